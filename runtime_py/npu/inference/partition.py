"""Which nodes the NPU can run, and the partitioning of the graph into provider subgraphs.

:func:`npu_reason` applies the NPU provider's rules (op, dtypes, ranks,
attributes, the device's capability bits) to one node and returns ``None``
when the NPU can run it, else the reason it cannot. :func:`partition` then
groups the nodes like ONNX Runtime's execution providers: it walks the graph
in a topological order that keeps taking nodes of the current provider while
any is ready (so independent nodes are reordered to make NPU subgraphs as
large as possible) and starts a new partition only when it must.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from .. import _abi
from ..kernels.validate import tensor_op_supported
from .cpu import conv_pads
from .graph import NPU_MIN_OPSET, Graph, Node
from .quant import MS_DOMAIN
from .resample import MAX_COPIES, linear_pieces, pad_spec, resize_dims, resize_maps

__all__ = [
    "COMPARE_OPS",
    "COMPOSED_OPS",
    "ELTWISE_OPS",
    "NPU_DTYPES",
    "QUANT_OPS",
    "UNARY_OPS",
    "VARIADIC_OPS",
    "VIEW_OPS",
    "Partition",
    "PoolGeometry",
    "npu_reason",
    "partition",
    "pool_geometry",
    "slice_spec",
    "split_sizes",
    "transpose_runs",
]

#: numpy dtype -> device dtype, for tensors the NPU provider handles.
NPU_DTYPES: Final[dict[np.dtype[Any], _abi.DType]] = {
    np.dtype(np.float32): _abi.DType.FP32,
    np.dtype(np.float16): _abi.DType.FP16,
    np.dtype(np.int32): _abi.DType.INT32,
    np.dtype(np.int8): _abi.DType.INT8,
    np.dtype(np.bool_): _abi.DType.BOOL,
}
_FLOATS = frozenset({np.dtype(np.float32), np.dtype(np.float16)})

#: ONNX binary ops -> ELTWISE kinds.
ELTWISE_OPS: Final = {
    "Add": _abi.EltwiseKind.ADD,
    "Sub": _abi.EltwiseKind.SUB,
    "Mul": _abi.EltwiseKind.MUL,
    "Div": _abi.EltwiseKind.DIV,
    "Max": _abi.EltwiseKind.MAX,
    "Min": _abi.EltwiseKind.MIN,
    "Equal": _abi.EltwiseKind.EQ,
    "Less": _abi.EltwiseKind.LT,
    "LessOrEqual": _abi.EltwiseKind.LE,
    "Greater": _abi.EltwiseKind.GT,
    "GreaterOrEqual": _abi.EltwiseKind.GE,
}
#: The comparisons among them: their output is bool.
COMPARE_OPS: Final = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
#: ONNX unary ops -> UNARY kinds.
UNARY_OPS: Final = {
    "Relu": _abi.UnaryKind.RELU,
    "Gelu": _abi.UnaryKind.GELU,
    "Sigmoid": _abi.UnaryKind.SIGMOID,
    "Tanh": _abi.UnaryKind.TANH,
    "Exp": _abi.UnaryKind.EXP,
    "Log": _abi.UnaryKind.LOG,
    "Sqrt": _abi.UnaryKind.SQRT,
    "Abs": _abi.UnaryKind.ABS,
    "Neg": _abi.UnaryKind.NEG,
    "Erf": _abi.UnaryKind.ERF,
    "Reciprocal": _abi.UnaryKind.RECIPROCAL,
}
_INT_UNARY = frozenset({"Relu", "Abs", "Neg"})
#: Ops the NPU provider runs as zero-copy views of a contiguous buffer.
VIEW_OPS: Final = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity"})
_REDUCE_OPS = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"})
# Inputs that only carry static parameters (must be constants; not device tensors).
#: The most row copies one Gather may take on the NPU.
MAX_GATHER_COPIES: Final = 256
#: The most mirrored rows one reflect Pad copies, and device ops one Resize takes, on the NPU.
MAX_RESAMPLE_COPIES: Final = MAX_COPIES

#: Elementwise ops the NPU runs as a few ELTWISE/UNARY ops with scalar constants.
COMPOSED_OPS: Final = frozenset({"Clip", "LeakyRelu", "PRelu", "HardSigmoid", "HardSwish"})

_PARAM_INPUTS: Final = {
    "Slice": (1, 2, 3, 4),
    "Gather": (1,),
    "Split": (1,),
    "Clip": (1, 2),
    "PRelu": (1,),
    "ReduceL2": (1,),
    "ReduceLogSumExp": (1,),
    "Reshape": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
    "QuantizeLinear": (1, 2),
    "DequantizeLinear": (1, 2),
    "QLinearConv": (1, 2, 4, 5, 6, 7),
    "QLinearMatMul": (1, 2, 4, 5, 6, 7),
    "QGemm": (1, 2, 4, 5, 7, 8),
    "MatMulInteger": (2, 3),
    "ConvInteger": (2, 3),
    "Pad": (1, 2, 3),
    "Resize": (1, 2, 3),
}
#: The integer ops (Cap.QUANT): int8 operands, exact int32 sums, REQUANT.
QUANT_OPS: Final = frozenset(
    {"QLinearConv", "QLinearMatMul", "QGemm", "MatMulInteger", "ConvInteger"}
)
# Capability each op needs.
_OPCODE: Final = {
    **dict.fromkeys(ELTWISE_OPS, _abi.Opcode.ELTWISE),
    **dict.fromkeys(UNARY_OPS, _abi.Opcode.UNARY),
    "Cast": _abi.Opcode.CONVERT,
    "Transpose": _abi.Opcode.CONVERT,
    "Conv": _abi.Opcode.CONV2D,
    "MaxPool": _abi.Opcode.POOL2D,
    "AveragePool": _abi.Opcode.POOL2D,
    "GlobalAveragePool": _abi.Opcode.POOL2D,
    "GlobalMaxPool": _abi.Opcode.POOL2D,
    "Gemm": _abi.Opcode.LINEAR,
    "MatMul": _abi.Opcode.MATMUL,
    "Softmax": _abi.Opcode.SOFTMAX,
    "LogSoftmax": _abi.Opcode.SOFTMAX,
    "LayerNormalization": _abi.Opcode.LAYERNORM,
    **dict.fromkeys(_REDUCE_OPS, _abi.Opcode.REDUCE),
    "Sum": _abi.Opcode.ELTWISE,
    "Concat": _abi.Opcode.CONVERT,
    "LRN": _abi.Opcode.POOL2D,
    "Slice": _abi.Opcode.CONVERT,
    "Gather": _abi.Opcode.CONVERT,
    "Split": _abi.Opcode.CONVERT,
    "Mean": _abi.Opcode.ELTWISE,
    **dict.fromkeys(COMPOSED_OPS, _abi.Opcode.ELTWISE),
    "ReduceL2": _abi.Opcode.REDUCE,
    "ReduceLogSumExp": _abi.Opcode.REDUCE,
    "QuantizeLinear": _abi.Opcode.ELTWISE,
    "DequantizeLinear": _abi.Opcode.CONVERT,
    "QLinearConv": _abi.Opcode.CONV2D,
    "QLinearMatMul": _abi.Opcode.MATMUL,
    "QGemm": _abi.Opcode.LINEAR,
    "MatMulInteger": _abi.Opcode.MATMUL,
    "ConvInteger": _abi.Opcode.CONV2D,
    "Where": _abi.Opcode.SELECT,
    "Pad": _abi.Opcode.CONVERT,
    "Resize": _abi.Opcode.CONVERT,
}

#: Variadic ops the NPU runs as a chain of binary ELTWISE ops.
VARIADIC_OPS: Final = {
    "Sum": _abi.EltwiseKind.ADD,
    "Mean": _abi.EltwiseKind.ADD,
    "Max": _abi.EltwiseKind.MAX,
    "Min": _abi.EltwiseKind.MIN,
}


@dataclass(frozen=True)
class Partition:
    """A run of nodes one provider executes: ``provider`` is ``"NPU"`` or ``"CPU"``."""

    provider: str
    nodes: tuple[str, ...]


def slice_spec(node: Node, graph: Graph, shape: Sequence[int]) -> list[tuple[int, int, int]] | None:
    """Per axis ``(start, length, step)`` of a Slice with constant, positive steps; else None."""
    starts: list[int] | None
    ends: list[int] | None
    axes: list[int] | None
    steps: list[int] | None
    if graph.opset >= 10:
        vals: list[list[int] | None] = []
        for i in (1, 2, 3, 4):
            name = node.input(i)
            if not name:
                vals.append(None)
                continue
            c = graph.const(name)
            if c is None:
                return None
            vals.append([int(v) for v in np.asarray(c).reshape(-1)])
        starts, ends, axes, steps = vals
    else:
        a = node.attrs
        starts, ends, axes, steps = a.get("starts"), a.get("ends"), a.get("axes"), None
    if starts is None or ends is None:
        return None
    r = len(shape)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    spec = [(0, int(d), 1) for d in shape]
    for ax, st, en, sp in zip(axes, starts, ends, steps, strict=True):
        if sp <= 0:
            return None
        ax = ax + r if ax < 0 else ax
        if not 0 <= ax < r:
            return None
        lo, hi, step = slice(st, en, sp).indices(int(shape[ax]))
        spec[ax] = (lo, len(range(lo, hi, step)), step)
    return spec


def split_sizes(node: Node, graph: Graph, shape: Sequence[int]) -> list[int] | None:
    """The sizes a Split cuts its axis into (constant), or None."""
    r = len(shape)
    axis = int(node.attrs.get("axis", 0))
    axis = axis + r if axis < 0 else axis
    n = len(node.outputs)
    split: Any = node.attrs.get("split")
    if node.input(1):
        c = graph.const(node.input(1))
        if c is None:
            return None
        split = [int(v) for v in np.asarray(c).reshape(-1)]
    dim = int(shape[axis])
    if split is None:
        k = int(node.attrs.get("num_outputs", n))
        chunk = -(-dim // k)
        split = [min(chunk, dim - chunk * i) for i in range(k)]
    sizes = [int(v) for v in split]
    if len(sizes) != n or sum(sizes) != dim or min(sizes) < 0:
        return None
    return sizes


def transpose_runs(shape: Sequence[int], perm: Sequence[int]) -> tuple[list[int], list[int]]:
    """A transpose with the axes that stay adjacent merged: (shape, perm) of lower rank.

    ShuffleNet's ``[N, g, C/g, H, W]`` with perm ``(0, 2, 1, 3, 4)`` becomes
    ``[N, g, C/g, H*W]`` with ``(0, 2, 1, 3)``: the same element order.
    """
    runs: list[list[int]] = []
    for p in perm:
        if runs and runs[-1][-1] + 1 == p:
            runs[-1].append(p)
        else:
            runs.append([p])
    order = sorted(range(len(runs)), key=lambda k: runs[k][0])
    merged = [math.prod(shape[a] for a in runs[k]) for k in order]
    new_perm = [order.index(k) for k in range(len(runs))]
    return merged, new_perm


def _probe_shape(graph: Graph, name: str) -> tuple[int, ...] | None:
    """The shape with each dynamic dim (a batch) taken as 1; None if the rank is unknown.

    Slice, Split and Transpose are decided on it: their constants and the
    merged rank of a transpose do not depend on a dynamic dim, and the plan,
    made with the run's real shapes, refuses (``ModelError``: the partition
    runs on the CPU for those shapes) what a real shape turns out to break.
    """
    shape = graph.tensor_info(name).shape
    if shape is None:
        return None
    return tuple(d if isinstance(d, int) else 1 for d in shape)


def _tensor_reason(
    graph: Graph, name: str, what: str, views: bool = False, bools: bool = False
) -> str | None:
    info = graph.tensor_info(name)
    if info.dtype is None:
        return f"{what} {name!r} has an unknown element type"
    if info.dtype not in NPU_DTYPES or (info.dtype == np.bool_ and not bools):
        return f"{what} {name!r} is {info.dtype}, the NPU has float32/float16/int32/int8"
    if info.rank is None:
        return f"{what} {name!r} has an unknown rank"
    if info.rank > _abi.NPU_MAX_RANK and not views:
        return f"{what} {name!r} has rank {info.rank} > {_abi.NPU_MAX_RANK}"
    if info.shape is not None and 0 in info.shape:
        return f"{what} {name!r} is empty"
    return None


@dataclass(frozen=True)
class PoolGeometry:
    """A 2-D MaxPool/AveragePool's window as POOL2D takes it (``pads`` as ONNX's)."""

    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]  # top, left, bottom, right
    dilations: tuple[int, int]
    ceil_mode: bool
    count_include_pad: bool

    @property
    def needs_geometry(self) -> bool:
        """Whether POOL2D needs ``NPU_POOL_F_GEOMETRY`` (``Cap.POOL_GEOMETRY``)."""
        p = self.pads
        return p[:2] != p[2:] or self.dilations != (1, 1) or self.ceil_mode


def pool_geometry(node: Node, spatial: Sequence[int]) -> PoolGeometry:
    """The window of a 2-D MaxPool/AveragePool over a ``spatial`` (H, W) input.

    Raises:
        ValueError: ``kernel_shape`` is not 2-D.
    """
    a = node.attrs
    kernel = tuple(int(k) for k in a.get("kernel_shape", []))
    if len(kernel) != 2:
        raise ValueError(f"kernel_shape {list(kernel)} is not 2-D")
    strides = tuple(int(s) for s in a.get("strides", [1, 1]))
    dil = tuple(int(d) for d in a.get("dilations", [1, 1]))
    pads = conv_pads(a, spatial, kernel, strides, dil)
    return PoolGeometry(
        (kernel[0], kernel[1]),
        (strides[0], strides[1]),
        (pads[0], pads[1], pads[2], pads[3]),
        (dil[0], dil[1]),
        bool(a.get("ceil_mode", 0)),
        bool(a.get("count_include_pad", 0)),
    )


def _pool_reason(node: Node, graph: Graph, caps: int) -> str | None:
    """None if POOL2D can run this MaxPool/AveragePool, else the reason."""
    a = node.attrs
    if a.get("storage_order", 0) or len([o for o in node.outputs if o]) != 1:
        return "MaxPool with an Indices output or storage_order"
    spatial = (graph.tensor_info(node.inputs[0]).shape or ())[2:]
    if a.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        if not all(isinstance(d, int) for d in spatial):
            return "auto_pad SAME with dynamic spatial dims"
    else:
        spatial = (0, 0)  # the explicit pads do not depend on the input's size
    try:
        geo = pool_geometry(node, [int(d) for d in spatial if d is not None])
    except ValueError as exc:
        return str(exc)
    if geo.ceil_mode and a.get("auto_pad", "NOTSET") != "NOTSET":
        return "ceil_mode with auto_pad"
    spans = [d * (k - 1) + 1 for k, d in zip(geo.kernel, geo.dilations, strict=True)]
    if any(p >= spans[i % 2] for i, p in enumerate(geo.pads)):
        return f"pads {list(geo.pads)} not below the window span {spans}"
    if geo.needs_geometry and not caps & _abi.Cap.POOL_GEOMETRY:
        return "uneven pads, dilations or ceil_mode without Cap.POOL_GEOMETRY"
    return None


def _symmetric_pads(node: Node, graph: Graph, kernel: Sequence[int]) -> str | None:
    """None if the node's 2-D padding is symmetric (and static), else the reason."""
    a = node.attrs
    strides = [int(s) for s in a.get("strides", [1, 1])]
    dil = [int(d) for d in a.get("dilations", [1, 1])]
    shape = graph.tensor_info(node.inputs[0]).shape or ()
    spatial = shape[2:]
    if a.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        if not all(isinstance(d, int) for d in spatial):
            return "auto_pad SAME with dynamic spatial dims"
        pads = conv_pads(a, [int(d) for d in spatial if d is not None], kernel, strides, dil)
    else:
        pads = conv_pads(a, [0, 0], kernel, strides, dil)
    if pads[0] != pads[2] or pads[1] != pads[3]:
        return f"asymmetric pads {pads}"
    if max(pads) > _abi.NPU_MAX_PAD:
        return f"pads {pads} exceed NPU_MAX_PAD"
    return None


