"""vLLM's engine behind our stream (grpo.generate.vllm_engine) on CPU, without vLLM: its pure helpers by
hand (vLLM's outputs into FinishedGroups with per-token versions, the sampling and engine fields), and
its stream, batches and weight copies over a stand-in for vLLM's LLMEngine (tests/fakevllm.py) that
decodes with a Hugging Face model. tests/generate/test_vllm_gpu.py runs the real one on a GPU."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fakevllm import FakeLLM, FakeMPLLM, FakeTPLLM, FlatLogprobs, make_params
from netutil import one_thread  # noqa: F401 - module-wide fixture (autouse)

from grpo.generate.backend import hf_generate, old_logprob_source, resolve_backend
from grpo.generate.vllm_engine import (RowTrace, VllmEngine, check_vllm, ended_with_eos, engine_fields,
                                       group_of, plan_share, sampled_logprobs, sampling_fields)
from grpo.generate.vllm_worker import EXTENSION, LOAD
from grpo.rules.backend import VLLM_MISSING as MISSING
from test_architectures import EOS, NEW, PAD, SwapAt, build, prompts, source, teacher_forced


# ----------------------------------------------------------------------------- pure helpers, by hand
def test_sampled_logprobs_picks_the_sampled_tokens_entry():
    lp = SimpleNamespace
    # logprobs=0: one entry a token, the sampled one's; logprobs=1 adds the top token (here 7 at step 1)
    assert sampled_logprobs([5, 9], [{5: lp(logprob=-0.5)}, {9: lp(logprob=-1.25), 7: lp(logprob=-0.1)}]) == \
        [-0.5, -1.25]
    assert sampled_logprobs([3], [{3: -2.0}]) == [-2.0]   # plain floats too
    assert sampled_logprobs([], []) == []
    with pytest.raises(ValueError, match="no log-probs"):
        sampled_logprobs([3], None)
    with pytest.raises(ValueError, match="2 log-prob entries for 1 tokens"):
        sampled_logprobs([3], [{3: -1.0}, {4: -1.0}])
    with pytest.raises(KeyError):
        sampled_logprobs([3], [{4: -1.0}])   # the sampled token's entry is missing


def test_sampled_logprobs_read_vllms_flat_lists():
    """flat_logprobs=True: positions 0 and 1 of a delta, entries [0:1] and [1:3] (position 1 with a top
    token after the sampled one), the sampled token's log-prob at each start."""
    flat = FlatLogprobs([0, 1], [1, 3], [5, 9, 7], [-0.5, -1.25, -0.1])
    assert sampled_logprobs([5, 9], flat) == [-0.5, -1.25]
    assert sampled_logprobs([], FlatLogprobs([], [], [], [])) == []
    with pytest.raises(ValueError, match="do not start with the sampled token 9"):
        sampled_logprobs([5, 9], FlatLogprobs([0, 1], [1, 2], [5, 7], [-0.5, -0.1]))
    with pytest.raises(ValueError, match="do not start with the sampled token 9"):
        sampled_logprobs([5, 9], FlatLogprobs([0, 1], [1, 1], [5], [-0.5]))   # position 1 without entries
    with pytest.raises(ValueError, match="1 log-prob entries for 2 tokens"):
        sampled_logprobs([5, 9], FlatLogprobs([0], [1], [5], [-0.5]))


