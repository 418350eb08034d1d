"""The NPU provider: weights kept on the device and compiled per-shape execution plans.

At session creation :class:`NpuProvider` uploads every constant the NPU
nodes read (plus the zero biases CONV2D/LAYERNORM need) into one buffer
object, once. The first run for a given input-shape signature builds, per
NPU partition, a :class:`PartitionPlan` (like a captured CUDA graph):

1. every tensor of the partition gets a :class:`Storage` (views - Reshape,
   Flatten, Squeeze, Unsqueeze, Identity, a same-type Cast - share their
   input's storage, zero-copy);
2. the storages get offsets in one arena buffer by a liveness-based
   first-fit (a storage is free again after the last op that reads it;
   tensors read after the partition, by the CPU or a later partition, stay
   live to its end);
3. every ``TensorOp`` is built once with the :mod:`npu.ops` builders.

A run then only copies the partition's host inputs into their mapped
buffers, SUBMITs the prebuilt ops (at most ``NPU_SUBMIT_MAX_OPS`` per
SUBMIT), waits once, and hands the tensors other partitions read out as
numpy views of the arena (later NPU partitions read them in place).
"""

from __future__ import annotations

import errno
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from .. import _abi
from ..core.buffer import Buffer
from ..core.device import Device, PackedOps
from ..core.stream import Program, Stream, current_user_stream
from ..errors import NpuDeviceError, NpuError
from ..kernels import ops
from ..kernels.ops import TensorOp
from ..kernels.validate import pool_out, window_out
from .cpu import CPU_OPS, Array, conv_pads, reduce_axes
from .graph import Graph, ModelError, Node, clip_bounds
from .partition import (
    COMPARE_OPS,
    COMPOSED_OPS,
    ELTWISE_OPS,
    NPU_DTYPES,
    UNARY_OPS,
    VARIADIC_OPS,
    VIEW_OPS,
    PoolGeometry,
    pool_geometry,
    slice_spec,
    split_sizes,
    transpose_runs,
)
from .quant import requant_scale
from .resample import PadSpec, linear_pieces, merge_dims, pad_spec, resize_dims, resize_maps
from .schedule import MIN_CONCURRENT_WORK, Range, concurrent_flags, level_order, op_work

__all__ = ["NpuProvider", "PartitionPlan", "Storage", "Val"]

log = logging.getLogger(__name__)

_ALIGN: Final = 64
_LIVE_FOREVER: Final = 1 << 62
#: 1.5 * 2**23: ``(v + M) - M`` rounds an fp32 ``|v| < 2**22`` to an integer,
#: half to even (larger values saturate the int8 result either way).
_RNE_MAGIC: Final = 12582912.0
#: WAIT timeout of one partition (TCG emulation is slow).
WAIT_TIMEOUT_S: Final = 120.0
_ACT = {
    "": _abi.ActKind.NONE,
    "Relu": _abi.ActKind.RELU,
    "Gelu": _abi.ActKind.GELU,
    "Relu6": _abi.ActKind.RELU6,
}
_REDUCE = {
    "ReduceSum": _abi.ReduceKind.SUM,
    "ReduceMean": _abi.ReduceKind.MEAN,
    "ReduceMax": _abi.ReduceKind.MAX,
    "ReduceMin": _abi.ReduceKind.MIN,
}
# Inputs of these ops that are static parameters, not device tensors.
_PARAM_INPUTS: Final = {
    "Reshape": {1},
    "Squeeze": {1},
    "Unsqueeze": {1},
    **{op: {1} for op in _REDUCE},
    "QuantizeLinear": {1, 2},
    "DequantizeLinear": {1, 2},
    "QLinearConv": {1, 2, 4, 5, 6, 7},
    "QLinearMatMul": {1, 2, 4, 5, 6, 7},
    "QGemm": {1, 2, 4, 5, 7, 8},
    "MatMulInteger": {2, 3},
    "ConvInteger": {2, 3},
    "Pad": {1, 2, 3},
    "Resize": {1, 2, 3},
}


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _scalar_name(dtype: np.dtype[Any], value: float) -> str:
    return f"__scalar_{dtype}_{value!r}"


#: The most CONVERT copies one Concat may take on the NPU.
MAX_CONCAT_COPIES = 256


def _strides(shape: Sequence[int]) -> tuple[int, ...]:
    out: list[int] = []
    acc = 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


@dataclass(eq=False)
class Storage:
    """Device memory of one or more tensors (a tensor and its views).

    ``first``/``last`` are the indices of the first op writing and the last
    op reading it within its partition (``-1`` = written by the host before
    the partition). ``fixed`` storages (weights, earlier partitions' tensors)
    already have their buffer and offset.
    """

    nbytes: int
    first: int = _LIVE_FOREVER
    last: int = -1
    buf: Buffer | None = None
    offset: int = 0
    fixed: bool = False


@dataclass(frozen=True, eq=False)
class Val:
    """A tensor in device memory: a contiguous ``shape`` of ``dtype`` at ``storage + offset``."""

    storage: Storage
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    offset: int = 0

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def numpy(self) -> Array:
        """A numpy view of the tensor's bytes (the storage must be placed)."""
        assert self.storage.buf is not None
        flat = self.storage.buf.numpy(self.dtype, (self.numel,), self.storage.offset + self.offset)
        return flat.reshape(self.shape)


@dataclass
class PartitionPlan:
    """The compiled form of one NPU partition for one input signature."""

    tensor_ops: list[TensorOp]
    chunks: list[list[TensorOp]]
    packed: list[list[PackedOps]]  # chunks packed once for submit_packed
    host_inputs: list[tuple[str, Array]]
    outputs: list[tuple[str, Array]]
    op_nodes: dict[int, Node]
    arena: Buffer | None
    arena_bytes: int
    vals: dict[str, Val] = field(default_factory=dict)
    # The ops prebuilt for user streams, at the first run inside `with stream:`.
    program: Program | None = None
    # The fence of each chunk's last op in the latest SUBMIT run (queue 0).
    fences: list[int] = field(default_factory=list)


class _Builder:
    """Plans one partition: values, storages, op recipes; then places and builds."""

    def __init__(
        self,
        provider: NpuProvider,
        nodes: list[Node],
        known: dict[str, Val],
        host: dict[str, tuple[tuple[int, ...], np.dtype[Any]]],
        escapes: set[str],
    ) -> None:
        self.p = provider
        self.g = provider.graph
        self.nodes = nodes
        self.known = known
        self.host = host
        self.escapes = escapes
        self.vals: dict[str, Val] = {}
        self.storages: list[Storage] = []
        self.host_inputs: list[tuple[str, Val]] = []
        self.steps: list[tuple[Node, Callable[[], ops.TensorOp]]] = []
        # The storages each step reads and writes, in step order.
        self.access: list[tuple[tuple[Storage, ...], tuple[Storage, ...]]] = []
        self.node: Node | None = None

    # -- values ---------------------------------------------------------------

    def get(self, name: str) -> Val:
        if name in self.vals:
            return self.vals[name]
        if name in self.known:
            return self.known[name]
        if name not in self.host:
            raise ModelError(f"{self.g.source}: tensor {name!r} is not available to the NPU")
        shape, dtype = self.host[name]
        st = Storage(max(1, math.prod(shape)) * dtype.itemsize, first=-1, last=-1)
        self.storages.append(st)
        v = Val(st, shape, dtype)
        self.vals[name] = v
        self.host_inputs.append((name, v))
        return v

    def new(self, name: str, shape: Sequence[int], dtype: np.dtype[Any]) -> Val:
        shp = tuple(int(d) for d in shape)
        st = Storage(max(1, math.prod(shp)) * dtype.itemsize)
        self.storages.append(st)
        v = Val(st, shp, dtype)
        if name:
            self.vals[name] = v
        return v

    def alias(self, name: str, base: Val, shape: Sequence[int]) -> Val:
        shp = tuple(int(d) for d in shape)
        if math.prod(shp) != base.numel:
            raise ModelError(f"{self.g.source}: view {name!r} {shp} of {base.shape} changes size")
        v = Val(base.storage, shp, base.dtype, base.offset)
        if name:
            self.vals[name] = v
        return v

    def emit(
        self, reads: Sequence[Val], writes: Sequence[Val], make: Callable[[], ops.TensorOp]
    ) -> None:
        i = len(self.steps)
        for v in reads:
            st = v.storage
            if not st.fixed:
                st.last = max(st.last, i)
        for v in writes:
            st = v.storage
            st.first = min(st.first, i)
            st.last = max(st.last, i)
        assert self.node is not None
        self.steps.append((self.node, make))
        self.access.append((tuple(v.storage for v in reads), tuple(v.storage for v in writes)))

    def reorder(self, order: Sequence[int], levels: Sequence[int] | None = None) -> None:
        """Put the steps in ``order`` and redo the storages' lifetimes.

        With ``levels`` (each step's dependency level in the new order,
        :func:`level_order`), a lifetime spans whole levels: two steps of
        one level may run at the same time, so what one of them reads or
        writes never shares memory with what another writes.
        """
        self.steps = [self.steps[j] for j in order]
        self.access = [self.access[j] for j in order]
        host = {id(v.storage) for _, v in self.host_inputs}
        for st in self.storages:
            if not st.fixed:
                st.first, st.last = (-1, -1) if id(st) in host else (_LIVE_FOREVER, -1)
        for i, (reads, writes) in enumerate(self.access):
            for st in reads:
                if not st.fixed:
                    st.last = max(st.last, i)
            for st in writes:
                st.first = min(st.first, i)
                st.last = max(st.last, i)
        if levels is None:
            return
        start: dict[int, int] = {}
        end: dict[int, int] = {}
        for i, lv in enumerate(levels):
            start.setdefault(lv, i)
            end[lv] = i
        for st in self.storages:
            if not st.fixed and 0 <= st.first < len(levels):
                st.first = start[levels[st.first]]
            if not st.fixed and 0 <= st.last < len(levels):
                st.last = end[levels[st.last]]

    def ranges(self) -> list[tuple[list[Range], list[Range]]]:
        """Each step's ``(reads, writes)`` byte ranges (after :meth:`place`)."""

        def span(sts: tuple[Storage, ...]) -> list[Range]:
            return [
                (id(st.buf), st.offset, st.offset + st.nbytes) for st in sts if st.buf is not None
            ]

        return [(span(reads), span(writes)) for reads, writes in self.access]

    @staticmethod
    def ref(
        v: Val, shape: Sequence[int] | None = None, strides: Sequence[int] | None = None
    ) -> ops.TensorRef:
        shp = tuple(shape) if shape is not None else (v.shape or (1,))
        st = v.storage
        assert st.buf is not None
        return ops.tensor_ref(
            st.buf,
            NPU_DTYPES[v.dtype],
            shp,
            strides if strides is not None else _strides(shp),
            st.offset + v.offset,
        )

    # -- placement --------------------------------------------------------------

    def place(self) -> tuple[Buffer | None, int]:
        for name, v in self.vals.items():
            if name in self.escapes and not v.storage.fixed:
                v.storage.last = _LIVE_FOREVER
        todo = [s for s in self.storages if not s.fixed]
        todo.sort(key=lambda s: (s.first, -s.nbytes))
        active: list[Storage] = []
        top = 0
        for s in todo:
            if s.last < s.first:  # never read (an unused output): still needs a place
                s.last = s.first
            active = [a for a in active if a.last >= s.first]
            active.sort(key=lambda a: a.offset)
            need = _align(s.nbytes)
            off = 0
            for a in active:
                if off + need <= a.offset:
                    break
                off = max(off, a.offset + _align(a.nbytes))
            s.offset = off
            active.append(s)
            top = max(top, off + need)
        if not todo:
            return None, 0
        arena = self.p.alloc(top)
        for s in todo:
            s.buf = arena
        return arena, top


