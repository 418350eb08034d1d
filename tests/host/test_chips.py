"""npu.chips: the timing model's chip descriptions and roofline (docs/npu-spec.md 12.2)."""

from __future__ import annotations

import npu
from npu.chips import CHIPS


def test_a_256_cubed_fp32_gemm_is_memory_bound_on_the_edge_chip() -> None:
    r = CHIPS["edge"].roofline(256**3, 3 * 256 * 256 * 4, npu.DType.FP32)
    # compute: 256^3 / (1024 / 4 * 1.0 GHz * 0.85); memory: 786432 B at 8 GB/s
    assert (r.compute_ns, r.memory_ns, r.duration_ns, r.bound) == (77102, 98304, 100304, "memory")


def test_a_resnet_3x3_conv_is_compute_bound_on_the_edge_chip() -> None:
    macs = 64 * 56 * 56 * 64 * 9
    nbytes = (64 * 56 * 56 * 2 + 64 * 64 * 9 + 64) * 4
    assert CHIPS["edge"].roofline(macs, nbytes, npu.DType.FP32, conv=True).bound == "compute"


def test_int8_runs_four_times_the_fp32_rate_and_bf16_twice() -> None:
    chip = CHIPS["datacenter"]
    fp32 = chip.peak_macs_per_s(npu.DType.FP32)
    assert chip.peak_macs_per_s(npu.DType.INT8) == 4 * fp32
    assert chip.peak_macs_per_s(npu.DType.BF16) == 2 * fp32


def test_bytes_beyond_the_sram_are_fetched_twice() -> None:
    chip = CHIPS["edge"]
    inside = chip.roofline(0, chip.sram_bytes, npu.DType.FP32).memory_ns
    outside = chip.roofline(0, 2 * chip.sram_bytes, npu.DType.FP32).memory_ns
    assert outside == 3 * inside


def test_an_op_without_multiply_adds_runs_on_the_vector_unit() -> None:
    r = CHIPS["datacenter"].roofline(0, 1 << 20, npu.DType.FP32)
    assert r.compute_ns == -(-(1 << 20) // int(512 * 1.5))
    assert r.duration_ns == 1000 + max(r.compute_ns, r.memory_ns)
