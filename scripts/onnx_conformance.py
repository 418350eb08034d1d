#!/usr/bin/env python3
"""Summarise an ONNX conformance run; update the committed expectation list.

Usage::

    scripts/onnx_conformance.py [build/onnx-conformance.json] [--update]

Prints the summary (the bench keys ``onnx_node_suite_pass`` and
``onnx_node_suite_npu_share``, and the verdict counts per suite kind).
``--update`` rewrites tests/conformance/expected.json from the run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = ROOT / "tests" / "conformance" / "expected.json"
RESULTS = ROOT / "build" / "onnx-conformance.json"


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """Bench keys and counts of one run (tests/conformance/onnx_suite.py's JSON).

    ``onnx_node_suite_npu_share``: of the node cases that pass, the share
    whose nodes all ran on the NPU.
    """
    node = {k: v for k, v in data["cases"].items() if k.startswith("node/")}
    passed = [v for v in node.values() if v["verdict"] == "pass"]
    on_npu = [v for v in passed if v.get("nodes") and v.get("npu_nodes") == v.get("nodes")]
    kinds: dict[str, dict[str, int]] = {}
    for name, r in data["cases"].items():
        per = kinds.setdefault(name.split("/")[0], {})
        per[r["verdict"]] = per.get(r["verdict"], 0) + 1
    return {
        "onnx_node_suite_pass": len(passed),
        "onnx_node_suite_cases": len(node),
        "onnx_node_suite_npu_share": round(len(on_npu) / len(passed), 3) if passed else 0.0,
        "onnx_suite_counts": kinds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", type=Path, default=RESULTS)
    ap.add_argument("--update", action="store_true", help="rewrite " + str(EXPECTED))
    args = ap.parse_args()
    data = json.loads(args.results.read_text())
    print(json.dumps(summary(data), indent=1))
    if args.update:
        cases = {k: v["verdict"] for k, v in sorted(data["cases"].items())}
        doc = {
            "about": "Verdict per case of tests/conformance/onnx_suite.py (engine npu); "
            "tests/test_onnx_conformance.py fails when a pass regresses or a result turns wrong.",
            "onnx": data["meta"]["onnx"],
            "cases": cases,
        }
        EXPECTED.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {EXPECTED} ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
