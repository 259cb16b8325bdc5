"""LoRA mode: adapters only are trained; samplers receive W + scale * B @ A under the base names."""
import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from netutil import free_ports

from grpo.learner.engine import TorchEngine
from grpo.learner.lora import lora_stats, save_adapter, wrap_lora
from grpo.weights.publisher import publish_named as publish_named_tensors
from grpo.model.load import load_causal_lm
from grpo.model.zoo import resolve_model
from grpo.sync.client import request_weights
from grpo.weights.tcp import TcpPublisher, apply_weights
from grpo.wire import messages as M
from grpo.wire.transport import SyncClient, SyncServer

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
CPU = torch.device("cpu")
R, ALPHA = 4, 8.0


def _base():
    return load_causal_lm(resolve_model("tiny-random"), CPU, torch.float32)


def _lora_with_nonzero_b(targets="q_proj,v_proj"):
    model = wrap_lora(_base(), R, ALPHA, targets, 0.0)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:  # peft starts B at zero (delta 0); make the delta visible
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def _hand_merge(model) -> dict[str, torch.Tensor]:
    """W + (alpha / r) * B @ A for each adapted weight, from the peft model's own tensors."""
    params = dict(model.get_base_model().named_parameters())
    out = {}
    for name, w in params.items():
        if ".lora_" in name:
            continue
        clean = name.replace(".base_layer.", ".")
        if ".base_layer.weight" in name:
            stem = name[: -len(".base_layer.weight")]
            a, b = params[f"{stem}.lora_A.default.weight"], params[f"{stem}.lora_B.default.weight"]
            out[clean] = w.detach() + (b @ a).detach() * (ALPHA / R)
        else:
            out[clean] = w.detach()
    return out


def test_publish_named_tensors_equals_peft_merge_and_leaves_weights_alone():
    base_names = [n for n, _ in _base().named_parameters()]
    model = _lora_with_nonzero_b("all-linear")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    named = publish_named_tensors(model)
    assert [n for n, _ in named] == base_names              # exactly the plain model's names, in order
    merged = dict(copy.deepcopy(model).merge_and_unload().named_parameters())
    for n, t in named:
        assert torch.equal(t, merged[n]), n
    plain = dict(_base().named_parameters())
    adapted = [n for n, t in named if not torch.equal(t, plain[n])]
    assert len(adapted) == 2 * 7                              # q,k,v,o,gate,up,down in 2 layers
    for n, p in model.named_parameters():                     # nothing trained was modified
        assert torch.equal(p, before[n]), n
    plain = _base()
    assert [(n, id(t)) for n, t in publish_named_tensors(plain)] == [(n, id(p)) for n, p in plain.named_parameters()]


def test_tcp_sync_gives_the_sampler_base_plus_merged_delta_exactly():
    (port,) = free_ports(1)
    model = _lora_with_nonzero_b()
    expect = _hand_merge(model)
    pub = TcpPublisher(SyncServer("127.0.0.1", port), model)
    client = SyncClient("127.0.0.1", port, M.weights_limits(64 << 20))
    try:
        pub.publish(1, model)
        answered, newest, stop = request_weights(client, 0, 0, request_id=1, timeout_s=30)
        assert answered and stop is None and newest.version == 1
        sampler = _base()                                     # plain transformers model, no peft
        apply_weights(sampler, newest)
    finally:
        client.close()
        pub.close()
    got, plain = dict(sampler.named_parameters()), dict(_base().named_parameters())
    assert set(got) == set(expect)
    changed = 0
    for n, t in expect.items():
        assert torch.equal(got[n], t), n
        changed += not torch.equal(t, plain[n])
    assert changed == 4                                       # q_proj and v_proj of 2 layers


