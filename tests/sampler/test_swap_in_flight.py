"""--swap-in-flight: a sampler streaming a round on the fast engine takes a version the learner
announced between two decode steps, copied into its weights in place, without draining the rows in
flight; each completion's old log-probs are those of the weights that drew each token, and each group
carries the oldest (policy_version) and newest (max_version) version among its tokens. Real sampler,
real sockets, a scripted learner whose answer carries tcp weights."""
from __future__ import annotations

import copy
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from netutil import free_ports, one_thread  # noqa: F401 - module-wide fixture (autouse)
from scripted import ScriptedLearner, facts, run_against

from grpo.config import SamplerConfig, from_flat
from grpo.model.logprobs import right_pad, token_logprobs
from grpo.sampler.loop import Sampler
from grpo.sampler.workflow import stream_line, swaps_in_flight
from grpo.weights.layout import plan_layout
from grpo.weights.pack import pack
from grpo.wire import messages as M

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "generate"))
from test_architectures import mixed_decode  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"


def test_swaps_in_flight_rule():
    assert swaps_in_flight(True, 4, M.TCP, "auto") and swaps_in_flight(True, 4, M.IPC, "sampling")
    assert swaps_in_flight(True, 1, M.NCCL, "auto")
    assert not swaps_in_flight(True, 0, M.TCP, "pass")      # fixed rounds: one batch, nothing to swap into
    assert not swaps_in_flight(False, 4, M.TCP, "pass")     # asked off
    assert not swaps_in_flight(True, 4, M.SHARED, "pass")   # shared: the learner steps only between rounds
    with pytest.raises(ValueError, match="--old-logprobs pass .* use --old-logprobs sampling .*--no-swap-in-flight"):
        swaps_in_flight(True, 4, M.TCP, "pass")


def tcp_announce(model: torch.nn.Module, version: int, request_id: int) -> M.WeightsAnnounce:
    named = list(model.named_parameters())
    layout, dtypes, nbytes = plan_layout(named)
    return M.WeightsAnnounce(version=version, method=M.TCP, layout=layout, bucket_dtypes=dtypes, bucket_nbytes=nbytes,
                             buckets=[memoryview(b.numpy()) for b in pack(named, layout, nbytes)],
                             request_id=request_id)


