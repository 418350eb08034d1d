"""Graph rewrites run once when a session is created.

Each rewrite keeps the graph's meaning, keeps the names of the tensors it
does not remove, and returns how many times it applied:

- :func:`constants_to_initializers`: ``Constant`` nodes become initializers;
- :func:`~npu.inference.quant.signed_activations`: uint8 quantised tensors
  (and uint8 constants under a DequantizeLinear) become the equivalent int8
  ones, 128 lower with zero points 128 lower;
- :func:`~npu.inference.quant.fuse_qdq`: ``DequantizeLinear -> Conv/MatMul/Gemm
  [-> Relu] -> QuantizeLinear`` islands of int8 models into ``QLinearConv``,
  ``QLinearMatMul`` or ``com.microsoft.QGemm`` (before constants are folded,
  which would turn the int8 weights into float ones);
- :func:`fold_constants`: nodes whose inputs are all constants (and
  ``Shape`` of a tensor of static shape) are evaluated once with the CPU
  kernels, so e.g. a ``Shape``-derived ``Reshape`` target becomes a constant;
- :func:`drop_identities`: ``Identity`` and inference-mode ``Dropout``;
- :func:`fold_batchnorm`: ``BatchNormalization`` into the preceding 2-D
  ``Conv`` (weights and bias rescaled), else into a per-channel ``Mul`` +
  ``Add``;
- :func:`fold_gemm_scalars`: ``Gemm`` ``alpha``/``beta`` into constant B/C;
- :func:`fuse_bias`: ``MatMul`` + ``Add`` of a constant ``[N]`` bias (and
  ``Conv`` + ``Add`` of a ``[O, 1, 1]`` bias) into one node;
- :func:`fuse_erf_gelu`: ``x * 0.5 * (1 + erf(x / sqrt(2)))`` into ``Gelu``;
- :func:`fuse_residual` (only when asked: the NPU has
  ``Cap.CONV_ACCUMULATE``): ``Add(Conv(x), r)`` of one shape into the
  ``Conv`` with ``r`` as its residual input (CONV2D accumulating into its
  output), ResNet's skip connection;
- :func:`fuse_activation`: ``Relu``/``Gelu`` (and, when asked: the NPU has
  ``Cap.ACT_RELU6``, a ``Clip`` to [0, 6] after a ``Conv``) after ``Conv``, ``Gemm`` or
  ``MatMul`` into the node's fused activation (the NPU's CONV2D/LINEAR
  activation, applied after a residual), when the intermediate tensor has
  no other reader.

:func:`rewrite` runs them all in that order.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from .cpu import CPU_OPS, Array, ReferenceKernel, cpu_kernel, numpy_kernel_ok
from .graph import NPU_MIN_OPSET, Graph, Node, TensorInfo, clip_bounds
from .quant import fuse_qdq, signed_activations

__all__ = [
    "constants_to_initializers",
    "drop_identities",
    "fold_batchnorm",
    "fold_constants",
    "fold_gemm_scalars",
    "fuse_activation",
    "fuse_bias",
    "fuse_erf_gelu",
    "fuse_residual",
    "prune_initializers",
    "rewrite",
]

log = logging.getLogger(__name__)

# Never folded even with constant inputs (not deterministic or not worth it).
_NO_FOLD = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                      "Multinomial", "Bernoulli", "Dropout"})  # fmt: skip
# Shape-computation ops folded with onnx.reference when their inputs are constant.
_REF_FOLD = frozenset({"Gather", "Slice", "Range", "ConstantOfShape", "Expand", "Tile",
                       "ReduceProd", "Equal", "Where", "Floor", "Ceil", "Pad"})  # fmt: skip
# Largest constant a fold may create (elements).
_FOLD_LIMIT = 1 << 24


def _rename_input(graph: Graph, old: str, new: str) -> None:
    for node in graph.nodes:
        node.inputs = [new if i == old else i for i in node.inputs]


def _single_use(graph: Graph, name: str) -> Node | None:
    """The only reader of ``name`` if it has exactly one and is not a graph output."""
    if name in graph.outputs:
        return None
    users = graph.consumers().get(name, [])
    return users[0] if len(users) == 1 else None


def _absorb(node: Node, other: Node, removed: set[int]) -> None:
    """``node`` takes over ``other`` (which read its output): ``other``'s output,
    a place in ``node.fused``, and ``other`` goes into ``removed``."""
    node.outputs = [other.outputs[0]]
    node.fused.append(other.name)
    node.proto = None
    removed.add(id(other))


def constants_to_initializers(graph: Graph) -> int:
    """Turn ``Constant`` nodes into initializers."""
    count = 0
    keep = []
    for node in graph.nodes:
        value = _constant_value(node) if node.op_type == "Constant" and not node.domain else None
        if value is None:
            keep.append(node)
            continue
        graph.initializers[node.outputs[0]] = value
        count += 1
    graph.nodes = keep
    return count


def _constant_value(node: Node) -> Array | None:
    a = node.attrs
    if "value" in a:
        return np.asarray(a["value"])
    if "value_float" in a:
        return np.asarray(a["value_float"], dtype=np.float32)
    if "value_floats" in a:
        return np.asarray(a["value_floats"], dtype=np.float32)
    if "value_int" in a:
        return np.asarray(a["value_int"], dtype=np.int64)
    if "value_ints" in a:
        return np.asarray(a["value_ints"], dtype=np.int64)
    return None


def fold_constants(graph: Graph) -> int:
    """Evaluate nodes of constant inputs (and ``Shape`` of static shapes) once."""
    count = 0
    keep = []
    for node in graph.nodes:
        value: list[Array] | None = None
        if node.op_type == "Shape" and not node.domain:
            shape = graph.tensor_info(node.input(0)).static_shape
            if shape is not None:
                value = CPU_OPS["Shape"](node, [np.empty(shape, np.uint8)], graph.opset)
        elif (
            node.inputs
            and node.op_type not in _NO_FOLD
            and all(not i or i in graph.initializers for i in node.inputs)
            and numpy_kernel_ok(node, graph)
        ):
            xs: list[Array | None] = [graph.const(i) for i in node.inputs]
            value = cpu_kernel(node, graph)(node, xs, graph.opset)
            if any(v.size > _FOLD_LIMIT for v in value):
                value = None
        elif (
            node.inputs
            and node.proto is not None
            and node.op_type in _REF_FOLD
            and all(not i or i in graph.initializers for i in node.inputs)
        ):
            try:
                ref = ReferenceKernel(node, graph)
                value = ref(node, [graph.const(i) for i in node.inputs], graph.opset)
            except Exception as exc:  # leave it to run time
                log.debug("%s: not folding %s: %s", graph.source, node.describe(), exc)
                value = None
        if value is None:
            keep.append(node)
            continue
        for out, v in zip(node.outputs, value, strict=False):
            if out:
                want = graph.tensor_info(out).static_shape
                if want is not None and math.prod(want) == v.size:
                    v = v.reshape(want)  # onnx.reference may return [x] for a scalar
                graph.initializers[out] = np.asarray(v, order="C")  # keeps rank 0
        count += 1
    graph.nodes = keep
    return count


def drop_identities(graph: Graph) -> int:
    """Remove ``Identity`` and inference ``Dropout`` nodes (their readers read the input)."""
    count = 0
    producers = graph.producers()
    keep = []
    for node in graph.nodes:
        if node.domain or node.op_type not in ("Identity", "Dropout"):
            keep.append(node)
            continue
        if node.op_type == "Dropout" and (
            any(o and (o in graph.outputs or graph.consumers().get(o)) for o in node.outputs[1:])
            or (node.input(2) and not (graph.const(node.input(2)) is not None
                                       and not bool(graph.initializers[node.input(2)])))
        ):  # fmt: skip
            keep.append(node)
            continue
        src, dst = node.inputs[0], node.outputs[0]
        if dst in graph.outputs:
            prod = producers.get(src)
            # Let the producer write the graph output directly, if nobody else sees src.
            if prod is None or src in graph.outputs or len(graph.consumers()[src]) != 1:
                keep.append(node)
                continue
            prod.outputs = [dst if o == src else o for o in prod.outputs]
            graph.info[dst] = graph.info.get(dst, graph.tensor_info(src))
        else:
            _rename_input(graph, dst, src)
        count += 1
    graph.nodes = keep
    return count


def _bn_params(graph: Graph, node: Node) -> tuple[Array, Array] | None:
    """(scale, shift) per channel of an inference BatchNormalization with constant params."""
    if len([o for o in node.outputs if o]) != 1 or node.attrs.get("training_mode", 0):
        return None
    params = [graph.const(i) for i in node.inputs[1:5]]
    if len(params) != 4 or any(p is None for p in params):
        return None
    scale, bias, mean, var = (np.asarray(p, np.float64) for p in params if p is not None)
    eps = float(node.attrs.get("epsilon", 1e-5))
    s = scale / np.sqrt(var + eps)
    return s, bias - mean * s


def fold_batchnorm(graph: Graph) -> int:
    """Fold BatchNormalization into a preceding Conv, else into Mul + Add per channel."""
    count = 0
    producers = graph.producers()
    new_nodes: list[Node] = []
    removed: set[int] = set()
    for node in graph.nodes:
        if node.op_type != "BatchNormalization" or node.domain:
            continue
        params = _bn_params(graph, node)
        x = node.inputs[0]
        xinfo = graph.tensor_info(x)
        if params is None or xinfo.dtype is None or xinfo.rank is None or xinfo.rank < 2:
            continue
        s, t = params
        dt = xinfo.dtype
        conv = producers.get(x)
        w = graph.const(conv.input(1)) if conv is not None else None
        if (
            conv is not None
            and conv.op_type == "Conv"
            and not conv.act
            and w is not None
            and w.ndim == 4
            and _single_use(graph, x) is node
            and len(graph.consumers().get(conv.input(1), [])) == 1
        ):
            b = graph.const(conv.input(2))
            b64 = np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64)
            wname = f"{conv.name}_bnfold_W"
            bname = f"{conv.name}_bnfold_B"
            graph.initializers[wname] = (w * s.reshape(-1, 1, 1, 1)).astype(w.dtype)
            graph.initializers[bname] = (b64 * s + t).astype(w.dtype)
            conv.inputs = [conv.inputs[0], wname, bname]
            _absorb(conv, node, removed)
            count += 1
            continue
        shape = (-1,) + (1,) * (xinfo.rank - 2)
        sname, tname, mid = f"{node.name}_scale", f"{node.name}_shift", f"{node.name}_scaled"
        graph.initializers[sname] = s.astype(dt).reshape(shape)
        graph.initializers[tname] = t.astype(dt).reshape(shape)
        graph.info[mid] = TensorInfo(dt, xinfo.shape)
        mul = Node(f"{node.name}_mul", "Mul", [x, sname], [mid], fused=[node.name])
        add = Node(f"{node.name}_add", "Add", [mid, tname], [node.outputs[0]], fused=[node.name])
        new_nodes.append(mul)
        new_nodes.append(add)
        node.op_type = "_replaced"
        node.fused = [mul.name, add.name]
        count += 1
    out: list[Node] = []
    for node in graph.nodes:
        if id(node) in removed:
            continue
        if node.op_type == "_replaced":
            out.extend(n for n in new_nodes if n.name in node.fused)
            continue
        out.append(node)
    graph.nodes = out
    return count


def fold_gemm_scalars(graph: Graph) -> int:
    """Fold Gemm's ``alpha`` into a constant B and ``beta`` into a constant C."""
    count = 0
    for node in graph.nodes:
        if node.op_type != "Gemm" or node.domain:
            continue
        alpha = float(node.attrs.get("alpha", 1.0))
        beta = float(node.attrs.get("beta", 1.0))
        b, c = graph.const(node.input(1)), graph.const(node.input(2))
        changed = False
        if alpha != 1.0 and b is not None:
            name = f"{node.name}_alphaB"
            graph.initializers[name] = (b * alpha).astype(b.dtype)
            node.inputs[1] = name
            node.attrs["alpha"] = 1.0
            changed = True
        if beta != 1.0 and c is not None:
            name = f"{node.name}_betaC"
            graph.initializers[name] = (c * beta).astype(c.dtype)
            node.inputs[2] = name
            node.attrs["beta"] = 1.0
            changed = True
        if changed:
            node.proto = None
            count += 1
    return count


