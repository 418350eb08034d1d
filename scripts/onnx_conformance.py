#!/usr/bin/env python3
"""Summarise the ONNX conformance runs; judge them; update the committed list.

Usage::

    scripts/onnx_conformance.py [--update [--partial]] [--guest GUEST.json] [--host HOST.json]

The suite runs in two parts (docs/onnx-conformance.md): the guest part
(tests/test_onnx_conformance.py: the cases the list places on the NPU, in
the guest; build/onnx-conformance-guest.json) and the host part
(tests/host/test_onnx_conformance_host.py: the cases with no NPU node, on
the host with the runtime's CPU backend; build/onnx-conformance-host.json).
Each test, when done, merges the parts there are into
build/onnx-conformance.json (scripts/bench.py reads its summary).

Prints the summary of the two parts merged: the bench keys
``onnx_node_suite_pass`` and ``onnx_node_suite_npu_share``, where the
passing cases ran, and the verdict counts per suite kind. ``--update``
rewrites tests/conformance/expected.json from them: every case's verdict
and placement. It refuses when a case of the list has no result in the
parts (a part is missing or was cut short), unless ``--partial``, which
updates the cases the parts have and keeps the others.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "conformance"))

from onnx_suite import EXPECTED, load_expected, runs_on_host  # noqa: E402

__all__ = [
    "EXPECTED",
    "PARTS",
    "RESULTS",
    "Judgement",
    "entry_of",
    "failures",
    "format_expected",
    "judge",
    "load_expected",
    "merge",
    "place",
    "remerge",
    "report",
    "runs_on_host",
    "summary",
    "write_part",
]

BUILD = ROOT / "build"
RESULTS = BUILD / "onnx-conformance.json"
#: The two parts' results, by part.
PARTS = {
    "guest": BUILD / "onnx-conformance-guest.json",
    "host": BUILD / "onnx-conformance-host.json",
}
_LOCK = BUILD / ".onnx-conformance.lock"

#: Where a passing case ran, as summary() counts it.
PLACES = ("npu", "mixed", "numpy", "reference")
#: Verdicts of a case that ran to its end (its placement is meaningful).
RAN = frozenset({"pass", "wrong", "nondeterministic"})

ABOUT = (
    "Per case of tests/conformance/onnx_suite.py (engine npu): its verdict and how many "
    "of its nodes ran on the NPU, on the CPU provider's numpy kernels and on its "
    "onnx.reference fallback. Cases with no NPU node run on the host "
    "(tests/host/test_onnx_conformance_host.py), the others in the guest "
    "(tests/test_onnx_conformance.py); a pass that regresses, a new wrong result, a node "
    "moved off the NPU or onto onnx.reference fail. docs/onnx-conformance.md; "
    "update with scripts/onnx_conformance.py --update."
)


def entry_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """A run's result of one case as the list records it (a refused model: no nodes)."""
    return {
        "verdict": result["verdict"],
        "npu": int(result.get("npu_nodes", 0)),
        "numpy": int(result.get("numpy_nodes", 0)),
        "reference": int(result.get("reference_nodes", 0)),
    }


def place(entry: Mapping[str, Any]) -> str:
    """Where a case ran: ``reference`` (any node on onnx.reference), ``npu`` (every
    node on the NPU), ``mixed`` (NPU and numpy) or ``numpy`` (numpy only, or no
    node left after the rewrites)."""
    if entry.get("reference", 0):
        return "reference"
    if entry.get("npu", 0):
        return "mixed" if entry.get("numpy", 0) else "npu"
    return "numpy"


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """Bench keys and counts of one run (tests/conformance/onnx_suite.py's JSON, or merged).

    ``onnx_node_suite_npu_share``: of the node cases that pass, the share
    whose nodes all ran on the NPU. ``onnx_node_suite_pass_on``: the node
    cases that pass, by :func:`place`; ``onnx_suite_pass_on``: the same per
    suite kind.
    """
    node = {k: v for k, v in data["cases"].items() if k.startswith("node/")}
    passed = [v for v in node.values() if v["verdict"] == "pass"]
    kinds: dict[str, dict[str, int]] = {}
    pass_on: dict[str, dict[str, int]] = {}
    for name, r in sorted(data["cases"].items()):
        kind = name.split("/")[0]
        per = kinds.setdefault(kind, {})
        per[r["verdict"]] = per.get(r["verdict"], 0) + 1
        if r["verdict"] == "pass":
            on = pass_on.setdefault(kind, dict.fromkeys(PLACES, 0))
            on[place(entry_of(r))] += 1
    node_on = pass_on.get("node", dict.fromkeys(PLACES, 0))
    return {
        "onnx_node_suite_pass": len(passed),
        "onnx_node_suite_cases": len(node),
        "onnx_node_suite_npu_share": round(node_on["npu"] / len(passed), 3) if passed else 0.0,
        "onnx_node_suite_pass_on": node_on,
        "onnx_suite_pass_on": pass_on,
        "onnx_suite_counts": kinds,
    }


