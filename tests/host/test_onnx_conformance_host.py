"""ONNX conformance, host part: the cases with no NPU node, on the runtime's CPU backend.

The committed list tests/conformance/expected.json records each case's
verdict and placement (nodes on the NPU, on the CPU provider's numpy
kernels, on its onnx.reference fallback). The cases it places wholly off
the NPU run here, not in the guest (tests/test_onnx_conformance.py runs
the others): tests/conformance/onnx_suite.py ``--where host --device cpu``
in the guest's own userspace on the host's CPU (a chroot of the guest
image's root tree, scripts/common.sh's guest_chroot: Debian 13's python3,
python3-onnx and numpy, as in the guest part), on the test data of the
list's onnx version (scripts/onnx_suite_data.py), judged as the guest part
is (scripts/onnx_conformance.py's judge: same tolerances, same failures).
So the host's own Python and packages (Debian 12's or 13's) decide nothing.

The session's planner runs against the CPU backend, which reports the
device's op capabilities (``npu.hal.CPU_CAPS``: the device's CAPS less
MSIX, MMU, LOCAL_MEM, PERF and TRACE, which no placement decision reads),
so it places nodes as it would in the guest. A host case that now gets NPU
nodes fails: it belongs in the guest part (``scripts/onnx_conformance.py
--update`` moves it). The results go to build/onnx-conformance-host.json,
merged with the guest part's into build/onnx-conformance.json.

The judge and the list's format are tested here too, on made-up runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from npu.hal import CPU_CAPS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import onnx_conformance as oc  # noqa: E402
from onnx_suite_data import CHROOT_DATA, ensure_data  # noqa: E402

RUNNER = "/src/tests/conformance/onnx_suite.py"  # the tree in the chroot
RUN_OUT = "build/onnx-conformance-host-run.json"
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    _, version = ensure_data()
    out = ROOT / RUN_OUT
    out.unlink(missing_ok=True)
    t0 = time.monotonic()
    script = (
        f'. "{ROOT}/scripts/common.sh" && guest_chroot env PYTHONPATH=/src/runtime_py '
        f"PYTHONDONTWRITEBYTECODE=1 python3 {RUNNER} {CHROOT_DATA} --out /src/{RUN_OUT} "
        "--where host --device cpu"
    )
    proc = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert proc.returncode == 0 and out.is_file(), (
        f"the suite runner exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    )
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["meta"]["onnx"] == version, (
        f"the guest root has onnx {data['meta']['onnx']}, the list is of onnx {version}"
    )
    oc.write_part("host", data)
    sys.stderr.write(
        f"\n[onnx] host part ({len(data['cases'])} cases, {time.monotonic() - t0:.1f} s): "
        f"{oc.summary(data)}\n"
    )
    return data


@pytest.fixture(scope="module")
def judged(results: dict[str, Any]) -> oc.Judgement:
    j = oc.judge(oc.load_expected(), results["cases"], "host")
    sys.stderr.write(oc.report(j))
    return j


def test_the_host_part_ran_on_the_cpu_backend(results: dict[str, Any]) -> None:
    # tests/test_onnx_conformance.py checks that the device's op capabilities are these.
    assert results["meta"]["device"] == "cpu"
    assert int(results["meta"]["caps"], 16) == CPU_CAPS


def test_every_host_case_ran(judged: oc.Judgement) -> None:
    assert not judged.missing, (
        f"{len(judged.missing)} host cases of the list did not run: {judged.missing[:20]}"
    )


def test_no_host_case_gets_npu_nodes(judged: oc.Judgement) -> None:
    assert not judged.to_guest, oc.failures(
        "host cases now place nodes on the NPU: they belong in the guest part "
        "(run both parts, then scripts/onnx_conformance.py --update moves them)",
        judged.to_guest,
    )


def test_no_case_that_passed_regresses(judged: oc.Judgement) -> None:
    assert not judged.regressed, oc.failures("regressions", judged.regressed)


def test_no_case_gives_a_new_wrong_result(judged: oc.Judgement) -> None:
    assert not judged.new_wrong, oc.failures("new wrong results", judged.new_wrong)


def test_no_node_moves_onto_onnx_reference(judged: oc.Judgement) -> None:
    assert not judged.moved_off, oc.failures(
        "cases with more nodes on onnx.reference than listed "
        "(update the list with scripts/onnx_conformance.py --update if that is intended)",
        judged.moved_off,
    )


# -- the judge, the summary and the list's format, on made-up runs ------------------


def _r(verdict: str, npu: int, numpy: int, ref: int, **extra: Any) -> dict[str, Any]:
    return {
        "verdict": verdict,
        "nodes": npu + numpy + ref,
        "npu_nodes": npu,
        "numpy_nodes": numpy,
        "reference_nodes": ref,
        **extra,
    }


LISTED = {
    "node/test_a": {"verdict": "pass", "npu": 2, "numpy": 1, "reference": 0},
    "node/test_b": {"verdict": "pass", "npu": 0, "numpy": 1, "reference": 0},
    "node/test_c": {"verdict": "pass", "npu": 0, "numpy": 0, "reference": 1},
    "node/test_d": {"verdict": "unsupported", "npu": 0, "numpy": 0, "reference": 0},
    "node/test_e": {"verdict": "pass", "npu": 3, "numpy": 0, "reference": 0},
}


def test_judge_fails_nodes_moved_off_the_npu_and_reports_improvements() -> None:
    run = {
        "node/test_a": _r("pass", 1, 2, 0),  # one node off the NPU
        "node/test_e": _r("pass", 3, 0, 0),
        "node/test_x": _r("pass", 1, 0, 0),  # not listed: a guest case
    }
    j = oc.judge(LISTED, run, "guest")
    assert list(j.moved_off) == ["node/test_a"]
    assert j.better == ["node/test_x"] and not j.regressed and not j.missing
    j = oc.judge(LISTED, {**run, "node/test_a": _r("pass", 3, 0, 0)}, "guest")
    assert not j.moved_off and list(j.improved) == ["node/test_a"]
    assert "placement improved" in oc.report(j)
    # Fewer NPU nodes fail even when the verdict holds; a failed case's
    # placement is not judged (its verdict is).
    j = oc.judge(LISTED, {**run, "node/test_e": _r("error", 0, 0, 0, why="boom")}, "guest")
    assert list(j.regressed) == ["node/test_e"] and "node/test_e" not in j.moved_off


def test_judge_fails_a_host_case_with_npu_nodes_or_more_reference() -> None:
    run = {
        "node/test_b": _r("pass", 1, 0, 0),  # the planner took it
        "node/test_c": _r("pass", 0, 0, 1),
        "node/test_d": _r("unsupported", 0, 0, 0),
    }
    j = oc.judge(LISTED, run, "host")
    assert list(j.to_guest) == ["node/test_b"] and not j.missing
    j = oc.judge(LISTED, {**run, "node/test_b": _r("pass", 0, 0, 1)}, "host")
    assert list(j.moved_off) == ["node/test_b"] and not j.to_guest
    j = oc.judge(LISTED, {"node/test_b": run["node/test_b"]}, "host")
    assert j.missing == ["node/test_c", "node/test_d"]
    j = oc.judge(LISTED, {**run, "node/test_c": _r("wrong", 0, 0, 1, why="x")}, "host")
    assert list(j.regressed) == ["node/test_c"] and list(j.new_wrong) == ["node/test_c"]


def test_the_host_split_follows_the_listed_placement() -> None:
    on_host = {k for k, e in LISTED.items() if oc.runs_on_host(k, e)}
    assert on_host == {"node/test_b", "node/test_c", "node/test_d"}
    assert not oc.runs_on_host("node/test_new", None)
    assert not oc.runs_on_host("node/test_old", {"verdict": "pass"})  # no placement
    regex = "node/test_regex_full_match_basic"
    assert not oc.runs_on_host(regex, {"verdict": "pass", "npu": 0, "numpy": 0, "reference": 1})


def test_summary_counts_passes_by_where_they_ran() -> None:
    run = {
        "cases": {
            "node/test_npu": _r("pass", 2, 0, 0),
            "node/test_mixed": _r("pass", 1, 1, 0),
            "node/test_numpy": _r("pass", 0, 2, 0),
            "node/test_folded": _r("pass", 0, 0, 0),
            "node/test_ref": _r("pass", 1, 1, 1),
            "node/test_wrong": _r("wrong", 1, 0, 0),
            "simple/test_s": _r("pass", 0, 0, 2),
        }
    }
    s = oc.summary(run)
    assert s["onnx_node_suite_pass"] == 5 and s["onnx_node_suite_cases"] == 6
    assert s["onnx_node_suite_pass_on"] == {"npu": 1, "mixed": 1, "numpy": 2, "reference": 1}
    assert s["onnx_suite_pass_on"]["simple"]["reference"] == 1
    assert s["onnx_node_suite_npu_share"] == 0.2


def test_the_list_has_one_case_a_line_and_reads_back(tmp_path: Path) -> None:
    text = oc.format_expected("1.17.0", LISTED)
    lines = text.splitlines()
    assert sum(1 for ln in lines if ln.startswith('  "node/')) == len(LISTED)
    path = tmp_path / "expected.json"
    path.write_text(text)
    assert oc.load_expected(path) == LISTED
    assert json.loads(text)["onnx"] == "1.17.0"


def test_the_committed_list_is_in_its_format() -> None:
    text = oc.EXPECTED.read_text()
    cases = oc.load_expected()
    assert text == oc.format_expected(json.loads(text)["onnx"], cases)
    assert all(set(e) == {"verdict", "npu", "numpy", "reference"} for e in cases.values())


def test_merge_prefers_the_guests_result(tmp_path: Path) -> None:
    meta = {"onnx": "1.17.0", "seconds": 1}
    guest, host = tmp_path / "g.json", tmp_path / "h.json"
    guest.write_text(json.dumps({"meta": meta, "cases": {"node/test_a": _r("pass", 2, 1, 0)}}))
    host.write_text(
        json.dumps(
            {
                "meta": meta,
                "cases": {"node/test_a": _r("error", 0, 3, 0), "node/test_b": _r("pass", 0, 1, 0)},
            }
        )
    )
    merged = oc.merge({"guest": guest, "host": host})
    assert merged["cases"]["node/test_a"]["verdict"] == "pass"
    assert set(merged["meta"]["parts"]) == {"guest", "host"}
    assert merged["meta"]["onnx"] == "1.17.0" and merged["meta"]["counts"] == {"pass": 2}
