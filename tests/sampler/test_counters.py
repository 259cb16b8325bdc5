"""The sampler's counters (grpo.sampler.counters): the status's stats keep the keys they had as a
dict, a snapshot taken while another thread updates them is consistent, and each field is written
only by the module its comment names."""
from __future__ import annotations

import ast
import re
import sys
import threading
from pathlib import Path

import pytest

import grpo.sampler
from grpo.data.faults import RewardFaults
from grpo.data.tasks import SuccessWindow
from grpo.generate.stream import STREAM_COUNTS
from grpo.sampler.counters import DICT_FIELDS, FIXED_FIELDS, SamplerCounters
from grpo.sampler.heartbeat import Statuses
from grpo.wire import codec

# The keys of the stats dict the sampler kept before the counters (grpo/sampler/loop.py, in its
# order): the learner, grpo.obs.report, bench/ and the tests read them by these names.
DICT_KEYS = ["samples", "tokens", "gen_s", "logprob_s", "reward_s", "sync_s", "weight_bytes", "weight_syncs", "apply_s",
             "rounds", "dropped_full", "dropped_send_timeout", "dropped_zero_signal", "peak_mem_gb",
             "peak_reserved_gb", "eval_version", "eval_accuracy", "eval_seconds", "verified_version",
             "verified_checksum", "budget_wait_s", "swaps", "reward_failures", "prompts_deferred",
             "zero_signal_solved", "zero_signal_unsolved", "screened_out", "screened_solved", "screened_unsolved",
             "screen_samples",
             *(f"stream_{k}" for k in STREAM_COUNTS)]
SAMPLER = Path(grpo.sampler.__file__).parent


def _curriculum_window() -> SuccessWindow:
    window = SuccessWindow(4)
    for task, level in (("leg_counting", 0), ("basic_arithmetic", 2)):
        window.set_level(task, level)
    return window


def test_the_snapshot_has_the_keys_and_starting_values_of_the_stats_dict():
    window = _curriculum_window()
    c = SamplerCounters(curriculum=window.stats())
    snap = c.snapshot()
    curriculum = [f"curriculum/{t}/{k}" for t in ("leg_counting", "basic_arithmetic") for k in ("level", "groups", "rate")]
    assert list(snap) == DICT_KEYS + curriculum   # the same keys, in the same order
    assert all(type(v) is float for v in snap.values())
    assert {k: v for k, v in snap.items() if v} == {"eval_version": -1.0, "verified_version": -1.0,
                                                     "curriculum/basic_arithmetic/level": 2.0}
    assert c.groups_sent == c.handed() == 0

    # reward_failures/<reward>/<type> join once a reward fails, as grpo.data.faults names them
    faults = RewardFaults()
    faults.counts[("correctness", "ValueError")] = 3
    failures = faults.stats()
    c.put(reward_failures=failures.pop("reward_failures"), reward_kinds=failures)
    snap = c.snapshot()
    assert set(snap) == set(DICT_KEYS) | set(curriculum) | {"reward_failures/correctness/ValueError"}
    assert snap["reward_failures"] == snap["reward_failures/correctness/ValueError"] == 3.0


def test_dict_fields_merge_and_unknown_names_fail():
    c = SamplerCounters(curriculum={"curriculum/a/level": 1.0})
    c.put(curriculum={"curriculum/b/level": 2.0})   # a key once reported stays (as dict.update did)
    c.put(curriculum={"curriculum/a/level": 3.0})
    assert c.curriculum == {"curriculum/a/level": 3.0, "curriculum/b/level": 2.0}
    c.raise_to(peak_mem_gb=2.0)
    c.raise_to(peak_mem_gb=1.0)
    assert c.peak_mem_gb == 2.0
    for write in (c.add, c.put, c.raise_to):
        with pytest.raises(AttributeError):
            write(sample=1)   # a typo is not a new key
    with pytest.raises(AttributeError):
        c.add(stream=1)       # a dict field takes put's merge, not a number
    with pytest.raises(AttributeError):
        c.samplez = 1.0       # no attribute outside the fields (slots)
    # rounds keeps the loop's int in the sampler's result (values), a float on the wire (snapshot)
    c.put(rounds=3)
    assert c.values()["rounds"] == 3 and type(c.values()["rounds"]) is int and type(c.snapshot()["rounds"]) is float


