"""--screen-generations K: a prompt's first K completions are generated and scored first; a screen
whose rewards all agree drops the prompt there (counted, by kind), one whose rewards differ has the
other G - K generated and is sent as one whole group, its screen scored once. The rules by hand, a
fixed round on the tiny model, and a streaming run over real sockets against a scripted learner."""
from __future__ import annotations

from pathlib import Path

import pytest
from netutil import free_ports, one_thread  # noqa: F401 - module-wide fixture (autouse)
from scripted import ScriptedLearner, drain, facts, run_against

from grpo.config import SamplerConfig, from_flat
from grpo.data.rewards import RewardResult
from grpo.launch.checks import sampler_problem
from grpo.rules.screening import expected_samples, screen_agrees, screen_problem
from grpo.sampler.loop import Sampler
from grpo.wire import messages as M
from grpo.wire.transport import DataReceiver

GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


def test_the_rule_by_hand():
    assert screen_problem(0, 16) is None and screen_problem(2, 4) is None and screen_problem(15, 16) is None
    for bad in (1, 16, 17):
        assert screen_problem(bad, 16).startswith(f"--screen-generations {bad}: give 2..15")
    assert screen_agrees(0.5, 4) == 0.125 and screen_agrees(0.0, 4) == screen_agrees(1.0, 4) == 1.0
    assert screen_agrees(0.25, 2) == 0.25 ** 2 + 0.75 ** 2 == 0.625
    assert expected_samples(0.5, 4, 16) == 4 + 0.875 * 12 == 14.5
    assert expected_samples(0.0, 4, 16) == expected_samples(1.0, 4, 16) == 4.0


def test_a_bad_count_is_refused_before_any_worker_starts():
    cfg = from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), num_generations=4,
                    screen_generations=4)
    assert sampler_problem(cfg).startswith("--screen-generations 4: give 2..3")


class Scripted:
    """rewards.score by problem, in the order problems are first scored: the first always right
    (its screen agrees: solved), the second never (unsolved), the third right on the even
    completions of each call (its screen differs, and so does its whole group). Records each
    call's texts."""

    def __init__(self):
        self.kinds: dict[str, int] = {}
        self.calls: list[list[str]] = []

    def __call__(self, problems, texts, ids, strict=False):
        self.calls.append(list(texts))
        out = []
        for i, p in enumerate(problems):
            kind = self.kinds.setdefault(p.question, len(self.kinds))
            right = {0: True, 1: False}.get(kind, i % 2 == 0)
            out.append(RewardResult(float(right), {"correct": float(right)}))
        return out


def sampler(data_port: int, sync_port: int, **kw) -> Sampler:
    return Sampler(from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), dataset_limit=8,
                             prompts_per_round=3, num_generations=4, max_new_tokens=4, generation_backend="fast",
                             reward="correctness", filter_zero_signal=True, screen_generations=2,
                             data_port=data_port, sync_port=sync_port, **kw))


def test_a_fixed_round_screens_each_prompt_and_sends_the_one_that_differs_whole():
    """3 prompts, G=4, K=2, one batch (a fixed round): 3 screens of 2 scored one call each; the
    solved and the unsolved prompt are dropped there (4 completions, not 8), the third gets its
    other 2 in a second batch of the same stream and leaves as one group of 4, its screen's two
    first and not scored again: 8 completions scored in all, each once."""
    s = sampler(*free_ports(2), old_logprobs="pass")
    scripted = Scripted()
    s.parts.workflow.rewards.score = scripted
    try:
        groups = [g for chunk in s.parts.workflow.stream_round(0, 3) for g in chunk]
    finally:
        s.parts.data.close()
        s.parts.sync.close()
    assert [len(c) for c in scripted.calls] == [2, 2, 2, 2]
    assert [g.group_id for g in groups] == ["s0-r0-g2"]
    (g,) = groups
    assert [c.reward for c in g.completions] == [1.0, 0.0, 1.0, 0.0]
    assert [c.text for c in g.completions] == scripted.calls[2] + scripted.calls[3]   # the screen's, then the rest
    for c in g.completions:   # every row has its own old log-probs (the pass), as any group's
        assert c.old_policy_log_probs.shape == (len(c.generated_token_ids),)
    c = s.counters
    assert (c.screened_out, c.screened_solved, c.screened_unsolved, c.screen_samples) == (2, 1, 1, 4)
    assert c.samples == 8 and c.dropped_zero_signal == 0 and c.groups_sent == 0   # (nothing offered yet)
    # for the round's sizing, a prompt dropped at its screen is a group without signal
    assert s.parts.workflow._signal[-1] == (1, 3) and s.parts.workflow.signal_share() == pytest.approx(1 / 3)


def test_a_streaming_run_sends_whole_groups_and_counts_the_screens():
    """Rows in flight with swaps, against a scripted learner that answers with no update: one round
    of 3 prompts over the ring (their screens share its 8 rows; the rest of the third is asked for
    after its screen is scored, ahead of any new prompt). One group of 4 reaches the socket, and
    the final status says 2 prompts were screened out, one solved and one not."""
    data_port, sync_port = free_ports(2)
    receiver = DataReceiver("127.0.0.1", data_port, M.Limits(), 1 << 26)
    s = sampler(data_port, sync_port, in_flight_rows=8, max_rounds=1, sync_timeout_s=0.2, heartbeat_interval_s=0)
    s.parts.workflow.rewards.score = Scripted()
    result = run_against(s, ScriptedLearner(s.cfg.run.sync_port, facts(s)))
    groups, final = drain(receiver)
    assert final is not None and result["groups_sent"] == final.groups_sent == 1
    assert [len(g.completions) for g in groups] == [4]
    assert [c.reward for c in groups[0].completions] == [1.0, 0.0, 1.0, 0.0]
    assert {k: final.stats[k] for k in ("screened_out", "screened_solved", "screened_unsolved", "screen_samples",
                                        "samples")} == {"screened_out": 2.0, "screened_solved": 1.0,
                                                        "screened_unsolved": 1.0, "screen_samples": 4.0,
                                                        "samples": 8.0}
    assert final.stats["stream_prompts"] == 4.0   # 3 screens and one rest prefilled
