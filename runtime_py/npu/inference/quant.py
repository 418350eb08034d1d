"""int8 models: the QDQ fusion rewrite and the CPU kernels of the integer ops.

A statically quantised model in QDQ form (onnxruntime's ``quantize_static``)
spells each quantised layer as float ops between ``DequantizeLinear`` and
``QuantizeLinear``::

    x_q -> DQ(sx, zx) -> Conv(w = DQ(w_q, sw), b = DQ(b_q, sx*sw)) [-> Relu] -> Q(sy, zy) -> y_q

:func:`fuse_qdq` turns each such island into one integer node, as
onnxruntime's own QDQ transformer does: ``QLinearConv`` (Conv),
``QLinearMatMul`` (MatMul) or ``com.microsoft.QGemm`` (Gemm), reading the
int8 tensors directly, with a fused ``Relu`` in ``Node.act``. The NPU runs
such a node as its integer CONV2D/MATMUL/LINEAR (exact int32 accumulators)
and one REQUANT whose scale is ``sx * sw / sy`` per output channel
(docs/npu-spec.md, section 8.5.9). The result is the exactly rounded
integer result; the float graph rounds its float sum instead, so an output
may differ from the unfused graph's by one quantisation step where the
float value lies within rounding of a half step (onnxruntime's fused
kernels differ from its unfused graph the same way).

:func:`signed_activations` runs first: it turns uint8 quantised tensors
(onnxruntime's default activations) into the equivalent int8 ones, which
the NPU has. The fusion applies only where the integer form means the same: int8
activations with scalar scales and zero points, int8 weights that are
constants with zero zero points (symmetric, per tensor or per output
channel), an int32 or float constant bias. Anything else is left as it
was and runs as float ops.

The CPU kernels here (``QLinearConv``, ``QLinearMatMul``, ``QGemm``) follow
the same integer definition with an exact requantisation
(:func:`requantize`), so a fused node gives the same bytes on either
provider; they honour ``Node.act`` (the onnx.reference fallback would not).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from .cpu import CPU_OPS, Array, Kernel, register_kernel
from .graph import Graph, Node, TensorInfo, np_dtype

__all__ = ["MS_DOMAIN", "fuse_qdq", "requant_scale", "requantize", "signed_activations"]

log = logging.getLogger(__name__)

#: onnxruntime's contrib-op domain (QGemm lives there).
MS_DOMAIN = "com.microsoft"
_INT8 = np.dtype(np.int8)
_F32 = np.dtype(np.float32)


# ---------------------------------------------------------------------------
# Exact requantisation
# ---------------------------------------------------------------------------


def requant_scale(*, x_scale: Array, w_scale: Array, y_scale: Array) -> Array:
    """The float32 requantisation scale ``x_scale * w_scale / y_scale`` (1-D).

    Computed in float64 and rounded once to float32, as the device takes it.
    """
    s = np.asarray(x_scale, np.float64) * np.asarray(w_scale, np.float64)
    out: Array = (s / np.asarray(y_scale, np.float64)).astype(np.float32).reshape(-1)
    return out


def requantize(
    acc: Array, scale: Array, zero_point: int, relu: bool, dtype: Any = np.int8
) -> Array:
    """``clamp(rne(acc * scale) + zero_point, lo, hi)`` as ``dtype``, the product exact.

    ``acc`` is integer, ``scale`` float32 broadcasting to it; ``[lo, hi]``
    is ``dtype``'s range (int8 or uint8), ``lo`` raised to ``zero_point``
    with ``relu``. Like the device's REQUANT, a
    float32 ``scale`` is ``m * 2**e`` with an integer ``m < 2**24``, so
    ``acc * m`` is an exact int64 and the ``2**e`` a shift rounding to
    nearest, ties to even.
    """
    a = np.asarray(acc, np.int64)
    frac, exp = np.frexp(np.asarray(scale, np.float32).astype(np.float64))
    m = np.broadcast_to((frac * (1 << 24)).astype(np.int64), a.shape)
    shift = np.broadcast_to(24 - exp.astype(np.int64), a.shape)
    p = a * m  # |acc| < 2**33, m < 2**24: exact in int64
    # p * 2**-shift, rounded half to even; a shift of 60 already gives 0 or +-1
    # before rounding for |p| < 2**57, so larger shifts are clipped to it.
    s = np.clip(shift, 0, 60)
    q = p >> s
    r = p - (q << s)
    half = np.where(s > 0, np.int64(1) << np.maximum(s - 1, 0), 0)
    up = (s > 0) & ((r > half) | ((r == half) & (q & 1 == 1)))
    q = q + up
    # Negative shifts (scales >= 2**24) only grow the value: saturate.
    q = np.where(shift < 0, np.sign(p) * (1 << 40), q)
    info = np.iinfo(dtype)
    lo = zero_point if relu else int(info.min)
    out: Array = np.clip(q + zero_point, lo, int(info.max)).astype(dtype)
    return out


# ---------------------------------------------------------------------------
# CPU kernels
# ---------------------------------------------------------------------------


def _scalar_int(x: Array | None) -> int:
    return 0 if x is None else int(np.asarray(x).reshape(-1)[0])


def _centered(x: Array, zp: Array | None, axis: int | None = None) -> Array:
    """``x - zp`` in float64 (exact); ``zp`` scalar or 1-D along ``axis``."""
    z = np.zeros(1) if zp is None else np.asarray(zp, np.float64)
    if z.size > 1 and axis is not None:
        shape = [1] * x.ndim
        shape[axis] = z.size
        z = z.reshape(shape)
    out: Array = np.asarray(x, np.float64) - z
    return out


def _channel_shape(n: int, rank: int, axis: int) -> tuple[int, ...]:
    shape = [1] * rank
    shape[axis] = n
    return tuple(shape)


def _finish(acc: Array, scale: Array, zp: Array | None, act: str, axis: int) -> Array:
    s = np.asarray(scale, np.float32).reshape(-1)
    if s.size > 1:
        s = s.reshape(_channel_shape(s.size, acc.ndim, axis))
    dtype = np.int8 if zp is None else np.asarray(zp).dtype
    return requantize(acc, s, _scalar_int(zp), act == "Relu", dtype)


def _int_acc(y: Array) -> Array:
    """Float64 sums of integer products (exact below 2**53) as int64."""
    out: Array = np.rint(y).astype(np.int64)
    return out


def _qlinear_conv(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    x, sx, zx, w, sw, zw, sy, zy = (xs + [None] * 9)[:8]
    bias = xs[8] if len(xs) > 8 else None
    assert x is not None and w is not None and sx is not None and sw is not None
    assert sy is not None
    conv = Node(node.name, "Conv", node.inputs[:2], node.outputs, dict(node.attrs))
    acc = _int_acc(CPU_OPS["Conv"](conv, [_centered(x, zx), _centered(w, zw, 0)], opset)[0])
    if bias is not None:
        acc = acc + np.asarray(bias, np.int64).reshape(1, -1, 1, 1)
    scale = requant_scale(x_scale=sx, w_scale=sw, y_scale=sy)
    if scale.size == 1:
        scale = np.broadcast_to(scale, (w.shape[0],))
    return [_finish(acc, scale, zy, node.act, 1)]


def _qlinear_matmul(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    a, sa, za, b, sb, zb, sy, zy = (xs + [None] * 8)[:8]
    assert a is not None and b is not None and sa is not None and sb is not None
    assert sy is not None
    bb = np.asarray(b)
    acc = _int_acc(np.matmul(_centered(a, za), _centered(bb, zb, bb.ndim - 1)))
    scale = requant_scale(x_scale=sa, w_scale=sb, y_scale=sy)
    return [_finish(acc, scale, zy, node.act, acc.ndim - 1)]


def _qgemm(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    """com.microsoft.QGemm: ``alpha * (A - za)(B - zb) + C``, requantised (or float)."""
    a, sa, za, b, sb, zb = xs[:6]
    c = xs[6] if len(xs) > 6 else None
    sy = xs[7] if len(xs) > 7 else None
    zy = xs[8] if len(xs) > 8 else None
    assert a is not None and b is not None and sa is not None and sb is not None
    at = node.attrs.get("transA", 0)
    bt = node.attrs.get("transB", 0)
    am = _centered(a, za).T if at else _centered(a, za)
    bm = _centered(b, zb, 0 if bt else 1)
    bm = bm.T if bt else bm
    acc = _int_acc(am @ bm)
    if c is not None:
        acc = acc + np.asarray(c, np.int64)
    alpha = float(node.attrs.get("alpha", 1.0))
    if sy is None:
        ab = np.asarray(sa, np.float32) * np.asarray(sb, np.float32) * np.float32(alpha)
        y: Array = (acc.astype(np.float32) * ab.reshape(-1)).astype(np.float32)
        return [np.maximum(y, 0) if node.act == "Relu" else y]
    scale = requant_scale(x_scale=np.asarray(sa, np.float64) * alpha, w_scale=sb, y_scale=sy)
    return [_finish(acc, scale, zy, node.act, 1)]


def _along(v: Array, rank: int, axis: int) -> Array:
    """A per-axis 1-D parameter shaped to broadcast along ``axis`` (scalars unchanged)."""
    a = np.asarray(v)
    if a.ndim == 1 and a.size > 1:
        return a.reshape(_channel_shape(a.size, rank, axis))
    return a.reshape(()) if a.size == 1 else a


def _axis(node: Node, rank: int) -> int:
    ax = int(node.attrs.get("axis", 1))
    return ax + rank if ax < 0 else ax


def _quantize_linear(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    """``saturate(rint(x / scale) + zero_point)``; NaN gives 0 (as the device's CONVERT)."""
    x, scale = np.asarray(xs[0]), np.asarray(xs[1])
    zp = xs[2] if len(xs) > 2 else None
    out_dt = _quantize_dtype(node, None if zp is None else zp.dtype)
    ax = _axis(node, x.ndim)
    v = np.rint(x / _along(scale, x.ndim, ax).astype(x.dtype))
    v = np.nan_to_num(v, nan=0.0, posinf=2.0**40, neginf=-(2.0**40))
    q = np.clip(v, -(2.0**40), 2.0**40).astype(np.int64)
    if zp is not None:
        q = q + _along(zp, x.ndim, ax).astype(np.int64)
    info = np.iinfo(out_dt)
    return [np.clip(q, info.min, info.max).astype(out_dt)]


def _quantize_dtype(node: Node, zp_dtype: np.dtype[Any] | None) -> np.dtype[Any]:
    """QuantizeLinear's output type: the zero point's, else ``output_dtype``, else uint8."""
    if zp_dtype is not None:
        return zp_dtype
    code = int(node.attrs.get("output_dtype", 0))
    got = np_dtype(code) if code else None
    return got if got is not None else np.dtype(np.uint8)


def _dequantize_linear(node: Node, xs: list[Array | None], opset: int) -> list[Array]:
    """``(x - zero_point) * scale`` in the scale's float type."""
    x, scale = np.asarray(xs[0]), np.asarray(xs[1])
    zp = xs[2] if len(xs) > 2 else None
    ax = _axis(node, x.ndim)
    s = _along(scale, x.ndim, ax)
    d = x.astype(s.dtype)
    if zp is not None:
        d = d - _along(zp, x.ndim, ax).astype(s.dtype)
    out: Array = (d * s).astype(s.dtype)
    return [out]


_QINTS = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32))


