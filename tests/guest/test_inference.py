"""The ONNX model runner (npu.InferenceSession) on the real device, in the guest.

Models come from tests/host/onnx_models.py (built with onnx.helper). Every
result is compared with onnx.reference.ReferenceEvaluator (float32):
single ops within rtol 1e-5 / atol 1e-5 (the device computes in fp32 and
rounds once; accumulations differ from numpy's only by summation order),
whole networks within rtol 1e-4 / atol 1e-5.
"""

from __future__ import annotations

import gc
import os
import sys

import numpy as np
import pytest

HOST_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "host")
if HOST_TESTS not in sys.path:
    sys.path.insert(0, HOST_TESTS)

onnx = pytest.importorskip("onnx")

import npu  # noqa: E402
from onnx_models import digits_cnn, op_cases, reference, resnet_like, rnd  # noqa: E402

CASES = op_cases()
OP_RTOL, OP_ATOL = 1e-5, 1e-5
NET_RTOL, NET_ATOL = 1e-4, 1e-5


def expected(case, model, feeds):
    """Reference result; opset-11 Softmax by hand (onnx.reference ignores the 2-D coercion)."""
    if case == "Softmax_opset11":
        x = feeds["x0"].reshape(3, -1).astype(np.float64)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return [(e / e.sum(axis=1, keepdims=True)).reshape(feeds["x0"].shape).astype(np.float32)]
    return reference(model, feeds)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_op_on_the_npu_matches_the_reference(dev, case):
    model, feeds = CASES[case]
    with npu.InferenceSession(model, device=dev) as sess:
        got = sess.run(None, feeds)
        if case not in ("Conv_asym_pads", "Softplus_reference", "AveragePool_1d_cpu"):
            assert sess.fallbacks == [], sess.fallbacks
    for g, w in zip(got, expected(case, model, feeds), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=OP_RTOL, atol=OP_ATOL)


def test_digits_cnn_at_batch_64_matches_the_reference(dev):
    model = digits_cnn()
    x = np.random.default_rng(0).uniform(0, 1, (64, 1, 28, 28)).astype(np.float32)
    with npu.InferenceSession(model, device=dev) as sess:
        assert [p.provider for p in sess.partitions] == ["NPU"]
        (got,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=NET_RTOL, atol=NET_ATOL)


def test_resnet_at_batch_8_matches_the_reference(dev):
    model = resnet_like()
    x = np.random.default_rng(1).uniform(0, 1, (8, 3, 32, 32)).astype(np.float32)
    with npu.InferenceSession(model, device=dev) as sess:
        (got,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=NET_RTOL, atol=NET_ATOL)


def test_resnet_residual_adds_run_inside_their_convolutions(dev):
    assert dev.info.has(npu.Cap.CONV_ACCUMULATE)
    model = resnet_like()
    x = np.random.default_rng(9).uniform(0, 1, (2, 3, 32, 32)).astype(np.float32)
    with npu.InferenceSession(model, device=dev) as sess:
        (got,) = sess.run(None, {"x": x})
        times = {t.name: t for t in sess.node_times()}
        assert sess.rewrites["fuse_residual"] == 2
    assert times["b1c2"].ops == 1 and "b1_add" in times["b1c2"].fused
    assert not any(name.endswith("_add") for name in times)
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=NET_RTOL, atol=NET_ATOL)


@pytest.fixture
def stream(dev):
    s = npu.Stream(dev)
    try:
        yield s
    finally:
        s.close()


def test_inside_a_stream_a_model_runs_on_that_queue_and_matches_the_reference(dev, stream):
    model = resnet_like()
    x = np.random.default_rng(1).uniform(0, 1, (2, 3, 32, 32)).astype(np.float32)
    want = reference(model, {"x": x})[0]
    with npu.InferenceSession(model, device=dev) as sess:
        sess.run(None, {"x": x})  # compiles the plan, uploads the weights
        dev.flush_deferred()  # eager ops held back count as submitted
        kernel_before = dev.submitted_fences().get(0, 0)
        for _ in range(2):  # the first builds the plan's descriptors, the second reuses them
            before = stream.last_fence
            with stream:
                (got,) = sess.run(None, {"x": x})
            assert stream.last_fence > before
            np.testing.assert_allclose(got, want, rtol=NET_RTOL, atol=NET_ATOL)
        dev.flush_deferred()  # eager ops held back count as submitted
        assert dev.submitted_fences().get(0, 0) == kernel_before


