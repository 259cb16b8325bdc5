#!/bin/bash
# Where a worker's start-up goes before its model loads: -X importtime of each start-up import chain
# (the learner's torch + DeepSpeed + transformers, the sampler's, the launcher's task check): the
# wall seconds of each and its slowest imports by cumulative time. From the repo root:
#     bash bench/import_profile.sh > bench/results/import_profile_<device>.log   (PYTHON=... to pick one)
# The committed log (the NVIDIA H200 machine) was taken while a training run was going on the same
# machine, 75 s after its launch: caches warm, a few cores busy.
cd "$(dirname "$0")/.." || exit 1
[ -f bench/device_setup.sh ] && . bench/device_setup.sh > /dev/null
tmp=$(mktemp)
imp() {
  echo "== $1"
  local t0=$EPOCHREALTIME
  "${PYTHON:-python}" -X importtime -c "$1" 2> "$tmp" > /dev/null
  echo "wall $(python3 -c "print(round($EPOCHREALTIME - $t0, 2))") s"
  grep '^import time' "$tmp" | sort -t'|' -k2 -n | tail -"${2:-14}"
}
imp "import torch" 4
imp "import torch; import deepspeed" 12
imp "import torch; import deepspeed; from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer" 25
imp "import torch; from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer" 12
imp "import reasoning_gym" 8
imp "import reasoning_gym" 4
# before the workers start (at 3d12808, the committed log's commit, this also checked the rg: tasks)
imp "from grpo.launch.main import check_sampler_flags; check_sampler_flags(['--dataset','rg:letter_counting','--reward','correctness'])" 6
# beside the workers' start-up since 850b3ba
imp "from grpo.launch.main import check_sampler_tasks; check_sampler_tasks(['--dataset','rg:letter_counting'])" 6
imp "from grpo.sampler.loop import Sampler" 12
imp "from grpo.learner.loop import Learner" 12
"${PYTHON:-python}" - <<'P'
import time, torch
if torch.cuda.is_available():
    t = time.perf_counter(); torch.zeros(1, device="cuda"); print("cuda init %.2f s" % (time.perf_counter() - t))
P
rm -f "$tmp"
