"""bench/objectives.py: the sampler's round lines, the reward-by-version rule, and the committed result."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import objectives as ob  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def test_round_lines_and_reward_by_version_by_hand():
    log = ("12:00 sampler0 INFO round 0 (v0): 1024 completions, 9 tokens in 1.0 s (9 tok/s); log-probs 0.1 s, "
           "rewards 0.1 s; reward mean 0.100, 30 of 64 groups zero-signal | gpu 10%\n"
           "12:01 sampler0 INFO round 1 (v9): 512 completions, 9 tokens in 1.0 s (9 tok/s); log-probs 0.1 s, "
           "rewards 0.1 s; reward mean 0.400\n"
           "12:02 sampler0 INFO round 2 (v10): 256 completions, 9 tokens in 1.0 s (9 tok/s); log-probs 0.1 s, "
           "rewards 0.1 s; reward mean 0.500\n")
    rounds = ob.rounds_of(log)
    assert [(r["round"], r["version"], r["n"], r["reward_mean"]) for r in rounds] == \
        [(0, 0, 1024, 0.1), (1, 9, 512, 0.4), (2, 10, 256, 0.5)]
    # versions 0-9: (1024 * 0.1 + 512 * 0.4) / 1536 = 0.2; versions 10-19: 0.5
    assert ob.reward_by_version(rounds) == [
        {"versions": "0-9", "reward_mean": pytest.approx(0.2), "completions": 1536},
        {"versions": "10-19", "reward_mean": 0.5, "completions": 256}]


def test_reward_by_wall_time_by_hand():
    log = ("23:59:50 sampler0 INFO round 0 (v0): 100 completions, 9 tokens in 1.0 s (9 tok/s); log-probs 0.1 s, "
           "rewards 0.1 s; reward mean 0.100\n"
           "23:59:59 sampler0 INFO round 1 (v1): 300 completions, 9 tokens in 1.0 s (9 tok/s); log-probs 0.1 s, "
           "rewards 0.1 s; reward mean 0.300\n"
           "00:00:20 sampler0 INFO round 2 (v2): 50 completions, 9 tokens in 1.0 s (9 tok/s); log-probs 0.1 s, "
           "rewards 0.1 s; reward mean 0.900\n")
    rounds = ob.rounds_of(log)
    assert [r["clock_s"] for r in rounds] == [86390, 86399, 20]
    start = 23 * 3600 + 59 * 60 + 40   # launched at 23:59:40: rounds at 10 s, 19 s, and 40 s past midnight's wrap
    # 0-30 s: (100 * 0.1 + 300 * 0.3) / 400 = 0.25; 30-60 s: 0.9
    assert ob.reward_by_time(rounds, start) == [
        {"seconds": "0-30", "reward_mean": pytest.approx(0.25), "completions": 400},
        {"seconds": "30-60", "reward_mean": 0.9, "completions": 50}]


def test_variant_flags_parse_with_the_learner_and_sampler():
    from grpo.launch.plan import parse

    for name, flags in ob.VARIANTS.items():
        cmd = ob.command("rg:letter_counting", 10, 1, Path("/tmp/x"), flags)
        parse(cmd[2:])   # the launcher's own parser: an unknown flag raises SystemExit


def test_the_committed_result_is_what_its_run_files_say():
    committed = json.loads((RESULTS / "objectives_NVIDIA_H100_80GB_HBM3.json").read_text())
    for name, run in committed["runs"].items():
        assert ob.summarise_run(RESULTS / "objectives" / name) == run, name
    assert committed["versions"]["transformers"] and committed["commit"]
    # The default objective (--tis-cap 2) learned more per version than PPO's clip around the
    # behaviour policy in every bucket from versions 20 on, the claim the default rests on.
    tis, ppo = (committed["runs"][k]["reward_by_version"] for k in ("tis2", "ppo"))
    assert all(t["reward_mean"] > p["reward_mean"] for t, p in zip(tis[2:], ppo[2:]))


def test_the_staleness_table_is_what_the_printed_lines_say():
    """bench/results/staleness_table_*.json: its runs are runs_from_printed of the two kept printouts,
    then the objectives comparison's tis2 and fresh runs (S8/R64 and S0/R8) as they were committed."""
    table = json.loads((RESULTS / "staleness_table_NVIDIA_H100_80GB_HBM3.json").read_text())
    ba = "rg:basic_arithmetic:min_terms=2,max_terms=2,max_digits=1"
    printed = (ob.runs_from_printed((RESULTS / "staleness_table" / "basic_arithmetic.out").read_text(), ba, 150)
               + ob.runs_from_printed((RESULTS / "staleness_table" / "letter_counting.out").read_text(),
                                      "rg:letter_counting", 240))
    assert table["runs"][:len(printed)] == printed
    assert [r["variant"] for r in printed] == ["s1r16", "s2r16", "s4r32", "s8r64_inflight", "tis2", "curriculum"]
    objectives = json.loads((RESULTS / "objectives_NVIDIA_H100_80GB_HBM3.json").read_text())["runs"]
    for run, name in zip(table["runs"][len(printed):], ("tis2", "fresh")):
        assert run["steps"] == objectives[name]["steps"]
        assert run["reward_by_version"] == [round(b["reward_mean"], 3) for b in objectives[name]["reward_by_version"]]
    assert table["commit"] and table["seed"] == 42 and table["versions"]["torch"]
    # the choice: S2/R16 made the most steps of the fixed-batch cells and ended with the highest reward
    by = {r["variant"]: r for r in table["runs"] if r["task"] == ba}
    assert max(by, key=lambda v: by[v]["reward_by_version"][-1]) == "s2r16"


