"""--profile-steps: the span rule, and one record of exactly the profiled steps."""
import gzip
import json

import pytest
import torch

from grpo.obs.profile import SpanProfiler, parse_span


def test_span_rule():
    assert parse_span("") is None and parse_span("  ") is None
    assert parse_span("20-21") == (20, 21)
    assert parse_span(" 7 ") == (7, 7)
    assert parse_span("3 - 5") == (3, 5)
    with pytest.raises(ValueError, match="ends before it starts; write 2-5"):
        parse_span("5-2")
    with pytest.raises(ValueError, match="--profile-steps 'x': give a span A-B"):
        parse_span("x")


def test_records_the_span_once_with_its_operators(tmp_path):
    prof = SpanProfiler("2-3", tmp_path, "learner0")
    a = torch.randn(64, 64)
    for i in [0, 1, 2, 3, 3, 4]:   # index 3 twice: a step started again is not recorded again
        with prof.around(i):
            if i in (2, 3):
                a = a @ a.T / 64
            else:
                a = a.tanh()
    files = sorted(p.name for p in (tmp_path / "profile").iterdir())
    assert files == ["learner0_2-3.json.gz", "learner0_2-3.txt"]
    table = (tmp_path / "profile" / "learner0_2-3.txt").read_text()
    assert "aten::mm" in table and "aten::tanh" not in table   # only the profiled steps' operators
    trace = json.loads(gzip.decompress((tmp_path / "profile" / "learner0_2-3.json.gz").read_bytes()))
    mm = [e for e in trace["traceEvents"] if e.get("name") == "aten::mm"]
    assert len(mm) == 2   # steps 2 and 3; the repeat of 3 came after the record closed


def test_off_writes_nothing(tmp_path):
    prof = SpanProfiler("", tmp_path, "sampler0")
    for i in range(3):
        with prof.around(i):
            torch.ones(2) + 1
    assert not (tmp_path / "profile").exists()


def test_marks_record_the_units_of_the_span(tmp_path):
    """A sampler marks each chunk as it begins: span 2-3 records from mark(2) to mark(4), the work
    of chunks 2 and 3; a run that ends inside the span writes at close()."""
    prof = SpanProfiler("2-3", tmp_path, "sampler0")
    a = torch.randn(64, 64)
    for chunk in range(1, 6):
        prof.mark(chunk)
        a = a @ a.T / 64 if chunk in (2, 3) else a.tanh()
    prof.close()
    table = (tmp_path / "profile" / "sampler0_2-3.txt").read_text()
    assert "aten::mm" in table and "aten::tanh" not in table
    trace = json.loads(gzip.decompress((tmp_path / "profile" / "sampler0_2-3.json.gz").read_bytes()))
    assert len([e for e in trace["traceEvents"] if e.get("name") == "aten::mm"]) == 2
    cut = SpanProfiler("2-9", tmp_path / "cut", "sampler0")
    for chunk in (1, 2, 3):
        cut.mark(chunk)
        torch.ones(2).exp()
    assert not (tmp_path / "cut" / "profile").exists()   # still recording
    cut.close()
    assert "aten::exp" in (tmp_path / "cut" / "profile" / "sampler0_2-9.txt").read_text()
