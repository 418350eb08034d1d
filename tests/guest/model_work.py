"""The device work one inference of a small ONNX model must cost, worked out
from the model file alone: a reference for the exact performance-counter
tests (test_profiler.py), independent of the runtime's plan.

A plain module, not a test file (pytest puts tests/guest on sys.path).

What an inference submits follows from the graph and two documents, not
from ``npu.inference``'s objects:

- docs/inference.md ("Rewrites", "Supported ops"): a ``Conv`` is one CONV2D,
  a ``Gemm`` whose C is a ``[N]`` (or ``[1, N]``) bias is one LINEAR, a
  ``MaxPool``/``AveragePool`` one POOL2D, ``Flatten``/``Reshape`` a view (no
  command), and a ``Relu`` that alone reads a Conv's or Gemm's output is
  fused into that command (no command of its own);
- docs/npu-spec.md 4.7: ``NPU_PERF_MACS`` of a CONV2D is
  N·O·OH·OW·(C/groups)·KH·KW, of a LINEAR M·N·K; ``READ_BYTES`` and
  ``WRITE_BYTES`` are the operand bytes the engine read and wrote.

Shapes come from onnx's own shape inference with the batch made concrete;
byte sizes from the tensors' ONNX element types. Only the ops above are
known: any other op raises, so a model this module cannot account for
exactly is refused rather than estimated.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, shape_inference

#: ONNX ops that run as no command at all (zero-copy views).
VIEWS = frozenset({"Flatten", "Reshape"})


@dataclass
class Work:
    """What one inference must cost the device.

    Attributes:
        commands: device commands by opcode name (``{"CONV2D": 3, ...}``).
        macs: multiply-adds (``NPU_PERF_MACS``).
        operand_read: bytes of every input operand of every command, each
            read once (``NPU_PERF_READ_BYTES`` as docs/npu-spec.md 4.7 defines it).
        written: bytes of every command's output, each written once
            (``NPU_PERF_WRITE_BYTES``).
        nodes: the ONNX nodes of each command, in graph order (for messages).
    """

    commands: Counter[str] = field(default_factory=Counter)
    macs: int = 0
    operand_read: int = 0
    written: int = 0
    nodes: list[tuple[str, ...]] = field(default_factory=list)

    @property
    def num_commands(self) -> int:
        return sum(self.commands.values())


def _shapes(model: onnx.ModelProto, batch: int) -> dict[str, tuple[tuple[int, ...], int]]:
    """name -> (shape, element bytes) of every tensor, the batch dim set to ``batch``."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name for t in m.graph.initializer}
    for v in m.graph.input:
        if v.name in inits:
            continue
        dims = v.type.tensor_type.shape.dim
        if dims[0].HasField("dim_param"):
            dims[0].dim_value = batch
    for v in m.graph.output:  # let inference fill them in from the batch
        v.type.tensor_type.ClearField("shape")
    m = shape_inference.infer_shapes(m, strict_mode=True)
    out: dict[str, tuple[tuple[int, ...], int]] = {}
    for t in m.graph.initializer:
        out[t.name] = (
            tuple(t.dims),
            np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize,
        )
    for v in (*m.graph.input, *m.graph.value_info, *m.graph.output):
        tt = v.type.tensor_type
        dims = []
        for d in tt.shape.dim:
            if not d.HasField("dim_value"):
                raise ValueError(f"{v.name}: dim {d} is not static after shape inference")
            dims.append(d.dim_value)
        out[v.name] = (
            tuple(dims),
            np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).itemsize,
        )
    return out


def _nbytes(info: tuple[tuple[int, ...], int]) -> int:
    shape, size = info
    return int(np.prod(shape, dtype=np.int64)) * size


def expected_work(path: str | Path, batch: int) -> Work:
    """The :class:`Work` of one inference of the model at ``path`` on ``batch`` inputs."""
    model = onnx.load(str(path))
    shapes = _shapes(model, batch)
    nodes = list(model.graph.node)
    readers: Counter[str] = Counter(i for n in nodes for i in n.input if i)
    outputs = {v.name for v in model.graph.output}
    fused: set[int] = set()
    work = Work()
    for idx, node in enumerate(nodes):
        if idx in fused or node.op_type in VIEWS:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        out = node.output[0]
        names = [node.name]
        # A Relu that alone reads the output is fused: the command writes its output.
        nxt = next((j for j, n in enumerate(nodes) if out in n.input), None)
        if (
            node.op_type in ("Conv", "Gemm")
            and nxt is not None
            and nodes[nxt].op_type == "Relu"
            and readers[out] == 1
            and out not in outputs
        ):
            fused.add(nxt)
            names.append(nodes[nxt].name)
            out = nodes[nxt].output[0]
        if node.op_type == "Conv":
            (n, o, oh, ow), _ = shapes[out]
            (_, cg, kh, kw), _ = shapes[node.input[1]]
            work.commands["CONV2D"] += 1
            work.macs += n * o * oh * ow * cg * kh * kw
        elif node.op_type == "Gemm":
            if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
                raise ValueError(f"{node.name}: Gemm with alpha/beta: not modelled here")
            if attrs.get("transA", 0):
                raise ValueError(f"{node.name}: Gemm with transA: not modelled here")
            (m, k), _ = shapes[node.input[0]]
            (_, nn), _ = shapes[out]
            bias = shapes[node.input[2]][0] if len(node.input) > 2 and node.input[2] else None
            if bias is None or int(np.prod(bias)) != nn:
                raise ValueError(f"{node.name}: Gemm without a [N] bias: not one LINEAR")
            work.commands["LINEAR"] += 1
            work.macs += m * nn * k
        elif node.op_type in ("MaxPool", "AveragePool"):
            work.commands["POOL2D"] += 1
        else:
            raise ValueError(f"{node.name}: {node.op_type} is not modelled here")
        work.operand_read += sum(_nbytes(shapes[i]) for i in node.input if i)
        work.written += _nbytes(shapes[out])
        work.nodes.append(tuple(names))
    return work
