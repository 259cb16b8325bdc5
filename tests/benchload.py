"""Load a bench/ script as a module, for tests of its pure functions and settings."""
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str):
    """bench/<name>.py as module bench_<name>. Bench scripts put bench/ on sys.path; the
    suite's path is restored afterwards."""
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved
    return mod
