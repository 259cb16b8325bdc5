"""The learner step's figures by name: how two ranks' figures combine (summed in rank order, the
largest, the mean, each rank's kept), over a real gloo process group of two ranks on CPU as well
as by the pure rule; the step record built from them; and each rank's share of a minibatch."""
import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from netutil import free_ports

from grpo.config import LearnerConfig, from_flat
from grpo.learner.step import (EACH, MAX, MEAN, RANK_FIGURES, SUM, combine, plan_shard, reduce_by_name,
                               step_record)

KINDS = {"loss": SUM, "kl": SUM, "is_weight_max": MAX, "grad_scale": MEAN, "tokens_per_s": EACH}
RANK0 = {"loss": 0.25, "kl": 0.1, "is_weight_max": 1.5, "grad_scale": 2.0, "tokens_per_s": 100.0}
RANK1 = {"loss": 0.5, "kl": 0.2, "is_weight_max": 3.0, "grad_scale": 5.0, "tokens_per_s": 50.0}
# By hand: sums added in rank order from 0 (0.1 + 0.2 is 0.30000000000000004 in float64, exactly),
# the larger weight, (2 + 5) / 2, and each rank's own rate in rank order.
BOTH = {"loss": 0.75, "kl": 0.1 + 0.2, "is_weight_max": 3.0, "grad_scale": 3.5, "tokens_per_s": [100.0, 50.0]}


def _figures(rank: int) -> dict[str, float]:
    """A rank's measured step figures, every name of RANK_FIGURES (made-up, exact in binary)."""
    if rank == 0:
        return {"loss": 0.375, "kl": 0.5, "clipped": 1.0, "tokens": 3.0, "ratio": 3.5, "sequences": 1.0,
                "is_weight_sum": 2.0, "is_weight_max": 1.25, "is_limited": 0.0, "entropy": 1.0,
                "model_tokens": 10.0, "padded_tokens": 12.0, "tokens_per_s": 200.0, "peak_mem_gb": 0.0}
    return {"loss": 0.125, "kl": 0.5, "clipped": 1.0, "tokens": 5.0, "ratio": 5.5, "sequences": 3.0,
            "is_weight_sum": 4.0, "is_weight_max": 2.5, "is_limited": 1.0, "entropy": 3.0,
            "model_tokens": 20.0, "padded_tokens": 28.0, "tokens_per_s": 400.0, "peak_mem_gb": 0.0}


def _cfg(**kw) -> LearnerConfig:
    return from_flat(LearnerConfig, **{"beta": 0.04, "entropy_coef": 0.01, **kw})


# The two ranks' figures through step_record (2 updates, grad norm 0.75), by hand: loss
# (0.375 + 0.125) / 2; per loss token (3 + 5 = 8): kl 1/8, clipped 2/8, ratio 9/8, weight 6/8,
# limited 1/8, entropy 4/8; the larger weight 2.5; 1 + 3 sequences; 10 + 20 model tokens, padding 1 - 30/40.
TWO_RANK_RECORD = {"loss": 0.25, "kl": 0.125, "clip_frac": 0.25, "ratio_mean": 1.125, "is_weight_mean": 0.75,
                   "is_weight_max": 2.5, "is_limited_frac": 0.125, "updates": 2, "policy_entropy": 0.5,
                   "tokens": 8, "sequences": 4, "model_tokens": 30, "grad_norm": 0.75, "pad_frac": 0.25,
                   "rank_tokens_per_s": [200.0, 400.0], "rank_peak_mem_gb": [0.0, 0.0]}


def test_two_ranks_figures_combine_by_name_by_hand():
    assert combine([RANK0, RANK1], KINDS) == BOTH
    assert combine([RANK0, RANK1], KINDS)["kl"] == 0.30000000000000004
    reduced = combine([_figures(0), _figures(1)], RANK_FIGURES)
    assert step_record(reduced, _cfg(), updates=2, grad_norm=0.75) == TWO_RANK_RECORD
    with pytest.raises(ValueError, match="unknown reduction 'median'"):
        combine([RANK0], {"loss": "median"})


def test_one_rank_keeps_its_own_figures_without_a_collective():
    # (earlier tests in this process may have started a one-rank group: world 1 needs none either way)
    assert reduce_by_name(RANK0, KINDS, world=1) == {**RANK0, "tokens_per_s": [100.0]}
    with pytest.raises(ValueError, match=r"figures \['kl'\]: measured but not declared"):
        reduce_by_name({k: v for k, v in RANK0.items() if k != "kl"}, KINDS, world=1)


def test_step_record_by_hand():
    one = _figures(1)
    rec = step_record({**one, "tokens_per_s": [400.0], "peak_mem_gb": [1.5]}, _cfg(beta=0.0, entropy_coef=0.0),
                      updates=1, grad_norm=float("inf"))
    # beta 0 and no entropy bonus: no KL and no entropy to report; per loss token (5): clipped 1/5,
    # ratio 5.5/5, weight 4/5, limited 1/5; padding 1 - 20/28
    assert rec == {"loss": 0.125, "kl": None, "clip_frac": 1.0 / 5, "ratio_mean": 5.5 / 5, "is_weight_mean": 4.0 / 5,
                   "is_weight_max": 2.5, "is_limited_frac": 1.0 / 5, "updates": 1, "policy_entropy": None,
                   "tokens": 5, "sequences": 3, "model_tokens": 20, "grad_norm": float("inf"),
                   "pad_frac": 1.0 - 20.0 / 28.0,
                   "rank_tokens_per_s": [400.0], "rank_peak_mem_gb": [1.5]}
    empty = dict.fromkeys(RANK_FIGURES, 0.0)
    rec = step_record({**empty, "tokens_per_s": [0.0], "peak_mem_gb": [0.0]}, _cfg(), updates=1, grad_norm=0.0)
    assert (rec["kl"], rec["clip_frac"], rec["pad_frac"], rec["tokens"]) == (0.0, 0.0, 0.0, 0)   # no division by 0


