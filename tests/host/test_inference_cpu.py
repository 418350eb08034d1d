"""The model runner's CPU provider (numpy kernels) against onnx.reference, op by op."""

from __future__ import annotations

import numpy as np
import pytest

import npu
from onnx_models import digits_cnn, op_cases, reference, resnet_like

CASES = op_cases()
# float32 kernels that sum many products (conv, matmul, pooling, reductions)
# differ from the reference by rounding only.
RTOL, ATOL = 1e-5, 1e-5


def expected(case: str, model: object, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The reference result; Softmax before opset 13 is computed by hand.

    onnx.reference 1.17 applies opset-11 Softmax along ``axis`` only, but the
    opset-11 spec coerces the input to 2-D (``[prod(:axis), prod(axis:)]``).
    """
    if case == "Softmax_opset11":
        x = feeds["x0"].reshape(3, -1).astype(np.float64)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return [(e / e.sum(axis=1, keepdims=True)).reshape(feeds["x0"].shape).astype(np.float32)]
    return reference(model, feeds)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", sorted(CASES))
def test_cpu_provider_matches_reference(case: str) -> None:
    model, feeds = CASES[case]
    want = expected(case, model, feeds)
    got = npu.InferenceSession(model, providers=("CPU",)).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_cpu_provider_runs_the_digits_cnn_like_the_reference() -> None:
    model = digits_cnn()
    x = np.random.default_rng(3).uniform(0, 1, (5, 1, 28, 28)).astype(np.float32)
    got = npu.InferenceSession(model, providers=("CPU",)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_cpu_provider_runs_the_resnet_like_the_reference() -> None:
    model = resnet_like()
    x = np.random.default_rng(3).uniform(0, 1, (2, 3, 32, 32)).astype(np.float32)
    got = npu.InferenceSession(model, providers=("CPU",)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_cpu_only_session_opens_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_device(device: object = None) -> npu.Device:
        raise AssertionError("the CPU provider must not open a device")

    monkeypatch.setattr("npu.inference.session.resolve_device", no_device)
    model, feeds = CASES["Relu"]
    sess = npu.InferenceSession(model, providers=("CPU",))
    assert [p.provider for p in sess.partitions] == ["CPU"]
    sess.run(None, feeds)


def test_run_returns_only_the_requested_outputs_as_fresh_arrays() -> None:
    model, feeds = CASES["Identity"]
    sess = npu.InferenceSession(model, providers=("CPU",))
    (y,) = sess.run(["y"], feeds)
    assert not np.shares_memory(y, feeds["x0"])
    np.testing.assert_array_equal(y, feeds["x0"])


def test_run_rejects_missing_unknown_and_misshaped_inputs() -> None:
    model, feeds = CASES["Relu"]
    sess = npu.InferenceSession(model, providers=("CPU",))
    with pytest.raises(ValueError, match="missing input 'x0'"):
        sess.run(None, {})
    with pytest.raises(ValueError, match="unknown inputs"):
        sess.run(None, {**feeds, "nope": feeds["x0"]})
    with pytest.raises(ValueError, match="has shape"):
        sess.run(None, {"x0": np.zeros((2, 3), np.float32)})
    with pytest.raises(ValueError, match="unknown outputs"):
        sess.run(["zz"], feeds)


def test_get_inputs_and_outputs_describe_the_graph() -> None:
    sess = npu.InferenceSession(digits_cnn(), providers=("CPU",))
    (inp,) = sess.get_inputs()
    assert (inp.name, inp.shape, inp.dtype, inp.type) == (
        "x",
        ["N", 1, 28, 28],
        np.dtype(np.float32),
        "tensor(float)",
    )
    assert [o.name for o in sess.get_outputs()] == ["probs"]


def test_unknown_provider_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown providers"):
        npu.InferenceSession(digits_cnn(), providers=("GPU",))


def test_a_cast_of_float32_to_string_gives_its_shortest_text() -> None:
    import onnx
    from onnx import helper

    from onnx_models import make, vi

    model = make(
        [helper.make_node("Cast", ["x"], ["y"], to=onnx.TensorProto.STRING)],
        [vi("x", [4])],
        [vi("y", [4], onnx.TensorProto.STRING)],
    )
    x = np.array([0.9767611, 0.039187793, -2.5, 1e-8], np.float32)
    (got,) = npu.InferenceSession(model, providers=("CPU",)).run(None, {"x": x})
    assert got.tolist() == ["0.9767611", "0.039187793", "-2.5", "1e-08"]