def fuse_bias(graph: Graph) -> int:
    """MatMul + Add(constant [N]) -> MatMul with a bias; Conv + Add([O,1,1]) -> Conv bias."""
    count = 0
    removed: set[int] = set()
    for node in graph.nodes:
        if node.domain or node.op_type not in ("MatMul", "Conv") or node.act:
            continue
        if node.op_type == "MatMul" and len(node.inputs) > 2:
            continue
        if node.op_type == "Conv" and node.input(2):
            continue
        out = node.outputs[0]
        add = _single_use(graph, out)
        if add is None or add.op_type != "Add" or add.domain:
            continue
        other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
        bias = graph.const(other)
        oinfo = graph.tensor_info(out)
        if bias is None or oinfo.rank is None or oinfo.dtype != bias.dtype:
            continue
        if node.op_type == "MatMul":
            n = graph.tensor_info(node.input(1)).shape
            if n is None or len(n) < 2 or not isinstance(n[-1], int) or oinfo.rank < 2:
                continue
            if bias.ndim > oinfo.rank or math.prod(bias.shape) != n[-1] or bias.shape[-1] != n[-1]:
                continue
            name = f"{node.name}_bias"
            graph.initializers[name] = np.ascontiguousarray(bias.reshape(-1))
            node.inputs = [*node.inputs[:2], name]
        else:
            w = graph.tensor_info(node.input(1)).static_shape
            if w is None or len(w) != 4 or oinfo.rank != 4:
                continue
            if (
                bias.ndim > 4
                or math.prod(bias.shape) != w[0]
                or (bias.ndim >= 3 and bias.shape[-3] != w[0])
            ):
                continue
            name = f"{node.name}_bias"
            graph.initializers[name] = np.ascontiguousarray(bias.reshape(-1))
            node.inputs = [*node.inputs[:2], name]
        _absorb(node, add, removed)
        count += 1
    graph.nodes = [n for n in graph.nodes if id(n) not in removed]
    return count


