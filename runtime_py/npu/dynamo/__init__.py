"""The ``"npu"`` backend of ``torch.compile`` (PyTorch 2 dynamo).

``import npu.dynamo`` registers it (an installed ``npu`` package also
declares it as a ``torch_dynamo_backends`` entry point, so torch finds it
by name alone)::

    import npu.dynamo
    model = torch.compile(model, backend="npu")
    with torch.no_grad():
        y = model(x)

Dynamo captures the model's Python into torch.fx graphs; ``aot_autograd``
turns each into ATen ops with the parameters as graph inputs; each forward
graph becomes a :class:`~npu.dynamo.compiler.CompiledGraph`: runs of ops
the NPU supports are captured once into :class:`npu.Graph` objects and
replayed at every call, weights are uploaded once, and each node the NPU
cannot run is left to torch on the CPU with one logged note (logger
``npu.dynamo.compiler``). Inference only: with autograd enabled the
backward graph runs in torch (the forward still runs on the NPU).
:func:`compiled_graphs` lists what was compiled, for inspection.
"""

from __future__ import annotations

import logging
from typing import Any

from ..core.device import DeviceArg, resolve_device
from .compiler import CompiledGraph

__all__ = ["CompiledGraph", "compiled_graphs", "npu_backend", "register"]

log = logging.getLogger(__name__)

_COMPILED: list[CompiledGraph] = []


def compiled_graphs() -> list[CompiledGraph]:
    """The forward graphs the backend compiled in this process, oldest first."""
    return list(_COMPILED)


def npu_backend(gm: Any, example_inputs: list[Any], device: DeviceArg = None) -> Any:
    """The dynamo backend: lower ``gm`` through ``aot_autograd`` onto the NPU."""
    from torch._dynamo.backends.common import aot_autograd

    dev = resolve_device(device)

    def forward(fx: Any, inputs: list[Any]) -> Any:
        compiled = CompiledGraph(fx, dev, name=f"graph{len(_COMPILED)}")
        _COMPILED.append(compiled)
        log.info(
            "%s: %d nodes on the NPU, %d on the CPU",
            compiled.name,
            len(compiled.npu_nodes),
            len(compiled.cpu_nodes),
        )
        return _boxed(compiled)

    def backward(fx: Any, inputs: list[Any]) -> Any:
        return fx.forward  # training: torch computes the gradients

    return aot_autograd(fw_compiler=forward, bw_compiler=backward)(gm, example_inputs)


def _boxed(compiled: CompiledGraph) -> Any:
    """``compiled`` with the calling convention aot_autograd expects (list in, tuple out)."""
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(lambda *args: compiled(*args))


def register() -> None:
    """Register :func:`npu_backend` with dynamo as ``"npu"`` (idempotent).

    Not through ``torch._dynamo.list_backends()``: that imports every
    backend dynamo knows, onnxruntime's among them, and in Debian's
    python3-onnx a process that has imported onnxruntime can no longer
    import ``onnx.reference`` (one schema registry; the CPU provider's
    last-resort kernels need it). ``register_backend`` refuses a second
    registration with an AssertionError: the "already registered" answer.
    """
    from torch._dynamo import register_backend

    try:
        register_backend(name="npu")(npu_backend)
    except AssertionError:
        log.debug("the npu dynamo backend was already registered")


try:
    register()
except ImportError:  # torch is not installed: nothing to register
    log.debug("torch is not importable; the npu dynamo backend is not registered")