def _qdq_ok(node: Node, graph: Graph) -> bool:
    """Q/DQ the numpy kernels cover: no blocks, integer types, float scales."""
    if node.attrs.get("block_size", 0):
        return False
    scale = graph.tensor_info(node.input(1)).dtype
    if scale not in (np.dtype(np.float32), np.dtype(np.float16)):
        return False
    if node.op_type == "QuantizeLinear":
        out = graph.tensor_info(node.outputs[0]).dtype
        return out in _QINTS and graph.tensor_info(node.inputs[0]).dtype == scale
    return graph.tensor_info(node.inputs[0]).dtype in _QINTS


def _qlinear_ok(node: Node, graph: Graph) -> bool:
    """Integer nodes of int8/uint8 operands and float32 scales."""
    ints = (np.dtype(np.int8), np.dtype(np.uint8))
    scales = (1, 4, 6) if node.op_type != "QGemm" else (1, 4)
    return all(graph.tensor_info(node.input(i)).dtype in ints for i in (0, 3)) and all(
        graph.tensor_info(node.input(i)).dtype == _F32 for i in scales
    )


_KERNELS: list[tuple[str, str, Kernel, Callable[[Node, Graph], bool]]] = [
    ("", "QLinearConv", _qlinear_conv, _qlinear_ok),
    ("", "QLinearMatMul", _qlinear_matmul, _qlinear_ok),
    (MS_DOMAIN, "QGemm", _qgemm, _qlinear_ok),
    ("", "QuantizeLinear", _quantize_linear, _qdq_ok),
    ("", "DequantizeLinear", _dequantize_linear, _qdq_ok),
]
for _domain, _op, _kernel, _accepts in _KERNELS:
    register_kernel(_op, _kernel, _domain, _accepts)