def _per_axis(graph: Graph, node: Node, i: int, channels: int | None) -> Any:
    """Constant input ``i`` as a flat array if it has 1 or ``channels`` elements, else None."""
    v = graph.const(node.input(i)) if node.input(i) else None
    if v is None or v.ndim > 1 or v.size not in (1, channels):
        return None
    return v.reshape(-1)


def _scales_ok(*scales: Any) -> bool:
    return all(
        s is not None and s.dtype == np.float32 and bool(np.all(np.isfinite(s) & (s > 0)))
        for s in scales
    )


def _qdq_reason(node: Node, graph: Graph) -> str | None:
    """QuantizeLinear (float32 -> int8) and DequantizeLinear (int8/int32 -> float32)."""
    a = node.attrs
    if a.get("block_size", 0):
        return "blocked quantisation"
    x = graph.tensor_info(node.inputs[0])
    rank = x.rank or 0
    axis = int(a.get("axis", 1))
    axis = axis + rank if axis < 0 else axis
    dim = x.shape[axis] if x.shape is not None and 0 <= axis < rank else None
    channels = dim if isinstance(dim, int) else None
    scale = _per_axis(graph, node, 1, channels)
    if node.op_type == "QuantizeLinear":
        if x.dtype != np.float32:
            return f"QuantizeLinear of {x.dtype} (float32 only)"
        out = graph.tensor_info(node.outputs[0]).dtype
        if out != np.int8:
            return f"QuantizeLinear to {out} (int8 only)"
        if not _scales_ok(scale):
            return "QuantizeLinear scale not finite float32 > 0, one or one per channel"
    elif scale is None or scale.dtype != np.float32 or not np.all(np.isfinite(scale)):
        return "DequantizeLinear scale not finite float32, one or one per channel"
    if node.input(2) and _per_axis(graph, node, 2, channels) is None:
        return "zero point not one value or one per channel"
    return None


