"""SELECT and CONVERT into a strided output on the device model, through qtest.

SELECT is checked bit for bit against ``np.where`` over every dtype, with
broadcasting and NaN payloads; a strided CONVERT against numpy's strided
assignment, with the bytes between its elements checked untouched. Bad
ops complete with ``BAD_ARGS`` and write nothing.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from qtest import hw, tensor_params
from qtest_tensor_ref import BF16, BOOL, FP16, FP32, INT8, INT32, SIZE, decode, encode, gather
from test_device_qtest_tensor import GUARD, HEAP, Operand, Rig, operand_from, rig, shared_npu

__all__ = ["rig", "shared_npu"]  # fixtures used here

DTYPES = {"fp32": FP32, "fp16": FP16, "bf16": BF16, "int8": INT8, "int32": INT32, "bool": BOOL}


def _bits(values: np.ndarray, dtype: int) -> bytes:
    return encode(values, dtype)


def _operand(rng: np.random.Generator, dt: int, shape: tuple[int, ...],
             strides: tuple[int, ...] | None = None) -> Operand:  # fmt: skip
    """A random input operand; BOOL ones hold 0, 1 and 2 (any nonzero byte is true)."""
    if dt != BOOL:
        return operand_from(rng, dt, shape, strides)
    op = Operand(BOOL, shape, strides)
    op.buf = rng.integers(0, 3, op.nbytes)
    return op


@pytest.mark.parametrize("dname", DTYPES)
def test_select_copies_the_chosen_element_for_every_dtype(rig: Rig, dname: str) -> None:
    dt = DTYPES[dname]
    rng = np.random.default_rng(5)
    cond = _operand(rng, BOOL, (3, 1, 5))
    x, y = _operand(rng, dt, (3, 4, 5)), _operand(rng, dt, (1, 4, 1))
    out = Operand(dt, (3, 4, 5))
    got = rig.run(hw.OP_SELECT, 0, [cond, x, y, out])
    want = np.where(
        gather(cond.buf, cond.shape, cond.strides) != 0,
        gather(x.buf, x.shape, x.strides),
        gather(y.buf, y.shape, y.strides),
    )
    # Compare the stored bytes: NaNs and signed zeros must pass unchanged.
    assert _bits(np.asarray(got), dt) == _bits(np.asarray(want), dt)


def test_select_keeps_a_nan_payload(rig: Rig) -> None:
    payload = struct.unpack("<f", struct.pack("<I", 0x7FC0_1234))[0]
    x = Operand(FP32, (4,))
    x.buf = np.array([payload, -0.0, np.inf, 1.0], np.float32)
    y = Operand(FP32, (4,))
    y.buf = np.zeros(4, np.float32)
    cond = Operand(BOOL, (4,))
    cond.buf = np.array([1, 1, 1, 0])
    out = Operand(FP32, (4,))
    rig.run(hw.OP_SELECT, 0, [cond, x, y, out])
    raw = rig.read(out.va, 16)
    assert raw == struct.pack("<IIII", 0x7FC0_1234, 0x8000_0000, 0x7F80_0000, 0)


@pytest.mark.parametrize(
    "shape,strides",
    [((3, 4), (10, 2)), ((2, 3, 4), (40, 1, 8)), ((4, 3), (1, 4)), ((5,), (3,))],
)
@pytest.mark.parametrize("pair", [(FP32, FP32), (FP32, FP16), (INT32, INT8), (FP16, INT32)])
def test_strided_convert_writes_only_its_elements(
    rig: Rig, shape: tuple[int, ...], strides: tuple[int, ...], pair: tuple[int, int]
) -> None:
    src_dt, dst_dt = pair
    rng = np.random.default_rng(7)
    x = operand_from(rng, src_dt, shape, specials=False)
    out = Operand(dst_dt, shape, strides)
    rig.place([x, out])
    block = tensor_params([x.desc(), out.desc()])
    assert rig.submit(hw.OP_CONVERT, 0, block) == hw.ST_OK
    raw = rig.read(out.va, out.nbytes + 64)
    # The reference: the same values through a contiguous CONVERT.
    dense = Operand(dst_dt, shape)
    dense.va = HEAP + 0x10_0000
    rig.write(dense.va, bytes([GUARD]) * dense.nbytes)
    assert rig.submit(hw.OP_CONVERT, 0, tensor_params([x.desc(), dense.desc()])) == hw.ST_OK
    want = decode(rig.read(dense.va, dense.nbytes), dst_dt, shape)
    size = SIZE[dst_dt]
    touched = set()
    for idx in np.ndindex(*shape):
        off = sum(i * s for i, s in zip(idx, strides, strict=True)) * size
        touched.update(range(off, off + size))
        elem = decode(raw[off : off + size], dst_dt, (1,))
        assert _bits(np.asarray(elem), dst_dt) == _bits(np.asarray(want[idx]).reshape(1), dst_dt)
    gaps = [raw[i] for i in range(len(raw)) if i not in touched]
    assert gaps == [GUARD] * len(gaps), "a strided CONVERT wrote between its elements"


@pytest.mark.parametrize(
    "opcode,operands",
    [
        # A strided output that overlaps itself.
        (hw.OP_CONVERT, [(FP32, (2, 3), None), (FP32, (2, 3), (2, 1))]),
        # A zero stride in the output.
        (hw.OP_CONVERT, [(FP32, (2, 3), None), (FP32, (2, 3), (3, 0))]),
        # Only CONVERT takes a strided output.
        (hw.OP_UNARY, [(FP32, (2, 3), None), (FP32, (2, 3), (6, 2))]),
        # SELECT: a non-BOOL condition; x of another dtype than out; no broadcast.
        (hw.OP_SELECT, [(FP32, (4,), None), (FP32, (4,), None), (FP32, (4,), None),
                        (FP32, (4,), None)]),
        (hw.OP_SELECT, [(BOOL, (4,), None), (FP16, (4,), None), (FP32, (4,), None),
                        (FP32, (4,), None)]),
        (hw.OP_SELECT, [(BOOL, (3,), None), (FP32, (4,), None), (FP32, (4,), None),
                        (FP32, (4,), None)]),
    ],
)  # fmt: skip
def test_bad_place_op_completes_with_bad_args_and_writes_nothing(
    rig: Rig, opcode: int, operands: list[tuple[int, tuple[int, ...], tuple[int, ...] | None]]
) -> None:
    rng = np.random.default_rng(9)
    ops = [_operand(rng, dt, shape, strides) for dt, shape, strides in operands[:-1]]
    dt, shape, strides = operands[-1]
    out = Operand(dt, shape, strides)
    rig.place([*ops, out])
    block = tensor_params([o.desc() for o in (*ops, out)])
    assert rig.submit(opcode, 0, block) == hw.ST_BAD_ARGS
    assert rig.read(out.va, out.nbytes) == bytes([GUARD]) * out.nbytes
