"""No module of the runtime reads another module's private attributes.

A private attribute (``_name``) belongs to the module that defines or
assigns it (``self._name = ...``, a ``_name`` function, method, class or
slot). Reading it through any other object, in another module, is
reaching into that module's state. The v1 layout does this in the pairs
listed here (mostly the op modules reading ``Tensor`` internals, and
streams driving user queues); the list may only shrink as the layers of
issue 15 land, and no new pair may appear.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "runtime_py"

KNOWN = frozenset(
    {
        ("npu.allocator", "_handle"),
        ("npu.tensors.elementwise", "_device"),
        ("npu.tensors.elementwise", "_dtype"),
        ("npu.tensors.elementwise", "_ref"),
        ("npu.tensors.elementwise", "_shape"),
        ("npu.graph", "_deps"),
        ("npu.graph", "_readers"),
        ("npu.graph", "_since"),
        ("npu.tensors.nn", "_buffer"),
        ("npu.tensors.nn", "_device"),
        ("npu.tensors.nn", "_dtype"),
        ("npu.tensors.nn", "_offset"),
        ("npu.tensors.nn", "_ref"),
        ("npu.tensors.nn", "_shape"),
        ("npu.tensors.nn", "_strides"),
        ("npu.tensors.nn", "_view"),
        ("npu.tensors.nn", "_view_as"),
        ("npu.tensors.quant", "_device"),
        ("npu.tensors.quant", "_dtype"),
        ("npu.tensors.quant", "_ref"),
        ("npu.tensors.quant", "_shape"),
        ("npu.tensors.quant", "_strides"),
        ("npu.tensors.quant", "_view"),
        ("npu.tensors.quant", "_view_as"),
        ("npu.tensors.reduce", "_device"),
        ("npu.tensors.reduce", "_dtype"),
        ("npu.tensors.reduce", "_ref"),
        ("npu.tensors.reduce", "_shape"),
        ("npu.tensors.reduce", "_view_as"),
        ("npu.core.stream", "_checked"),
        ("npu.core.stream", "_claim"),
        ("npu.core.stream", "_commit"),
        ("npu.core.stream", "_context"),
        ("npu.core.stream", "_emit"),
        ("npu.core.stream", "_fence_view"),
        ("npu.core.stream", "_handle"),
        ("npu.core.stream", "_mmap"),
        ("npu.core.stream", "_put"),
        ("npu.core.stream", "_reserve"),
        ("npu.core.stream", "_ring_np"),
        ("npu.core.stream", "_tail"),
    }
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def own_names(tree: ast.Module) -> set[str]:
    """Private names a module defines: functions, classes, self-assignments, slots, class fields."""
    own: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
                own.add(n.attr)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            own.add(n.target.id)
        elif isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    own.add(t.id)
                    if t.id == "__slots__" and isinstance(n.value, ast.Tuple | ast.List):
                        own.update(e.value for e in n.value.elts if isinstance(e, ast.Constant))
    return own


def foreign_private_reads(source: str) -> set[str]:
    """``x._name`` reads (x not self/cls) of private names the module does not own."""
    tree = ast.parse(source)
    own = own_names(tree)
    found = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__"):
            if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
                continue
            if n.attr not in own:
                found.add(n.attr)
    return found


def all_pairs() -> set[tuple[str, str]]:
    pairs = set()
    for path in sorted(ROOT.joinpath("npu").rglob("*.py")):
        for attr in foreign_private_reads(path.read_text()):
            pairs.add((module_name(path), attr))
    return pairs


def test_the_scan_finds_a_foreign_private_read() -> None:
    assert foreign_private_reads("def f(d):\n    return d._secret\n") == {"_secret"}


def test_the_scan_ignores_a_modules_own_private_names() -> None:
    source = (
        "class A:\n    def __init__(self):\n        self._x = 1\n\ndef f(a):\n    return a._x\n"
    )
    assert foreign_private_reads(source) == set()


def test_no_new_module_reads_another_modules_private_attributes() -> None:
    new = all_pairs() - KNOWN
    by_module = collections.defaultdict(list)
    for module, attr in sorted(new):
        by_module[module].append(attr)
    assert not new, f"new private reads: {dict(by_module)}"


def test_the_list_of_known_private_reads_only_holds_live_ones() -> None:
    gone = KNOWN - all_pairs()
    assert not gone, f"remove from KNOWN (fixed): {sorted(gone)}"
