"""How a run that ends on --max-time-s leaves its saves, with real processes (CPU, tiny-random).

The clock can run out in two places: after a step (that step is the last, saved as such), or while
the learner waits for the next step's data. In the second case the last trained step must still be
saved as the run's last, or the final evaluation scores weights no save holds (a 600 s run of the
1.5B model ended two steps past its last timed save)."""
import json

import pytest
from faultutil import Cluster


@pytest.mark.slow
def test_time_running_out_while_waiting_for_data_saves_the_last_step(tmp_path):
    c = Cluster(tmp_path, 1, ["--num-generations", "4", "--max-new-tokens", "8"])
    try:
        # Sampler 0 makes 2 rounds of one group and exits; each step takes one group; the learner
        # trains 2 steps, then waits for data until --max-time-s is up. No timed save falls due
        # before the end (1000 s), so the only saves are the ones the end makes.
        c.learner("--max-steps", "50", "--train-batch-size", "4", "--max-time-s", "40", "--eval-every", "0",
                  "--save-weights-every-s", "1000", "--save-every", "1000")
        c.sampler(0, "--prompts-per-round", "1", "--max-rounds", "2")
        assert c.procs["sampler0"].wait(timeout=300) == 0, c.logs()
        assert c.procs["learner"].wait(timeout=300) == 0, c.logs()
    finally:
        c.close()
    s = c.summary()
    assert s["steps"] == 2, s
    assert "--max-time-s reached while waiting for data" in c.log("learner")
    saves = sorted(p.name for p in (c.run_dir / "weights").iterdir())
    assert saves == ["step_2"], saves
    assert json.loads((c.run_dir / "weights" / "step_2" / "weights.json").read_text())["step"] == 2
    assert sorted(p.name for p in (c.run_dir / "checkpoints").iterdir() if p.name.startswith("step_")) == ["step_2"]