def test_row_traces_into_a_finished_group_with_per_token_versions():
    # Row 0: 2 tokens at version 4 (two steps), then a swap, then 2 at version 5, the last an EOS (id 1).
    # Row 1: one token at 4, cut at max_new_tokens later at 5. Row 2 ended at once without tokens
    # (max_new_tokens reached nothing: impossible in vLLM, but the rule holds).
    a, b, c = RowTrace(), RowTrace(), RowTrace()
    a.extend([10], [-0.5], 4)
    b.extend([20], [-0.25], 4)
    a.extend([11], [-1.0], 4)
    a.extend((12, 1), [-2.0, -0.125], 5)
    b.extend([21], [-3.0], 5)
    a.finished, b.finished, c.finished = True, False, False
    g = group_of("key", [a, b, c], decode_steps=3, default_version=9)
    assert g.key == "key" and g.token_ids == [[10, 11, 12, 1], [20, 21], []]
    assert g.finished == [True, False, False] and g.decode_steps == 3 and g.last_in_check
    assert [v.tolist() for v in g.versions] == [[4, 4, 5, 5], [4, 5], []]
    assert all(v.dtype == np.int32 for v in g.versions)
    assert [lp.tolist() for lp in g.logprobs] == [[-0.5, -1.0, -2.0, -0.125], [-0.25, -3.0], []]
    assert all(lp.dtype == np.float32 for lp in g.logprobs)
    assert (g.min_version, g.max_version) == (4, 5)
    empty = group_of(0, [c], 0, default_version=9, last_in_check=False)
    assert (empty.min_version, empty.max_version, empty.last_in_check) == (9, 9, False)
    with pytest.raises(ValueError, match="still in flight"):
        group_of(0, [RowTrace()], 0, 0)
    with pytest.raises(ValueError, match="2 tokens with 1 log-probs"):
        RowTrace().extend([1, 2], [-1.0], 0)


def test_finish_reasons():
    assert ended_with_eos("stop") is True and ended_with_eos("length") is False
    with pytest.raises(RuntimeError, match="'abort'"):
        ended_with_eos("abort")


def test_a_config_without_the_shape_is_refused_with_the_callers_remedy():
    """The memory rule needs the model's shape; the refusal names the missing key and what the caller
    can do instead: the sampler's flag by default, the evaluate command's own way (it has no flag)."""
    policy = SimpleNamespace(config=SimpleNamespace(to_dict=lambda: {"hidden_size": 8}))
    with pytest.raises(ValueError, match="no 'num_hidden_layers' to plan by; give it with --vllm-gpu-memory-utilization"):
        plan_share(policy, torch.device("cpu"), 4, 8)
    with pytest.raises(ValueError, match="to plan by; decode with --generation-backend fast$"):
        plan_share(policy, torch.device("cpu"), 4, 8, remedy="decode with --generation-backend fast")


def test_sampling_fields_are_our_engines_rule():
    f = sampling_fields(0.7, False, 12, [5, 2, 5])
    assert f["temperature"] == 0.7 and (f["top_p"], f["top_k"], f["min_p"]) == (1.0, 0, 0.0)
    assert (f["presence_penalty"], f["frequency_penalty"], f["repetition_penalty"]) == (0.0, 0.0, 1.0)
    # our EOS ids exactly: ignore_eos keeps vLLM from adding the tokenizer's or the generation config's
    assert f["stop_token_ids"] == [2, 5] and f["ignore_eos"] is True
    assert (f["max_tokens"], f["min_tokens"], f["n"], f["logprobs"]) == (12, 0, 1, 0)
    assert f["detokenize"] is False and f["flat_logprobs"] is True   # a few lists a request, not objects a token
    assert sampling_fields(0.7, True, 12, [])["temperature"] == 0.0    # greedy: vLLM's temperature 0
    assert sampling_fields(0.0, False, 12, [])["temperature"] == 0.0
    assert sampling_fields(1.0, False, 3, None)["stop_token_ids"] == []
    with pytest.raises(ValueError, match="max_new_tokens"):
        sampling_fields(1.0, False, 0, [])


def test_a_folder_without_weights_gets_dummy_weights_that_the_policy_overwrites(tmp_path):
    """random:qwen2.5-* folders hold a config and a tokenizer only: vLLM draws dummy weights (the
    first stream copies the policy's in); a folder with weight files, or a hub id, loads them."""
    from grpo.generate.vllm_engine import holds_weights

    (tmp_path / "config.json").write_text("{}")
    assert not holds_weights(str(tmp_path))
    assert engine_fields(str(tmp_path), "bfloat16", 0.5, 0)["load_format"] == "dummy"
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert holds_weights(str(tmp_path)) and holds_weights("Qwen/Qwen2.5-0.5B-Instruct")
    assert "load_format" not in engine_fields(str(tmp_path), "bfloat16", 0.5, 0)


