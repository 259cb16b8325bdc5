"""Startup stages: each process records the stages it reaches in the run directory, and the
launcher names any process that has not reached its next stage within a bound.

A stage file is `<run_dir>/stages/<process>.json` ({"stage", "time", "pid"}), replaced
atomically at each stage, so a reader never sees half a file. STAGES lists each role's stages
in order, with what the process is doing until it reaches each one: what the launcher says.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

# role -> [(stage, what the process does until it reaches it)], in order.
STAGES: dict[str, list[tuple[str, str]]] = {
    "learner0": [("started", "starting Python and parsing its options"),
                 ("bound", "binding the data and sync ports"),
                 ("engine_ready", "loading the model and building its optimizer engine (DeepSpeed: the "
                                  "process group and, on CPU, its communication op)"),
                 ("weights_published", "publishing version 0 of the weights"),
                 ("first_step", "its first step: waiting for groups from the samplers, then training")],
    "learner": [("started", "starting Python and parsing its options"),
                ("engine_ready", "loading the model and joining the DeepSpeed group"),
                ("first_step", "its first step (rank 0 gathers the batch)")],
    "sampler": [("started", "starting Python and parsing its options"),
                ("model_loaded", "loading its data and the model"),
                ("connected", "the learner's first answer on the sync port"),
                ("first_group", "generating and scoring its first round")],
}


def role_of(process: str) -> str:
    return "learner0" if process == "learner0" else "learner" if process.startswith("learner") else "sampler"


def mark(run_dir: str | Path, process: str, stage: str) -> None:
    """Record that `process` reached `stage` (best effort: a run never fails on its stage file).
    Without a run directory (a sampler or learner built in process, as tests do) nothing is written."""
    if not run_dir:
        return
    d = Path(run_dir) / "stages"
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{process}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"stage": stage, "time": time.time(), "pid": os.getpid()}))
        os.replace(tmp, d / f"{process}.json")
    except OSError:
        pass


def read(run_dir: str | Path) -> dict[str, tuple[str, float]]:
    """process -> (the last stage it reached, when), for every stage file that parses."""
    out: dict[str, tuple[str, float]] = {}
    for path in (Path(run_dir) / "stages").glob("*.json"):
        try:
            rec = json.loads(path.read_text())
            out[path.stem] = (str(rec["stage"]), float(rec["time"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


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
