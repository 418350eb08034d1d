"""The model runner's graph representation and its error type.

The loader (:mod:`npu.inference.loader`) turns an ``onnx.ModelProto`` into a
:class:`Graph`: a list of :class:`Node` in topological order, the graph's
input and output names, the initializers as numpy arrays and what shape
inference knows about every tensor (:class:`TensorInfo`). The rewrites,
the partitioner and both providers work on this form, never on protobufs
(except the CPU provider's ``onnx.reference`` fallback, which keeps each
untouched node's original ``NodeProto``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import helper

__all__ = [
    "NPU_MIN_OPSET",
    "Dim",
    "Graph",
    "ModelError",
    "Node",
    "Shape",
    "TensorInfo",
    "elem_type",
    "np_dtype",
]

#: A dimension: an int when static, a name (``"N"``) or ``None`` when not.
Dim = int | str | None
#: A tensor shape as shape inference knows it.
Shape = tuple[Dim, ...]


class ModelError(ValueError):
    """A model file that cannot be loaded or run: malformed, invalid or unsupported.

    The message names the model and, where there is one, the node and the
    reason, e.g. ``"model.onnx: node 'conv1' (Conv): input 'W' is not ..."``.
    """


#: The oldest ``ai.onnx`` opset whose op definitions the numpy kernels and
#: the NPU provider implement; nodes of older models run with onnx.reference.
NPU_MIN_OPSET = 7


#: ONNX element types numpy has no dtype for: onnx.reference's custom
#: dtypes (the raw bits in a one-field structured dtype) stand in for them.
_CUSTOM_TYPES: dict[int, str] = {
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.FLOAT8E4M3FN: "float8e4m3fn",
    onnx.TensorProto.FLOAT8E4M3FNUZ: "float8e4m3fnuz",
    onnx.TensorProto.FLOAT8E5M2: "float8e5m2",
    onnx.TensorProto.FLOAT8E5M2FNUZ: "float8e5m2fnuz",
    onnx.TensorProto.INT4: "int4",
    onnx.TensorProto.UINT4: "uint4",
}


def np_dtype(elem_type: int) -> np.dtype[Any] | None:
    """The numpy dtype of an ONNX element type (onnx.reference's for bfloat16,
    float8 and int4), or None for one numpy cannot hold."""
    custom = _CUSTOM_TYPES.get(elem_type)
    if custom is not None:
        from onnx.reference import custom_element_types

        dt: np.dtype[Any] = np.dtype(getattr(custom_element_types, custom))
        return dt
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def elem_type(dtype: np.dtype[Any]) -> int:
    """The ONNX element type of a numpy dtype (onnx.reference's custom ones included)."""
    if dtype.fields is not None:
        for elem in _CUSTOM_TYPES:
            custom = np_dtype(elem)
            if custom is not None and custom.names == dtype.names:
                return elem
    return int(helper.np_dtype_to_tensor_dtype(dtype))


@dataclass
class TensorInfo:
    """What is statically known about a tensor: element type and shape.

    ``dtype`` is ``None`` when unknown; ``shape`` is ``None`` when even the
    rank is unknown.
    """

    dtype: np.dtype[Any] | None
    shape: Shape | None

    @property
    def rank(self) -> int | None:
        """The rank, or ``None`` when unknown."""
        return None if self.shape is None else len(self.shape)

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape if every dimension is a known int, else ``None``."""
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return tuple(int(d) for d in self.shape if d is not None)


@dataclass
class Node:
    """One operator of the graph.

    ``inputs`` and ``outputs`` are tensor names (``""`` for an omitted
    optional input). ``attrs`` are the ONNX attributes as Python values.
    ``act`` is a fused activation (``""``, ``"Relu"``, ``"Gelu"`` or
    ``"Relu6"``, a ``Clip`` to [0, 6]) added by the rewrites to Conv, Gemm
    and MatMul; ``residual`` (Conv only) says
    that ``inputs[3]`` is added to the result before the activation (a
    fused residual Add); ``fused`` names the nodes folded into this one.
    ``proto`` is the original node for the ``onnx.reference`` fallback;
    rewrites that change a node's meaning set it to ``None``.
    """

    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    act: str = ""
    residual: bool = False
    fused: list[str] = field(default_factory=list)
    proto: Any = None

    def input(self, i: int) -> str:
        """Input ``i``'s name, ``""`` when absent."""
        return self.inputs[i] if i < len(self.inputs) else ""

    def describe(self) -> str:
        """``"node 'name' (OpType)"``, as error messages and logs name nodes."""
        op = f"{self.domain}.{self.op_type}" if self.domain not in ("", "ai.onnx") else self.op_type
        return f"node {self.name!r} ({op})"


@dataclass
class Graph:
    """A loaded model: nodes in topological order and everything about its tensors.

    ``source`` names the model in messages (a path, ``"<bytes>"`` or the
    graph's name). ``opset`` is the ``ai.onnx`` opset version; ``opsets``
    maps every imported domain to its version.
    """

    source: str
    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    initializers: dict[str, npt.NDArray[Any]]
    info: dict[str, TensorInfo]
    opset: int
    opsets: dict[str, int] = field(default_factory=dict)
    ir_version: int = 8

    def consumers(self) -> dict[str, list[Node]]:
        """For each tensor name, the nodes that read it (in graph order)."""
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    users.setdefault(name, []).append(node)
        return users

    def producers(self) -> dict[str, Node]:
        """For each node output name, the node that writes it."""
        return {out: node for node in self.nodes for out in node.outputs if out}

    def tensor_info(self, name: str) -> TensorInfo:
        """Static info of ``name`` (initializers included); unknown -> empty info."""
        if name in self.initializers:
            arr = self.initializers[name]
            return TensorInfo(arr.dtype, tuple(arr.shape))
        return self.info.get(name, TensorInfo(None, None))

    def const(self, name: str) -> npt.NDArray[Any] | None:
        """The initializer ``name``, or ``None`` if it is not a constant."""
        return self.initializers.get(name) if name else None


def clip_bounds(graph: Graph, node: Node) -> tuple[float | None, float | None]:
    """A Clip node's (min, max), None where absent or not constant (attributes
    before opset 11, inputs after)."""
    if graph.opset < 11:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
        return (None if lo is None else float(lo), None if hi is None else float(hi))
    out: list[float | None] = []
    for i in (1, 2):
        c = graph.const(node.input(i)) if node.input(i) else None
        out.append(None if c is None else float(np.asarray(c).reshape(-1)[0]))
    return out[0], out[1]
