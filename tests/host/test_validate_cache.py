"""npu.kernels.validate checks a tensor-op signature once, and a bad op every time."""

from __future__ import annotations

import pytest

from npu import _abi, ops
from npu.kernels import validate

D = _abi.DType


class Buf:
    def __init__(self, handle: int) -> None:
        self.handle, self.size = handle, 1 << 20


def add(handle: int, offset: int, out_shape: tuple[int, ...] = (4, 8)) -> ops.TensorOp:
    buf = Buf(handle)
    a = ops.tensor_ref(buf, D.FP32, (4, 8), offset=offset)
    out = ops.tensor_ref(buf, D.FP32, out_shape, offset=offset + 4096)
    return ops.TensorOp(_abi.Opcode.ELTWISE, int(_abi.EltwiseKind.ADD), (a, a, out), (buf,))


def test_a_signature_is_checked_once_whatever_its_handles_and_offsets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(validate, "_CHECKED", {})
    calls: list[ops.TensorOp] = []
    real = validate._check_tensor_op

    def counting(op: ops.TensorOp) -> None:
        calls.append(op)
        real(op)

    monkeypatch.setattr(validate, "_check_tensor_op", counting)
    for handle, offset in ((1, 0), (2, 512), (3, 1024)):
        validate.check_tensor_op(add(handle, offset))
    assert len(calls) == 1


def test_a_bad_op_is_refused_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validate, "_CHECKED", {})
    for _ in range(2):
        with pytest.raises(ValueError, match="does not broadcast"):
            validate.check_tensor_op(add(1, 0, out_shape=(4, 9)))


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validate, "_CHECKED", {})
    monkeypatch.setattr(validate, "_CHECKED_MAX", 3)
    for rows in range(1, 8):
        buf = Buf(1)
        t = ops.tensor_ref(buf, D.FP32, (rows,))
        validate.check_tensor_op(ops.TensorOp(_abi.Opcode.UNARY, 0, (t, t), (buf,)))
    assert len(validate._CHECKED) <= 3
