"""SELECT and CONVERT into a strided output on the device, and the ONNX ops built on them.

SELECT copies the chosen element's bits; a strided CONVERT writes only its
elements. Both are checked bit for bit against numpy, the driver's
refusals by errno through raw ioctls, and Where, Pad and nearest Resize
through ``npu.InferenceSession`` on the device.
"""

from __future__ import annotations

import errno

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tensor_helpers import cap_device, raw_submit

import npu
from npu import _abi, ops

D = npu.DType
RNG = np.random.default_rng(17)


@pytest.fixture(scope="module")
def sdev():
    yield from cap_device(npu.Cap.SELECT)


def _buf(dev: npu.Device, a: np.ndarray) -> npu.Buffer:
    buf = dev.alloc(max(a.nbytes, 64))
    buf.numpy(np.uint8, (a.nbytes,))[:] = a.reshape(-1).view(np.uint8)
    return buf


def _ref(buf, dt, shape, strides=None, offset=0) -> ops.TensorRef:
    return ops.tensor_ref(buf, dt, shape, strides, offset)


def test_select_copies_the_chosen_bits_with_broadcasting(sdev):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    x[0, 0, :3] = [np.nan, -0.0, np.inf]
    x.view(np.uint32)[0, 0, 0] = 0x7FC0_ABCD  # a NaN payload
    y = RNG.standard_normal((1, 4, 1)).astype(np.float32)
    c = RNG.random((3, 1, 5)) < 0.5
    c[0, 0, :3] = True
    bx, by, bc = _buf(sdev, x), _buf(sdev, y), _buf(sdev, c.astype(np.uint8))
    out = sdev.alloc(x.nbytes)
    op = ops.select(
        _ref(bc, D.BOOL, c.shape, (5, 0, 1)),
        _ref(bx, D.FP32, x.shape),
        _ref(by, D.FP32, y.shape, (0, 1, 0)),
        _ref(out, D.FP32, x.shape),
    )
    sdev.run([op])
    got = out.numpy(np.float32, x.shape)
    assert got.tobytes() == np.where(c, x, y).tobytes()
    for b in (bx, by, bc, out):
        b.free()


@pytest.mark.parametrize("dt,np_dt", [(D.INT8, np.int8), (D.INT32, np.int32), (D.BOOL, np.uint8)])
def test_select_of_integer_and_bool_values(sdev, dt, np_dt):
    x = RNG.integers(0, 2 if dt is D.BOOL else 100, (4, 6)).astype(np_dt)
    y = RNG.integers(0, 2 if dt is D.BOOL else 100, (4, 6)).astype(np_dt)
    c = (RNG.random((4, 6)) < 0.5).astype(np.uint8)
    bx, by, bc, out = _buf(sdev, x), _buf(sdev, y), _buf(sdev, c), sdev.alloc(x.nbytes)
    sdev.run([ops.select(_ref(bc, D.BOOL, c.shape), _ref(bx, dt, x.shape), _ref(by, dt, y.shape),
                         _ref(out, dt, x.shape))])  # fmt: skip
    assert np.array_equal(out.numpy(np_dt, x.shape), np.where(c != 0, x, y))
    for b in (bx, by, bc, out):
        b.free()


def test_strided_convert_writes_only_its_elements(sdev):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    bx = _buf(sdev, x)
    out = _buf(sdev, np.full((7, 10), -5.0, np.float32))
    # The interior of a 7x10 image at (2, 3), every other column: x as fp16
    # would round, so fp32 -> fp32 here; a second op converts to int32.
    sdev.run([ops.convert(_ref(bx, D.FP32, (3, 4)), _ref(out, D.FP32, (3, 4), (10, 2), 4 * 23))])
    got = out.numpy(np.float32, (7, 10))
    want = np.full((7, 10), -5.0, np.float32)
    want[2:5, 3:11:2] = x
    assert got.tobytes() == want.tobytes()
    bx.free()
    out.free()


def test_strided_convert_changes_the_dtype_into_place(sdev):
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
    bx = _buf(sdev, x)
    out = _buf(sdev, np.full((4, 3), 99, np.int32))
    # Transposed placement: out[j, i] = int(x[i, j]) for a 3x4 into 4x3.
    sdev.run([ops.convert(_ref(bx, D.FP32, (3, 4)), _ref(out, D.INT32, (3, 4), (1, 3)))])
    assert np.array_equal(out.numpy(np.int32, (4, 3)), np.trunc(x).astype(np.int32).T)
    bx.free()
    out.free()