def _scalar(graph: Graph, name: str) -> float | None:
    c = graph.const(name)
    if c is None or c.size != 1 or not np.issubdtype(c.dtype, np.floating):
        return None
    return float(c.reshape(-1)[0])


def fuse_erf_gelu(graph: Graph) -> int:
    """``Div(x, sqrt2) -> Erf -> Add(1) -> Mul(x) -> Mul(0.5)`` (either order) into Gelu."""
    count = 0
    removed: set[int] = set()
    for div in graph.nodes:
        if div.op_type != "Div" or div.domain or id(div) in removed:
            continue
        x = div.inputs[0]
        d = _scalar(graph, div.input(1))
        if d is None or abs(d - math.sqrt(2.0)) > 1e-3:
            continue
        chain = [div]
        erf = _single_use(graph, div.outputs[0])
        if erf is None or erf.op_type != "Erf":
            continue
        chain.append(erf)
        add = _single_use(graph, erf.outputs[0])
        if add is None or add.op_type != "Add":
            continue
        one = add.inputs[1] if add.inputs[0] == erf.outputs[0] else add.inputs[0]
        if _scalar(graph, one) != 1.0:
            continue
        chain.append(add)
        m1 = _single_use(graph, add.outputs[0])
        if m1 is None or m1.op_type != "Mul":
            continue
        other = m1.inputs[1] if m1.inputs[0] == add.outputs[0] else m1.inputs[0]
        chain.append(m1)
        final = m1
        if other == x:  # (1 + erf) * x, then * 0.5
            m2 = _single_use(graph, m1.outputs[0])
            if m2 is None or m2.op_type != "Mul":
                continue
            half = m2.inputs[1] if m2.inputs[0] == m1.outputs[0] else m2.inputs[0]
            if _scalar(graph, half) != 0.5:
                continue
            chain.append(m2)
            final = m2
        else:  # (x * 0.5) * (1 + erf)
            pre = graph.producers().get(other)
            if pre is None or pre.op_type != "Mul" or x not in pre.inputs:
                continue
            half = pre.inputs[1] if pre.inputs[0] == x else pre.inputs[0]
            if _scalar(graph, half) != 0.5 or _single_use(graph, other) is not m1:
                continue
            chain.append(pre)
        gelu = Node(div.name, "Gelu", [x], [final.outputs[0]], {"approximate": "none"})
        gelu.fused = [n.name for n in chain[1:]]
        # Replace the first node of the chain (in graph order) with the Gelu.
        first = min(chain, key=graph.nodes.index)
        idx = graph.nodes.index(first)
        for n in chain:
            removed.add(id(n))
        graph.nodes.insert(idx, gelu)
        count += 1
    graph.nodes = [n for n in graph.nodes if id(n) not in removed]
    return count


