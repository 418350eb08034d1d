"""ATen ops of a torch.fx graph lowered to :mod:`npu` tensor functions.

One entry of :data:`LOWERINGS` per supported ``torch.ops.aten`` overload
(keyed by its name, e.g. ``"aten.convolution.default"``): a function of the
node's arguments, with every tensor argument already an :class:`npu.Tensor`,
that returns the node's value (a Tensor, or a tuple whose unused members
are ``None``). :func:`check` says, from the node's fake-tensor metadata,
whether the NPU can run a node at all; :class:`Unsupported` from a lowering
means the same thing found later (the compiler then leaves the node to
torch).

The module imports nothing from torch: nodes and targets are read through
their names and attributes, so the lowering rules are plain functions of
numbers, lists and npu tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Final

from .. import tensors as nt
from ..tensors.tensor import Tensor

__all__ = ["LOWERINGS", "NPU_TORCH_DTYPES", "Unsupported", "check", "target_name"]

Lowering = Callable[..., Any]


class Unsupported(Exception):
    """The NPU cannot run this node (the message says why); torch runs it."""


#: torch dtypes (by name) the NPU path takes; other tensors stay with torch.
NPU_TORCH_DTYPES: Final = frozenset({"torch.float32"})
_MAX_RANK: Final = 4


def target_name(target: Any) -> str:
    """``"aten.relu.default"`` for ``torch.ops.aten.relu.default``; ``str`` of anything else."""
    name = getattr(target, "name", None)
    if callable(name):  # an OpOverload: name() is "aten::add.Tensor", or "aten::relu"
        full = str(name()).replace("::", ".")
        return full if full.count(".") >= 2 else f"{full}.default"
    module = getattr(target, "__module__", "") or ""
    return f"{module}.{getattr(target, '__name__', str(target))}"


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    seq = [int(x) for x in v]
    return (seq[0], seq[0]) if len(seq) == 1 else (seq[0], seq[1])


def _conv(
    x: Tensor, w: Tensor, b: Tensor | None, stride: Sequence[int], padding: Sequence[int],
    dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int,
) -> Tensor:  # fmt: skip
    if transposed or len(stride) != 2:
        raise Unsupported("transposed or non-2-D convolution")
    return nt.nn.conv2d(x, w, b, _pair(stride), _pair(padding), _pair(dilation), groups)


def _add(a: Any, b: Any, *, alpha: float = 1) -> Tensor:
    if alpha != 1:
        b = nt.elementwise.multiply(b, alpha)
    return nt.elementwise.add(a, b)


def _sub(a: Any, b: Any, *, alpha: float = 1) -> Tensor:
    if alpha != 1:
        b = nt.elementwise.multiply(b, alpha)
    return nt.elementwise.subtract(a, b)


def _div(a: Any, b: Any, *, rounding_mode: str | None = None) -> Tensor:
    if rounding_mode is not None:
        raise Unsupported(f"division with rounding_mode={rounding_mode!r}")
    return nt.elementwise.divide(a, b)


def _addmm(bias: Tensor, a: Tensor, b: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    if beta != 1 or alpha != 1:
        raise Unsupported("addmm with alpha or beta other than 1")
    return nt.elementwise.add(nt.nn.matmul(a, b), bias)


def _view(x: Tensor, shape: Sequence[int]) -> Tensor:
    return x.reshape(tuple(int(s) for s in shape))


def _permute(x: Tensor, dims: Sequence[int]) -> Tensor:
    return x.permute(tuple(int(d) for d in dims))


def _transpose(x: Tensor, d0: int, d1: int) -> Tensor:
    perm = list(range(x.ndim))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return x.permute(tuple(perm))


def _slice(
    x: Tensor, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1
) -> Tensor:
    key = (slice(None),) * (dim % x.ndim) + (slice(start, end, step),)
    return x[key]


def _expand(x: Tensor, size: Sequence[int], *, implicit: bool = False) -> Tensor:
    shape = [int(s) for s in size]
    lead = len(shape) - x.ndim
    out = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(shape))
    src = x.reshape((1,) * lead + x.shape) if lead else x
    strides = tuple(
        0 if s != o else st for s, o, st in zip(src.shape, out, src.strides, strict=True)
    )
    return src.as_strided(out, strides)


def _unsqueeze(x: Tensor, dim: int) -> Tensor:
    shape = list(x.shape)
    shape.insert(dim % (x.ndim + 1), 1)
    return x.reshape(tuple(shape))


def _squeeze(x: Tensor, dims: Any = None) -> Tensor:
    if dims is None:
        dims = [d for d, s in enumerate(x.shape) if s == 1]
    elif isinstance(dims, int):
        dims = [dims]
    drop = {d % x.ndim for d in dims if x.shape[d % x.ndim] == 1}
    return x.reshape(tuple(s for d, s in enumerate(x.shape) if d not in drop))


def _max_pool(
    x: Tensor, kernel: Sequence[int], stride: Sequence[int] = (), padding: Any = 0,
    dilation: Any = 1, ceil_mode: bool = False,
) -> tuple[Tensor, None]:  # fmt: skip
    k = _pair(kernel)
    s = _pair(stride) if stride else k
    return nt.nn.max_pool2d(x, k, s, _pair(padding), _pair(dilation), ceil_mode), None


def _avg_pool(
    x: Tensor, kernel: Sequence[int], stride: Sequence[int] = (), padding: Any = 0,
    ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None,
) -> Tensor:  # fmt: skip
    if divisor_override is not None:
        raise Unsupported("avg_pool2d with divisor_override")
    k = _pair(kernel)
    s = _pair(stride) if stride else k
    return nt.nn.avg_pool2d(x, k, s, _pair(padding), count_include_pad, ceil_mode=ceil_mode)


def _adaptive_avg_pool(x: Tensor, output_size: Sequence[int]) -> Tensor:
    if [int(v) for v in output_size] != [1, 1] or x.ndim != 4:
        raise Unsupported(f"adaptive average pooling to {list(output_size)} (NPU: 1x1)")
    return nt.nn.global_avg_pool2d(x)


def _mean(x: Tensor, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    if dtype is not None:
        raise Unsupported("mean with a dtype")
    axes = None if dims is None else tuple(int(d) % x.ndim for d in dims)
    if x.ndim == 4 and axes in ((2, 3), (3, 2)) and keepdim:
        return nt.nn.global_avg_pool2d(x)
    return nt.reduce.mean(x, axes, keepdim)


def _sum(x: Tensor, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    if dtype is not None:
        raise Unsupported("sum with a dtype")
    axes = None if dims is None else tuple(int(d) % x.ndim for d in dims)
    return nt.reduce.sum(x, axes, keepdim)


def _batch_norm(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, var: Tensor,
    momentum: float, eps: float,
) -> tuple[Tensor, None, None]:  # fmt: skip
    """Inference batch norm: ``x * s + (bias - mean * s)``, ``s = weight / sqrt(var + eps)``."""
    if x.ndim < 2:
        raise Unsupported("batch norm of a rank-1 input")
    c = x.shape[1]
    shape = (1, c) + (1,) * (x.ndim - 2)
    inv = nt.elementwise.reciprocal(nt.elementwise.sqrt(nt.elementwise.add(var, eps)))
    scale = inv if weight is None else nt.elementwise.multiply(weight, inv)
    shift = nt.elementwise.negative(nt.elementwise.multiply(mean, scale))
    if bias is not None:
        shift = nt.elementwise.add(shift, bias)
    y = nt.elementwise.add(nt.elementwise.multiply(x, scale.reshape(shape)), shift.reshape(shape))
    return y, None, None


def _layer_norm(
    x: Tensor, shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, None, None]:
    return nt.reduce.layer_norm(x, tuple(int(s) for s in shape), weight, bias, eps), None, None


def _softmax(x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    return nt.reduce.softmax(x, int(dim))


def _log_softmax(x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    return nt.reduce.log_softmax(x, int(dim))


def _gelu(x: Tensor, *, approximate: str = "none") -> Tensor:
    if approximate != "none":
        raise Unsupported(f"gelu(approximate={approximate!r}) (the NPU's GELU is exact)")
    return nt.elementwise.gelu(x)


def _hardtanh(x: Tensor, lo: float = -1.0, hi: float = 1.0) -> Tensor:
    return nt.elementwise.minimum(nt.elementwise.maximum(x, lo), hi)


def _clone(x: Tensor, *, memory_format: Any = None) -> Tensor:
    return x.astype(x.npu_dtype, copy=True)


def _same(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    return x


e = nt.elementwise
#: ATen overload name -> lowering.
LOWERINGS: Final[dict[str, Lowering]] = {
    "aten.convolution.default": _conv,
    "aten.relu.default": e.relu,
    "aten.sigmoid.default": e.sigmoid,
    "aten.tanh.default": e.tanh,
    "aten.exp.default": e.exp,
    "aten.log.default": e.log,
    "aten.sqrt.default": e.sqrt,
    "aten.abs.default": e.abs,
    "aten.neg.default": e.negative,
    "aten.erf.default": e.erf,
    "aten.reciprocal.default": e.reciprocal,
    "aten.gelu.default": _gelu,
    "aten.hardtanh.default": _hardtanh,
    "aten.add.Tensor": _add,
    "aten.sub.Tensor": _sub,
    "aten.mul.Tensor": e.multiply,
    "aten.div.Tensor": _div,
    "aten.maximum.default": e.maximum,
    "aten.minimum.default": e.minimum,
    "aten.addmm.default": _addmm,
    "aten.mm.default": nt.nn.matmul,
    "aten.bmm.default": nt.nn.matmul,
    "aten.matmul.default": nt.nn.matmul,
    "aten.t.default": lambda x: _transpose(x, 0, 1) if x.ndim == 2 else x,
    "aten.transpose.int": _transpose,
    "aten.permute.default": _permute,
    "aten.view.default": _view,
    "aten._unsafe_view.default": _view,
    "aten.reshape.default": _view,
    "aten.unsqueeze.default": _unsqueeze,
    "aten.slice.Tensor": _slice,
    "aten.expand.default": _expand,
    "aten.squeeze.dim": _squeeze,
    "aten.squeeze.dims": _squeeze,
    "aten.squeeze.default": _squeeze,
    "aten.clone.default": _clone,
    "aten.detach.default": _same,
    "aten.alias.default": _same,
    "aten.max_pool2d_with_indices.default": _max_pool,
    "aten.avg_pool2d.default": _avg_pool,
    "aten._adaptive_avg_pool2d.default": _adaptive_avg_pool,
    "aten.mean.dim": _mean,
    "aten.sum.dim_IntList": _sum,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm,
    "aten.native_layer_norm.default": _layer_norm,
    "aten._softmax.default": _softmax,
    "aten._log_softmax.default": _log_softmax,
}
del e

# Tuple-valued ops whose members beyond the first the NPU does not compute.
_FIRST_ONLY: Final = frozenset(
    {
        "aten.max_pool2d_with_indices.default",
        "aten._native_batch_norm_legit_no_training.default",
        "aten.native_layer_norm.default",
    }
)


def _fake_tensors(value: Any) -> list[Any]:
    """The tensor-like members of a node's ``meta["val"]`` (one tensor or a tuple)."""
    vals = value if isinstance(value, (tuple, list)) else [value]
    return [v for v in vals if hasattr(v, "shape") and hasattr(v, "dtype")]


def check(op: str, inputs: Sequence[Any], outputs: Any, used: set[int]) -> str | None:
    """``None`` if the NPU can run aten op ``op``, else why not.

    ``inputs`` are the fake tensors among its arguments, ``outputs`` its
    ``meta["val"]`` and ``used`` the indices of its tuple members that
    other nodes read (``{0}`` for a plain value).
    """
    if op not in LOWERINGS:
        return f"no NPU lowering for {op}"
    if op in _FIRST_ONLY and used - {0}:
        return f"{op}: the NPU computes only its first result"
    outs = _fake_tensors(outputs)
    if op in _FIRST_ONLY:
        outs = outs[:1]
    for t in [*inputs, *outs]:
        if str(t.dtype) not in NPU_TORCH_DTYPES:
            return f"a {t.dtype} tensor (NPU path: float32)"
        if len(t.shape) > _MAX_RANK or len(t.shape) == 0:
            return f"a rank-{len(t.shape)} tensor (NPU tensors: rank 1..{_MAX_RANK})"
        if any(not isinstance(s, int) for s in t.shape) or math.prod(t.shape) == 0:
            return "a dynamic or empty shape"
    return None
