"""The ONNX model runner: load a model, partition it between the NPU and numpy, run it.

``npu.InferenceSession(model)`` works like ``onnxruntime.InferenceSession``
with two execution providers, ``"NPU"`` and ``"CPU"`` (numpy). Modules, one
job each:

- :mod:`.graph`: the graph form the runner works on, and :class:`ModelError`;
- :mod:`.loader`: decoding, checking and shape-inferring the model;
- :mod:`.rewrite`: BatchNorm folding, fusions, constant folding;
- :mod:`.partition`: the NPU support rules and the partitioning;
- :mod:`.npu_provider`: weights on the device, compiled per-shape plans;
- :mod:`.cpu`: numpy kernels and the ``onnx.reference`` fallback;
- :mod:`.session`: :class:`InferenceSession`.

See docs/inference.md.
"""

from __future__ import annotations

from .graph import ModelError
from .partition import Partition
from .session import InferenceSession, NodeArg, NodeTime, RunFuture, RunProfile

__all__ = [
    "InferenceSession",
    "ModelError",
    "NodeArg",
    "NodeTime",
    "Partition",
    "RunFuture",
    "RunProfile",
]
