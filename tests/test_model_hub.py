"""A hub id as --model where the hub does not answer (grpo.model.hub): the hub client's own retries
took ~52 s to fail with no fix named; now the hub is asked once, with a bound, and the start fails
in seconds with the ways out in one line, or loads the copy in the Hugging Face cache. No network:
HF_ENDPOINT points at a loopback port nothing listens on (refused at once), and the cache is the
test's own folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netutil import free_ports

from grpo.model.gguf.header import ModelUnavailable
from grpo.model.hub import cached_model, check_hub_model

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
REPO_ID = "someone/tiny-llama"
# The bound a start must fail within: the probe's 3 s and a worker's imports on a busy two-core
# machine; the hub client's retries alone took ~25 s for the config and as long again for the tokenizer.
LAUNCHER_BOUND_S = 10
WORKER_BOUND_S = 30


@pytest.fixture
def no_hub(tmp_path, monkeypatch):
    """The environment of a machine whose hub does not answer: HF_ENDPOINT on a closed loopback port,
    offline mode off (the suite turns it on), an empty Hugging Face cache of the test's own."""
    (port,) = free_ports(1)   # free now: nothing listens, so a connect is refused at once
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(ROOT))
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", env["HF_ENDPOINT"])
    monkeypatch.setenv("HF_HOME", env["HF_HOME"])
    # huggingface_hub, once imported in this process, reads offline mode from its constant, which
    # the suite's HF_HUB_OFFLINE=1 set: off too, or the checks here would see offline mode
    if (hub := sys.modules.get("huggingface_hub.constants")) is not None:
        monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    return env


def put_in_cache(hf_home: Path, repo_id: str) -> None:
    """A model's config.json in the hub cache's layout (refs/main naming the snapshot), as a download leaves it."""
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps(
        {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}))


def one_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def assert_ways_out(line: str) -> None:
    for way in ("a local model folder", "a .gguf file", "HF_HUB_OFFLINE=1"):
        assert way in line, (way, line)


def test_launcher_fails_in_seconds_naming_the_ways_out(tmp_path, no_hub):
    work = tmp_path / "work"
    work.mkdir()
    t = time.monotonic()
    r = subprocess.run([PY, str(ROOT / "run_distributed.py"), "--device", "cpu", "--model", REPO_ID], cwd=work,
                       env=no_hub, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t
    line = one_line(r)
    assert line.startswith(f"run_distributed.py: error: --model {REPO_ID}: the hub ({no_hub['HF_ENDPOINT']}) "
                           f"cannot be reached"), line
    assert_ways_out(line)
    assert took < LAUNCHER_BOUND_S, took
    assert list(work.iterdir()) == []


def test_a_worker_started_alone_fails_in_seconds_too(tmp_path, no_hub):
    work = tmp_path / "work"
    work.mkdir()
    t = time.monotonic()
    r = subprocess.run([PY, str(ROOT / "training_worker.py"), "--device", "cpu", "--model", REPO_ID,
                        "--run-dir", str(work / "run")], cwd=work, env=no_hub, capture_output=True, text=True,
                       timeout=120)
    took = time.monotonic() - t
    line = one_line(r)
    assert line.startswith(f"training_worker.py: error: --model {REPO_ID}: the hub"), line
    assert_ways_out(line)
    assert took < WORKER_BOUND_S, took
    assert list(work.iterdir()) == []


def test_a_cached_model_loads_at_once_when_the_hub_does_not_answer(no_hub):
    """resolve_model turns offline mode on (for this process and those it starts), so transformers
    reads the cached config at once instead of retrying the hub for ~25 s first."""
    put_in_cache(Path(no_hub["HF_HOME"]), REPO_ID)
    code = ("import os, time\n"
            "from grpo.model.zoo import resolve_model\n"
            "from transformers import AutoConfig\n"
            f"path = resolve_model({REPO_ID!r})\n"
            "t = time.monotonic()\n"
            "cfg = AutoConfig.from_pretrained(path)\n"
            "print(path, cfg.num_hidden_layers, os.environ.get('HF_HUB_OFFLINE'), round(time.monotonic() - t, 1))\n")
    r = subprocess.run([PY, "-c", code], cwd=ROOT, env=no_hub, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    path, layers, offline, took = r.stdout.split()
    assert (path, layers, offline) == (REPO_ID, "2", "1"), r.stdout
    assert float(took) < 5, took
    assert "does not answer" in r.stderr and "loading the copy in the Hugging Face cache" in r.stderr, r.stderr


def test_check_hub_model_by_case(no_hub, monkeypatch):
    """Not cached: the one line (whether the hub did not answer or offline mode is on); cached: None
    with offline mode on, or a note that turns it on where the hub does not answer."""
    hf_home = Path(no_hub["HF_HOME"])
    with pytest.raises(ModelUnavailable, match="cannot be reached .* not in the Hugging Face cache"):
        check_hub_model(REPO_ID)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailable, match=r"offline mode \(HF_HUB_OFFLINE\) is set"):
        check_hub_model(REPO_ID)
    put_in_cache(hf_home, REPO_ID)
    assert cached_model(REPO_ID) and not cached_model("someone/else")
    assert check_hub_model(REPO_ID) is None
    monkeypatch.delenv("HF_HUB_OFFLINE")
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    note = check_hub_model(REPO_ID)
    assert note and note.startswith(f"--model {REPO_ID}: the hub") and os.environ["HF_HUB_OFFLINE"] == "1"
    assert hub.HF_HUB_OFFLINE is True   # already imported here: turned on in the module too