def _zero(graph: Graph, node: Node, i: int) -> bool:
    v = graph.const(node.input(i)) if node.input(i) else None
    return not node.input(i) or (v is not None and not np.any(v))


def _scalar_zp(graph: Graph, node: Node, i: int) -> bool:
    v = graph.const(node.input(i)) if node.input(i) else None
    return not node.input(i) or (v is not None and v.size == 1)


def _quant_reason(node: Node, graph: Graph, caps: int) -> str | None:
    """The integer ops: int8 inputs, symmetric int8 weights, scalar activation zero points."""
    if not caps & _abi.Cap.QUANT:
        return "the device lacks Cap.QUANT (int8 ops)"
    op = node.op_type
    x = graph.tensor_info(node.inputs[0])
    w_in = 3 if op.startswith("Q") else 1
    w = graph.tensor_info(node.input(w_in))
    if x.dtype != np.int8 or w.dtype != np.int8:
        return f"{op} of {x.dtype} x {w.dtype} (the NPU takes int8 x int8)"
    if not _zero(graph, node, w_in + 2 if op.startswith("Q") else 3):
        return "a weight zero point other than 0 (the NPU's weights are symmetric)"
    if not _scalar_zp(graph, node, 2):
        return "a per-channel input zero point"
    wshape = w.static_shape
    conv = op in ("QLinearConv", "ConvInteger")
    if conv:
        if (
            x.rank != 4
            or wshape is None
            or len(wshape) != 4
            or graph.const(node.input(w_in)) is None
        ):
            return f"{op} other than 2-D with a constant 4-D weight"
        channels = wshape[0]
    elif op == "QGemm":
        a = node.attrs
        if a.get("transA", 0) or x.rank != 2 or wshape is None or len(wshape) != 2:
            return "QGemm with transA or operands not 2-D"
        channels = wshape[0] if a.get("transB", 0) else wshape[1]
        if not node.input(7):
            return "QGemm with a float output (no y_scale)"
    else:
        if wshape is None or len(wshape) < 2 or (x.rank or 0) < 2:
            return f"{op} of operands below rank 2 or a dynamic weight shape"
        channels = wshape[-1]
    if op in ("QLinearConv", "QLinearMatMul", "QGemm"):
        out_scale = 7 if op == "QGemm" else 6
        if not _scalar_zp(graph, node, out_scale + 1):
            return "a per-channel output zero point"
        sx, sy = _per_axis(graph, node, 1, 1), _per_axis(graph, node, out_scale, 1)
        sw = _per_axis(graph, node, 4, channels)
        if not _scales_ok(sx, sw, sy):
            return "scales not finite float32 > 0 (input and output per tensor)"
        alpha = float(node.attrs.get("alpha", 1.0))
        rq = (sx.astype(np.float64) * alpha * sw / sy.astype(np.float64)).astype(np.float32)
        if not _scales_ok(rq):
            return "the requantisation scale is not a finite float32 > 0"
        b_in = {"QLinearConv": 8, "QGemm": 6}.get(op)
        if b_in is not None and node.input(b_in):
            bias = graph.const(node.input(b_in))
            if bias is None or bias.dtype != np.int32 or bias.size != channels:
                return "bias not a constant int32 per output channel"
    if conv:
        assert wshape is not None
        return _symmetric_pads(node, graph, wshape[2:])
    return None


