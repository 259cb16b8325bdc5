"""Checkpoints: exact optimizer/model/RNG round trip for both engines, HF export, pruning, --resume."""
import json
import math
from pathlib import Path

import pytest
import torch

from grpo.learner.checkpoint import (STATE_FILE, Checkpointer, ResumeError, list_checkpoints, load_checkpoint,
                                     resolve_resume)
from engines import _ds_config, _engine, _train_step  # noqa: F401 (test_warmup and test_micro_batches take them from here)
from grpo.model.load import load_causal_lm, load_tokenizer
from grpo.model.zoo import resolve_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny():
    path = resolve_model("tiny-random")
    return path, load_tokenizer(path)


def _opt_state(engine):
    return engine._engine.optimizer.state_dict() if hasattr(engine, "_engine") else engine.opt.state_dict()


def _assert_same(a, b, where="state"):
    """Recursive exact equality of nested dicts/lists of tensors and plain values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif hasattr(a, "__dict__") and not callable(a):
        assert type(a) is type(b), where         # e.g. DeepSpeed's loss scaler: compare its fields
        _assert_same(vars(a), vars(b), where)
    else:
        assert a == b, (where, a, b)


def _params(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("kind", ["torch", "deepspeed"])
def test_save_then_resume_restores_optimizer_weights_and_rng_exactly(tmp_path, tiny, kind):
    path, tok = tiny
    a = _engine(kind, path)
    ckpt = Checkpointer(tmp_path, save_every=2, keep=0, rank=0, world=1)
    for step in (1, 2):
        _train_step(a, seed=step)
        if ckpt.due(step, last=False):
            ckpt.save(a, tok, step, {"samplers": {0: {"rounds": 7}}})
    assert [s for s, _ in list_checkpoints(tmp_path / "checkpoints")] == [2]
    saved_opt, saved_w = _opt_state(a), _params(a.module)
    after_save_draw = torch.rand(3)

    torch.manual_seed(999)                       # a fresh process would have other RNG state
    b = _engine(kind, path)                      # fresh: initial weights, empty optimizer
    assert not all(torch.equal(v, saved_w[k]) for k, v in _params(b.module).items())
    state = load_checkpoint(b, resolve_resume("latest", tmp_path), rank=0, world=1)
    assert state["step"] == 2 and state["policy_version"] == 2 and state["samplers"]["0"]["rounds"] == 7
    assert state["engine"] == kind
    _assert_same(saved_opt, _opt_state(b), "optimizer")
    _assert_same(saved_w, _params(b.module), "weights")
    assert torch.equal(torch.rand(3), after_save_draw)      # RNG continues where the save left it

    # The same next step on both gives the same weights: Adam moments and step count carried over.
    _train_step(a, seed=3)
    _train_step(b, seed=3)
    _assert_same(_params(a.module), _params(b.module), "weights after step 3")

    # The Hugging Face export loads with plain transformers and holds the step-2 weights.
    from transformers import AutoModelForCausalLM

    hf_dir = tmp_path / "checkpoints" / "step_2" / "hf"
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    assert hf.config.use_cache is True
    hf_w = hf.state_dict()
    for k, v in saved_w.items():
        assert torch.equal(hf_w[k], v), k
    assert (hf_dir / "tokenizer.json").is_file() or (hf_dir / "tokenizer_config.json").is_file()


def test_keep_k_prunes_oldest_and_incomplete_ones_are_ignored(tmp_path, tiny):
    path, tok = tiny
    eng = _engine("torch", path)
    ckpt = Checkpointer(tmp_path, save_every=1, keep=2, rank=0, world=1)
    for step in range(1, 5):
        assert ckpt.due(step, last=False)
        ckpt.save(eng, tok, step, {})
    assert not ckpt.due(4, last=True)            # the end of the run does not save step 4 twice
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_3", "step_4"]
    # A crash mid-save leaves a folder without trainer_state.json: never picked as latest.
    (root / "step_9").mkdir()
    assert resolve_resume("latest", tmp_path) == root / "step_4"
    assert resolve_resume(str(tmp_path), tmp_path) == root / "step_4"     # a run directory
    assert resolve_resume(str(root / "step_3"), tmp_path) == root / "step_3"
    assert json.loads((root / "step_4" / STATE_FILE).read_text())["step"] == 4
    assert resolve_resume("", tmp_path) is None
    with pytest.raises(ResumeError, match="at step 4 >= --max-steps 4; raise --max-steps"):
        resolve_resume("latest", tmp_path, max_steps=4)
    assert resolve_resume("latest", tmp_path, max_steps=5) == root / "step_4"
    with pytest.raises(ResumeError, match="--resume latest: no complete checkpoint"):
        resolve_resume("latest", tmp_path / "elsewhere")
    with pytest.raises(ResumeError, match="not a complete checkpoint"):
        resolve_resume(str(root / "step_9"), tmp_path)


def test_save_every_schedule():
    c = Checkpointer(Path("/nonexistent"), save_every=1000, keep=3, rank=0, world=1)
    assert [s for s in range(1, 2501) if c.due(s, last=s == 2500)] == [1000, 2000, 2500]
    c0 = Checkpointer(Path("/nonexistent"), save_every=0, keep=3, rank=0, world=1)
    assert [s for s in range(1, 11) if c0.due(s, last=s == 10)] == [10]


def test_engine_mismatch_is_one_line(tmp_path, tiny):
    path, tok = tiny
    eng = _engine("torch", path)
    Checkpointer(tmp_path, save_every=1, keep=0, rank=0, world=1).save(eng, tok, 1, {})
    state_file = tmp_path / "checkpoints" / "step_1" / STATE_FILE
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps(dict(state, engine="deepspeed")))
    with pytest.raises(ResumeError, match="drop --no-deepspeed"):
        load_checkpoint(eng, tmp_path / "checkpoints" / "step_1", rank=0, world=1)


def test_timed_weights_save_on_the_marks_without_catching_up(tiny, tmp_path, monkeypatch):
    """--save-weights-every-s 30 from t0 = 1000: nothing before 1030; a save at 1065 (a slow step ran
    past the 60 s mark) moves the next mark to 1090, not 1060; the last step always saves."""
    import grpo.learner.checkpoint as ck

    path, tok = tiny
    model = load_causal_lm(path, torch.device("cpu"), torch.float32)
    tw = ck.TimedWeights(tmp_path / "weights", 30.0, 1000.0)
    assert not tw.due(1029.9, last=False) and tw.due(1030.0, last=False) and tw.due(1000.0, last=True)
    monkeypatch.setattr(ck.time, "time", lambda: 1065.0)
    rec = tw.save(model, tok, 12)
    assert rec == {"step": 12, "wall_time": 1065.0, "seconds": 65.0}
    assert json.loads((tmp_path / "weights" / "step_12" / "weights.json").read_text()) == rec
    assert not tw.due(1089.0, last=False) and tw.due(1090.0, last=False)
    assert not ck.TimedWeights(tmp_path / "weights", 0.0, 1000.0).due(5000.0, last=True)   # 0: off


def test_timed_weights_on_a_schedule_hand_worked(tiny, tmp_path, monkeypatch):
    """--save-weights-schedule 10x2,30 from t0 = 1000: marks 1010, 1020, then every 30 s: 1050, 1080;
    a save at 1026 (past 1020) moves the next mark to 1050."""
    import grpo.learner.checkpoint as ck

    assert ck.parse_save_schedule("15x8,30") == [(15.0, 8), (30.0, None)]
    for bad in ("15x8", "15,30", "0", "15x0,30", "abc"):
        with pytest.raises(ValueError, match="--save-weights-schedule"):
            ck.parse_save_schedule(bad)
    s = ck.parse_save_schedule("15x8,30")
    assert [ck.next_save_mark(s, e) for e in (0.0, 15.0, 119.9, 120.0, 1000.0)] == [15.0, 30.0, 120.0, 150.0, 1020.0]
    path, tok = tiny
    model = load_causal_lm(path, torch.device("cpu"), torch.float32)
    tw = ck.TimedWeights(tmp_path / "weights", 10.0, 1000.0, "10x2,30")
    assert not tw.due(1009.9, last=False) and tw.due(1010.0, last=False)
    monkeypatch.setattr(ck.time, "time", lambda: 1026.0)
    tw.save(model, tok, 4)
    assert not tw.due(1049.9, last=False) and tw.due(1050.0, last=False)


def test_torch_engine_skips_a_step_whose_gradient_is_not_finite(tiny):
    """--no-deepspeed: a NaN gradient leaves the weights and the optimizer as they were (DeepSpeed's
    bf16 optimizer does the same); the next finite step trains as usual."""
    path, _ = tiny
    eng = _engine("torch", path)
    before = [p.detach().clone() for p in eng.module.parameters()]
    ids = torch.tensor([[5, 6, 7, 8]])
    eng.backward(eng.module(input_ids=ids).logits.float().mean() * float("nan"))
    eng.step()
    assert math.isnan(eng.grad_norm()) and eng.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, eng.module.parameters()))
    assert not eng.opt.state                      # AdamW never stepped: no moments, no step count
    eng.backward(eng.module(input_ids=ids).logits.float().mean())
    eng.step()
    assert math.isfinite(eng.grad_norm()) and eng.skipped_steps == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, eng.module.parameters()))
