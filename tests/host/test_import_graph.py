"""The runtime's layers import one way.

The graph has one edge per import of one ``npu`` module by another, wherever
it is written: at the top, inside a function, or under ``TYPE_CHECKING``.
``npu.hal`` sits at the bottom (it may import only itself and ``npu._abi``);
the rest of the package still has the cycles of the v1 layout, listed here
so that none can grow while they are taken apart (issue 15).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "runtime_py"

# Modules in an import cycle today; the set may only shrink.
KNOWN_CYCLIC = frozenset(
    {
        "npu.allocator",
        "npu.core.buffer",
        "npu.core.device",
        "npu.tensors.elementwise",
        "npu.core.event",
        "npu.graph",
        "npu.tensors.nn",
        "npu.tensors.reduce",
        "npu.core.stream",
        "npu.tensors.tensor",
        "npu.core.userqueue",
    }
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports (``from . import x`` names module x if it is one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


def test_the_graph_sees_imports_inside_functions() -> None:
    graph = import_graph()
    # device.create_queue imports npu.userqueue inside the method.
    assert "npu.core.userqueue" in graph["npu.core.device"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cyclic_modules({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {"a", "b", "c"}


def test_the_hal_imports_only_itself_and_the_abi() -> None:
    graph = import_graph()
    hal = {m for m in graph if m == "npu.hal" or m.startswith("npu.hal.")}
    assert hal >= {"npu.hal", "npu.hal.backend", "npu.hal.cpu", "npu.hal.driver"}
    for module in hal:
        outside = {m for m in graph[module] if m not in hal and m != "npu._abi"}
        assert not outside, f"{module} imports {sorted(outside)}"


def test_the_op_builders_and_their_validator_are_off_every_cycle() -> None:
    cyclic = cyclic_modules(import_graph())
    assert not cyclic & {
        "npu.kernels.ops",
        "npu.kernels.validate",
        "npu.kernels.descriptors",
        "npu._abi",
    }


def test_no_module_outside_the_known_v1_cycles_is_on_a_cycle() -> None:
    cyclic = cyclic_modules(import_graph())
    assert cyclic <= KNOWN_CYCLIC, f"new import cycles through {sorted(cyclic - KNOWN_CYCLIC)}"
    assert not any(m.startswith("npu.hal") for m in cyclic)
