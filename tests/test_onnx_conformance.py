"""ONNX conformance: the onnx package's backend test suite through npu.InferenceSession.

Runs tests/conformance/onnx_suite.py in the session guest over the node,
simple, pytorch-converted, pytorch-operator and light cases of onnx's own
backend test data (the version the guest's onnx has; scripts/onnx_suite_data.py
puts it where the guest reads it), and compares each case's verdict (pass,
wrong, error, unsupported) with the committed expectation list
tests/conformance/expected.json:

- a case expected to pass that does not is a regression;
- a wrong result is never expected: a case that turns wrong fails;
- a case that passes but was not expected to is reported on stderr (update
  the list with ``scripts/onnx_conformance.py --update``), not failed.

The results go to build/onnx-conformance.json; docs/onnx-conformance.md
explains the verdicts and lists what does not pass and why.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from onnx_conformance import summary  # noqa: E402
from onnx_suite_data import GUEST_DATA, ensure_data  # noqa: E402

EXPECTED = ROOT / "tests" / "conformance" / "expected.json"
RESULTS = ROOT / "build" / "onnx-conformance.json"
RESULTS_GUEST = "/mnt/npu/build/onnx-conformance.json"
TIMEOUT_S = 1200

pytestmark = pytest.mark.guest


@pytest.fixture(scope="module")
def results(guest_holder: Any) -> dict[str, Any]:
    _, version = ensure_data()
    g = guest_holder.get()
    RESULTS.unlink(missing_ok=True)
    rc, out = g.run(
        f"python3 tests/conformance/onnx_suite.py {GUEST_DATA} --out {RESULTS_GUEST}",
        timeout=TIMEOUT_S,
    )
    assert rc == 0 and RESULTS.is_file(), f"the suite runner exited {rc}:\n{out[-3000:]}"
    data: dict[str, Any] = json.loads(RESULTS.read_text())
    assert data["meta"]["onnx"] == version, (
        f"the guest has onnx {data['meta']['onnx']}, the test data is onnx {version}'s"
    )
    exp = _expected()
    better = sorted(
        n for n, r in data["cases"].items() if r["verdict"] == "pass" and exp.get(n) != "pass"
    )
    sys.stderr.write(f"\n[onnx] {summary(data)}\n")
    if better:
        sys.stderr.write(
            f"[onnx] {len(better)} cases pass beyond the list (update it with "
            f"scripts/onnx_conformance.py --update): {better[:10]}\n"
        )
    return data


def _expected() -> dict[str, str]:
    return dict(json.loads(EXPECTED.read_text())["cases"])


def test_every_expected_case_ran(results: dict[str, Any]) -> None:
    missing = sorted(set(_expected()) - set(results["cases"]))
    assert not missing, f"{len(missing)} cases of the list did not run: {missing[:20]}"


def test_no_case_that_passed_regresses(results: dict[str, Any]) -> None:
    got = results["cases"]
    bad = {
        name: f"{got[name]['verdict']}: {got[name].get('why', '')}"
        for name, verdict in _expected().items()
        if verdict == "pass" and name in got and got[name]["verdict"] != "pass"
    }
    assert not bad, f"{len(bad)} regressions:\n" + "\n".join(f"{k}: {v}" for k, v in bad.items())


def test_no_case_gives_a_new_wrong_result(results: dict[str, Any]) -> None:
    exp = _expected()
    bad = {
        name: r.get("why", "")
        for name, r in results["cases"].items()
        if r["verdict"] == "wrong" and exp.get(name) != "wrong"
    }
    assert not bad, f"{len(bad)} new wrong results:\n" + "\n".join(
        f"{k}: {v}" for k, v in bad.items()
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
