"""Rollout throughput: the fast engine (grpo/generate/engine.py) against Hugging Face `generate`, side by side.

Usage (GPU machine, repo root):   python bench/rollout.py            (full, < 6 min on one H100)
                                  python bench/rollout.py --quick    (a minute)
Local smoke check:                python bench/rollout.py --device cpu --quick --model tiny-random

Throughput rows sample at temperature 1 with EOS ignored, so every row generates exactly
max_new_tokens and both engines do the same work (tokens/s = rows x new tokens / wall s).
One row per goal configuration also runs with EOS on (the sampler's real setting) and
counts only the tokens kept; on CUDA that row also measures the engine without CUDA graphs
(what the graph buys) and, in the full run, with `compile_decode=True` (torch.compile'd step,
then captured; an error there is recorded, not fatal). HF `generate` is slow, so it runs only where affordable
(listed under "hf_configs" in the JSON). Then two correctness checks on GSM8K prompts:
greedy agreement (fraction of prompts whose greedy completion is token-identical) and the
engine's sampled-token log-probs against a teacher-forced pass (grpo.model.logprobs.token_logprobs).
Writes bench/results/rollout_<device>.json.

--window-compare: a random-weight Mistral at SmolLM2-135M's size (Mistral-7B's attention pattern:
every layer a sliding window, here 128 slots, shorter than prompt plus new tokens) against the
same model with full attention, in tokens/s at fixed length (EOS ignored); writes
rollout_window_<device>.json.
"""
from __future__ import annotations

import argparse
import copy
import functools
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, Timer, pick, table, write_result  # noqa: E402

from grpo.data.prompts import problem_prompt
from grpo.data.sources import load_problems  # noqa: E402
from grpo.generate.backend import hf_generate  # noqa: E402
from grpo.generate.engine import RolloutEngine  # noqa: E402
from grpo.generate.vllm_engine import sampling_fields  # noqa: E402
from grpo.model.load import compute_dtype, eos_ids, load_causal_lm, load_tokenizer  # noqa: E402
from grpo.model.logprobs import left_pad, right_pad, token_logprobs  # noqa: E402
from grpo.model.zoo import resolve_model  # noqa: E402

GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
ENGINE_KW: dict = {}   # --attend-chunk: passed to every RolloutEngine this script makes
# The on/off flags that set every engine's keyword: (flag's dest, RolloutEngine keyword, its value when
# the flag is given, the result files' suffix, what the flag does), in the suffix's order
ENGINE_SWITCHES = (
    ("compile_ring", "compile_ring", True, "_ring_compiled",
     "every engine compiles its in-flight (stream) step only (the sampler's --compile-ring)"),
    ("refill_behind", "refill_behind", True, "_refill_behind",
     "every engine's in-flight stream queues a check's decode steps before its refill (the engine's refill_behind)"),
    ("no_fused_sampling", "fused_sampling", False, "_torch_sampling",
     "every engine samples with torch's ops, not the fused Triton kernel (the sampler's --no-fused-sampling)"),
    ("no_liger_decode", "liger_layers", False, "_hf_layers",
     "every engine decodes with Hugging Face's layers, not Liger-Kernel's (the sampler's --no-liger-decode)"))


def plan(quick: bool, cuda: bool):
    """(fast configs, hf configs, eos configs, agreement prompts, agreement tokens) per model."""
    if not cuda:  # smoke check: tiny everything
        return {"batches": [4], "new": [8], "hf": [(4, 8)], "eos": [(4, 8)], "agree": (4, 8), "qwen": [],
                "workload": (4, 2, 4, 8)}
    workload = (128, 8, 512, 256)   # prompts, G, rows, new tokens: the rollouts issue's EOS workload
    if quick:
        return {"batches": [64, 512], "new": [128, 256], "hf": [(64, 128), (512, 256)], "eos": [(512, 256)],
                "agree": (16, 128), "qwen": [(256, 128)], "workload": workload}
    return {"batches": [64, 256, 512, 1024], "new": [128, 256, 512],
            "hf": [(64, 128), (256, 128), (512, 128), (1024, 128), (512, 256)], "eos": [(512, 256)],
            "agree": (64, 256), "qwen": [(256, 128), (256, 256)], "workload": workload}


