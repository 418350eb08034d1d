"""Where, Pad and Resize on the NPU provider (CPU backend), checked against onnxruntime.

Where is one SELECT; Pad and nearest Resize are strided CONVERT copies
(``Cap.STRIDED_OUT``). Every result is compared bit for bit with
onnxruntime: these ops move elements, they compute nothing.
"""

from __future__ import annotations

import errno
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import npu
from npu import _abi
from npu.hal.cpu import CPU_CAPS, CpuBackend
from npu.inference.resample import AxisMap, block_pattern, linear_pieces, merge_dims
from npu.kernels import ops
from onnx_models import make, vi

RNG = np.random.default_rng(43)
F, I32, I8, B = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT8, TensorProto.BOOL


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, feeds)]


def _run(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], device: npu.Device
) -> tuple[list[np.ndarray], dict[str, str], list[Any]]:
    with npu.InferenceSession(model.SerializeToString(), device=device) as sess:
        out = [np.array(o) for o in sess.run(None, feeds)]
        return out, dict(sess.placement), list(sess.fallbacks)


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()


def _check(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], device: npu.Device, op: str
) -> dict[str, str]:
    got, placement, fallbacks = _run(model, feeds, device)
    for g, w in zip(got, _ort(model, feeds), strict=True):
        _same(g, w)
    assert placement == {op: "NPU"}, fallbacks
    return placement


# -- Where ------------------------------------------------------------------------------


def _where_model(shapes: tuple[list[int], list[int], list[int]], elem: int, out: list[int]) -> Any:
    node = helper.make_node("Where", ["c", "x", "y"], ["o"], name="Where")
    return make(
        [node],
        [vi("c", shapes[0], B), vi("x", shapes[1], elem), vi("y", shapes[2], elem)],
        [vi("o", out, elem)],
    )


def test_where_selects_per_element_with_broadcasting(device: npu.Device) -> None:
    model = _where_model(([2, 1, 4], [2, 3, 4], [1, 3, 1]), F, [2, 3, 4])
    feeds = {
        "c": RNG.random((2, 1, 4)) < 0.5,
        "x": RNG.standard_normal((2, 3, 4)).astype(np.float32),
        "y": RNG.standard_normal((1, 3, 1)).astype(np.float32),
    }
    _check(model, feeds, device, "Where")


def test_where_keeps_nan_payloads_infinities_and_signed_zeros(device: npu.Device) -> None:
    model = _where_model(([6], [6], [6]), F, [6])
    x = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1.5], np.float32)
    x[0] = np.frombuffer(np.uint32(0x7FC0_1234).tobytes(), np.float32)[0]  # a NaN payload
    y = np.array([1, 2, 3, 4, 5, -0.0], np.float32)
    c = np.array([True, True, True, True, False, False])
    got, _, _ = _run(model, {"c": c, "x": x, "y": y}, device)
    _same(got[0], np.where(c, x, y))


@pytest.mark.parametrize("elem,dtype", [(I32, np.int32), (I8, np.int8), (B, np.bool_)])
def test_where_of_integer_and_bool_values(device: npu.Device, elem: int, dtype: Any) -> None:
    model = _where_model(([3, 4], [3, 4], [4]), elem, [3, 4])
    feeds = {
        "c": RNG.random((3, 4)) < 0.5,
        "x": RNG.integers(-100, 100, (3, 4)).astype(dtype),
        "y": RNG.integers(-100, 100, (4,)).astype(dtype),
    }
    got, placement, fallbacks = _run(model, feeds, device)  # onnxruntime has no bool Where
    _same(got[0], np.where(feeds["c"], feeds["x"], feeds["y"]))
    assert placement == {"Where": "NPU"}, fallbacks


def test_where_runs_on_the_cpu_without_cap_select() -> None:
    backend = CpuBackend(caps=CPU_CAPS & ~_abi.NPU_INFO_CAP_SELECT)
    with npu.Device(backend) as dev:
        model = _where_model(([4], [4], [4]), F, [4])
        c = np.array([True, False, True, False])
        x, y = np.arange(4, dtype=np.float32), -np.arange(4, dtype=np.float32)
        got, placement, fallbacks = _run(model, {"c": c, "x": x, "y": y}, dev)
        _same(got[0], np.where(c, x, y))
        assert placement == {"Where": "CPU"}
        assert any("SELECT" in str(f) for f in fallbacks)
    backend.close()