def test_the_letter_counting_comparison_is_what_its_run_files_say():
    """bench/results/objectives_*_letter_counting.json: bf16 weights (DeepSpeed's bf16 mode, `fresh`)
    against float32 weights under bf16 autocast (`fp32`, `fresh_fp32`), the claim --precision's
    default rests on: autocast learned more per version in every bucket."""
    committed = json.loads((RESULTS / "objectives_NVIDIA_H100_80GB_HBM3_letter_counting.json").read_text())
    assert committed["task"] == "rg:letter_counting" and set(committed["runs"]) == {"fp32", "fresh", "fresh_fp32"}
    for name, run in committed["runs"].items():
        assert ob.summarise_run(RESULTS / "objectives_letter_counting" / name) == run, name
    by = {k: [b["reward_mean"] for b in committed["runs"][k]["reward_by_version"]] for k in committed["runs"]}
    for wide in ("fp32", "fresh_fp32"):
        assert all(w > b for w, b in zip(by[wide], by["fresh"])), wide
    assert "--no-deepspeed" in committed["runs"]["fp32"]["flags"]


def test_zero_signal_counts_per_window_by_hand():
    """Round lines that count groups without signal give each window their share:
    (30 + 10) / (64 + 16) = 0.5 in the first minute, 3 / 4 in the second; a line without the
    count adds its completions to the reward only."""
    log = ("10:00:00 sampler0 INFO round 0 (v0): 1024 completions, 9 tokens in 1.0 s (9 tok/s); log-probs 0.1 s, "
           "rewards 0.1 s; reward mean 0.100, 30 of 64 groups zero-signal | gpu 10%\n"
           "10:00:50 sampler0 INFO round 1 (v1): 256 completions, 9 tokens in 1.0 s (9 tok/s); log-probs 0.1 s, "
           "rewards 0.1 s; reward mean 0.500, 10 of 16 groups zero-signal | gpu 10%\n"
           "10:01:10 sampler0 INFO round 2 (v2): 64 completions, 9 tokens in 1.0 s (9 tok/s); log-probs 0.1 s, "
           "rewards 0.1 s; reward mean 0.250, 3 of 4 groups zero-signal | gpu 10%\n"
           "10:01:20 sampler0 INFO round 3 (v2): 64 completions, 9 tokens in 1.0 s (9 tok/s); log-probs 0.1 s, "
           "rewards 0.1 s; reward mean 0.750\n")
    rounds = ob.rounds_of(log)
    assert [(r.get("zero_signal"), r.get("groups")) for r in rounds] == [(30, 64), (10, 16), (3, 4), (None, None)]
    # 0-60 s: (1024 * 0.1 + 256 * 0.5) / 1280 = 0.18; 60-120 s: (64 * 0.25 + 64 * 0.75) / 128 = 0.5
    assert ob.reward_by_time(rounds, rounds[0]["clock_s"], 60) == [
        {"seconds": "0-60", "reward_mean": pytest.approx(0.18), "completions": 1280, "zero_signal_share": 0.5,
         "groups": 80},
        {"seconds": "60-120", "reward_mean": 0.5, "completions": 128, "zero_signal_share": 0.75, "groups": 4}]
