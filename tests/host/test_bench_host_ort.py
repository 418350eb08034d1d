"""How scripts/bench_host_ort.py compares the NPU with onnxruntime on the host.

``<model>_b1_vs_host_ort`` is host onnxruntime's batch-1 milliseconds over the
NPU's (above 1 the NPU is faster), ResNet-50's NPU figure is
infer_resnet50.py's key, and the aggregates cover the models that have both
figures. No model is run here.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_host_ort


def figures(**ms: tuple[float | None, float | None]) -> dict[str, Any]:
    """Bench results with (NPU ms, host onnxruntime ms) per model."""
    res: dict[str, Any] = {}
    for model, (npu_ms, host_ms) in ms.items():
        res[bench_host_ort.npu_b1_key(model)] = npu_ms
        res[f"{model}_b1_ms_host_ort"] = host_ms
    return res


def test_the_ratio_is_host_milliseconds_over_npu_milliseconds() -> None:
    res = figures(vgg19=(400.0, 200.0))
    bench_host_ort.add_ratios(res, ("vgg19",))
    assert res["vgg19_b1_vs_host_ort"] == pytest.approx(0.5)


def test_resnet50_takes_its_npu_latency_from_infer_resnet50s_key() -> None:
    res = {"resnet50_b1_latency_ms_npu": 50.0, "resnet50_b1_ms_host_ort": 100.0}
    bench_host_ort.add_ratios(res, ("resnet50",))
    assert res["resnet50_b1_vs_host_ort"] == pytest.approx(2.0)


def test_geomean_and_min_cover_the_models_with_both_figures() -> None:
    res = figures(a=(10.0, 40.0), b=(10.0, 2.5), c=(None, 3.0))
    bench_host_ort.add_ratios(res, ("a", "b", "c"))
    assert res["c_b1_vs_host_ort"] is None
    assert res["models_b1_vs_host_ort_geomean"] == pytest.approx(math.sqrt(4.0 * 0.25))
    assert res["models_b1_vs_host_ort_min"] == pytest.approx(0.25)


def test_no_ratio_leaves_the_aggregates_null() -> None:
    res = figures(a=(None, None))
    bench_host_ort.add_ratios(res, ("a",))
    assert res["models_b1_vs_host_ort_geomean"] is None
    assert res["models_b1_vs_host_ort_min"] is None


def test_the_chart_is_a_png_of_the_ratios(tmp_path: Path) -> None:
    import matplotlib  # noqa: F401

    res = figures(a=(10.0, 40.0), b=(10.0, 2.5))
    bench_host_ort.add_ratios(res, ("a", "b"))
    path = tmp_path / "chart.png"
    assert bench_host_ort.write_chart(res, path, ("a", "b"))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_chart_without_any_ratio(tmp_path: Path) -> None:
    import matplotlib  # noqa: F401

    path = tmp_path / "chart.png"
    assert not bench_host_ort.write_chart({}, path, ("a",))
    assert not path.exists()
