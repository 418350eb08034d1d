"""Independent ops of a partition run at the same time (Cap.CONCURRENT): the
runner's level order and concurrency flags, through the CPU backend."""

from __future__ import annotations

import ctypes
import errno

import numpy as np
import pytest

import npu
from npu import _abi
from npu.hal import CpuBackend
from npu.hal.cpu import CPU_CAPS
from npu.inference.schedule import concurrent_flags, level_order, op_work
from onnx_models import inception_like, reference, rnd

# -- level_order ----------------------------------------------------------------


def test_level_order_makes_two_branches_neighbours() -> None:
    # a1: x -> t1, a2: t1 -> t2, b1: x -> u1, b2: u1 -> u2, c: t2, u2 -> y
    ops = [
        (["x"], ["t1"]),
        (["t1"], ["t2"]),
        (["x"], ["u1"]),
        (["u1"], ["u2"]),
        (["t2", "u2"], ["y"]),
    ]
    assert level_order(ops) == ([0, 2, 1, 3, 4], [0, 0, 1, 1, 2])


def test_level_order_keeps_a_write_after_the_reads_before_it() -> None:
    # op 1 overwrites what op 0 reads (in place): it may not move before op 0.
    ops = [(["r"], ["a"]), (["x"], ["r"]), (["x"], ["b"])]
    order, _ = level_order(ops)
    assert order.index(1) > order.index(0)


def test_level_order_keeps_two_writes_of_one_tensor_in_order() -> None:
    ops = [(["x"], ["t"]), (["y"], ["u"]), (["y"], ["t"]), (["t"], ["z"])]
    order, _ = level_order(ops)
    assert order.index(0) < order.index(2) < order.index(3)


def test_level_order_of_a_chain_is_the_chain() -> None:
    ops = [(["x"], ["a"]), (["a"], ["b"]), (["b"], ["c"])]
    assert level_order(ops) == ([0, 1, 2], [0, 1, 2])


# -- concurrent_flags ------------------------------------------------------------


def rng_(buf: int, start: int, end: int) -> tuple[int, int, int]:
    return (buf, start, end)


def test_ops_on_disjoint_memory_are_flagged() -> None:
    ops = [([rng_(1, 0, 64)], [rng_(1, 64, 128)]), ([rng_(1, 0, 64)], [rng_(1, 128, 192)])]
    assert concurrent_flags(ops) == [False, True]


def test_an_op_reading_what_its_group_writes_starts_a_new_group() -> None:
    ops = [([rng_(1, 0, 64)], [rng_(1, 64, 128)]), ([rng_(1, 100, 110)], [rng_(1, 128, 192)])]
    assert concurrent_flags(ops) == [False, False]


def test_an_op_writing_what_its_group_reads_starts_a_new_group() -> None:
    ops = [([rng_(1, 0, 64)], [rng_(1, 64, 128)]), ([rng_(2, 0, 8)], [rng_(1, 32, 40)])]
    assert concurrent_flags(ops) == [False, False]


def test_two_writes_of_the_same_bytes_are_not_concurrent() -> None:
    ops = [([], [rng_(1, 0, 64)]), ([], [rng_(1, 63, 64)])]
    assert concurrent_flags(ops) == [False, False]


def test_the_same_offsets_of_different_buffers_do_not_conflict() -> None:
    ops = [([], [rng_(1, 0, 64)]), ([], [rng_(2, 0, 64)])]
    assert concurrent_flags(ops) == [False, True]


def test_a_group_conflict_is_checked_against_every_member() -> None:
    a, b, c = ([], [rng_(1, 0, 8)]), ([], [rng_(1, 8, 16)]), ([rng_(1, 0, 4)], [rng_(1, 16, 24)])
    assert concurrent_flags([a, b, c]) == [False, True, False]


def test_a_barrier_starts_a_group() -> None:
    ops = [([], [rng_(1, 0, 8)]), ([], [rng_(1, 8, 16)]), ([], [rng_(1, 16, 24)])]
    assert concurrent_flags(ops, barriers=[2]) == [False, True, False]


def test_a_small_op_starts_a_group_and_a_large_one_may_join_it() -> None:
    ops = [([], [rng_(1, 0, 8)]), ([], [rng_(1, 8, 16)]), ([], [rng_(1, 16, 24)])]
    assert concurrent_flags(ops, small=[False, True, False]) == [False, False, True]


# -- the runner --------------------------------------------------------------------


def run_ops(
    driver: CpuBackend, device: npu.Device, model: object, x: np.ndarray, **kw: bool
) -> list[_abi.NpuTensorOp]:
    """The tensor ops one run of ``model`` on ``x`` submitted."""
    with npu.InferenceSession(model, device=device, **kw) as sess:
        device.flush_deferred()
        before = len(driver.submitted_tensor)
        sess.run(None, {"x": x})
        device.flush_deferred()
        return driver.submitted_tensor[before:]


def concurrent_of(ops: list[_abi.NpuTensorOp]) -> list[bool]:
    return [bool(op.flags & _abi.NPU_TENSOR_OP_F_CONCURRENT) for op in ops]


