"""bench/goals.py: the one-GPU targets read from a plan's rows, by hand on made-up rows, and on the
committed rows of plans J (one H200, c1f5e01) and L (two H200s, 5cd88db) against the figures worked
from them by hand; the results file found by its label."""
import json
import subprocess
import sys

from benchload import BENCH

sys.path.insert(0, str(BENCH))
import goals  # noqa: E402


def row(model, trainer, **fields):
    return {"model": model, "trainer": trainer, "gpus": 1, "label": "p", "seconds": 300.0, **fields}


def test_targets_by_hand():
    rows = [row("0.5b", "ours", steps_per_s=0.6, steps_per_s_from_launch=0.5, seconds_to_plus10=151.0,
                accuracy_at_s={"600": 0.42}, gen_tokens_per_s_per_gpu=29_999.0, bf16_peak_share_median=0.3,
                zero_signal_share=0.15, seconds=600.0),
            row("0.5b", "trl-vllm", steps_per_s=0.25, steps_per_s_from_launch=0.1),
            row("0.5b", "ours", steps_per_s=9.0, seconds=100.0),        # a shorter row of the same plan: not read
            row("1.5b", "ours", steps_per_s=0.24)]                      # no TRL row at 1.5B
    got = {e["target"]: (e["figure"], e["verdict"]) for e in goals.table(rows)}
    assert got["0.5B steps/s from launch"] == (0.5, "met")                          # exactly the bound
    assert got["0.5B steps/s over TRL with vLLM (own clocks)"] == (2.4, "missed")   # 0.6 / 0.25
    assert got["0.5B steps/s over TRL with vLLM (from launch)"] == (5.0, "met")     # 0.5 / 0.1
    assert got["0.5B seconds to +10 points"] == (151.0, "missed")
    assert got["0.5B accuracy at 600 s"] == (0.42, "met")
    assert got["1.5B steps/s (own clock)"] == (0.24, "missed")
    assert got["1.5B steps/s over TRL with vLLM (own clocks)"] == (None, "no figure")
    assert got["0.5B tokens/s decoded in the run"] == (29_999.0, "missed")
    assert got["0.5B learner's median share of the bf16 peak"] == (0.3, "met")
    assert got["0.5B share of groups sent without signal"] == (0.15, "met")          # at most: the bound passes
    # never reached in a row that ran past the bound: missed; in a shorter row: no figure
    rows[0]["seconds_to_plus10"] = None
    assert goals.table(rows)[3]["verdict"] == "missed (not reached in 600 s)"
    short = [row("0.5b", "ours", seconds=120.0, seconds_to_plus10=None)]
    assert goals.table(short)[3]["verdict"] == "no figure"


def test_plan_j_rows_and_the_command():
    out = subprocess.run([sys.executable, str(BENCH / "goals.py"), "--label", "plan-j", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = {e["target"]: (e["figure"], e["verdict"]) for e in json.loads(out.stdout)}
    # plan J's rows: ours 136 steps, 0.4533 steps/s on its clock, 0.4286 from launch; TRL 0.1561 / 0.1019
    assert got["0.5B steps/s from launch"] == (0.4286, "missed")
    assert got["0.5B steps/s over TRL with vLLM (own clocks)"] == (round(0.4533 / 0.1561, 4), "met")
    assert got["0.5B steps/s over TRL with vLLM (from launch)"] == (round(0.4286 / 0.1019, 4), "met")
    assert got["0.5B seconds to +10 points"] == (None, "missed (not reached in 300 s)")
    assert got["0.5B accuracy at 600 s"] == (None, "no figure")
    assert got["0.5B share of groups sent without signal"] == (0.3293, "missed")
    bad = subprocess.run([sys.executable, str(BENCH / "goals.py"), "--label", "no-such-plan"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no-such-plan" in bad.stderr


def test_the_results_file_is_found_by_its_label(tmp_path):
    """plan L's rows are in the two-GPU host's file; without --results goals.py finds it there. Its
    figures by hand: ours 0.5B 0.5292 steps/s from launch, 1.5B 0.2597 on its clock against TRL with
    vLLM's 0.1528; the 0.5B row's last save before 600 s scored 0.346."""
    out = subprocess.run([sys.executable, str(BENCH / "goals.py"), "--label", "plan-l", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = {e["target"]: (e["figure"], e["verdict"]) for e in json.loads(out.stdout)}
    assert got["0.5B steps/s from launch"] == (0.5292, "met")
    assert got["1.5B steps/s (own clock)"] == (0.2597, "met")
    assert got["1.5B steps/s over TRL with vLLM (own clocks)"] == (round(0.2597 / 0.1528, 4), "missed")
    assert got["0.5B accuracy at 600 s"] == (0.346, "missed")
    (tmp_path / "real_workload_a.json").write_text(json.dumps({"rows": [{"label": "x"}]}))
    (tmp_path / "real_workload_b.json").write_text(json.dumps({"rows": [{"label": "x"}, {"label": "y"}]}))
    (tmp_path / "real_workload_c.json").write_text("not json")
    assert [p.name for p in goals.labelled_files(tmp_path, "x")] == ["real_workload_a.json", "real_workload_b.json"]
    assert [p.name for p in goals.labelled_files(tmp_path, "y")] == ["real_workload_b.json"]
    assert goals.labelled_files(tmp_path, "z") == []