def _pad_to(shape: tuple[int, ...], r: int) -> tuple[int, ...]:
    return (1,) * (r - len(shape)) + shape


def _bcast_strides(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, ...]:
    st = _strides(shape)
    return tuple(0 if d == 1 and o != 1 else s for d, o, s in zip(shape, out, st, strict=True))


class NpuProvider:
    """Runs the NPU partitions of a graph on one device.

    Args:
        device: the device.
        graph: the (rewritten) graph.
        npu_nodes: the nodes the NPU runs.
        concurrent: let independent ops run at the same time on the AI
            cores, where the device can (``Cap.CONCURRENT``).

    The constructor uploads the weights; :meth:`build` compiles one
    partition for an input signature; :meth:`run_plan` executes it.
    """

    def __init__(
        self, device: Device, graph: Graph, npu_nodes: list[Node], *, concurrent: bool = True
    ) -> None:
        self.device = device
        self.graph = graph
        # Independent ops run at the same time on the AI cores (a device
        # with Cap.CONCURRENT): reordered by level, then flagged.
        self.concurrent = concurrent and bool(device.info.caps & _abi.Cap.CONCURRENT)
        self.buffers: list[Buffer] = []
        self.weights: dict[str, Val] = {}
        self.weight_uploads = 0
        # Graph position of each node, and of each tensor's last reader: a
        # fused residual may be overwritten in place after its last read.
        self._position = {id(n): i for i, n in enumerate(graph.nodes)}
        self._last_read: dict[str, int] = {}
        for i, n in enumerate(graph.nodes):
            for name in n.inputs:
                self._last_read[name] = i
        self._upload_weights(npu_nodes)

    # -- memory -------------------------------------------------------------------

    def alloc(self, nbytes: int) -> Buffer:
        """Allocate a buffer this provider frees on :meth:`close`."""
        if nbytes > self.device.info.max_bo_size:
            raise ModelError(
                f"{self.graph.source}: needs a buffer of {nbytes} bytes, more than the "
                f"device's max_bo_size {self.device.info.max_bo_size}"
            )
        buf = self.device.alloc(max(nbytes, _ALIGN))
        self.buffers.append(buf)
        return buf

    def free(self, buf: Buffer) -> None:
        """Free one buffer of :meth:`alloc` now."""
        self.buffers.remove(buf)
        buf.free()

    def close(self) -> None:
        """Free every buffer (weights and plans)."""
        free_buffers(self.buffers)

    def _upload_weights(self, npu_nodes: list[Node]) -> None:
        g = self.graph
        consts: dict[str, Array] = {}
        for node in npu_nodes:
            params = _PARAM_INPUTS.get(node.op_type, set())
            for i, name in enumerate(node.inputs):
                if name and i not in params and name in g.initializers:
                    consts[name] = np.asarray(g.initializers[name], order="C")  # keeps rank 0
            for name, arr in self._derived_for(node):
                consts.setdefault(name, arr)
            for name, arr in self._scalars_for(node):
                consts.setdefault(name, arr)
        if not consts:
            return
        layout: dict[str, int] = {}
        total = 0
        for name, arr in consts.items():
            layout[name] = total
            total += _align(max(arr.nbytes, 1))
        buf = self.alloc(total)
        view = buf.numpy(np.uint8, (total,))
        for name, arr in consts.items():
            off = layout[name]
            view[off : off + arr.nbytes] = arr.reshape(-1).view(np.uint8)
            st = Storage(arr.nbytes, buf=buf, offset=off, fixed=True)
            self.weights[name] = Val(st, tuple(arr.shape), arr.dtype)
        self.weight_uploads += 1
        log.debug("%s: uploaded %d constants (%d bytes)", g.source, len(consts), total)

    def _derived_for(self, node: Node) -> list[tuple[str, Array]]:
        """Constants a node's plan reads beyond its inputs (uploaded with the weights).

        Zero biases (CONV2D and LAYERNORM always take one), the float32
        scale and zero point of QuantizeLinear/DequantizeLinear shaped to
        broadcast along their axis, and the REQUANT scale of the integer ops.
        """
        g = self.graph
        op = node.op_type
        if op in ("Conv", "QLinearConv", "ConvInteger"):
            bias_in = {"Conv": 2, "QLinearConv": 8}.get(op)
            w = g.tensor_info(node.input(3 if op == "QLinearConv" else 1)).static_shape
            dt = g.tensor_info(node.input(0)).dtype
            out: list[tuple[str, Array]] = []
            if op != "Conv":
                dt = np.dtype(np.int32)
            if (bias_in is None or not node.input(bias_in)) and w is not None and dt is not None:
                out.append((f"__zeros_{dt}_{w[0]}", np.zeros(w[0], dt)))
            if op == "QLinearConv":
                out.append(self._requant_scale(node, 6))
            return out
        if op == "LayerNormalization" and not node.input(2):
            s = g.const(node.input(1))
            if s is not None:
                return [(f"__zeros_{s.dtype}_{s.size}", np.zeros(s.size, s.dtype))]
        if op in ("QLinearMatMul", "QGemm"):
            return [self._requant_scale(node, 7 if op == "QGemm" else 6)]
        if op in ("QuantizeLinear", "DequantizeLinear"):
            rank = g.tensor_info(node.inputs[0]).rank or 0
            out = [(f"__qs_{node.name}", self._along_axis(node, 1, rank))]
            zp = g.const(node.input(2)) if node.input(2) else None
            nonzero = zp is not None and bool(np.any(zp))
            if op == "QuantizeLinear":
                # (v + M) - (M - zp): the rounding's second step adds the zero point
                # (all integers below 2**24: exact).
                shift = np.float32(_RNE_MAGIC) - (
                    self._along_axis(node, 2, rank) if nonzero else np.float32(0)
                )
                out.append((f"__qm_{node.name}", np.asarray(shift, np.float32)))
            elif nonzero:
                out.append((f"__qz_{node.name}", self._along_axis(node, 2, rank)))
            return out
        return []

    def _along_axis(self, node: Node, i: int, rank: int) -> Array:
        """Constant input ``i`` as float32, shaped to broadcast along the node's axis."""
        v = np.asarray(self.graph.const(node.input(i)), np.float32).reshape(-1)
        if v.size == 1:
            return v.reshape(())
        axis = int(node.attrs.get("axis", 1))
        axis = axis + rank if axis < 0 else axis
        return v.reshape((v.size,) + (1,) * (rank - 1 - axis))

    def _requant_scale(self, node: Node, y_scale: int) -> tuple[str, Array]:
        """``x_scale * w_scale * alpha / y_scale`` (float32, 1-D) of an integer node."""
        c = self.graph.const
        alpha = float(node.attrs.get("alpha", 1.0))
        sx = np.asarray(c(node.input(1)), np.float64) * alpha
        sw, sy = (np.asarray(c(node.input(i)), np.float64) for i in (4, y_scale))
        scale = requant_scale(x_scale=sx, w_scale=sw, y_scale=sy)
        return f"__rq_{node.name}", scale

    def _zeros(self, n: int, dtype: np.dtype[Any]) -> Val:
        return self.weights[f"__zeros_{dtype}_{n}"]

    @staticmethod
    def _lrn_scalars(node: Node) -> tuple[float, float, float]:
        """LRN's (alpha, bias, -beta): the constants its ELTWISE steps read."""
        a = node.attrs
        return (
            float(a.get("alpha", 1e-4)),
            float(a.get("bias", 1.0)),
            -float(a.get("beta", 0.75)),
        )

    def _clip_bounds(self, node: Node) -> tuple[float | None, float | None]:
        """Clip's (min, max), None where absent (attributes before opset 11, inputs after)."""
        return clip_bounds(self.graph, node)

    def _node_scalars(self, node: Node) -> list[float]:
        """The scalar constants a node's composed NPU plan reads."""
        op = node.op_type
        a = node.attrs
        if op == "LRN":
            return list(self._lrn_scalars(node))
        if op == "Clip":
            return [v for v in self._clip_bounds(node) if v is not None]
        if op == "LeakyRelu":
            return [float(a.get("alpha", 0.01))]
        if op == "PRelu":
            return [0.0]
        if op == "HardSigmoid":
            return [float(a.get("alpha", 0.2)), float(a.get("beta", 0.5)), 0.0, 1.0]
        if op == "HardSwish":
            return [1.0 / 6.0, 0.5, 0.0, 1.0]
        if op == "Mean":
            return [1.0 / len([i for i in node.inputs if i])]
        if op == "QuantizeLinear":
            return [_RNE_MAGIC]
        if op in ("Pad", "Resize"):
            shape = self.graph.tensor_info(node.inputs[0]).static_shape
            if shape is None:
                return []
            if op == "Pad":
                spec = pad_spec(node, self.graph, shape)
                return [spec.value] if isinstance(spec, PadSpec) and spec.mode == "constant" else []
            maps = resize_maps(node, self.graph, shape)
            if isinstance(maps, str):
                return []
            return [
                w
                for m in maps
                if any(m.w1)
                for p in linear_pieces(m)
                if p.w1 != 0.0
                for w in (1.0 - p.w1, p.w1)
            ]
        return []

    def _scalars_for(self, node: Node) -> list[tuple[str, Array]]:
        """Scalar constants a node's NPU plan reads (uploaded with the weights)."""
        values = self._node_scalars(node)
        dt = self.graph.tensor_info(node.inputs[0]).dtype if node.inputs else None
        if not values or dt is None:
            return []
        return [(_scalar_name(dt, v), np.full(1, v, dt)) for v in values]

    def _scalar(self, value: float, dtype: np.dtype[Any]) -> Val:
        return self.weights[_scalar_name(dtype, value)]

    def _scalar_op(
        self, b: _Builder, kind: _abi.EltwiseKind, x: Val, value: float, name: str = ""
    ) -> Val:
        """``x <kind> value`` (the scalar broadcast) into a new tensor ``name``."""
        R = b.ref
        k = self._scalar(value, x.dtype)
        shp = x.shape or (1,)
        o = b.new(name, x.shape, x.dtype)
        zeros = (0,) * len(shp)
        ones = (1,) * len(shp)
        b.emit(
            [x, k],
            [o],
            lambda: ops.eltwise(kind, R(x, shp), R(k, ones, zeros), R(o, shp), _bufs(x, k, o)),
        )
        return o

    def _binary(self, b: _Builder, kind: _abi.EltwiseKind, x: Val, y: Val, name: str = "") -> Val:
        """``x <kind> y`` with ``y`` broadcast to ``x``'s shape."""
        R = b.ref
        shp = x.shape or (1,)
        py = _pad_to(y.shape, len(shp))
        o = b.new(name, x.shape, x.dtype)
        b.emit(
            [x, y],
            [o],
            lambda: ops.eltwise(
                kind, R(x, shp), R(y, py, _bcast_strides(py, shp)), R(o, shp), _bufs(x, y, o)
            ),
        )
        return o

    def _unary(self, b: _Builder, kind: _abi.UnaryKind, x: Val, name: str = "") -> Val:
        R = b.ref
        shp = x.shape or (1,)
        o = b.new(name, x.shape, x.dtype)
        b.emit([x], [o], lambda: ops.unary(kind, R(x, shp), R(o, shp), _bufs(x, o)))
        return o

    def _plan_composed(self, b: _Builder, node: Node) -> None:
        """Clip, LeakyRelu, PRelu, HardSigmoid, HardSwish from ELTWISE/UNARY ops."""
        E = _abi.EltwiseKind
        op = node.op_type
        out = node.outputs[0]
        x = b.get(node.inputs[0])
        a = node.attrs
        if op == "Clip":
            lo, hi = self._clip_bounds(node)
            if lo is None and hi is None:
                b.alias(out, x, x.shape)
                return
            y = x
            if lo is not None:
                y = self._scalar_op(b, E.MAX, y, lo, out if hi is None else "")
            if hi is not None:
                self._scalar_op(b, E.MIN, y, hi, out)
            return
        if op == "LeakyRelu":
            alpha = float(a.get("alpha", 0.01))
            ax = self._scalar_op(b, E.MUL, x, alpha)
            # max(x, alpha x) for alpha <= 1, min(x, alpha x) above.
            self._binary(b, E.MAX if alpha <= 1.0 else E.MIN, x, ax, out)
            return
        if op == "PRelu":
            slope = b.get(node.inputs[1])
            pos = self._unary(b, _abi.UnaryKind.RELU, x)
            neg = self._scalar_op(b, E.MIN, x, 0.0)
            self._binary(b, E.ADD, pos, self._binary(b, E.MUL, neg, slope), out)
            return
        if op in ("HardSigmoid", "HardSwish"):
            alpha, beta = (
                (1.0 / 6.0, 0.5)
                if op == "HardSwish"
                else (float(a.get("alpha", 0.2)), float(a.get("beta", 0.5)))
            )
            t = self._scalar_op(b, E.ADD, self._scalar_op(b, E.MUL, x, alpha), beta)
            t = self._scalar_op(b, E.MAX, t, 0.0)
            if op == "HardSigmoid":
                self._scalar_op(b, E.MIN, t, 1.0, out)
                return
            self._binary(b, E.MUL, x, self._scalar_op(b, E.MIN, t, 1.0), out)
            return
        raise ModelError(f"{self.graph.source}: {node.describe()}: no composed plan")

    def _plan_slice(self, b: _Builder, node: Node) -> None:
        """Slice and Split: a CONVERT from a strided view of the input per output."""
        R = b.ref
        x = b.get(node.inputs[0])
        st = _strides(x.shape)
        item = x.dtype.itemsize
        if node.op_type == "Slice":
            spec = slice_spec(node, self.graph, x.shape)
            if spec is None:
                raise ModelError(
                    f"{self.graph.source}: {node.describe()}: not a Slice of shape "
                    f"{list(x.shape)} with constant, positive steps"
                )
            outs = [(node.outputs[0], spec)]
        else:
            r = len(x.shape)
            axis = int(node.attrs.get("axis", 0))
            axis = axis + r if axis < 0 else axis
            sizes = split_sizes(node, self.graph, x.shape)
            if sizes is None:
                raise ModelError(
                    f"{self.graph.source}: {node.describe()}: its sizes do not cut "
                    f"axis {axis} of shape {list(x.shape)}"
                )
            outs = []
            start = 0
            for name, size in zip(node.outputs, sizes, strict=True):
                spec = [(0, d, 1) for d in x.shape]
                spec[axis] = (start, size, 1)
                outs.append((name, spec))
                start += size
        for name, spec in outs:
            if not name:
                continue
            shape = tuple(n for _, n, _ in spec)
            o = b.new(name, shape, x.dtype)
            if 0 in shape:
                raise ModelError(f"{self.graph.source}: {node.describe()}: empty output")
            offset = sum(s0 * s for (s0, _, _), s in zip(spec, st, strict=True))
            strides = tuple(s * step for (_, _, step), s in zip(spec, st, strict=True))
            src = Val(x.storage, shape, x.dtype, x.offset + offset * item)

            def make(
                src: Val = src, o: Val = o, shp: Any = shape, sst: Any = strides
            ) -> ops.TensorOp:
                return ops.convert(
                    R(src, shp or (1,), sst or (1,)), R(o, shp or (1,)), _bufs(src, o)
                )

            b.emit([src], [o], make)

    def _plan_gather(self, b: _Builder, node: Node) -> None:
        """Gather with constant indices: one contiguous copy per (block, index).

        The output is ``[prefix, K, inner]`` in memory (prefix: the axes
        before ``axis``, K: the flattened indices, inner: the axes after),
        so each ``inner`` row is a contiguous copy of one input row.
        """
        R = b.ref
        x = b.get(node.inputs[0])
        idx = np.asarray(self.graph.const(node.input(1)))
        r = len(x.shape)
        axis = int(node.attrs.get("axis", 0))
        axis = axis + r if axis < 0 else axis
        oshape = x.shape[:axis] + tuple(idx.shape) + x.shape[axis + 1 :]
        o = b.new(node.outputs[0], oshape, x.dtype)
        flat = [int(i) + (x.shape[axis] if i < 0 else 0) for i in idx.reshape(-1)]
        prefix = math.prod(x.shape[:axis])
        inner = math.prod(x.shape[axis + 1 :])
        item = x.dtype.itemsize
        for p in range(prefix):
            for k, i in enumerate(flat):
                src = Val(
                    x.storage,
                    (inner,),
                    x.dtype,
                    x.offset + ((p * x.shape[axis] + i) * inner) * item,
                )
                dst = Val(
                    o.storage, (inner,), o.dtype, o.offset + ((p * len(flat) + k) * inner) * item
                )

                def make(src: Val = src, dst: Val = dst) -> ops.TensorOp:
                    return ops.convert(R(src), R(dst), _bufs(src, dst))

                b.emit([src], [dst], make)

    def _plan_reduce_composed(self, b: _Builder, node: Node) -> None:
        """ReduceL2 (sqrt of a sum of squares) and ReduceLogSumExp (max-shifted)."""
        R = b.ref
        E = _abi.EltwiseKind
        g = self.graph
        x = b.get(node.inputs[0])
        axes = reduce_axes(node, g.const(node.input(1)), len(x.shape), g.opset)
        keep = bool(node.attrs.get("keepdims", 1))
        out = node.outputs[0]
        if axes is None:
            axes = []
        kshape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
        oshape = kshape if keep else tuple(s for d, s in enumerate(x.shape) if d not in axes)

        def reduce(kind: _abi.ReduceKind, v: Val) -> Val:
            o = b.new("", kshape, v.dtype)
            if axes:
                b.emit([v], [o], lambda: ops.reduce(kind, R(v), R(o), axes, _bufs(v, o)))
            else:
                b.emit([v], [o], lambda: ops.convert(R(v), R(o), _bufs(v, o)))
            return o

        if node.op_type == "ReduceL2":
            sq = self._binary(b, E.MUL, x, x)
            r = self._unary(b, _abi.UnaryKind.SQRT, reduce(_abi.ReduceKind.SUM, sq))
        else:
            m = reduce(_abi.ReduceKind.MAX, x)
            e = self._unary(b, _abi.UnaryKind.EXP, self._binary(b, E.SUB, x, m))
            lg = self._unary(b, _abi.UnaryKind.LOG, reduce(_abi.ReduceKind.SUM, e))
            r = self._binary(b, E.ADD, lg, m)
        b.alias(out, r, oshape)

    # -- planning -----------------------------------------------------------------

    def build(
        self,
        nodes: list[Node],
        known: dict[str, Val],
        host: dict[str, tuple[tuple[int, ...], np.dtype[Any]]],
        escapes: set[str],
    ) -> PartitionPlan:
        """Compile one partition (``nodes`` in order) for concrete shapes.

        ``known`` are device tensors from the weights and earlier partitions,
        ``host`` the shapes and dtypes of the host arrays it reads, and
        ``escapes`` the names read after the partition.
        """
        b = _Builder(self, nodes, known, host, escapes)
        for node in nodes:
            b.node = node
            try:
                self._plan_node(b, node)
            except ModelError:
                raise
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise ModelError(
                    f"{self.graph.source}: {node.describe()}: cannot plan for the NPU: {exc}"
                ) from exc
        step = _abi.NPU_SUBMIT_MAX_OPS
        graph_order = list(range(len(b.steps)))
        if self.concurrent:
            order, levels = level_order(b.access)
            b.reorder(order, levels)
        arena, size = b.place()
        built = self._make_ops(b)
        if self.concurrent:
            small = [op_work(op) < MIN_CONCURRENT_WORK for op in built]
            flags = concurrent_flags(b.ranges(), range(0, len(built), step), small)
            built = [op.with_concurrent() if f else op for op, f in zip(built, flags, strict=True)]
            if not any(flags):
                # Nothing runs concurrently: plan in graph order, as without.
                at = {j: i for i, j in enumerate(order)}
                b.reorder([at[j] for j in graph_order])
                if arena is not None:
                    self.free(arena)
                arena, size = b.place()
                built = self._make_ops(b)
        op_nodes = {id(op): node for op, (node, _) in zip(built, b.steps, strict=True)}
        chunks = [built[i : i + step] for i in range(0, len(built), step)]
        host_inputs = [(name, v.numpy()) for name, v in b.host_inputs]
        outputs = [(name, v.numpy()) for name, v in b.vals.items() if name in escapes]
        for _, arr in outputs:
            arr.flags.writeable = False
        log.debug(
            "%s: planned NPU partition of %d nodes: %d ops, arena %d bytes",
            self.graph.source,
            len(nodes),
            len(built),
            size,
        )
        packed = [self.device.pack(chunk) for chunk in chunks]
        return PartitionPlan(
            built, chunks, packed, host_inputs, outputs, op_nodes, arena, size, b.vals
        )

    def _make_ops(self, b: _Builder) -> list[ops.TensorOp]:
        """Build every step's op (after :meth:`_Builder.place`)."""
        built: list[ops.TensorOp] = []
        for node, make in b.steps:
            try:
                built.append(make())
            except ValueError as exc:
                raise ModelError(
                    f"{self.graph.source}: {node.describe()}: the NPU op is invalid: {exc}"
                ) from exc
        return built

    def _plan_node(self, b: _Builder, node: Node) -> None:
        planner = _PLANNERS.get(node.op_type)
        if planner is None:
            raise ModelError(
                f"{self.graph.source}: {node.describe()}: no NPU planner for {node.op_type}"
            )
        planner(self, b, node)

    def _plan_view(self, b: _Builder, node: Node) -> None:
        """Reshape, Flatten, Squeeze, Unsqueeze, Identity: a view (the CPU kernel's shape)."""
        g = self.graph
        x = b.get(node.inputs[0])
        params: list[Array | None] = [np.empty(x.shape, np.uint8)]
        params += [g.const(i) for i in node.inputs[1:]]
        shape = CPU_OPS[node.op_type](node, params, g.opset)[0].shape
        b.alias(node.outputs[0], x, shape)

    def _plan_cast(self, b: _Builder, node: Node) -> None:
        """A Cast to the same dtype is a view; any other a CONVERT."""
        R = b.ref
        x = b.get(node.inputs[0])
        to = np.dtype(_onnx_np(int(node.attrs["to"])))
        if to == x.dtype:
            b.alias(node.outputs[0], x, x.shape)
            return
        o = b.new(node.outputs[0], x.shape, to)
        b.emit([x], [o], lambda: ops.convert(R(x), R(o), _bufs(x, o)))

    def _plan_max_min(self, b: _Builder, node: Node) -> None:
        """Max/Min of two inputs is one ELTWISE; of any other number a chain."""
        if len(node.inputs) == 2:
            self._plan_eltwise(b, node)
        else:
            self._plan_variadic(b, node)

    def _plan_eltwise(self, b: _Builder, node: Node) -> None:
        """A binary ELTWISE with numpy broadcasting (a bool result for the comparisons)."""
        R = b.ref
        op = node.op_type
        a, c = b.get(node.inputs[0]), b.get(node.inputs[1])
        oshape = tuple(np.broadcast_shapes(a.shape, c.shape))
        o = b.new(node.outputs[0], oshape, np.dtype(np.bool_) if op in COMPARE_OPS else a.dtype)
        r = max(len(oshape), 1)
        os_ = oshape or (1,)
        pa, pc = _pad_to(a.shape, r), _pad_to(c.shape, r)
        kind = ELTWISE_OPS[op]
        b.emit(
            [a, c],
            [o],
            lambda: ops.eltwise(
                kind,
                R(a, pa, _bcast_strides(pa, os_)),
                R(c, pc, _bcast_strides(pc, os_)),
                R(o, os_),
                _bufs(a, c, o),
            ),
        )

    def _plan_unary(self, b: _Builder, node: Node) -> None:
        R = b.ref
        x = b.get(node.inputs[0])
        o = b.new(node.outputs[0], x.shape, x.dtype)
        ukind = UNARY_OPS[node.op_type]
        b.emit([x], [o], lambda: ops.unary(ukind, R(x), R(o), _bufs(x, o)))

    def _plan_transpose(self, b: _Builder, node: Node) -> None:
        """A CONVERT of the permuted view, adjacent axes merged (rank <= 4 on the device)."""
        R = b.ref
        x = b.get(node.inputs[0])
        perm = [int(p) for p in node.attrs.get("perm", range(len(x.shape) - 1, -1, -1))]
        o = b.new(node.outputs[0], tuple(x.shape[p] for p in perm), x.dtype)
        mshape, mperm = transpose_runs(x.shape, perm)
        st = _strides(mshape)
        pshape = tuple(mshape[p] for p in mperm)
        pstrides = tuple(st[p] for p in mperm)
        b.emit(
            [x],
            [o],
            lambda: ops.convert(
                R(x, pshape or (1,), pstrides or (1,)), R(o, pshape or (1,)), _bufs(x, o)
            ),
        )

    def _plan_softmax(self, b: _Builder, node: Node) -> None:
        """SOFTMAX along one axis; before opset 13 the input is coerced to 2-D first."""
        R = b.ref
        x = b.get(node.inputs[0])
        o = b.new(node.outputs[0], x.shape, x.dtype)
        skind = _abi.SoftmaxKind.LOG if node.op_type == "LogSoftmax" else _abi.SoftmaxKind.SOFTMAX
        r = len(x.shape)
        if self.graph.opset < 13:
            axis = int(node.attrs.get("axis", 1)) % r
            flat = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
            b.emit([x], [o], lambda: ops.softmax(skind, R(x, flat), R(o, flat), 1, _bufs(x, o)))
        else:
            ax = int(node.attrs.get("axis", -1)) % r
            b.emit([x], [o], lambda: ops.softmax(skind, R(x), R(o), ax, _bufs(x, o)))

    def _plan_layernorm(self, b: _Builder, node: Node) -> None:
        R = b.ref
        x = b.get(node.inputs[0])
        r = len(x.shape)
        axis = int(node.attrs.get("axis", -1)) % r
        want = (1,) * axis + x.shape[axis:]
        n = math.prod(x.shape[axis:])
        gamma = b.get(node.inputs[1])
        beta = b.get(node.input(2)) if node.input(2) else self._zeros(n, gamma.dtype)
        o = b.new(node.outputs[0], x.shape, x.dtype)
        eps = float(node.attrs.get("epsilon", 1e-5))
        b.emit(
            [x, gamma, beta],
            [o],
            lambda: ops.layernorm(
                R(x), R(gamma, want), R(beta, want), R(o), r - axis, eps,
                _bufs(x, gamma, beta, o),
            ),
        )  # fmt: skip

    def _plan_reduce(self, b: _Builder, node: Node) -> None:
        """REDUCE over constant axes, keeping dims; a view drops them without keepdims."""
        R = b.ref
        out = node.outputs[0]
        x = b.get(node.inputs[0])
        axes = reduce_axes(node, self.graph.const(node.input(1)), len(x.shape), self.graph.opset)
        if axes is None:
            b.alias(out, x, x.shape)
            return
        kshape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
        o = b.new("", kshape, x.dtype)
        rkind = _REDUCE[node.op_type]
        b.emit([x], [o], lambda: ops.reduce(rkind, R(x), R(o), axes, _bufs(x, o)))
        keep = bool(node.attrs.get("keepdims", 1))
        b.alias(
            out, o, kshape if keep else tuple(s for d, s in enumerate(x.shape) if d not in axes)
        )

    def _plan_variadic(self, b: _Builder, node: Node) -> None:
        """Sum, Mean, and Max/Min of other than two inputs: a chain of binary ELTWISE ops.

        Mean sums into a temporary and scales it by 1/n into the output; one
        input is the output itself (a view).
        """
        R = b.ref
        kind = VARIADIC_OPS[node.op_type]
        ins = [b.get(i) for i in node.inputs if i]
        acc = ins[0]
        target = "" if node.op_type == "Mean" else node.outputs[0]
        if len(ins) == 1:
            b.alias(node.outputs[0], acc, acc.shape)
            return
        for k, x in enumerate(ins[1:], start=2):
            oshape = tuple(np.broadcast_shapes(acc.shape, x.shape))
            o = b.new(target if k == len(ins) else "", oshape, acc.dtype)
            r = max(len(oshape), 1)
            os_ = oshape or (1,)
            pa, px = _pad_to(acc.shape, r), _pad_to(x.shape, r)

            def make(
                a: Val = acc, c: Val = x, o: Val = o, pa: Any = pa, px: Any = px, os_: Any = os_
            ) -> ops.TensorOp:
                return ops.eltwise(
                    kind,
                    R(a, pa, _bcast_strides(pa, os_)),
                    R(c, px, _bcast_strides(px, os_)),
                    R(o, os_),
                    _bufs(a, c, o),
                )

            b.emit([acc, x], [o], make)
            acc = o
        if node.op_type == "Mean":
            self._scalar_op(b, _abi.EltwiseKind.MUL, acc, 1.0 / len(ins), node.outputs[0])

    def _plan_concat(self, b: _Builder, node: Node) -> None:
        """Concat: one CONVERT per input and per block before the axis (contiguous copies).

        The output rows of one input are contiguous only within one index of
        the axes before ``axis``, so an input is copied as
        ``prod(shape[:axis])`` blocks (one for a batch of 1 on axis 1).

        Raises:
            ModelError: more than :data:`MAX_CONCAT_COPIES` copies (the
                partition then runs on the CPU for these shapes).
        """
        R = b.ref
        ins = [b.get(i) for i in node.inputs if i]
        r = len(ins[0].shape)
        axis = int(node.attrs.get("axis", 0))
        axis = axis + r if axis < 0 else axis
        oshape = list(ins[0].shape)
        oshape[axis] = sum(x.shape[axis] for x in ins)
        o = b.new(node.outputs[0], oshape, ins[0].dtype)
        blocks = math.prod(oshape[:axis])
        if blocks * len(ins) > MAX_CONCAT_COPIES:
            raise ModelError(
                f"{self.graph.source}: {node.describe()}: Concat would take "
                f"{blocks * len(ins)} copies (at most {MAX_CONCAT_COPIES})"
            )
        row = math.prod(oshape[axis + 1 :])
        out_block = math.prod(oshape[axis:])
        item = o.dtype.itemsize
        start = 0
        for x in ins:
            n = x.shape[axis] * row
            for p in range(blocks):
                src = Val(x.storage, (n,), x.dtype, x.offset + p * n * item)
                dst = Val(o.storage, (n,), o.dtype, o.offset + (p * out_block + start) * item)

                def make(src: Val = src, dst: Val = dst, x: Val = x) -> ops.TensorOp:
                    return ops.convert(R(src), R(dst), _bufs(x, o))

                b.emit([src], [dst], make)
            start += n

    def _copy(
        self,
        b: _Builder,
        src: Val,
        dst: Val,
        dims: Sequence[tuple[int, int, int]],
        offsets: tuple[int, int] = (0, 0),
    ) -> None:
        """CONVERT copies of a strided view of ``src`` into a strided view of ``dst``.

        ``dims`` are ``(size, src_stride, dst_stride)`` in elements, outermost
        first; ``offsets`` the elements from each value's start to element 0.
        Adjacent dims that step alike merge; when more than ``NPU_MAX_RANK``
        remain, the outer ones become a loop of copies. A ``dst`` view that
        is not row-major needs ``Cap.STRIDED_OUT`` (its elements must not
        overlap).
        """
        outer, inner = merge_dims(dims, _abi.NPU_MAX_RANK)
        shape = tuple(d[0] for d in inner)
        sst, dst_st = tuple(d[1] for d in inner), tuple(d[2] for d in inner)
        R = b.ref
        for idx in np.ndindex(*(d[0] for d in outer)):
            so = offsets[0] + sum(i * d[1] for i, d in zip(idx, outer, strict=True))
            do = offsets[1] + sum(i * d[2] for i, d in zip(idx, outer, strict=True))
            s_val = Val(src.storage, shape, src.dtype, src.offset + so * src.dtype.itemsize)
            d_val = Val(dst.storage, shape, dst.dtype, dst.offset + do * dst.dtype.itemsize)

            def make(s_val: Val = s_val, d_val: Val = d_val) -> ops.TensorOp:
                return ops.convert(
                    R(s_val, shape, sst), R(d_val, shape, dst_st), _bufs(s_val, d_val)
                )

            b.emit([s_val], [d_val], make)

    def _plan_where(self, b: _Builder, node: Node) -> None:
        """Where: one SELECT, the three inputs broadcast to the output."""
        R = b.ref
        c, x, y = (b.get(i) for i in node.inputs[:3])
        oshape = tuple(np.broadcast_shapes(c.shape, x.shape, y.shape))
        o = b.new(node.outputs[0], oshape, x.dtype)
        os_ = oshape or (1,)
        r = len(os_)
        pc, px, py = (_pad_to(v.shape, r) for v in (c, x, y))
        b.emit(
            [c, x, y],
            [o],
            lambda: ops.select(
                R(c, pc, _bcast_strides(pc, os_)),
                R(x, px, _bcast_strides(px, os_)),
                R(y, py, _bcast_strides(py, os_)),
                R(o, os_),
                _bufs(c, x, y, o),
            ),
        )

    def _plan_pad(self, b: _Builder, node: Node) -> None:
        """Pad: the input copied into the interior, then the borders per axis.

        constant: the fill value broadcast over the whole output first;
        edge: each border is the edge row broadcast; reflect: one copy per
        mirrored row; wrap: each border is a copy of the far end. The
        borders of axis ``d`` span the padded extent of the axes before it,
        so the corners come out right.
        """
        x = b.get(node.inputs[0])
        spec = pad_spec(node, self.graph, x.shape)
        assert isinstance(spec, PadSpec)
        r = len(x.shape)
        oshape = tuple(n + p + q for n, p, q in zip(x.shape, spec.begin, spec.end, strict=True))
        o = b.new(node.outputs[0], oshape, x.dtype)
        xs, os_ = _strides(x.shape), _strides(oshape)
        padded = any(spec.begin) or any(spec.end)
        if spec.mode == "constant" and padded:
            k = self._scalar(spec.value, x.dtype)
            self._copy(b, k, o, [(math.prod(oshape), 0, 1)])
        interior = sum(p * s for p, s in zip(spec.begin, os_, strict=True))
        self._copy(b, x, o, list(zip(x.shape, xs, os_, strict=True)), (0, interior))
        if spec.mode == "constant":
            return
        for d in range(r):
            # Axes before d: their whole padded extent; after d: the interior.
            lo = [0 if e < d else spec.begin[e] for e in range(r)]
            size = [oshape[e] if e < d else x.shape[e] for e in range(r)]

            def rows(
                dst: int,
                src: int,
                n: int,
                step: int,
                d: int = d,
                lo: list[int] = lo,
                size: list[int] = size,
            ) -> None:
                """Copy ``n`` rows of axis ``d`` from ``src`` (``step`` apart) to ``dst`` on."""
                at = list(lo)
                at[d] = src
                so = sum(i * s for i, s in zip(at, os_, strict=True))
                at[d] = dst
                do = sum(i * s for i, s in zip(at, os_, strict=True))
                dims = [
                    (n if e == d else size[e], step if e == d else os_[e], os_[e]) for e in range(r)
                ]
                self._copy(b, o, o, dims, (so, do))

            n, p, q = x.shape[d], spec.begin[d], spec.end[d]
            if spec.mode == "edge":
                if p:
                    rows(0, p, p, 0)
                if q:
                    rows(p + n, p + n - 1, q, 0)
            elif spec.mode == "wrap":
                if p:
                    rows(0, n, p, os_[d])
                if q:
                    rows(p + n, p, q, os_[d])
            else:  # reflect: row i mirrors row 2p - i; one copy each
                for i in range(p):
                    rows(i, 2 * p - i, 1, os_[d])
                for j in range(q):
                    rows(p + n + j, p + n - 2 - j, 1, os_[d])

    def _plan_resize(self, b: _Builder, node: Node) -> None:
        """Resize: a strided copy when it can be one, else pieces per axis.

        One copy (:func:`resize_dims`): nearest where, per axis, output ``o``
        reads input ``c + (o // k) * s``: the view splits the axis into
        ``(out / k, k)`` with strides ``(s, 0)``. A repeat on the last axis
        (rows of ``k`` elements) becomes ``k`` copies into strided views of
        whole rows instead, with ``Cap.STRIDED_OUT``. Otherwise (linear, or
        another nearest map) one axis after the other, each
        :class:`LinearPiece` either a strided copy (``w1 == 0``) or
        ``(1 - w1) * x0 + w1 * x1`` (two MULs by scalar constants and an
        ADD into a temporary) copied into its strided place.
        """
        x = b.get(node.inputs[0])
        maps = resize_maps(node, self.graph, x.shape)
        assert not isinstance(maps, str)
        plan = resize_dims(maps)
        if plan is not None:
            o = b.new(node.outputs[0], tuple(m.size_out for m in maps), x.dtype)
            start, dims = plan
            *head, last, (k, _, ost) = dims
            if k > 1 and self.device.info.has(_abi.Cap.STRIDED_OUT):
                # A repeat on the last axis would make rows of k elements;
                # one strided copy per output phase keeps whole rows.
                for j in range(k):
                    self._copy(b, x, o, [*head, last], (start, j * ost))
                return
            self._copy(b, x, o, dims, (start, 0))
            return
        axes = [d for d, m in enumerate(maps) if not m.identity]
        cur = x
        for i, d in enumerate(axes):
            m = maps[d]
            shape = list(cur.shape)
            shape[d] = m.size_out
            o = b.new(node.outputs[0] if i == len(axes) - 1 else "", shape, x.dtype)
            a, inner = math.prod(cur.shape[:d]), math.prod(cur.shape[d + 1 :])
            n_in, n_out = cur.shape[d], m.size_out
            for p in linear_pieces(m):
                place = (a, n_out * inner), (p.count, p.out_step * inner)
                if p.w1 == 0.0:
                    dims = [
                        (a, n_in * inner, place[0][1]),
                        (p.count, p.in_step * inner, place[1][1]),
                    ]
                    self._copy(b, cur, o, [*dims, (inner, 1, 1)], (p.in0 * inner, p.out0 * inner))
                    continue
                view = ((a, p.count, inner), (n_in * inner, p.in_step * inner, 1))
                t0 = self._scaled_view(b, cur, p.in0 * inner, view, 1.0 - p.w1)
                t1 = self._scaled_view(b, cur, p.in1 * inner, view, p.w1)
                t = self._binary(b, _abi.EltwiseKind.ADD, t0, t1)
                dims = [(a, p.count * inner, place[0][1]), (p.count, inner, place[1][1])]
                self._copy(b, t, o, [*dims, (inner, 1, 1)], (0, p.out0 * inner))
            cur = o

    def _scaled_view(
        self,
        b: _Builder,
        x: Val,
        offset: int,
        view: tuple[tuple[int, ...], tuple[int, ...]],
        value: float,
    ) -> Val:
        """``value *`` a strided view of ``x`` (``offset`` elements in) into a new tensor."""
        R = b.ref
        shape, strides = view
        k = self._scalar(value, x.dtype)
        src = Val(x.storage, shape, x.dtype, x.offset + offset * x.dtype.itemsize)
        o = b.new("", shape, x.dtype)
        ones, zeros = (1,) * len(shape), (0,) * len(shape)
        b.emit(
            [src, k],
            [o],
            lambda: ops.eltwise(
                _abi.EltwiseKind.MUL,
                R(src, shape, strides),
                R(k, ones, zeros),
                R(o, shape),
                _bufs(src, k, o),
            ),
        )
        return o

    def _plan_conv(self, b: _Builder, node: Node) -> None:
        x = b.get(node.inputs[0])
        w = b.get(node.inputs[1])
        bias = b.get(node.input(2)) if node.input(2) else self._zeros(w.shape[0], x.dtype)
        out = node.outputs[0]
        if not node.residual:
            self._conv(b, node, x, w, bias, out, x.dtype, _ACT[node.act], 0)
            return
        # A fused residual: CONV2D accumulates into an output that holds it.
        r = b.get(node.inputs[3])
        if r.dtype != x.dtype:
            raise ModelError(f"{self.graph.source}: {node.describe()}: residual of {r.dtype}")
        if self._can_overwrite(b, node, r, x):
            into = b.alias(out, r, r.shape)  # after its last read: in place
        else:
            into = b.new(out, r.shape, r.dtype)
            R = b.ref
            b.emit([r], [into], lambda: ops.convert(R(r), R(into), _bufs(r, into)))
        self._conv(b, node, x, w, bias, out, x.dtype, _ACT[node.act], 0, into=into)

    def _can_overwrite(self, b: _Builder, node: Node, r: Val, x: Val) -> bool:
        """Whether ``node`` may write its output over ``r``'s storage: no later
        reader of any tensor on it, not an output, not a host input or a
        constant, and not the convolution's input."""
        st = r.storage
        whole = not r.offset and r.numel * r.dtype.itemsize == st.nbytes
        if st.fixed or st.first < 0 or x.storage is st or not whole:
            return False
        here = self._position[id(node)]
        for name, v in b.vals.items():
            if v.storage is st and (
                name in b.escapes
                or name in self.graph.outputs
                or self._last_read.get(name, -1) > here
            ):
                return False
        return True

    def _conv(
        self,
        b: _Builder,
        node: Node,
        x: Val,
        w: Val,
        bias: Val,
        out: str,
        dtype: np.dtype[Any],
        act: _abi.ActKind,
        zero_point: int,
        into: Val | None = None,
    ) -> Val:
        """One CONV2D of ``node``'s geometry into a new tensor ``out``, or, with
        ``into`` (holding the residual), accumulating into it (``out`` names it)."""
        o_ch, _, kh, kw = w.shape
        a = node.attrs
        sh, sw = (int(s) for s in a.get("strides", [1, 1]))
        dh, dw = (int(d) for d in a.get("dilations", [1, 1]))
        groups = int(a.get("group", 1))
        pads = conv_pads(a, x.shape[2:], (kh, kw), (sh, sw), (dh, dw))
        ph, pw = pads[0], pads[1]
        oh = window_out(x.shape[2], kh, sh, ph, dh)
        ow = window_out(x.shape[3], kw, sw, pw, dw)
        shape = (x.shape[0], o_ch, oh, ow)
        if into is None:
            o = b.new(out, shape, dtype)
        elif into.shape != shape or into.dtype != dtype:
            raise ModelError(
                f"{self.graph.source}: {node.describe()}: residual {into.shape} of "
                f"{into.dtype}, the convolution makes {shape} of {dtype}"
            )
        else:
            o = into
        R = b.ref
        b.emit(
            [x, w, bias] if into is None else [x, w, bias, into],
            [o],
            lambda: ops.conv2d_op(
                R(x),
                R(w),
                R(bias, (1, o_ch, 1, 1)),
                R(o),
                (sh, sw),
                (ph, pw),
                (dh, dw),
                groups,
                act,
                _bufs(x, w, bias, o),
                input_zero_point=zero_point,
                accumulate=into is not None,
            ),
        )
        return o

    # -- int8 ---------------------------------------------------------------------

    def _int_param(self, node: Node, i: int) -> int:
        """A scalar integer constant input (a zero point); 0 when absent."""
        v = self.graph.const(node.input(i)) if node.input(i) else None
        return 0 if v is None else int(np.asarray(v).reshape(-1)[0])

    def _requant(self, b: _Builder, node: Node, acc: Val, out: str, zp_in: int, axis: int) -> Val:
        """REQUANT ``acc`` (int32) to int8 ``out`` with the node's scale along ``axis``."""
        R = b.ref
        scale = self.weights[f"__rq_{node.name}"]
        sshape = [1] * len(acc.shape)
        if scale.numel > 1:
            sshape[axis] = scale.numel
        o = b.new(out, acc.shape, np.dtype(np.int8))
        act = _ACT[node.act]
        b.emit(
            [acc, scale],
            [o],
            lambda: ops.requant_op(
                R(acc), R(scale, sshape), R(o), zp_in, act, _bufs(acc, scale, o)
            ),
        )
        return o

    def _plan_qlinear_conv(self, b: _Builder, node: Node) -> None:
        """QLinearConv and ConvInteger: an integer CONV2D (then REQUANT for QLinearConv)."""
        x = b.get(node.inputs[0])
        q = node.op_type == "QLinearConv"
        w = b.get(node.input(3 if q else 1))
        i32 = np.dtype(np.int32)
        bias = b.get(node.input(8)) if q and node.input(8) else self._zeros(w.shape[0], i32)
        zx = self._int_param(node, 2)
        if not q:
            self._conv(b, node, x, w, bias, node.outputs[0], i32, _abi.ActKind.NONE, zx)
            return
        acc = self._conv(b, node, x, w, bias, "", i32, _abi.ActKind.NONE, zx)
        self._requant(b, node, acc, node.outputs[0], self._int_param(node, 7), 1)

    def _plan_qlinear_matmul(self, b: _Builder, node: Node) -> None:
        """QLinearMatMul and MatMulInteger: an integer MATMUL (then REQUANT)."""
        q = node.op_type == "QLinearMatMul"
        a_v = b.get(node.inputs[0])
        b_v = b.get(node.input(3 if q else 1))
        ash, bsh, dev_shape, onnx_shape = _matmul_shapes(a_v.shape, b_v.shape)
        za = self._int_param(node, 2)
        acc = b.new("", dev_shape, np.dtype(np.int32))
        R = b.ref
        b.emit(
            [a_v, b_v],
            [acc],
            lambda: ops.matmul_op(
                R(a_v, ash), R(b_v, bsh), R(acc), _abi.ActKind.NONE, _bufs(a_v, b_v, acc),
                input_zero_point=za,
            ),
        )  # fmt: skip
        res = (
            self._requant(b, node, acc, "", self._int_param(node, 7), len(dev_shape) - 1)
            if q
            else acc
        )
        b.alias(node.outputs[0], res, onnx_shape)

    def _plan_qgemm(self, b: _Builder, node: Node) -> None:
        """com.microsoft.QGemm: an integer LINEAR (MATMUL without C), then REQUANT."""
        a_v = b.get(node.inputs[0])
        b_v = b.get(node.input(3))
        m, k = a_v.shape
        tb = bool(node.attrs.get("transB", 0))
        n = b_v.shape[0] if tb else b_v.shape[1]
        b_ref = ((k, n), (1, k)) if tb else ((k, n), (n, 1))
        za = self._int_param(node, 2)
        acc = b.new("", (m, n), np.dtype(np.int32))
        R = b.ref
        none = _abi.ActKind.NONE
        if node.input(6):
            c = b.get(node.input(6))
            b.emit(
                [a_v, b_v, c],
                [acc],
                lambda: ops.linear_op(
                    R(a_v), R(b_v, *b_ref), R(c, (1, n)), R(acc), none, _bufs(a_v, b_v, c, acc),
                    input_zero_point=za,
                ),
            )  # fmt: skip
        else:
            b.emit(
                [a_v, b_v],
                [acc],
                lambda: ops.matmul_op(
                    R(a_v), R(b_v, *b_ref), R(acc), none, _bufs(a_v, b_v, acc), input_zero_point=za
                ),
            )
        self._requant(b, node, acc, node.outputs[0], self._int_param(node, 8), 1)

    def _plan_quantize(self, b: _Builder, node: Node) -> None:
        """QuantizeLinear: ``x / scale``; ``(v + M) - (M - zp)`` rounds half to even
        and adds the zero point; then CONVERT (saturating)."""
        E = _abi.EltwiseKind
        R = b.ref
        x = b.get(node.inputs[0])
        t = self._binary(b, E.DIV, x, self.weights[f"__qs_{node.name}"])
        t = self._scalar_op(b, E.ADD, t, _RNE_MAGIC)
        t = self._binary(b, E.SUB, t, self.weights[f"__qm_{node.name}"])
        shp = x.shape or (1,)
        o = b.new(node.outputs[0], x.shape, np.dtype(np.int8))
        b.emit([t], [o], lambda: ops.convert(R(t, shp), R(o, shp), _bufs(t, o)))

    def _plan_dequantize(self, b: _Builder, node: Node) -> None:
        """DequantizeLinear: CONVERT to float32, ``- zp``, ``* scale``."""
        E = _abi.EltwiseKind
        R = b.ref
        x = b.get(node.inputs[0])
        shp = x.shape or (1,)
        wide = b.new("", x.shape, np.dtype(np.float32))
        b.emit([x], [wide], lambda: ops.convert(R(x, shp), R(wide, shp), _bufs(x, wide)))
        zp = self.weights.get(f"__qz_{node.name}")
        centred = self._binary(b, E.SUB, wide, zp) if zp is not None else wide
        self._binary(b, E.MUL, centred, self.weights[f"__qs_{node.name}"], node.outputs[0])

    def _plan_pool(self, b: _Builder, node: Node) -> None:
        x = b.get(node.inputs[0])
        op = node.op_type
        kind = _abi.PoolKind.MAX if op in ("MaxPool", "GlobalMaxPool") else _abi.PoolKind.AVG
        if op.startswith("Global"):
            geo = PoolGeometry((x.shape[2], x.shape[3]), (1, 1), (0, 0, 0, 0), (1, 1), False, True)
        else:
            geo = pool_geometry(node, x.shape[2:])
        oh, ow = (
            pool_out(x.shape[2 + i], geo.kernel[i], geo.strides[i],
                     (geo.pads[i], geo.pads[i + 2]), geo.dilations[i], geo.ceil_mode)
            for i in (0, 1)
        )  # fmt: skip
        o = b.new(node.outputs[0], (x.shape[0], x.shape[1], oh, ow), x.dtype)
        R = b.ref
        b.emit(
            [x],
            [o],
            lambda: ops.pool2d_op(
                kind,
                R(x),
                R(o),
                geo.kernel,
                geo.strides,
                geo.pads,
                geo.count_include_pad,
                _bufs(x, o),
                dilation=geo.dilations,
                ceil_mode=geo.ceil_mode,
            ),
        )

    def _plan_lrn(self, b: _Builder, node: Node) -> None:
        """LRN as eight ops: ``y = x * (bias + alpha * avg_c(x^2)) ** -beta``.

        The channel-window average is a POOL2D AVG (count_include_pad) over
        ``x^2`` viewed as ``[N, 1, C, H*W]`` with a ``size x 1`` kernel and
        ``(size - 1) / 2`` rows of padding (ONNX sums over ``size`` channels
        and divides by ``size``); the power is ``exp(-beta * log(d))``.
        """
        R = b.ref
        x = b.get(node.inputs[0])
        n, c, h, w = x.shape
        size = int(node.attrs["size"])
        alpha, bias, neg_beta = self._lrn_scalars(node)
        pooled = (n, 1, c, h * w)
        sq = self._binary(b, _abi.EltwiseKind.MUL, x, x)
        avg = b.new("", pooled, x.dtype)
        pad = (size - 1) // 2
        b.emit(
            [sq],
            [avg],
            lambda: ops.pool2d_op(
                _abi.PoolKind.AVG,
                R(sq, pooled),
                R(avg),
                (size, 1),
                (1, 1),
                (pad, 0),
                True,
                _bufs(sq, avg),
            ),
        )
        mul, add = _abi.EltwiseKind.MUL, _abi.EltwiseKind.ADD
        d = self._scalar_op(b, add, self._scalar_op(b, mul, avg, alpha), bias)
        scaled = self._scalar_op(b, mul, self._unary(b, _abi.UnaryKind.LOG, d), neg_beta)
        inv = self._unary(b, _abi.UnaryKind.EXP, scaled)
        self._binary(b, mul, x, b.alias("", inv, x.shape), node.outputs[0])

    def _plan_gemm(self, b: _Builder, node: Node) -> None:
        a_v = b.get(node.inputs[0])
        b_v = b.get(node.inputs[1])
        ta, tb = bool(node.attrs.get("transA", 0)), bool(node.attrs.get("transB", 0))
        m, k = (a_v.shape[1], a_v.shape[0]) if ta else a_v.shape
        n = b_v.shape[0] if tb else b_v.shape[1]
        a_ref = ((m, k), (1, m)) if ta else ((m, k), (k, 1))
        b_ref = ((k, n), (1, k)) if tb else ((k, n), (n, 1))
        act = _ACT[node.act]
        out = node.outputs[0]
        R = b.ref
        c_name = node.input(2)
        c = b.get(c_name) if c_name else None
        if c is not None and c.numel in (1, n) and (len(c.shape) < 2 or c.shape[0] == 1):
            o = b.new(out, (m, n), a_v.dtype)
            cstr = (0, 0) if c.numel == 1 and n != 1 else (0, 1)
            b.emit(
                [a_v, b_v, c],
                [o],
                lambda: ops.linear_op(
                    R(a_v, *a_ref),
                    R(b_v, *b_ref),
                    R(c, (1, n), cstr),
                    R(o),
                    act,
                    _bufs(a_v, b_v, c, o),
                ),
            )
            return
        if c is None:
            o = b.new(out, (m, n), a_v.dtype)
            b.emit(
                [a_v, b_v],
                [o],
                lambda: ops.matmul_op(
                    R(a_v, *a_ref), R(b_v, *b_ref), R(o), act, _bufs(a_v, b_v, o)
                ),
            )
            return
        # C of shape [M, N] or [M, 1]: MATMUL, then ADD (then the activation).
        tmp = b.new("", (m, n), a_v.dtype)
        b.emit(
            [a_v, b_v],
            [tmp],
            lambda: ops.matmul_op(
                R(a_v, *a_ref), R(b_v, *b_ref), R(tmp), _abi.ActKind.NONE, _bufs(a_v, b_v, tmp)
            ),
        )
        pc = _pad_to(c.shape, 2)
        summed = b.new(out if not node.act else "", (m, n), a_v.dtype)
        b.emit(
            [tmp, c],
            [summed],
            lambda: ops.eltwise(
                _abi.EltwiseKind.ADD,
                R(tmp),
                R(c, pc, _bcast_strides(pc, (m, n))),
                R(summed),
                _bufs(tmp, c, summed),
            ),
        )
        if node.act:
            o = b.new(out, (m, n), a_v.dtype)
            ukind = UNARY_OPS[node.act]
            b.emit([summed], [o], lambda: ops.unary(ukind, R(summed), R(o), _bufs(summed, o)))

    def _plan_matmul(self, b: _Builder, node: Node) -> None:
        a_v = b.get(node.inputs[0])
        b_v = b.get(node.inputs[1])
        ash, bsh, dev_shape, onnx_shape = _matmul_shapes(a_v.shape, b_v.shape)
        r, n = len(dev_shape), dev_shape[-1]
        o = b.new("", dev_shape, a_v.dtype)
        act = _ACT[node.act]
        R = b.ref
        bias_name = node.input(2)
        if bias_name:
            bias = b.get(bias_name)
            bshape = (1,) * (r - 1) + (n,)
            b.emit(
                [a_v, b_v, bias],
                [o],
                lambda: ops.linear_op(
                    R(a_v, ash), R(b_v, bsh), R(bias, bshape), R(o), act, _bufs(a_v, b_v, bias, o)
                ),
            )
        else:
            b.emit(
                [a_v, b_v],
                [o],
                lambda: ops.matmul_op(R(a_v, ash), R(b_v, bsh), R(o), act, _bufs(a_v, b_v, o)),
            )
        b.alias(node.outputs[0], o, onnx_shape)

    # -- running --------------------------------------------------------------------

    def run_plan(self, plan: PartitionPlan, env: dict[str, Array]) -> tuple[float, float]:
        """Execute ``plan``: write its host inputs, submit, wait; publish its outputs in ``env``.

        Inside ``with stream:`` (a user stream of this device) the plan is
        launched on that stream instead of SUBMIT, from descriptors built at
        its first such run.

        Returns:
            (seconds spent writing inputs, seconds in submit + wait).

        Raises:
            NpuDeviceError: an op failed on the device (the context names the node).
            NpuError: the driver refused a SUBMIT (the context names the nodes).
        """
        up = self.upload(plan, env)
        t1 = time.perf_counter()
        stream = current_user_stream(self.device) if plan.chunks else None
        if stream is not None:
            plan.fences = []  # op_times reads SUBMIT runs' records only
            self._run_on_stream(plan, stream)
        elif plan.chunks:
            self.wait_plan(plan, self.submit_plan(plan))
        t2 = time.perf_counter()
        for name, view in plan.outputs:
            env[name] = view
        return up, t2 - t1

    def upload(self, plan: PartitionPlan, env: dict[str, Array]) -> float:
        """Write ``plan``'s host inputs from ``env`` into its buffers; the seconds it took.

        Raises:
            ValueError: an input's shape is not the one the plan was built for.
        """
        t0 = time.perf_counter()
        for name, view in plan.host_inputs:
            arr = env[name]
            if arr.shape != view.shape:
                raise ValueError(
                    f"{self.graph.source}: tensor {name!r} has shape {arr.shape} but the plan "
                    f"was built for {view.shape} (data-dependent shape?)"
                )
            np.copyto(view, arr, casting="same_kind")
        return time.perf_counter() - t0

    def submit_plan(self, plan: PartitionPlan) -> int:
        """SUBMIT ``plan``'s prebuilt ops to queue 0 without waiting; the last fence (0: no ops).

        Raises:
            NpuError: the driver refused a SUBMIT (the context names the nodes).
        """
        fence = 0
        plan.fences = []
        for chunk, packed in zip(plan.chunks, plan.packed, strict=True):
            try:
                fence = self.device.submit_packed(packed)
            except NpuError as exc:
                raise self._partition_error(plan, chunk, exc, "") from exc
            plan.fences.append(fence)
        return fence

    def wait_plan(self, plan: PartitionPlan, fence: int, timeout_s: float = WAIT_TIMEOUT_S) -> None:
        """Wait for ``fence`` of :meth:`submit_plan` (nothing to do for 0).

        Raises:
            NpuDeviceError: an op failed on the device (the context names the node).
            NpuTimeoutError: not done within ``timeout_s``.
        """
        if not fence:
            return
        try:
            self.device.wait(fence, timeout_s=timeout_s)
        except NpuDeviceError as exc:
            raise self._node_error(plan, exc) from exc

    def device_span(self, plan: PartitionPlan) -> tuple[int, int] | None:
        """``(t_start, t_end)`` in device ns of ``plan``'s latest SUBMIT run (its
        first op's start, its last op's end), or None when the records were reused."""
        if not plan.fences or len(plan.fences) != len(plan.chunks):
            return None
        first = plan.fences[0] - (len(plan.chunks[0]) - 1)
        try:
            start = self.device.fence_info(first).t_start_ns
            end = self.device.fence_info(plan.fences[-1]).t_end_ns
        except NpuError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        return start, end

    def op_records(
        self, plan: PartitionPlan, fences: Sequence[int] | None = None
    ) -> list[tuple[Node, int, int, int]]:
        """Each op of a completed SUBMIT run of ``plan`` (the latest, or the one
        whose chunks ended at ``fences``): (its node, fence on queue 0, device
        start ns, device end ns), from the completion records.

        Raises:
            NpuError: as :meth:`op_times`.
        """
        ends = plan.fences if fences is None else fences
        if len(ends) != len(plan.chunks):
            raise NpuError(errno.ENOENT, "no completed SUBMIT run of this plan", "op_records")
        out: list[tuple[Node, int, int, int]] = []
        for chunk, last in zip(plan.chunks, ends, strict=True):
            for i, op in enumerate(chunk):
                fence = last - (len(chunk) - 1 - i)
                info = self.device.fence_info(fence)
                out.append((plan.op_nodes[id(op)], fence, info.t_start_ns, info.t_end_ns))
        return out

    def op_times(self, plan: PartitionPlan) -> list[tuple[Node, int]]:
        """Each op of ``plan``'s latest SUBMIT run: (its node, device time in ns).

        From the device's completion records (FENCE_INFO's ``t_end - t_start``):
        op ``i`` of a chunk of ``n`` got fence ``last - (n - 1 - i)``.

        Raises:
            NpuError: no SUBMIT run yet (``ENOENT``: also when the records
                were reused by more than ``ring_entries`` later ops).
        """
        if len(plan.fences) != len(plan.chunks):
            raise NpuError(errno.ENOENT, "no completed SUBMIT run of this plan", "op_times")
        out: list[tuple[Node, int]] = []
        for chunk, last in zip(plan.chunks, plan.fences, strict=True):
            for i, op in enumerate(chunk):
                info = self.device.fence_info(last - (len(chunk) - 1 - i))
                out.append((plan.op_nodes[id(op)], info.t_end_ns - info.t_start_ns))
        return out

    def _run_on_stream(self, plan: PartitionPlan, stream: Stream) -> None:
        """Launch ``plan`` on a user stream from its prebuilt descriptors; wait for it."""
        op_list = [op for chunk in plan.chunks for op in chunk]
        try:
            if plan.program is None:
                plan.program = stream.build_program(op_list)
            _, last = stream.replay_program(plan.program)
            stream.wait_fence(last, WAIT_TIMEOUT_S)
        except NpuDeviceError as exc:
            raise self._node_error(plan, exc) from exc
        except NpuError as exc:
            raise self._partition_error(plan, op_list, exc, f" on {stream!r}") from exc

    def _partition_error(
        self, plan: PartitionPlan, op_list: Sequence[TensorOp], exc: NpuError, where: str
    ) -> NpuError:
        """``exc`` (refused before running) with the ONNX nodes of ``op_list`` named."""
        names = ", ".join(dict.fromkeys(plan.op_nodes[id(o)].name for o in op_list))
        return NpuError(
            exc.errno or 0,
            exc.strerror,
            f"{self.graph.source}: NPU partition (nodes {names}){where}: {exc.context}",
        )

    def _node_error(self, plan: PartitionPlan, exc: NpuDeviceError) -> NpuDeviceError:
        """``exc`` with the ONNX node of its op named in the context."""
        node = plan.op_nodes.get(id(exc.op)) if exc.op is not None else None
        where = node.describe() if node is not None else "an NPU partition"
        return NpuDeviceError(
            exc.status,
            exc.fence,
            exc.op,
            f"{self.graph.source}: {where}: {exc.context}",
            exc.errno or 0,
            exc.strerror,
        )