def test_groups_sent_and_handed():
    c = SamplerCounters()
    c.add(groups_offered=5)
    c.add(dropped_zero_signal=2)
    c.add(dropped_full=1)
    c.add(dropped_send_timeout=1)
    assert (c.groups_sent, c.handed()) == (7, 3)   # offered + filtered; offered - dropped at the socket


def test_a_status_round_trips_with_the_stats_keys():
    c = SamplerCounters(curriculum=_curriculum_window().stats())
    c.add(samples=6, tokens=40, gen_s=0.5, groups_offered=3, dropped_zero_signal=1)
    c.put(rounds=2, reward_kinds={"reward_failures/format/KeyError": 1.0})
    version = [4]
    status = Statuses(1, 12345, c, lambda: version[0])(True)
    assert (status.sampler_id, status.policy_version, status.groups_sent, status.final, status.incarnation) == \
           (1, 4, 4, True, 12345)
    assert set(status.stats) == set(c.snapshot()) | {"clock_s"} and status.stats["clock_s"] >= 0
    assert {k: status.stats[k] for k in ("samples", "tokens", "rounds", "dropped_zero_signal")} == \
           {"samples": 6.0, "tokens": 40.0, "rounds": 2.0, "dropped_zero_signal": 1.0}
    assert codec.decode(codec.encode(status)) == status


def test_a_snapshot_taken_while_a_thread_updates_is_consistent():
    """The writer moves several fields at once (a round's samples and tokens, a filtered group's
    groups_sent with its drop); every snapshot the reader takes meanwhile sees all of an update or
    none of it. The switch interval is made tiny so that threads interleave inside an update."""
    c = SamplerCounters()
    n = 20000
    done = threading.Event()

    def writer():
        for i in range(n):
            c.add(samples=2, tokens=10, gen_s=0.5)
            c.add(dropped_zero_signal=1, dropped_full=1)
            c.put(stream={"stream_steps": float(i + 1), "stream_prompts": float(i + 1)})
        done.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        t = threading.Thread(target=writer)
        t.start()
        seen = 0
        while not done.is_set() or seen == 0:
            sent, snap = c.read()
            assert snap["tokens"] == 5 * snap["samples"] and snap["gen_s"] == snap["samples"] / 4
            assert snap["dropped_zero_signal"] == snap["dropped_full"] and sent >= snap["dropped_zero_signal"]
            assert snap["stream_steps"] == snap["stream_prompts"]
            seen += 1
        t.join()
    finally:
        sys.setswitchinterval(old)
    assert c.snapshot()["samples"] == 2 * n and seen > 1


def _owners() -> dict[str, str]:
    """Each field's owner, from its comment in grpo/sampler/counters.py ('name: type = ...  # owner: ...')."""
    text = (SAMPLER / "counters.py").read_text()
    body = text[text.index("class SamplerCounters"):text.index("    # ---")]
    return {m[1]: m[2] for m in re.finditer(r"^    (\w+): [^#\n]+#\s*(\w+):", body, re.M)}


def _writes() -> dict[str, set[str]]:
    """Every write to a counter field in grpo/sampler/*.py, by field: the modules making it. A write is
    a keyword of add/put/raise_to called on `counters` or `<x>.counters`, or an assignment to
    `counters.<field>` / `<x>.counters.<field>` (which the counters' lock would not cover)."""
    def is_counters(node) -> bool:
        return (isinstance(node, ast.Name) and node.id == "counters") or \
               (isinstance(node, ast.Attribute) and node.attr == "counters")

    out: dict[str, set[str]] = {}
    for path in SAMPLER.glob("*.py"):
        if path.name == "counters.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("add", "put", "raise_to") and is_counters(node.func.value)):
                for kw in node.keywords:
                    out.setdefault(kw.arg, set()).add(path.stem)
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AugAssign) else [])
            for target in targets:
                if isinstance(target, ast.Subscript):
                    target = target.value
                if isinstance(target, ast.Attribute) and is_counters(target.value):
                    out.setdefault(target.attr, set()).add(f"{path.stem} (assigned)")
    return out


def test_each_field_is_written_only_by_the_module_its_comment_names():
    owners = _owners()
    assert set(owners) == set(FIXED_FIELDS) | set(DICT_FIELDS) | {"groups_offered"}   # every field says its owner
    assert set(owners.values()) <= {"workflow", "weights_client", "loop", "heartbeat"}
    writes = _writes()
    assert set(writes) <= set(owners), set(writes) - set(owners)
    for name, owner in owners.items():
        assert writes.get(name) == {owner}, (name, owner, writes.get(name))