# ---------------------------------------------------------------------------
# The QDQ fusion
# ---------------------------------------------------------------------------


class _Fuser:
    """Matches and rewrites the QDQ islands of one graph."""

    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.producers = graph.producers()
        self.users = graph.consumers()
        self.removed: set[int] = set()
        self.zero_names = 0

    def single_reader(self, name: str) -> Node | None:
        if name in self.g.outputs:
            return None
        users = self.users.get(name, [])
        return users[0] if len(users) == 1 else None

    def dq(self, name: str) -> Node | None:
        node = self.producers.get(name)
        if node is None or node.domain or node.op_type != "DequantizeLinear":
            return None
        if node.attrs.get("block_size", 0):
            return None
        return node

    def const(self, name: str) -> Array | None:
        return self.g.const(name)

    def scalar_scale(self, name: str) -> Array | None:
        s = self.const(name)
        if s is None or s.dtype != _F32 or s.size != 1:
            return None
        v = float(s.reshape(-1)[0])
        return s if np.isfinite(v) and v > 0 else None

    def scalar_zp(self, name: str) -> bool:
        """A scalar int8 zero point (or none: then the tensor must be int8 by type)."""
        if not name:
            return True
        z = self.const(name)
        return z is not None and z.dtype == _INT8 and z.size == 1

    def activation(self, name: str) -> Node | None:
        """The DQ producing ``name`` from an int8 activation, scalar scale and zero point."""
        d = self.dq(name)
        if d is None or self.g.tensor_info(d.inputs[0]).dtype != _INT8:
            return None
        if self.scalar_scale(d.input(1)) is None or not self.scalar_zp(d.input(2)):
            return None
        return d

    def weight(self, name: str, channels: int, axis: int) -> Node | None:
        """The DQ of a constant symmetric int8 weight, per tensor or per ``axis``."""
        d = self.dq(name)
        if d is None:
            return None
        w = self.const(d.inputs[0])
        s = self.const(d.input(1))
        z = self.const(d.input(2)) if d.input(2) else None
        if w is None or w.dtype != _INT8 or s is None or s.dtype != _F32:
            return None
        if d.input(2) and (z is None or np.any(z != 0)):
            return None
        if not (np.all(np.isfinite(s)) and np.all(s > 0)):
            return None
        if s.size != 1:
            ax = int(d.attrs.get("axis", 1))
            ax = ax + w.ndim if ax < 0 else ax
            if s.ndim != 1 or ax != axis or s.size != channels:
                return None
        return d

    def output_q(self, name: str) -> tuple[Node, Node | None] | None:
        """The Q (and the Relu before it) that alone read ``name``."""
        nxt = self.single_reader(name)
        relu = None
        if nxt is not None and not nxt.domain and nxt.op_type == "Relu":
            relu = nxt
            nxt = self.single_reader(relu.outputs[0])
        if nxt is None or nxt.domain or nxt.op_type != "QuantizeLinear":
            return None
        if self.scalar_scale(nxt.input(1)) is None or not nxt.input(2):
            return None
        if not self.scalar_zp(nxt.input(2)) or nxt.attrs.get("block_size", 0):
            return None
        return nxt, relu

    def int32_bias(self, name: str, sx: Array, sw: Array, channels: int) -> str | None:
        """An int32 bias in units of ``sx * sw``: the DQ's input when its scale is that."""
        if not name:
            return ""
        d = self.dq(name)
        per = (np.float32(sx.reshape(-1)[0]) * sw.reshape(-1)).astype(np.float32)
        want = np.broadcast_to(per, (channels,))
        if d is not None:
            q = self.const(d.inputs[0])
            s = self.const(d.input(1))
            z = self.const(d.input(2)) if d.input(2) else None
            if (
                q is not None
                and q.dtype == np.int32
                and q.shape == (channels,)
                and s is not None
                and s.size in (1, channels)
                and np.array_equal(np.broadcast_to(s.reshape(-1), want.shape), want)
                and (z is None or not np.any(z))
            ):
                return d.inputs[0]
            return None
        f = self.const(name)
        if f is None or f.dtype != _F32 or f.size != channels:
            return None
        q32 = np.rint(f.reshape(-1).astype(np.float64) / want)
        if np.any(np.abs(q32) >= 2**31):
            return None
        new = f"{name}__int32"
        self.g.initializers[new] = q32.astype(np.int32)
        return new

    def zero_point(self, name: str) -> str:
        """``name``, or a new int8 zero initializer when the zero point is omitted."""
        if name:
            return name
        self.zero_names += 1
        new = f"__qdq_zero_{self.zero_names}"
        self.g.initializers[new] = np.zeros((), np.int8)
        return new

    def fuse(self, node: Node) -> Node | None:
        op = node.op_type
        if node.domain or node.act or op not in ("Conv", "MatMul", "Gemm"):
            return None
        x = self.activation(node.input(0))
        if x is None:
            return None
        wshape = self.g.tensor_info(node.input(1)).static_shape
        if wshape is None:
            return None
        if op == "Conv":
            if len(wshape) != 4:
                return None
            channels, axis = wshape[0], 0
        elif op == "MatMul":
            if len(wshape) != 2:
                return None
            channels, axis = wshape[1], 1
        else:
            a = node.attrs
            if a.get("transA", 0) or float(a.get("alpha", 1.0)) != 1.0:
                return None
            if float(a.get("beta", 1.0)) != 1.0:
                return None
            tb = bool(a.get("transB", 0))
            channels, axis = (wshape[0], 0) if tb else (wshape[1], 1)
        w = self.weight(node.input(1), channels, axis)
        q = self.output_q(node.outputs[0])
        if w is None or q is None:
            return None
        qy, relu = q
        sx = self.const(x.input(1))
        sw = self.const(w.input(1))
        assert sx is not None and sw is not None
        if op == "MatMul":
            bias = ""
        else:
            got = self.int32_bias(node.input(2), sx, sw, channels)
            if got is None:
                return None
            bias = got
        if op == "Gemm" and bias:
            c = self.const(bias)
            if c is None or c.shape != (channels,):
                return None
        ins = [x.inputs[0], x.input(1), self.zero_point(x.input(2)),
               w.inputs[0], w.input(1), self.zero_point(w.input(2)),
               qy.input(1), qy.input(2)]  # fmt: skip
        attrs = dict(node.attrs)
        domain = ""
        if op == "Conv":
            new_op = "QLinearConv"
            ins += [bias] if bias else []
        elif op == "MatMul":
            new_op = "QLinearMatMul"
            attrs = {}
        else:
            new_op, domain = "QGemm", MS_DOMAIN
            ins = [*ins[:6], bias, qy.input(1), qy.input(2)]
            attrs = {"transB": int(bool(node.attrs.get("transB", 0)))}
        fused = Node(
            name=node.name,
            op_type=new_op,
            inputs=ins,
            outputs=[qy.outputs[0]],
            attrs=attrs,
            domain=domain,
            act="Relu" if relu is not None else "",
            fused=[d.name for d in (x, w) if d is not None]
            + [n.name for n in (relu, qy) if n is not None],
        )
        for n in (node, relu, qy):
            if n is not None:
                self.removed.add(id(n))
        return fused


