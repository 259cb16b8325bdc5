"""Shared helpers of the bench/ scripts: device and version info, timing, the results file."""
from __future__ import annotations

import importlib.metadata
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/X.py` from anywhere: import grpo from the repo
    sys.path.insert(0, str(ROOT))

from grpo.stats import bf16_peak_tflops  # noqa: E402  (the repo root is on sys.path by now)

# Dense bf16 tensor-core peak of one H100 SXM / H200 (same chip), without sparsity: the learner's table.
PEAK_BF16_FLOPS = bf16_peak_tflops("NVIDIA H200") * 1e12


def read_run_file(run: Path, name: str) -> str:
    """A run directory's file as text, as written or gzipped to commit it (name + '.gz')."""
    import gzip

    plain, packed = run / name, run / (name + ".gz")
    return plain.read_text() if plain.is_file() else gzip.decompress(packed.read_bytes()).decode()


def versions(extra: tuple[str, ...] = ()) -> dict:
    out = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "deepspeed", *extra):
        # the installed metadata first (the same version string): importing vllm would start its
        # whole runtime; the module's own __version__ where it is named unlike its package (zmq: pyzmq)
        try:
            out[mod] = importlib.metadata.version(mod)
        except importlib.metadata.PackageNotFoundError:
            try:
                out[mod] = __import__(mod).__version__
            except Exception as exc:  # noqa: BLE001 - a missing package is reported, not fatal
                out[mod] = f"unavailable ({type(exc).__name__})"
    return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or "cpu"


def pick(device: str) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("bench: error: --device cuda but CUDA is not available; use --device cpu", file=sys.stderr)
        raise SystemExit(2)
    return torch.device(device if device != "cuda" else "cuda:0")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Wall time of a block, synchronised with the device on both ends; peak memory too."""

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        sync(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.s = time.perf_counter() - self.t0
        self.peak_gib = (torch.cuda.max_memory_allocated(self.device) / 2**30
                         if self.device.type == "cuda" else float("nan"))


def capture(fn, generator=None):
    """fn captured as a graph after two eager warm-up calls (on CPU: fn itself)."""
    if not torch.cuda.is_available():
        return fn
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    if generator is not None and hasattr(g, "register_generator_state"):
        g.register_generator_state(generator)
    with torch.cuda.graph(g):
        fn()
    return g.replay


def per_call_ms(fn, n: int, device) -> float:
    for _ in range(3):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / n
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) * 1e3 / n


def commit() -> str | None:
    """The tree's commit, as every run file records it (grpo.obs.rundir.code_commit)."""
    from grpo.obs.rundir import code_commit

    return code_commit()


def write_result(name: str, device: torch.device, payload: dict, label: str | None = None,
                 extra_versions: tuple[str, ...] = (), results_dir: Path | None = None) -> Path:
    """bench/results/<name>_<device>.json with the device, versions, command line (as run, and as
    `command` from the repo root), the script that made it and the commit; `payload` may give its own.
    `label` names the device instead of asking CUDA (a parent of GPU processes should not hold a
    CUDA context of its own), e.g. "2x NVIDIA H200". `results_dir`: another folder than
    bench/results (a GPU machine's $OUT, whose tree is a copy)."""
    dev = label or device_name(device)
    slug = dev.replace(" ", "_").replace("/", "_") if device.type == "cuda" else "cpu"
    path = (results_dir or ROOT / "bench" / "results") / f"{name}_{slug}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    script = Path(sys.argv[0]).resolve()
    made_by = script.relative_to(ROOT).as_posix() if script.is_relative_to(ROOT) else script.name
    out = {"device": dev, "versions": versions(extra_versions),
           "command_line": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
           "command": shlex.join(["python3", made_by, *sys.argv[1:]]),   # to run again from the repo root
           "made_by": made_by, "commit": commit(), **payload}
    path.write_text(json.dumps(out, indent=2) + "\n")
    return path


def table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        return "-" if v is None else str(v)

    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(x.rjust(w) for x, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
