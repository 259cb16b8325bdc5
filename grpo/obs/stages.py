"""Startup stages: each process records the stages it reaches in the run directory, and the
launcher names any process that has not reached its next stage within a bound.

A stage file is `<run_dir>/stages/<process>.json`: {"stage", "time", "pid"} of the newest mark,
and "history", every mark in the order made ([{"stage", "time", "pid"}], the oldest dropped past
MAX_HISTORY; a restarted process adds to it under its own pid). It is replaced atomically at each
mark, so a reader never sees half a file. STAGES lists each role's stages in order, with what the
process is doing until it reaches each one: what the launcher says.

A sampler generates its first round while it waits for the learner's first answer (the learner
may still be loading) and sends it only after that answer, whose run facts it must check first:
so 'connected' always comes before 'first_group'. Stages need not be marked in order all the
same (stage files of older runs have a sampler's 'first_group' before 'connected'): a process is
where the furthest stage its newest process has marked puts it (`read`).
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from grpo.obs.rundir import provenance

MAX_HISTORY = 256   # marks kept per stage file (a few per process, so room for many restarts)
_lock = threading.Lock()   # one read-modify-write of a stage file at a time within a process

# role -> [(stage, what the process does until it reaches it)], in order.
STAGES: dict[str, list[tuple[str, str]]] = {
    "learner0": [("started", "starting Python and parsing its options"),
                 ("bound", "binding the data and sync ports"),
                 ("engine_ready", "loading the model and building its optimizer engine (DeepSpeed: the "
                                  "process group and, on CPU, its communication op)"),
                 ("weights_published", "publishing version 0 of the weights"),
                 ("first_step", "its first step: waiting for groups from the samplers, "
                                "then training")],
    "learner": [("started", "starting Python and parsing its options"),
                ("engine_ready", "loading the model and joining the DeepSpeed group"),
                ("first_step", "its first step (rank 0 gathers the batch)")],
    "sampler": [("started", "starting Python and parsing its options"),
                ("model_loaded", "loading its data and the model"),
                ("connected", "the learner's first answer on the sync port (generating its first round meanwhile)"),
                ("first_group", "generating and scoring its first round")],
}


def role_of(process: str) -> str:
    return "learner0" if process == "learner0" else "learner" if process.startswith("learner") else "sampler"


def mark(run_dir: str | Path, process: str, stage: str, now: float | None = None) -> None:
    """Record that `process` reached `stage` at `now` (default: the time now), added to its history
    (best effort: a run never fails on its stage file). Without a run directory (a sampler or
    learner built in process, as tests do) nothing is written."""
    if not run_dir:
        return
    d = Path(run_dir) / "stages"
    entry = {"stage": stage, "time": time.time() if now is None else float(now), "pid": os.getpid()}
    try:
        with _lock:
            d.mkdir(parents=True, exist_ok=True)
            history = _history(d / f"{process}.json")
            history = (history + [entry])[-MAX_HISTORY:]
            tmp = d / f".{process}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({**entry, "history": history, **provenance()}))
            os.replace(tmp, d / f"{process}.json")
    except OSError:
        pass


def _history(path: Path) -> list[dict]:
    """The marks of one stage file, oldest first ([] when it is missing or does not parse). A file
    without "history" (written before it had one) counts as its one mark."""
    try:
        rec = json.loads(path.read_text())
        entries = rec.get("history", [rec]) if isinstance(rec, dict) else []
        return [{"stage": str(e["stage"]), "time": float(e["time"]), "pid": int(e.get("pid", -1))}
                for e in entries if isinstance(e, dict)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def history(run_dir: str | Path) -> dict[str, list[dict]]:
    """process -> every stage it marked, oldest first ([{"stage", "time", "pid"}]), for every stage file."""
    out = {}
    for path in sorted((Path(run_dir) / "stages").glob("*.json")):
        if entries := _history(path):
            out[path.stem] = entries
    return out


def read(run_dir: str | Path) -> dict[str, tuple[str, float]]:
    """process -> (the furthest stage its newest process has reached, when it reached it)."""
    out: dict[str, tuple[str, float]] = {}
    for proc, entries in history(run_dir).items():
        newest = [e for e in entries if e["pid"] == entries[-1]["pid"]]
        names = [s for s, _ in STAGES[role_of(proc)]]
        known = [e for e in newest if e["stage"] in names]
        furthest = max(known, key=lambda e: (names.index(e["stage"]), e["time"])) if known else newest[-1]
        out[proc] = (furthest["stage"], furthest["time"])
    return out


def first_step_s(hist: dict[str, list[dict]], learner_pid: int | None = None) -> float | None:
    """Seconds from the earliest 'started' of any process of this launch to learner0's 'first_step'
    (that of process `learner_pid`, default its newest); None before learner0's first step.

    A run directory can hold the marks of earlier launches (a resumed run): a process belongs to
    this launch if it marked anything at or after learner0's own 'started' (the other learner
    ranks and the samplers start beside it and mark stages after it)."""
    mine = [e for e in hist.get("learner0", []) if learner_pid is None or e["pid"] == learner_pid]
    if learner_pid is None and mine:
        mine = [e for e in mine if e["pid"] == mine[-1]["pid"]]
    firsts = [e["time"] for e in mine if e["stage"] == "first_step"]
    starts = [e["time"] for e in mine if e["stage"] == "started"]
    if not firsts:
        return None
    since = min(starts) if starts else min(e["time"] for e in mine)
    t0 = min(starts or [firsts[-1]])
    for entries in hist.values():
        pids = {e["pid"] for e in entries if e["time"] >= since}
        t0 = min([t0] + [e["time"] for e in entries if e["stage"] == "started" and e["pid"] in pids])
    return firsts[-1] - t0


def overdue(started: dict[str, float], reached: dict[str, tuple[str, float]], now: float, bound_s: float,
            noted: dict[str, float]) -> list[tuple[str, str, str, str, float]]:
    """Processes that have waited more than `bound_s` for their next stage, and were not noted
    within the last `bound_s`: [(process, last stage, next stage, what it is doing, seconds)].

    `started`: when the launcher started each process (a stage recorded before that belongs to
    an earlier incarnation and is ignored); `noted` is updated for those returned.
    """
    out = []
    for proc, t_start in sorted(started.items()):
        stages = STAGES[role_of(proc)]
        stage, t = reached.get(proc, ("", t_start))
        if t < t_start:
            stage, t = "", t_start
        names = [s for s, _ in stages]
        i = names.index(stage) + 1 if stage in names else 0
        if i >= len(names):
            continue   # past its last startup stage
        waited = now - t
        if waited > bound_s and now - noted.get(proc, -1e18) > bound_s:
            noted[proc] = now
            out.append((proc, stage or "(none)", names[i], stages[i][1], waited))
    return out