# -- Pad --------------------------------------------------------------------------------


def _pad_model(shape: list[int], pads: list[int], mode: str, value: float | None = None) -> Any:
    inits: dict[str, np.ndarray] = {"pads": np.array(pads, np.int64)}
    ins = ["x", "pads"]
    if value is not None:
        inits["value"] = np.array(value, np.float32)
        ins.append("value")
    node = helper.make_node("Pad", ins, ["o"], name="Pad", mode=mode)
    return make([node], [vi("x", shape)], [vi("o", [None] * len(shape))], inits)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
@pytest.mark.parametrize(
    "shape,pads",
    [
        ([1, 3, 5, 6], [0, 0, 1, 2, 0, 0, 2, 1]),
        ([2, 3, 4], [1, 0, 2, 0, 2, 1]),
        ([7], [3, 2]),
        ([2, 2, 3, 3], [1, 1, 1, 1, 1, 1, 2, 2]),
    ],
)
def test_pad_matches_onnxruntime_bit_for_bit(
    device: npu.Device, mode: str, shape: list[int], pads: list[int]
) -> None:
    model = _pad_model(shape, pads, mode, 2.5 if mode == "constant" else None)
    _check(model, {"x": RNG.standard_normal(shape).astype(np.float32)}, device, "Pad")


def test_pad_with_axes_pads_only_those_axes(device: npu.Device) -> None:
    inits = {"pads": np.array([1, 2, 3, 1], np.int64), "axes": np.array([-1, 1], np.int64)}
    node = helper.make_node("Pad", ["x", "pads", "", "axes"], ["o"], name="Pad", mode="edge")
    model = make([node], [vi("x", [2, 3, 4])], [vi("o", [None] * 3)], inits, opset=18)
    _check(model, {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)}, device, "Pad")


def test_pad_of_int8_with_a_constant(device: npu.Device) -> None:
    inits = {"pads": np.array([1, 2, 0, 1], np.int64), "value": np.array(-7, np.int8)}
    node = helper.make_node("Pad", ["x", "pads", "value"], ["o"], name="Pad")
    model = make([node], [vi("x", [3, 4], I8)], [vi("o", [None] * 2, I8)], inits)
    x = RNG.integers(-128, 128, (3, 4)).astype(np.int8)
    _check(model, {"x": x}, device, "Pad")


def test_pad_before_opset_11_reads_its_attributes(device: npu.Device) -> None:
    node = helper.make_node("Pad", ["x"], ["o"], name="Pad", mode="reflect", pads=[0, 2, 0, 1])
    model = make([node], [vi("x", [2, 4])], [vi("o", [None] * 2)], opset=10)
    _check(model, {"x": RNG.standard_normal((2, 4)).astype(np.float32)}, device, "Pad")


def test_pad_with_negative_pads_runs_on_the_cpu(device: npu.Device) -> None:
    model = _pad_model([4, 4], [-1, 0, 1, 0], "constant")
    x = RNG.standard_normal((4, 4)).astype(np.float32)
    got, placement, fallbacks = _run(model, {"x": x}, device)
    _same(got[0], _ort(model, {"x": x})[0])
    assert placement == {"Pad": "CPU"}
    assert any("negative pads" in str(f) for f in fallbacks)


def test_pad_runs_on_the_cpu_without_cap_strided_out() -> None:
    backend = CpuBackend(caps=CPU_CAPS & ~_abi.NPU_INFO_CAP_STRIDED_OUT)
    with npu.Device(backend) as dev:
        model = _pad_model([3, 3], [1, 1, 1, 1], "edge")
        x = RNG.standard_normal((3, 3)).astype(np.float32)
        got, placement, fallbacks = _run(model, {"x": x}, dev)
        _same(got[0], _ort(model, {"x": x})[0])
        assert placement == {"Pad": "CPU"}
        assert any("STRIDED_OUT" in str(f) for f in fallbacks)
    backend.close()


# -- Resize -----------------------------------------------------------------------------


