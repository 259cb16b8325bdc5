"""Where vLLM's time goes when the sampler steps it by hand (grpo.generate.vllm_engine), against vLLM
driving itself, on the same prompts: bench/rollout.py's in-flight workload (GSM8K train prompts x G,
temperature 1, our EOS ids, up to NEW tokens, at most ROWS sequences at once), one mode a process:

  stream          VllmEngine.stream as a sampler runs it (in process, async scheduling off, DELTA
                  outputs, the sampled log-probs), the timed pass under cProfile: its top functions
  generate-sync   vLLM's own LLM.generate in process with async scheduling off, log-probs on
  generate-async  the same with async scheduling on (vLLM overlaps its host work with the GPU)
  generate-async-nolp  async scheduling on, no log-probs
  generate-mp     vLLM's defaults: its engine core in a process of its own, async scheduling on,
                  log-probs on (what a sampler would get by not running vLLM in process)
  generate-mp-nolp     the same without log-probs (the usual serving setting)

Each mode builds its engine, runs a short warm-up (graphs, compiled kernels), then the timed pass.
Convert a GGUF model once first (`python -c "from grpo.model.zoo import resolve_model; resolve_model(PATH)"`):
the first mode otherwise pays the conversion inside its time limit.
Usage (GPU machine, vLLM installed):
  python bench/vllm_overhead.py --model /tmp/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
      --dataset /tmp/data/gsm8k --mode stream
Writes bench/results/vllm_overhead_<mode>_<model>_<device>.json (<model>: the registry's short name of a
GGUF file it knows, else the name given, as a file name).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import pick, write_result  # noqa: E402
from rollout import stream_tokens  # noqa: E402  (bench/rollout.py's in-flight workload, the same count)

from grpo.data.prompts import problem_prompt  # noqa: E402
from grpo.data.sources import load_problems  # noqa: E402
from grpo.generate.vllm_engine import engine_fields, sampling_fields  # noqa: E402
from grpo.model.fetch import MODELS  # noqa: E402
from grpo.model.load import compute_dtype, eos_ids, load_causal_lm, load_tokenizer  # noqa: E402
from grpo.model.zoo import resolve_model  # noqa: E402

MODES = ("stream", "generate-sync", "generate-async", "generate-async-nolp", "generate-mp", "generate-mp-nolp")


def top_functions(prof: cProfile.Profile, key: str, n: int = 25) -> list[dict]:
    """The profile's first n functions by `key` ('tottime' or 'cumulative')."""
    stats = pstats.Stats(prof, stream=io.StringIO())
    stats.sort_stats(key)
    rows = []
    for func in stats.fcn_list[:n]:
        cc, nc, tt, ct, _ = stats.stats[func]
        rows.append({"function": f"{Path(func[0]).name}:{func[1]}:{func[2]}", "calls": nc,
                     "tottime_s": round(tt, 3), "cumtime_s": round(ct, 3)})
    return rows


def model_tag(model: str) -> str:
    """The model's part of the result's file name: '/tmp/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf' ->
    'qwen2.5-coder-0.5b' (the registry's name for that file), 'random:qwen2.5-7b' -> 'random-qwen2.5-7b'."""
    name = Path(model).name
    short = next((k for k, spec in MODELS.items() if spec["file"] == name), None)
    return short or re.sub(r"[^A-Za-z0-9._-]+", "-", name.removesuffix(".gguf"))


def run_stream(path: str, policy, prompts, eos, args, device) -> dict:
    from grpo.generate.vllm_engine import VllmEngine

    t0 = time.perf_counter()
    engine = VllmEngine.build(path, policy, eos, compute_dtype(device), args.gpu_memory_utilization, seed=0,
                              rows=args.rows, max_model_len=max(map(len, prompts)) + args.new)
    build_s = time.perf_counter() - t0

    def one(ps):
        return stream_tokens(engine, ps, args.G, args.new, args.rows)

    one(prompts[:args.warm])
    before = dict(engine.stream_counts)
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    prof.enable()
    tokens = one(prompts)
    prof.disable()
    torch.cuda.synchronize()
    s = time.perf_counter() - t0
    counts = {k: v - before[k] for k, v in engine.stream_counts.items()}
    return {"build_s": build_s, "tokens": tokens, "seconds": s, "tok_s": tokens / s, "counts": counts,
            "ms_per_step": 1e3 * counts["decode_s"] / max(counts["steps"], 1),
            "profiled": True, "top_tottime": top_functions(prof, "tottime"),
            "top_cumulative": top_functions(prof, "cumulative")}


