"""npu.Stream on the host: the parameter blocks a stream writes for tensor ops,
the current/default stream bookkeeping, and the default stream (the kernel
SUBMIT path) on the CPU backend. Streams on user queues: test_stream_queues.py."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

import npu
from npu import DType, EltwiseKind, _abi, ops
from npu.core.stream import pack_tensor_params
from npu.hal import CpuBackend


class FakeBuf:
    def __init__(self, handle: int, size: int) -> None:
        self.handle = handle
        self.size = size


def test_a_parameter_block_holds_each_operand_at_its_address_and_zeros_elsewhere() -> None:
    a, b, out = FakeBuf(1, 4096), FakeBuf(2, 4096), FakeBuf(3, 4096)
    ra = ops.tensor_ref(a, DType.FP32, (4, 8), offset=64)
    rb = ops.tensor_ref(b, DType.FP32, (1, 8), strides=(0, 1))
    rout = ops.tensor_ref(out, DType.FP32, (4, 8))
    op = ops.eltwise(EltwiseKind.ADD, ra, rb, rout)
    vas = [0x40_0000 + 64, 0x50_0000, 0x60_0000]
    block = pack_tensor_params(op, vas)
    assert len(block) == ctypes.sizeof(_abi.NpuTensorParams) == 256
    params = _abi.NpuTensorParams.from_buffer_copy(block)
    for t, ref, va in zip(params.t, (ra, rb, rout), vas, strict=False):
        assert (t.va, t.dtype, t.ndim) == (va, DType.FP32, 2)
        assert list(t.shape) == [*ref.shape, 0, 0]
        assert list(t.strides) == [*ref.strides, 0, 0]
    assert bytes(params.t[3]) == bytes(ctypes.sizeof(_abi.NpuHwTensor))
    assert list(params.params) == [0] * _abi.NPU_TENSOR_PARAMS


def test_a_parameter_block_carries_the_ops_params() -> None:
    x = FakeBuf(1, 1 << 16)
    rx = ops.tensor_ref(x, DType.FP32, (2, 3, 4))
    rout = ops.tensor_ref(x, DType.FP32, (2, 1, 4), offset=4096)
    op = ops.reduce(npu.ReduceKind.SUM, rx, rout, [1])
    params = _abi.NpuTensorParams.from_buffer_copy(pack_tensor_params(op, [0x1000, 0x2000]))
    assert list(params.params) == [0b10] + [0] * (_abi.NPU_TENSOR_PARAMS - 1)


def test_a_parameter_block_needs_one_address_per_operand() -> None:
    x = FakeBuf(1, 4096)
    r = ops.tensor_ref(x, DType.FP32, (8,))
    with pytest.raises(ValueError, match="operands"):
        pack_tensor_params(ops.unary(npu.UnaryKind.RELU, r, r), [0x1000])


def test_the_default_stream_is_one_per_device_and_current_outside_with(
    default_device: npu.Device,
) -> None:
    s = npu.default_stream()
    assert s is npu.default_stream(default_device) is npu.current_stream()
    assert s.is_default and s.queue is None and not s.closed


def test_with_nests_and_restores_the_current_stream(default_device: npu.Device) -> None:
    outer, inner = npu.default_stream(), npu.Stream()
    with outer:
        with inner:
            assert npu.current_stream() is inner
        assert npu.current_stream() is outer
    assert npu.current_stream() is npu.default_stream()
    inner.close()


def test_the_current_stream_is_per_thread(default_device: npu.Device) -> None:
    other = npu.Stream(default_device)
    seen: list[npu.Stream] = []
    with other:
        t = threading.Thread(target=lambda: seen.append(npu.current_stream(default_device)))
        t.start()
        t.join()
    assert seen == [npu.default_stream(default_device)]
    other.close()


def test_work_on_the_default_stream_goes_through_submit(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    s = npu.default_stream()
    with default_device.alloc(4096) as src, default_device.alloc(4096) as dst:
        s.fill(src, 0x01020304, 4096)
        s.copy(dst, src, 4096)  # destination first
        fence = s.launch(ops.nop())
        assert fence == s.last_fence == driver.last_fence
        s.synchronize()
        assert s.query()
        assert (dst.numpy(np.uint32) == 0x01020304).all()
    assert [op.opcode for op in driver.submitted[-3:]] == [
        _abi.NPU_OP_FILL,
        _abi.NPU_OP_COPY,
        _abi.NPU_OP_NOP,
    ]


def test_closing_the_default_stream_does_nothing(default_device: npu.Device) -> None:
    s = npu.default_stream()
    s.close()
    assert not s.closed
    s.synchronize()


def test_an_event_recorded_on_the_default_stream_keeps_the_kernel_path(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    e = npu.Event(enable_timing=True)
    e.record(npu.default_stream())
    assert e.stream is None
    assert driver.submitted[-1].opcode == _abi.NPU_OP_NOP
    e.synchronize()
    assert e.query()


def test_the_default_stream_waiting_on_a_default_stream_event_needs_nothing(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    e = npu.Event()
    e.record()
    calls = len(driver.calls)
    npu.default_stream().wait_event(e)
    assert len(driver.calls) == calls
