"""COPY, FILL and GEMM compute the right bytes, through both API levels.

Every result is checked against numpy. The high-level functions
(``npu.matmul``, ``npu.copy_array``, ``npu.fill``) and the low-level
``Device.submit``/``Device.wait`` with op builders are both exercised.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import npu
from npu import ops

RNG_SEED = 1234
SENTINEL_U32 = 0x7FC0DEAD  # a NaN bit pattern: padding must keep it verbatim
ONE_F32 = 0x3F800000  # 1.0f


def rand_f32(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def assert_gemm_close(got: np.ndarray, want: np.ndarray, k: int) -> None:
    # fp32 accumulation of k products: tolerance grows with k.
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(k, 1) ** 0.5 * 10)


# --------------------------------------------------------------------------
# GEMM
# --------------------------------------------------------------------------

GEMM_SHAPES = [
    (1, 1, 1),
    (3, 5, 7),
    (33, 17, 29),
    (64, 1, 64),
    (127, 255, 63),
    (256, 256, 256),
]


@pytest.mark.parametrize(("m", "n", "k"), GEMM_SHAPES, ids=lambda v: str(v))
def test_matmul_matches_numpy_for_shape(dev, m, n, k):
    rng = np.random.default_rng(RNG_SEED + m * 7 + n * 3 + k)
    a = rand_f32(rng, (m, k))
    b = rand_f32(rng, (k, n))
    c = npu.matmul(a, b, device=dev)
    assert c.shape == (m, n)
    assert c.dtype == np.float32
    assert_gemm_close(c, a @ b, k)


@pytest.mark.parametrize(("m", "n", "k"), [(3, 5, 7), (33, 17, 29), (64, 1, 64)], ids=str)
def test_submitted_gemm_matches_numpy_for_shape(dev, m, n, k):
    rng = np.random.default_rng(RNG_SEED + m + n + k)
    a = rand_f32(rng, (m, k))
    b = rand_f32(rng, (k, n))
    with dev.alloc(a.nbytes) as ba, dev.alloc(b.nbytes) as bb, dev.alloc(m * n * 4) as bc:
        ba.write(a)
        bb.write(b)
        fence = dev.submit([ops.gemm(ba, bb, bc, m, n, k)])
        dev.wait(fence)
        assert_gemm_close(bc.numpy(np.float32, (m, n)), a @ b, k)


# GEMMs of at least 2^22 multiply-adds are split into row tiles for the
# device's AI cores: "tiled" shapes take that path, "small" ones do not.
GEMM_TILING = {"small": (33, 17, 29), "tiled": (301, 170, 129)}


@pytest.mark.parametrize("size", list(GEMM_TILING))
@pytest.mark.parametrize(
    ("trans_a", "trans_b"),
    [(True, False), (False, True), (True, True)],
    ids=["trans_a", "trans_b", "trans_a_and_b"],
)
def test_gemm_with_transposed_operands_matches_numpy(dev, trans_a, trans_b, size):
    m, n, k = GEMM_TILING[size]
    rng = np.random.default_rng(RNG_SEED + trans_a + 2 * trans_b)
    a = rand_f32(rng, (m, k))
    b = rand_f32(rng, (k, n))
    a_stored = np.ascontiguousarray(a.T) if trans_a else a
    b_stored = np.ascontiguousarray(b.T) if trans_b else b
    with dev.alloc(a.nbytes) as ba, dev.alloc(b.nbytes) as bb, dev.alloc(m * n * 4) as bc:
        ba.write(a_stored)
        bb.write(b_stored)
        dev.run([ops.gemm(ba, bb, bc, m, n, k, trans_a=trans_a, trans_b=trans_b)])
        assert_gemm_close(bc.numpy(np.float32, (m, n)), a @ b, k)


def _padded(rng: np.random.Generator, rows: int, cols: int, ld: int) -> np.ndarray:
    """A rows x ld float32 array: random data in [:, :cols], sentinel padding after."""
    full = np.full((rows, ld), 0, dtype=np.uint32)
    full[:] = SENTINEL_U32
    full = full.view(np.float32)
    full[:, :cols] = rand_f32(rng, (rows, cols))
    return full


@pytest.mark.parametrize("size", ["small", "tiled"])
@pytest.mark.parametrize(("trans_a", "trans_b"), [(False, False), (True, True)], ids=["nn", "tt"])
def test_gemm_with_row_strides_reads_only_the_matrix_and_keeps_c_padding(
    dev, trans_a, trans_b, size
):
    m, n, k = (19, 23, 11) if size == "small" else (190, 230, 110)
    rng = np.random.default_rng(RNG_SEED + 99 + trans_a)
    a_rows, a_cols = (k, m) if trans_a else (m, k)
    b_rows, b_cols = (n, k) if trans_b else (k, n)
    lda, ldb, ldc = a_cols + 5, b_cols + 3, n + 7
    a_full = _padded(rng, a_rows, a_cols, lda)
    b_full = _padded(rng, b_rows, b_cols, ldb)
    c_full = np.full((m, ldc), SENTINEL_U32, dtype=np.uint32)
    a = a_full[:, :a_cols].T if trans_a else a_full[:, :a_cols]
    b = b_full[:, :b_cols].T if trans_b else b_full[:, :b_cols]
    with (
        dev.alloc(a_full.nbytes) as ba,
        dev.alloc(b_full.nbytes) as bb,
        dev.alloc(c_full.nbytes) as bc,
    ):
        ba.write(a_full)
        bb.write(b_full)
        bc.write(c_full)
        dev.run(
            [
                ops.gemm(
                    ba, bb, bc, m, n, k, lda=lda, ldb=ldb, ldc=ldc, trans_a=trans_a, trans_b=trans_b
                )
            ]
        )
        c_raw = bc.numpy(np.uint32, (m, ldc)).copy()
    assert (c_raw[:, n:] == SENTINEL_U32).all(), "GEMM wrote into the padding of C"
    assert_gemm_close(c_raw[:, :n].view(np.float32), a @ b, k)


def test_gemm_at_buffer_offsets_leaves_the_rest_of_the_buffers_alone(dev):
    m, n, k = 8, 9, 10
    rng = np.random.default_rng(RNG_SEED + 5)
    a = rand_f32(rng, (m, k))
    b = rand_f32(rng, (k, n))
    off = 4096 + 64
    with dev.alloc(off + a.nbytes + b.nbytes) as bab, dev.alloc(2 * off + m * n * 4) as bc:
        bab.write(a, offset=off)
        bab.write(b, offset=off + a.nbytes)
        bc.numpy(np.uint32)[:] = SENTINEL_U32
        dev.run(
            [ops.gemm(bab, bab, bc, m, n, k, a_offset=off, b_offset=off + a.nbytes, c_offset=off)]
        )
        raw = bc.numpy(np.uint32)
        assert (raw[: off // 4] == SENTINEL_U32).all()
        assert (raw[off // 4 + m * n :] == SENTINEL_U32).all()
        got = bc.numpy(np.float32, (m, n), offset=off)
        assert_gemm_close(got, a @ b, k)


def test_matmul_of_non_contiguous_float64_input_is_converted(dev):
    rng = np.random.default_rng(RNG_SEED + 6)
    a = rng.standard_normal((20, 12))[:, ::2]  # float64, strided: 20 x 6
    b = rng.standard_normal((6, 9))
    c = npu.matmul(a, b, device=dev)
    assert_gemm_close(c, (a.astype(np.float32) @ b.astype(np.float32)), 6)


# --------------------------------------------------------------------------
# COPY
# --------------------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [1, 3, 4096, 4097, 1 << 20], ids=lambda v: f"{v}B")
def test_copy_array_returns_identical_bytes(dev, nbytes):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    out = npu.copy_array(data, device=dev)
    assert out.dtype == np.uint8
    assert np.array_equal(out, data)


@pytest.mark.parametrize(
    ("src_off", "dst_off", "nbytes"),
    [(0, 1, 1000), (13, 4099, 1000), (4096, 0, 8192), (1, 7, 1)],
)
def test_copy_at_nonzero_offsets_writes_only_the_destination_range(dev, src_off, dst_off, nbytes):
    size = 16384
    rng = np.random.default_rng(src_off + dst_off)
    src_data = rng.integers(0, 256, size, dtype=np.uint8)
    with dev.alloc(size) as src, dev.alloc(size) as dst:
        src.write(src_data)
        dst.numpy(np.uint8)[:] = 0xA5
        dev.run([ops.copy(src, dst, nbytes, src_offset=src_off, dst_offset=dst_off)])
        got = dst.numpy(np.uint8)
        assert np.array_equal(got[dst_off : dst_off + nbytes], src_data[src_off : src_off + nbytes])
        assert (got[:dst_off] == 0xA5).all()
        assert (got[dst_off + nbytes :] == 0xA5).all()


def test_copy_between_disjoint_ranges_of_one_buffer(dev):
    with dev.alloc(8192) as buf:
        data = np.arange(4096, dtype=np.uint8)
        buf.write(data)
        dev.run([ops.copy(buf, buf, 4096, src_offset=0, dst_offset=4096)])
        assert np.array_equal(buf.numpy(np.uint8)[4096:], data)


def test_64_mib_copied_by_one_submit_of_4_mib_copies_is_exact(dev):
    chunk, count = 4 << 20, 16
    srcs = [dev.alloc(chunk) for _ in range(count)]
    dsts = [dev.alloc(chunk) for _ in range(count)]
    try:
        for i, src in enumerate(srcs):
            words = src.numpy(np.uint32)
            words[:] = np.arange(i * words.size, (i + 1) * words.size, dtype=np.uint32)
            words *= np.uint32(2654435761)  # scramble so that misplaced blocks differ
        dev.run([ops.copy(s, d, chunk) for s, d in zip(srcs, dsts, strict=True)], timeout_s=60)
        for src, dst in zip(srcs, dsts, strict=True):
            assert np.array_equal(dst.numpy(np.uint32), src.numpy(np.uint32))
    finally:
        for buf in srcs + dsts:
            buf.free()


def test_copy_of_64_mib_in_one_op_is_exact(dev):
    nbytes = 64 << 20
    src = dev.alloc(nbytes)
    with src, dev.alloc(nbytes) as dst:
        words = src.numpy(np.uint32)
        words[:] = np.arange(words.size, dtype=np.uint32)
        words *= np.uint32(2654435761)
        dev.run([ops.copy(src, dst, nbytes)], timeout_s=60)
        assert np.array_equal(dst.numpy(np.uint32), words)


# --------------------------------------------------------------------------
# FILL
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern", [0x00000000, 0xFFFFFFFF, 0xDEADBEEF, 0x01020304], ids=lambda p: f"{p:#010x}"
)
def test_fill_repeats_the_32_bit_pattern_little_endian(dev, pattern):
    nbytes = 3 * 4096 + 12
    with dev.alloc(nbytes) as buf:
        buf.numpy(np.uint8)[:] = 0x5A
        dev.run([ops.fill(buf, pattern, nbytes)])
        assert (buf.numpy(np.uint32) == pattern).all()
        assert buf.read(4) == pattern.to_bytes(4, "little")


def test_fill_at_an_offset_writes_only_its_range(dev):
    with dev.alloc(8192) as buf:
        buf.numpy(np.uint8)[:] = 0x11
        dev.run([ops.fill(buf, 0xCAFEF00D, 400, offset=1000)])
        raw = buf.numpy(np.uint8)
        assert (raw[:1000] == 0x11).all()
        assert (raw[1400:] == 0x11).all()
        assert (raw[1000:1400].view(np.uint32) == 0xCAFEF00D).all()


@pytest.mark.parametrize(
    ("value", "dtype"),
    [(1.5, np.float32), (-7, np.int32), (0xAB, np.uint8), (0x1234, np.uint16)],
    ids=["float32", "int32", "uint8", "uint16"],
)
def test_high_level_fill_returns_the_value_everywhere(dev, value, dtype):
    out = npu.fill((5, 7), value, dtype, device=dev)
    assert out.shape == (5, 7)
    assert out.dtype == np.dtype(dtype)
    assert (out == np.array(value, dtype=dtype)).all()


# --------------------------------------------------------------------------
# Submissions and fences
# --------------------------------------------------------------------------


def test_ops_of_one_submit_run_in_order(dev):
    m = n = k = 16
    nbytes = m * k * 4
    with dev.alloc(nbytes) as a, dev.alloc(nbytes) as b, dev.alloc(m * n * 4) as c:
        a.numpy(np.uint32)[:] = 0
        batch = [
            ops.fill(a, ONE_F32, nbytes),  # A = 1
            ops.copy(a, b, nbytes),  # B = A = 1
            ops.gemm(a, b, c, m, n, k),  # C = k everywhere
            ops.fill(a, 0, nbytes),  # A = 0 afterwards
            ops.nop(),
        ]
        fence = dev.submit(batch)
        dev.wait(fence)
        assert (c.numpy(np.float32) == float(k)).all()
        assert (b.numpy(np.float32) == 1.0).all()
        assert (a.numpy(np.uint32) == 0).all()


def test_submit_of_256_ops_completes_them_all(dev):
    with dev.alloc(256 * 4) as buf:
        fence = dev.submit([ops.fill(buf, i, 4, offset=4 * i) for i in range(256)])
        dev.wait(fence)
        assert np.array_equal(buf.numpy(np.uint32), np.arange(256, dtype=np.uint32))


def test_each_op_takes_the_next_fence_and_fences_increase(dev):
    with dev.alloc(4096) as buf:
        fences = []
        for count in (1, 3, 1, 7, 2):
            fences.append(dev.submit([ops.fill(buf, count, 4096)] * count))
        dev.wait(fences[-1])
        deltas = [later - earlier for earlier, later in itertools.pairwise(fences)]
        assert deltas == [3, 1, 7, 2]
        assert all(f > 0 for f in fences)


def test_waiting_on_an_older_fence_after_a_newer_one_returns_at_once(dev):
    with dev.alloc(4096) as buf:
        f1 = dev.submit([ops.nop()])
        f2 = dev.submit([ops.fill(buf, 1, 4096)])
        dev.wait(f2)
        dev.wait(f1, timeout_s=0)
        dev.wait(f2, timeout_s=0)


def test_run_returns_a_completed_fence(dev):
    fence = dev.run([ops.nop()])
    dev.wait(fence, timeout_s=0)