def _resize_model(
    shape: list[int], scales: list[float] | None, sizes: list[int] | None, **attrs: Any
) -> Any:
    inits: dict[str, np.ndarray] = {}
    ins = ["x", "", "", ""]
    if scales is not None:
        inits["scales"] = np.array(scales, np.float32)
        ins[2] = "scales"
    if sizes is not None:
        inits["sizes"] = np.array(sizes, np.int64)
        ins[3] = "sizes"
    while not ins[-1]:
        ins.pop()
    node = helper.make_node("Resize", ins, ["o"], name="Resize", **attrs)
    return make([node], [vi("x", shape)], [vi("o", [None] * len(shape))], inits, opset=13)


@pytest.mark.parametrize(
    "coord,nearest",
    [
        ("asymmetric", "floor"),
        ("half_pixel", "round_prefer_floor"),
        ("half_pixel", "round_prefer_ceil"),
        ("pytorch_half_pixel", "round_prefer_floor"),
        ("align_corners", "round_prefer_floor"),
        ("asymmetric", "ceil"),
    ],
)
@pytest.mark.parametrize("scale", [2.0, 3.0, 1.5])
def test_nearest_resize_matches_onnxruntime_bit_for_bit(
    device: npu.Device, coord: str, nearest: str, scale: float
) -> None:
    """Repeating maps are one copy; others (align_corners at 3x, 1.5x) copy per piece."""
    model = _resize_model(
        [1, 2, 4, 4],
        [1, 1, scale, scale],
        None,
        mode="nearest",
        coordinate_transformation_mode=coord,
        nearest_mode=nearest,
    )
    _check(model, {"x": RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)}, device, "Resize")


def test_nearest_upsampling_without_cap_strided_out_is_one_repeating_copy() -> None:
    backend = CpuBackend(caps=CPU_CAPS & ~_abi.NPU_INFO_CAP_STRIDED_OUT)
    with npu.Device(backend) as dev:
        model = _resize_model(
            [1, 2, 3, 4],
            [1, 1, 2, 2],
            None,
            mode="nearest",
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
        )
        _check(model, {"x": RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)}, dev, "Resize")
    backend.close()


def test_nearest_downsampling_by_sizes_is_a_strided_copy(device: npu.Device) -> None:
    model = _resize_model(
        [2, 3, 8, 6],
        None,
        [2, 3, 4, 3],
        mode="nearest",
        coordinate_transformation_mode="asymmetric",
    )
    _check(model, {"x": RNG.standard_normal((2, 3, 8, 6)).astype(np.float32)}, device, "Resize")