def test_engine_fields(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")   # a folder with weights: vLLM loads them
    f = engine_fields(str(tmp_path), "bfloat16", 0.25, 7, rows=64)
    assert (f["model"], f["dtype"], f["seed"], f["gpu_memory_utilization"]) == (str(tmp_path), "bfloat16", 7, 0.25)
    assert "load_format" not in f
    assert f["skip_tokenizer_init"] is True   # our token ids in, token ids out: no tokenizer of vLLM's
    # synchronous steps (no batch queued behind the running one), each step's tokens at once, processed log-probs
    assert f["async_scheduling"] is False and f["stream_interval"] == 1 and f["logprobs_mode"] == "processed_logprobs"
    assert f["generation_config"] == "vllm" and f["max_num_seqs"] == 64 and f["enforce_eager"] is False
    assert f["tensor_parallel_size"] == 1 and "max_model_len" not in f
    assert "distributed_executor_backend" not in f   # one GPU: vLLM's worker in this process
    t = engine_fields("/m", "bfloat16", 0.25, 7, tensor_parallel=2)
    assert t["tensor_parallel_size"] == 2 and t["distributed_executor_backend"] == "mp"   # a worker process a GPU
    g = engine_fields("/m", "float32", 1.0, 0, cuda_graphs=False, max_model_len=512)
    assert g["enforce_eager"] is True and g["max_model_len"] == 512 and "max_num_seqs" not in g
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            engine_fields("/m", "bfloat16", bad, 0)


def test_backend_rules_take_vllm():
    assert resolve_backend("vllm", torch.device("cpu")) == "vllm"
    assert old_logprob_source("sampling", "vllm", torch.bfloat16) == "sampling"
    assert old_logprob_source("auto", "vllm", torch.bfloat16) == "pass"      # bf16: a pass, as for our engine
    assert old_logprob_source("auto", "vllm", torch.float32) == "sampling"


def test_check_vllm_refuses_in_one_line(monkeypatch):
    import grpo.generate.vllm_engine as ve

    monkeypatch.setattr(ve, "vllm_installed", lambda: False)
    with pytest.raises(ValueError) as e:
        check_vllm("cuda")
    assert str(e.value) == MISSING == "--generation-backend vllm needs vLLM: pip install '.[vllm]'"
    monkeypatch.setattr(ve, "vllm_installed", lambda: True)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        check_vllm("cpu")
    with pytest.raises(ValueError, match="not --gpu-id 2: choose the GPU with CUDA_VISIBLE_DEVICES=2 and --gpu-id 0"):
        check_vllm("cuda", 2)
    check_vllm("cuda", 0)
    check_vllm("cuda", None)
    # over two GPUs it must see two (its own first: the launcher's CUDA_VISIBLE_DEVICES)
    with pytest.raises(ValueError) as e:
        check_vllm("cuda", 0, tensor_parallel=2, visible=1)
    assert str(e.value) == ("--vllm-tensor-parallel-size 2 needs 2 visible GPUs, and this sampler sees 1: list its "
                            "GPUs first in CUDA_VISIBLE_DEVICES (run_distributed.py does), or lower "
                            "--vllm-tensor-parallel-size")
    check_vllm("cuda", 0, tensor_parallel=2, visible=3)


# ----------------------------------------------------------------------------- the engine over a stand-in
@pytest.fixture(scope="module")
def old():
    return build("qwen2")


@pytest.fixture(scope="module")
def new():
    return build("qwen2", seed=1)


@torch.no_grad()
def greedy_pick(model, ids: list[int]) -> int:
    return int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())


def engine_on(model, eos=(EOS,), seed=4, tp=1):
    policy = copy.deepcopy(model)   # the sampler's own model, which the receivers (and swap) write
    llm = FakeLLM(policy, seed=seed) if tp == 1 else FakeTPLLM(policy, tp, seed=seed)
    share = {} if tp == 1 else {"share": llm.share}   # (the stand-in's handles: CUDA IPC's part)
    return VllmEngine(llm, make_params, list(eos), policy=policy, tensor_parallel=tp, **share), llm, policy


