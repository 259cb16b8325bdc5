"""How a run that ends on --max-time-s leaves its saves, with real processes (CPU, tiny-random).

The clock can run out in two places: after a step (that step is the last, saved as such), or while
the learner waits for the next step's data. In the second case the last trained step must still be
saved as the run's last, or the final evaluation scores weights no save holds (a 600 s run of the
1.5B model ended two steps past its last timed save).

One run serves both tests (a module fixture): it ends in the second place, and its final evaluation
must equal `python -m grpo.evaluate` on the checkpoint it saved last.
"""
import json
import subprocess
import sys

import pytest
from faultutil import GSM8K, ROOT, Cluster

EV = ["--dataset", str(GSM8K), "--eval-size", "6", "--max-new-tokens", "12"]


def evaluate(model, out):
    """`python -m grpo.evaluate` started; its stderr goes to out + ".log" (a file: no pipe to fill)."""
    with open(f"{out}.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "grpo.evaluate", "--model", str(model), "--device", "cpu",
                                 "--out", str(out), *EV], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)


def finished(p, out):
    """Wait for the evaluate command; a non-zero exit fails the test with its stderr's tail."""
    rc = p.wait(timeout=300)
    assert rc == 0, open(f"{out}.log").read()[-2000:]


@pytest.fixture(scope="module")
def timed_out_run(tmp_path_factory):
    """A run whose clock runs out while the learner waits for data, after 2 trained steps; and the
    evaluate command's result on the base model, made while the learner sat waiting."""
    tmp_path = tmp_path_factory.mktemp("timed_out")
    c = Cluster(tmp_path, 1, ["--num-generations", "4", "--max-new-tokens", "12"])
    base = None
    try:
        # Sampler 0 makes 2 rounds of one group and exits; each step takes one group; the learner
        # trains 2 steps, then waits for data until --max-time-s is up. No timed save falls due
        # before the end (1000 s), so the only saves are the ones the end makes. A large step:
        # the saved weights are not the base model's. The clock starts once the learner is up, by
        # when the sampler (started with it) is up too: its 2 rounds of 4 x 12 tokens and the 2
        # steps take about 1 s of the 15.
        c.learner("--max-steps", "50", "--train-batch-size", "4", "--max-time-s", "15", "--eval-every", "1000",
                  "--save-weights-every-s", "1000", "--save-every", "1000", "--learning-rate", "1e-2", *EV)
        # the tiny random model never answers right: a reward of the completion's own token ids gives
        # its groups signal, so the two steps move the weights
        (tmp_path / "varied.py").write_text("def varied(prompts, completions, completion_ids, **kw):\n"
                                            "    return [float(sum(ids) % 2) for ids in completion_ids]\n")
        c.sampler(0, "--prompts-per-round", "1", "--max-rounds", "2", "--reward", f"{tmp_path / 'varied.py'}:varied")
        c.wait("step 2", lambda: len(c.steps()) >= 2)
        base = evaluate("tiny-random", tmp_path / "base.json")   # the learner only waits for data now
        assert c.procs["sampler0"].wait(timeout=300) == 0, c.logs()
        assert c.procs["learner"].wait(timeout=300) == 0, c.logs()
        finished(base, tmp_path / "base.json")
    finally:
        c.close()
        if base is not None and base.poll() is None:
            base.kill()
    return c, tmp_path


@pytest.mark.slow
def test_time_running_out_while_waiting_for_data_saves_the_last_step(timed_out_run):
    c, _ = timed_out_run
    s = c.summary()
    assert s["steps"] == 2, s
    assert "--max-time-s reached while waiting for data" in c.log("learner")
    saves = sorted(p.name for p in (c.run_dir / "weights").iterdir())
    assert saves == ["step_2"], saves
    assert json.loads((c.run_dir / "weights" / "step_2" / "weights.json").read_text())["step"] == 2
    assert sorted(p.name for p in (c.run_dir / "checkpoints").iterdir() if p.name.startswith("step_")) == ["step_2"]


@pytest.mark.slow
def test_final_evaluation_equals_the_evaluate_command_on_the_last_save(timed_out_run):
    """The learner's final evaluation and `python -m grpo.evaluate` on the checkpoint it saved last
    decode the same completions: same accuracy, same digest of every completion's text."""
    c, tmp_path = timed_out_run
    learner = [json.loads(x) for x in (c.run_dir / "eval.jsonl").read_text().splitlines()]
    final = [e for e in learner if e["by"] == "learner"]
    assert [e["version"] for e in final] == [2], learner
    out = tmp_path / "cli.json"
    finished(evaluate(c.run_dir / "checkpoints" / "step_2" / "hf", out), out)
    cli = json.loads(out.read_text())
    assert cli["n"] == final[0]["n"] == 6
    assert cli["completions_sha256"] == final[0]["completions_sha256"]
    assert (cli["correct"], cli["mean_completion_len"]) == (final[0]["correct"], final[0]["mean_completion_len"])
    # the digest tells weights apart: the trained weights decode otherwise than the base model
    assert json.loads((tmp_path / "base.json").read_text())["completions_sha256"] != cli["completions_sha256"]
