"""The default stream's eager queue and the tensor layer's fast path, on the CPU backend.

Eager ops outside any stream are held back and submitted together (one
SUBMIT per batch); anything that needs them submitted flushes them; a batch
flushes by itself after a short time. An op of a signature seen before is
launched from its checked template, with the same descriptor the slow path
builds.
"""

from __future__ import annotations

import ctypes
import errno
import time

import numpy as np
import pytest

import npu
from npu import _abi, ops
from npu.core import eager as eager_module
from npu.core.eager import BATCH_MAX, FLUSH_S, eager_queue
from npu.core.stream import pack_tensor_params
from npu.hal import CpuBackend
from npu.kernels.template import Template


def ones(n: int = 8) -> npu.Tensor:
    return npu.tensor(np.ones(n, np.float32))


def submits(driver: CpuBackend) -> int:
    return sum(1 for call in driver.calls if call.name == "submit")


def test_eager_ops_are_held_back_and_go_in_one_submit_at_a_host_read(
    default_device: npu.Device, driver: CpuBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eager_module, "FLUSH_S", 60.0)  # no timer flush meanwhile
    x = ones()
    before = submits(driver)
    y = x
    for _ in range(10):
        y = y + x
    assert submits(driver) == before
    np.testing.assert_array_equal(y.numpy(), np.full(8, 11, np.float32))
    assert submits(driver) == before + 1
    assert driver.submits[-1] == (ctypes.sizeof(_abi.NpuTensorOp), 10)


def test_a_full_batch_is_submitted_without_a_synchronisation(
    default_device: npu.Device, driver: CpuBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eager_module, "FLUSH_S", 60.0)  # no timer flush meanwhile
    x = ones()
    before = submits(driver)
    kept = [x * 2 for _ in range(BATCH_MAX)]
    assert submits(driver) == before + 1
    assert driver.submits[-1][1] == BATCH_MAX
    assert all((t.numpy() == 2).all() for t in kept[:3])