def check_by_version(got: dict, ps: list, models: dict, temperature: float) -> None:
    """Each token's log-prob is that of the version it is tagged with (the stand-in keeps no KV cache:
    a teacher-forced pass of that version), and at temperature 0 each token that version's argmax."""
    for k, g in got.items():
        for row, lp, vs in zip(g.token_ids, g.logprobs, g.versions):
            for v in set(vs.tolist()):
                want = teacher_forced(models[v], [ps[k]], [row], temperature or 1.0)[0]
                mask = vs == v
                np.testing.assert_allclose(lp[mask], want[mask], rtol=0, atol=1e-5)
            if temperature == 0:
                assert row == [greedy_pick(models[v], ps[k] + row[:c]) for c, v in enumerate(vs.tolist())]


@pytest.mark.parametrize("temperature, tp", [(0.0, 1), (0.8, 1), (0.8, 2)])
def test_stream_swaps_between_two_steps_without_draining(old, new, temperature, tp):
    """3 prompts, G=2, at most 4 rows, 8 tokens each (no EOS): prompts 0 and 1 take the 4 rows at
    step 1; swap() copies new weights into the policy at its 2nd call (after step 2) and the engine
    copies them into vLLM's model before step 3, with 4 requests in flight: their tokens 0-1 are
    version 0's, 2-7 version 1's. Prompt 2 starts when rows free (after step 8): all version 1. Each
    log-prob is that of the version that drew the token (the stand-in keeps no KV cache: a
    teacher-forced pass of that version), greedy tokens its argmax. tp 2: the same over vLLM's worker
    processes (the stand-in's: each copy loads from the policy's IPC handles), versions as they were."""
    ps = prompts((5, 9, 3), seed=6)
    engine, llm, policy = engine_on(old, eos=(), tp=tp)
    swap = SwapAt(policy, new, 2)
    got = {g.key: g for g in engine.stream(source(enumerate(ps)), 2, NEW, temperature=temperature, rows=4,
                                           swap=swap)}
    # two copies (version 0 at the start, version 1 after step 2), each loaded by every worker
    assert sorted(got) == [0, 1, 2] and llm.most_live == 4 and llm.loads == 2 * tp and not llm.requests
    span, after = [0, 0] + [1] * (NEW - 2), [1] * NEW
    for k, want in {0: span, 1: span, 2: after}.items():
        g = got[k]
        assert [v.tolist() for v in g.versions] == [want, want], k
        assert (g.min_version, g.max_version) == (min(want), max(want)) and g.decode_steps == NEW
        assert g.finished == [False, False] and all(len(r) == NEW for r in g.token_ids)
    check_by_version(got, ps, {0: old, 1: new}, temperature)
    counts = engine.stream_counts   # one swap in flight (the first copy is the stream's start, not one)
    assert counts["steps"] == 16 and counts["prompts"] == 3
    assert counts["swaps"] == 1 and 0 < counts["swap_s"] <= counts["check_s"]


def test_stream_without_swap_and_a_fixed_round(old):
    """No swap: every token carries the stream's version, which the engine first copies from the
    policy (once: a second stream at that version copies nothing). Rows 0/None: every prompt the
    source gives is in flight at once (a fixed round)."""
    ps = prompts((4, 6, 2), seed=3)
    engine, llm, _ = engine_on(old)
    got = list(engine.stream(source(enumerate(ps)), 3, NEW, temperature=1.0, rows=0, version=7))
    assert llm.most_live == 9 and llm.loads == 1 and engine.loaded == 7 and llm.prefix_resets == 1
    assert sorted(g.key for g in got) == [0, 1, 2]
    for g in got:
        assert all(v.tolist() == [7] * len(r) for v, r in zip(g.versions, g.token_ids))
        assert (g.min_version, g.max_version) == (7, 7)
        for row, lp, fin in zip(g.token_ids, g.logprobs, g.finished):
            assert fin == (row[-1] == EOS) and EOS not in row[:-1]   # cut at the first EOS, kept
            np.testing.assert_allclose(lp, teacher_forced(old, [ps[g.key]], [row], 1.0)[0], rtol=0, atol=1e-5)
    list(engine.stream(source(enumerate(ps)), 3, NEW, rows=None, version=7))
    assert llm.loads == 1