def _rank(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks: reduce its figures by name and write what it got."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        mine = RANK0 if rank == 0 else RANK1
        got = {"kinds": reduce_by_name(mine, KINDS, world=2),
               "record": step_record(reduce_by_name(_figures(rank), RANK_FIGURES, world=2), _cfg(), 2, 0.75)}
    finally:
        dist.destroy_process_group()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(got, f)   # floats round-trip exactly through json


def test_two_gloo_ranks_reduce_figures_by_name_exactly(tmp_path):
    (port,) = free_ports(1)
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):   # every rank holds the same result
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["kinds"] == BOTH
        assert got["record"] == TWO_RANK_RECORD


def test_each_rank_plans_its_share_of_a_minibatch_by_hand():
    lens = [9, 3, 7, 5, 2, 6]
    # balanced_split, longest first onto the lighter rank: 9->0, 7->1, 6->1, 5->0, 3->1, 2->0, so
    # rank 0 holds sequences 0, 3, 4 (9 + 5 + 2 tokens) and rank 1 holds 1, 2, 5 (3 + 7 + 6).
    # gas 2: neighbouring lengths together, the later micro-step takes the extra row
    # (micro-steps index into the rank's share).
    assert plan_shard(lens, [0, 1, 2, 3, 4, 5], 2, 0, 0, 2) == ([0, 3, 4], [[2], [0, 1]])
    assert plan_shard(lens, [0, 1, 2, 3, 4, 5], 2, 1, 0, 2) == ([1, 2, 5], [[0], [1, 2]])
    # A 10-token budget: rank 0 packs 2 and 5 (2 rows x 5 = 10), then 9 alone; rank 1 needs three
    # (3; 6; 7: two rows of 6 or 7 are 12 or 14 > 10), so rank 0 runs an empty third micro-step.
    assert plan_shard(lens, [0, 1, 2, 3, 4, 5], 2, 0, 10, 2) == ([0, 3, 4], [[1, 2], [0], []])
    assert plan_shard(lens, [0, 1, 2, 3, 4, 5], 2, 1, 10, 2) == ([1, 2, 5], [[0], [2], [1]])
    # Padding-free passes: the budget counts real tokens. Rank 0 (9, 5, 2) fits 2 + 5 = 7 and then 9
    # alone; rank 1 (3, 7, 6) needs two: 3 + 6 = 9 and 7 (3 + 6 + 7 = 16 > 10; the least largest of
    # two runs over sorted 3 6 7 is 9), where padded slots needed three.
    assert plan_shard(lens, [0, 1, 2, 3, 4, 5], 2, 0, 10, 2, packed=True) == ([0, 3, 4], [[1, 2], [0]])
    assert plan_shard(lens, [0, 1, 2, 3, 4, 5], 2, 1, 10, 2, packed=True) == ([1, 2, 5], [[0, 2], [1]])
    # The second of two minibatches (sequences 2..5: 7, 5, 2, 6 tokens): 7->0, 6->1, 5->1, 2->0.
    assert plan_shard(lens, [2, 3, 4, 5], 2, 0, 0, 1) == ([2, 4], [[0, 1]])
    assert plan_shard(lens, [2, 3, 4, 5], 2, 1, 0, 1) == ([3, 5], [[0, 1]])


def test_the_step_runs_the_lm_head_on_completion_positions_only():
    """A real step on the tiny model (plain AdamW engine, with the entropy bonus): the loss reads
    only the generated tokens' positions, so only those reach the LM head: 2 + 3 rows (a prompt of
    3 tokens, completions of 2 and 3), not the 4 + 5 of every target, in the forward pass and in
    the checkpointed chunk's recomputation alike."""
    from builders import make_group

    from grpo.learner.batch import build_batch
    from grpo.learner.engine import TorchEngine
    from grpo.learner.step import TrainStep
    from grpo.model.load import load_causal_lm
    from grpo.model.zoo import resolve_model

    torch.manual_seed(0)
    model = load_causal_lm(resolve_model("tiny-random"), torch.device("cpu"), torch.float32)
    engine = TorchEngine(model, {"optimizer": {"params": {"lr": 1e-3}}, "gradient_accumulation_steps": 1},
                         torch.device("cpu"))
    step = TrainStep(_cfg(num_generations=2), engine, 0, torch.device("cpu"), rank=0, world=1, micro_tokens=0,
                     autocast=False)
    g = make_group(prefix_ids=[11, 12, 13], completions=[[21, 22], [31, 32, 33]], rewards=[1.0, 0.0])
    head_rows = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, a, o: head_rows.append(a[0].shape[0]))
    try:
        record = step(build_batch([g], group_size=2, scale_rewards=False))
    finally:
        hook.remove()
    assert head_rows == [5, 5], head_rows
    assert record["tokens"] == 5 and record["sequences"] == 2, record
