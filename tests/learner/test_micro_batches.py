"""Token micro-batches (--micro-batch-tokens): DeepSpeed with the learner owning the accumulation
boundary takes the same update from one micro-batch of four rows as from DeepSpeed's own two
micro-batches of two, and the config says who owns the boundary."""
from pathlib import Path

import pytest
import torch

from grpo.learner.engine import ConfigError, load_ds_config, resolve_ds_config
from grpo.model.zoo import resolve_model
from test_checkpoint import _engine as make_engine

ROOT = Path(__file__).resolve().parents[2]


def _config(tokens: bool, raw: dict | None = None):
    raw = raw or load_ds_config(str(ROOT / "deepspeed.json"))
    # Adam with eps 1 moves each weight by about lr x its gradient: the two ways of adding up the
    # same gradient agree to rounding (with eps 1e-8, a gradient of 1e-12 moves a weight by lr).
    raw = {**raw, "train_micro_batch_size_per_gpu": 2,
           "optimizer": {**raw["optimizer"], "params": {**raw["optimizer"]["params"], "eps": 1.0}}}
    cfg, _ = resolve_ds_config(raw, world=1, train_batch_size=4, group_size=4, learning_rate=1.0, cuda=False,
                               token_micro_batches=tokens)
    return cfg


def test_the_flag_owns_the_accumulation_boundary():
    assert _config(True)["managed_gradient_accumulation"] is False
    assert "managed_gradient_accumulation" not in _config(False)
    raw = {**load_ds_config(str(ROOT / "deepspeed.json")), "managed_gradient_accumulation": True}
    with pytest.raises(ConfigError, match="managed_gradient_accumulation is true but --micro-batch-tokens"):
        _config(True, raw)


def _engine(kind: str, cfg: dict):
    return make_engine(kind, resolve_model("tiny-random"), cfg)   # the same saved weights each time


def _loss(engine, ids):
    logits = engine.module(input_ids=ids, use_cache=False).logits.float()
    return logits.logsumexp(-1).mean(-1).sum() / 4     # a mean over the step's 4 rows


@pytest.mark.parametrize("kind", ["torch", "deepspeed"])
def test_one_token_micro_batch_updates_like_fixed_ones(kind):
    ids = torch.randint(0, 1000, (4, 10), generator=torch.Generator().manual_seed(3))
    fixed, packed = _engine(kind, _config(False)), _engine(kind, _config(True))
    assert (fixed.gas, fixed.loss_divisor, packed.loss_divisor) == (2, 2, 1)
    for step in range(2):
        for half in (ids[:2], ids[2:]):              # fixed: gas = 2 micro-batches of 2 rows
            fixed.backward(_loss(fixed, half) * fixed.loss_divisor)
        fixed.step()
        packed.backward(_loss(packed, ids) * packed.loss_divisor)   # packed: one micro-batch of 4
        packed.step()
    assert fixed.updates == packed.updates == 2
    for (name, a), b in zip(fixed.module.named_parameters(), packed.module.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), name
    moved = max((a - b).abs().max().item() for a, b in zip(packed.module.parameters(),
                                                          _engine("torch", _config(True)).module.parameters()))
    assert moved > 1e-4   # the updates were real
