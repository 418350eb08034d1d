"""Small helpers to write the example models as ONNX graphs with onnx.helper.

Every model has one float32 input named ``input`` whose first dimension is
the symbolic batch ``N``, one output named ``logits`` and opset 17.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
INPUT = "input"
OUTPUT = "logits"


class GraphBuilder:
    """Collects nodes and initializers; ``model()`` wraps them into a checked ModelProto."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value: npt.NDArray[Any]) -> str:
        """Add an initializer (float32 unless value is an integer array); return its name."""
        arr = value if value.dtype.kind in "iu" else value.astype(np.float32)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def node(self, op: str, inputs: Sequence[str], output: str, **attrs: Any) -> str:
        """Add one node with a single output; return the output's name."""
        self.nodes.append(
            helper.make_node(op, list(inputs), [output], name=f"{op.lower()}_{output}", **attrs)
        )
        return output

    def model(
        self, name: str, input_shape: Sequence[int | str], num_classes: int
    ) -> onnx.ModelProto:
        """The model with input INPUT of input_shape and output OUTPUT [N, num_classes]."""
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, list(input_shape))],
            [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["N", num_classes])],
            initializer=self.inits,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="npu-stack examples/models",
        )
        # onnx 1.17 writes IR version 10; keep it so that the model also loads
        # with older onnxruntime releases.
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=True)
        return model


def save(model: onnx.ModelProto, path: Path) -> None:
    """Write model to path (deterministic bytes for the same model)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))


def reference_run(model: onnx.ModelProto, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The model's logits for x with onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    (out,) = ReferenceEvaluator(model).run(None, {INPUT: x})
    return np.asarray(out, dtype=np.float32)
