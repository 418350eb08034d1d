"""InferenceSession.run_async: pipelined runs with futures (docs/inference.md)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

HOST_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "host")
if HOST_TESTS not in sys.path:
    sys.path.insert(0, HOST_TESTS)

onnx = pytest.importorskip("onnx")

import npu  # noqa: E402
from onnx_models import digits_cnn, reference, resnet_like, rnd  # noqa: E402

NET_RTOL, NET_ATOL = 1e-4, 1e-5


def inputs(seed: int, count: int, *shape: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rnd(rng, *shape) for _ in range(count)]


def test_pipelined_runs_give_each_request_its_own_outputs(dev):
    model = resnet_like()
    xs = inputs(20, 5, 2, 3, 32, 32)
    with npu.InferenceSession(model, device=dev) as sess:
        futures = [sess.run_async(None, {"x": x}) for x in xs]  # more than two in flight
        got = [f.result()[0] for f in futures]
    for x, g in zip(xs, got, strict=True):
        np.testing.assert_allclose(g, reference(model, {"x": x})[0], rtol=NET_RTOL, atol=NET_ATOL)


def test_pipelined_results_equal_the_synchronous_ones_bit_for_bit(dev):
    xs = inputs(21, 4, 8, 1, 28, 28)
    with npu.InferenceSession(digits_cnn(), device=dev) as sess:
        want = [sess.run(None, {"x": x})[0] for x in xs]
        futures = [sess.run_async(None, {"x": x}) for x in xs]
        got = [f.result()[0] for f in futures]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_at_most_two_runs_are_in_flight_and_each_has_its_own_plan(dev):
    xs = inputs(22, 3, 4, 1, 28, 28)
    with npu.InferenceSession(digits_cnn(), device=dev) as sess:
        f0 = sess.run_async(None, {"x": xs[0]})
        f1 = sess.run_async(None, {"x": xs[1]})
        assert f0.plan is not None and f1.plan is not None and f0.plan is not f1.plan
        f2 = sess.run_async(None, {"x": xs[2]})  # takes f0's plan: f0 completes first
        assert f0.plan is None and f2.plan is not None
        assert f0.done()
        f1.result()
        f2.result()


def test_a_future_keeps_its_outputs_after_later_runs_reuse_its_buffers(dev):
    xs = inputs(23, 4, 4, 1, 28, 28)
    with npu.InferenceSession(digits_cnn(), device=dev) as sess:
        first = sess.run_async(None, {"x": xs[0]})
        kept = first.result()[0].copy()
        for x in xs[1:]:
            sess.run_async(None, {"x": x}).result()
        sess.run(None, {"x": xs[-1]})
        np.testing.assert_array_equal(first.result()[0], kept)


def test_run_completes_the_runs_in_flight_first(dev):
    xs = inputs(24, 3, 4, 1, 28, 28)
    with npu.InferenceSession(digits_cnn(), device=dev) as sess:
        want = [sess.run(None, {"x": x})[0] for x in xs]
        futures = [sess.run_async(None, {"x": x}) for x in xs[:2]]
        (last,) = sess.run(None, {"x": xs[2]})
        assert all(f.plan is None for f in futures)
        got = [f.result()[0] for f in futures]
    np.testing.assert_array_equal(last, want[2])
    for g, w in zip(got, want[:2], strict=True):
        np.testing.assert_array_equal(g, w)


def test_close_completes_the_runs_in_flight_and_leaks_no_buffer(dev):
    baseline = len(dev.buffers)
    xs = inputs(25, 2, 4, 1, 28, 28)
    sess = npu.InferenceSession(digits_cnn(), device=dev)
    futures = [sess.run_async(None, {"x": x}) for x in xs]
    sess.close()
    assert all(f.done() for f in futures)
    assert len(dev.buffers) == baseline
    model = digits_cnn()
    for f, x in zip(futures, xs, strict=True):
        np.testing.assert_allclose(
            f.result()[0], reference(model, {"x": x})[0], rtol=NET_RTOL, atol=NET_ATOL
        )


def test_a_pipelined_run_reports_its_device_span_and_profile(dev):
    x = inputs(26, 1, 8, 1, 28, 28)[0]
    with npu.InferenceSession(digits_cnn(), device=dev) as sess:
        f = sess.run_async(None, {"x": x})
        f.result()
    assert f.device_ns is not None and 0 < f.device_ns[0] < f.device_ns[1]
    p = f.profile
    assert p.upload_s > 0 and p.compute_s > 0 and p.download_s > 0
    assert p.total_s >= p.upload_s + p.compute_s + p.download_s


def test_a_model_with_a_cpu_partition_runs_at_once_and_its_future_is_done(dev):
    model = digits_cnn(middle="Softplus")
    x = inputs(27, 1, 2, 1, 28, 28)[0]
    with npu.InferenceSession(model, device=dev) as sess:
        f = sess.run_async(None, {"x": x})
        assert f.plan is None and f.done() and f.device_ns is None
        (got,) = f.result()
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=NET_RTOL, atol=NET_ATOL)


def test_bad_inputs_raise_from_run_async_itself(dev):
    with npu.InferenceSession(digits_cnn(), device=dev) as sess:
        with pytest.raises(ValueError, match="missing input"):
            sess.run_async(None, {})
        with pytest.raises(ValueError, match="has shape"):
            sess.run_async(None, {"x": np.zeros((2, 1, 27, 28), np.float32)})
        with pytest.raises(ValueError, match="unknown outputs"):
            sess.run_async(["nope"], {"x": np.zeros((2, 1, 28, 28), np.float32)})


def test_run_async_on_a_closed_session_raises_ebadf(dev):
    sess = npu.InferenceSession(digits_cnn(), device=dev)
    sess.close()
    with pytest.raises(npu.NpuError) as info:
        sess.run_async(None, {"x": np.zeros((2, 1, 28, 28), np.float32)})
    assert info.value.errno == 9  # EBADF


def test_a_driver_refusal_raises_from_run_async_with_the_nodes_named(dev):
    x = inputs(28, 1, 2, 1, 28, 28)[0]
    with npu.InferenceSession(digits_cnn(), device=dev) as sess:
        sess.run_async(None, {"x": x}).result()
        (plan,) = sess._plans[next(iter(sess._plans))]
        plan.arena.free()  # every op now names a freed buffer
        with pytest.raises(npu.NpuError, match=r"conv1") as info:
            sess.run_async(None, {"x": x})
        assert info.value.errno == 9  # EBADF