def _resample_reason(node: Node, graph: Graph, caps: int) -> str | None:
    """Pad and Resize: strided copies (Cap.STRIDED_OUT), at most MAX_RESAMPLE_COPIES ops."""
    shape = graph.tensor_info(node.inputs[0]).static_shape
    if shape is None:
        return f"{node.op_type} of a dynamic shape"
    if graph.tensor_info(node.inputs[0]).dtype == np.bool_:
        return f"{node.op_type} of bool"
    if node.op_type == "Pad":
        spec = pad_spec(node, graph, shape)
        if isinstance(spec, str):
            return spec
        if not caps & _abi.Cap.STRIDED_OUT:
            return "the device lacks Cap.STRIDED_OUT (Pad writes strided views)"
        if spec.mode == "reflect" and sum(spec.begin) + sum(spec.end) > MAX_RESAMPLE_COPIES:
            return f"reflect Pad of more than {MAX_RESAMPLE_COPIES} mirrored rows"
        return None
    maps = resize_maps(node, graph, shape)
    if isinstance(maps, str):
        return maps
    if resize_dims(maps) is not None:
        return None
    if any(any(m.w1) for m in maps) and graph.tensor_info(node.inputs[0]).dtype not in _FLOATS:
        return "linear Resize of integers"
    if not caps & _abi.Cap.STRIDED_OUT:
        return "the device lacks Cap.STRIDED_OUT (this Resize writes strided views)"
    count = sum(1 if p.w1 == 0.0 else 4 for m in maps if not m.identity for p in linear_pieces(m))
    if count > MAX_RESAMPLE_COPIES:
        return f"Resize of {count} device ops (at most {MAX_RESAMPLE_COPIES})"
    return None