def fuse_residual(graph: Graph) -> int:
    """``Add(Conv(x), r)`` becomes the Conv with residual input ``r``.

    The Conv (2-D, float, no activation yet) must be the Add's only reader's
    producer, ``r`` a computed tensor (not a constant) of the Add's own
    shape and dtype, made before the Conv. When both Add inputs are Conv
    outputs (a projection shortcut), the later Conv takes the other as its
    residual. The Conv moves to the Add's output; a Relu after it then
    fuses as usual, after the residual.
    """
    count = 0
    removed: set[int] = set()
    made_at: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for o in node.outputs:
            made_at[o] = i
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    for add in graph.nodes:
        if add.domain or add.op_type != "Add" or len(add.inputs) != 2:
            continue
        out = graph.tensor_info(add.outputs[0])
        if out.shape is None or out.dtype is None or out.dtype.kind != "f":
            continue
        best: tuple[int, Node, str] | None = None
        for k in (0, 1):
            a, r = add.inputs[k], add.inputs[1 - k]
            conv = graph.nodes[made_at[a]] if a in made_at else None
            if (
                conv is None
                or conv.domain
                or conv.op_type != "Conv"
                or conv.act
                or conv.residual
                or id(conv) in removed
                or _single_use(graph, a) is not add
                or graph.tensor_info(conv.input(0)).rank != 4
                or r == a
                or r in graph.initializers
                or (r not in made_at and r not in graph.inputs)
                or made_at.get(r, -1) >= position[id(conv)]
            ):
                continue
            info = [graph.tensor_info(t) for t in (a, r)]
            if any(t.shape != out.shape or t.dtype != out.dtype for t in info):
                continue
            if best is None or position[id(conv)] > best[0]:
                best = (position[id(conv)], conv, r)
        if best is None:
            continue
        _, conv, r = best
        conv.inputs = [conv.input(0), conv.input(1), conv.input(2), r]
        conv.residual = True
        _absorb(conv, add, removed)
        count += 1
    graph.nodes = [n for n in graph.nodes if id(n) not in removed]
    return count