_U8 = np.dtype(np.uint8)


def _s8(values: Array) -> Array:
    """uint8 values (or zero points) as the int8 ones 128 below them."""
    out: Array = (np.asarray(values).astype(np.int16) - 128).astype(np.int8)
    return out


def signed_activations(graph: Graph) -> int:
    """Make uint8 quantised tensors int8 (the NPU has no UINT8), exactly.

    ``x_u8`` with zero point ``z`` means what ``x_u8 - 128`` with zero point
    ``z - 128`` means: ``(x - z) * s`` is unchanged, and a QuantizeLinear's
    ``clamp(q + z, 0, 255) - 128`` is ``clamp(q + z - 128, -128, 127)``. So a
    QuantizeLinear to uint8 whose output only DequantizeLinear nodes (with
    the same constant zero point) read, none a graph output, gets an int8
    zero point, as do its readers; and a DequantizeLinear of a uint8
    constant (a weight or bias) reads the shifted int8 constant. This is
    how onnxruntime's default ``QUInt8`` activations reach the NPU.
    """
    users = graph.consumers()
    count = 0
    for node in graph.nodes:
        if node.domain or node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        zp = graph.const(node.input(2))
        if zp is None or zp.dtype != _U8:
            continue
        if node.op_type == "DequantizeLinear":
            w = graph.const(node.inputs[0])
            if w is None or w.dtype != _U8:
                continue
            name = f"{node.inputs[0]}__s8_{count}"
            graph.initializers[name] = _s8(w)
            zname = f"{node.input(2)}__s8_{count}"
            graph.initializers[zname] = _s8(zp)
            node.inputs = [name, node.inputs[1], zname, *node.inputs[3:]]
            node.proto = None
            count += 1
            continue
        out = node.outputs[0]
        readers = users.get(out, [])
        if out in graph.outputs or not readers:
            continue
        if not all(
            r.op_type == "DequantizeLinear"
            and not r.domain
            and r.inputs[0] == out
            and (rz := graph.const(r.input(2))) is not None
            and rz.dtype == _U8
            and np.array_equal(rz, zp)
            and r.attrs.get("axis", 1) == node.attrs.get("axis", 1)
            for r in readers
        ):
            continue
        zname = f"{node.input(2)}__s8_{count}"
        graph.initializers[zname] = _s8(zp)
        for n in (node, *readers):
            n.inputs = [*n.inputs[:2], zname, *n.inputs[3:]]
            n.proto = None
        graph.info[out] = TensorInfo(np.dtype(np.int8), graph.tensor_info(out).shape)
        count += 1
    if count:
        log.debug("%s: %d uint8 quantised tensors made int8", graph.source, count)
    return count


