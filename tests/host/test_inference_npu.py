"""The NPU provider through the CPU backend: plans, weights, errors, lifetime, and every op."""

from __future__ import annotations

import errno
import gc

import numpy as np
import pytest
from onnx import helper

import npu
from npu import _abi
from npu.hal import CpuBackend
from npu.hal.cpu import CPU_CAPS
from onnx_models import digits_cnn, make, op_cases, reference, resnet_like, rnd, vi
from test_inference_cpu import expected

CASES = op_cases()


@pytest.mark.parametrize("case", sorted(CASES))
def test_npu_provider_matches_reference(case: str, device: npu.Device) -> None:
    model, feeds = CASES[case]
    want = expected(case, model, feeds)
    with npu.InferenceSession(model, device=device) as sess:
        got = sess.run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_digits_cnn_runs_entirely_on_the_npu(device: npu.Device, driver: CpuBackend) -> None:
    x = rnd(np.random.default_rng(0), 8, 1, 28, 28)
    model = digits_cnn()
    with npu.InferenceSession(model, device=device) as sess:
        assert sess.fallbacks == []
        device.flush_deferred()
        before = len(driver.submitted_tensor)
        (got,) = sess.run(None, {"x": x})
        device.flush_deferred()
        assert len(driver.submitted_tensor) - before == 7  # one per node; Flatten is a view
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_fallback_model_runs_npu_cpu_npu_and_matches_reference(device: npu.Device) -> None:
    model = digits_cnn(middle="Softplus")
    x = rnd(np.random.default_rng(1), 4, 1, 28, 28)
    with npu.InferenceSession(model, device=device) as sess:
        assert [p.provider for p in sess.partitions] == ["NPU", "CPU", "NPU"]
        (got,) = sess.run(None, {"x": x})
        assert sess.last_profile.cpu_s > 0 and sess.last_profile.compute_s > 0
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_resnet_runs_with_one_submit_per_run(device: npu.Device, driver: CpuBackend) -> None:
    model = resnet_like()
    x = rnd(np.random.default_rng(2), 2, 3, 32, 32)
    with npu.InferenceSession(model, device=device) as sess:
        sess.run(None, {"x": x})
        device.flush_deferred()
        before = len(driver.submits)
        (got,) = sess.run(None, {"x": x})
        device.flush_deferred()
        assert len(driver.submits) - before == 1
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_second_run_reuses_the_plan_and_allocates_nothing(device: npu.Device) -> None:
    x = rnd(np.random.default_rng(3), 2, 1, 28, 28)
    with npu.InferenceSession(digits_cnn(), device=device) as sess:
        first = sess.run(None, {"x": x})[0]
        assert sess.last_profile.planned
        count = len(device.buffers)
        second = sess.run(None, {"x": x * 0.5})[0]
        assert not sess.last_profile.planned
        assert len(device.buffers) == count
        again = sess.run(None, {"x": x})[0]
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, second)


def test_a_new_batch_size_builds_a_second_plan(device: npu.Device) -> None:
    model = digits_cnn()
    with npu.InferenceSession(model, device=device) as sess:
        for n in (1, 3, 1):
            x = rnd(np.random.default_rng(n), n, 1, 28, 28)
            (got,) = sess.run(None, {"x": x})
            np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
        assert len(sess._plans) == 2


def test_weights_are_uploaded_once_at_session_creation(device: npu.Device) -> None:
    x = rnd(np.random.default_rng(4), 2, 1, 28, 28)
    with npu.InferenceSession(digits_cnn(), device=device) as sess:
        assert sess.weight_uploads == 1
        assert len(device.buffers) == 1  # the weights; plans come at the first run
        for _ in range(3):
            sess.run(None, {"x": x})
        assert sess.weight_uploads == 1


def test_device_error_names_the_node(device: npu.Device, driver: CpuBackend) -> None:
    driver.fail_opcode[int(npu.Opcode.POOL2D)] = int(npu.Status.BAD_ARGS)
    x = rnd(np.random.default_rng(5), 1, 1, 28, 28)
    with npu.InferenceSession(digits_cnn(), device=device) as sess:
        with pytest.raises(npu.NpuDeviceError, match=r"node 'pool1' \(MaxPool\)") as info:
            sess.run(None, {"x": x})
        assert info.value.status_name == "NPU_ST_BAD_ARGS"


def test_close_frees_every_buffer(device: npu.Device) -> None:
    baseline = len(device.buffers)
    sess = npu.InferenceSession(resnet_like(), device=device)
    sess.run(None, {"x": rnd(np.random.default_rng(6), 1, 3, 32, 32)})
    assert len(device.buffers) > baseline
    sess.close()
    sess.close()
    assert len(device.buffers) == baseline


def test_garbage_collected_session_frees_every_buffer(device: npu.Device) -> None:
    baseline = len(device.buffers)
    sess = npu.InferenceSession(digits_cnn(middle="Softplus"), device=device)
    out = sess.run(None, {"x": rnd(np.random.default_rng(7), 2, 1, 28, 28)})
    del sess
    gc.collect()
    assert len(device.buffers) == baseline
    assert out[0].shape == (2, 10)


