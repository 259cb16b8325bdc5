"""The one-GPU targets (0.5B and 1.5B on one H200: steps/s, the lead over TRL with vLLM, time to +10
points, accuracy at 600 s, decode rate, the learner's share of the bf16 peak, groups without signal),
read from the rows of one plan: each target's figure and whether it is met, from the rows, not from
sums by hand.

    python bench/goals.py --label plan-l
    python bench/goals.py --results bench/results/real_workload_1x_NVIDIA_H200.json --label plan-j --json

Without --results, the one bench/results/real_workload_*.json file whose rows carry the label.

A plan's rows share a label (benchmark.sh's LABEL); ours against TRL with vLLM counts only rows of
one plan, which ran on one host one after the other. A target whose row is not in the plan, or whose
field the row lacks (a 300 s row has no accuracy at 600 s), says "no figure". Reads JSON only: no
torch, no GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Target:
    name: str        # what it says, as the table prints it
    model: str       # the row's model ('0.5b', '1.5b')
    field: str       # the figure: a row field, 'ratio:<field>' (ours over TRL with vLLM), or 'accuracy_at:<s>'
    bound: float
    at_least: bool   # met when the figure is >= bound (else <= bound)


TARGETS = (
    Target("0.5B steps/s from launch", "0.5b", "steps_per_s_from_launch", 0.5, True),
    Target("0.5B steps/s over TRL with vLLM (own clocks)", "0.5b", "ratio:steps_per_s", 2.5, True),
    Target("0.5B steps/s over TRL with vLLM (from launch)", "0.5b", "ratio:steps_per_s_from_launch", 2.5, True),
    Target("0.5B seconds to +10 points", "0.5b", "seconds_to_plus10", 150.0, False),
    Target("0.5B accuracy at 600 s", "0.5b", "accuracy_at:600", 0.42, True),
    Target("1.5B steps/s (own clock)", "1.5b", "steps_per_s", 0.25, True),
    Target("1.5B steps/s over TRL with vLLM (own clocks)", "1.5b", "ratio:steps_per_s", 2.5, True),
    Target("0.5B tokens/s decoded in the run", "0.5b", "gen_tokens_per_s_per_gpu", 30_000.0, True),
    Target("0.5B learner's median share of the bf16 peak", "0.5b", "bf16_peak_share_median", 0.25, True),
    Target("0.5B share of groups sent without signal", "0.5b", "zero_signal_share", 0.15, False),
)
OURS, PEER = "ours", "trl-vllm"


def plan_rows(rows: list[dict], label: str) -> list[dict]:
    """The rows of one plan (its label)."""
    return [r for r in rows if r.get("label") == label]


def row_of(rows: list[dict], model: str, trainer: str) -> dict | None:
    """The plan's row of `model` by `trainer` (one-GPU layouts only); the longest when there are several."""
    found = [r for r in rows if r.get("model") == model and r.get("trainer") == trainer and r.get("gpus") == 1]
    return max(found, key=lambda r: r.get("seconds") or 0.0, default=None)


def figure(rows: list[dict], t: Target) -> float | None:
    """The target's figure from the plan's rows (None: not in the plan, or not measured)."""
    ours = row_of(rows, t.model, OURS)
    if ours is None:
        return None
    if t.field.startswith("ratio:"):
        peer, key = row_of(rows, t.model, PEER), t.field.split(":", 1)[1]
        if peer is None or not ours.get(key) or not peer.get(key):
            return None
        return ours[key] / peer[key]
    if t.field.startswith("accuracy_at:"):
        return (ours.get("accuracy_at_s") or {}).get(t.field.split(":", 1)[1])
    return ours.get(t.field)


def verdict(value: float | None, t: Target) -> str:
    """'met', 'missed' or 'no figure'."""
    if value is None:
        return "no figure"
    return "met" if (value >= t.bound if t.at_least else value <= t.bound) else "missed"


def table(rows: list[dict]) -> list[dict]:
    """One entry per target: name, bound, figure (rounded to 4 places), verdict. A time to a gain
    that the row never reached is missed when the row ran past the bound ('not reached in 300 s')."""
    out = []
    for t in TARGETS:
        value, ours = figure(rows, t), row_of(rows, t.model, OURS)
        said = verdict(value, t)
        if (value is None and t.field.startswith("seconds_to_") and ours is not None
                and (ours.get("seconds") or 0.0) >= t.bound):
            said = f"missed (not reached in {ours['seconds']:g} s)"
        out.append({"target": t.name, "bound": ("at least " if t.at_least else "at most ") + f"{t.bound:g}",
                    "figure": None if value is None else round(value, 4), "verdict": said})
    return out


def labelled_files(folder: Path, label: str) -> list[Path]:
    """The real_workload_*.json files in `folder` with a row of that label (a file that cannot be read
    has none)."""
    found = []
    for path in sorted(folder.glob("real_workload_*.json")):
        try:
            rows = json.loads(path.read_text()).get("rows", [])
        except (OSError, ValueError, AttributeError):
            continue
        if plan_rows(rows, label):
            found.append(path)
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--results", type=Path, default=None,
                    help="a real_workload results file (default: the one in bench/results whose rows carry --label)")
    ap.add_argument("--label", required=True, help="the plan's label, as its rows carry it (benchmark.sh's LABEL)")
    ap.add_argument("--json", action="store_true", help="print the table as JSON instead of markdown")
    args = ap.parse_args(argv)
    if args.results is None:
        found = labelled_files(RESULTS, args.label)
        if len(found) != 1:
            print(f"goals.py: {len(found)} results files in {RESULTS} have rows labelled {args.label!r}"
                  f"{' (' + ', '.join(p.name for p in found) + ')' if found else ''}: name one with --results",
                  file=sys.stderr)
            return 2
        args.results = found[0]
    try:
        rows = plan_rows(json.loads(args.results.read_text())["rows"], args.label)
    except (OSError, ValueError, KeyError) as exc:
        print(f"goals.py: cannot read rows from {args.results} ({exc}): give a real_workload results file",
              file=sys.stderr)
        return 2
    if not rows:
        print(f"goals.py: no row of {args.results} has the label {args.label!r}: give one its rows carry",
              file=sys.stderr)
        return 2
    out = table(rows)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print("| target | bound | figure | |\n|---|---|---|---|")
        for e in out:
            print(f"| {e['target']} | {e['bound']} | {'-' if e['figure'] is None else e['figure']} | {e['verdict']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