def test_a_version_announced_mid_stream_is_swapped_in_between_decode_steps():
    """3 prompts, G=2 on 3 rows, 12 new tokens, a host check every 3 decode steps. Before the round the
    sampler's swap request is out and answered with version 1's weights (tcp), so the first check
    (after step 3) applies them. Prompt 0's samples and prompt 1's first (rows 0-2 from step 0) drew
    tokens 0-3 (the refill's and steps 1-3) with version 0 and 4-11 with version 1; prompt 1's second
    sample waited for a row (its prompt prefilled by version 0) and took one at step 12: token 0 from
    that prefill, the rest by version 1; prompt 2, prefilled after the swap: all version 1."""
    data_port, sync_port = free_ports(2)
    s = Sampler(from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), dataset_limit=8,
                              num_generations=2, max_new_tokens=12, prompts_per_round=3, in_flight_rows=3,
                              generation_backend="fast", data_port=data_port, sync_port=sync_port,
                              heartbeat_interval_s=0))
    assert s.parts.swaps and s.parts.old_source == "sampling"
    s.parts.engine.check_every = 3
    old = copy.deepcopy(s.parts.policy)
    torch.manual_seed(123)
    new = type(s.parts.policy)(s.parts.policy.config).eval()
    ptrs = [p.data_ptr() for p in s.parts.policy.parameters()]
    # request 0: sync_weights' (no_update, the run's facts); request 1: the swap request sent before the round
    learner = ScriptedLearner(sync_port, facts(s), later={1: lambda req: tcp_announce(new, 1, req.request_id)})
    learner.start()
    try:
        assert s.parts.client.sync_weights() and s.parts.client.version == 0 and not s.parts.client.awaiting_first
        assert s.parts.client.apply_newer_now() is None   # nothing announced yet: request 1 goes out
        deadline = time.monotonic() + 30
        while not any(isinstance(m, M.WeightsAnnounce) for m in s.parts.client.inbox.peek()):
            assert time.monotonic() < deadline, "the scripted learner's answer never came"
            time.sleep(0.05)
        assert s.parts.client.version == 0   # answered, not yet applied: that is the stream's to do
        groups = {g.group_id: g for chunk in s.parts.workflow.stream_round(0, 3) for g in chunk}
    finally:
        learner.done.set()
        s.parts.data.close()
        s.parts.sync.close()
    assert s.parts.client.version == 1 and s.counters.swaps == 1 and s.counters.weight_syncs == 1
    assert [p.data_ptr() for p in s.parts.policy.parameters()] == ptrs   # copied in place
    assert all(torch.equal(p, q) for p, q in zip(s.parts.policy.parameters(), new.parameters()))
    assert sorted(groups) == ["s0-r0-g0", "s0-r0-g1", "s0-r0-g2"]
    assert [(groups[f"s0-r0-g{k}"].policy_version, groups[f"s0-r0-g{k}"].max_version) for k in range(3)] == \
        [(0, 1), (0, 1), (1, 1)]
    span, waited, after = [0] * 4 + [1] * 8, [0] + [1] * 11, [1] * 12
    want = {0: [span, span], 1: [span, waited], 2: [after, after]}
    eos = set(s.parts.eos_ids)
    models = {0: old, 1: new}
    for k in range(3):
        g = groups[f"s0-r0-g{k}"]
        prompt = g.prefix_token_ids.tolist()
        for c, versions in zip(g.completions, want[k]):
            tokens = c.generated_token_ids.tolist()
            assert len(tokens) == 12 and not eos & set(tokens)   # no EOS: the hand-worked steps hold
            # the old log-probs are the sampled ones, each under the weights that drew its token,
            # with the rows' keys and values as those weights computed them
            ref, _ = mixed_decode(models, prompt, tokens, versions, 1.0)
            np.testing.assert_allclose(c.old_policy_log_probs, ref, rtol=0, atol=1e-4)
    # Teacher-forced under one version alone: a spanning row's tokens before the swap are the old
    # weights' and its later ones are neither version's alone (the kept cache); prompt 2's are the new ones'.
    def alone(m, g):
        P = len(g.prefix_token_ids)
        ids, mask = right_pad([c.whole_token_ids.tolist() for c in g.completions], s.parts.tok.pad_token_id,
                              torch.device("cpu"))
        with torch.no_grad():
            return token_logprobs(m, ids, mask, 1.0)[:, P - 1:P + 11].numpy()
    g0, g2 = groups["s0-r0-g0"], groups["s0-r0-g2"]
    old0, new0, new2 = alone(old, g0), alone(new, g0), alone(new, g2)
    for i in range(2):
        lp = g0.completions[i].old_policy_log_probs
        np.testing.assert_allclose(lp[:4], old0[i][:4], rtol=0, atol=1e-4)
        assert np.abs(lp[4:] - old0[i][4:]).max() > 1e-2 and np.abs(lp[4:] - new0[i][4:]).max() > 1e-2
        np.testing.assert_allclose(g2.completions[i].old_policy_log_probs, new2[i], rtol=0, atol=1e-4)


def test_pass_old_logprobs_with_swaps_is_one_line_exit_2(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "sampling_worker.py"), "--device", "cpu", "--model", "tiny-random",
                        "--dataset", str(GSM8K), "--generation-backend", "fast", "--in-flight-rows", "4",
                        "--old-logprobs", "pass", "--run-dir", str(tmp_path / "run")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--old-logprobs pass" in lines[0] and "--no-swap-in-flight" in lines[0], r.stderr


