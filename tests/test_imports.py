"""The package's import graph has no cycles (imports inside functions count too), and the layout
of ../shared/DESIGN.md holds: one folder per role, wire without torch."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "grpo"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def import_graph() -> dict[str, set[str]]:
    """grpo module -> the grpo modules it imports, anywhere in its source."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        me = module_name(path)
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("grpo")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] == "grpo":
                for a in node.names:   # `from grpo.x import y`: the module grpo.x.y if there is one
                    sub = f"{node.module}.{a.name}"
                    deps.add(sub if is_module(sub) else node.module)
        graph[me] = {d for d in deps if d != me}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search, colours)."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_find_cycle_finds_one_by_hand():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"b2"}, "b2": {"b"}}) == ["b", "b2", "b"]


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 40 and "grpo.weights.slots" in graph["grpo.weights"]   # the walk sees lazy imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_layout_has_one_folder_per_role():
    for folder in ("wire", "weights", "sync", "generate", "sampler", "learner", "data", "obs", "launch"):
        assert (PKG / folder / "__init__.py").is_file(), folder
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert top == ["__init__.py", "config.py", "evaluate.py", "flags.py", "loss.py", "model.py", "stats.py",
                   "workers.py"], top


def test_wire_needs_no_torch():
    """Any process can speak the protocol: the wire package imports neither torch nor our other packages."""
    for path in (PKG / "wire").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] != "torch", (path.name, name)
                assert not name.startswith("grpo.") or name.startswith(("grpo.wire", "grpo.config")), (path.name, name)


def test_generate_sits_below_the_roles():
    """grpo.generate is the layer every role uses: it imports none of them (nor evaluation)."""
    above = ("grpo.sampler", "grpo.learner", "grpo.launch", "grpo.evaluate", "grpo.workers")
    graph = import_graph()
    mods = [m for m in graph if m == "grpo.generate" or m.startswith("grpo.generate.")]
    assert len(mods) >= 6, mods
    for m in mods:
        bad = sorted(d for d in graph[m] if d.startswith(above))
        assert not bad, (m, bad)
