"""npu.Tensor and the tensor ops, end to end against the CPU backend.

Covers the pieces that need no device: dtype promotion, bfloat16 conversion,
broadcast/stride computation, packing of struct npu_tensor_op, the Python
mirror of npu_tensor_op_check (cross-checked against the C header), the
splitting of mixed SUBMITs, and every op through CpuBackend, which executes
tensor ops with numpy.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import npu
from npu import _abi, ops
from npu.dtypes import promote
from npu.hal import CpuBackend

REPO = Path(__file__).resolve().parents[2]
D = npu.DType
ALL = [D.FP32, D.FP16, D.BF16, D.INT8, D.INT32]
NP_OF = {D.FP32: np.float32, D.FP16: np.float16, D.INT8: np.int8, D.INT32: np.int32}
PUBLIC: dict[D, Any] = {D.FP32: np.float32, D.FP16: np.float16, D.BF16: npu.bfloat16,
                        D.INT8: np.int8, D.INT32: np.int32}  # fmt: skip
pytestmark = pytest.mark.usefixtures("default_device")


def host(dt: D, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``x`` rounded to ``dt`` and back to float64 (what the device reads)."""
    if dt is D.BF16:
        return npu.bf16_to_float32(npu.float32_to_bf16(x)).astype(np.float64)
    return x.astype(PUBLIC[dt]).astype(np.float64)


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)


def waits(driver: CpuBackend) -> int:
    return [call.name for call in driver.calls].count("wait")


def flush() -> None:
    """Submit the default device's eager batch: what a test of the submitted ops reads."""
    npu.default_device().flush_deferred()


# -- dtypes and promotion ------------------------------------------------------


@pytest.mark.parametrize(("a", "b"), list(itertools.product(ALL, ALL)))
def test_promotion_is_numpy_result_type_with_float64_as_float32(a: D, b: D) -> None:
    got = promote(a, b)
    assert got is promote(b, a)
    if D.BF16 in (a, b):
        # bf16 behaves like fp16 would, with fp16 itself as a "wider" partner.
        other = b if a is D.BF16 else a
        want = {D.BF16: D.BF16, D.INT8: D.BF16, D.FP16: D.FP32, D.FP32: D.FP32, D.INT32: D.FP32}
        assert got is want[other]
        return
    numpy = np.result_type(NP_OF[a], NP_OF[b])
    numpy = np.dtype(np.float32) if numpy == np.float64 else numpy
    assert NP_OF[got] == numpy


def test_result_type_accepts_numpy_dtypes_and_the_bfloat16_marker() -> None:
    assert npu.result_type(np.int8, np.int32) == np.int32
    assert npu.result_type(npu.bfloat16, "bf16") is npu.bfloat16
    assert npu.result_type(npu.bfloat16, np.float16) == np.float32
    with pytest.raises(TypeError, match="unsupported"):
        npu.result_type(np.float64, np.float32)


def test_bfloat16_is_a_singleton_marker() -> None:
    import pickle

    assert npu.BFloat16Type() is npu.bfloat16
    assert pickle.loads(pickle.dumps(npu.bfloat16)) is npu.bfloat16
    assert repr(npu.bfloat16) == "npu.bfloat16"


# -- bfloat16 conversion -------------------------------------------------------


def test_bf16_round_trip_is_exact_for_representable_values() -> None:
    bits = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)
    f = npu.bf16_to_float32(bits)
    finite = np.isfinite(f)
    assert np.array_equal(npu.float32_to_bf16(f[finite]), bits[finite])


def test_float32_to_bf16_rounds_to_nearest_even() -> None:
    one = 0x3F80
    cases = {
        0x3F808000: one,  # exactly half: to even (0x3F80)
        0x3F818000: one + 2,  # half, odd below: up to even
        0x3F808001: one + 1,  # above half: up
        0x3F807FFF: one,  # below half: down
    }
    words = np.array(list(cases), dtype=np.uint32).view(np.float32)
    assert npu.float32_to_bf16(words).tolist() == list(cases.values())