@pytest.mark.parametrize(
    "coord", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
)
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 3, 1.5], [1, 1, 0.5, 0.75]])
def test_linear_resize_matches_onnxruntime(
    device: npu.Device, coord: str, scales: list[float]
) -> None:
    model = _resize_model(
        [2, 3, 8, 8], scales, None, mode="linear", coordinate_transformation_mode=coord
    )
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    got, placement, fallbacks = _run(model, {"x": x}, device)
    np.testing.assert_allclose(got[0], _ort(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert placement == {"Resize": "NPU"}, fallbacks


def test_linear_resize_of_a_sizes_target(device: npu.Device) -> None:
    model = _resize_model([1, 2, 5, 7], None, [1, 2, 9, 4], mode="linear")
    x = RNG.standard_normal((1, 2, 5, 7)).astype(np.float32)
    got, placement, fallbacks = _run(model, {"x": x}, device)
    np.testing.assert_allclose(got[0], _ort(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert placement == {"Resize": "NPU"}, fallbacks


def test_cubic_resize_runs_on_the_cpu_with_a_reason(device: npu.Device) -> None:
    model = _resize_model([1, 1, 4, 4], [1, 1, 2, 2], None, mode="cubic")
    x = RNG.standard_normal((1, 1, 4, 4)).astype(np.float32)
    got, placement, fallbacks = _run(model, {"x": x}, device)
    np.testing.assert_allclose(got[0], _ort(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert placement == {"Resize": "CPU"}
    assert any("cubic" in str(f) for f in fallbacks)


def test_linear_pieces_cover_every_output_once() -> None:
    for n_in, n_out in [(4, 8), (5, 10), (8, 3), (7, 13)]:
        w1 = tuple(float(o % 3) / 4 for o in range(n_out))
        i0 = tuple(min(o * n_in // n_out, n_in - 1) for o in range(n_out))
        i1 = tuple(min(i + 1, n_in - 1) for i in i0)
        pieces = linear_pieces(AxisMap(n_in, i0, i1, w1))
        seen = sorted(p.out0 + j * p.out_step for p in pieces for j in range(p.count))
        assert seen == list(range(n_out))
        for p in pieces:
            for j in range(p.count):
                o = p.out0 + j * p.out_step
                assert (p.in0 + j * p.in_step, p.in1 + j * p.in_step) == (i0[o], i1[o])
                assert p.w1 == w1[o]


# -- the device ops themselves ----------------------------------------------------------


def test_block_pattern_finds_repeats_and_steps() -> None:
    assert block_pattern([0, 0, 1, 1, 2, 2]) == (2, 1, 0)
    assert block_pattern([1, 3, 5]) == (1, 2, 1)
    assert block_pattern([0, 0, 0, 1, 1]) == (3, 1, 0)
    assert block_pattern([0, 1, 1, 2]) is None


def test_merge_dims_merges_alike_steps_and_loops_the_outer_ones() -> None:
    outer, inner = merge_dims([(2, 12, 24), (3, 4, 8), (4, 1, 2), (1, 5, 5)], 4)
    assert (outer, inner) == ([], [(24, 1, 2)])
    dims = [(2, 0, 32), (2, 1, 16), (2, 0, 8), (2, 1, 4), (2, 0, 2), (2, 1, 1)]
    outer, inner = merge_dims(dims, 4)
    assert len(inner) == 4 and [d[0] for d in outer] == [2, 2]


def _ref(buf: npu.Buffer, dtype: _abi.DType, shape: tuple[int, ...], strides: tuple[int, ...],
         offset: int = 0) -> ops.TensorRef:  # fmt: skip
    return ops.tensor_ref(buf, dtype, shape, strides, offset)


def test_strided_convert_writes_only_its_elements(device: npu.Device) -> None:
    src = device.alloc(64)
    dst = device.alloc(64)
    src.numpy(np.float32, (6,))[:] = np.arange(1, 7, dtype=np.float32)
    dst.numpy(np.float32, (16,))[:] = -1
    op = ops.convert(
        _ref(src, _abi.DType.FP32, (2, 3), (3, 1)), _ref(dst, _abi.DType.FP32, (2, 3), (8, 2))
    )
    device.run([op])
    got = dst.numpy(np.float32, (16,))
    want = np.full(16, -1, np.float32)
    want[[0, 2, 4, 8, 10, 12]] = np.arange(1, 7)
    _same(np.array(got), want)
    src.free()
    dst.free()


def test_a_strided_output_that_overlaps_itself_is_refused(device: npu.Device) -> None:
    buf = device.alloc(64)
    with pytest.raises(ValueError, match="overlap"):
        ops.convert(
            _ref(buf, _abi.DType.FP32, (2, 3), (3, 1)), _ref(buf, _abi.DType.FP32, (2, 3), (2, 1))
        )
    buf.free()


def test_select_needs_a_bool_condition(device: npu.Device) -> None:
    buf = device.alloc(64)
    x = _ref(buf, _abi.DType.FP32, (4,), (1,))
    with pytest.raises(ValueError, match="BOOL"):
        ops.select(x, x, x, x)
    buf.free()


def test_a_strided_convert_without_cap_strided_out_fails_with_eopnotsupp() -> None:
    backend = CpuBackend(caps=CPU_CAPS & ~_abi.NPU_INFO_CAP_STRIDED_OUT)
    with npu.Device(backend) as dev:
        src, dst = dev.alloc(64), dev.alloc(64)
        op = ops.convert(
            _ref(src, _abi.DType.FP32, (2, 3), (3, 1)), _ref(dst, _abi.DType.FP32, (2, 3), (8, 2))
        )
        with pytest.raises(npu.NpuError) as info:
            dev.run([op])
        assert info.value.errno == errno.EOPNOTSUPP
        src.free()
        dst.free()
    backend.close()