def _op_reason(node: Node, graph: Graph, caps: int) -> str | None:
    """Op-specific rules (dtypes/ranks of device tensors already checked)."""
    op = node.op_type
    if op in QUANT_OPS:
        return _quant_reason(node, graph, caps)
    if op in ("QuantizeLinear", "DequantizeLinear"):
        return _qdq_reason(node, graph)
    a = node.attrs
    dts = [graph.tensor_info(i).dtype for i in node.inputs[:1] if i]
    dt = dts[0] if dts else None
    floaty = dt in _FLOATS
    if op in VARIADIC_OPS and op != "Mean":
        ins = [i for i in node.inputs if i]
        if any(graph.tensor_info(i).dtype != dt for i in ins):
            return f"{op} of mixed dtypes"
        if op == "Sum" or len(ins) != 2:
            return None
    if op in ELTWISE_OPS:
        if len([i for i in node.inputs if i]) != 2:
            return f"{op} with {len(node.inputs)} inputs (the NPU takes 2)"
        if op == "Div" and not floaty:
            return "integer Div (the NPU divides floats only)"
        return None
    if op in UNARY_OPS:
        if not floaty and op not in _INT_UNARY:
            return f"{op} of {dt} (float only on the NPU)"
        if op == "Gelu" and a.get("approximate", "none") != "none":
            return "tanh-approximate Gelu (the NPU's GELU is the erf form)"
        return None
    if op == "Transpose":
        shape = _probe_shape(graph, node.inputs[0])
        if shape is None:
            return "Transpose of an unknown rank"
        perm = a.get("perm", list(range(len(shape) - 1, -1, -1)))
        merged, _ = transpose_runs(shape, [int(p) for p in perm])
        if len(merged) > _abi.NPU_MAX_RANK:
            return f"Transpose of rank {len(merged)} after merging adjacent axes"
        return None
    if op in ("Slice", "Split"):
        shape = _probe_shape(graph, node.inputs[0])
        if shape is None:
            return f"{op} of an unknown rank"
        if op == "Slice":
            spec = slice_spec(node, graph, shape)
            if spec is None:
                return "Slice with non-constant or negative steps"
        elif split_sizes(node, graph, shape) is None:
            return "Split with non-constant sizes"
        return None
    if op == "Gather":
        shape = graph.tensor_info(node.inputs[0]).static_shape
        idx = graph.const(node.input(1))
        if shape is None or idx is None:
            return "Gather with non-constant indices or a dynamic shape"
        r = len(shape)
        axis = int(a.get("axis", 0))
        axis = axis + r if axis < 0 else axis
        flat = np.asarray(idx).reshape(-1)
        if flat.size == 0 or (flat < -shape[axis]).any() or (flat >= shape[axis]).any():
            return "Gather indices out of range"
        if math.prod(shape[:axis]) * flat.size > MAX_GATHER_COPIES:
            return f"Gather of more than {MAX_GATHER_COPIES} rows"
        return None
    if op == "Mean":
        ins = [i for i in node.inputs if i]
        if not floaty or any(graph.tensor_info(i).dtype != dt for i in ins):
            return "Mean of other than one float dtype"
        return None
    if op in COMPOSED_OPS:
        if op == "Clip":
            if graph.opset >= 11 and any(
                node.input(i) and graph.const(node.input(i)) is None for i in (1, 2)
            ):
                return "Clip with non-constant bounds"
            if dt is not None and dt.kind not in "fi":
                return f"Clip of {dt}"
            return None
        if not floaty:
            return f"{op} of {dt} (float only)"
        if op == "LeakyRelu" and float(a.get("alpha", 0.01)) < 0:
            return "LeakyRelu with a negative slope"
        if op == "PRelu":
            slope = graph.const(node.input(1))
            xs = graph.tensor_info(node.inputs[0]).static_shape
            if slope is None or xs is None:
                return "PRelu with a non-constant slope or a dynamic shape"
            try:
                if np.broadcast_shapes(slope.shape, xs) != tuple(xs):
                    return "PRelu slope that does not broadcast to the input"
            except ValueError:
                return "PRelu slope that does not broadcast to the input"
        return None
    if op in ("ReduceL2", "ReduceLogSumExp"):
        if not floaty:
            return f"{op} of {dt} (float only)"
        if len(node.inputs) > 1 and node.input(1) and graph.const(node.input(1)) is None:
            return "non-constant axes"
        return None
    if op == "LRN":
        size = int(a.get("size", 0))
        if graph.tensor_info(node.inputs[0]).rank != 4 or dt != np.dtype(np.float32):
            return "LRN of other than a 4-D float32 tensor"
        if size % 2 == 0 or (size - 1) // 2 > _abi.NPU_MAX_PAD:
            return f"LRN size {size} (the NPU's channel window is odd and centred)"
        return None
    if op == "Concat":
        ins = [i for i in node.inputs if i]
        if any(graph.tensor_info(i).dtype != dt for i in ins):
            return "Concat of mixed dtypes"
        return None
    if op == "Cast" or op in VIEW_OPS:
        return None
    if op == "Where":
        if graph.tensor_info(node.inputs[1]).dtype != graph.tensor_info(node.inputs[2]).dtype:
            return "Where of mixed dtypes"
        return None
    if op in ("Pad", "Resize"):
        return _resample_reason(node, graph, caps)
    if op in ("Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"):
        if graph.tensor_info(node.inputs[0]).rank != 4:
            return f"{op} on a rank-{graph.tensor_info(node.inputs[0]).rank} input (NPU: 2-D)"
        if not floaty:
            return f"{op} of {dt} (float only)"
        if op.startswith("Global"):
            return None
        if op == "Conv":
            w = graph.tensor_info(node.input(1)).static_shape
            if w is None or len(w) != 4:
                return "the weight shape is not static 4-D"
            return _symmetric_pads(node, graph, w[2:])
        return _pool_reason(node, graph, caps)
    if op in ("Gemm", "MatMul"):
        if not floaty:
            return f"{op} of {dt} (float only)"
        if op == "Gemm":
            if float(a.get("alpha", 1.0)) != 1.0 or float(a.get("beta", 1.0)) != 1.0:
                return "Gemm alpha/beta != 1 with non-constant operands"
            if node.input(2) and (graph.tensor_info(node.input(2)).rank or 0) > 2:
                return "Gemm C of rank > 2"
        return None
    if op in ("Softmax", "LogSoftmax"):
        return None if floaty else f"{op} of {dt} (float only)"
    if op == "LayerNormalization":
        if not floaty:
            return f"{op} of {dt} (float only)"
        if len([o for o in node.outputs if o]) != 1:
            return "LayerNormalization with Mean/InvStdDev outputs"
        if graph.const(node.input(1)) is None or (
            node.input(2) and graph.const(node.input(2)) is None
        ):
            return "non-constant scale or bias"
        return None
    if op in _REDUCE_OPS:
        if len(node.inputs) > 1 and node.input(1) and graph.const(node.input(1)) is None:
            return "non-constant axes"
        if op == "ReduceMean" and not floaty:
            return "integer ReduceMean"
        return None
    return f"no NPU kernel for {op}"


