"""The learner's warm-up pass leaves no trace: the same steps after it give bit-identical weights
and optimizer state, with DeepSpeed's ZeRO-2 engine (gloo) and the plain one."""
import pytest
import torch

from grpo.config import ASSUMED_PROMPT_TOKENS
from grpo.learner.warmup import warm_up, warm_up_shape
from test_checkpoint import _assert_same, _engine, _opt_state, _params, _train_step, tiny  # noqa: F401 (a fixture)

CPU = torch.device("cpu")


def test_shape_is_a_micro_batch_of_a_short_prompt_and_the_longest_completion():
    assert warm_up_shape(32, 4096, 256) == (32, ASSUMED_PROMPT_TOKENS + 256) == (32, 384)
    assert warm_up_shape(16, 40, 100) == (16, 140)    # prompts capped below the assumed length
    assert warm_up_shape(0, 64, 8) == (1, 72)


@pytest.mark.parametrize("kind", ["torch", "deepspeed"])
def test_warm_up_changes_nothing_training_reads(tiny, kind):   # noqa: F811 (the fixture imported above)
    path, _ = tiny
    warmed, plain = _engine(kind, path), _engine(kind, path)
    _assert_same(_params(warmed.module), _params(plain.module), "weights before")
    rng = torch.get_rng_state()
    seconds = warm_up(warmed.module, 1000, 3, 20, CPU)
    assert seconds > 0
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in warmed.module.parameters())
    for seed in (1, 2):
        _train_step(warmed, seed)
        _train_step(plain, seed)
    assert warmed.updates == plain.updates == 2
    _assert_same(_params(warmed.module), _params(plain.module), "weights after two steps")
    _assert_same(_opt_state(warmed), _opt_state(plain), "optimizer state")


def test_warm_up_runs_a_backward_pass_through_every_layer(tiny):   # noqa: F811 (the fixture imported above)
    """The pass reaches the first layer's weights in its graph (it is a real backward), though
    their gradients are not computed."""
    path, _ = tiny
    engine = _engine("torch", path)
    first = next(m for m in engine.module.modules() if isinstance(m, torch.nn.Linear))
    seen = []
    handle = first.register_full_backward_hook(lambda mod, gin, gout: seen.append(gout[0].shape))
    try:
        warm_up(engine.module, 1000, 2, 9, CPU)                      # padding-free: one row of 2 x 9 tokens
        warm_up(engine.module, 1000, 2, 9, CPU, padding_free=False)  # the rows as they are
    finally:
        handle.remove()
    assert [s[:2] for s in seen] == [(1, 18), (2, 9)]