def test_float32_to_bf16_keeps_nan_and_inf() -> None:
    out = npu.bf16_to_float32(npu.float32_to_bf16([np.nan, np.inf, -np.inf, 3.0e38]))
    assert np.isnan(out[0])
    assert out[1] == np.inf and out[2] == -np.inf
    assert out[3] == np.inf or out[3] > 3e38  # rounds up past bf16 max to inf


# -- TensorRef, TensorOp packing, check_tensor_op -----------------------------


class FakeBuf:
    def __init__(self, handle: int, size: int) -> None:
        self.handle, self.size = handle, size


def test_tensor_ref_defaults_to_row_major_and_packs_zero_unused_dims() -> None:
    ref = ops.tensor_ref(FakeBuf(7, 4096), D.FP16, (2, 3, 4), offset=8)
    assert ref.strides == (12, 4, 1)
    raw = ref.pack()
    assert (raw.handle, raw.dtype, raw.offset, raw.ndim) == (7, _abi.NPU_DTYPE_FP16, 8, 3)
    assert list(raw.shape) == [2, 3, 4, 0] and list(raw.strides) == [12, 4, 1, 0]
    assert raw.rsvd == 0 and raw.rsvd2 == 0
    assert ref.extent == 24 * 2


def test_tensor_ref_rejects_an_extent_past_the_buffer() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        ops.tensor_ref(FakeBuf(1, 100), D.FP32, (5, 6))