def npu_reason(node: Node, graph: Graph, caps: int) -> str | None:
    """``None`` if the NPU provider can run ``node`` on a device with ``caps``, else why not."""
    if node.domain not in ("", "ai.onnx") and (node.domain, node.op_type) != (MS_DOMAIN, "QGemm"):
        return f"custom domain {node.domain!r}"
    if graph.opset < NPU_MIN_OPSET:
        return f"ai.onnx opset {graph.opset}: the NPU provider starts at opset {NPU_MIN_OPSET}"
    op = node.op_type
    if op not in _OPCODE and op not in VIEW_OPS:
        return f"no NPU kernel for {op}"
    opcode = _OPCODE.get(op)
    if opcode is not None and not tensor_op_supported(opcode, caps):
        return f"the device lacks the capability for {opcode.name}"
    params = _PARAM_INPUTS.get(op, ())
    # Views move no data, so their tensors may have any rank; a Transpose
    # needs rank <= 4 once the axes that stay together are merged.
    views = op in VIEW_OPS or op == "Transpose"
    # BOOL tensors: the comparisons' operands and results, and CONVERT's.
    bools = op in COMPARE_OPS or op in VIEW_OPS or op in ("Cast", "Where")
    if op == "Reshape" and graph.opset >= 5 and graph.const(node.input(1)) is None:
        return "Reshape to a shape computed at run time"
    for i, name in enumerate(node.inputs):
        if not name:
            continue
        if i in params:
            if graph.const(name) is None:
                return f"parameter input {name!r} is not a constant"
            continue
        reason = _tensor_reason(graph, name, "input", views, bools)
        if reason:
            return reason
    for name in node.outputs:
        if name:
            reason = _tensor_reason(graph, name, "output", views, bools)
            if reason:
                return reason
    return _op_reason(node, graph, caps)