def test_stream_takes_a_count_per_prompt_and_a_prompt_given_after_its_last_group(old):
    """(key, ids, n): n requests for that prompt, its group n rows; a prompt the source gives in
    answer to the last group yielded, after it had said None, is still decoded (greedy: each row the
    greedy continuation, so a prompt's rows are alike)."""
    ps = prompts((5, 9), seed=6)
    engine, llm, _ = engine_on(old, eos=())
    queue = [(0, ps[0], 1), (1, ps[1])]
    got = []
    for g in engine.stream(lambda: queue.pop(0) if queue else None, 3, NEW, temperature=0.0, rows=4):
        got.append(g)
        if len(got) == 2:
            queue.append(("rest", ps[0], 2))
    assert [(g.key, len(g.token_ids)) for g in got] == [(0, 1), (1, 3), ("rest", 2)] and not llm.requests
    assert llm.most_live == 4   # 1 + 3 rows of the first two prompts at once
    assert got[2].token_ids == got[0].token_ids * 2


def test_should_stop_aborts_the_requests_in_flight(old):
    ps = prompts((4, 6), seed=2)
    engine, llm, _ = engine_on(old, eos=())
    calls = []
    got = list(engine.stream(source(enumerate(ps)), 2, NEW, rows=8, should_stop=lambda: calls.append(1) or len(calls) >= 3))
    assert got == [] and len(calls) == 3 and llm.steps == 3
    assert sorted(llm.aborted) == sorted(f"s{i}" for i in range(4)) and not llm.requests


def test_generate_greedy_equals_hf_generate_and_takes_the_policys_version(old, new):
    """A fixed batch (what a greedy evaluation decodes): hf_generate's tokens and ends, in the prompts'
    order; the policy's version (version_of) is copied in first, once."""
    ps = prompts((5, 9, 3, 12), seed=1)
    engine, llm, policy = engine_on(old)
    version = [3]
    engine.version_of = lambda: version[0]
    out = engine.generate(ps, NEW, greedy=True)
    ref, ref_fin = hf_generate(old, ps, NEW, 1.0, True, eos_id=EOS, pad_id=PAD)
    assert out.token_ids == ref and out.finished == ref_fin and llm.loads == 1
    assert out.stats["tokens"] == sum(map(len, ref)) and not out.stats["stopped"]
    assert [len(lp) for lp in out.logprobs] == [len(r) for r in ref]
    engine.generate(ps, NEW, greedy=True)
    assert llm.loads == 1   # the same version: nothing copied
    with torch.no_grad():
        for p, q in zip(policy.parameters(), new.parameters()):
            p.copy_(q)
    version[0] = 4
    out = engine.generate(ps, NEW, greedy=True)
    assert out.token_ids == hf_generate(new, ps, NEW, 1.0, True, eos_id=EOS, pad_id=PAD)[0] and llm.loads == 2
    stopped = engine.generate(ps, NEW, greedy=True, should_stop=lambda: True)
    assert stopped.stats["stopped"] and stopped.token_ids == [[]] * 4 and not llm.requests


class ScriptedLLM:
    """vLLM's LLMEngine as a script: step k returns script[k] as DELTA outputs (request id, new
    tokens, their log-probs, finish reason), in the request ids the engine gave (s0, s1, ...)."""

    def __init__(self, script):
        self.script, self.added = script, []

    def add_request(self, rid, prompt, params):
        self.added.append((rid, prompt["prompt_token_ids"], params.max_tokens))

    def step(self):
        outs = []
        for rid, toks, lps, reason in self.script.pop(0):
            entries = [{t: lp} for t, lp in zip(toks, lps)] or [{9: -9.0}, {9: -9.0}]   # (an empty delta: vLLM's
            #                                                                       logprobs[-0:], all of them)
            outs.append(SimpleNamespace(request_id=rid, finished=reason is not None, outputs=[SimpleNamespace(
                token_ids=toks, logprobs=entries, finish_reason=reason)]))
        return outs


