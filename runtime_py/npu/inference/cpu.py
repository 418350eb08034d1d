"""The CPU provider: numpy kernels for the runner's ops, and the ``onnx.reference`` fallback.

Every op the NPU provider covers has a numpy kernel here (convolution by
im2col + matmul, pooling by ``sliding_window_view``, ...), including the
fused forms the rewrites create (Conv/Gemm/MatMul with a fused activation
and MatMul with a bias input). It runs the nodes the NPU cannot and, with
``providers=("CPU",)``, the whole model: the "numpy in the guest" baseline.

Any other standard op runs through ``onnx.reference.ReferenceEvaluator`` on
a one-node model built from the node's original ``NodeProto``
(:class:`ReferenceKernel`); nodes of unknown ops raise :class:`ModelError`
when the session is created.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import helper

from .graph import NPU_MIN_OPSET, Graph, ModelError, Node, elem_type, np_dtype

__all__ = [
    "CPU_OPS",
    "Array",
    "Kernel",
    "ReferenceKernel",
    "conv_pads",
    "cpu_kernel",
    "erf",
    "reduce_axes",
    "register_kernel",
    "reshape_target",
]

log = logging.getLogger(__name__)

Array: TypeAlias = npt.NDArray[Any]
#: A kernel: (node, inputs (None for omitted ones), opset) -> outputs.
Kernel: TypeAlias = Callable[[Node, list[Array | None], int], list[Array]]


# ---------------------------------------------------------------------------
# Helpers shared with the NPU provider
# ---------------------------------------------------------------------------


def erf(x: Array) -> Array:
    """``erf`` in float64 (Abramowitz & Stegun 7.1.26 refined; |error| < 2e-7)."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    # Numerical Recipes erfc (Chebyshev fit), relative error < 1.2e-7.
    poly = (
        -z * z
        - 1.26551223
        + t
        * (
            1.00002368
            + t
            * (
                0.37409196
                + t
                * (
                    0.09678418
                    + t
                    * (
                        -0.18628806
                        + t
                        * (
                            0.27886807
                            + t
                            * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))
                        )
                    )
                )
            )
        )
    )
    erfc = t * np.exp(poly)
    out: Array = np.where(x >= 0, 1.0 - erfc, erfc - 1.0)
    return out


def conv_pads(
    attrs: dict[str, Any],
    spatial: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
) -> list[int]:
    """ONNX ``pads`` (begins then ends) of a Conv/pool, resolving ``auto_pad``."""
    nd = len(kernel)
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            if auto == "SAME_UPPER":
                begins.append(small)
                ends.append(big)
            else:
                begins.append(big)
                ends.append(small)
        return begins + ends
    if auto == "VALID":
        return [0] * (2 * nd)
    pads = attrs.get("pads")
    return [int(p) for p in pads] if pads is not None else [0] * (2 * nd)


def reduce_axes(node: Node, axes_input: Array | None, rank: int, opset: int) -> list[int] | None:
    """The sorted non-negative axes of a Reduce* node; ``None`` means "nothing to reduce"."""
    axes: Any = node.attrs.get("axes")
    if axes is None and axes_input is not None:
        axes = [int(a) for a in np.asarray(axes_input).reshape(-1)]
    if axes is None or len(axes) == 0:
        if node.attrs.get("noop_with_empty_axes", 0):
            return None
        return list(range(rank))
    return sorted({int(a) % rank if rank else 0 for a in axes})


def reshape_target(
    in_shape: Sequence[int], shape: Sequence[int], allowzero: bool
) -> tuple[int, ...]:
    """The output shape of ONNX Reshape (``0`` copies, ``-1`` infers)."""
    dims = [int(d) for d in shape]
    if not allowzero:
        dims = [in_shape[i] if d == 0 and i < len(in_shape) else d for i, d in enumerate(dims)]
    total = math.prod(in_shape)
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = total // known if known else 0
    if math.prod(dims) != total:
        raise ValueError(f"cannot reshape {tuple(in_shape)} to {tuple(shape)}")
    return tuple(dims)


