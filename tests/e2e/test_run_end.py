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


@pytest.mark.slow
def test_final_evaluation_equals_the_evaluate_command_on_the_last_save(tmp_path):
    """The learner's final evaluation and `python -m grpo.evaluate` on the checkpoint it saved last
    decode the same completions: same accuracy, same digest of every completion's text."""
    import subprocess
    import sys

    from faultutil import GSM8K, ROOT

    ev = ["--dataset", str(GSM8K), "--eval-size", "6", "--max-new-tokens", "12"]
    c = Cluster(tmp_path, 1, ["--num-generations", "4", "--max-new-tokens", "12"])
    try:
        c.learner("--max-steps", "2", "--train-batch-size", "4", "--eval-every", "1000",
                  "--learning-rate", "1e-2", *ev)   # a large step: the saved weights are not the base model's
        # the tiny random model never answers right: a reward of the completion's own token ids gives
        # its groups signal, so the two steps move the weights
        (tmp_path / "varied.py").write_text("def varied(prompts, completions, completion_ids, **kw):\n"
                                            "    return [float(sum(ids) % 2) for ids in completion_ids]\n")
        c.sampler(0, "--prompts-per-round", "1", "--reward", f"{tmp_path / 'varied.py'}:varied")
        assert c.procs["learner"].wait(timeout=400) == 0, c.logs()
    finally:
        c.close()
    learner = [json.loads(x) for x in (c.run_dir / "eval.jsonl").read_text().splitlines()]
    final = [e for e in learner if e["by"] == "learner"]
    assert [e["version"] for e in final] == [2], learner
    out = tmp_path / "cli.json"
    r = subprocess.run([sys.executable, "-m", "grpo.evaluate", "--model", str(c.run_dir / "checkpoints" / "step_2" / "hf"),
                        "--device", "cpu", "--out", str(out), *ev], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    cli = json.loads(out.read_text())
    assert cli["n"] == final[0]["n"] == 6
    assert cli["completions_sha256"] == final[0]["completions_sha256"]
    assert (cli["correct"], cli["mean_completion_len"]) == (final[0]["correct"], final[0]["mean_completion_len"])
    base = subprocess.run([sys.executable, "-m", "grpo.evaluate", "--model", "tiny-random", "--device", "cpu",
                           "--out", str(tmp_path / "base.json"), *ev], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert base.returncode == 0, base.stderr[-2000:]
    # the digest tells weights apart: the trained weights decode otherwise than the base model
    assert json.loads((tmp_path / "base.json").read_text())["completions_sha256"] != cli["completions_sha256"]
