"""CONV2D's two kernels and POOL2D's row kernel at network sizes, through qtest.

The device runs a float CONV2D on oneDNN (``dnnl=on``, the default) where
oneDNN takes the shape, and as im2col + BLAS otherwise or with
``dnnl=off``. Both must meet the CONV2D tolerance of docs/npu-spec.md
against the float64 reference of test_device_qtest_tensor.py, on the shapes
real CNNs have (the small shapes of that file's tests take oneDNN's
reference kernels; these take its blocked JIT kernels): ResNet's stem,
1x1 and 3x3 convolutions and strided projections, MobileNet's depthwise
and grouped convolutions, batches, output channels that leave a partial
block, bf16 operands and fp16 outputs. POOL2D with ordinary windows runs
a row kernel; it must meet the POOL2D reference as the per-window loops do
(MAX exactly, with NaN propagating).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from qtest import Npu, hw, tensor_params
from qtest_tensor_ref import BF16, FP16, FP32, INT8, INT32, assert_matches, encode, round_to
from test_device_qtest_quant import i8_operand, run_int_mm
from test_device_qtest_tensor import (
    Operand,
    Rig,
    check_accumulated,
    conv_geometry,
    conv_operands,
    logical,
    operand_from,
    ref_conv,
    ref_pool,
    run_conv,
    run_mm,
    run_pool,
)

# (N, C, H, W, O, KH, KW, stride, pad, dilation, groups)
NETWORK_CONVS = {
    "resnet-stem-7x7-s2": (1, 3, 64, 64, 64, 7, 7, (2, 2), (3, 3), (1, 1), 1),
    "bottleneck-1x1": (1, 64, 28, 28, 256, 1, 1, (1, 1), (0, 0), (1, 1), 1),
    "bottleneck-3x3": (1, 128, 14, 14, 128, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    "projection-1x1-s2": (1, 256, 14, 14, 512, 1, 1, (2, 2), (0, 0), (1, 1), 1),
    "late-3x3-7x7": (1, 256, 7, 7, 256, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    "depthwise-3x3-s2": (1, 96, 28, 28, 96, 3, 3, (2, 2), (1, 1), (1, 1), 96),
    "grouped-g4-batch3": (3, 64, 14, 14, 64, 3, 3, (1, 1), (1, 1), (1, 1), 4),
    "partial-block-o40": (2, 32, 16, 16, 40, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    "dilated-3x3-d2": (1, 32, 20, 20, 48, 3, 3, (1, 1), (2, 2), (2, 2), 1),
}


def start(tmp_path: Path, device: str, extra_args: Sequence[str] = ()) -> Iterator[Rig]:
    dev = Npu(tmp_path / "qemu.log", device=device, extra_args=extra_args)
    try:
        dev.start()
        yield Rig(dev)
        dev.assert_alive()
    finally:
        dev.close()


@pytest.fixture(scope="module")
def onednn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    yield from start(tmp_path_factory.mktemp("onednn"), "npu,cores=2")


@pytest.fixture(scope="module")
def blas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    yield from start(tmp_path_factory.mktemp("blas"), "npu,cores=2,dnnl=off")


def run_case(rig: Rig, name: str, dtype: int, kind: int) -> None:
    n, c, h, wd, o, kh, kw, st, pd, dl, g = NETWORK_CONVS[name]
    rng = np.random.default_rng([140, dtype, kind, len(name)])
    x, w, b = conv_operands(rng, dtype, n, c, h, wd, o, kh, kw, g)
    run_conv(rig, kind, x, w, b, st, pd, dl, g, what=name)


@pytest.mark.parametrize("name", NETWORK_CONVS)
def test_fp32_conv2d_on_onednn_meets_the_tolerance(onednn: Rig, name: str) -> None:
    run_case(onednn, name, FP32, hw.ACT_RELU)


@pytest.mark.parametrize("name", NETWORK_CONVS)
def test_fp32_conv2d_on_blas_meets_the_tolerance(blas: Rig, name: str) -> None:
    run_case(blas, name, FP32, hw.ACT_RELU)


@pytest.mark.parametrize("name", ["bottleneck-3x3", "depthwise-3x3-s2", "partial-block-o40"])
def test_bf16_conv2d_meets_the_tolerance_on_either_kernel(onednn: Rig, blas: Rig,
                                                          name: str) -> None:  # fmt: skip
    run_case(onednn, name, BF16, hw.ACT_GELU)
    run_case(blas, name, BF16, hw.ACT_GELU)


def test_fp16_conv2d_takes_the_blas_kernel_and_meets_the_tolerance(onednn: Rig) -> None:
    run_case(onednn, "bottleneck-3x3", FP16, hw.ACT_NONE)


def test_conv2d_on_a_strided_input_view(onednn: Rig) -> None:
    rng = np.random.default_rng(141)
    n, c, h, wd, o = 2, 32, 12, 10, 48
    # NHWC memory seen as NCHW: oneDNN reads it through a strided descriptor.
    x = operand_from(rng, FP32, (n, c, h, wd), (h * wd * c, 1, wd * c, c), specials=False)
    _, w, b = conv_operands(rng, FP32, n, c, h, wd, o, 3, 3, 1)
    run_conv(onednn, hw.ACT_NONE, x, w, b, (1, 1), (1, 1), what="nhwc view")


def test_conv2d_results_of_the_two_kernels_agree(onednn: Rig, blas: Rig) -> None:
    n, c, h, wd, o, kh, kw, st, pd, dl, g = NETWORK_CONVS["bottleneck-3x3"]
    rng = np.random.default_rng(142)
    x, w, b = conv_operands(rng, FP32, n, c, h, wd, o, kh, kw, g)
    fast = run_conv(onednn, hw.ACT_NONE, x, w, b, st, pd, dl, g)
    slow = run_conv(blas, hw.ACT_NONE, x, w, b, st, pd, dl, g)
    np.testing.assert_allclose(fast, slow, rtol=1e-4, atol=1e-4)


# -- NPU_CONV_F_ACCUMULATE: out = act(conv + bias + out), a fused residual add --


def conv_accumulate(rig: Rig, kind: int, x: Operand, w: Operand, b: Operand, res: Operand,
                    stride: Sequence[int] = (1, 1), pad: Sequence[int] = (0, 0),
                    groups: int = 1, what: str = "") -> np.ndarray:  # fmt: skip
    """Run CONV2D with the output preloaded with ``res``; check it against the reference."""
    oh, ow = conv_geometry(x.shape, w.shape, stride, pad, (1, 1))
    out = Operand(x.dtype, (x.shape[0], w.shape[0], oh, ow))
    assert res.shape == out.shape
    rig.place([x, w, b, out])
    rig.write(out.va, encode(logical(res), res.dtype))
    params = [stride[0], stride[1], pad[0], pad[1], 1, 1, groups, 0, hw.CONV_F_ACCUMULATE]
    got = rig.run(hw.OP_CONV2D, kind, [x, w, b, out], place=False, params=params, timeout=60.0)
    acc, mag = ref_conv(logical(x), logical(w), logical(b), stride, pad, (1, 1), groups)
    r = logical(res).astype(np.float64)
    check_accumulated(got, acc + r, mag + np.abs(r), kind, x.dtype, what)
    return got


def accumulate_case(rig: Rig, name: str, dtype: int, kind: int) -> np.ndarray:
    n, c, h, wd, o, kh, kw, st, pd, _, g = NETWORK_CONVS[name]
    rng = np.random.default_rng([143, dtype, kind, len(name)])
    x, w, b = conv_operands(rng, dtype, n, c, h, wd, o, kh, kw, g)
    oh, ow = conv_geometry(x.shape, w.shape, st, pd, (1, 1))
    res = operand_from(rng, dtype, (n, o, oh, ow), specials=False, scale=4.0)
    return conv_accumulate(rig, kind, x, w, b, res, st, pd, g, what=name)


@pytest.mark.parametrize("name", ["bottleneck-1x1", "late-3x3-7x7", "partial-block-o40",
                                  "grouped-g4-batch3"])  # fmt: skip
def test_accumulating_conv2d_adds_the_old_output_before_relu_on_onednn(
    onednn: Rig, name: str
) -> None:
    got = accumulate_case(onednn, name, FP32, hw.ACT_RELU)
    assert (got == 0).any() and (got > 0).any()  # the ReLU saw sums of both signs


@pytest.mark.parametrize("name", ["bottleneck-1x1", "late-3x3-7x7", "partial-block-o40"])
def test_accumulating_conv2d_adds_the_old_output_before_relu_on_blas(blas: Rig, name: str) -> None:
    accumulate_case(blas, name, FP32, hw.ACT_RELU)


@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_accumulating_conv2d_in_16_bit_dtypes(onednn: Rig, blas: Rig, dtype: int) -> None:
    accumulate_case(onednn, "bottleneck-3x3", dtype, hw.ACT_GELU)
    accumulate_case(blas, "bottleneck-3x3", dtype, hw.ACT_NONE)


def conv_status(rig: Rig, dtype: int, flags: int, kind: int = hw.ACT_NONE) -> int:
    """Status of a small CONV2D of ``dtype`` operands (int32 bias for int8) with ``flags``."""
    rng = np.random.default_rng(144)
    x = operand_from(rng, dtype, (1, 2, 4, 4), specials=False)
    w = operand_from(rng, dtype, (3, 2, 3, 3), specials=False)
    b = operand_from(rng, INT32 if dtype == INT8 else dtype, (1, 3, 1, 1), specials=False)
    out = Operand(INT32 if dtype == INT8 else dtype, (1, 3, 2, 2))
    rig.place([x, w, b, out])
    block = tensor_params([t.desc() for t in (x, w, b, out)], [1, 1, 0, 0, 1, 1, 1, 0, flags])
    return rig.submit(hw.OP_CONV2D, kind, block)


def test_accumulate_with_an_integer_output_is_refused_with_bad_args(onednn: Rig) -> None:
    assert conv_status(onednn, INT8, hw.CONV_F_ACCUMULATE) == hw.ST_BAD_ARGS
    assert conv_status(onednn, INT8, 0) == hw.ST_OK


def test_an_unknown_conv2d_flag_is_refused_with_bad_args(onednn: Rig) -> None:
    assert conv_status(onednn, FP32, hw.CONV_F_MASK + 1) == hw.ST_BAD_ARGS
    assert conv_status(onednn, FP32, hw.CONV_F_ACCUMULATE) == hw.ST_OK


def host_cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def onednn_builds(log: Path, what: str) -> list[bool]:
    """Per oneDNN primitive the device built for @what ("conv", "matmul"): declined?"""
    pattern = rf"npu_dnnl_\w+_build {what} .*: declined (\d)"
    return [m == "1" for m in re.findall(pattern, log.read_text())]


def test_network_convolutions_and_matmuls_run_on_onednn(tmp_path: Path) -> None:
    """The shapes of real networks take oneDNN's kernels (the trace names each one
    the device builds), except a 1x1 convolution over few positions, which BLAS runs
    on the weights in place; int8 only where the host has VNNI (without it oneDNN's
    int8 sums saturate), bf16 where it has AVX-512."""
    flags = host_cpu_flags()
    for rig in start(tmp_path, "npu,cores=2", ["-trace", "npu_dnnl_*"]):
        for name in ("bottleneck-3x3", "projection-1x1-s2", "depthwise-3x3-s2"):
            run_case(rig, name, FP32, hw.ACT_NONE)
        rng = np.random.default_rng(144)
        run_int_mm(rig, hw.ACT_NONE, i8_operand(rng, (64, 256)), i8_operand(rng, (256, 96)),
                   None, INT32, zp=-3)  # fmt: skip
        a = operand_from(rng, BF16, (64, 256), specials=False, scale=1.0)
        b = operand_from(rng, BF16, (256, 96), specials=False, scale=1.0)
        run_mm(rig, hw.OP_MATMUL, hw.ACT_NONE, a, b, None, what="bf16")
    log = tmp_path / "qemu.log"
    convs, mms = onednn_builds(log, "conv"), onednn_builds(log, "matmul")
    # One shape each for the 3x3 and the depthwise convolution (two equal blocks
    # of output channels); none for the 1x1 projection (49 positions).
    assert convs == [False, False], convs
    assert len(mms) == 2, mms
    has_vnni = bool(flags & {"avx512_vnni", "avx_vnni"})
    assert mms[0] is not has_vnni, ("int8 declined", mms[0], "VNNI", has_vnni)
    if "avx512f" in flags:
        assert mms[1] is False, "bf16 declined on an AVX-512 host"


# (N, C, H, W, kernel, stride, pad)
NETWORK_POOLS = {
    "resnet-maxpool-3x3-s2-p1": (1, 64, 56, 56, (3, 3), (2, 2), (1, 1)),
    "densenet-avgpool-2x2-s2": (2, 32, 28, 28, (2, 2), (2, 2), (0, 0)),
    "inception-3x3-s1-p1": (1, 48, 14, 14, (3, 3), (1, 1), (1, 1)),
}


@pytest.mark.parametrize("kname", ["max", "avg"])
@pytest.mark.parametrize("name", NETWORK_POOLS)
def test_pool2d_network_shapes(onednn: Rig, name: str, kname: str) -> None:
    n, c, h, wd, k, st, pd = NETWORK_POOLS[name]
    rng = np.random.default_rng([143, len(name), len(kname)])
    x = operand_from(rng, FP32, (n, c, h, wd), specials=False)
    kind = hw.POOL_MAX if kname == "max" else hw.POOL_AVG
    run_pool(onednn, kind, x, k, st, pd, count_pad=kname == "avg", what=name)


def test_max_pool2d_row_kernel_propagates_nan_and_keeps_infinities(onednn: Rig) -> None:
    x = Operand(FP32, (1, 1, 4, 6))
    x.buf = np.array([[0.0, -0.0, 1.0, np.nan, -np.inf, 2.0],
                      [-0.0, -0.0, -1.0, 3.0, -np.inf, -np.inf],
                      [np.inf, 0.0, -2.0, -3.0, 5.0, -0.0],
                      [1.0, -0.0, -0.0, 0.0, -np.inf, -np.inf]],
                     np.float32).reshape(-1)  # fmt: skip
    got = run_pool(onednn, hw.POOL_MAX, x, (2, 2), (2, 2), (1, 1))
    want = round_to(ref_pool(hw.POOL_MAX, logical(x), (2, 2), (2, 2), (1, 1), False), FP32)
    assert_matches(got, want, FP32)
    assert np.isnan(got[0, 0, 0, 2]) and got[0, 0, 1, 0] == np.inf


def test_relu6_on_an_integer_conv2d_is_refused_with_bad_args(onednn: Rig) -> None:
    assert conv_status(onednn, INT8, 0, hw.ACT_RELU6) == hw.ST_BAD_ARGS
    assert conv_status(onednn, INT8, 0, hw.ACT_RELU) == hw.ST_OK


@pytest.mark.parametrize("name", ["bottleneck-1x1", "depthwise-3x3-s2"])
def test_relu6_conv2d_clamps_to_0_and_6_on_either_kernel(onednn: Rig, blas: Rig,
                                                          name: str) -> None:  # fmt: skip
    for rig in (onednn, blas):
        n, c, h, wd, o, kh, kw, st, pd, dl, g = NETWORK_CONVS[name]
        rng = np.random.default_rng([145, len(name)])
        x, w, b = conv_operands(rng, FP32, n, c, h, wd, o, kh, kw, g)
        got = run_conv(rig, hw.ACT_RELU6, x, w, b, st, pd, dl, g, what=name)
        assert (got == 0).any() and (got == 6).any() and ((got > 0) & (got < 6)).any()
