"""The run's last lines: what it made, where it is, and what to do next.

Once the learner has exited, the launcher says, from the files the run left (summary.json,
eval.jsonl, checkpoints/, the samplers' results): the run folder, the steps and the time, the last
evaluation, the newest checkpoint, the group books in words (what the queued groups were, and
whether the books balance), what the screens dropped (--screen-generations), and the command that
draws the report. A run stopped by Ctrl+C or SIGTERM ends with
one line that says what was saved and the command that resumes it.

Pure functions of those files' contents, and torch-free: the launcher imports nothing heavy.
"""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from grpo.learner.resume import checkpoints_root, list_checkpoints

STOP_SIGNALS = ("SIGINT", "SIGTERM")


def read_summary(run_dir: Path) -> dict | None:
    """summary.json, or None when the learner wrote none (it was killed, or never trained)."""
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def last_eval(run_dir: Path) -> dict | None:
    """The newest whole line of eval.jsonl (by sampler 0 during the run, or the learner's final one)."""
    try:
        lines = (run_dir / "eval.jsonl").read_text().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        try:
            return json.loads(raw)
        except ValueError:
            continue
    return None


def newest_checkpoint(run_dir: Path) -> dict | None:
    """{"step", "path"} of the newest complete checkpoint under the run folder, or None."""
    found = list_checkpoints(checkpoints_root(run_dir))
    return {"step": found[-1][0], "path": str(found[-1][1])} if found else None


def why_ended(summary: dict) -> str:
    """How the loop ended, as the end of 'the run stopped ...'."""
    by = summary.get("ended_by")
    if by == "max_time_s":
        return "when --max-time-s ran out"
    if by in STOP_SIGNALS:
        return f"on {by}"
    return f"at --max-steps {summary['max_steps']}" if summary.get("max_steps") else "at --max-steps"


def books_line(summary: dict) -> str:
    """The group ledger in words: sent = trained + dropped (by reason) + queued, whether it balances
    (the learner's own verdict, grpo.learner.accounting.balance), and what the queued groups were."""
    g = summary.get("groups") or {}
    dropped = {k: n for k, n in (g.get("dropped") or {}).items() if n}   # a reason the books keep at 0 says nothing
    queued = int(g.get("queued") or 0)
    why = (f" ({', '.join(f'{k} {n}' for k, n in sorted(dropped.items()))})" if dropped else "")
    verdict = (summary.get("balance") or {}).get("text") or ("balanced" if g.get("balanced") else "NOT balanced")
    line = (f"groups: {g.get('sent', 0)} sent = {g.get('trained', 0)} trained + {sum(dropped.values())} dropped{why} "
            f"+ {queued} queued: {verdict}")
    if queued:
        versions = summary.get("queued_versions")
        made = ""
        if versions:
            lo, hi = versions
            made = f" (made at version {lo})" if lo == hi else f" (made at versions {lo}-{hi})"
        # Queued means received and still waiting for a step when the loop ended: the samplers make
        # groups ahead of the learner (up to --max-staleness versions), so the last ones have no step.
        line += (f"; {queued} group{'s' * (queued != 1)}{made} {'were' if queued != 1 else 'was'} still queued when "
                 f"the run stopped {why_ended(summary)}: generated ahead, never trained")
        if summary.get("ended_by") in STOP_SIGNALS:
            line += " (a resumed run generates fresh ones)"
    return line


SCREEN_COUNTS = ("screened_out", "screened_solved", "screened_unsolved", "screen_samples", "dropped_zero_signal",
                 "samples")


def screen_totals(run_dir: Path) -> dict[str, float] | None:
    """SCREEN_COUNTS summed over the samplers' results (sampler<i>_result.json; one that does not
    read is left out); None where none counts screens (made before the counters existed)."""
    results = []
    for path in sorted(run_dir.glob("sampler*_result.json")):
        try:
            results.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    counted = [r for r in results if "screened_out" in r]
    if not counted:
        return None
    return {k: sum(float(r.get(k) or 0.0) for r in counted) for k in SCREEN_COUNTS}