def _raw(op: ops.TensorOp) -> _abi.NpuTensorOp:
    return op.pack()


def test_driver_refuses_an_overlapping_strided_output_and_a_bad_select(sdev):
    buf = sdev.alloc(4096)
    fd = sdev.fileno()
    good_in = _ref(buf, D.FP32, (2, 3))
    cases = {
        "overlapping out": ops.TensorOp(
            _abi.Opcode.CONVERT, 0, (good_in, _ref(buf, D.FP32, (2, 3), (2, 1), 64)), (buf,)
        ),
        "zero-stride out": ops.TensorOp(
            _abi.Opcode.CONVERT, 0, (good_in, _ref(buf, D.FP32, (2, 3), (3, 0), 64)), (buf,)
        ),
        "strided eltwise out": ops.TensorOp(
            _abi.Opcode.ELTWISE,
            0,
            (good_in, good_in, _ref(buf, D.FP32, (2, 3), (6, 2), 64)),
            (buf,),
        ),
        "float cond": ops.TensorOp(
            _abi.Opcode.SELECT,
            0,
            (good_in, good_in, good_in, _ref(buf, D.FP32, (2, 3), None, 64)),
            (buf,),
        ),
        "select kind": ops.TensorOp(
            _abi.Opcode.SELECT,
            1,
            (_ref(buf, D.BOOL, (2, 3)), good_in, good_in, _ref(buf, D.FP32, (2, 3), None, 64)),
            (buf,),
        ),
    }
    failures = []
    for name, op in cases.items():
        try:
            raw_submit(fd, [_raw(op)])
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                failures.append(f"{name}: {errno.errorcode.get(exc.errno)}")
            continue
        failures.append(f"{name}: accepted")
    assert not failures, failures
    buf.free()


def _session_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    with npu.InferenceSession(model.SerializeToString()) as sess:
        out = sess.run(None, feeds)[0]
        return np.array(out), dict(sess.placement)


def _model(node: onnx.NodeProto, ins, out_rank: int, inits, opset: int = 17):
    graph = helper.make_graph(
        [node],
        "t",
        ins,
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [None] * out_rank)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def test_where_pad_and_resize_run_on_the_device_bit_exact(sdev):
    x = RNG.standard_normal((1, 3, 5, 6)).astype(np.float32)
    fx = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))
    failures = []
    # Where(x > 0, x, 0.5 * x)-like: condition and branches as inputs.
    c = x > 0
    y = (0.5 * x).astype(np.float32)
    where = _model(
        helper.make_node("Where", ["c", "x", "y"], ["o"], name="n"),
        [helper.make_tensor_value_info("c", TensorProto.BOOL, list(x.shape)), fx,
         helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        4, {},
    )  # fmt: skip
    got, placement = _session_run(where, {"c": c, "x": x, "y": y})
    if got.tobytes() != np.where(c, x, y).tobytes() or placement != {"n": "NPU"}:
        failures.append(f"Where {placement}")
    for mode in ("constant", "edge", "reflect", "wrap"):
        pads = np.array([0, 1, 2, 1, 0, 2, 1, 3], np.int64)
        ins = ["x", "pads"] + (["v"] if mode == "constant" else [])
        inits = {"pads": pads, "v": np.array(1.25, np.float32)}
        if mode != "constant":
            del inits["v"]
        m = _model(helper.make_node("Pad", ins, ["o"], name="n", mode=mode), [fx], 4, inits)
        got, placement = _session_run(m, {"x": x})
        widths = list(zip(pads[:4], pads[4:], strict=True))
        want = (
            np.pad(x, widths, constant_values=np.float32(1.25))
            if mode == "constant"
            else np.pad(x, widths, mode=mode)
        )
        if got.tobytes() != want.tobytes() or placement != {"n": "NPU"}:
            failures.append(f"Pad {mode} {placement}")
    resize = _model(
        helper.make_node("Resize", ["x", "", "s"], ["o"], name="n", mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        [fx], 4, {"s": np.array([1, 1, 2, 3], np.float32)},
    )  # fmt: skip
    got, placement = _session_run(resize, {"x": x})
    want = x.repeat(2, axis=2).repeat(3, axis=3)
    if got.tobytes() != want.tobytes() or placement != {"n": "NPU"}:
        failures.append(f"Resize {placement}")
    assert not failures, failures
