"""ONNX conformance, guest part: the cases with NPU nodes, through npu.InferenceSession.

Runs tests/conformance/onnx_suite.py in the session guest over the cases of
onnx's own backend test data (node, simple, pytorch-converted,
pytorch-operator, light; the version the guest's onnx has:
scripts/onnx_suite_data.py puts it where the guest reads it) that the
committed list tests/conformance/expected.json places, wholly or in part,
on the NPU, with the cases the list does not have. The cases with no NPU
node run on the host, on the runtime's CPU backend
(tests/host/test_onnx_conformance_host.py); ``NPU_ONNX_SUITE=all`` runs
every case here instead (a full run in the guest, e.g. to place every case
on the device again before ``scripts/onnx_conformance.py --update``).

Each case's verdict (pass, wrong, error, unsupported, nondeterministic) and
placement (nodes on the NPU, on the numpy provider, on onnx.reference) are
compared with the list (scripts/onnx_conformance.py's judge):

- a case listed as passing that does not is a regression;
- a wrong result is never expected: a case that turns wrong fails;
- a case with fewer nodes on the NPU, or more on onnx.reference, than
  listed fails (a change that moved nodes to the CPU would keep every pass);
- a case that passes but was not listed to, or whose placement improved,
  is reported on stderr (update the list with
  ``scripts/onnx_conformance.py --update``), not failed.

The results go to build/onnx-conformance-guest.json, merged with the host
part's into build/onnx-conformance.json; docs/onnx-conformance.md explains
the verdicts, the split and lists what does not pass and why.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import onnx_conformance as oc  # noqa: E402
from onnx_suite_data import GUEST_DATA, ensure_data  # noqa: E402

from npu import _abi  # noqa: E402
from npu.hal import CPU_CAPS  # noqa: E402

PART = "all" if os.environ.get("NPU_ONNX_SUITE") == "all" else "guest"
RESULTS = oc.PARTS["guest"]
RESULTS_GUEST = f"/mnt/npu/{RESULTS.relative_to(ROOT)}"
TIMEOUT_S = 1500
#: The device's capability bits (qemu_device/npu.c's CAPS) that the CPU backend
#: does not report and no placement decision reads.
NOT_PLACEMENT = (
    _abi.NPU_INFO_CAP_MSIX
    | _abi.NPU_INFO_CAP_MMU
    | _abi.NPU_INFO_CAP_LOCAL_MEM
    | _abi.NPU_INFO_CAP_PERF
    | _abi.NPU_INFO_CAP_TRACE
)

pytestmark = pytest.mark.guest


@pytest.fixture(scope="module")
def results(guest_holder: Any) -> dict[str, Any]:
    _, version = ensure_data()
    g = guest_holder.get()
    RESULTS.unlink(missing_ok=True)
    rc, out = g.run(
        f"python3 tests/conformance/onnx_suite.py {GUEST_DATA} --out {RESULTS_GUEST} "
        f"--where {PART}",
        timeout=TIMEOUT_S,
    )
    assert rc == 0 and RESULTS.is_file(), f"the suite runner exited {rc}:\n{out[-3000:]}"
    data: dict[str, Any] = json.loads(RESULTS.read_text())
    oc.remerge()
    assert data["meta"]["onnx"] == version, (
        f"the guest has onnx {data['meta']['onnx']}, the test data is onnx {version}'s"
    )
    sys.stderr.write(
        f"\n[onnx] guest part ({len(data['cases'])} cases, {data['meta']['seconds']} s): "
        f"{oc.summary(data)}\n"
    )
    return data


@pytest.fixture(scope="module")
def judged(results: dict[str, Any]) -> oc.Judgement:
    j = oc.judge(oc.load_expected(), results["cases"], PART)
    sys.stderr.write(oc.report(j))
    return j


def test_the_host_part_plans_with_the_devices_capabilities(results: dict[str, Any]) -> None:
    # The host part's planner runs against the CPU backend: it must see the
    # op capabilities the device reports, or it would place nodes otherwise.
    caps = int(results["meta"]["caps"], 16)
    assert caps & ~NOT_PLACEMENT == CPU_CAPS, (
        f"the device reports caps {caps:#x}, the CPU backend {CPU_CAPS:#x}: the host part "
        "no longer places nodes as the guest would"
    )


def test_every_expected_case_ran(judged: oc.Judgement) -> None:
    assert not judged.missing, (
        f"{len(judged.missing)} cases of the list did not run: {judged.missing[:20]}"
    )


def test_no_case_that_passed_regresses(judged: oc.Judgement) -> None:
    assert not judged.regressed, oc.failures("regressions", judged.regressed)


def test_no_case_gives_a_new_wrong_result(judged: oc.Judgement) -> None:
    assert not judged.new_wrong, oc.failures("new wrong results", judged.new_wrong)


def test_no_node_moves_off_the_npu(judged: oc.Judgement) -> None:
    # Fewer NPU nodes or more onnx.reference nodes than listed. A rewrite
    # that fuses NPU nodes also lowers the count: update the list then.
    assert not judged.moved_off, oc.failures(
        "cases with fewer nodes on the NPU or more on onnx.reference than listed "
        "(update the list with scripts/onnx_conformance.py --update if that is intended)",
        judged.moved_off,
    )


# onnx's light models (issue 17's target: each CNN one NPU partition).
LIGHT_CNNS = (
    "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
    "shufflenet", "squeezenet", "vgg19", "zfnet512",
)  # fmt: skip


@pytest.mark.parametrize("model", LIGHT_CNNS)
def test_a_light_cnn_runs_as_one_npu_partition(results: dict[str, Any], model: str) -> None:
    # SqueezeNet's verdict is its documented "wrong" (docs/onnx-conformance.md);
    # the partitioning is what this test is about.
    r = results["cases"][f"light/light_{model}"]
    assert r["verdict"] in ("pass", "wrong"), r.get("why", "")
    assert r["npu_nodes"] == r["nodes"], f"{r['nodes'] - r['npu_nodes']} nodes ran on the CPU"
