"""Which checkpoint --resume names: the complete checkpoints of a run and the one a --resume value
picks. Standard library only: the launcher (grpo.launch.checks.check_resume) asks it before any worker
starts, when nothing may import torch or numpy yet; grpo.learner.checkpoint saves and loads them.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class ResumeError(ValueError):
    """--resume cannot be honoured; the message is one line with the fix."""


def checkpoints_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under root (those with trainer_state.json), oldest first."""
    found = []
    if root.is_dir():
        for p in root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and (p / STATE_FILE).is_file():
                found.append((int(m.group(1)), p))
    return sorted(found)


def resolve_resume(spec: str, run_dir: Path, max_steps: int = 0) -> Path | None:
    """--resume value to a checkpoint folder: '' (none), 'latest', or a path.

    A path may be a step_N folder or a run directory / checkpoints folder (its newest complete
    checkpoint is taken). With max_steps, a checkpoint with nothing left to do is refused.
    """
    if not spec:
        return None
    found = _resolve(spec, run_dir)
    step = json.loads((found / STATE_FILE).read_text())["step"]
    if max_steps and step >= max_steps:
        raise ResumeError(f"checkpoint {found} is at step {step} >= --max-steps {max_steps}; "
                          f"raise --max-steps (it counts all steps, the resumed ones too)")
    return found


def _resolve(spec: str, run_dir: Path) -> Path:
    if spec == "latest":
        found = list_checkpoints(checkpoints_root(run_dir))
        if not found:
            raise ResumeError(f"--resume latest: no complete checkpoint under {checkpoints_root(run_dir)}; "
                              f"pass the --run-dir of the run to resume, or --resume PATH")
        return found[-1][1]
    path = Path(spec).expanduser()
    if (path / STATE_FILE).is_file():
        return path
    for root in (path, checkpoints_root(path)):
        found = list_checkpoints(root)
        if found:
            return found[-1][1]
    raise ResumeError(f"--resume {spec}: not a complete checkpoint (no {STATE_FILE}); "
                      f"pass a checkpoints/step_N folder, a run directory, or 'latest'")
