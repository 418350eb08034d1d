"""Helpers shared by the in-guest tensor tests (test_tensor_*.py).

A plain module, not a test file: pytest puts tests/guest on sys.path (the
directory has a conftest.py and no __init__.py), so ``import tensor_helpers``
resolves under the default import mode.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import math

import numpy as np
import pytest

import npu
from npu import _abi

D = npu.DType
PUBLIC = {D.FP32: np.float32, D.FP16: np.float16, D.BF16: npu.bfloat16, D.INT8: np.int8,
          D.INT32: np.int32}  # fmt: skip

# Accumulating ops (matmul, linear, conv2d): the device sums in float32 and
# rounds once, so results are within rtol * |want| + atol * magnitude.
ACC_RTOL = {D.FP32: 1e-5, D.FP16: 1e-3, D.BF16: 8e-3}
ACC_ATOL = {D.FP32: 1e-5, D.FP16: 1e-4, D.BF16: 1e-3}


def cap_device(cap):
    """Generator for a module fixture: device 0 as the default device, or skip
    the module when the device lacks ``cap``."""
    d = npu.open_device(0)
    if not d.info.has(cap):
        d.close()
        pytest.skip(f"the device has no NPU_CAP_{cap.name}")
    npu.set_default_device(d)
    try:
        yield d
    finally:
        npu.set_default_device(None)
        d.close()


def upload(x, dt):
    """(tensor of x in dt, float64 copy of the values the device holds)."""
    t = npu.tensor(x, dtype=PUBLIC[dt])
    return t, t.numpy().astype(np.float64)


def rnd(rng, shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


def act_ref(y, act):
    if act == "relu":
        return np.maximum(y, 0)
    if act == "gelu":
        erf = np.vectorize(math.erf, otypes=[np.float64])
        return y * (1 + erf(y / math.sqrt(2))) / 2
    return y


def check_acc(got, want, mag, dt, what=""):
    """got matches want within ACC_RTOL * |want| + ACC_ATOL * mag, element by element."""
    assert got.npu_dtype is dt, (what, got.dtype, dt)
    h = got.numpy().astype(np.float64)
    assert h.shape == want.shape, (what, h.shape, want.shape)
    err = np.abs(h - want)
    bound = ACC_RTOL[dt] * np.abs(want) + ACC_ATOL[dt] * mag + 1e-30
    bad = err > bound
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {bad.size} elements off, worst "
        f"{float(np.max(err - bound)):.3g} over the bound"
    )


# --------------------------------------------------------------------------
# Raw ioctls
# --------------------------------------------------------------------------


def raw_submit(fd: int, tops: list[_abi.NpuTensorOp]) -> int:
    arr = (_abi.NpuTensorOp * len(tops))(*tops)
    arg = _abi.NpuSubmit(ops_ptr=ctypes.addressof(arr), num_ops=len(tops), queue=0, flags=0,
                         op_size=ctypes.sizeof(_abi.NpuTensorOp))  # fmt: skip
    fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_SUBMIT, arg, True)
    return int(arg.fence)


def raw_wait(fd: int, fence: int) -> None:
    fcntl.ioctl(
        fd,
        _abi.DRM_IOCTL_NPU_WAIT,
        _abi.NpuWait(fence=fence, deadline_ns=_abi.deadline_after(10**10)),
        True,
    )


class Bo:
    def __init__(self, handle: int, size: int) -> None:
        self.handle, self.size = handle, size


def raw_bo(fd: int, size: int) -> tuple[int, Bo]:
    """(fd, a new BO of size bytes on fd), for a ``raw`` fixture."""
    arg = _abi.NpuBoCreate(size=size)
    fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg, True)
    return fd, Bo(arg.handle, size)


def mutations_not_rejected(fd: int, good_ops, bo, mutations) -> list[str]:
    """Submit each mutated op after a good one; describe every mutation the
    driver did not reject with EINVAL (an empty list means all were).

    ``good_ops(bo)`` builds fresh unmodified ops by name; ``mutations`` maps
    a case name to (op name, function mutating that op in place).
    """
    good = good_ops(bo)
    failures = []
    for name, (which, mutate) in mutations.items():
        op = good_ops(bo)[which]
        mutate(op)
        try:
            raw_submit(fd, [good[which], op])
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                failures.append(f"{name}: {errno.errorcode.get(exc.errno)} != EINVAL")
            continue
        failures.append(f"{name}: accepted")
    return failures