def test_torch_engine_trains_adapters_only(tmp_path):
    model = wrap_lora(_base(), R, ALPHA, "q_proj,v_proj", 0.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ds = {"optimizer": {"params": {"lr": 1e-2}}, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0}
    eng = TorchEngine(model, ds, CPU)
    ids = torch.randint(0, 100, (2, 8))
    for _ in range(2):  # the first step moves only B (A's grad is 0 while B is 0), the second both
        eng.backward(model(input_ids=ids).logits.float().pow(2).mean())
        for n, p in model.named_parameters():
            assert (p.grad is not None) == ("lora_" in n), n
        eng.step()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) != ("lora_" in n), n  # adapters moved, everything else did not
    stats = lora_stats(eng)
    # q_proj: A 4x64 + B 64x4; v_proj: A 4x64 + B 32x4 (2 KV heads of 16); 2 layers
    assert stats["trainable_params"] == 2 * (4 * 64 + 64 * 4 + 4 * 64 + 32 * 4) == 1792
    assert stats["optimizer_state_numel"] == 1792 and stats["frozen_params_with_grad"] == 0
    out = save_adapter(model, tmp_path / "ad", merged=True)
    assert (out / "adapter_model.safetensors").stat().st_size < 64_000
    reloaded = load_causal_lm(str(out / "merged"), CPU, torch.float32)
    for n, t in publish_named_tensors(model):
        assert torch.equal(dict(reloaded.named_parameters())[n], t), n


def test_bad_lora_options_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^--lora-target-modules nope_proj: Target modules \{'nope_proj'\} not found"):
        wrap_lora(_base(), R, ALPHA, "nope_proj", 0.0)
    with pytest.raises(ValueError, match=r"^--lora-dropout 1.5: must be in \[0, 1\)$"):
        wrap_lora(_base(), R, ALPHA, "q_proj", 1.5)


@pytest.mark.slow
def test_lora_run_distributed_zero2_with_config_file(tmp_path):
    """2 steps of a LoRA ZeRO-2 learner and a sampler through run_distributed.py, set up by a YAML
    file, with TensorBoard events and a report from the real run."""
    d, s = free_ports(2)
    run_dir = tmp_path / "run"
    cfg = tmp_path / "lora.yaml"
    cfg.write_text(f"device: cpu\nmodel: tiny-random\ndataset: {GSM8K}\ndataset-limit: 16\nnum_generations: 4\n"
                   "prompts_per_round: 2\ntrain_batch_size: 8\nmax_new_tokens: 16\nmax_steps: 2\n"
                   "lora_r: 4\nlora_alpha: 8\nlora_target_modules: [q_proj, v_proj]\nbeta: 0.5\n"
                   # Step 2 then trains only on groups generated by version 1, so the sampler must
                   # have received and applied the merged weights for the run to finish.
                   "max_staleness: 0\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "run_distributed.py", "--config", str(cfg), "--beta", "0.0",
                        "--data-port", str(d), "--sync-port", str(s), "--run-dir", str(run_dir)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    logs = "".join(p.read_text() for p in run_dir.glob("*.log")) if run_dir.exists() else ""
    assert r.returncode == 0, r.stdout + r.stderr + logs
    conf = json.loads((run_dir / "config_learner.json").read_text())
    assert (conf["lora_r"], conf["lora_alpha"], conf["lora_target_modules"], conf["beta"]) == (4, 8.0, "q_proj,v_proj", 0.0)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["lora"] == {"trainable_params": 1792, "total_params": summary["lora"]["total_params"],
                               "frozen_params_with_grad": 0, "optimizer_state_numel": 1792}
    assert summary["lora"]["total_params"] > 1000 * 1792
    assert summary["groups"]["balanced"]
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in steps if not x.get("final")]
    assert [x["step"] for x in steps] == [1, 2] and all(math.isfinite(x["loss"]) for x in steps)
    assert steps[1]["staleness_max"] == 0                                          # trained on version-1 groups
    assert "now running policy version 1" in (run_dir / "sampler0.log").read_text()  # merged layout applied
    assert (run_dir / "lora_adapter" / "adapter_config.json").is_file()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2]
    assert {"reward/reward_mean", "reward/component/has_answer", "train/entropy", "time/sync_publish_s",
            "samplers/version/0", "groups/trained"} <= set(acc.Tags()["scalars"])
    r = subprocess.run([sys.executable, "-m", "grpo.obs.report", str(run_dir)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (run_dir / "report.png").stat().st_size > 20_000
    assert "LoRA r=4 alpha=8.0" in (run_dir / "report.md").read_text()