def run_generate(path: str, prompts, eos, args, asynchronous: bool, logprobs: bool, in_process: bool = True) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    from vllm import LLM, SamplingParams  # here: vLLM is an optional extra (and reads the variable above at import)

    fields = engine_fields(path, "bfloat16", args.gpu_memory_utilization, 0, args.rows,
                           max_model_len=max(map(len, prompts)) + args.new)
    fields["async_scheduling"] = asynchronous
    if not logprobs:
        fields.pop("logprobs_mode")
    t0 = time.perf_counter()
    llm = LLM(**fields)
    build_s = time.perf_counter() - t0
    sp = sampling_fields(1.0, False, args.new, eos)
    if not logprobs:
        sp.pop("logprobs")
    params = SamplingParams(**sp)

    def one(ps):
        outs = llm.generate([{"prompt_token_ids": p} for p in ps for _ in range(args.G)], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    one(prompts[:args.warm])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tokens = one(prompts)
    torch.cuda.synchronize()
    s = time.perf_counter() - t0
    return {"build_s": build_s, "tokens": tokens, "seconds": s, "tok_s": tokens / s, "profiled": False}


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the model (a GGUF file, folder or hub id)")
    ap.add_argument("--dataset", required=True, help="GSM8K folder (train.jsonl)")
    ap.add_argument("--mode", choices=MODES, required=True, help="what to time (the module's docstring)")
    ap.add_argument("--prompts", type=int, default=48, help="GSM8K train prompts in the timed pass")
    ap.add_argument("--warm", type=int, default=8, help="prompts of the untimed warm-up pass")
    ap.add_argument("--G", type=int, default=16, help="samples per prompt")
    ap.add_argument("--rows", type=int, default=320, help="sequences at once (max_num_seqs)")
    ap.add_argument("--new", type=int, default=512, help="new tokens at most")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="vLLM's share of the GPU")
    args = ap.parse_args()
    device = pick("cuda")
    path = str(resolve_model(args.model))
    tok = load_tokenizer(path)
    problems = load_problems(args.dataset, "train", limit=args.prompts)
    prompts = [tok(problem_prompt(tok, p), add_special_tokens=False)["input_ids"] for p in problems]
    policy = load_causal_lm(path, device, compute_dtype(device)).eval()   # the sampler's weights (stream copies them in)
    eos = eos_ids(tok, policy)
    if args.mode == "stream":
        res = run_stream(path, policy, prompts, eos, args, device)
    else:
        del policy
        res = run_generate(path, prompts, eos, args, asynchronous=args.mode != "generate-sync",
                           logprobs=not args.mode.endswith("-nolp"), in_process=not args.mode.startswith("generate-mp"))
    print(f"{args.mode}: {res['tokens']} tokens in {res['seconds']:.2f} s = {res['tok_s']:,.0f} tok/s "
          f"(build {res['build_s']:.1f} s)", flush=True)
    for r in res.get("top_tottime", [])[:15]:
        print(f"  {r['tottime_s']:8.3f} {r['cumtime_s']:8.3f} {r['calls']:>8} {r['function']}")
    settings = {k: getattr(args, k) for k in ("mode", "prompts", "warm", "G", "rows", "new", "gpu_memory_utilization")}
    # (results made before the requests asked for flat log-probs lack the key: they ran without)
    settings.update(model=args.model, temperature=1.0, seed=0,
                    flat_logprobs=sampling_fields(1.0, False, 1, eos)["flat_logprobs"])
    out = write_result(f"vllm_overhead_{args.mode}_{model_tag(args.model)}", device, {"settings": settings, "result": res},
                       extra_versions=("vllm",), results_dir=Path(d) if (d := os.environ.get("RESULTS_DIR")) else None)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
