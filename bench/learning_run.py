"""Issue 3's learning run: GRPO on GSM8K train, greedy accuracy on a fixed test subset before and after.

Run it (2 GPUs: sampler on GPU 0, learner on GPU 1; about 8 minutes of training plus evaluations):
  python bench/learning_run.py run --dataset .data/gsm8k --run-dir runs/learning [-- extra run_distributed flags]
Summarise a finished run (here or on the GPU machine) into JSON and a PNG:
  python bench/learning_run.py summarise runs/learning --device "2x NVIDIA H200"

The baseline is sampler 0's evaluation of version 0 (the untrained model), the final one the
learner's evaluation of its last weights, both on the first --eval-size test problems.
Writes bench/results/learning_<device>.json and learning_<device>.png (and the PNG into the run dir).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run 1 (lr 3e-6, G=8, correctness only, HF generation: ~5,600 completions in 8 minutes) did
# not learn: 2-3 % train reward gave most groups zero advantage. Run 2 (fast engine, G=16,
# correctness + 0.2 x format, lr 1e-5; its exact flags are in bench/results/learning_run_2/)
# did not either: the learner ran 32 micro-steps per step and the format bonus was gamed.
# Run 3 (run 2's settings, correctness only, 32-sequence micro-batches; learning_run_3/) got
# worse (0.026 -> 0.016): completions grew until cut off (train truncation 59% -> 81%), read
# then as the per-sequence loss's length bias (run 4's token-level loss did not stop the growth
# either: 320 -> 346 tokens, so that was at most part of it). Run 4 (learning_run_4/) changed, from run 3's train
# metrics, not the test subset: token-level loss (--loss-type dapo) with truncated completions
# kept in it (at this size a cut-off completion is a loop or a ramble, scored wrong), groups with
# all-equal rewards filtered (--filter-zero-signal: four in five carried no signal), 512 new
# tokens (the baseline is re-measured at that length), --max-staleness 8. Run 5
# (learning_run_5/) added rounds of 128 prompts and lr 2e-5. Neither moved
# greedy test accuracy (0.024 -> 0.024 and 0.022): 41 and 47 steps, each of 8 groups with
# signal, were all the sampler's 36-45k completions gave (15% of groups have a correct member
# at 1.2-1.8% train accuracy), and KL to the start stayed under 0.011. The train reward rises
# within each run, but run 3's rose the same way over the same (seed 42) prompt order. Since
# run 5, --filter-zero-signal also filters at the sampler, before the log-prob passes (24% of
# its time in run 5), so these flags now give about 1.2x the signal per minute; adding
# `-- --sampling-gpus 0,1 --share-gpus` (a second sampler on the learner's GPU) gave 2.7x in a
# 90 s run (bench/results/two_samplers_90s/). Runs 6 and 7 (these flags; run 7 is the top-level
# learning_2x_NVIDIA_H200.*) added that second sampler, two-step train problems only
# (bench/gsm8k_curriculum.py) and lr 5e-5: 119 and 118 steps, 2.5x run 5's groups with signal,
# KL 0.08-0.11, and greedy test accuracy 0.024 -> 0.018 in both. bench/chance_probe.py says why:
# the base model's 2.4% is at chance (always answering "4" scores 3.0%, copying the question's
# last number 1.8%; half its correct answers are copies), so the reward mostly pays coincidences.
# README, "Learning runs 6 and 7", has the numbers.
RUN_FLAGS = ["--sampling-gpus", "0,1", "--share-gpus", "--training-gpus", "1", "--max-time-s", "480", "--max-steps", "100000",
             "--eval-every", "50", "--eval-size", "500", "--num-generations", "16", "--prompts-per-round", "128",
             "--train-batch-size", "128", "--learning-rate", "5e-5", "--beta", "0.0",
             "--reward", "correctness", "--generation-backend", "fast", "--verify-weight-sync",
             "--loss-type", "dapo", "--filter-zero-signal", "--max-new-tokens", "512", "--max-staleness", "8",
             "--dataset-transform", "bench/gsm8k_curriculum.py:at_most_2_steps"]


def summarise(run_dir: Path, device: str, out_dir: Path) -> dict:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if not r.get("final")]
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    cfg = {p.stem[len("config_"):]: json.loads(p.read_text()) for p in sorted(run_dir.glob("config_*.json"))}
    base = next(e for e in evals if e["version"] == 0)
    final = max(evals, key=lambda e: (e["version"], e["by"] == "learner"))
    doc = {
        "device": device, "model": cfg.get("learner", {}).get("model"),
        "data": {"train": cfg.get("sampler0", {}).get("dataset"), "eval": "first %d test problems" % base["n"]},
        "steps": len(steps), "wall_s": steps[-1]["time_s"], "config": cfg,
        "baseline_accuracy": base["accuracy"], "final_accuracy": final["accuracy"],
        "final_eval_version": final["version"],
        # decoder: None in runs up to 7, whose learner evaluated with HF generate and sampler 0 with the engine.
        "evals": [{**{k: e[k] for k in ("version", "by", "accuracy", "correct", "n", "mean_completion_len",
                                         "truncated_frac", "seconds")}, "decoder": e.get("decoder")} for e in evals],
        "reward_mean_per_step": [r["reward_mean"] for r in steps],
        # The learner's batch reward counts only groups it trained on (with --filter-zero-signal,
        # only groups with a correct member); the sampler's rounds count every completion.
        "trained_groups_only": bool(cfg.get("learner", {}).get("filter_zero_signal")),
        "sampler_rounds": _sampler_rounds(run_dir / "sampler0.log"),
        "train_accuracy_per_step": [r["accuracy"] for r in steps],
        "time_s_per_step": [r["time_s"] for r in steps],
    }
    slug = device.replace(" ", "_").replace("/", "_")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"learning_{slug}.json").write_text(json.dumps(doc, indent=2) + "\n")
    _plot(doc, [run_dir / "learning.png", out_dir / f"learning_{slug}.png"])
    return doc


def _sampler_rounds(log: Path) -> list[dict]:
    """Sampler 0's rounds from its log: the version it generated with, completions, mean reward."""
    if not log.is_file():
        return []
    sys.path.insert(0, str(ROOT / "bench"))
    from benchutil import rounds_of

    return [{"round": r["round"], "version": r["version"], "completions": r["n"], "reward_mean": r["reward_mean"]}
            for r in rounds_of(log.read_text())]


