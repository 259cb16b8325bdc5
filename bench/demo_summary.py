"""Summarise `make demo-run` runs into bench/results/demo_<device>.json: baseline and final greedy
accuracy on the held-out subset, every evaluation, steps, training seconds and the books.

  python bench/demo_summary.py --device "NVIDIA H200" --versions-from bench/results/task_probe_NVIDIA_H200.json \\
      RUN_DIR[:WALL_S] ...

A run dir holds what the demo writes (eval.jsonl, metrics.jsonl or .gz, summary.json or .gz,
config_launch.json). WALL_S: the whole command's wall seconds, measured outside (optional).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import ROOT, read_run_file  # noqa: E402


def summarise(run: Path, wall_s: float | None) -> dict:
    evals = sorted((json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()), key=lambda e: e["version"])
    recs = [json.loads(x) for x in read_run_file(run, "metrics.jsonl").splitlines()]
    steps = [r for r in recs if not r.get("final")]
    final = next((r for r in recs if r.get("final")), {})
    try:
        summary = json.loads(read_run_file(run, "summary.json"))
    except FileNotFoundError:
        summary = final
    launch = json.loads((run / "config_launch.json").read_text())
    base = next(e for e in evals if e["version"] == 0)
    time_at = {r["step"]: r["time_s"] for r in steps}   # version v: the weights after step v
    last = evals[-1]
    groups = summary["groups"]
    return {"run": run.name, "seed": launch.get("seed"), "baseline_accuracy": base["accuracy"],
            "final_accuracy": last["accuracy"], "ratio": round(last["accuracy"] / base["accuracy"], 3),
            "eval_size": base["n"], "final_version": last["version"], "final_by": last["by"],
            "evaluations": [{"version": e["version"], "by": e["by"], "accuracy": e["accuracy"],
                             "train_seconds": round(time_at.get(e["version"], 0.0), 1)} for e in evals],
            "steps": len(steps), "train_seconds": round(steps[-1]["time_s"], 1), "command_wall_seconds": wall_s,
            "groups": groups, "stale_fraction": round(groups["dropped"].get("stale", 0) / groups["sent"], 4),
            "zero_signal_fraction": round(groups["dropped"].get("sampler_zero_signal", 0) / groups["sent"], 4)}


def plot(rows: list[dict], out: Path, device: str) -> None:
    """Greedy held-out accuracy against training seconds, every run, with the baseline and 2x lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for r in rows:
        xs = [e["train_seconds"] for e in r["evaluations"]]
        ax.plot(xs, [e["accuracy"] for e in r["evaluations"]], marker="o",
                label=f"{r['run']} (seed {r['seed']}): {r['final_accuracy']:.3f}, {r['ratio']:.2f}x")
    base = rows[0]["baseline_accuracy"]
    ax.axhline(base, color="gray", ls=":", label=f"baseline {base:.3f}")
    ax.axhline(2 * base, color="gray", ls="--", label="2x baseline")
    ax.set_xlabel("seconds of training (one GPU shared by sampler and learner)")
    ax.set_ylabel(f"greedy accuracy, {rows[0]['eval_size']} held-out problems")
    ax.set_title(f"make demo-run: SmolLM2-135M on rg:letter_counting, {device}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--device", required=True)
    ap.add_argument("--versions-from", default="", help="a result JSON from the same machine image")
    args = ap.parse_args()
    rows = []
    for spec in args.runs:
        path, _, wall = spec.partition(":")
        rows.append(summarise(Path(path), float(wall) if wall else None))
    versions = json.loads(Path(args.versions_from).read_text())["versions"] if args.versions_from else {}
    out = ROOT / "bench" / "results" / f"demo_{args.device.replace(' ', '_')}.json"
    out.write_text(json.dumps({"device": args.device, "versions": versions, "command": "make demo-run",
                               "runs": rows}, indent=2) + "\n")
    plot(rows, out.with_suffix(".png"), args.device)
    for r in rows:
        print(f"{r['run']}: {r['baseline_accuracy']:.3f} -> {r['final_accuracy']:.3f} ({r['ratio']}x) in "
              f"{r['steps']} steps, {r['train_seconds']} s of training; stale {r['stale_fraction']:.1%}")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