def test_on_a_stream_a_freed_buffer_is_refused_with_the_nodes_named(dev, stream):
    x = rnd(np.random.default_rng(5), 2, 1, 28, 28)
    with npu.InferenceSession(digits_cnn(), device=dev) as sess:
        with stream:
            sess.run(None, {"x": x})
        (plan,) = sess._plans[next(iter(sess._plans))]
        plan.arena.free()
        with stream, pytest.raises(npu.NpuError, match=r"conv1") as info:
            sess.run(None, {"x": x})
        assert info.value.errno == 9  # EBADF


@pytest.mark.parametrize("op", ["Softplus", "Sin", "Floor"])
def test_model_with_an_op_the_npu_lacks_runs_npu_cpu_npu(dev, op):
    model = digits_cnn(middle=op)
    x = np.random.default_rng(2).uniform(0, 1, (4, 1, 28, 28)).astype(np.float32)
    with npu.InferenceSession(model, device=dev) as sess:
        assert [p.provider for p in sess.partitions] == ["NPU", "CPU", "NPU"]
        assert [f[0] for f in sess.fallbacks] == ["middle"]
        (got,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=NET_RTOL, atol=NET_ATOL)


def test_second_run_reuses_the_plan_and_allocates_no_buffer(dev):
    x = rnd(np.random.default_rng(3), 16, 1, 28, 28)
    with npu.InferenceSession(digits_cnn(), device=dev) as sess:
        first = sess.run(None, {"x": x})[0]
        count = len(dev.buffers)
        for _ in range(3):
            again = sess.run(None, {"x": x})[0]
            assert not sess.last_profile.planned
            assert len(dev.buffers) == count
    np.testing.assert_array_equal(first, again)


def test_weights_are_uploaded_once(dev):
    x = rnd(np.random.default_rng(4), 2, 3, 32, 32)
    with npu.InferenceSession(resnet_like(), device=dev) as sess:
        assert sess.weight_uploads == 1
        for _ in range(3):
            sess.run(None, {"x": x})
        assert sess.weight_uploads == 1


def test_driver_refusal_names_the_nodes(dev):
    x = rnd(np.random.default_rng(5), 2, 1, 28, 28)
    with npu.InferenceSession(digits_cnn(), device=dev) as sess:
        sess.run(None, {"x": x})
        (plan,) = sess._plans[next(iter(sess._plans))]
        plan.arena.free()  # every op now names a freed buffer
        with pytest.raises(npu.NpuError, match=r"conv1") as info:
            sess.run(None, {"x": x})
        assert info.value.errno == 9  # EBADF


def test_no_buffer_leaks_after_close(dev):
    baseline = len(dev.buffers)
    sess = npu.InferenceSession(digits_cnn(middle="Softplus"), device=dev)
    sess.run(None, {"x": rnd(np.random.default_rng(6), 2, 1, 28, 28)})
    assert len(dev.buffers) > baseline
    sess.close()
    assert len(dev.buffers) == baseline


def test_no_buffer_leaks_after_garbage_collection(dev):
    baseline = len(dev.buffers)
    sess = npu.InferenceSession(resnet_like(), device=dev)
    sess.run(None, {"x": rnd(np.random.default_rng(7), 1, 3, 32, 32)})
    del sess
    gc.collect()
    assert len(dev.buffers) == baseline


def test_npu_is_much_faster_than_the_cpu_provider(dev):

    model = digits_cnn()
    x = np.random.default_rng(8).uniform(0, 1, (64, 1, 28, 28)).astype(np.float32)
    cpu = npu.InferenceSession(model, providers=("CPU",))
    with npu.InferenceSession(model, device=dev) as sess:
        sess.run(None, {"x": x})
        t_npu = min(_timed(sess, x) for _ in range(3))
    t_cpu = min(_timed(cpu, x) for _ in range(2))
    print(f"digits CNN batch 64: NPU {t_npu * 1e3:.1f} ms, CPU {t_cpu * 1e3:.1f} ms")
    assert t_cpu / t_npu >= 5  # the benchmark target is 20x; keep slack for a busy host


def _timed(sess, x):
    import time

    t = time.perf_counter()
    sess.run(None, {"x": x})
    return time.perf_counter() - t