def screens_line(run_dir: Path) -> str | None:
    """With --screen-generations, what the screens dropped (screen_totals): the prompts (every
    completion right, none right), the completions they cost and their share of all the samplers
    generated. None where no screen dropped one."""
    total = screen_totals(run_dir)
    if not total or not total["screened_out"]:
        return None
    share = f", {total['screen_samples'] / total['samples']:.0%} of the {total['samples']:,.0f} generated" \
        if total["samples"] else ""
    # the kinds where the rewards have a correctness part to tell them by
    kinds = (f" ({total['screened_solved']:,.0f} with every completion right, {total['screened_unsolved']:,.0f} "
             f"with none)" if total["screened_solved"] + total["screened_unsolved"] else "")
    return (f"screens: {total['screened_out']:,.0f} prompts dropped at their screen{kinds}: "
            f"{total['screen_samples']:,.0f} completions{share}")


def eval_line(ev: dict | None) -> str:
    if ev is None:
        return "last evaluation: none (--eval-every N evaluates every N versions and the final weights)"
    return (f"last evaluation: greedy pass@1 {ev.get('accuracy', 0.0):.3f} ({ev.get('correct', '?')}/{ev.get('n', '?')}) "
            f"at version {ev.get('version', '?')}, by {ev.get('by', '?')}")


def stop_line(signal_name: str, summary: dict | None, newest: dict | None, resume: str) -> str:
    """The one line a stopped run ends with: what was saved (path, step) and how to resume it."""
    steps = summary.get("steps") if summary else None
    if newest is None:
        return (f"{signal_name}: nothing saved: no checkpoint exists in this run folder "
                f"(the run stopped before its first step)")
    # saved by this launch: a step trained in it (a resumed run stopped before its first new step
    # has only the checkpoint it resumed from)
    if steps is not None and newest["step"] == steps > int(summary.get("steps_at_start") or 0):
        return f"{signal_name}: saved step {newest['step']} to {newest['path']}; resume with: {resume}"
    return (f"{signal_name}: no new step to save; the newest checkpoint is step {newest['step']} at {newest['path']}; "
            f"resume with: {resume}")


def end_lines(run_dir: Path, summary: dict | None, launch_s: float, signal_name: str = "",
              resume: str = "") -> list[str]:
    """The launcher's last lines (without its '[launcher] ' prefix). `launch_s`: seconds since the
    launcher started; `signal_name`: the signal that stopped the run ('' when it ended on its own);
    `resume`: the command that resumes it (said only for a stopped run)."""
    newest = newest_checkpoint(run_dir)
    lines = []
    if summary is None:
        lines.append(f"run folder {run_dir}: the learner wrote no summary.json ({launch_s:.0f} s since launch)")
    else:
        steps, start = int(summary.get("steps") or 0), int(summary.get("steps_at_start") or 0)
        this = f" ({steps - start} in this launch, resumed at step {start})" if start else ""
        lines.append(f"run folder {run_dir}: {steps} step{'s' * (steps != 1)}{this}, the run stopped "
                     f"{why_ended(summary)}; {float(summary.get('elapsed_s') or 0.0):.0f} s of training, "
                     f"{launch_s:.0f} s since launch")
        lines.append(eval_line(last_eval(run_dir)))
        lines.append(books_line(summary))
        if screens := screens_line(run_dir):
            lines.append(screens)
    if not signal_name:
        lines.append(f"newest checkpoint: {newest['path']} (step {newest['step']})" if newest else
                     "newest checkpoint: none (--save-every N saves every N steps and the last)")
    if (run_dir / "metrics.jsonl").is_file() and (summary is None or summary.get("steps")):
        lines.append(f"report: {shlex.join([sys.executable, '-m', 'grpo.obs.report', str(run_dir)])} "
                     f"(writes report.png and report.md there)")
    if signal_name:
        lines.append(stop_line(signal_name, summary, newest, resume))
    return lines


def resume_command(argv: list[str], run_dir: Path, run_dir_given: bool) -> str:
    """The launcher's own command line with `--resume latest` in place of any --resume, and the run
    folder named when no flag or --config file gave one (`run_dir_given`): what resumes this run
    from its newest checkpoint, from the same working directory."""
    out: list[str] = []
    skip = False
    for tok in argv:
        if skip:
            skip = False
        elif tok == "--resume":
            skip = True
        elif not tok.startswith("--resume="):
            out.append(tok)
    if not run_dir_given:
        out += ["--run-dir", str(run_dir)]
    prog = sys.argv[0] if sys.argv and sys.argv[0].endswith("run_distributed.py") else \
        str(Path(__file__).resolve().parents[2] / "run_distributed.py")
    return shlex.join([sys.executable, prog, *out, "--resume", "latest"])
