"""Start-up costs a worker pays before its first step, each in fresh processes, alternated:

- `engine`: deepspeed.initialize for SmolLM2 on CPU (gloo, one rank, the repo's deepspeed.json),
  after torch, deepspeed and transformers are imported as the learner has them: as DeepSpeed does
  it (`deepspeed`), and after grpo.learner.engine.import_muon_uncompiled (`ours`). Also whether
  torch's inductor stack was imported by the start and by one training step.
- `problems`: the sampler's problems stage for --dataset TASK: `import reasoning_gym` alone, then
  grpo.data.sources.load_problems (2,000 train problems) on top of it.
- `overlap`: the problems stage and transformers' import one after the other, against the
  problems loaded in a thread while the main thread imports transformers (the GIL decides).

    python bench/startup_probe.py --repeats 3     # writes bench/results/startup_probe_cpu.json

A figure of this machine's CPU; the GPU machines' stages are in each run's log and stage files.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, write_result  # noqa: E402

ENGINE = r"""
import json, os, sys, time
import torch, deepspeed
import transformers.modeling_utils
from grpo.learner.engine import import_muon_uncompiled, load_ds_config, resolve_ds_config, trainable
from grpo.model import load_causal_lm, resolve_model
deepspeed.init_distributed(dist_backend="gloo")
model = load_causal_lm(resolve_model("smollm2"), torch.device("cpu"), torch.float32)
cfg, _ = resolve_ds_config(load_ds_config(os.path.join(sys.argv[2], "deepspeed.json")), world=1,
                           train_batch_size=128, group_size=16, learning_rate=2e-5, cuda=False)
t = time.perf_counter()
if sys.argv[1] == "ours":
    import_muon_uncompiled(str(cfg["optimizer"]["type"]))
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable(model), config=cfg)
start_s = time.perf_counter() - t
inductor_start = "torch._inductor.compile_fx" in sys.modules
ids = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(int(sys.argv[3])))
t = time.perf_counter()
for _ in range(engine.gradient_accumulation_steps()):
    engine.backward(engine(input_ids=ids, use_cache=False).logits.float().pow(2).mean())
engine.step()
print("RESULT " + json.dumps({"start_s": start_s, "first_step_s": time.perf_counter() - t,
                              "inductor_after_start": inductor_start,
                              "inductor_after_step": "torch._inductor.compile_fx" in sys.modules}))
"""

PROBLEMS = r"""
import json, sys, time
import torch
t = time.perf_counter(); import reasoning_gym
t1 = time.perf_counter()
from grpo.data.sources import load_problems
n = len(load_problems(sys.argv[1], "train", seed=int(sys.argv[2])))
print("RESULT " + json.dumps({"import_reasoning_gym_s": t1 - t, "load_problems_s": time.perf_counter() - t1,
                              "problems": n}))
"""

OVERLAP = r"""
import json, sys, threading, time
import torch
def problems():
    from grpo.data.sources import load_problems
    load_problems(sys.argv[2], "train", seed=int(sys.argv[3]))
def tf():
    import transformers.modeling_utils
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
t = time.perf_counter()
if sys.argv[1] == "sequential":
    problems(); tf()
else:
    th = threading.Thread(target=problems); th.start(); tf(); th.join()
print("RESULT " + json.dumps({"both_s": time.perf_counter() - t}))
"""


def fresh(script: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", MASTER_PORT=str(29500 + os.getpid() % 1000))
    env.pop("TORCHDYNAMO_DISABLE", None)
    out = subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not lines:
        raise SystemExit(f"startup_probe: a probe failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per variant, alternated")
    ap.add_argument("--task", default="rg:letter_counting", help="the --dataset whose problems are loaded")
    ap.add_argument("--seed", type=int, default=42, help="the problems' seed (and the engine step's made-up tokens')")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"engine_deepspeed": [], "engine_ours": [], "problems": [],
                                   "overlap_sequential": [], "overlap_thread": []}
    seed = str(args.seed)
    fresh(PROBLEMS, args.task, seed)   # bytecode and page cache, once, not counted
    for _ in range(args.repeats):
        for mode in ("deepspeed", "ours"):
            runs[f"engine_{mode}"].append(fresh(ENGINE, mode, str(ROOT), seed))
        runs["problems"].append(fresh(PROBLEMS, args.task, seed))
        for mode in ("sequential", "thread"):
            runs[f"overlap_{mode}"].append(fresh(OVERLAP, mode, args.task, seed))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], float)}
           for name, rs in runs.items()}
    path = write_result("startup_probe", __import__("torch").device("cpu"),
                        {"task": args.task, "seed": args.seed, "repeats": args.repeats, "cpu_count": os.cpu_count(),
                         "medians": med, "runs": runs}, extra_versions=("reasoning_gym",))
    print(json.dumps(med, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