def test_inception_branches_are_submitted_to_run_concurrently(
    device: npu.Device, driver: CpuBackend
) -> None:
    x = rnd(np.random.default_rng(0), 1, 3, 32, 32)
    ops = run_ops(driver, device, inception_like(width=32, size=32), x)
    flags = concurrent_of(ops)
    convs = [f for op, f in zip(ops, flags, strict=True) if op.opcode == _abi.NPU_OP_CONV2D]
    # stem; the three 1x1 heads (one group); the two 3x3s after them (one
    # group) with the pool's 1x1; the last 3x3 of the third branch.
    assert convs == [False, False, True, True, False, True, True, False], convs
    assert not flags[0]


def test_ops_with_little_work_are_not_handed_to_another_core(
    device: npu.Device, driver: CpuBackend
) -> None:
    x = rnd(np.random.default_rng(0), 1, 3, 16, 16)
    assert not any(concurrent_of(run_ops(driver, device, inception_like(width=8, size=16), x)))


def test_op_work_counts_multiply_adds_of_convolutions_and_matmuls(device: npu.Device) -> None:
    buf = device.alloc(1 << 16)
    ref = npu.ops.tensor_ref
    f32 = _abi.NPU_DTYPE_FP32
    conv = npu.ops.conv2d_op(
        ref(buf, f32, (1, 8, 6, 6)), ref(buf, f32, (4, 8, 3, 3)), ref(buf, f32, (1, 4, 1, 1)),
        ref(buf, f32, (1, 4, 4, 4)),
    )  # fmt: skip
    mm = npu.ops.matmul_op(ref(buf, f32, (5, 7)), ref(buf, f32, (7, 3)), ref(buf, f32, (5, 3)))
    neg = npu.ops.unary(_abi.UnaryKind.NEG, ref(buf, f32, (10, 10)), ref(buf, f32, (10, 10)))
    assert op_work(conv) == 4 * 4 * 4 * 8 * 3 * 3
    assert op_work(mm) == 5 * 3 * 7
    assert op_work(neg) == 100


def test_results_are_the_same_with_concurrency_on_and_off(device: npu.Device) -> None:
    model = inception_like(width=32, size=32)
    x = rnd(np.random.default_rng(1), 2, 3, 32, 32)
    with npu.InferenceSession(model, device=device) as on:
        (got_on,) = on.run(None, {"x": x})
    with npu.InferenceSession(model, device=device, concurrent=False) as off:
        (got_off,) = off.run(None, {"x": x})
    np.testing.assert_array_equal(got_on, got_off)
    np.testing.assert_allclose(got_on, reference(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_concurrent_false_submits_no_flag(device: npu.Device, driver: CpuBackend) -> None:
    x = rnd(np.random.default_rng(2), 1, 3, 32, 32)
    ops = run_ops(driver, device, inception_like(width=32, size=32), x, concurrent=False)
    assert not any(concurrent_of(ops))


def test_a_device_without_the_cap_gets_no_flag() -> None:
    backend = CpuBackend(caps=CPU_CAPS & ~_abi.NPU_INFO_CAP_CONCURRENT, record=True)
    model = inception_like(width=32, size=32)
    x = rnd(np.random.default_rng(4), 1, 3, 32, 32)
    with npu.Device(backend) as dev, npu.InferenceSession(model, device=dev) as sess:
        (got,) = sess.run(None, {"x": x})
        dev.flush_deferred()
        assert not any(op.flags for op in backend.submitted_tensor)
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def flagged_op(dev: npu.Device) -> npu.ops.TensorOp:
    a = dev.alloc(64)
    out = dev.alloc(64)
    return npu.ops.unary(
        _abi.UnaryKind.NEG, npu.ops.tensor_ref(a, _abi.NPU_DTYPE_FP32, (16,)),
        npu.ops.tensor_ref(out, _abi.NPU_DTYPE_FP32, (16,)),
    ).with_concurrent()  # fmt: skip


def test_a_concurrent_op_without_the_cap_is_refused_with_eopnotsupp() -> None:
    backend = CpuBackend(caps=CPU_CAPS & ~_abi.NPU_INFO_CAP_CONCURRENT)
    with npu.Device(backend) as dev, pytest.raises(npu.NpuError) as info:
        op = flagged_op(dev)
        dev.submit([op, op])
    assert info.value.errno == errno.EOPNOTSUPP


def test_a_tensor_op_flag_outside_the_mask_is_refused_with_einval(driver: CpuBackend) -> None:
    with npu.Device(driver) as dev:
        raw = flagged_op(dev).pack()
        raw.flags = 1 << 1
        ops = (_abi.NpuTensorOp * 1)(raw)
        with pytest.raises(OSError) as info:
            driver.submit(ops, ctypes.sizeof(_abi.NpuTensorOp), 0)
    assert info.value.errno == errno.EINVAL


def submitted_ops(driver: CpuBackend, device: npu.Device, concurrent: bool) -> list[object]:
    """(opcode, kind, flags, operand offsets) of each op of one run of the small Inception."""
    x = rnd(np.random.default_rng(5), 1, 3, 16, 16)
    model = inception_like(width=8, size=16)  # every op too small to hand to a core
    ops = run_ops(driver, device, model, x, concurrent=concurrent)
    return [(op.opcode, op.kind, op.flags, [op.t[i].offset for i in range(4)]) for op in ops]


def test_a_partition_with_nothing_to_run_concurrently_keeps_its_graph_order(
    device: npu.Device, driver: CpuBackend
) -> None:
    assert submitted_ops(driver, device, True) == submitted_ops(driver, device, False)
