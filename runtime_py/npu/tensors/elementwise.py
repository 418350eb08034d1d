"""Element-wise tensor ops: ELTWISE (add, ..., minimum) and UNARY (relu, ..., negative).

Binary ops broadcast like numpy and promote with :func:`npu.result_type`
(Python scalars are weak); the float-only unary ops of integer inputs give
a float dtype. CONVERT is :meth:`npu.Tensor.astype`.
"""

from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from .. import _abi
from ..dtypes import DType, float_of, promote
from ..kernels import ops
from ..kernels.validate import unary_float_only
from .tensor import (
    Plan,
    Tensor,
    alloc,
    as_tensor,
    broadcast_shapes,
    buffers_of,
    cast_to,
    empty_tensor,
    launch,
    operands,
    register_operator,
    run_plan,
    signature,
    tensor,
)

__all__ = [
    "abs",
    "add",
    "divide",
    "equal",
    "erf",
    "exp",
    "gelu",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "log",
    "maximum",
    "minimum",
    "multiply",
    "negative",
    "not_equal",
    "power",
    "reciprocal",
    "relu",
    "sigmoid",
    "sqrt",
    "subtract",
    "tanh",
]


# Plans of the ops seen, by (kind, signature of each input); bounded.
_PLANS: dict[tuple[object, ...], Plan] = {}
_PLANS_MAX = 1024


def _keep_plan(key: tuple[object, ...], op: ops.TensorOp, out: Tensor) -> None:
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = Plan(op, out.npu_dtype, out.shape)


def _binary(kind: _abi.EltwiseKind, x: Any, y: Any, what: str) -> Tensor:
    key: tuple[object, ...] | None = None
    if type(x) is Tensor and type(y) is Tensor:
        sx, sy = signature(x), signature(y)
        if sx is not None and sy is not None and x.device is y.device:
            key = (kind, sx, sy)
            plan = _PLANS.get(key)
            if plan is not None:
                done = run_plan(plan, (x, y))
                if done is not None:
                    return done
    a, b = operands(x, y, what)
    dtype = promote(a.npu_dtype, b.npu_dtype)
    compare = kind.is_compare
    if dtype is DType.BOOL and not compare:
        raise TypeError(f"{what}: not supported for two bool tensors; convert one with astype()")
    if kind is _abi.EltwiseKind.DIV and not dtype.is_float:
        dtype = DType.FP32
    shape = broadcast_shapes(a.shape, b.shape, what)
    out_dtype = DType.BOOL if compare else dtype
    if math.prod(shape) == 0:
        return empty_tensor(a.device, out_dtype, shape)
    batch: list[ops.AnyOp] = []
    ca, cb = cast_to(a, dtype, batch), cast_to(b, dtype, batch)
    out = alloc(a.device, out_dtype, shape)
    rank = builtins.max(1, len(shape))
    op = ops.eltwise(
        kind, ca.tensor_ref(rank), cb.tensor_ref(rank), out.tensor_ref(), buffers_of(ca, cb, out)
    )
    batch.append(op)
    if key is not None and len(batch) == 1:  # no casts: the next call takes the plan
        _keep_plan(key, op, out)
    return launch(batch, out, a, b)


def _unary(kind: _abi.UnaryKind, x: Any, what: str) -> Tensor:
    key: tuple[object, ...] | None = None
    if type(x) is Tensor:
        sx = signature(x)
        if sx is not None:
            key = (kind, sx)
            plan = _PLANS.get(key)
            if plan is not None:
                done = run_plan(plan, (x,))
                if done is not None:
                    return done
    t = x if isinstance(x, Tensor) else operands(x, 0, what)[0]
    dtype = t.npu_dtype
    if dtype is DType.BOOL:
        raise TypeError(f"{what}: not supported for bool tensors; convert with astype()")
    if unary_float_only(kind):
        dtype = float_of(dtype)
    if t.size == 0:
        return empty_tensor(t.device, dtype, t.shape)
    batch: list[ops.AnyOp] = []
    src = cast_to(t, dtype, batch)
    out = alloc(t.device, dtype, t.shape)
    op = ops.unary(kind, src.tensor_ref(), out.tensor_ref(), buffers_of(src, out))
    batch.append(op)
    if key is not None and len(batch) == 1:
        _keep_plan(key, op, out)
    return launch(batch, out, t)


# ---------------------------------------------------------------------------
# Public op functions
# ---------------------------------------------------------------------------


@register_operator("add")
def add(x: Any, y: Any) -> Tensor:
    """``x + y`` on the device (numpy broadcasting and promotion)."""
    return _binary(_abi.EltwiseKind.ADD, x, y, "add")


@register_operator("subtract")
def subtract(x: Any, y: Any) -> Tensor:
    """``x - y`` on the device."""
    return _binary(_abi.EltwiseKind.SUB, x, y, "subtract")


@register_operator("multiply")
def multiply(x: Any, y: Any) -> Tensor:
    """``x * y`` on the device."""
    return _binary(_abi.EltwiseKind.MUL, x, y, "multiply")