def test_stream_of_a_script_by_hand():
    """One prompt, G=2: step 1 draws 5 (-1.0) and 6 (-2.0) at version 3; swap() says 4 after it; step
    2 draws 7 (-0.5, max_new_tokens reached: 'length') and 1 (-0.25, EOS: 'stop'). The group ends at
    step 2: rows [5, 7] and [6, 1], versions [3, 4] each, finished [False, True], decode_steps 2.
    Then a second prompt whose second request ends with an empty delta (kept as its 1 token)."""
    llm = ScriptedLLM([
        [("s0", [5], [-1.0], None), ("s1", [6], [-2.0], None)],
        [("s0", [7], [-0.5], "length"), ("s1", [1], [-0.25], "stop")],
        [("s2", [8], [-1.5], "length"), ("s3", [9], [-3.0], None)],
        [("s3", [], [], "stop")],
    ])
    engine = VllmEngine(llm, make_params, [1])
    answers = iter([4, None, None, None])                  # swap() after each step
    ps = iter([("a", [11, 12]), ("b", [13]), None])        # asked while rows are free: before steps 1 and 3, after 4
    got = list(engine.stream(lambda: next(ps), 2, 2, rows=2, swap=lambda: next(answers), version=3))
    assert [rid for rid, _, _ in llm.added] == ["s0", "s1", "s2", "s3"]
    assert [p for _, p, _ in llm.added] == [[11, 12], [11, 12], [13], [13]] and {m for _, _, m in llm.added} == {2}
    a, b = got
    assert (a.key, a.token_ids, a.finished, a.decode_steps) == ("a", [[5, 7], [6, 1]], [False, True], 2)
    assert [v.tolist() for v in a.versions] == [[3, 4], [3, 4]] and (a.min_version, a.max_version) == (3, 4)
    assert [lp.tolist() for lp in a.logprobs] == [[-1.0, -0.5], [-2.0, -0.25]]
    assert (b.key, b.token_ids, b.finished, b.decode_steps) == ("b", [[8], [9]], [False, True], 2)
    assert [v.tolist() for v in b.versions] == [[4], [4]] and a.last_in_check and b.last_in_check