def fuse_qdq(graph: Graph) -> int:
    """Fuse ``DQ -> Conv/MatMul/Gemm [-> Relu] -> Q`` islands into integer nodes.

    The DequantizeLinear nodes stay while anything else reads their
    outputs (they are dropped once nothing does).
    """
    f = _Fuser(graph)
    out: list[Node] = []
    count = 0
    for node in graph.nodes:
        if id(node) in f.removed:
            continue
        fused = f.fuse(node)
        if fused is None:
            out.append(node)
            continue
        out.append(fused)
        count += 1
    out = [n for n in out if id(n) not in f.removed]
    if count:
        if "com.microsoft" not in graph.opsets and any(n.domain == MS_DOMAIN for n in out):
            graph.opsets[MS_DOMAIN] = 1
        out = _drop_dead_dq(graph, out)
        log.debug("%s: fused %d QDQ island(s) into integer nodes", graph.source, count)
    graph.nodes = out
    return count


def _drop_dead_dq(graph: Graph, nodes: list[Node]) -> list[Node]:
    """Drop DequantizeLinear nodes whose outputs nothing reads any more."""
    read: dict[str, int] = {}
    for n in nodes:
        for i in n.inputs:
            if i:
                read[i] = read.get(i, 0) + 1
    keep: list[Node] = []
    for n in nodes:
        if (
            n.op_type == "DequantizeLinear"
            and not n.domain
            and not any(read.get(o) or o in graph.outputs for o in n.outputs)
        ):
            continue
        keep.append(n)
    return keep
