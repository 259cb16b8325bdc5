"""The run's last lines (grpo.launch.ending) on hand-made run folders: the words must stay true
to the books in the cases a real run rarely shows (nothing queued, one group, drops, unbalanced
books, no summary), and the resume command must name the run and resume it whatever --resume the
run itself was started with."""
import json
import shlex
import sys

from grpo.launch.ending import books_line, end_lines, resume_command


def summary(**kw):
    base = {"steps": 10, "steps_at_start": 0, "elapsed_s": 12.3, "ended_by": "max_steps", "max_steps": 10,
            "groups": {"sent": 13, "trained": 10, "dropped": {}, "queued": 3, "balanced": True},
            "balance": {"text": "balanced"}, "queued_versions": [9, 10]}
    return {**base, **kw}


def test_books_line_names_the_queued_groups_by_what_ended_the_run():
    assert books_line(summary()) == ("groups: 13 sent = 10 trained + 0 dropped + 3 queued: balanced; 3 groups "
                                     "(made at versions 9-10) were still queued when the run stopped at --max-steps "
                                     "10: generated ahead, never trained")
    one = summary(ended_by="SIGINT", groups={"sent": 12, "trained": 10, "dropped": {"stale": 1}, "queued": 1,
                                             "balanced": True}, queued_versions=[9, 9])
    assert books_line(one) == ("groups: 12 sent = 10 trained + 1 dropped (stale 1) + 1 queued: balanced; 1 group "
                               "(made at version 9) was still queued when the run stopped on SIGINT: generated "
                               "ahead, never trained (a resumed run generates fresh ones)")
    assert "when --max-time-s ran out" in books_line(summary(ended_by="max_time_s"))
    none = summary(groups={"sent": 10, "trained": 10, "dropped": {}, "queued": 0, "balanced": True})
    assert books_line(none) == "groups: 10 sent = 10 trained + 0 dropped + 0 queued: balanced"
    # the learner's verdict is said as it is: a gap is never hidden behind the words
    bad = summary(balance={"text": "NOT balanced (sent 13, accounted 12): ..."})
    assert ": NOT balanced (sent 13, accounted 12): ...; 3 groups" in books_line(bad)


def test_end_lines_of_a_folder_without_summary_or_checkpoint(tmp_path):
    lines = end_lines(tmp_path, None, 5.0, "SIGTERM", "cmd")
    assert lines == [f"run folder {tmp_path}: the learner wrote no summary.json (5 s since launch)",
                     "SIGTERM: nothing saved: no checkpoint exists in this run folder (the run stopped before its "
                     "first step)"]


def test_end_lines_of_a_stop_with_no_new_step_point_at_the_checkpoint_it_resumed_from(tmp_path):
    step = tmp_path / "checkpoints" / "step_4"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text(json.dumps({"step": 4}))
    s = summary(steps=4, steps_at_start=4, ended_by="SIGINT", groups={"sent": 0, "trained": 0, "dropped": {},
                                                                      "queued": 0, "balanced": True})
    (tmp_path / "summary.json").write_text(json.dumps(s))
    lines = end_lines(tmp_path, s, 7.0, "SIGINT", "cmd")
    assert lines[0].startswith(f"run folder {tmp_path}: 4 steps (0 in this launch, resumed at step 4), the run "
                               f"stopped on SIGINT; ")
    assert lines[-1] == f"SIGINT: no new step to save; the newest checkpoint is step 4 at {step}; resume with: cmd"


def test_resume_command_replaces_any_resume_and_names_the_run_folder(tmp_path):
    cmd = shlex.split(resume_command(["--device", "cpu", "--resume", "runs/a/checkpoints/step_2", "--max-steps", "9"],
                                     tmp_path / "run", run_dir_given=False))
    assert cmd[0] == sys.executable and cmd[1].endswith("run_distributed.py")
    assert cmd[2:] == ["--device", "cpu", "--max-steps", "9", "--run-dir", str(tmp_path / "run"), "--resume", "latest"]
    cmd = shlex.split(resume_command(["--run-dir", "runs/my run", "--resume=latest"], tmp_path, run_dir_given=True))
    assert cmd[2:] == ["--run-dir", "runs/my run", "--resume", "latest"]


def test_the_screens_line_sums_the_samplers_results_and_is_absent_without_screens(tmp_path):
    """Two samplers' results of a --screen-generations 4 run: 30 + 12 prompts dropped at their screen
    (7 + 2 solved, 23 + 10 unsolved), 168 completions of 1,000 + 400 generated (12%); a run whose
    samplers dropped none, or left no result, says nothing of screens."""
    from grpo.launch.ending import screens_line

    assert screens_line(tmp_path) is None
    (tmp_path / "sampler0_result.json").write_text(json.dumps(
        {"screened_out": 30.0, "screened_solved": 7.0, "screened_unsolved": 23.0, "screen_samples": 120.0,
         "samples": 1000.0}))
    (tmp_path / "sampler1_result.json").write_text(json.dumps(
        {"screened_out": 12.0, "screened_solved": 2.0, "screened_unsolved": 10.0, "screen_samples": 48.0,
         "samples": 400.0}))
    (tmp_path / "sampler2_result.json").write_text("{not json")   # a sampler killed while writing: left out
    want = ("screens: 42 prompts dropped at their screen (9 with every completion right, 33 with none): 168 "
            "completions, 12% of the 1,400 generated")
    assert screens_line(tmp_path) == want
    assert want in end_lines(tmp_path, summary(), 20.0)
    (tmp_path / "sampler1_result.json").write_text(json.dumps({"screened_out": 5.0, "screen_samples": 10.0}))
    (tmp_path / "sampler0_result.json").unlink()   # a reward without a correctness part: no kinds to tell
    assert screens_line(tmp_path) == "screens: 5 prompts dropped at their screen: 10 completions"
    (tmp_path / "sampler0_result.json").write_text(json.dumps({"screened_out": 0.0, "samples": 10.0}))
    (tmp_path / "sampler1_result.json").unlink()
    assert screens_line(tmp_path) is None and not any(x.startswith("screens") for x in end_lines(tmp_path, summary(), 1.0))
