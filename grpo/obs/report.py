"""python -m grpo.obs.report runs/<id>: a PNG of the run and a one-page markdown summary.

Reads metrics.jsonl (one record per learner step, plus the final accounting record),
summary.json and config_learner.json when present. Writes report.png and report.md into the
run directory (or --out). Draws reward, accuracy, KL, throughput and weight-sync latency
against steps (left column) and against wall-clock time (right column).
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from matplotlib.figure import Figure   # no pyplot: a figure of its own, written to a file, needs no display or backend
from matplotlib.ticker import MaxNLocator

from grpo.config.cli import ArgumentParser

PANELS = [  # (title, y label, [(record key, legend, scale)])
    ("Reward", "mean reward", [("reward_mean", "reward mean", 1.0)]),
    ("Accuracy", "fraction correct", [("accuracy", "accuracy", 1.0)]),
    ("KL to reference", "KL per token", [("kl", "kl", 1.0)]),
    ("Throughput", "samples / s", [("samples_per_s", "cumulative", 1.0), ("_inst_samples_per_s", "this step", 1.0)]),
    ("Weight sync latency", "ms", [("sync_publish_s", "learner publish stall", 1000.0)]),
]


class ReportError(Exception):
    """A run directory that cannot be reported on; one line naming the fix."""


def load_run(run_dir: Path) -> tuple[list[dict], dict, dict]:
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run directory; pass runs/<run_id> (see ls runs/)")
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ReportError(f"{path} is missing: the learner has not finished a step in this run yet")
    steps, final = [], {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n == len(path.read_text().splitlines()):  # a half-written last line of a live run
                continue
            raise ReportError(f"{path}:{n} is not JSON; the file is damaged") from None
        if rec.get("final"):
            final = rec
        elif "step" in rec:
            if rec.get("step_time_s"):
                rec["_inst_samples_per_s"] = rec.get("sequences", 0) / rec["step_time_s"]
            steps.append(rec)
    if not steps:
        raise ReportError(f"{path} has no step records yet; wait for the first learner step")
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else final
    cfg_path = run_dir / "config_learner.json"
    config = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    return steps, summary, config


def _series(steps: list[dict], key: str, scale: float) -> tuple[list[float], list[float], list[float]]:
    xs, ts, ys = [], [], []
    for r in steps:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(r["step"])
            ts.append(r.get("time_s", 0.0))
            ys.append(v * scale)
    return xs, ts, ys


def load_evals(run_dir: Path) -> list[dict]:
    """eval.jsonl: the greedy evaluations of the run (sampler 0's at each --eval-every, the learner's final)."""
    path = run_dir / "eval.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue   # a half-written last line of a live run
    return out


def change_note(before: float, after: float, n: int) -> str:
    """What a change of greedy accuracy on the same n problems shows: a change within two standard
    errors of the difference (each score's binomial error, the pooled rate where one is 0 or 1) is
    said to be within the noise, with the margin; a larger one as points and, from a non-zero
    baseline, the ratio."""
    diff = after - before
    if diff == 0:
        return f"no change on {n} problems"
    p = (before + after) / 2
    se = math.sqrt(max(before * (1 - before) + after * (1 - after), 2 * p * (1 - p)) / max(n, 1))
    if abs(diff) <= 2 * se:
        return f"{diff:+.3f}, within the noise of {n} problems (two standard errors: {2 * se:.3f})"
    ratio = f", {after / before:.2f}x" if before else ""
    return f"{diff * 100:+.1f} points{ratio} (two standard errors: {2 * se:.3f})"


def eval_summary(evals: list[dict]) -> str | None:
    """The baseline (version 0) and the last evaluation, and what their difference shows, as one line."""
    # by version, then who, then when: a resumed run's file holds version 0 twice (each launch's
    # sampler 0 scores the weights it starts with), and records themselves do not compare
    pts = sorted(((e["version"], e.get("by", ""), e) for e in evals if isinstance(e.get("version"), int)),
                 key=lambda t: (t[0], t[1], t[2].get("time") or 0.0))
    base = next((e for v, _, e in pts if v == 0), None)
    if base is None or len(pts) < 2:
        return None
    last = pts[-1][2]
    n = int(base.get("n") or 0)
    return (f"greedy accuracy on the held-out subset (first {n} test problems): before "
            f"{base['accuracy']:.3f} (version 0), after {last['accuracy']:.3f} (version {last['version']}, "
            f"{last.get('by', '?')}): {change_note(base['accuracy'], last['accuracy'], n)}")


def _eval_points(steps: list[dict], evals: list[dict]) -> tuple[list[float], list[float], list[float]]:
    """(step, seconds, accuracy) of each evaluation: version v is the weights after step v."""
    time_at = {r["step"]: r.get("time_s", 0.0) for r in steps}
    pts = sorted((e["version"], time_at.get(e["version"], 0.0), e["accuracy"]) for e in evals
                 if isinstance(e.get("version"), int) and isinstance(e.get("accuracy"), (int, float)))
    return [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]


def plot(steps: list[dict], out: Path, title: str, evals: list[dict] | None = None) -> None:
    panels = list(PANELS)
    levels = sorted({k for r in steps for k in r if k.startswith("curriculum/")})
    if levels:   # --curriculum: each task's level; its changes are the steps where a line moves
        panels.append(("Curriculum level", "level", [(k, k.split("/", 1)[1], 1.0) for k in levels]))
    tasks = sorted({k for r in steps for k in r if k.startswith("accuracy/")})
    if len(tasks) > 1:   # a mixture: each task's own train accuracy
        panels.insert(2, ("Train accuracy by task", "fraction correct", [(k, k.split("/", 1)[1], 1.0) for k in tasks]))
    fig = Figure(figsize=(12, 2.6 * len(panels)))
    axes = fig.subplots(len(panels), 2, squeeze=False)
    for row, (name, ylabel, series) in enumerate(panels):
        for col in range(2):
            ax = axes[row][col]
            for key, label, scale in series:
                xs, ts, ys = _series(steps, key, scale)
                if ys:
                    x = xs if col == 0 else ts
                    noisy = len(ys) >= 20 and key in ("reward_mean", "accuracy")
                    ax.plot(x, ys, marker="." if len(ys) < 50 else None, label=label,
                            alpha=0.35 if key.startswith("_") or noisy else 1.0)
                    if noisy:  # per-step reward is noisy: a trailing mean shows the trend
                        w = max(5, len(ys) // 20)
                        ax.plot(x, [sum(ys[max(0, i - w + 1):i + 1]) / len(ys[max(0, i - w + 1):i + 1])
                                    for i in range(len(ys))], label=f"mean of last {w}")
                        ax.legend(fontsize=8)
            if name == "Accuracy" and evals:
                xs, ts, ys = _eval_points(steps, evals)
                ax.plot(xs if col == 0 else ts, ys, marker="o", color="black", label="greedy, held-out test subset")
                ax.legend(fontsize=8)
            if col == 0:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title(f"{name} vs {'step' if col == 0 else 'wall time'}", fontsize=10)
            ax.set_xlabel("learner step" if col == 0 else "seconds since the learner started")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if len(series) > 1:
                ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out, dpi=90)


def _median(steps: list[dict], key: str, skip_first: bool = True) -> float | None:
    vals = [r[key] for r in steps[1 if skip_first and len(steps) > 1 else 0:]
            if isinstance(r.get(key), (int, float))]
    return statistics.median(vals) if vals else None


def _mean(vals: list[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def _f(v, fmt: str = ".3f") -> str:
    return "n/a" if v is None else format(v, fmt)


def summarize(run_dir: Path, steps: list[dict], summary: dict, config: dict) -> str:
    k = max(1, min(10, len(steps) // 4 or 1))
    first, last = steps[:k], steps[-k:]
    lines = [f"# Run report: {run_dir.name}", ""]
    if config:
        lora = f", LoRA r={config['lora_r']} alpha={config.get('lora_alpha')}" if config.get("lora_r") else ""
        lines += [f"model `{config.get('model')}`, G={config.get('num_generations')}, lr {config.get('learning_rate')}, "
                  f"beta {config.get('beta')}, loss `{config.get('loss_type')}`, max new tokens "
                  f"{config.get('max_new_tokens')}{lora}", ""]
    elapsed = summary.get("elapsed_s", steps[-1].get("time_s"))
    lines += [f"**{len(steps)} steps** in {_f(elapsed, '.1f')} s "
              f"(last step {steps[-1]['step']}; {'finished' if summary.get('steps') else 'no final record: still running or crashed'})",
              "", "| metric | first {k} steps | last {k} steps |".format(k=k), "|---|---|---|"]
    for key, label in (("reward_mean", "reward"), ("accuracy", "accuracy"), ("kl", "KL"), ("loss", "loss"),
                       ("clip_frac", "clip fraction"), ("entropy", "entropy (sampled)"),
                       ("completion_len_mean", "completion length"), ("staleness_mean", "staleness")):
        a = _mean([r[key] for r in first if isinstance(r.get(key), (int, float))])
        b = _mean([r[key] for r in last if isinstance(r.get(key), (int, float))])
        if a is not None or b is not None:
            lines.append(f"| {label} | {_f(a, '.4g')} | {_f(b, '.4g')} |")
    lines += ["", "Timing (medians, step 1 left out): "
              f"step {_f(_median(steps, 'step_time_s'))} s, data wait {_f(_median(steps, 'data_wait_s'))} s, "
              f"train {_f(_median(steps, 'train_s'))} s, weight publish {_f(_median(steps, 'sync_publish_s'), '.4f')} s; "
              f"throughput {_f(steps[-1].get('samples_per_s'), '.2f')} samples/s overall.", ""]
    groups = summary.get("groups") or steps[-1].get("groups") or {}
    if groups:
        dropped = groups.get("dropped", {})
        lines += [f"Groups: sent {groups.get('sent')} = trained {groups.get('trained')} + dropped "
                  f"{sum(dropped.values())} {dropped or ''} + queued {groups.get('queued')}"
                  + (f" -> {'balanced' if groups['balanced'] else 'NOT balanced'}" if "balanced" in groups else ""), ""]
    samplers = summary.get("samplers") or {}
    if samplers:
        lines += ["| sampler | last version | groups sent | weight syncs | generation tok/s |", "|---|---|---|---|---|"]
        for sid, s in samplers.items():
            st = s.get("stats", {})
            tps = st.get("tokens", 0) / st["gen_s"] if st.get("gen_s") else None
            lines.append(f"| {sid} | {s.get('version')} | {s.get('groups_sent')} | {_f(st.get('weight_syncs'), '.0f')} "
                         f"| {_f(tps, '.0f')} |")
        lines.append("")
    if summary.get("lora"):
        lines += [f"LoRA: {summary['lora']}", ""]
    lines += ["![report](report.png)", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m grpo.obs.report", usage="%(prog)s RUN_DIR [--out DIR]",
                            description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run directory, e.g. runs/20260101-120000-1234")
    parser.add_argument("--out", default="", help="where to write report.png and report.md (default: the run dir)")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    try:
        steps, summary, config = load_run(run_dir)
    except ReportError as exc:
        print(f"grpo.obs.report: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else run_dir
    out.mkdir(parents=True, exist_ok=True)
    evals = load_evals(run_dir)
    plot(steps, out / "report.png", f"{run_dir.name}: {len(steps)} steps", evals)
    if line := eval_summary(evals):
        print(line)
    (out / "report.md").write_text(summarize(run_dir, steps, summary, config))
    print(f"wrote {out / 'report.png'} and {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
