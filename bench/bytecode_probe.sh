#!/bin/bash
# Does this machine's Python have bytecode for what the workers import, and what does its absence
# cost? Each import chain in a fresh interpreter: first as the environment is (on the GPU image:
# PYTHONDONTWRITEBYTECODE=1, no __pycache__ for torch, numpy or sympy), then with bytecode written
# under a PYTHONPYCACHEPREFIX (the first pass writes it, the second reads it). From the repo root,
# on a machine that has just started (the first pass also reads the files for the first time):
#     bash bench/bytecode_probe.sh > bench/results/bytecode_probe_<device>.log
# Run it before bench/device_setup.sh, which writes that bytecode itself.
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset} PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX-unset}"
python - <<'P'
import importlib.util, os, sys
for m in ["torch", "transformers", "sklearn", "sympy", "numpy"]:
    s = importlib.util.find_spec(m)
    if s is None:
        continue
    d = os.path.dirname(s.origin)
    pc = os.path.join(d, "__pycache__")
    n = len(os.listdir(pc)) if os.path.isdir(pc) else 0
    print(m, d, "pycache files:", n, "writable:", os.access(d, os.W_OK), "tag", sys.implementation.cache_tag)
P
t() { local t0=$EPOCHREALTIME; python -c "$1" >/dev/null 2>&1; python3 -c "print('$2', round($EPOCHREALTIME - $t0, 2))"; }
T="import torch, deepspeed; from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer"
t "import torch" "torch(default)"
t "import torch" "torch(default again)"
t "$T" "learner imports(default)"
t "import reasoning_gym" "rg(default)"
prefix=$(mktemp -d)
export PYTHONPYCACHEPREFIX=$prefix; unset PYTHONDONTWRITEBYTECODE
t "import torch" "torch(prefix, writing)"
t "import torch" "torch(prefix, warm)"
t "$T" "learner imports(prefix, writing)"
t "$T" "learner imports(prefix, warm)"
t "import reasoning_gym" "rg(prefix writing)"
t "import reasoning_gym" "rg(prefix warm)"
du -sh "$prefix"
nproc; cat /proc/loadavg