def test_outputs_do_not_alias_device_memory(device: npu.Device) -> None:
    x = rnd(np.random.default_rng(8), 2, 1, 28, 28)
    with npu.InferenceSession(digits_cnn(), device=device) as sess:
        a = sess.run(None, {"x": x})[0]
        keep = a.copy()
        sess.run(None, {"x": x * 2})
    np.testing.assert_array_equal(a, keep)
    assert a.flags.owndata


def test_node_times_give_each_npu_node_its_ops_device_time(device: npu.Device) -> None:
    sess = npu.InferenceSession(digits_cnn(), device=device)
    with pytest.raises(npu.NpuError) as info:
        sess.node_times()
    assert info.value.errno == errno.ENOENT
    sess.run(None, {"x": rnd(np.random.default_rng(4), 3, 1, 28, 28)})
    times = sess.node_times()
    names = [t.name for t in times]
    assert names[:2] == ["conv1", "pool1"] and "fc2" in names
    assert all(t.ops >= 1 and t.device_us >= 0 for t in times)
    assert times[0].device_us > 0  # the backend stamps each op's start and end
    sess.close()


# -- residual adds fused into CONV2D (NPU_CONV_F_ACCUMULATE) ------------------


def node_ops(sess: npu.InferenceSession) -> dict[str, tuple[int, tuple[str, ...]]]:
    return {t.name: (t.ops, t.fused) for t in sess.node_times()}


def test_a_residual_add_runs_inside_its_conv_in_place(device: npu.Device) -> None:
    model = resnet_like()
    x = rnd(np.random.default_rng(40), 2, 3, 32, 32)
    with npu.InferenceSession(model, device=device) as sess:
        (got,) = sess.run(None, {"x": x})
        ops = node_ops(sess)
        assert sess.rewrites["fuse_residual"] == 2
    assert ops["b1c2"] == (1, ("b1c2_bn", "b1_add", "b1_relu"))  # one CONV2D, no copy
    assert ops["b2proj"][0] == 1 and "b2_add" in ops["b2proj"][1]
    assert not any(name.endswith("_add") for name in ops)
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_a_residual_read_again_later_is_copied_into_the_output_first(
    device: npu.Device,
) -> None:
    rng = np.random.default_rng(41)
    inits = {"w": rnd(rng, 4, 4, 3, 3, scale=0.3)}
    nodes = [
        helper.make_node("Relu", ["x"], ["s"], name="relu"),
        helper.make_node("Conv", ["s", "w"], ["c"], name="conv", pads=[1] * 4),
        helper.make_node("Add", ["c", "s"], ["y"], name="add"),
        helper.make_node("Mul", ["y", "s"], ["z"], name="mul"),  # s is read after the add
    ]
    model = make(nodes, [vi("x", [2, 4, 6, 6])], [vi("z", [2, 4, 6, 6])], inits)
    x = rnd(rng, 2, 4, 6, 6)
    with npu.InferenceSession(model, device=device) as sess:
        (got,) = sess.run(None, {"x": x})
        ops = node_ops(sess)
    assert ops["conv"] == (2, ("add",))  # a CONVERT of the residual, then CONV2D
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_a_device_without_conv_accumulate_keeps_the_add() -> None:
    backend = CpuBackend(caps=CPU_CAPS & ~_abi.NPU_INFO_CAP_CONV_ACCUMULATE)
    model = resnet_like()
    x = rnd(np.random.default_rng(42), 2, 3, 32, 32)
    with npu.Device(backend) as dev, npu.InferenceSession(model, device=dev) as sess:
        assert "fuse_residual" not in sess.rewrites
        assert "b1_add" in {n.name for n in sess.graph.nodes}
        (got,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


# -- ReLU6 fused into CONV2D (NPU_ACT_RELU6) -----------------------------------


def relu6_model() -> tuple[object, dict[str, np.ndarray]]:
    rng = np.random.default_rng(43)
    inits = {
        "w": rnd(rng, 8, 3, 3, 3, scale=2.0),
        "lo": np.asarray(np.float32(0.0)),
        "hi": np.asarray(np.float32(6.0)),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4),
        helper.make_node("Clip", ["c", "lo", "hi"], ["y"], name="relu6"),
    ]
    model = make(nodes, [vi("x", [2, 3, 8, 8])], [vi("y", [2, 8, 8, 8])], inits)
    return model, {"x": rnd(rng, 2, 3, 8, 8, scale=3.0)}


def test_a_relu6_clip_runs_inside_its_conv(device: npu.Device) -> None:
    model, feeds = relu6_model()
    with npu.InferenceSession(model, device=device) as sess:
        (got,) = sess.run(None, feeds)
        ops = node_ops(sess)
    assert ops == {"conv": (1, ("relu6",))}
    want = reference(model, feeds)[0]
    assert (want == 6).any() and (want == 0).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_device_without_act_relu6_keeps_the_clip() -> None:
    model, feeds = relu6_model()
    backend = CpuBackend(caps=CPU_CAPS & ~_abi.NPU_INFO_CAP_ACT_RELU6)
    with npu.Device(backend) as dev, npu.InferenceSession(model, device=dev) as sess:
        assert [n.op_type for n in sess.graph.nodes] == ["Conv", "Clip"]
        (got,) = sess.run(None, feeds)
    np.testing.assert_allclose(got, reference(model, feeds)[0], rtol=1e-5, atol=1e-5)