def _plot(doc: dict, paths: list[Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = list(range(1, len(doc["reward_mean_per_step"]) + 1))
    t = doc["time_s_per_step"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, x, label in ((axes[0], steps, "learner step (= policy version)"), (axes[1], t, "wall time (s)")):
        window = 8
        r = doc["reward_mean_per_step"]
        smooth = [sum(r[max(0, i - window + 1):i + 1]) / len(r[max(0, i - window + 1):i + 1]) for i in range(len(r))]
        what = "trained batch reward (groups with signal only)" if doc.get("trained_groups_only") else "train reward"
        ax.plot(x, r, color="tab:blue", alpha=0.3, lw=0.8, label=f"{what}, per step")
        ax.plot(x, smooth, color="tab:blue", lw=1.6, label=f"{what}, {window}-step mean")
        rounds = doc.get("sampler_rounds") or []
        if rounds:   # at the version each round was generated with (its time: when that version began)
            rx = [rd["version"] if ax is axes[0] else ([0.0] + t)[min(rd["version"], len(t))] for rd in rounds]
            ax.plot(rx, [rd["reward_mean"] for rd in rounds], ".", color="tab:green", ms=4,
                    label="sampler round reward, all completions")
        ex = [e["version"] if ax is axes[0] else t[min(max(e["version"] - 1, 0), len(t) - 1)] for e in doc["evals"]]
        ax.plot(ex, [e["accuracy"] for e in doc["evals"]], "o-", color="tab:red",
                label=f"greedy test accuracy ({doc['evals'][0]['n']} problems)")
        ax.set_xlabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("reward / accuracy")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"GRPO {doc['model']} on GSM8K, {doc['device']}: {doc['steps']} steps in {doc['wall_s']:.0f} s; "
                 f"test accuracy {doc['baseline_accuracy']:.3f} -> {doc['final_accuracy']:.3f}", fontsize=10)
    fig.tight_layout()
    for p in paths:
        fig.savefig(p, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--dataset", required=True)
    r.add_argument("--run-dir", default="runs/learning")
    r.add_argument("extra", nargs=argparse.REMAINDER)
    s = sub.add_parser("summarise")
    s.add_argument("run_dir")
    s.add_argument("--device", required=True)
    s.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    if args.cmd == "run":
        extra = [a for a in args.extra if a != "--"]
        cmd = [sys.executable, str(ROOT / "run_distributed.py"), *RUN_FLAGS, "--dataset", args.dataset,
               "--run-dir", args.run_dir, *extra]
        print("$", " ".join(cmd), flush=True)
        return subprocess.run(cmd, cwd=ROOT).returncode
    doc = summarise(Path(args.run_dir), args.device, Path(args.out_dir))
    print(f"{doc['steps']} steps in {doc['wall_s']:.0f} s; greedy test accuracy {doc['baseline_accuracy']:.3f} "
          f"(v0) -> {doc['final_accuracy']:.3f} (v{doc['final_eval_version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