def partition(graph: Graph, on_npu: dict[str, bool]) -> list[Partition]:
    """Group ``graph``'s nodes into maximal runs per provider, in a topological order.

    ``on_npu`` maps node names to whether the NPU runs them. Among the ready
    nodes the current provider's are always taken first; the graph's own
    order breaks ties, so a graph that needs no reordering keeps its order.
    """
    producers = graph.producers()
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    deps: dict[int, set[int]] = {}
    users: dict[int, list[int]] = {i: [] for i in range(len(graph.nodes))}
    for i, node in enumerate(graph.nodes):
        d = {index[id(producers[x])] for x in node.inputs if x in producers}
        d.discard(i)
        deps[i] = d
        for j in d:
            users[j].append(i)
    ready = sorted(i for i, d in deps.items() if not d)
    parts: list[Partition] = []
    current: list[str] = []
    provider = ""
    remaining = {i: len(d) for i, d in deps.items()}
    while ready:
        want = provider or ("NPU" if on_npu[graph.nodes[ready[0]].name] else "CPU")
        pick = next(
            (i for i in ready if ("NPU" if on_npu[graph.nodes[i].name] else "CPU") == want), None
        )
        if pick is None:
            parts.append(Partition(provider, tuple(current)))
            current, provider = [], ""
            continue
        provider = want
        ready.remove(pick)
        current.append(graph.nodes[pick].name)
        for u in users[pick]:
            remaining[u] -= 1
            if remaining[u] == 0:
                ready.append(u)
        ready.sort()
    if current:
        parts.append(Partition(provider, tuple(current)))
    return parts
