"""The folder layout is the architecture: every import inside vit_jax goes down the layers, and no module imports
itself back through others. Imports inside functions count too (they run just as well, only later).

To add a package or a command, give it a layer in LAYERS; docs/ARCHITECTURE.md draws the same table.
"""

import ast
import pathlib

import pytest

import vit_jax

PACKAGE = pathlib.Path(vit_jax.__file__).parent

# Bottom to top. An entry is a sub-package or a top-level module of vit_jax; a module may import its own entry and
# entries of lower layers. Entries of one layer are peers: they do not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("hardware", "runtime", "resources", "storage", "cli_args"),  # cli_args: --verbose sets the switch of errors.py
    ("__init__",),  # the package's own set-up (runtime) and __version__
    ("models", "parallel", "data"),
    ("checkpoints",),
    ("eval",),
    ("train",),
    ("sweep", "bench"),
    ("report",),
    ("commands", "main", "cli"),
]


def _entry(module: str) -> str:
    """vit_jax.train.trainer -> 'train'; vit_jax.main -> 'main'; vit_jax -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _rank(entry: str) -> int:
    for rank, layer in enumerate(LAYERS):
        if entry in layer:
            return rank
    raise AssertionError(f"vit_jax/{entry} has no layer in tests/test_import_layers.py: give it one")


def import_graph(package: pathlib.Path) -> dict[str, set[str]]:
    """module -> the modules of the package it imports (`from a.b import c` imports a.b.c if that is a module)."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    # C/C++ extension modules (built from vit_jax/**/_name.c[c]) import nothing of the package, but they are modules.
    extensions = {".".join(p.relative_to(package.parent).with_suffix("").parts)
                  for pattern in ("*.c", "*.cc") for p in package.rglob(pattern)}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                assert not node.level, f"{path}: relative import (the package uses absolute imports)"
                subs = {f"{node.module}.{a.name}" for a in node.names} & (modules.keys() | extensions)
                found.update(subs if subs else {node.module})
        graph[name] = (found & modules.keys()) - {name}
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in graph.items():
        for dst in targets:
            a, b = _entry(src), _entry(dst)
            if a != b and _rank(b) >= _rank(a):
                bad.append(f"{src} -> {dst} ({a}: layer {_rank(a)}, {b}: layer {_rank(b)})")
    return sorted(bad)


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_imports_only_go_down_the_layers():
    bad = upward_imports(import_graph(PACKAGE))
    assert not bad, "imports that do not go down the layers:\n" + "\n".join(bad)


def test_no_import_cycles():
    cycles = import_cycles(import_graph(PACKAGE))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checks_see_an_upward_import_and_a_cycle(tmp_path):
    files = {"__init__.py": "", "models/__init__.py": "from vit_jax.models import a\n", "train/__init__.py": "",
             "models/a.py": "from vit_jax.train import b\n",  # upward
             "train/b.py": "def f():\n    from vit_jax.models import a\n"}  # ... and back: a cycle
    for name, text in files.items():
        (tmp_path / "vit_jax" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "vit_jax" / name).write_text(text)
    graph = import_graph(tmp_path / "vit_jax")
    assert upward_imports(graph) == ["vit_jax.models.a -> vit_jax.train.b (models: layer 3, train: layer 6)"]
    assert import_cycles(graph) == ["vit_jax.models.a -> vit_jax.train.b -> vit_jax.models.a"]
    with pytest.raises(AssertionError, match="no layer"):
        upward_imports({"vit_jax.nowhere.x": {"vit_jax.models.a"}})