def test_a_streaming_round_takes_prompts_as_the_budget_allows_and_no_more(caplog):
    """--in-flight-rows with swaps and --prompts-per-round 0: no fixed rounds. The scripted learner
    will take K = 6 groups in all: every answer's budget is K less the groups the request says were
    handed (what a learner with an empty line and nothing received would answer). The pool's room
    is then K - handed - (taken - done) = K - taken at every moment (no filter: every finished
    group is handed), so exactly 6 prompts start, 2 at a time on 4 rows (G=2), all in one round
    that lasts while rows come free; then the budget is 0 and the sampler waits until the stop.
    With rounds (one learner step of 1 group each) the same budget would have taken 6 rounds."""
    K = 6
    data_port, sync_port = free_ports(2)
    s = Sampler(from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), dataset_limit=16,
                              num_generations=2, max_new_tokens=6, in_flight_rows=4, generation_backend="fast",
                              data_port=data_port, sync_port=sync_port, heartbeat_interval_s=0))
    assert s.parts.swaps and s.cfg.rollout.prompts_per_round == 0
    # stop once three requests have said all K were handed: two of them asked for room in vain
    learner = ScriptedLearner(sync_port, facts(s, groups_per_step=4), budget=lambda req: max(0, K - max(req.sent, 0)),
                              stop_when=lambda reqs: sum(r.sent == K for r in reqs) >= 3)
    with caplog.at_level(logging.INFO, logger="grpo.sampler.workflow"):
        result = run_against(s, learner)
    assert result["groups_sent"] == K and result["rounds"] == 1, result
    # A step of 4 groups, but what ended leaves at the end of its host check: with 2 prompts in
    # flight at a time, at most 2 groups a chunk, so at least 3 chunks (a step's worth: 4 + 2)
    chunks = [int(n) for n in re.findall(r"round 0 \(v0\): (\d+) completions", caplog.text)]
    assert sum(chunks) == 2 * K and max(chunks) <= 4 and len(chunks) >= 3, chunks
    assert result["budget_wait_s"] > 0, result   # it waited for room once the 6 were out
    sent = [r.sent for r in learner.requests]
    assert sent == sorted(sent) and max(sent) == K, sent   # every request said the groups handed so far
    # the engine's counts reach the result: K prompts prefilled, 4 rows at every step, at most 2 x G busy
    steps = result["stream_steps"]
    assert result["stream_prompts"] == K and steps % s.parts.engine.check_every == 0 and steps >= 6
    assert result["stream_row_steps"] == 4 * steps and 0 < result["stream_busy_row_steps"] <= 4 * steps
    line = stream_line(result, 10.0)
    assert line.startswith(f"stream: {steps:,.0f} decode steps") and f"{K} prompts prefilled" in line, line
    assert stream_line({"stream_steps": 0.0}, 10.0) == ""
    assert "weight swaps" not in stream_line({**result, "stream_swaps": 0.0}, 10.0)
    assert stream_line({**result, "stream_swaps": 4.0, "stream_swap_s": 0.1}, 10.0).endswith(
        "; 4 weight swaps in flight, 25.0 ms each (host)")


def test_a_round_ending_for_an_evaluation_swaps_nothing_in_while_its_rows_end():
    """The same announced version 1 as above, on 6 rows, but the round's `ends` says stop taking
    prompts after the third, which the rows take at once (an evaluation of version 0 is due): from
    then on, the first host check included, no version is swapped in, so every token of the round
    is version 0's and the evaluation that follows scores version 0. The announcement is not lost:
    the next swap request applies it."""
    data_port, sync_port = free_ports(2)
    s = Sampler(from_flat(SamplerConfig, model="tiny-random", device="cpu", dataset=str(GSM8K), dataset_limit=8,
                              num_generations=2, max_new_tokens=12, in_flight_rows=6, generation_backend="fast",
                              data_port=data_port, sync_port=sync_port, heartbeat_interval_s=0))
    s.parts.engine.check_every = 3
    torch.manual_seed(123)
    new = type(s.parts.policy)(s.parts.policy.config).eval()
    learner = ScriptedLearner(sync_port, facts(s), later={1: lambda req: tcp_announce(new, 1, req.request_id)})
    learner.start()
    asked = []
    try:
        assert s.parts.client.sync_weights() and s.parts.client.apply_newer_now() is None   # request 1 goes out
        deadline = time.monotonic() + 30
        while not any(isinstance(m, M.WeightsAnnounce) for m in s.parts.client.inbox.peek()):
            assert time.monotonic() < deadline, "the scripted learner's answer never came"
            time.sleep(0.05)
        take = s.parts.workflow.prompts.stream.next_batch   # counted: the round ends once it has taken three prompts
        s.parts.workflow.prompts.stream.next_batch = lambda n: asked.append(n) or take(n)
        ends = lambda: len(asked) >= 3   # noqa: E731
        groups = [g for chunk in s.parts.workflow.stream_round(0, 0, ends=ends) for g in chunk]
        assert s.parts.client.version == 0 and s.counters.swaps == 0
        assert len(groups) == 3 and all((g.policy_version, g.max_version) == (0, 0) for g in groups)
        assert s.parts.client.apply_newer_now() == 1   # taken once the round is over
    finally:
        learner.done.set()
        s.parts.data.close()
        s.parts.sync.close()
