"""Loading and checking an ONNX model (the runner's first stage).

:func:`load_model` accepts a path, the bytes of a model file or an
``onnx.ModelProto`` and returns a :class:`~npu.inference.graph.Graph`, after:

1. decoding the protobuf (a truncated or garbage file raises
   :class:`ModelError` naming the file and the decode error);
2. checking the ``ai.onnx`` opset is in ``MIN_OPSET..MAX_OPSET`` (a model
   that imports only other domains, ``ai.onnx.ml`` or
   ``ai.onnx.preview.training``, runs on the CPU with ``onnx.reference``);
3. checking every node input is a graph input, an initializer or the output
   of an earlier node (a missing initializer names the node and the input);
4. ``onnx.checker.check_model``;
5. ``onnx.shape_inference.infer_shapes`` in strict mode with data
   propagation (a shape mismatch names the node).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Final

import onnx
from onnx import helper, numpy_helper

from .graph import NPU_MIN_OPSET, Dim, Graph, ModelError, Node, TensorInfo, np_dtype

__all__ = ["MAX_OPSET", "MIN_OPSET", "NPU_MIN_OPSET", "ModelSource", "load_model"]

log = logging.getLogger(__name__)

#: Supported ``ai.onnx`` opset versions (inclusive). Models below
#: :data:`NPU_MIN_OPSET` load, but every node runs with ``onnx.reference``
#: (the numpy kernels and the NPU provider implement the op definitions of
#: opset 7 and later).
MIN_OPSET: Final = 1
MAX_OPSET: Final = 22

#: What :func:`load_model` (and :class:`npu.InferenceSession`) accept.
ModelSource = str | os.PathLike[str] | bytes | bytearray | memoryview | onnx.ModelProto

_DEFAULT_DOMAINS = ("", "ai.onnx")


def _decode(src: ModelSource) -> tuple[onnx.ModelProto, str]:
    """The ModelProto of ``src`` and a name for messages."""
    if isinstance(src, onnx.ModelProto):
        return src, src.graph.name or "<ModelProto>"
    if isinstance(src, bytes | bytearray | memoryview):
        data, name = bytes(src), "<bytes>"
    else:
        name = os.fspath(src)
        try:
            with open(name, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ModelError(f"{name}: cannot read the model file: {exc}") from exc
    if not data:
        raise ModelError(f"{name}: empty model file")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # google.protobuf DecodeError (protobuf ships no stubs)
        raise ModelError(
            f"{name}: not a valid ONNX model (protobuf decode error: {exc}); "
            f"is the file truncated or not an ONNX file?"
        ) from exc
    if not model.HasField("graph"):
        raise ModelError(f"{name}: the file decodes to a model without a graph (truncated?)")
    return model, name


def _check_opset(model: onnx.ModelProto, name: str) -> tuple[int, dict[str, int]]:
    opsets = {imp.domain: int(imp.version) for imp in model.opset_import}
    versions = [v for d, v in opsets.items() if d in _DEFAULT_DOMAINS]
    if not opsets:
        raise ModelError(f"{name}: the model imports no opset")
    opset = versions[0] if versions else 0
    if versions and not MIN_OPSET <= opset <= MAX_OPSET:
        raise ModelError(
            f"{name}: ai.onnx opset {opset} is not supported (supported: {MIN_OPSET}..{MAX_OPSET})"
        )
    return opset, opsets


def _outer_refs(graph: onnx.GraphProto) -> list[str]:
    """Names a subgraph reads from the scopes around it (in first-use order)."""
    local = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    local |= {t.values.name for t in graph.sparse_initializer}
    refs: list[str] = []
    for node in graph.node:
        for name in [*node.input, *_implicit(node)]:
            if name and name not in local and name not in refs:
                refs.append(name)
        local.update(node.output)
    return refs


def _implicit(node: onnx.NodeProto) -> list[str]:
    """The outer-scope names the subgraphs of ``node`` (If, Loop, Scan) read."""
    refs: list[str] = []
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for sub in graphs:
            refs.extend(r for r in _outer_refs(sub) if r not in refs)
    return refs


def _node_inputs(node: onnx.NodeProto) -> list[str]:
    """The node's inputs, then what its subgraphs read from the graph around them.

    The implicit inputs come last, so positional access to the real inputs
    is unchanged; the partitioner orders the node after their producers and
    the CPU kernel (onnx.reference) gets their values.
    """
    ins = list(node.input)
    return ins + [r for r in _implicit(node) if r not in ins]


def _node_names(model: onnx.ModelProto) -> list[str]:
    """Unique names for the nodes (``OpType_i`` for unnamed or repeated ones)."""
    seen: set[str] = set()
    names = []
    for i, node in enumerate(model.graph.node):
        nm = node.name or f"{node.op_type}_{i}"
        if nm in seen:
            nm = f"{nm}_{i}"
        seen.add(nm)
        names.append(nm)
    return names


def _check_structure(model: onnx.ModelProto, name: str, names: list[str]) -> None:
    """Every node input must be defined before it is used; outputs must be produced."""
    g = model.graph
    defined = {i.name for i in g.input} | {t.name for t in g.initializer}
    defined |= {t.values.name for t in g.sparse_initializer}
    for node, nm in zip(g.node, names, strict=True):
        for inp in node.input:
            if inp and inp not in defined:
                raise ModelError(
                    f"{name}: node {nm!r} ({node.op_type}): input {inp!r} is not a graph "
                    f"input, an initializer or an output of an earlier node "
                    f"(missing initializer?)"
                )
        for out in node.output:
            if out:
                defined.add(out)
    for out in g.output:
        if out.name not in defined:
            raise ModelError(f"{name}: graph output {out.name!r} is not produced by any node")


def _info(vi: onnx.ValueInfoProto) -> TensorInfo:
    t = vi.type
    if not t.HasField("tensor_type"):
        return TensorInfo(None, None)
    tt = t.tensor_type
    dtype = np_dtype(tt.elem_type) if tt.elem_type else None
    if not tt.HasField("shape"):
        return TensorInfo(dtype, None)
    dims: list[Dim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return TensorInfo(dtype, tuple(dims))


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        out[a.name] = value
    return out


def _check_conv_channels(graph: Graph) -> None:
    """ONNX shape inference does not match Conv's input channels with the weight's."""
    for node in graph.nodes:
        if node.op_type != "Conv" or node.domain not in _DEFAULT_DOMAINS:
            continue
        x = graph.tensor_info(node.input(0)).shape
        w = graph.tensor_info(node.input(1)).shape
        if x is None or w is None or len(x) < 2 or len(w) < 2:
            continue
        c, cg = x[1], w[1]
        groups = int(node.attrs.get("group", 1))
        if isinstance(c, int) and isinstance(cg, int) and c != cg * groups:
            raise ModelError(
                f"{graph.source}: {node.describe()}: input has {c} channels but the weight "
                f"{list(w)} with group={groups} expects {cg * groups}"
            )


def load_model(src: ModelSource) -> Graph:
    """Decode, check and shape-infer a model; return its :class:`Graph`.

    Raises:
        ModelError: the file cannot be read or decoded, its opset is not
            supported, a node reads an undefined tensor, the checker rejects
            it, or shape inference finds a mismatch (the message names the
            model and, where there is one, the node).
    """
    model, name = _decode(src)
    opset, opsets = _check_opset(model, name)
    names = _node_names(model)
    _check_structure(model, name, names)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ModelError(f"{name}: invalid model: {exc}") from exc
    try:
        inferred = onnx.shape_inference.infer_shapes(
            model, check_type=True, strict_mode=True, data_prop=True
        )
    except (onnx.shape_inference.InferenceError, RuntimeError) as exc:
        raise ModelError(f"{name}: shape inference failed: {exc}") from exc
    g = inferred.graph
    initializers = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    info: dict[str, TensorInfo] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        info[vi.name] = _info(vi)
    nodes = [
        Node(nm, n.op_type, _node_inputs(n), list(n.output), _attrs(n), n.domain, proto=n)
        for n, nm in zip(g.node, names, strict=True)
    ]
    inputs = [i.name for i in g.input if i.name not in initializers]
    graph = Graph(
        source=name,
        nodes=nodes,
        inputs=inputs,
        outputs=[o.name for o in g.output],
        initializers=initializers,
        info=info,
        opset=opset,
        opsets=opsets,
        ir_version=int(model.ir_version),
    )
    _check_conv_channels(graph)
    log.debug("%s: loaded %d nodes, opset %d", name, len(nodes), opset)
    return graph
