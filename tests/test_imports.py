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
    assert len(graph) > 40 and "grpo.weights.slots" in graph["grpo.weights.registry"]   # the walk sees lazy imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_layout_has_one_folder_per_role():
    for folder in ("rules", "wire", "weights", "sync", "generate", "sampler", "learner", "data", "model", "obs", "launch"):
        assert (PKG / folder / "__init__.py").is_file(), folder
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert top == ["__init__.py", "evaluate.py", "flags.py", "loss.py", "stats.py", "workers.py"], top
    assert (PKG / "config" / "__init__.py").is_file()   # the typed config: one module per section


def test_wire_needs_no_torch():
    """Any process can speak the protocol: the wire package imports neither torch nor our other packages."""
    for path in (PKG / "wire").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] != "torch", (path.name, name)
                assert not name.startswith("grpo.") or name.startswith(("grpo.wire", "grpo.config")), (path.name, name)


# The package's layers, lowest first (../shared/DESIGN.md's layout, with flags, which reads the
# task names, above data, and wire below data and model, importing neither): a module may import
# its own layer's modules and lower layers' only. Sampler and learner are peers above the layers both use
# (neither imports the other); the launcher and the worker entry points sit on top.
LAYERS = [
    ["grpo", "grpo.config", "grpo.stats", "grpo.loss"],   # pure rules and typed configs
    ["grpo.rules"],                                      # the torch-free rules every layer uses (over config and stats)
    ["grpo.obs", "grpo.wire"],                           # logging/metrics; the protocol (no torch)
    ["grpo.data", "grpo.model"],                         # problems and rewards; GGUF files, loading a model, log-probs
    ["grpo.flags"],                                      # flags from the configs (and task names)
    ["grpo.weights", "grpo.generate", "grpo.sync"],      # moving weights; generating; the control channel
    ["grpo.evaluate"],                                   # held-out scoring, used by both roles
    ["grpo.sampler", "grpo.learner"],                    # the two roles (peers)
    ["grpo.launch", "grpo.workers"],                     # starting them
]
PEERS = [("grpo.sampler", "grpo.learner")]


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the package or top module it belongs to)."""
    parts = module.split(".")
    key = ".".join(parts[:2])
    for i, names in enumerate(LAYERS):
        if key in names:
            return i, key
    raise KeyError(f"{module}: not in LAYERS; add its package to tests/test_imports.py")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for each import of a higher layer's module, or of a peer role's."""
    bad = []
    for a, deps in graph.items():
        la, ka = layer_of(a)
        for b in sorted(deps):
            lb, kb = layer_of(b)
            if lb > la or (ka != kb and ((ka, kb) in PEERS or (kb, ka) in PEERS)):
                bad.append(f"{a} -> {b}")
    return sorted(bad)


def test_upward_imports_by_hand():
    assert upward_imports({"grpo.generate.engine": {"grpo.model", "grpo.config"}}) == []
    assert upward_imports({"grpo.weights.publisher": {"grpo.learner.lora"}}) == \
        ["grpo.weights.publisher -> grpo.learner.lora"]
    assert upward_imports({"grpo.sampler.loop": {"grpo.learner.loop"}}) == ["grpo.sampler.loop -> grpo.learner.loop"]
    assert upward_imports({"grpo.learner.loop": {"grpo.learner.intake", "grpo.evaluate"}}) == []


def test_no_module_imports_a_higher_layer():
    graph = import_graph()
    for m in graph:
        layer_of(m)   # every module is placed
    assert upward_imports(graph) == []