def fuse_activation(graph: Graph, relu6: bool = False) -> int:
    """Relu/Gelu after Conv, Gemm or MatMul becomes the node's fused activation;
    with ``relu6`` (the NPU has ``Cap.ACT_RELU6``) also a ``Clip`` to constant
    [0, 6] after a Conv (MobileNet's ReLU6), as ``"Relu6"``."""
    count = 0
    removed: set[int] = set()
    for node in graph.nodes:
        if node.domain or node.op_type not in ("Conv", "Gemm", "MatMul") or node.act:
            continue
        if node.op_type == "Conv" and graph.tensor_info(node.input(0)).rank != 4:
            continue
        act = _single_use(graph, node.outputs[0])
        if act is None or act.domain or act.op_type not in ("Relu", "Gelu", "Clip"):
            continue
        if act.op_type == "Gelu" and act.attrs.get("approximate", "none") != "none":
            continue
        if act.op_type == "Clip" and (
            not relu6 or node.op_type != "Conv" or clip_bounds(graph, act) != (0.0, 6.0)
        ):
            continue
        node.act = "Relu6" if act.op_type == "Clip" else act.op_type
        _absorb(node, act, removed)
        count += 1
    graph.nodes = [n for n in graph.nodes if id(n) not in removed]
    return count


def prune_initializers(graph: Graph) -> int:
    """Drop initializers no node reads and no graph output names."""
    used = {i for n in graph.nodes for i in n.inputs} | set(graph.outputs)
    dead = [k for k in graph.initializers if k not in used]
    for k in dead:
        del graph.initializers[k]
    return len(dead)


def rewrite(graph: Graph, *, residual: bool = False, relu6: bool = False) -> dict[str, int]:
    """Run every rewrite in order; return how often each applied.

    :func:`fuse_residual` runs only with ``residual`` (the NPU can
    accumulate into a CONV2D output), and :func:`fuse_activation` fuses a
    ReLU6 ``Clip`` only with ``relu6`` (the NPU has the activation). A model below opset
    :data:`NPU_MIN_OPSET` is not rewritten: its nodes run with
    onnx.reference, which knows their old definitions.
    """
    done: dict[str, int] = {}
    if graph.opset < NPU_MIN_OPSET:
        return done
    passes: list[tuple[str, Any]] = [
        ("constants_to_initializers", constants_to_initializers),
        ("signed_activations", signed_activations),
        ("fuse_qdq", fuse_qdq),
        ("fold_constants", fold_constants),
        ("drop_identities", drop_identities),
        ("fold_batchnorm", fold_batchnorm),
        ("fold_gemm_scalars", fold_gemm_scalars),
        ("fuse_bias", fuse_bias),
        ("fuse_erf_gelu", fuse_erf_gelu),
        ("fuse_residual", fuse_residual if residual else lambda _: 0),
        ("fuse_activation", lambda g: fuse_activation(g, relu6)),
        ("prune_initializers", prune_initializers),
    ]
    for name, fn in passes:
        n = int(fn(graph))
        if n:
            done[name] = n
            log.debug("%s: rewrite %s applied %d time(s)", graph.source, name, n)
    return done
