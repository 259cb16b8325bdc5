"""Where a run's stale groups came from, from its own logs (no GPU): each group's arrival second and
oldest-token version (the samplers' "round R (vX): ... K of N groups zero-signal" lines, groups with
signal only) and each step's collect time (the learner's step lines, less its train and publish
seconds). Three figures:

  spans          the versions each group's generation spanned (its newest token's version less its
                 oldest's): a group is at least that old when it reaches the queue
  replay         those arrivals through a queue taken a step's groups at a time at the steps' own
                 times, first come first served and oldest version first: the first should give
                 the run's own stale count if the replay is faithful; the two differ only where
                 waiting order, not generation, made groups stale
  share          how far the estimate of the share of groups with signal, by whose reciprocal a
                 sampler sizes what it starts (grpo.rules.staleness.pool_room), sat from the run's
                 own: the mean reciprocal over the last four chunks (the rule before SIGNAL_GROUPS)
                 and over the last 64 groups, against the run's

    python bench/staleness_replay.py RUN_DIR:BOUND [RUN_DIR:BOUND ...] [--out FILE.json]

Seconds are whole (the logs' resolution), so a step and an arrival in one second are ordered
arrival first.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

GROUP = re.compile(r"(\d\d):(\d\d):(\d\d) sampler\d+ INFO round \d+ \(v(\d+)\): \d+ completions.*?"
                   r"(\d+) of (\d+) groups zero-signal")
STEP = re.compile(r"(\d\d):(\d\d):(\d\d) learner0 INFO step (\d+) v(\d+): .*?\(wait [\d.]+, train ([\d.]+), "
                  r"publish ([\d.]+)\)")


def seconds(m: re.Match) -> int:
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3))


def read(run: Path) -> tuple[list[tuple[int, int]], list[tuple[float, int, int]], list[list[tuple[int, int]]]]:
    """(arrivals (second, version) of groups with signal in arrival order, steps (collect second,
    finish second, version after), per sampler its chunks' (kept, groups))."""
    arrivals, chunks = [], []
    for log in sorted(run.glob("sampler*.log")):
        mine = []
        for line in log.read_text(errors="replace").splitlines():
            if m := GROUP.search(line):
                zero, groups = int(m.group(5)), int(m.group(6))
                arrivals += [(seconds(m), int(m.group(4)))] * (groups - zero)
                mine.append((groups - zero, groups))
        chunks.append(mine)
    arrivals.sort(key=lambda a: a[0])   # stable: each sampler's log order within a second
    steps = [(seconds(m) - float(m.group(6)) - float(m.group(7)), seconds(m), int(m.group(5)))
             for m in map(STEP.search, (run / "learner0.log").read_text(errors="replace").splitlines()) if m]
    return arrivals, steps, chunks


def spans(run: Path) -> dict[int, int]:
    """Groups with signal by the versions their generation spanned (newest token's version less the
    oldest's, "tokens of vA-vB" in the samplers' lines; 0 where a chunk took no swap): a group is
    at least this old when it reaches the learner's queue."""
    got = collections.Counter()
    for log in sorted(run.glob("sampler*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if m := GROUP.search(line):
                span = re.search(r"tokens of v(\d+)-v(\d+)", line)
                got[int(span.group(2)) - int(span.group(1)) if span else 0] += int(m.group(6)) - int(m.group(5))
    return dict(sorted(got.items()))


def replay(arrivals, steps, bound: int, per_step: int, oldest_first: bool) -> dict[str, int]:
    """The learner's queue at the steps' own collect times: each step judges groups at the version
    before it and takes per_step that are at most `bound` old, dropping older ones it meets."""
    queue: list[tuple[int, int]] = []
    i = stale = trained = 0
    for t_collect, _, after in steps:
        version, got = after - 1, 0
        while got < per_step:
            while i < len(arrivals) and (arrivals[i][0] <= t_collect or not queue):
                if oldest_first:
                    queue.insert(bisect.bisect_right([g[1] for g in queue], arrivals[i][1]), arrivals[i])
                else:
                    queue.append(arrivals[i])
                i += 1
            if not queue:
                break
            g = queue.pop(0)
            if version - g[1] > bound:
                stale += 1
            else:
                got, trained = got + 1, trained + 1
    return {"trained": trained, "stale": stale, "queued": len(queue) + len(arrivals) - i}


def share_bias(chunks: list[tuple[int, int]]) -> dict[str, float]:
    """Mean reciprocal of the windowed share (floored at 1/16, as the rules floor it), after each chunk."""
    def window(upto: list[tuple[int, int]], last_chunks: int | None, groups: int | None) -> float:
        kept = total = 0
        for n, (k, g) in enumerate(reversed(upto)):
            if last_chunks is not None and n == last_chunks:
                break
            kept, total = kept + k, total + g
            if groups is not None and total >= groups:
                break
        return 1 / min(1.0, max(kept / total, 1 / 16))
    kept, total = sum(k for k, _ in chunks), sum(g for _, g in chunks)
    four = [window(chunks[:n + 1], 4, None) for n in range(len(chunks))]
    sixty_four = [window(chunks[max(0, n - 63):n + 1], None, 64) for n in range(len(chunks))]
    return {"run": round(total / kept, 3), "last_4_chunks": round(statistics.mean(four), 3),
            "last_64_groups": round(statistics.mean(sixty_four), 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="RUN_DIR:BOUND (the run's --max-staleness)")
    ap.add_argument("--per-step", type=int, default=8, help="groups a learner step takes (train batch / G)")
    ap.add_argument("--out", help="write the figures here as JSON")
    args = ap.parse_args(argv)
    here = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True)
    out = {"command_line": " ".join(["python", "bench/staleness_replay.py", *(argv if argv is not None else sys.argv[1:])]),
           "commit": here.stdout.strip() or None, "device": "CPU (reads the runs' logs)",
           "versions": {"python": platform.python_version()}, "runs": {}}
    for spec in args.runs:
        path, _, bound = spec.rpartition(":")
        run = Path(path)
        arrivals, steps, chunks = read(run)
        summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
        span = spans(run)
        learner = json.loads((run / "config_learner.json").read_text()) if (run / "config_learner.json").is_file() else {}
        got = {"run_commit": learner.get("commit"), "seed": learner.get("seed"), "device": learner.get("device"),
               "bound": int(bound), "arrivals": len(arrivals), "steps": len(steps),
               "seen": {k: summary.get("groups", {}).get(k) for k in ("trained", "queued")}
               | {"stale": summary.get("groups", {}).get("dropped", {}).get("stale")},
               "generation_spans": span, "spanned_more_than_bound": sum(n for a, n in span.items() if a > int(bound)),
               "replay_arrival_order": replay(arrivals, steps, int(bound), args.per_step, False),
               "replay_oldest_first": replay(arrivals, steps, int(bound), args.per_step, True),
               "share_reciprocal": {f"sampler{i}": share_bias(c) for i, c in enumerate(chunks)}}
        out["runs"][run.name] = got
        print(f"{run.name}: {json.dumps(got)}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