def _nodes(e: Mapping[str, Any]) -> str:
    return f"npu {e['npu']}, numpy {e['numpy']}, reference {e['reference']}"


@dataclass
class Judgement:
    """A run against the list: what fails (the first five) and what to report."""

    #: Cases of the list (of the part judged) the run does not have.
    missing: list[str] = field(default_factory=list)
    #: Listed as passing, now not: case -> the verdict and why.
    regressed: dict[str, str] = field(default_factory=dict)
    #: Wrong results the list does not have: case -> why.
    new_wrong: dict[str, str] = field(default_factory=dict)
    #: Fewer nodes on the NPU, or more on onnx.reference, than listed: case -> how.
    moved_off: dict[str, str] = field(default_factory=dict)
    #: Host cases that now get NPU nodes on the host's planner: case -> how many.
    to_guest: dict[str, str] = field(default_factory=dict)
    #: Passing beyond the list.
    better: list[str] = field(default_factory=list)
    #: More nodes on the NPU or fewer on onnx.reference, nothing worse: case -> how.
    improved: dict[str, str] = field(default_factory=dict)
    #: Other placement differences (e.g. a rewrite changed the node count): case -> how.
    changed: dict[str, str] = field(default_factory=dict)


def judge(
    expected: Mapping[str, Mapping[str, Any]], cases: Mapping[str, Mapping[str, Any]], part: str
) -> Judgement:
    """Compare a run's ``cases`` with the list; ``part`` is the run's: ``guest``,
    ``host`` or ``all`` (which cases it must have; a host case must not get NPU nodes)."""
    j = Judgement()
    for name, listed_entry in sorted(expected.items()):
        if part != "all" and runs_on_host(name, listed_entry) != (part == "host"):
            continue
        if name not in cases:
            j.missing.append(name)
    for name, r in sorted(cases.items()):
        exp = expected.get(name)
        got = entry_of(r)
        verdict = got["verdict"]
        listed = exp["verdict"] if exp else None
        if listed == "pass" and verdict != "pass":
            j.regressed[name] = f"{verdict}: {r.get('why', '')}"
        if verdict == "wrong" and listed != "wrong":
            j.new_wrong[name] = str(r.get("why", ""))
        if verdict == "pass" and listed != "pass":
            j.better.append(name)
        if part == "host" and runs_on_host(name, exp) and got["npu"]:
            j.to_guest[name] = f"{got['npu']} NPU nodes ({_nodes(got)})"
        if exp is None or "npu" not in exp or listed not in RAN or verdict not in RAN:
            continue
        if (got["npu"], got["numpy"], got["reference"]) == (
            exp["npu"],
            exp["numpy"],
            exp["reference"],
        ):
            continue
        how = f"{_nodes(got)}; listed {_nodes(exp)}"
        if got["npu"] < exp["npu"] or got["reference"] > exp["reference"]:
            j.moved_off[name] = how
        elif got["npu"] > exp["npu"] or got["reference"] < exp["reference"]:
            j.improved[name] = how
        else:
            j.changed[name] = how
    return j


def report(j: Judgement) -> str:
    """The lines a test writes to stderr: what goes beyond the list (not failures)."""
    out = []
    hint = "update the list with scripts/onnx_conformance.py --update"
    if j.better:
        out.append(f"[onnx] {len(j.better)} cases pass beyond the list ({hint}): {j.better[:10]}")
    if j.improved:
        some = dict(list(j.improved.items())[:10])
        out.append(f"[onnx] {len(j.improved)} cases' placement improved ({hint}): {some}")
    if j.changed:
        some = dict(list(j.changed.items())[:10])
        out.append(
            f"[onnx] {len(j.changed)} cases' placement differs from the list ({hint}): {some}"
        )
    return "".join(line + "\n" for line in out)