@register_operator("divide")
def divide(x: Any, y: Any) -> Tensor:
    """``x / y`` (true division); integer operands give float32 (numpy: float64)."""
    return _binary(_abi.EltwiseKind.DIV, x, y, "divide")


@register_operator("equal")
def equal(x: Any, y: Any) -> Tensor:
    """``x == y`` element-wise: a bool tensor (ELTWISE EQ; NaN equals nothing)."""
    return _binary(_abi.EltwiseKind.EQ, x, y, "equal")


@register_operator("not_equal")
def not_equal(x: Any, y: Any) -> Tensor:
    """``x != y`` element-wise: a bool tensor (NaN differs from everything)."""
    return _binary(_abi.EltwiseKind.NE, x, y, "not_equal")


@register_operator("less")
def less(x: Any, y: Any) -> Tensor:
    """``x < y`` element-wise: a bool tensor."""
    return _binary(_abi.EltwiseKind.LT, x, y, "less")


@register_operator("less_equal")
def less_equal(x: Any, y: Any) -> Tensor:
    """``x <= y`` element-wise: a bool tensor."""
    return _binary(_abi.EltwiseKind.LE, x, y, "less_equal")


@register_operator("greater")
def greater(x: Any, y: Any) -> Tensor:
    """``x > y`` element-wise: a bool tensor."""
    return _binary(_abi.EltwiseKind.GT, x, y, "greater")


@register_operator("greater_equal")
def greater_equal(x: Any, y: Any) -> Tensor:
    """``x >= y`` element-wise: a bool tensor."""
    return _binary(_abi.EltwiseKind.GE, x, y, "greater_equal")


def maximum(x: Any, y: Any) -> Tensor:
    """Element-wise maximum."""
    return _binary(_abi.EltwiseKind.MAX, x, y, "maximum")


def minimum(x: Any, y: Any) -> Tensor:
    """Element-wise minimum."""
    return _binary(_abi.EltwiseKind.MIN, x, y, "minimum")


def relu(x: Any) -> Tensor:
    """``max(x, 0)``; any dtype."""
    return _unary(_abi.UnaryKind.RELU, x, "relu")


def gelu(x: Any) -> Tensor:
    """Exact GELU ``x * (1 + erf(x / sqrt(2))) / 2``; integer inputs promote like :func:`exp`."""
    return _unary(_abi.UnaryKind.GELU, x, "gelu")


def sigmoid(x: Any) -> Tensor:
    """``1 / (1 + exp(-x))``; integer inputs promote like :func:`exp`."""
    return _unary(_abi.UnaryKind.SIGMOID, x, "sigmoid")


def tanh(x: Any) -> Tensor:
    """Hyperbolic tangent; integer inputs promote like :func:`exp`."""
    return _unary(_abi.UnaryKind.TANH, x, "tanh")


def exp(x: Any) -> Tensor:
    """``e ** x``; int8 inputs give float16 and int32 inputs float32, as numpy (float64)."""
    return _unary(_abi.UnaryKind.EXP, x, "exp")


def log(x: Any) -> Tensor:
    """Natural logarithm; integer inputs promote like :func:`exp`."""
    return _unary(_abi.UnaryKind.LOG, x, "log")


def sqrt(x: Any) -> Tensor:
    """Square root; integer inputs promote like :func:`exp`."""
    return _unary(_abi.UnaryKind.SQRT, x, "sqrt")


def erf(x: Any) -> Tensor:
    """The error function (``torch.erf``); integer inputs promote like :func:`exp`."""
    return _unary(_abi.UnaryKind.ERF, x, "erf")


def reciprocal(x: Any) -> Tensor:
    """``1 / x`` (``torch.reciprocal``), one IEEE division; integers promote like :func:`exp`."""
    return _unary(_abi.UnaryKind.RECIPROCAL, x, "reciprocal")


@register_operator("abs")
def abs(x: Any) -> Tensor:
    """Absolute value; any dtype."""
    return _unary(_abi.UnaryKind.ABS, x, "abs")


@register_operator("negative")
def negative(x: Any) -> Tensor:
    """``-x``; any dtype."""
    return _unary(_abi.UnaryKind.NEG, x, "negative")


@register_operator("power")
def power(base: Any, exponent: Any) -> Tensor:
    """``base ** exponent`` (numpy's ``power``, ``Tensor.__pow__``).

    Exact for the exponents 0, 1, 2, 3, 0.5 and -1 (products, SQRT, a
    division), else ``exp(exponent * log(base))``: NaN for a negative base,
    where numpy gives a real result for integer exponents.
    """
    b = as_tensor(base, "power")
    if not isinstance(exponent, Tensor):
        p = float(exponent)
        if p == 0:  # 1 everywhere, NaN and inf included (numpy's rule)
            return tensor(np.ones(b.shape, np.float32), b.dtype, b.device)
        if p == 1:
            return b.clone()
        if p == 2:
            return multiply(b, b)
        if p == 3:
            return multiply(multiply(b, b), b)
        if p == 0.5:
            return sqrt(b)
        if p == -1:
            return divide(1, b)
    return exp(multiply(log(b), exponent))
