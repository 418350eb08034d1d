"""The tensor-op descriptors pack to the C layout, field by field."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from npu import _abi
from npu.kernels.descriptors import TensorOp, TensorRef


def by_fields(op: TensorOp) -> bytes:
    """The reference: ``struct npu_tensor_op`` filled through ctypes, field by field."""
    raw = _abi.NpuTensorOp()
    raw.opcode, raw.flags, raw.kind = int(op.opcode), 0, int(op.kind)
    for i, ref in enumerate(op.operands):
        t = raw.t[i]
        t.handle, t.dtype, t.offset, t.ndim = ref.handle, int(ref.dtype), ref.offset, ref.ndim
        for d, (dim, stride) in enumerate(zip(ref.shape, ref.strides, strict=True)):
            t.shape[d], t.strides[d] = dim, stride
    for i, value in enumerate(op.params):
        raw.params[i] = value
    return bytes(raw)


@pytest.mark.parametrize("seed", range(20))
def test_to_bytes_matches_the_ctypes_layout(seed: int) -> None:
    rng = np.random.default_rng(seed)
    refs = []
    for _ in range(int(rng.integers(1, _abi.NPU_TENSOR_OPERANDS + 1))):
        rank = int(rng.integers(1, _abi.NPU_MAX_RANK + 1))
        refs.append(
            TensorRef(
                int(rng.integers(1, 2**32)),
                _abi.DType(int(rng.integers(0, len(_abi.DType)))),
                int(rng.integers(0, 2**48)),
                tuple(int(v) for v in rng.integers(1, 60, rank)),
                tuple(int(v) for v in rng.integers(0, 1000, rank)),
            )
        )
    params = tuple(int(v) for v in rng.integers(0, 2**32, int(rng.integers(0, 13))))
    op = TensorOp(_abi.Opcode.ELTWISE, int(rng.integers(0, 6)), tuple(refs), (), params)
    assert len(op.to_bytes()) == ctypes.sizeof(_abi.NpuTensorOp)
    assert op.to_bytes() == by_fields(op)
    assert bytes(op.pack()) == by_fields(op)