def test_vllm_is_imported_only_inside_the_engines_build():
    """vLLM stays an optional extra: no module imports it at its top, and only vllm_engine.py imports it
    at all (inside VllmEngine.build), so the CPU path and `make test` never need it."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "grpo"
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            if any(n.split(".")[0] == "vllm" for n in names):
                found.append((path.relative_to(root).as_posix(), id(node) in top))
    assert found and all(p == "generate/vllm_engine.py" and not at_top for p, at_top in found), found


def test_over_several_gpus_each_worker_loads_the_policy_from_its_handles(old, new):
    """tp 2: a weight copy is one collective_rpc of our loader's method by name, its arguments the
    parameters' names and handles as plain values (the stand-in sends them through msgpack, as vLLM's
    engine-core client does: a tensor, a class or a function there would fail); each worker rebuilds
    the tensors and loads them, and vLLM's model then holds the policy's new values. A handle goes
    once: the next version's call carries the names alone (the workers kept the mapping), and a
    parameter whose memory moved gets a handle again, the others not."""
    engine, llm, policy = engine_on(old, tp=2)
    assert engine.sync_weights(0) and llm.loads == 2 and len(llm.rpc_calls) == 2
    (method, (names, handles)), again = llm.rpc_calls
    assert method == LOAD and again == llm.rpc_calls[0] and engine.stamps == []   # (stamps: engine process only)
    named = list(policy.named_parameters())
    assert names == [name for name, _ in named] and len(handles) == len(named)
    assert all(h[0] == "torch.Tensor" and h[5] == str(p.dtype) and h[1] == list(p.shape) for h, (_, p) in zip(handles, named))
    with torch.no_grad():
        for p, q in zip(policy.parameters(), new.parameters()):
            p.copy_(q)   # the receivers write version 1 into the policy
    assert engine.sync_weights(1) and not engine.sync_weights(1)   # once a version
    (_, (names1, handles1)), again = llm.rpc_calls[-2:]
    assert names1 == names and handles1 == [None] * len(named) and again == llm.rpc_calls[-2]
    for (name, mine), theirs in zip(llm.model.named_parameters(), new.parameters()):
        assert torch.equal(mine, theirs), name
    assert llm.loads == 4
    moved = named[0][1]
    with torch.no_grad():
        moved.data = moved.data * 2   # new memory for the first parameter
    assert engine.sync_weights(2)
    (_, (_, handles2)), _ = llm.rpc_calls[-2:]
    assert [h is not None for h in handles2] == [True] + [False] * (len(named) - 1)
    assert torch.equal(dict(llm.model.named_parameters())[named[0][0]], moved)
    assert engine_fields("m", "bfloat16", 0.5, 0, tensor_parallel=2)["worker_extension_cls"] == EXTENSION


def test_a_worker_count_other_than_the_engines_is_an_error(old):
    policy = copy.deepcopy(old)
    llm = FakeTPLLM(policy, 3)
    engine = VllmEngine(llm, make_params, [EOS], policy=policy, tensor_parallel=2, share=llm.share)
    with pytest.raises(RuntimeError, match=r"vLLM's 2 workers loaded \[\d+, \d+, \d+\] of \d+ tensors"):
        engine.sync_weights(0)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_with_its_engine_core_in_a_process_of_its_own_each_token_has_the_version_that_drew_it(old, new, temperature):
    """The engine core steps on its own, up to 2 steps ahead of the stream's reading (the stand-in's
    thread, FakeMPLLM). As in the in-process test above, 3 prompts, G=2, at most 4 rows, 8 tokens
    each, swap() gives version 1 at its 2nd call, after the stream has read step 2; but by then the
    engine has run steps 3 and 4 with version 0, and the load comes between its steps 4 and 5. Each
    step's stamp against the load's end says so: the rows in flight have tokens 0-3 of version 0 and
    4-7 of version 1 (the in-process rule, the version in force when the stream reads a step, would
    have said 0-1 and 2-7), prompt 2 all version 1; every log-prob is that of the version it is
    tagged with (a teacher-forced pass of it), greedy tokens its argmax."""
    ps = prompts((5, 9, 3), seed=6)
    policy = copy.deepcopy(old)
    llm = FakeMPLLM(policy, seed=4, lead=2)
    engine = VllmEngine(llm, make_params, [], policy=policy, engine_process=True, share=llm.share)
    try:
        got = {g.key: g for g in engine.stream(source(enumerate(ps)), 2, NEW, temperature=temperature, rows=4,
                                               swap=SwapAt(policy, new, 2))}
    finally:
        llm.close()
    assert sorted(got) == [0, 1, 2] and llm.loads == 2 and not llm.requests
    span, after = [0] * 4 + [1] * (NEW - 4), [1] * NEW
    for k, want in {0: span, 1: span, 2: after}.items():
        assert [v.tolist() for v in got[k].versions] == [want, want], k
        assert (got[k].min_version, got[k].max_version) == (min(want), max(want))
    check_by_version(got, ps, {0: old, 1: new}, temperature)
    assert engine.stream_counts["swaps"] == 1 and len(engine.stamps) == 1 and engine.stamps[0][1] == 1
    fields = engine_fields("m", "bfloat16", 0.5, 0, engine_process=True)
    assert fields["worker_extension_cls"] == EXTENSION and "distributed_executor_backend" not in fields


def test_version_at_a_stamp_is_the_last_load_before_it():
    engine = VllmEngine(None, make_params, [EOS], engine_process=True)
    assert engine._version_at(5.0, 3) == 3   # no load known: the version in force
    engine.stamps = [(1.0, 0), (2.0, 1), (4.0, 2)]
    assert engine._version_at(1.5, 9) == 0 and engine.stamps == [(1.0, 0), (2.0, 1), (4.0, 2)]
    assert engine._version_at(3.0, 9) == 1 and engine.stamps == [(2.0, 1), (4.0, 2)]   # load 0 forgotten
    assert engine._version_at(4.0, 9) == 2 and engine.stamps == [(4.0, 2)]
    assert engine._version_at(0.5, 9) == 9   # before every load kept: the version in force
