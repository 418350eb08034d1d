"""Op builders: what they pack into struct npu_op and what they reject."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from npu import _abi, ops


@dataclass(frozen=True)
class FakeBuffer:
    handle: int
    size: int


BIG = FakeBuffer(handle=1, size=1 << 20)


def extent(rows: int, cols: int, ld: int) -> int:
    return ((rows - 1) * ld + cols) * 4


# -- NOP ---------------------------------------------------------------------


def test_nop_packs_no_buffers_and_no_params() -> None:
    raw = ops.nop().pack()
    assert (raw.opcode, raw.flags, raw.num_bufs, raw.rsvd) == (_abi.NPU_OP_NOP, 0, 0, 0)
    assert list(raw.params) == [0] * _abi.NPU_OP_MAX_PARAMS


# -- COPY --------------------------------------------------------------------


def test_copy_packs_src_then_dst_with_equal_sizes() -> None:
    src, dst = FakeBuffer(3, 100), FakeBuffer(4, 200)
    raw = ops.copy(src, dst, 40, src_offset=8, dst_offset=16).pack()
    assert raw.opcode == _abi.NPU_OP_COPY
    assert raw.num_bufs == 2
    assert [(b.handle, b.offset, b.size) for b in raw.bufs[:2]] == [(3, 8, 40), (4, 16, 40)]


def test_copy_rejects_zero_bytes() -> None:
    with pytest.raises(ValueError, match="nbytes"):
        ops.copy(BIG, BIG, 0)


def test_copy_rejects_a_source_range_past_the_buffer_end() -> None:
    with pytest.raises(ValueError, match="COPY src"):
        ops.copy(FakeBuffer(1, 64), BIG, 64, src_offset=4)


def test_copy_rejects_a_destination_range_past_the_buffer_end() -> None:
    with pytest.raises(ValueError, match="COPY dst"):
        ops.copy(BIG, FakeBuffer(2, 32), 64)


def test_copy_rejects_overlapping_ranges_of_one_buffer() -> None:
    with pytest.raises(ValueError, match="overlap"):
        ops.copy(BIG, BIG, 64, src_offset=0, dst_offset=32)


def test_copy_allows_disjoint_ranges_of_one_buffer() -> None:
    assert ops.copy(BIG, BIG, 32, src_offset=0, dst_offset=32).bufs[1].offset == 32


def test_copy_rejects_a_negative_offset() -> None:
    with pytest.raises(ValueError, match="offset"):
        ops.copy(BIG, BIG, 4, src_offset=-4)


# -- FILL --------------------------------------------------------------------


def test_fill_packs_the_destination_and_the_pattern_as_param_0() -> None:
    raw = ops.fill(FakeBuffer(5, 64), 0xDEADBEEF, 32, offset=16).pack()
    assert raw.opcode == _abi.NPU_OP_FILL
    assert raw.num_bufs == 1
    assert (raw.bufs[0].handle, raw.bufs[0].offset, raw.bufs[0].size) == (5, 16, 32)
    assert raw.params[0] == 0xDEADBEEF


def test_fill_rejects_a_size_that_is_not_a_multiple_of_4() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        ops.fill(BIG, 0, 6)


def test_fill_rejects_a_pattern_wider_than_32_bits() -> None:
    with pytest.raises(ValueError, match="pattern"):
        ops.fill(BIG, 1 << 32, 4)


def test_fill_rejects_a_negative_pattern() -> None:
    with pytest.raises(ValueError, match="pattern"):
        ops.fill(BIG, -1, 4)


# -- GEMM --------------------------------------------------------------------


def test_gemm_packs_a_b_c_and_the_eight_params_in_header_order() -> None:
    raw = ops.gemm(BIG, FakeBuffer(2, 4096), FakeBuffer(3, 4096), 2, 3, 4).pack()
    assert raw.opcode == _abi.NPU_OP_GEMM
    assert raw.num_bufs == 3
    assert [b.handle for b in raw.bufs] == [1, 2, 3]
    assert list(raw.params) == [2, 3, 4, 4, 3, 3, _abi.NPU_DTYPE_FP32, 0]


def test_gemm_extents_are_exact_for_packed_matrices() -> None:
    op = ops.gemm(BIG, BIG, BIG, m=2, n=3, k=4)
    assert [r.size for r in op.bufs] == [2 * 4 * 4, 4 * 3 * 4, 2 * 3 * 4]


def test_gemm_extents_do_not_pad_the_last_row_of_strided_matrices() -> None:
    op = ops.gemm(BIG, BIG, BIG, m=2, n=3, k=4, lda=10, ldb=7, ldc=5)
    assert [r.size for r in op.bufs] == [extent(2, 4, 10), extent(4, 3, 7), extent(2, 3, 5)]


def test_gemm_trans_a_stores_a_as_k_by_m() -> None:
    op = ops.gemm(BIG, BIG, BIG, m=2, n=3, k=4, lda=6, trans_a=True)
    assert op.bufs[0].size == extent(4, 2, 6)
    assert op.params[7] == _abi.NPU_GEMM_TRANS_A


def test_gemm_trans_b_stores_b_as_n_by_k() -> None:
    op = ops.gemm(BIG, BIG, BIG, m=2, n=3, k=4, ldb=5, trans_b=True)
    assert op.bufs[1].size == extent(3, 4, 5)
    assert op.params[7] == _abi.NPU_GEMM_TRANS_B


def test_gemm_default_strides_follow_the_stored_shape_under_transposes() -> None:
    op = ops.gemm(BIG, BIG, BIG, m=2, n=3, k=4, trans_a=True, trans_b=True)
    lda, ldb, ldc, _dtype, flags = op.params[3:]
    assert (lda, ldb, ldc) == (2, 4, 3)
    assert flags == _abi.NPU_GEMM_F_MASK


def test_gemm_honours_buffer_offsets() -> None:
    op = ops.gemm(BIG, BIG, BIG, 1, 1, 1, a_offset=4, b_offset=8, c_offset=12)
    assert [r.offset for r in op.bufs] == [4, 8, 12]


def test_gemm_accepts_numpy_integers_as_dimensions() -> None:
    op = ops.gemm(BIG, BIG, BIG, np.int64(2), np.int32(2), np.uint16(2))
    assert op.params[:3] == (2, 2, 2)


@pytest.mark.parametrize("dims", [(0, 1, 1), (1, 0, 1), (1, 1, 0)])
def test_gemm_rejects_a_zero_dimension(dims: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="out of range"):
        ops.gemm(BIG, BIG, BIG, *dims)


def test_gemm_rejects_a_dimension_above_npu_max_dim() -> None:
    with pytest.raises(ValueError, match="GEMM m"):
        ops.gemm(BIG, BIG, BIG, _abi.NPU_MAX_DIM + 1, 1, 1)


def test_gemm_rejects_a_stride_shorter_than_the_stored_row() -> None:
    with pytest.raises(ValueError, match="lda=3 is smaller than the stored row length 4"):
        ops.gemm(BIG, BIG, BIG, m=2, n=3, k=4, lda=3)


def test_gemm_rejects_a_stride_shorter_than_the_transposed_row() -> None:
    with pytest.raises(ValueError, match="ldb=3 is smaller than the stored row length 4"):
        ops.gemm(BIG, BIG, BIG, m=2, n=3, k=4, ldb=3, trans_b=True)


def test_gemm_rejects_a_matrix_that_does_not_fit_its_buffer() -> None:
    small = FakeBuffer(9, extent(2, 3, 3) - 4)
    with pytest.raises(ValueError, match="GEMM C"):
        ops.gemm(BIG, BIG, small, m=2, n=3, k=4)


def test_gemm_rejects_a_float_dimension() -> None:
    with pytest.raises(TypeError, match="GEMM m"):
        ops.gemm(BIG, BIG, BIG, 2.0, 1, 1)  # type: ignore[arg-type]


# -- Op ----------------------------------------------------------------------


def test_op_rejects_more_buffers_than_npu_op_max_bufs() -> None:
    ref = ops.BufRef(1, 0, 4)
    with pytest.raises(ValueError, match="buffers"):
        ops.Op(_abi.Opcode.NOP, (ref,) * (_abi.NPU_OP_MAX_BUFS + 1))


def test_op_rejects_a_param_that_is_not_a_u32() -> None:
    with pytest.raises(ValueError, match="params"):
        ops.Op(_abi.Opcode.FILL, (), (1 << 32,))


def test_op_string_names_the_gemm_shape() -> None:
    op = ops.gemm(BIG, BIG, BIG, 2, 3, 4, trans_b=True)
    assert str(op) == "GEMM(m=2,n=3,k=4,lda=4,ldb=4,ldc=3,trans_b)"


def test_ops_are_equal_when_they_pack_the_same_struct() -> None:
    assert ops.fill(BIG, 7, 8) == ops.fill(FakeBuffer(1, 8), 7, 8)
