"""What a weights swap into vLLM adds to its decode (issue 61's 50 ms goal): the sampler's vLLM engine
(grpo.generate.vllm_engine.VllmEngine: in process, stepped by hand, or with --vllm-engine-process its
engine core in a process of its own, the sampler's --vllm-engine-process) streams the same prompts twice
each way, alternating: without swaps, and with swap() giving a new version every --swap-every steps,
so that the engine copies the policy's every parameter into vLLM's model between two steps
(sync_weights, as a sampler's in-flight swap does).

Usage (GPU machine, vLLM installed):
    python bench/vllm_swap.py --model /tmp/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --dataset /tmp/data/gsm8k

No EOS ids (every sample runs --new tokens), so both ways do the same decode work; the difference in
wall time over the swaps is what a swap adds, host and device together. The swap's own host time
(the stream's swap_s) is given too. Writes bench/results/vllm_swap_<model>_<device>.json.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import write_result  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--rows", type=int, default=320)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--swap-every", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--vllm-engine-process", action="store_true",
                    help="vLLM's engine core in a process of its own (the sampler's --vllm-engine-process; "
                         "without: in this process, the sampler's default)")
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)
    from grpo.data.prompts import build_prompt
    from grpo.data.sources import load_problems
    from grpo.generate.vllm_engine import VllmEngine
    from grpo.model.load import load_causal_lm, load_tokenizer
    from grpo.model.zoo import resolve_model

    cuda = torch.device("cuda", 0)
    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    policy = load_causal_lm(path, cuda, torch.bfloat16).eval()
    problems = load_problems(args.dataset, "train", limit=args.prompts, seed=0)
    prompts = [tok(build_prompt(tok, p.question), add_special_tokens=False)["input_ids"] for p in problems]
    t0 = time.perf_counter()
    engine = VllmEngine.build(path, policy, [], torch.bfloat16, gpu_memory_utilization=0.5, seed=0, rows=args.rows,
                              cuda_graphs=True, max_model_len=1024, engine_process=args.vllm_engine_process)
    build_s = time.perf_counter() - t0

    def run(swaps: bool) -> dict:
        counts = engine.stream_counts
        for k in counts:
            counts[k] = 0.0
        calls, version = [0], [0]

        def swap():
            calls[0] += 1
            if calls[0] % args.swap_every:
                return None
            version[0] += 1
            return version[0]

        src = iter(enumerate(prompts))
        engine.loaded = None   # the stream copies version 0 in first, both ways
        torch.cuda.synchronize()
        t = time.perf_counter()
        groups = list(engine.stream(lambda: next(src, None), args.group, args.new, temperature=1.0, rows=args.rows,
                                    swap=swap if swaps else None, version=0))
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
        tokens = sum(len(r) for g in groups for r in g.token_ids)
        return {"wall_s": round(wall, 3), "steps": int(counts["steps"]), "swaps": int(counts["swaps"]),
                "swap_host_s": round(counts["swap_s"], 4), "decode_s": round(counts["decode_s"], 3),
                "tokens": tokens, "groups": len(groups)}

    run(False)   # warm-up: the first stream's one-time costs
    plain, swapped = [], []
    for _ in range(args.reps):
        plain.append(run(False))
        swapped.append(run(True))
    engine.close()   # vLLM's processes apart stopped while this one is whole
    added = [(s["wall_s"] - p["wall_s"]) / max(1, s["swaps"]) for p, s in zip(plain, swapped)]
    host = [s["swap_host_s"] / max(1, s["swaps"]) for s in swapped]
    step_ms = [1000 * p["wall_s"] / max(1, p["steps"]) for p in plain]
    name = Path(args.model).stem.split("-instruct")[0] + ("_process" if args.vllm_engine_process else "")
    result = {"command": " ".join(["python3", "bench/vllm_swap.py", *(argv or sys.argv[1:])]),
              "made_by": "bench/vllm_swap.py", "seeds": [0], "model": args.model,
              "engine_process": args.vllm_engine_process,
              "parameters": sum(p.numel() for p in policy.parameters()),
              "workload": {"prompts": args.prompts, "group": args.group, "rows": args.rows, "new_tokens": args.new,
                           "swap_every_steps": args.swap_every, "eos": "none"},
              "engine_build_s": round(build_s, 1), "plain": plain, "with_swaps": swapped,
              "added_per_swap_ms": [round(1000 * x, 2) for x in added],
              "swap_host_ms": [round(1000 * x, 2) for x in host],
              "plain_step_ms": [round(x, 2) for x in step_ms],
              "added_per_swap_median_ms": round(1000 * statistics.median(added), 2)}
    out = write_result(f"vllm_swap_{name}", cuda, result,
                       results_dir=Path(args.results_dir) if args.results_dir else None)
    print(f"{name}: a swap adds {result['added_per_swap_median_ms']:.1f} ms (host {result['swap_host_ms']} ms) "
          f"to a decode step of {result['plain_step_ms']} ms; wrote {out}")
    return result


if __name__ == "__main__":
    main()