def _axes_arg(node: Node, xs: list[Array | None], idx: int = 1) -> list[int] | None:
    axes = node.attrs.get("axes")
    if axes is None and len(xs) > idx and xs[idx] is not None:
        axes = [int(a) for a in np.asarray(xs[idx]).reshape(-1)]
    return None if axes is None else [int(a) for a in axes]


def _act(y: Array, act: str) -> Array:
    if act == "Relu":
        return np.maximum(y, 0, out=y) if y.flags.writeable else np.maximum(y, 0)
    if act == "Gelu":
        return _gelu(y)
    if act == "Relu6":
        return np.minimum(np.maximum(y, 0), 6).astype(y.dtype, copy=False)
    return y


def _gelu(x: Array) -> Array:
    out: Array = (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype)
    return out


def _req(x: Array | None) -> Array:
    if x is None:
        raise ValueError("a required input is missing")
    return x


# ---------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------


def _conv(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x, w = _req(xs[0]), _req(xs[1])
    b = xs[2] if len(xs) > 2 else None
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    sh, sw = node.attrs.get("strides", [1, 1])
    dh, dw = node.attrs.get("dilations", [1, 1])
    g = int(node.attrs.get("group", 1))
    pt, pl, pb, pr = conv_pads(node.attrs, (h, wd), (kh, kw), (sh, sw), (dh, dw))
    if pt or pl or pb or pr:
        x = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ekh, ekw = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    win = sliding_window_view(x, (ekh, ekw), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    oh, ow = win.shape[2], win.shape[3]
    og = o // g
    y: Array
    if g == 1:
        # One GEMM over the whole batch: [N*OH*OW, C*KH*KW] @ [C*KH*KW, O].
        cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * kh * kw)
        y = (cols @ w.reshape(o, c * kh * kw).T).reshape(n, oh, ow, o).transpose(0, 3, 1, 2)
        y = np.ascontiguousarray(y).reshape(n, o, oh * ow)
    elif cg == 1 and og == 1:  # depthwise: one multiply-add per tap
        y = np.zeros((n, c, oh, ow), np.result_type(x, w))
        for i in range(kh):
            for j in range(kw):
                y += win[:, :, :, :, i, j] * w[:, 0, i, j].reshape(1, c, 1, 1)
        y = y.reshape(n, o, oh * ow)
    else:
        parts = []
        for gi in range(g):
            wg = w[gi * og : (gi + 1) * og].reshape(og, cg * kh * kw)
            cols = (
                win[:, gi * cg : (gi + 1) * cg]
                .transpose(0, 2, 3, 1, 4, 5)
                .reshape(n * oh * ow, cg * kh * kw)
            )
            parts.append((cols @ wg.T).reshape(n, oh * ow, og).transpose(0, 2, 1))
        y = np.concatenate(parts, axis=1)
    y = y.reshape(n, o, oh, ow)
    if b is not None:
        y += b.reshape(1, o, 1, 1)
    if node.residual:
        y += _req(xs[3])
    return [_act(y.astype(x.dtype, copy=False), node.act)]


def _gemm(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    a, b = _req(xs[0]), _req(xs[1])
    c = xs[2] if len(xs) > 2 else None
    if node.attrs.get("transA", 0):
        a = a.T
    if node.attrs.get("transB", 0):
        b = b.T
    alpha = float(node.attrs.get("alpha", 1.0))
    beta = float(node.attrs.get("beta", 1.0))
    y = a @ b
    if alpha != 1.0:
        y = y * np.asarray(alpha, dtype=y.dtype)
    if c is not None:
        y = y + (c if beta == 1.0 else c * np.asarray(beta, dtype=c.dtype))
    return [_act(y.astype(a.dtype, copy=False), node.act)]


def _matmul(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    a, b = _req(xs[0]), _req(xs[1])
    y = np.matmul(a, b)
    if len(xs) > 2 and xs[2] is not None:
        y += xs[2]
    return [_act(y, node.act)]


def _binary(fn: Callable[[Array, Array], Array]) -> Kernel:
    def kernel(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
        args = [_req(x) for x in xs]
        y = args[0]
        for z in args[1:]:
            y = fn(y, z)
        return [np.asarray(y)]

    return kernel


def _div(a: Array, b: Array) -> Array:
    if np.issubdtype(a.dtype, np.integer):
        q: Array = (np.abs(a) // np.abs(b)) * (np.sign(a) * np.sign(b))
        return q.astype(a.dtype)
    out: Array = np.divide(a, b)
    return out


def _unary(fn: Callable[[Array], Array]) -> Kernel:
    def kernel(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
        x = _req(xs[0])
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            return [np.asarray(fn(x)).astype(x.dtype, copy=False)]

    return kernel


def _sigmoid(x: Array) -> Array:
    out: Array = 1.0 / (1.0 + np.exp(-x))
    return out


def _gelu_kernel(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    if node.attrs.get("approximate", "none") == "tanh":
        k = math.sqrt(2.0 / math.pi)
        y = 0.5 * x * (1.0 + np.tanh(k * (x + 0.044715 * x**3)))
        return [y.astype(x.dtype)]
    return [_gelu(x)]


def _pool(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    kmax = node.op_type == "MaxPool"
    nd = x.ndim - 2
    kernel = [int(k) for k in node.attrs["kernel_shape"]]
    strides = [int(s) for s in node.attrs.get("strides", [1] * nd)]
    pads = conv_pads(node.attrs, x.shape[2:], kernel, strides, [1] * nd)
    pad_width = [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)]
    fill = -np.inf if kmax else 0
    xp = np.pad(x, pad_width, constant_values=fill) if any(pads) else x
    if nd != 2:
        return [_pool_nd(node, x, xp, kernel, strides, pads, pad_width, kmax)]
    (kh, kw), (sh, sw) = kernel, strides
    oh = (xp.shape[2] - kh) // sh + 1
    ow = (xp.shape[3] - kw) // sw + 1
    acc_t = np.float32 if x.dtype == np.float16 else x.dtype
    y: Array | None = None
    for i in range(kh):  # one strided slice per kernel tap
        for j in range(kw):
            tap = xp[:, :, i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw]
            if y is None:
                y = np.array(tap, dtype=acc_t)
            elif kmax:
                np.maximum(y, tap, out=y)
            else:
                y += tap
    assert y is not None
    if kmax:
        return [y.astype(x.dtype, copy=False)]
    if any(pads) and not node.attrs.get("count_include_pad", 0):
        ones = np.pad(np.ones(x.shape[2:], np.float32), pad_width[2:])
        cw = sliding_window_view(ones, kernel)[::sh, ::sw]
        y = y / cw.sum(axis=(2, 3))
    else:
        y = y / (kh * kw)
    return [y.astype(x.dtype, copy=False)]


def _pool_nd(
    node: Node,
    x: Array,
    xp: Array,
    kernel: list[int],
    strides: list[int],
    pads: list[int],
    pad_width: list[tuple[int, int]],
    kmax: bool,
) -> Array:
    """Pooling over any number of spatial dims with ``sliding_window_view``."""
    nd = len(kernel)
    axes = tuple(range(2, 2 + nd))
    win = sliding_window_view(xp, kernel, axis=axes)
    win = win[(slice(None), slice(None), *(slice(None, None, s) for s in strides))]
    red = tuple(range(2 + nd, 2 + 2 * nd))
    if kmax:
        out: Array = win.max(axis=red)
        return out
    y = win.sum(axis=red, dtype=np.float32 if x.dtype == np.float16 else x.dtype)
    if any(pads) and not node.attrs.get("count_include_pad", 0):
        ones = np.pad(np.ones(x.shape[2:], x.dtype), pad_width[2:])
        cw = sliding_window_view(ones, kernel)
        cw = cw[tuple(slice(None, None, s) for s in strides)]
        y = y / cw.sum(axis=tuple(range(nd, 2 * nd)))
    else:
        y = y / math.prod(kernel)
    res: Array = y.astype(x.dtype, copy=False)
    return res


def _global_pool(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    axes = tuple(range(2, x.ndim))
    if node.op_type == "GlobalMaxPool":
        return [x.max(axis=axes, keepdims=True)]
    return [x.mean(axis=axes, keepdims=True, dtype=np.float32).astype(x.dtype, copy=False)]


def _softmax(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    log_ = node.op_type == "LogSoftmax"
    axis = int(node.attrs.get("axis", -1 if opset >= 13 else 1))
    shape = x.shape
    if opset < 13:
        axis %= max(x.ndim, 1)
        x = x.reshape(math.prod(shape[:axis]), -1)
        axis = 1
    m = x.max(axis=axis, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    y = (x - m) - np.log(s) if log_ else e / s
    return [y.reshape(shape)]


def _layernorm(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x, scale = _req(xs[0]), _req(xs[1])
    bias = xs[2] if len(xs) > 2 else None
    axis = int(node.attrs.get("axis", -1)) % x.ndim
    eps = float(node.attrs.get("epsilon", 1e-5))
    axes = tuple(range(axis, x.ndim))
    xf = x.astype(np.float32)
    mean = xf.mean(axis=axes, keepdims=True)
    d = xf - mean
    var = (d * d).mean(axis=axes, keepdims=True)
    y = d / np.sqrt(var + np.float32(eps)) * scale
    if bias is not None:
        y = y + bias
    return [y.astype(x.dtype, copy=False)]


def _reduce(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    axes_in = xs[1] if len(xs) > 1 else None
    axes = reduce_axes(node, axes_in, x.ndim, opset)
    if axes is None:
        return [x]
    keep = bool(node.attrs.get("keepdims", 1))
    reducers: dict[str, Callable[..., Any]] = {
        "ReduceSum": np.sum,
        "ReduceMean": np.mean,
        "ReduceMax": np.max,
        "ReduceMin": np.min,
    }
    fn = reducers[node.op_type]
    extra: dict[str, Any] = {}
    if x.size == 0 and node.op_type in ("ReduceMax", "ReduceMin"):
        # The empty set's max is the lowest value (min: the highest).
        info = np.finfo(x.dtype) if x.dtype.kind == "f" else np.iinfo(x.dtype)
        low = -np.inf if x.dtype.kind == "f" else info.min
        high = np.inf if x.dtype.kind == "f" else info.max
        extra["initial"] = low if node.op_type == "ReduceMax" else high
    y = fn(x, axis=tuple(axes), keepdims=keep, **extra)
    return [np.asarray(y).astype(x.dtype, copy=False)]


def _transpose(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    perm = node.attrs.get("perm")
    return [np.asarray(np.transpose(x, perm), order="C")]  # keeps rank 0


def _custom(dtype: np.dtype[Any] | None) -> bool:
    """Whether ``dtype`` is one of onnx.reference's (bfloat16, float8, int4)."""
    return dtype is not None and dtype.fields is not None


def _cast_target(node: Node) -> np.dtype[Any] | None:
    return np_dtype(int(node.attrs.get("to", 0)))


def _cast(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    to = np.dtype(helper.tensor_dtype_to_np_dtype(int(node.attrs["to"])))
    if to.kind == "O":  # STRING: numpy's shortest round-trip text of the source dtype
        return [x.astype(np.str_).astype(object)]
    with np.errstate(invalid="ignore", over="ignore"):
        return [x.astype(to)]


def _flatten(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    axis = int(node.attrs.get("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis  # in [-r, r]: -1 is r - 1
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


def _reshape(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    if opset < 5 or len(xs) < 2:
        shape = [int(d) for d in node.attrs["shape"]]
    else:
        shape = [int(d) for d in _req(xs[1]).reshape(-1)]
    return [x.reshape(reshape_target(x.shape, shape, bool(node.attrs.get("allowzero", 0))))]


def _squeeze(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    axes = _axes_arg(node, xs)
    if axes is None:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(a % x.ndim for a in axes))]


def _unsqueeze(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    axes = _axes_arg(node, xs) or []
    r = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(a % r for a in axes)))]


def _identity(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    outs = [x]
    if len(node.outputs) > 1:  # Dropout's mask
        outs.append(np.ones(x.shape, dtype=bool))
    return outs


def _optional(node: Node, xs: list[Array | None], opset: int) -> list[Any]:
    """Optional(x) is x itself (a tensor or a sequence); Optional() is the empty optional.

    onnx.reference 1.17 wraps the value in a one-element list, which turns a
    sequence of [5] tensors into [1, 5] (onnx's test_if_opt).
    """
    return [xs[0] if xs else None]


def _batchnorm(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x, scale, bias, mean, var = (_req(v) for v in xs[:5])
    eps = float(node.attrs.get("epsilon", 1e-5))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    s = (scale / np.sqrt(var + np.float32(eps))).astype(x.dtype)
    y = x * s.reshape(shape) + (bias - mean * s).astype(x.dtype).reshape(shape)
    return [y.astype(x.dtype, copy=False)]


def _shape(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    dims = list(x.shape)
    start = int(node.attrs.get("start", 0))
    end = node.attrs.get("end")
    return [np.array(dims[start : None if end is None else int(end)], dtype=np.int64)]


def _concat(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    return [np.concatenate([_req(x) for x in xs], axis=int(node.attrs["axis"]))]


def _scatter(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    """Scatter (opsets 9 and 10; ScatterElements without a reduction)."""
    data, idx, upd = _req(xs[0]), _req(xs[1]).astype(np.int64), _req(xs[2])
    axis = int(node.attrs.get("axis", 0))
    axis = axis + data.ndim if axis < 0 else axis
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    out = np.array(data, copy=True)
    np.put_along_axis(out, idx, upd, axis=axis)
    return [out]


def _lrn(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    """LRN over channels (onnx.reference 1.17 loops over the batch axis instead)."""
    x = _req(xs[0])
    a = node.attrs
    size = int(a["size"])
    alpha, beta, bias = (
        float(a.get("alpha", 1e-4)),
        float(a.get("beta", 0.75)),
        float(a.get("bias", 1.0)),
    )
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = np.pad(x.astype(np.float64) ** 2, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    c = x.shape[1]
    window = sum(sq[:, i : i + c] for i in range(size))
    return [(x / (bias + alpha / size * window) ** beta).astype(x.dtype)]


def _pad(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    """Pad: negative pads crop first (onnx.reference 1.17 fails on them), then numpy pads."""
    x = _req(xs[0])
    a = node.attrs
    mode = a.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    r = x.ndim
    value: Any = 0
    if opset < 11:
        pads = [int(p) for p in a.get("pads", [])]
        value = a.get("value", 0.0)
        axes = list(range(r))
    else:
        pads = [int(p) for p in _req(xs[1]).reshape(-1)]
        if len(xs) > 2 and xs[2] is not None and xs[2].size:
            value = xs[2].reshape(-1)[0]
        axes = (
            [int(v) % r for v in xs[3].reshape(-1)]
            if len(xs) > 3 and xs[3] is not None
            else list(range(r))
        )
    begin, end = [0] * r, [0] * r
    for k, ax in enumerate(axes):
        begin[ax], end[ax] = pads[k], pads[k + len(axes)]
    x = x[
        tuple(
            slice(max(-b, 0), n - max(-e, 0)) for b, e, n in zip(begin, end, x.shape, strict=True)
        )
    ]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end, strict=True)]
    if mode == "constant":
        return [np.pad(x, widths, mode="constant", constant_values=np.asarray(value, x.dtype))]
    numpy_mode: Any = mode  # edge, reflect or wrap (numpy_kernel_ok)
    return [np.pad(x, widths, mode=numpy_mode)]


def _erf_kernel(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x = _req(xs[0])
    return [erf(x).astype(x.dtype)]


CPU_OPS: dict[str, Kernel] = {
    "Conv": _conv,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _binary(_div),
    "Max": _binary(np.maximum),
    "Min": _binary(np.minimum),
    "Sum": _binary(np.add),
    "Relu": _unary(lambda x: np.maximum(x, 0)),
    "Sigmoid": _unary(_sigmoid),
    "Tanh": _unary(np.tanh),
    "Exp": _unary(np.exp),
    "Log": _unary(np.log),
    "Sqrt": _unary(np.sqrt),
    "Abs": _unary(np.abs),
    "Neg": _unary(np.negative),
    "Erf": _erf_kernel,
    "Gelu": _gelu_kernel,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "GlobalAveragePool": _global_pool,
    "GlobalMaxPool": _global_pool,
    "Softmax": _softmax,
    "LogSoftmax": _softmax,
    "LayerNormalization": _layernorm,
    "ReduceSum": _reduce,
    "ReduceMean": _reduce,
    "ReduceMax": _reduce,
    "ReduceMin": _reduce,
    "Transpose": _transpose,
    "Cast": _cast,
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Identity": _identity,
    "Optional": _optional,
    "Dropout": _identity,
    "BatchNormalization": _batchnorm,
    "Shape": _shape,
    "Concat": _concat,
    "Scatter": _scatter,
    "LRN": _lrn,
    "Pad": _pad,
}


#: Kernels of ops outside the default domain, by (domain, op type).
_DOMAIN_OPS: dict[tuple[str, str], Kernel] = {}
#: Registered kernels' rules: whether the kernel covers a node.
_ACCEPTS: dict[tuple[str, str], Callable[[Node, Graph], bool]] = {}


def register_kernel(
    op_type: str,
    kernel: Kernel,
    domain: str = "",
    accepts: Callable[[Node, Graph], bool] | None = None,
) -> None:
    """Add the numpy kernel of ``op_type`` (of ``domain``) to the CPU provider.

    ``accepts(node, graph)`` says whether it covers a node's attributes and
    dtypes; nodes it refuses run with onnx.reference.
    """
    if domain in ("", "ai.onnx"):
        CPU_OPS[op_type] = kernel
        domain = ""
    else:
        _DOMAIN_OPS[(domain, op_type)] = kernel
    if accepts is not None:
        _ACCEPTS[(domain, op_type)] = accepts


def numpy_kernel_ok(node: Node, graph: Graph) -> bool:
    """Whether the numpy kernel covers this node's attributes (else the reference runs it)."""
    key = (node.domain if node.domain not in ("", "ai.onnx") else "", node.op_type)
    if key in _ACCEPTS and not _ACCEPTS[key](node, graph):
        return False
    if key[0]:
        return key in _DOMAIN_OPS
    if node.op_type not in CPU_OPS:
        return False
    if graph.opset < NPU_MIN_OPSET or any(
        _custom(graph.tensor_info(n).dtype) for n in [*node.inputs, *node.outputs] if n
    ):
        return False
    a = node.attrs
    op = node.op_type
    rank = graph.tensor_info(node.input(0)).rank if node.inputs else None
    if op == "Conv":
        w = graph.tensor_info(node.input(1)).rank
        return rank == 4 and w == 4
    if op in ("MaxPool", "AveragePool"):
        return (
            rank is not None
            and rank >= 3
            and not a.get("ceil_mode", 0)
            and not a.get("storage_order", 0)
            and all(d == 1 for d in a.get("dilations", [1]))
            and len([o for o in node.outputs if o]) == 1
        )
    if op == "BatchNormalization":
        return len([o for o in node.outputs if o]) == 1 and not a.get("training_mode", 0)
    if op == "LayerNormalization":
        return len([o for o in node.outputs if o]) == 1
    if op == "Dropout":
        return len(node.inputs) < 3 or (
            graph.const(node.input(2)) is not None and not bool(graph.initializers[node.input(2)])
        )
    if op == "Cast":
        return a.get("saturate", 1) == 1 and not _custom(_cast_target(node))
    if op == "Pad":
        mode = a.get("mode", "constant")
        return (mode.decode() if isinstance(mode, bytes) else str(mode)) in (
            "constant",
            "edge",
            "reflect",
            "wrap",
        )
    return True


@functools.cache
def _reference_fixes() -> list[type]:
    """onnx.reference ops replaced by spec-following ones (used in subgraphs too)."""
    from onnx.reference.op_run import OpRun

    class Optional(OpRun):
        """Optional(x) is x; 1.17's wraps it in a list (see :func:`_optional`)."""

        op_domain = ""

        def _run(self, x: Any = None, type: Any = None) -> tuple[Any]:
            return (x,)

    return [Optional]


class ReferenceKernel:
    """Runs one node with ``onnx.reference.ReferenceEvaluator`` (the fallback of last resort).

    Raises:
        ModelError: at construction, when the reference has no implementation.
    """

    def __init__(self, node: Node, graph: Graph) -> None:
        from onnx.reference import ReferenceEvaluator

        if node.proto is None:
            raise ModelError(
                f"{graph.source}: {node.describe()}: rewritten node has no CPU implementation"
            )
        self.node = node
        self.inputs = [i for i in node.inputs if i]
        # Loop: output index (among the node's listed outputs) -> rank of a
        # scan output, where it is known.
        self.scan_ranks: dict[int, int] = {}
        if node.op_type == "Loop" and node.proto is not None:
            body = next(a.g for a in node.proto.attribute if a.name == "body")
            carried = len(body.input) - 2
            listed = [i for i, o in enumerate(node.outputs) if o]
            for idx in range(carried, len(node.outputs)):
                # A scan output's rank: the body's declared rank plus one, or
                # what shape inference found for the node's output.
                rank = graph.tensor_info(node.outputs[idx]).rank
                vo = body.output[1 + idx] if 1 + idx < len(body.output) else None
                if rank is None and vo is not None and vo.type.tensor_type.HasField("shape"):
                    rank = len(vo.type.tensor_type.shape.dim) + 1
                if rank is not None and idx in listed:
                    self.scan_ranks[listed.index(idx)] = rank

        def vi(name: str) -> onnx.ValueInfoProto:
            info = graph.tensor_info(name)
            if info.dtype is None:
                return onnx.ValueInfoProto(name=name)
            elem = elem_type(info.dtype)
            return helper.make_tensor_value_info(name, elem, None)

        one = helper.make_graph(
            [node.proto],
            f"{node.name}_graph",
            [vi(n) for n in dict.fromkeys(self.inputs)],
            [vi(n) for n in node.outputs if n],
        )
        model = helper.make_model(
            one,
            opset_imports=[helper.make_opsetid(d, v) for d, v in graph.opsets.items()],
            ir_version=graph.ir_version,
        )
        try:
            fixes: Any = _reference_fixes()  # classes, which onnx's hints call OpRun
            self.evaluator = ReferenceEvaluator(model, new_ops=fixes)
        except Exception as exc:
            raise ModelError(
                f"{graph.source}: {node.describe()}: no NPU support and no CPU "
                f"implementation (onnx.reference: {type(exc).__name__}: {exc})"
            ) from exc

    def _fix_loop(self, got: Any) -> list[Any]:
        """onnx.reference 1.17 stacks a Loop's rank-0 scan outputs as [N, 1]; the spec says [N]."""
        outs: list[Any] = list(got)
        for k, rank in self.scan_ranks.items():
            o = outs[k] if k < len(outs) else None
            if rank == 1 and isinstance(o, np.ndarray) and o.ndim == 2 and o.shape[-1] == 1:
                outs[k] = o.reshape(o.shape[0])
        return outs

    def __call__(self, node: Node, xs: list[Array | None], opset: int) -> list[Array]:
        """Run the node on ``xs`` (the node's inputs, in order)."""
        feeds = {n: x for n, x in zip(node.inputs, xs, strict=False) if n}
        got = iter(self._fix_loop(self.evaluator.run(None, feeds)))
        # One value per node output ('' for an omitted one, which the
        # one-node model does not list); sequences (lists), maps and empty
        # optionals (None) stay as they are.
        outs: list[Any] = []
        for name in node.outputs:
            o = next(got) if name else None
            outs.append(o if o is None or isinstance(o, (list, dict)) else np.asarray(o))
        return outs


def cpu_kernel(node: Node, graph: Graph) -> Kernel:
    """The CPU kernel for ``node``: a numpy kernel, or a :class:`ReferenceKernel`.

    Raises:
        ModelError: the node has neither (unknown op).
    """
    if numpy_kernel_ok(node, graph):
        return _DOMAIN_OPS.get((node.domain, node.op_type)) or CPU_OPS[node.op_type]
    ref = ReferenceKernel(node, graph)
    log.info("%s: %s runs with onnx.reference on the CPU", graph.source, node.describe())
    return ref
