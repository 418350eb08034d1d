#!/usr/bin/env python3
"""CI's figures from the files the runs left in build/, as JSON.

    scripts/ci_times.py [--out build/ci-times.json]

Keys (null when the run that makes a figure has not happened here):

- ``ci_fresh_demo_s``: ``make demo`` in a new Debian root with an empty
  cache (``make fresh-check``: build/fresh-check-<release>.json), per
  release under ``ci_fresh_demo_s_<release>``, the slowest as the key;
- ``ci_fresh_test_s``: ``make test`` on a new machine, after its
  ``make demo``, when ``make fresh-check FRESH_ARGS=--test`` measured it
  (build/fresh-check-<release>-test.json), the slowest release;
- ``ci_cached_test_s``: ``make test``'s pytest wall time with every build
  cached (build/test-times.json, written under make test);
- ``debug_pass_s``: the debug-kernel pass, boot to the fuzzer's end
  (build/debug-pass.json);
- ``npu_ko_line_coverage_debug_pass`` and
  ``npu_ko_line_coverage_full_suite``: npu.ko's line coverage (percent) of
  the debug pass and of every guest file on the debug kernel (make
  coverage-debug-full: build/debug-pass-full.json).

scripts/bench.py merges these into build/bench.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
RELEASES = ("bookworm", "trixie")


def _load(name: str) -> dict[str, Any] | None:
    path = BUILD / name
    if not path.is_file():
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _coverage(doc: dict[str, Any] | None) -> float | None:
    cov = (doc or {}).get("npu_ko_line_coverage") or {}
    pct = cov.get("percent")
    return float(pct) if pct is not None else None


def ci_times() -> dict[str, Any]:
    """The figures, from what build/ holds now."""
    out: dict[str, Any] = {}
    fresh: dict[str, float] = {}
    fresh_test: dict[str, float] = {}
    for rel in RELEASES:
        for target, into in (("demo", fresh), ("test", fresh_test)):
            name = f"fresh-check-{rel}.json" if target == "demo" else f"fresh-check-{rel}-test.json"
            doc = _load(name)
            if doc and doc.get("ok"):
                into[rel] = float(doc["seconds"])
    for rel in RELEASES:
        out[f"ci_fresh_demo_s_{rel}"] = fresh.get(rel)
    out["ci_fresh_demo_s"] = max(fresh.values()) if fresh else None
    out["ci_fresh_test_s"] = max(fresh_test.values()) if fresh_test else None
    times = _load("test-times.json")
    out["ci_cached_test_s"] = times["seconds"] if times and times["exitstatus"] == 0 else None
    debug = _load("debug-pass.json")
    if debug:
        parts = ("boot_s", "suite_s", "faults_s", "fuzz_s")
        out["debug_pass_s"] = round(sum(float(debug.get(k) or 0) for k in parts), 1)
    else:
        out["debug_pass_s"] = None
    out["npu_ko_line_coverage_debug_pass"] = _coverage(debug)
    out["npu_ko_line_coverage_full_suite"] = _coverage(_load("debug-pass-full.json"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=BUILD / "ci-times.json")
    args = ap.parse_args(argv)
    doc = ci_times()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
