"""Python runtime of the emulated NPU.

Quick start::

    import numpy as np
    import npu

    c = npu.matmul(np.ones((4, 3)), np.ones((3, 5)))   # on the default device

    with npu.open_device(0) as dev, dev.alloc(4096) as buf:
        fence = dev.submit([npu.ops.fill(buf, 0xDEADBEEF, 4096)])
        dev.wait(fence)
        print(hex(buf.numpy(np.uint32)[0]))

Layers, bottom up (each imports only those below it): :mod:`npu._abi`
(ctypes mirrors of the C headers), :mod:`npu.errors` and :mod:`npu.dtypes`;
:mod:`npu.hal` (the backends: driver ioctls and mmap, or numpy on the CPU);
:mod:`npu.kernels` (op builders, descriptor packing, validation; ``npu.ops``);
:mod:`npu.core` (:class:`Device`, :class:`Buffer`, :class:`UserQueue`,
:class:`Stream`, :class:`Event`); :mod:`npu.allocator` (the caching
allocator); :mod:`npu.tensors` (device-resident :class:`Tensor`:
``npu.tensor(x) + 1`` stays on the device until ``.numpy()``, and its ops);
:mod:`npu.graph` (capture and replay); :mod:`npu.api` (numpy-level
functions) and :mod:`npu.inference` (ONNX models). See docs/runtime.md.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from ._abi import (
    ActKind,
    Cap,
    DType,
    EltwiseKind,
    Opcode,
    PoolKind,
    ReduceKind,
    SoftmaxKind,
    Status,
    UnaryKind,
    status_name,
)
from .allocator import (
    empty_cache,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_peak_memory_stats,
)
from .api import copy_array, fill, matmul
from .core.buffer import Buffer, UserBuffer
from .core.device import (
    DEFAULT_TIMEOUT_S,
    Device,
    DeviceInfo,
    close_default_device,
    default_device,
    devices,
    open_device,
    resolve_device,
    set_default_device,
)
from .core.stream import Event, Stream, current_stream, default_stream, synchronize
from .core.userqueue import Completion, UserQueue
from .dtypes import BFloat16Type, bf16_to_float32, bfloat16, float32_to_bf16, result_type
from .errors import (
    DeviceNotFoundError,
    NpuDeviceError,
    NpuError,
    NpuOutOfMemoryError,
    NpuTimeoutError,
)
from .graph import Graph
from .kernels import ops
from .kernels.ops import BufRef, Op, TensorOp, TensorRef
from .tensors.elementwise import (
    abs,
    add,
    divide,
    equal,
    erf,
    exp,
    gelu,
    greater,
    greater_equal,
    less,
    less_equal,
    log,
    maximum,
    minimum,
    multiply,
    negative,
    not_equal,
    power,
    reciprocal,
    relu,
    sigmoid,
    sqrt,
    subtract,
    tanh,
)
from .tensors.factory import (
    arange,
    empty,
    empty_like,
    full,
    full_like,
    ones,
    ones_like,
    zeros,
    zeros_like,
)
from .tensors.nn import avg_pool2d, conv2d, global_avg_pool2d, linear, max_pool2d
from .tensors.quant import quantized_conv2d, quantized_linear, quantized_matmul
from .tensors.reduce import layer_norm, log_softmax, max, mean, min, softmax, sum
from .tensors.tensor import Tensor, from_numpy, from_torch, permute, tensor

if TYPE_CHECKING:
    from . import profiler as profiler
    from .inference import InferenceSession, ModelError

__version__ = "0.1.0"

# One dtype system: the tensor dtypes by name, usable wherever a numpy dtype
# is (they are numpy dtypes, and bfloat16 the runtime's marker).
float32: Final = np.dtype(np.float32)
float16: Final = np.dtype(np.float16)
int8: Final = np.dtype(np.int8)
int32: Final = np.dtype(np.int32)
bool_: Final = np.dtype(np.bool_)
#: ``npu.bool``, as ``torch.bool`` (``npu.bool_`` is the numpy spelling).
bool = bool_

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ActKind",
    "BFloat16Type",
    "BufRef",
    "Buffer",
    "Cap",
    "Completion",
    "DType",
    "Device",
    "DeviceInfo",
    "DeviceNotFoundError",
    "EltwiseKind",
    "Event",
    "Graph",
    "InferenceSession",
    "ModelError",
    "NpuDeviceError",
    "NpuError",
    "NpuOutOfMemoryError",
    "NpuTimeoutError",
    "Op",
    "Opcode",
    "PoolKind",
    "ReduceKind",
    "SoftmaxKind",
    "Status",
    "Stream",
    "Tensor",
    "TensorOp",
    "TensorRef",
    "UnaryKind",
    "UserBuffer",
    "UserQueue",
    "__version__",
    "abs",
    "add",
    "arange",
    "avg_pool2d",
    "bf16_to_float32",
    "bfloat16",
    "bool",
    "bool_",
    "close_default_device",
    "conv2d",
    "copy_array",
    "current_stream",
    "default_device",
    "default_stream",
    "devices",
    "divide",
    "empty",
    "empty_cache",
    "empty_like",
    "equal",
    "erf",
    "exp",
    "fill",
    "float16",
    "float32",
    "float32_to_bf16",
    "from_numpy",
    "from_torch",
    "full",
    "full_like",
    "gelu",
    "global_avg_pool2d",
    "greater",
    "greater_equal",
    "int8",
    "int32",
    "layer_norm",
    "less",
    "less_equal",
    "linear",
    "log",
    "log_softmax",
    "matmul",
    "max",
    "max_pool2d",
    "maximum",
    "mean",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "min",
    "minimum",
    "multiply",
    "negative",
    "not_equal",
    "ones",
    "ones_like",
    "open_device",
    "ops",
    "permute",
    "power",
    "quantized_conv2d",
    "quantized_linear",
    "quantized_matmul",
    "reciprocal",
    "relu",
    "reset_peak_memory_stats",
    "resolve_device",
    "result_type",
    "set_default_device",
    "sigmoid",
    "softmax",
    "sqrt",
    "status_name",
    "subtract",
    "sum",
    "synchronize",
    "tanh",
    "tensor",
    "zeros",
    "zeros_like",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())

# The model runner imports onnx (slow under emulation): load it on first use.
_LAZY = {"InferenceSession", "ModelError"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import inference

        return getattr(inference, name)
    if name == "profiler":  # npu.profiler, imported on first use (it is not small)
        return importlib.import_module(".profiler", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