@pytest.mark.parametrize(
    ("shape", "strides", "match"),
    [
        ((), (), "rank 0"),
        ((1, 1, 1, 1, 1), (1, 1, 1, 1, 1), "rank 5"),
        ((0,), (1,), r"shape\[0\]"),
        ((2,), (1 << 31,), r"strides\[0\]"),
        ((1 << 15, 1 << 14), (1 << 14, 1), "NPU_MAX_ELEMS"),
    ],
)
def test_tensor_ref_rejects_what_npu_tensor_check_rejects(
    shape: tuple[int, ...], strides: tuple[int, ...], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        ops.TensorRef(1, D.FP32, 0, shape, strides)


def test_eltwise_packs_a_b_out_and_zero_params() -> None:
    buf = FakeBuf(3, 1 << 16)
    a = ops.tensor_ref(buf, D.INT32, (4, 1), strides=(1, 0))
    b = ops.tensor_ref(buf, D.INT32, (1, 5), strides=(0, 1), offset=64)
    out = ops.tensor_ref(buf, D.INT32, (4, 5), offset=128)
    raw = ops.eltwise(npu.EltwiseKind.MAX, a, b, out).pack()
    assert ctypes.sizeof(raw) == 320
    assert (raw.opcode, raw.flags, raw.kind, raw.rsvd) == (_abi.NPU_OP_ELTWISE, 0, 4, 0)
    assert [raw.t[i].offset for i in range(3)] == [0, 64, 128]
    assert bytes(raw.t[3]) == bytes(64)
    assert list(raw.params) == [0] * 12


def test_check_tensor_op_rejects_the_header_rules() -> None:
    buf = FakeBuf(1, 1 << 16)
    f = ops.tensor_ref(buf, D.FP32, (2, 3))
    i = ops.tensor_ref(buf, D.INT32, (2, 3))
    transposed = ops.tensor_ref(buf, D.FP32, (3, 2), strides=(1, 3))
    with pytest.raises(ValueError, match="contiguous"):
        ops.unary(npu.UnaryKind.RELU, ops.tensor_ref(buf, D.FP32, (3, 2)), transposed)
    with pytest.raises(ValueError, match="dtype"):
        ops.eltwise(npu.EltwiseKind.ADD, f, i, f)
    with pytest.raises(ValueError, match="broadcast"):
        ops.eltwise(npu.EltwiseKind.ADD, f, transposed, f)
    with pytest.raises(ValueError, match="DIV"):
        ops.eltwise(npu.EltwiseKind.DIV, i, i, i)
    with pytest.raises(ValueError, match="float dtypes only"):
        ops.unary(npu.UnaryKind.EXP, i, i)
    with pytest.raises(ValueError, match="same shape"):
        ops.convert(f, ops.tensor_ref(buf, D.INT8, (6,)))
    ops.convert(transposed, ops.tensor_ref(buf, D.BF16, (3, 2)))  # any strides and dtypes in


def _c_check(params: list[tuple[int, int, bytes]]) -> list[int]:
    """npu_tensor_op_check of (opcode, kind, npu_tensor_params bytes), compiled from the header."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is not installed (scripts/deps.sh installs build-essential)")
    src = r"""
#include <stdio.h>
#include <linux/types.h>
#include "npu_tensor.h"
int main(void) {
    unsigned opcode, kind;
    struct npu_tensor_params p;
    while (fread(&opcode, 4, 1, stdin) == 1 && fread(&kind, 4, 1, stdin) == 1 &&
           fread(&p, sizeof(p), 1, stdin) == 1)
        printf("%u\n", npu_tensor_op_check(opcode, kind, &p));
    return 0;
}
"""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        c, exe = Path(tmp) / "check.c", Path(tmp) / "check"
        c.write_text(src)
        subprocess.run(
            [gcc, "-std=gnu11", "-Wall", "-I", str(REPO / "include"), "-o", str(exe), str(c)],
            check=True,
            capture_output=True,
        )
        stdin = b"".join(
            np.array([op, kind], dtype=np.uint32).tobytes() + raw for op, kind, raw in params
        )
        out = subprocess.run([str(exe)], input=stdin, check=True, capture_output=True).stdout
    return [int(line) for line in out.split()]


def _as_params(op: ops.TensorOp) -> bytes:
    p = _abi.NpuTensorParams()
    for i, ref in enumerate(op.operands):
        p.t[i].va = 0x100000 + ref.offset
        p.t[i].dtype = int(ref.dtype)
        p.t[i].ndim = ref.ndim
        for d in range(ref.ndim):
            p.t[i].shape[d] = ref.shape[d]
            p.t[i].strides[d] = ref.strides[d]
    for i, value in enumerate(op.params):
        p.params[i] = value
    return bytes(p)


def test_python_check_agrees_with_npu_tensor_op_check_of_the_header() -> None:
    buf = FakeBuf(1, 1 << 20)
    shapes = [((2, 3), None), ((3, 2), (1, 3)), ((1, 3), (0, 1)), ((2, 1), (1, 0)), ((6,), None)]
    refs = [ops.tensor_ref(buf, dt, s, st) for dt in (D.FP32, D.INT8, D.BF16) for s, st in shapes]
    candidates: list[ops.TensorOp] = []
    for a, b, out in itertools.product(refs, refs[:6], refs):
        for kind in (npu.EltwiseKind.ADD, npu.EltwiseKind.DIV):
            candidates.append(ops.TensorOp(npu.Opcode.ELTWISE, int(kind), (a, b, out)))
    for a, out in itertools.product(refs, refs):
        for ukind in (npu.UnaryKind.RELU, npu.UnaryKind.SQRT):
            candidates.append(ops.TensorOp(npu.Opcode.UNARY, int(ukind), (a, out)))
        candidates.append(ops.TensorOp(npu.Opcode.CONVERT, 0, (a, out)))
    python_ok = []
    for op in candidates:
        try:
            ops.check_tensor_op(op)
            python_ok.append(True)
        except ValueError:
            python_ok.append(False)
    statuses = _c_check([(int(op.opcode), op.kind, _as_params(op)) for op in candidates])
    assert [st == _abi.NPU_ST_OK for st in statuses] == python_ok
    assert any(python_ok) and not all(python_ok)


# -- Device.submit splitting -------------------------------------------------------


def test_submit_splits_mixed_op_kinds_into_consecutive_submits(
    device: npu.Device, driver: CpuBackend
) -> None:
    buf = device.alloc(256)
    ref = ops.tensor_ref(buf, D.FP32, (8,))
    out = ops.tensor_ref(buf, D.FP32, (8,), offset=64)
    t_op = ops.unary(npu.UnaryKind.ABS, ref, out, (buf,))
    fence = device.submit([ops.nop(), ops.nop(), t_op, t_op, ops.nop(), t_op])
    tsize, vsize = ctypes.sizeof(_abi.NpuTensorOp), ctypes.sizeof(_abi.NpuOp)
    flush()
    assert driver.submits == [(vsize, 2), (tsize, 2), (vsize, 1), (tsize, 1)]
    assert fence == 6
    device.wait(fence)


def test_device_error_of_a_tensor_op_names_the_op(device: npu.Device, driver: CpuBackend) -> None:
    driver.fail_opcode[_abi.NPU_OP_UNARY] = _abi.NPU_ST_BAD_ARGS
    t = npu.relu(npu.tensor([1.0, -1.0]))
    with pytest.raises(npu.NpuDeviceError) as info:
        t.numpy()
    assert isinstance(info.value.op, ops.TensorOp)
    assert "UNARY.RELU" in str(info.value)
    # The failure stays attached to every tensor computed from it.
    u = t + 1
    with pytest.raises(npu.NpuDeviceError):
        t.numpy()
    with pytest.raises(npu.NpuDeviceError):
        u.numpy()


# -- upload, download, dtypes ----------------------------------------------------


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (np.ones(3, np.float32), np.float32),
        (np.ones(3, np.float16), np.float16),
        (np.ones(3, np.int8), np.int8),
        (np.ones(3, np.int32), np.int32),
        (np.ones(3), np.float32),  # float64 narrowed
        ([1, 2, 3], np.int32),  # int64 narrowed
        (np.array([True, False]), np.bool_),
        (np.arange(3, dtype=np.uint16), np.int32),
        (2.5, np.float32),
    ],
)
def test_tensor_infers_a_supported_dtype(data: Any, want: Any) -> None:
    t = npu.tensor(data)
    assert t.dtype == want
    np.testing.assert_array_equal(t.numpy(), np.asarray(data).astype(want))


def test_tensor_rejects_unsupported_data() -> None:
    with pytest.raises(TypeError):
        npu.tensor(np.ones(2, np.complex64))
    with pytest.raises(TypeError):
        npu.tensor([1.0], dtype=np.float64)
    with pytest.raises(ValueError, match="int32"):
        npu.tensor(np.array([2**40]))
    with pytest.raises(ValueError, match="rank 5"):
        npu.tensor(np.zeros((1, 1, 1, 1, 2)))


def test_bf16_tensor_stores_words_and_downloads_float32() -> None:
    x = np.array([1.0, -2.5, 3.140625, 1e-3], dtype=np.float32)
    t = npu.tensor(x, dtype=npu.bfloat16)
    assert t.dtype is npu.bfloat16 and t.itemsize == 2
    assert t.buffer is not None
    assert np.array_equal(t.buffer.numpy(np.uint16, 4, t.offset * 2), npu.float32_to_bf16(x))
    got = t.numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, x, rtol=2**-8)


def test_rank0_tensor_is_stored_as_shape_1() -> None:
    t = npu.tensor(np.float32(3.5))
    assert (t.shape, t.ndim, t.size) == ((), 0, 1)
    assert t.item() == 3.5 and float(t) == 3.5
    ref = t.tensor_ref()
    assert (ref.shape, ref.strides) == ((1,), (0,))
    r = t * 2
    assert r.shape == () and r.numpy() == np.float32(7.0)


def test_array_protocol_and_repr() -> None:
    t = npu.tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert np.asarray(t).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert np.asarray(t, dtype=np.float32).dtype == np.float32
    assert repr(t).startswith("tensor([[0, 1, 2],") and len(t) == 2


# -- ops against numpy ------------------------------------------------------------

BINARY = {
    "add": (npu.add, np.add),
    "subtract": (npu.subtract, np.subtract),
    "multiply": (npu.multiply, np.multiply),
    "divide": (npu.divide, np.divide),
    "maximum": (npu.maximum, np.maximum),
    "minimum": (npu.minimum, np.minimum),
}


def _data(dt: D, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    if dt.is_float:
        return rng.uniform(0.5, 4, shape).astype(np.float32)
    return rng.integers(1, 10, shape).astype(np.int32)


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("dt", ALL)
def test_binary_op_matches_numpy(name: str, dt: D) -> None:
    fn, ref = BINARY[name]
    rng = np.random.default_rng(1)
    x, y = _data(dt, (3, 4), rng), _data(dt, (3, 4), rng)
    got = fn(npu.tensor(x, dtype=dt), npu.tensor(y, dtype=dt))
    want_dt = D.FP32 if name == "divide" and not dt.is_float else dt
    assert got.npu_dtype is want_dt
    tol = {D.FP32: 1e-6, D.FP16: 1e-3, D.BF16: 1e-2}.get(want_dt, 0)
    xs = npu.tensor(x, dtype=dt).numpy().astype(np.float64)
    ys = npu.tensor(y, dtype=dt).numpy().astype(np.float64)
    np.testing.assert_allclose(got.numpy(), ref(xs, ys), rtol=tol)


UNARY = {
    "relu": (npu.relu, lambda x: np.maximum(x, 0)),
    "gelu": (npu.gelu, None),
    "sigmoid": (npu.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "tanh": (npu.tanh, np.tanh),
    "exp": (npu.exp, np.exp),
    "log": (npu.log, np.log),
    "sqrt": (npu.sqrt, np.sqrt),
    "abs": (npu.abs, np.abs),
    "negative": (npu.negative, np.negative),
}


@pytest.mark.parametrize("name", list(UNARY))
@pytest.mark.parametrize("dt", [D.FP32, D.INT8, D.INT32])
def test_unary_op_promotes_integers_like_numpy(name: str, dt: D) -> None:
    fn, ref = UNARY[name]
    x = np.array([1, 2, 3], dtype=NP_OF[dt])
    got = fn(npu.tensor(x))
    if name in ("relu", "abs", "negative") or ref is None:
        want_dtype = np.dtype(NP_OF[dt]) if name != "gelu" or dt is D.FP32 else None
        if want_dtype is not None:
            assert got.dtype == want_dtype
        if ref is None:
            return
    else:
        numpy_dt = ref(x).dtype
        assert got.dtype == (np.float32 if numpy_dt == np.float64 else numpy_dt)
    np.testing.assert_allclose(got.numpy(), ref(x.astype(np.float64)), rtol=1e-3)


def test_operators_and_reflected_operators() -> None:
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    t = npu.tensor(x)
    cases = [
        (t + 1, x + 1),
        (1 + t, 1 + x),
        (t - x, x - x),
        (x - t, x - x),
        (2 * t, 2 * x),
        (t / 2, x / 2),
        (1 / t, 1 / x),
        (-t, -x),
        (abs(-t), x),
        (np.float32(3) - t, 3 - x),
    ]
    for got, want in cases:
        assert isinstance(got, npu.Tensor)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_python_scalars_are_weak_and_numpy_values_strong() -> None:
    i8 = npu.tensor(np.array([1, 2], np.int8))
    assert (i8 + 3).dtype == np.int8
    assert (i8 + 2.5).dtype == np.float32
    assert (i8 + np.int32(1)).dtype == np.int32
    assert (npu.tensor(np.ones(2, np.float16)) * 2.0).dtype == np.float16
    assert (i8 / 2).dtype == np.float32
    with pytest.raises(OverflowError):
        i8 + 300


@pytest.mark.parametrize(
    ("sa", "sb"),
    [
        ((3, 4), (4,)),
        ((3, 1), (1, 4)),
        ((2, 1, 4), (3, 1)),
        ((1,), (2, 3, 4, 5)),
        ((), (2, 3)),
        ((5, 1, 1, 2), (1, 3, 4, 1)),
    ],
)
def test_broadcasting_matches_numpy(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    np.testing.assert_allclose((npu.tensor(a) * npu.tensor(b)).numpy(), a * b, rtol=1e-6)
    np.testing.assert_allclose((npu.tensor(b) - npu.tensor(a)).numpy(), b - a, rtol=1e-6)


def test_broadcast_operand_gets_leading_ones_and_zero_strides(driver: CpuBackend) -> None:
    a = npu.tensor(np.ones((4,), np.float32))
    b = npu.tensor(np.ones((2, 3, 1), np.float32))
    (a + b).numpy()
    flush()
    op = driver.submitted_tensor[-1]
    shapes = [list(op.t[i].shape) for i in range(3)]
    strides = [list(op.t[i].strides) for i in range(3)]
    assert shapes == [[1, 1, 4, 0], [2, 3, 1, 0], [2, 3, 4, 0]]
    assert strides == [[0, 0, 1, 0], [3, 1, 0, 0], [12, 4, 1, 0]]


def test_incompatible_shapes_raise_value_error() -> None:
    with pytest.raises(ValueError, match="broadcast"):
        npu.tensor(np.ones((2, 3))) + npu.tensor(np.ones((4,)))


def test_promotion_inserts_convert_ops_before_the_op(driver: CpuBackend) -> None:
    a = npu.tensor(np.array([1, 2, 3], np.int8))
    b = npu.tensor(np.array([0.5, 0.25, 2], np.float16))
    r = a * b
    assert r.dtype == np.float16
    flush()
    assert [op.opcode for op in driver.submitted_tensor[-2:]] == [
        _abi.NPU_OP_CONVERT,
        _abi.NPU_OP_ELTWISE,
    ]
    np.testing.assert_allclose(r.numpy(), [0.5, 0.5, 6])


# -- views, conversions, chains -----------------------------------------------------


def test_transpose_is_a_free_view_and_contiguous_materialises(driver: CpuBackend) -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = npu.tensor(x)
    flush()
    before = len(driver.submitted_tensor)
    v = t.transpose(2, 0, 1)
    assert v.strides == (1, 12, 4) and v.buffer is t.buffer
    flush()
    assert len(driver.submitted_tensor) == before
    np.testing.assert_array_equal(v.numpy(), x.transpose(2, 0, 1))
    np.testing.assert_array_equal(t.T.numpy(), x.T)
    c = v.contiguous()
    flush()
    assert c.is_contiguous and len(driver.submitted_tensor) == before + 1
    np.testing.assert_array_equal(c.numpy(), x.transpose(2, 0, 1))
    np.testing.assert_array_equal(npu.permute(t, (1, 2, 0)).numpy(), x.transpose(1, 2, 0))
    np.testing.assert_array_equal((v + 1).numpy(), x.transpose(2, 0, 1) + 1)
    with pytest.raises(ValueError, match="permutation"):
        t.transpose(0, 0, 1)


def test_reshape_views_contiguous_and_copies_strided_tensors() -> None:
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    t = npu.tensor(x)
    r = t.reshape(2, -1)
    assert r.buffer is t.buffer and r.shape == (2, 6)
    np.testing.assert_array_equal(t.T.reshape(12).numpy(), x.T.reshape(12))
    with pytest.raises(ValueError, match="reshape"):
        t.reshape(5, 3)


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(ALL, ALL)))
def test_astype_between_all_dtypes(src: D, dst: D) -> None:
    x = np.array([-3.75, -1.5, 0.0, 2.25, 100.5], np.float32)
    t = npu.tensor(x, dtype=src)
    host = t.numpy().astype(np.float64)
    got = t.astype(dst).numpy()
    want = host if dst.is_float else np.trunc(host)
    np.testing.assert_allclose(got, want, rtol=1e-2)


def test_float_to_int_saturates_and_truncates_toward_zero() -> None:
    t = npu.tensor(np.array([-1e9, -2.9, 2.9, 1e9, 300], np.float32))
    assert t.to(np.int8).numpy().tolist() == [-128, -2, 2, 127, 127]
    assert t.to(np.int32).numpy().tolist() == [-(10**9), -2, 2, 10**9, 300]


def test_a_chain_of_ops_waits_only_once(driver: CpuBackend) -> None:
    x = np.linspace(0.5, 2, 16, dtype=np.float32).reshape(4, 4)
    t = npu.tensor(x)
    before = waits(driver)
    r = npu.sqrt(npu.exp(npu.relu(t * 2 - 1)) + t.T) / 3
    r = npu.maximum(r, 0.5).astype(npu.bfloat16).astype(np.float32)
    assert waits(driver) == before and r.fence is not None
    want = np.maximum(np.sqrt(np.exp(np.maximum(x * 2 - 1, 0)) + x.T) / 3, 0.5)
    np.testing.assert_allclose(r.numpy(), want, rtol=1e-2)
    assert waits(driver) == before + 1 and r.fence is None


def test_empty_tensors_never_reach_the_device(driver: CpuBackend) -> None:
    before = len(driver.calls)
    e = npu.tensor(np.zeros((0, 3), np.float32))
    assert e.buffer is None and e.shape == (0, 3)
    r = npu.exp(e + e).astype(np.int8)
    assert r.shape == (0, 3) and r.dtype == np.int8
    assert r.numpy().shape == (0, 3)
    assert (e * npu.tensor(np.ones(3, np.float32))).shape == (0, 3)
    bo_creates = [call.name for call in driver.calls[before:]].count("bo_create")
    assert bo_creates == 1  # only the ones(3) operand


def test_matmul_on_tensors_without_cap_matmul_uses_gemm_transpose_flags() -> None:
    driver = CpuBackend(caps=0x1F | _abi.NPU_INFO_CAP_TENSOR, record=True)
    dev = npu.Device(driver)
    npu.set_default_device(dev)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal((4, 3)).astype(np.float32)
    ta, tb = npu.tensor(a), npu.tensor(b)
    c = npu.matmul(ta, tb.T)
    assert isinstance(c, npu.Tensor) and c.shape == (5, 4)
    flush()
    gemm = driver.submitted[-1]
    assert gemm.opcode == _abi.NPU_OP_GEMM and gemm.params[7] == _abi.NPU_GEMM_TRANS_B
    np.testing.assert_allclose(c.numpy(), a @ b.T, rtol=1e-5)
    np.testing.assert_allclose((ta.T @ ta).numpy(), a.T @ a, rtol=1e-5)
    np.testing.assert_allclose(npu.matmul(a, tb.T).numpy(), a @ b.T, rtol=1e-5)
    i8 = npu.tensor(np.ones((2, 3), np.int8))
    np.testing.assert_allclose((i8 @ ta.T).numpy(), np.ones((2, 3)) @ a.T, rtol=1e-5)
    assert isinstance(npu.matmul(a, b.T), np.ndarray)
    with pytest.raises(ValueError, match="no MATMUL"):
        npu.matmul(npu.tensor(np.ones((2, 2, 2), np.float32)), ta.T)
    npu.set_default_device(None)
    dev.close()


def test_matmul_on_tensors_handles_empty_dims() -> None:
    z = npu.matmul(npu.tensor(np.ones((2, 0), np.float32)), np.ones((0, 3), np.float32))
    np.testing.assert_array_equal(z.numpy(), np.zeros((2, 3)))
    assert npu.matmul(npu.tensor(np.ones((0, 2), np.float32)), np.ones((2, 3))).shape == (0, 3)


def test_driver_refusal_is_an_npu_error_with_errno(device: npu.Device) -> None:
    t = npu.tensor(np.ones(4, np.float32))
    assert t.buffer is not None
    t.buffer.free()
    with pytest.raises(npu.NpuError) as info:
        t + 1
    assert info.value.errno == errno.EBADF


def test_tensors_of_different_devices_do_not_mix(driver: CpuBackend) -> None:
    with npu.Device(driver) as other:
        a = npu.tensor([1.0], device=other)
        with pytest.raises(ValueError, match="different devices"):
            a + npu.tensor([1.0])
