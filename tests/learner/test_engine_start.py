"""Starting the DeepSpeed engine: DeepSpeed's Muon module is imported without torch.compile (and
so without torch's inductor stack) unless the run's optimizer is Muon, and the process group's
first collective runs on a thread beside the model's loading, in a fresh process, as a learner
starts."""
import json
import os
import subprocess
import sys
from pathlib import Path

from netutil import free_ports

ROOT = Path(__file__).resolve().parents[2]

# A fresh interpreter: whether a module was imported is a fact about one process, and the test
# process has imported whatever earlier tests needed.
SCRIPT = r"""
import json, os, sys
import torch, deepspeed
import transformers.modeling_utils   # as the learner has, before its engine starts
from grpo.learner.engine import CommunicatorWarmup, DeepSpeedEngine, init_process_group, load_ds_config, resolve_ds_config
from grpo.model.load import load_causal_lm
from grpo.model.zoo import resolve_model

INDUCTOR = "torch._inductor.compile_fx"
try:   # before the group exists: the thread's error comes back to the caller
    CommunicatorWarmup(torch.device("cpu"), 5.0).wait()
    early = None
except Exception as exc:
    early = f"{type(exc).__name__}: {exc}"
init_process_group(torch.device("cpu"), 1800.0)   # gloo, as a CPU learner's
warm = CommunicatorWarmup(torch.device("cpu"), 60.0)   # as the learner: beside the model's loading
model = load_causal_lm(resolve_model("tiny-random"), torch.device("cpu"), torch.float32)
comm_s = warm.wait()
cfg, _ = resolve_ds_config(load_ds_config(sys.argv[1]), world=1, train_batch_size=4, group_size=4,
                           learning_rate=1e-2, cuda=False)
engine = DeepSpeedEngine(model, cfg)
after_start = INDUCTOR in sys.modules
before = [p.detach().clone() for p in engine.module.parameters()]
ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
for _ in range(engine.gas):
    engine.backward(engine.module(input_ids=ids, use_cache=False).logits.float().pow(2).mean())
engine.step()
moved = sum(int(not torch.equal(a, b)) for a, b in zip(before, engine.module.parameters()))
from deepspeed.runtime.zero.muon import original_muon
print("RESULT " + json.dumps({
    "optimizer": type(engine._engine.optimizer.optimizer).__name__, "inductor_after_start": after_start,
    "inductor_after_step": INDUCTOR in sys.modules, "params_moved": moved,
    "muon_compiled": hasattr(original_muon.zeropower_via_newtonschulz5, "_torchdynamo_orig_callable"),
    "switch_left": os.environ.get("TORCHDYNAMO_DISABLE"), "early": early, "comm_s": comm_s,
    "warm_alive": warm.is_alive()}))
"""


def test_engine_starts_and_steps_without_torch_inductor():
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_ports(1)[0]), RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", PYTHONPATH=str(ROOT))
    env.pop("TORCHDYNAMO_DISABLE", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "deepspeed.json")], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    got = json.loads(lines[-1].removeprefix("RESULT "))
    # The ZeRO-2 engine runs deepspeed.json's optimizer (torch's AdamW) and its step moves weights.
    assert got["optimizer"] == "AdamW" and got["params_moved"] > 0
    # Neither the start nor the first gradient reduction (each imports the Muon module) brought in
    # the inductor stack; Muon's functions are the plain ones, and the switch is off again.
    assert got["inductor_after_start"] is False and got["inductor_after_step"] is False
    assert got["muon_compiled"] is False and got["switch_left"] is None
    # The communicator warm-up: an error on its thread reaches the caller; with the group made, its
    # collective ran and the thread is done before the engine starts.
    assert "not been initialized" in got["early"], got["early"]
    assert got["comm_s"] >= 0 and got["warm_alive"] is False


def test_a_muon_run_imports_it_compiled():
    from grpo.learner.engine import import_muon_uncompiled

    assert import_muon_uncompiled("Muon") is False and import_muon_uncompiled("muon") is False
