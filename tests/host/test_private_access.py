"""No module of the runtime reads another module's private attributes.

A private attribute (``_name``) belongs to the module that defines or
assigns it (``self._name = ...``, a ``_name`` function, method, class or
slot). Reading it through any other object, in another module, is
reaching into that module's state, and so is importing a ``_name``
from it; a layer offers what the layer above
needs as public API (a property, a method, a protocol) instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "runtime_py"


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


def private_imports(source: str) -> set[str]:
    """``_name``s imported from another module of the package (a private module, such
    as ``npu._abi``, may be imported: it is the package's own base)."""
    found = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("npu")):
            for alias in n.names:
                name = alias.name
                if name.startswith("_") and not name.startswith("__") and name not in MODULES:
                    found.add(name)
    return found


MODULES = frozenset(p.stem for p in ROOT.joinpath("npu").rglob("*.py"))


def all_pairs() -> set[tuple[str, str]]:
    pairs = set()
    for path in sorted(ROOT.joinpath("npu").rglob("*.py")):
        source = path.read_text()
        for attr in foreign_private_reads(source) | private_imports(source):
            pairs.add((module_name(path), attr))
    return pairs


def test_the_scan_finds_a_foreign_private_read() -> None:
    assert foreign_private_reads("def f(d):\n    return d._secret\n") == {"_secret"}


def test_the_scan_ignores_a_modules_own_private_names() -> None:
    source = (
        "class A:\n    def __init__(self):\n        self._x = 1\n\ndef f(a):\n    return a._x\n"
    )
    assert foreign_private_reads(source) == set()


def test_the_scan_finds_a_private_name_imported_from_a_sibling() -> None:
    assert private_imports("from .tensor import _launch, Tensor\nfrom . import _abi\n") == {
        "_launch"
    }


def test_no_module_reads_another_modules_private_attributes() -> None:
    found = sorted(all_pairs())
    assert not found, f"private reads (module, attribute): {found}"