def gsm8k_prompts(tok, split: str, n: int) -> list[list[int]]:
    problems = load_problems(str(GSM8K), split, limit=n)  # GSM8K: set from --dataset in main()
    return [tok(problem_prompt(tok, p), add_special_tokens=False)["input_ids"] for p in problems]


def rows_for(prompts: list[list[int]], batch: int) -> list[list[int]]:
    """The sampler's layout: each prompt repeated batch/len(prompts) times, contiguously."""
    if batch <= len(prompts):
        return prompts[:batch]
    return [prompts[(i * len(prompts)) // batch] for i in range(batch)]


def run_fast(engine: RolloutEngine, rows, new: int, device, eos_on: bool) -> dict:
    first = Timer(device)
    with first:  # includes the one-time graph capture for this shape
        engine.generate(rows, new, temperature=1.0)
    with Timer(device) as t:
        out = engine.generate(rows, new, temperature=1.0)
    tokens = sum(len(r) for r in out.token_ids)
    if not eos_on:
        assert tokens == len(rows) * new, (tokens, len(rows) * new)
    return {"tok_s": tokens / t.s, "s": t.s, "tokens": tokens, "peak_gib": t.peak_gib,
            "first_call_s": first.s, "cuda_graphs": out.stats["cuda_graphs"],
            "graph_failures": out.stats.get("graph_failures", [])}


def run_hf(model, rows, new: int, device, pad_id: int, eos_id: list[int] | None) -> dict:
    ids, attn = left_pad(rows, pad_id, device)
    width = ids.shape[1]
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = eos_id or None  # None: no stopping, exactly `new` tokens per row
    gc.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=pad_id, max_new_tokens=4)
    model.generate(input_ids=ids[:2], attention_mask=attn[:2], generation_config=gc)  # warm-up
    gc.max_new_tokens = new
    with Timer(device) as t:
        out = model.generate(input_ids=ids, attention_mask=attn, generation_config=gc)
    gen = out[:, width:]
    if not eos_id:
        tokens = gen.numel()
    else:  # kept tokens: up to and including the first EOS
        hit = torch.isin(gen, torch.tensor(eos_id, device=gen.device))
        first = torch.where(hit.any(1), hit.float().argmax(1) + 1, torch.full_like(hit[:, 0], gen.shape[1], dtype=torch.long))
        tokens = int(first.sum())
    return {"tok_s": tokens / t.s, "s": t.s, "tokens": tokens, "peak_gib": t.peak_gib}


def throughput(name: str, model, tok, device, p: dict, configs_fast, configs_hf, eos_cfgs,
               compile_decode: bool = False) -> list[dict]:
    prompts = gsm8k_prompts(tok, "train", 64)
    no_eos = RolloutEngine(model, [], tok.pad_token_id, **ENGINE_KW)
    with_eos = RolloutEngine(model, eos_ids(tok, model), tok.pad_token_id, **ENGINE_KW)
    rows_out = []
    for batch, new in configs_fast:
        rows = rows_for(prompts, batch)
        r = {"model": name, "rows": batch, "new": new}
        f = run_fast(no_eos, rows, new, device, eos_on=False)
        no_eos.clear()
        r.update({"fast_tok_s": f["tok_s"], "fast_s": f["s"], "fast_peak_gib": f["peak_gib"],
                  "fast_first_call_s": f["first_call_s"], "cuda_graphs": f["cuda_graphs"]})
        if f["graph_failures"]:
            r["graph_failures"] = f["graph_failures"]
        if (batch, new) in configs_hf:
            h = run_hf(model, rows, new, device, tok.pad_token_id, None)
            r.update({"hf_tok_s": h["tok_s"], "hf_s": h["s"], "hf_peak_gib": h["peak_gib"],
                      "speedup": f["tok_s"] / h["tok_s"]})
        if (batch, new) in eos_cfgs:  # the sampler's real setting: stop at EOS, count kept tokens
            fe = run_fast(with_eos, rows, new, device, eos_on=True)
            with_eos.clear()
            he = run_hf(model, rows, new, device, tok.pad_token_id, eos_ids(tok, model))
            r.update({"eos_fast_tok_s": fe["tok_s"], "eos_fast_tokens": fe["tokens"], "eos_hf_tok_s": he["tok_s"],
                      "eos_hf_tokens": he["tokens"], "eos_speedup": fe["tok_s"] / he["tok_s"]})
            if device.type == "cuda":  # what the graph buys: the same engine decoding eagerly
                eager = RolloutEngine(model, [], tok.pad_token_id, cuda_graphs=False, buckets=(batch,), **ENGINE_KW)
                r["fast_eager_tok_s"] = run_fast(eager, rows, new, device, eos_on=False)["tok_s"]
                eager.clear()
                if compile_decode:  # opt-in engine switch: torch.compile the step, then capture it
                    try:
                        comp = RolloutEngine(model, [], tok.pad_token_id, **{**ENGINE_KW, "compile_decode": True})
                        c = run_fast(comp, rows, new, device, eos_on=False)
                        r.update({"fast_compiled_tok_s": c["tok_s"], "fast_compiled_first_call_s": c["first_call_s"],
                                  "fast_compiled_cuda_graphs": c["cuda_graphs"]})
                        comp.clear()
                    except Exception as exc:  # noqa: BLE001 - reported in the results, the rest still runs
                        r["fast_compiled_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        rows_out.append(r)
        print(table([r], list(r)), flush=True)
    return rows_out


# SmolLM2-135M's shapes (its config.json) as a Mistral: what --window-compare decodes.
SMOL_AS_MISTRAL = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                       num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
                       rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)
WINDOW = 128


def window_model(window: int | None, device, dtype, tok):
    """Random weights (the same draw for both windows), SmolLM2's tokenizer ids."""
    from transformers import AutoModelForCausalLM, MistralConfig

    cfg = MistralConfig(**SMOL_AS_MISTRAL, sliding_window=window, bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if device.type == "cpu":   # the smoke run: a two-layer model
        cfg.num_hidden_layers = 2
    torch.manual_seed(1234)
    with device:
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa").eval()


def window_compare(tok, device, dtype, configs) -> dict:
    """tokens/s of the sliding-window model and the full-attention one, each (rows, new) config
    twice in alternation (window, full, window, full) so that clocks and the allocator's state
    favour neither; the best of the two runs counts."""
    prompts = gsm8k_prompts(tok, "train", 64)
    lengths = [len(p) for p in prompts]
    rows_out = []
    models = {w: window_model(w, device, dtype, tok) for w in (WINDOW, None)}
    from grpo.generate.attention import layer_plan

    kinds = {str(w): sorted(set(layer_plan(m).kinds)) for w, m in models.items()}
    for batch, new in configs:
        rows = rows_for(prompts, batch)
        r = {"rows": batch, "new": new, "prompt_tokens_min": min(lengths), "prompt_tokens_max": max(lengths)}
        runs: dict = {WINDOW: [], None: []}
        for _ in range(2):
            for w, m in models.items():
                eng = RolloutEngine(m, [], tok.pad_token_id, **ENGINE_KW)
                runs[w].append(run_fast(eng, rows, new, device, eos_on=False))
                eng.clear()
        best = {w: max(x["tok_s"] for x in v) for w, v in runs.items()}
        r.update({"window_tok_s": best[WINDOW], "full_tok_s": best[None], "window_vs_full": best[WINDOW] / best[None],
                  "window_runs_tok_s": [x["tok_s"] for x in runs[WINDOW]],
                  "full_runs_tok_s": [x["tok_s"] for x in runs[None]],
                  "cuda_graphs": all(x["cuda_graphs"] for v in runs.values() for x in v)})
        rows_out.append(r)
        print(table([r], list(r)), flush=True)
    return {"layer_kinds": kinds, "rows": rows_out}


def eos_workload(model, tok, device, n_prompts: int, G: int, rows: int, new: int, hf: bool = True,
                 consumer_ms: float = 0.0, stream_only: bool = False) -> dict:
    """The rollouts issue's workload: n_prompts GSM8K train prompts x G samples with EOS allowed,
    up to `new` tokens, through `rows` rows, timed to the last completion; useful tokens = tokens
    kept (up to and including EOS). Three ways: the engine's in-flight batching (`stream`: a group
    leaves when its rows end and the next prompt takes them), the same engine in fixed batches of
    `rows` (`generate`), and Hugging Face `generate` in batches of `rows`. Each engine runs the
    workload once untimed first (graph capture), then timed. consumer_ms: the stream's caller sleeps
    this long for each group it is given (a stand-in for a sampler's scoring and sending, which
    run while the stream is suspended). stream_only: the stream alone (no fixed batches, no HF)."""
    prompts = gsm8k_prompts(tok, "train", n_prompts)
    flat = [p for p in prompts for _ in range(G)]
    out = {"prompts": n_prompts, "G": G, "rows": rows, "max_new_tokens": new, "consumer_ms": consumer_ms}
    streamed = functools.partial(stream_tokens, prompts=prompts, G=G, new=new, rows=rows, consumer_ms=consumer_ms)
    stream_engine = RolloutEngine(model, eos_ids(tok, model), tok.pad_token_id, **ENGINE_KW)
    with Timer(device) as first:   # captures (and with compile_decode compiles) the ring's step
        streamed(stream_engine)
    out["eos_stream_first_call_s"] = first.s
    before = dict(stream_engine.stream_counts)
    with Timer(device) as t:
        tokens = streamed(stream_engine)
    out.update(eos_stream_tok_s=tokens / t.s, eos_stream_tokens=tokens, eos_stream_s=t.s,
               # where the timed stream's seconds went (grpo.generate.stream.STREAM_COUNTS)
               eos_stream_counts={k: v - before[k] for k, v in stream_engine.stream_counts.items()},
               check_every=stream_engine.check_every)
    stream_engine.clear()
    if stream_only:
        return out
    fixed = RolloutEngine(model, eos_ids(tok, model), tok.pad_token_id,
                          buckets=(rows,) if device.type == "cuda" else None, **ENGINE_KW)
    with Timer(device) as first:
        fixed.generate(flat[:rows], new, temperature=1.0)
    out["eos_fast_first_call_s"] = first.s
    with Timer(device) as t:
        res = fixed.generate(flat, new, temperature=1.0)   # in batches of `rows` (its largest bucket)
    tokens = sum(len(r) for r in res.token_ids)
    out.update(eos_fast_tok_s=tokens / t.s, eos_fast_tokens=tokens, eos_fast_s=t.s)
    fixed.clear()
    if not hf:
        return out
    hf_tokens, hf_s = 0, 0.0
    for s in range(0, len(flat), rows):
        h = run_hf(model, flat[s:s + rows], new, device, tok.pad_token_id, eos_ids(tok, model))
        hf_tokens, hf_s = hf_tokens + h["tokens"], hf_s + h["s"]
    out.update(eos_hf_tok_s=hf_tokens / hf_s, eos_hf_tokens=hf_tokens, eos_hf_s=hf_s,
               stream_vs_hf=out["eos_stream_tok_s"] * hf_s / hf_tokens,
               fixed_vs_hf=out["eos_fast_tok_s"] * hf_s / hf_tokens)
    return out


def stream_tokens(engine, prompts: list[list[int]], G: int, new: int, rows: int, consumer_ms: float = 0.0) -> int:
    """The prompts through `engine`'s in-flight stream (ours or vLLM's: grpo.generate.stream's
    interface), G samples each at temperature 1 on `rows` rows; the tokens kept."""
    it = iter(enumerate(prompts))
    tokens = 0
    for g in engine.stream(lambda: next(it, None), G, new, temperature=1.0, rows=rows):
        tokens += sum(len(r) for r in g.token_ids)
        if consumer_ms:
            time.sleep(consumer_ms / 1e3)
    return tokens


def vllm_workload(path: str, model, tok, device, n_prompts: int, G: int, rows: int, new: int,
                  gpu_memory_utilization: float, consumer_ms: float = 0.0, engine_process: bool = False) -> dict:
    """eos_workload's in-flight stream through vLLM's engine (--generation-backend vllm's VllmEngine,
    its engine core in this process, stepped by hand, or with `engine_process` in its own, at most
    `rows` sequences at once) on the same prompts: run once untimed (vLLM's start, its graphs, the
    copy of `model`'s weights in), then timed."""
    from grpo.generate.vllm_engine import VllmEngine

    prompts = gsm8k_prompts(tok, "train", n_prompts)
    t0 = time.perf_counter()
    engine = VllmEngine.build(path, model, eos_ids(tok, model), next(model.parameters()).dtype,
                              gpu_memory_utilization, seed=0, rows=rows, max_model_len=max(map(len, prompts)) + new,
                              engine_process=engine_process)
    out = {"vllm_build_s": time.perf_counter() - t0, "vllm_gpu_memory_utilization": gpu_memory_utilization,
           "vllm_engine_process": engine_process}
    streamed = functools.partial(stream_tokens, engine, prompts, G, new, rows, consumer_ms)
    with Timer(device) as first:
        streamed()
    out["vllm_stream_first_call_s"] = first.s
    before = dict(engine.stream_counts)
    with Timer(device) as t:
        tokens = streamed()
    out.update(vllm_stream_tok_s=tokens / t.s, vllm_stream_tokens=tokens, vllm_stream_s=t.s,
               vllm_stream_counts={k: v - before[k] for k, v in engine.stream_counts.items()})
    if engine_process:
        engine.close()   # its process and the GPU memory it holds
    del engine
    return out


def agreement(model, tok, device, n: int, new: int) -> dict:
    prompts = gsm8k_prompts(tok, "test", n)
    eos, pad = eos_ids(tok, model), tok.pad_token_id
    engine = RolloutEngine(model, eos, pad, **ENGINE_KW)
    fast = engine.generate(prompts, new, greedy=True).token_ids
    ref, _ = hf_generate(model, prompts, new, 1.0, True, eos, pad)
    diverge = []
    for i, (a, b) in enumerate(zip(fast, ref)):
        if a != b:
            at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diverge.append({"prompt": i, "first_diff_token": at, "fast_len": len(a), "hf_len": len(b)})
    # Sampled log-probs: engine's (decode-time) against a teacher-forced pass over the same tokens.
    torch.manual_seed(0)
    sampled = engine.generate(prompts, new, temperature=1.0)
    diffs = []
    whole = [p + g for p, g in zip(prompts, sampled.token_ids)]
    for s in range(0, len(whole), 16):
        ids, mask = right_pad(whole[s:s + 16], pad, device)
        with torch.no_grad():
            tf = token_logprobs(model, ids, mask, 1.0).float().cpu().numpy()
        for j in range(ids.shape[0]):
            i = s + j
            p, g = len(prompts[i]), len(sampled.token_ids[i])
            diffs.append(np.abs(sampled.logprobs[i] - tf[j, p - 1:p - 1 + g]))
    d = np.concatenate(diffs)
    engine.clear()
    return {"prompts": n, "max_new_tokens": new, "greedy_identical": (n - len(diverge)) / n,
            "greedy_divergent": diverge, "logprob_tokens": int(d.size), "logprob_absdiff_mean": float(d.mean()),
            "logprob_absdiff_p99": float(np.quantile(d, 0.99)), "logprob_absdiff_max": float(d.max()),
            "logprob_within_0.05": float((d <= 0.05).mean())}


def main() -> int:
    global GSM8K
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--quick", action="store_true", help="fewer configurations (CPU: a tiny smoke run)")
    ap.add_argument("--model", default="smollm2", help="main model (default smollm2; tiny-random for a CPU smoke run)")
    ap.add_argument("--dataset", default=str(GSM8K), help="GSM8K folder with train.jsonl/test.jsonl (default ../shared/data/gsm8k)")
    ap.add_argument("--no-qwen", action="store_true", help="skip the random:qwen2.5-3b rows")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd engine row (full run, CUDA)")
    ap.add_argument("--attend-chunk", type=int, default=0,
                    help="every engine attends only to the filled cache in chunks of this many slots (default 0: the "
                         "whole cache, as the earlier result files; the sampler's default is 64); the result files "
                         "get an _attendN suffix")
    ap.add_argument("--compile-decode", action="store_true",
                    help="every engine runs its decode step through torch.compile before capture (the sampler's "
                         "--compile-decode); the result files get a _compiled suffix")
    for dest, _, _, tag, what in ENGINE_SWITCHES:
        ap.add_argument("--" + dest.replace("_", "-"), action="store_true",
                        help=f"{what}; the result files get a {tag} suffix")
    ap.add_argument("--check-every", type=int, default=0,
                    help="decode steps between the engines' host checks (default: the engine's, 16); the result "
                         "files get a _checkN suffix")
    ap.add_argument("--stream-only", action="store_true",
                    help="--workload-only: the in-flight stream alone (no fixed batches, no fixed-length rate)")
    ap.add_argument("--workload-only", action="store_true",
                    help="only the EOS workload (in-flight, fixed batches, HF generate) and the fixed-length rate "
                         "at its rows x new tokens; writes rollout_workload_<device>.json")
    ap.add_argument("--skip-hf", action="store_true", help="--workload-only: leave out Hugging Face generate")
    ap.add_argument("--vllm", type=float, default=0.0, metavar="GPU_MEMORY_UTILIZATION",
                    help="--workload-only: the in-flight stream through vLLM's engine too (the sampler's "
                         "--generation-backend vllm), after ours, with this share of the GPU; needs vLLM installed")
    ap.add_argument("--vllm-engine-process", action="store_true",
                    help="--vllm: vLLM's engine core in a process of its own (the sampler's "
                         "--vllm-engine-process; without: in this process, the sampler's default)")
    ap.add_argument("--workload", default="", help="--workload-only: PROMPTS,G,ROWS,NEW instead of the plan's "
                    "(128,8,512,256 on CUDA); the result file's name then says them")
    ap.add_argument("--consumer-ms", type=float, default=0.0,
                    help="--workload-only: the in-flight stream's caller sleeps this many ms per group it is given "
                         "(a stand-in for a sampler's scoring and sending); the result file gets a _consumerN suffix")
    ap.add_argument("--window-compare", action="store_true",
                    help=f"only the sliding-window comparison: SmolLM2-135M's shapes as a random Mistral with a "
                         f"{WINDOW}-slot window on every layer against full attention; writes "
                         f"rollout_window_<device>.json")
    args = ap.parse_args()
    suffix = (f"_attend{args.attend_chunk}" if args.attend_chunk else "") + ("_compiled" if args.compile_decode else "")
    ENGINE_KW["attend_chunk"] = args.attend_chunk or None   # 0: the whole cache (the engine's default is 64)
    if args.compile_decode:
        ENGINE_KW["compile_decode"] = True
    for dest, keyword, value, tag, _ in ENGINE_SWITCHES:
        if getattr(args, dest):
            ENGINE_KW[keyword] = value
            suffix += tag
    if args.check_every:
        ENGINE_KW["check_every"] = args.check_every
        suffix += f"_check{args.check_every}"
    GSM8K = Path(args.dataset)
    if not (GSM8K / "train.jsonl").is_file():
        print(f"bench/rollout.py: error: no train.jsonl in {GSM8K}; pass --dataset PATH_TO_GSM8K", file=sys.stderr)
        return 2
    device = pick(args.device)
    torch.manual_seed(0)
    p = plan(args.quick, device.type == "cuda")
    if args.workload:
        try:
            p["workload"] = tuple(int(x) for x in args.workload.split(","))
            assert len(p["workload"]) == 4 and min(p["workload"]) > 0
        except (ValueError, AssertionError):
            print(f"bench/rollout.py: error: --workload {args.workload!r}: give PROMPTS,G,ROWS,NEW, four positive "
                  f"integers, e.g. 96,16,512,512", file=sys.stderr)
            return 2
        suffix += "_" + "x".join(map(str, p["workload"]))
    if args.consumer_ms:
        suffix += f"_consumer{args.consumer_ms:g}"
    if args.vllm and (not args.workload_only or device.type != "cuda"):
        print("bench/rollout.py: error: --vllm measures the in-flight workload on CUDA: add --workload-only and run "
              "it on a GPU", file=sys.stderr)
        return 2
    if args.vllm_engine_process and not args.vllm:
        print("bench/rollout.py: error: --vllm-engine-process sets how --vllm runs vLLM's engine: give --vllm "
              "GPU_MEMORY_UTILIZATION too", file=sys.stderr)
        return 2
    suffix += ("_vllm_process" if args.vllm_engine_process else "_vllm") if args.vllm else ""
    dtype = compute_dtype(device)
    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    if args.window_compare:
        cfgs = [(4, 8)] if device.type == "cpu" else [(64, 512), (256, 512), (256, 1024)]
        result = window_compare(tok, device, dtype, cfgs)
        settings = {"model": "SmolLM2-135M's shapes as MistralForCausalLM, random weights (seed 1234)",
                    # torch.manual_seed(0) at the start, (1234) before each model's weights; the engines'
                    # sampling generators are seeded from torch's RNG after that (grpo.generate.sampling)
                    "seeds": {"start": 0, "weights": 1234},
                    "shapes": SMOL_AS_MISTRAL, "sliding_window": WINDOW, "dtype": str(dtype),
                    "attend_chunk": args.attend_chunk or None, "configs": cfgs, "temperature": 1.0,
                    "eos": "ignored: every row generates exactly `new` tokens",
                    "prompts": "GSM8K train, first 64, chat template (SmolLM2's tokenizer), each repeated rows/64 times"}
        print(f"wrote {write_result('rollout_window' + suffix, device, {'settings': settings, **result})}")
        return 0
    model = load_causal_lm(path, device, dtype).eval()
    fast_cfgs = [(b, n) for b in p["batches"] for n in p["new"]]
    if args.workload_only:
        _, _, rows_n, new_n = p["workload"]
        work = eos_workload(model, tok, device, *p["workload"], hf=not args.skip_hf, consumer_ms=args.consumer_ms,
                            stream_only=args.stream_only)
        if args.vllm:
            torch.cuda.empty_cache()   # ours' stream and fixed batches gave their caches back (clear())
            work.update(vllm_workload(str(path), model, tok, device, *p["workload"], args.vllm,
                                      consumer_ms=args.consumer_ms, engine_process=args.vllm_engine_process))
            work["vllm_vs_ours_stream"] = work["vllm_stream_tok_s"] / work["eos_stream_tok_s"]
        if not args.stream_only:
            fixed = throughput(args.model, model, tok, device, p, [(rows_n, new_n)], [], [])
            work["fixed_length_tok_s"] = fixed[0]["fast_tok_s"]
            work["stream_vs_fixed_length"] = work["eos_stream_tok_s"] / fixed[0]["fast_tok_s"]
        row = {k: v for k, v in work.items() if not isinstance(v, dict)}
        print(table([row], list(row)), flush=True)
        print("stream counts: " + ", ".join(f"{k} {v:.6g}" for k, v in work["eos_stream_counts"].items()), flush=True)
        settings = {"model": args.model, "dtype": str(dtype), "attend_chunk": args.attend_chunk or None, "seed": 0,
                    "compile_decode": args.compile_decode, "compile_ring": args.compile_ring,
                    "refill_behind": args.refill_behind, "fused_sampling": not args.no_fused_sampling,
                    "liger_decode": not args.no_liger_decode, "stream_only": args.stream_only,
                    "vllm_gpu_memory_utilization": args.vllm or None,
                    "vllm_engine_process": args.vllm_engine_process if args.vllm else None,
                    # (results made before vLLM's requests asked for flat log-probs lack the key)
                    **({"vllm_flat_logprobs": sampling_fields(1.0, False, 1, [])["flat_logprobs"]} if args.vllm else {})}
        print(f"wrote {write_result('rollout_workload' + suffix, device, {'settings': settings, 'eos_workload': work})}")
        return 0
    rows = throughput(args.model, model, tok, device, p, fast_cfgs, p["hf"], p["eos"],
                      compile_decode=not (args.quick or args.no_compile))
    work = eos_workload(model, tok, device, *p["workload"])
    fixed_rate = next((r["fast_tok_s"] for r in rows if (r["rows"], r["new"]) == (work["rows"], work["max_new_tokens"])),
                      None)
    work["stream_vs_fixed_length"] = work["eos_stream_tok_s"] / fixed_rate if fixed_rate else None
    print(table([work], list(work)), flush=True)
    agree = agreement(model, tok, device, *p["agree"])
    del model
    # fp32 too: there the two paths' different summation orders stay ~1e-6 apart, so greedy
    # identity tests the engine's algorithm; in bf16 near-ties of the coarse logits flip.
    m32 = load_causal_lm(path, device, torch.float32).eval()
    agree32 = agreement(m32, tok, device, *p["agree"])
    del m32
    for label, a in ((str(dtype), agree), ("torch.float32", agree32)):
        print(f"{label}: greedy agreement on {a['prompts']} GSM8K prompts x {a['max_new_tokens']} tokens: "
              f"{a['greedy_identical']:.3f}; log-prob |diff| mean {a['logprob_absdiff_mean']:.2e} "
              f"p99 {a['logprob_absdiff_p99']:.2e} max {a['logprob_absdiff_max']:.2e}", flush=True)
    qwen = []
    if p["qwen"] and not args.no_qwen:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        qpath = resolve_model("random:qwen2.5-3b")
        qmodel = load_causal_lm(qpath, device, dtype).eval()
        qwen = throughput("random:qwen2.5-3b", qmodel, load_tokenizer(qpath), device, p, p["qwen"], p["qwen"][:1], [])
        del qmodel
    all_rows = rows + qwen
    cols = ["model", "rows", "new", "fast_tok_s", "hf_tok_s", "speedup", "fast_peak_gib", "hf_peak_gib",
            "fast_first_call_s", "cuda_graphs"]
    print("\n" + table(all_rows, cols))
    out = write_result("rollout" + suffix, device, {
        "settings": {"quick": args.quick, "model": args.model, "dtype": str(dtype), "temperature": 1.0,
                     "top_k": 0, "top_p": 1.0, "prompts": "GSM8K train, first 64, chat template, each repeated rows/64 times",
                     "eos": "ignored in throughput rows (every row generates exactly `new` tokens); eos_* columns stop at EOS and count kept tokens",
                     "fast_configs": fast_cfgs, "hf_configs": p["hf"] + [("random:qwen2.5-3b",) + c for c in p["qwen"][:1]],
                     "hf_note": "HF generate runs only where affordable within the time budget"},
        "rows": all_rows, "eos_workload": work, "agreement": agree, "agreement_fp32": agree32})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
