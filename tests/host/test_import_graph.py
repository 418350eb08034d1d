"""The runtime's layers import one way.

The graph has one edge per import of one ``npu`` module by another, wherever
it is written: at the top, inside a function, or under ``TYPE_CHECKING``.
It has no cycle, and every edge goes down the layers (or stays in one):
the base modules, ``npu.coredump`` (the device coredump decoder, a tool on
the base) and ``npu.chips`` (the timing model's chip descriptions),
``npu.smi`` (the ``npu-smi`` tool: sysfs, fdinfo, debugfs and the coredump
decoder, never the device layers), ``npu.hal`` (the backends),
``npu.kernels`` (descriptors), ``npu.core`` (device, buffers, queues,
streams), ``npu.allocator``, ``npu.tensors``, ``npu.graph``, ``npu.api``,
``npu.inference`` and ``npu.dynamo`` (the two front ends), ``npu.profiler``
(on top of them all: it reads what they recorded into ``npu._spans``, a
base module), and the package itself. ``npu.hal`` may import only itself
and ``npu._abi``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "runtime_py"

# Bottom first: a module may import modules of its own layer or below.
LAYERS = (
    ("npu._abi", "npu._closing", "npu._spans", "npu.errors", "npu.dtypes"),
    ("npu.coredump", "npu.chips"),
    ("npu.smi",),
    ("npu.hal",),
    ("npu.kernels",),
    ("npu.core",),
    ("npu.allocator",),
    ("npu.tensors",),
    ("npu.graph",),
    ("npu.api",),
    ("npu.inference", "npu.dynamo"),
    ("npu.profiler",),
)


def layer_of(module: str) -> int:
    """The index in LAYERS of ``module`` (the package ``npu`` itself is on top)."""
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    assert module == "npu", f"{module} is in no layer: add it to LAYERS"
    return len(LAYERS)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str], source: str | None = None) -> set[str]:
    """The package modules ``path`` imports (``from . import x`` names module x if it is one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    # A parent package is always initialised before its modules: no edge.
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {m for m in found if m in modules and m != name and m not in ancestors}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.joinpath("npu").rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) for p in paths}


def cyclic_modules(graph: dict[str, set[str]]) -> set[str]:
    """Modules on a cycle: members of a strongly connected component of size > 1."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cyclic: set[str] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: set[str] = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cyclic.update(component)

    for v in graph:
        if v not in index:
            visit(v)
    return cyclic


def test_the_graph_sees_imports_inside_functions_and_under_type_checking() -> None:
    modules = set(import_graph())
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .stream import Stream\n"
        "def f():\n    from ..allocator import allocator\n"
    )
    found = imports_of(ROOT / "npu" / "core" / "device.py", modules, source)
    assert found == {"npu.core.stream", "npu.allocator"}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cyclic_modules({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {"a", "b", "c"}


def test_the_package_has_no_import_cycle() -> None:
    cyclic = cyclic_modules(import_graph())
    assert not cyclic, f"import cycles through {sorted(cyclic)}"


def test_every_import_goes_down_the_layers() -> None:
    upward = [
        f"{a} -> {b}"
        for a, targets in sorted(import_graph().items())
        for b in sorted(targets)
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, f"imports of a higher layer: {upward}"


def test_the_hal_imports_only_itself_and_the_abi() -> None:
    graph = import_graph()
    hal = {m for m in graph if m == "npu.hal" or m.startswith("npu.hal.")}
    assert hal >= {"npu.hal", "npu.hal.backend", "npu.hal.cpu", "npu.hal.driver"}
    for module in hal:
        outside = {m for m in graph[module] if m not in hal and m != "npu._abi"}
        assert not outside, f"{module} imports {sorted(outside)}"


def test_the_coredump_decoder_imports_only_the_abi() -> None:
    assert import_graph()["npu.coredump"] <= {"npu._abi"}


def test_npu_smi_imports_only_itself_the_coredump_decoder_and_the_abi() -> None:
    graph = import_graph()
    smi = {m for m in graph if m == "npu.smi" or m.startswith("npu.smi.")}
    assert "npu.smi.cli" in smi
    for module in smi:
        outside = {m for m in graph[module] if m not in smi}
        assert outside <= {"npu._abi", "npu.coredump"}, f"{module} imports {sorted(outside)}"