def test_a_batch_is_submitted_by_itself_after_a_short_time(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    x = ones()
    before = submits(driver)
    y = npu.exp(x)
    deadline = time.monotonic() + 10.0  # FLUSH_S, on a loaded machine
    while submits(driver) == before and time.monotonic() < deadline:
        time.sleep(FLUSH_S)
    assert submits(driver) == before + 1, "the flusher thread submitted the batch"
    np.testing.assert_allclose(y.numpy(), np.exp(np.ones(8)), rtol=1e-6)


def test_a_raw_submit_goes_after_the_eager_ops_held_back(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    x = ones()
    y = x + x
    default_device.submit([ops.nop()])
    assert [call.args[1] for call in driver.calls if call.name == "submit"][-2:] == [1, 1]
    assert driver.submitted_tensor[-1].opcode == _abi.NPU_OP_ELTWISE
    assert driver.submitted[-1].opcode == _abi.NPU_OP_NOP
    assert (y.numpy() == 2).all()


def test_closing_the_device_submits_the_ops_held_back(driver: CpuBackend) -> None:
    dev = npu.Device(driver)
    x = npu.tensor(np.ones(4, np.float32), device=dev)
    x + x
    before = submits(driver)
    dev.close()
    assert submits(driver) == before + 1


def test_a_device_error_of_an_eager_op_names_it_with_the_queue_fence(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    x = ones()
    a = x + x
    driver.fail_opcode[_abi.NPU_OP_UNARY] = _abi.NPU_ST_BAD_ARGS
    b = npu.relu(a)
    with pytest.raises(npu.NpuDeviceError) as info:
        b.wait()
    assert info.value.fence == eager_queue(default_device).last_fence
    assert info.value.status == _abi.NPU_ST_BAD_ARGS
    assert "UNARY.RELU" in str(info.value)
    assert "default stream fence" in str(info.value)


def test_a_batch_the_driver_refuses_raises_at_each_wait_of_its_ops(
    default_device: npu.Device, driver: CpuBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eager_module, "FLUSH_S", 60.0)  # both ops in one batch
    x = ones()

    def refuse(*args: object) -> int:
        raise OSError(errno.EBADFD, "file faulted")

    monkeypatch.setattr(driver, "submit", refuse)
    a, b = x + x, x * x
    with pytest.raises(npu.NpuError) as first:
        a.wait()  # submits the batch: the refusal names its ops
    assert first.value.errno == errno.EBADFD and "ELTWISE.ADD" in str(first.value)
    with pytest.raises(npu.NpuError) as again:
        b.wait()
    assert again.value.errno == errno.EBADFD
    assert "default stream fence" in str(again.value)


def test_waiting_for_a_fence_never_launched_is_einval(default_device: npu.Device) -> None:
    eager = eager_queue(default_device)
    with pytest.raises(npu.NpuError) as info:
        eager.wait(eager.last_fence + 1)
    assert info.value.errno == errno.EINVAL


def test_a_view_written_by_the_device_is_seen_by_a_read_of_its_base(
    default_device: npu.Device,
) -> None:
    t = npu.tensor(np.zeros((3, 4), np.float32))
    t[1, 1:3] = npu.tensor(np.array([5, 6], np.float32))  # a device COPY into a view
    want = np.zeros((3, 4), np.float32)
    want[1, 1:3] = [5, 6]
    np.testing.assert_array_equal(t.numpy(), want)


# -- templates ------------------------------------------------------------------


def ref(handle: int, shape: tuple[int, ...], offset: int = 0) -> ops.TensorRef:
    return ops.TensorRef(
        handle, _abi.DType.FP32, offset, shape, (shape[1], 1) if len(shape) > 1 else (1,)
    )


def test_a_template_patches_the_same_descriptor_the_op_packs() -> None:
    op = ops.eltwise(_abi.EltwiseKind.MUL, ref(1, (2, 8)), ref(2, (2, 8)), ref(3, (2, 8)))
    template = Template(op)
    other = ops.eltwise(
        _abi.EltwiseKind.MUL, ref(7, (2, 8), 64), ref(8, (2, 8), 128), ref(9, (2, 8), 4096)
    )
    assert template.record((7, 8, 9), (64, 128, 4096)) == other.to_bytes()
    batch = bytearray(b"head")
    template.append_record(batch, (7, 8, 9), (64, 128, 4096))
    assert bytes(batch) == b"head" + other.to_bytes()
    vas = (0x1000_0040, 0x2000_0080, 0x3000_1000)
    assert template.block(vas) == pack_tensor_params(other, vas)
    arena = memoryview(bytearray(1024))
    template.write_block(arena, 512, vas)
    assert bytes(arena[512:768]) == pack_tensor_params(other, vas)
    assert not any(arena[:512]) and not any(arena[768:])
    assert template.bind((7, 8, 9), (64, 128, 4096)) == other


def test_a_template_refuses_an_op_the_checks_refuse() -> None:
    bad = ops.TensorOp(_abi.Opcode.ELTWISE, 99, (ref(1, (4,)), ref(2, (4,)), ref(3, (4,))))
    with pytest.raises(ValueError):
        Template(bad)


def test_the_second_op_of_a_signature_builds_no_op_object(
    default_device: npu.Device, driver: CpuBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, y = ones(16), ones(16)
    first = x - y
    built: list[object] = []
    real = ops.eltwise

    def counting(*args: object, **kwargs: object) -> ops.TensorOp:
        op = real(*args, **kwargs)  # type: ignore[arg-type]
        built.append(op)
        return op

    monkeypatch.setattr(ops, "eltwise", counting)
    second = x - y
    assert built == []
    default_device.flush_deferred()
    a, b = driver.submitted_tensor[-2:]
    assert bytes(a)[:8] == bytes(b)[:8]  # opcode and kind
    assert a.t[2].handle == b.t[2].handle and a.t[2].offset != b.t[2].offset
    assert (first.numpy() == 0).all() and (second.numpy() == 0).all()


def test_the_fast_path_checks_that_an_operand_buffer_is_live(
    default_device: npu.Device,
) -> None:
    buf = default_device.alloc(64)
    t = npu.Tensor(default_device, buf, _abi.DType.FP32, (16,))
    (t + t).wait()  # the plan of this signature exists now
    buf.free()
    with pytest.raises(npu.NpuError) as info:
        t + t
    assert info.value.errno == errno.EBADF


def test_many_in_place_writes_keep_one_range_per_timeline(default_device: npu.Device) -> None:
    from npu.tensors import tensor as tensor_module

    t = npu.tensor(np.zeros(8, np.float32))
    for _ in range(50):
        t += 1
    writes = [w for _, w in tensor_module._aliased_writes.values()]
    assert all(len(w) == 1 for w in writes)
    np.testing.assert_array_equal(t.numpy(), np.full(8, 50, np.float32))


def test_a_plan_made_on_one_device_launches_on_another_with_its_buffers() -> None:
    with npu.Device("cpu") as a, npu.Device("cpu") as b:
        for dev, value in ((a, 2.0), (b, 3.0), (a, 4.0)):
            x = npu.tensor(np.full(32, value, np.float32), device=dev)
            got = (x * x).numpy()
            np.testing.assert_array_equal(got, np.full(32, value * value, np.float32))


@pytest.mark.parametrize(
    "data,count",
    [(b"", 0), (bytes(ctypes.sizeof(_abi.NpuTensorOp)), 2), (b"\0" * 7, 1)],
    ids=["no-records", "fewer-bytes-than-records", "not-a-record"],
)
def test_submit_records_refuses_bytes_that_are_not_count_records(
    device: npu.Device, driver: CpuBackend, data: bytes, count: int
) -> None:
    before = submits(driver)
    with pytest.raises(ValueError, match="records"):
        device.submit_records(data, count, True, [None] * count)
    assert submits(driver) == before