def _matmul_shapes(
    a: tuple[int, ...], b: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """MATMUL's operand shapes (one rank, 1-D operands promoted), its output's, and ONNX's."""
    ash = a if len(a) > 1 else (1, *a)
    bsh = b if len(b) > 1 else (*b, 1)
    r = max(len(ash), len(bsh))
    ash, bsh = _pad_to(ash, r), _pad_to(bsh, r)
    batch = tuple(np.broadcast_shapes(ash[:-2], bsh[:-2]))
    dev_shape = (*batch, ash[-2], bsh[-1])
    return ash, bsh, dev_shape, _matmul_shape(a, b)


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    ash = a if len(a) > 1 else (1, *a)
    bsh = b if len(b) > 1 else (*b, 1)
    r = max(len(ash), len(bsh))
    ash, bsh = _pad_to(ash, r), _pad_to(bsh, r)
    batch = tuple(np.broadcast_shapes(ash[:-2], bsh[:-2]))
    out = (*batch, ash[-2], bsh[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return tuple(int(d) for d in out)


def _bufs(*vals: Val) -> tuple[Buffer, ...]:
    seen: dict[int, Buffer] = {}
    for v in vals:
        buf = v.storage.buf
        if buf is not None:
            seen.setdefault(id(buf), buf)
    return tuple(seen.values())


def _onnx_np(elem: int) -> Any:
    from onnx import helper

    return helper.tensor_dtype_to_np_dtype(elem)


def free_buffers(buffers: list[Buffer]) -> None:
    """Free ``buffers`` (ignoring ones already freed) and empty the list."""
    while buffers:
        buf = buffers.pop()
        try:
            buf.free()
        except NpuError as exc:  # device closed or already gone
            log.debug("freeing %r: %s", buf, exc)


Planner = Callable[[NpuProvider, _Builder, Node], None]
#: ONNX op -> the NpuProvider method that plans it (partition.npu_reason decides
#: which nodes get here).
_PLANNERS: Final[dict[str, Planner]] = {
    **dict.fromkeys(VIEW_OPS, NpuProvider._plan_view),
    "Cast": NpuProvider._plan_cast,
    "Sum": NpuProvider._plan_variadic,
    "Max": NpuProvider._plan_max_min,
    "Min": NpuProvider._plan_max_min,
    "Mean": NpuProvider._plan_variadic,
    "Concat": NpuProvider._plan_concat,
    **dict.fromkeys(
        [op for op in ELTWISE_OPS if op not in ("Max", "Min")], NpuProvider._plan_eltwise
    ),
    **dict.fromkeys(UNARY_OPS, NpuProvider._plan_unary),
    "Transpose": NpuProvider._plan_transpose,
    "Conv": NpuProvider._plan_conv,
    **dict.fromkeys(
        ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"), NpuProvider._plan_pool
    ),
    "LRN": NpuProvider._plan_lrn,
    **dict.fromkeys(COMPOSED_OPS, NpuProvider._plan_composed),
    "Slice": NpuProvider._plan_slice,
    "Split": NpuProvider._plan_slice,
    "Gather": NpuProvider._plan_gather,
    "ReduceL2": NpuProvider._plan_reduce_composed,
    "ReduceLogSumExp": NpuProvider._plan_reduce_composed,
    "Gemm": NpuProvider._plan_gemm,
    "MatMul": NpuProvider._plan_matmul,
    "Softmax": NpuProvider._plan_softmax,
    "LogSoftmax": NpuProvider._plan_softmax,
    "LayerNormalization": NpuProvider._plan_layernorm,
    **dict.fromkeys(_REDUCE, NpuProvider._plan_reduce),
    "QuantizeLinear": NpuProvider._plan_quantize,
    "DequantizeLinear": NpuProvider._plan_dequantize,
    "QLinearConv": NpuProvider._plan_qlinear_conv,
    "ConvInteger": NpuProvider._plan_qlinear_conv,
    "QLinearMatMul": NpuProvider._plan_qlinear_matmul,
    "MatMulInteger": NpuProvider._plan_qlinear_matmul,
    "QGemm": NpuProvider._plan_qgemm,
    "Where": NpuProvider._plan_where,
    "Pad": NpuProvider._plan_pad,
    "Resize": NpuProvider._plan_resize,
}