def failures(text: str, found: Mapping[str, str]) -> str:
    """An assertion message: a count, then one line per case."""
    return f"{len(found)} {text}:\n" + "\n".join(f"{k}: {v}" for k, v in found.items())


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """The parts and the merged file, for one process at a time (xdist workers)."""
    BUILD.mkdir(exist_ok=True)
    with _LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def merge(parts: Mapping[str, Path]) -> dict[str, Any]:
    """One run of the parts that exist: their cases (the guest's where both have
    one) and each part's meta, with the time its file was written."""
    cases: dict[str, Any] = {}
    metas: dict[str, Any] = {}
    for label in sorted(parts, key=lambda p: p == "guest"):  # the guest's last: it wins
        path = parts[label]
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC)
        metas[label] = {**data["meta"], "written": stamp.strftime("%Y-%m-%dT%H:%M:%SZ")}
        cases.update(data["cases"])
    counts: dict[str, int] = {}
    for r in cases.values():
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    versions = sorted({m["onnx"] for m in metas.values()})
    meta = {"onnx": versions[0] if len(versions) == 1 else versions, "counts": counts}
    return {"meta": {**meta, "parts": metas}, "cases": dict(sorted(cases.items()))}


def write_part(part: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """Store one part's run (a copy of ``data``) and remerge build/onnx-conformance.json."""
    with _locked():
        tmp = PARTS[part].with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, PARTS[part])
        return _write_merged()


def remerge() -> dict[str, Any]:
    """Merge the parts written (the guest test writes its own through the guest's mount)."""
    with _locked():
        return _write_merged()


def _write_merged() -> dict[str, Any]:
    merged = merge(PARTS)
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(merged, indent=1, sort_keys=True))
    os.replace(tmp, RESULTS)
    return merged


def format_expected(onnx_version: str, cases: Mapping[str, Mapping[str, Any]]) -> str:
    """The list's text: one case a line, sorted, in a fixed key order (diffs stay small)."""
    lines = [
        "{",
        f' "about": {json.dumps(ABOUT)},',
        f' "onnx": {json.dumps(onnx_version)},',
        ' "cases": {',
    ]
    rows = []
    for name, e in sorted(cases.items()):
        entry = {k: e[k] for k in ("verdict", "npu", "numpy", "reference")}
        rows.append(f"  {json.dumps(name)}: {json.dumps(entry)}")
    lines.append(",\n".join(rows))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def update(parts: Mapping[str, Path], partial: bool) -> int:
    """Rewrite the list from the parts' runs; 1 when it refuses."""
    data = merge(parts)
    version = data["meta"]["onnx"]
    if not isinstance(version, str):
        print(f"the parts are of different onnx versions: {version}", file=sys.stderr)
        return 1
    old = load_expected() if EXPECTED.is_file() else {}
    missing = sorted(set(old) - set(data["cases"]))
    if missing and not partial:
        print(
            f"{len(missing)} cases of the list have no result (run both parts, or --partial): "
            f"{missing[:10]}",
            file=sys.stderr,
        )
        return 1
    unplaced = sorted(k for k in missing if "npu" not in old[k])
    if unplaced:
        print(f"{len(unplaced)} cases have no placement to keep: {unplaced[:10]}", file=sys.stderr)
        return 1
    cases = {k: old[k] for k in missing}
    cases.update({k: entry_of(r) for k, r in data["cases"].items()})
    host = parts.get("host")
    if host is not None and host.is_file():
        guest = parts.get("guest")
        in_guest = (
            set(json.loads(guest.read_text())["cases"]) if guest and guest.is_file() else set()
        )
        moved = sorted(
            k
            for k, r in json.loads(host.read_text())["cases"].items()
            if r.get("npu_nodes") and k not in in_guest
        )
        if moved:
            print(
                f"{len(moved)} cases move to the guest run, placed by the host's planner "
                f"(the next guest run checks that placement on the device): {moved[:10]}"
            )
    EXPECTED.write_text(format_expected(version, cases))
    on_host = sum(runs_on_host(k, e) for k, e in cases.items())
    print(f"wrote {EXPECTED} ({len(cases)} cases: {on_host} on the host, the others in the guest)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--guest", type=Path, default=PARTS["guest"], help="the guest part's results")
    ap.add_argument("--host", type=Path, default=PARTS["host"], help="the host part's results")
    ap.add_argument("--update", action="store_true", help="rewrite " + str(EXPECTED))
    ap.add_argument("--partial", action="store_true", help="keep cases the parts do not have")
    args = ap.parse_args()
    parts = {"guest": args.guest, "host": args.host}
    absent = [str(p) for p in parts.values() if not p.is_file()]
    if absent:
        print(f"no {' and no '.join(absent)}", file=sys.stderr)
        if len(absent) == len(parts):
            return 1
    print(json.dumps(summary(merge(parts)), indent=1))
    return update(parts, args.partial) if args.update else 0


if __name__ == "__main__":
    raise SystemExit(main())
