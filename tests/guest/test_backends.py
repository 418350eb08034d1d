"""The op suite on both backends: the driver (the device) against the CPU backend.

Every op runs once on ``/dev/npu0`` and once on ``npu.Device("cpu")`` from
the same inputs; the results must agree within the tolerance of the output
dtype (the device computes in float32 and rounds once; the CPU backend's
reductions, matmul, conv and pool compute in float64 and round once):

| dtype | rtol | atol |
|---|---|---|
| float32 | 1e-5 | 1e-5 (1e-4 for matmul, conv and GELU) |
| float16 | 2e-3 (two ulp) | 2e-3 |
| bfloat16 | 1.6e-2 (two ulp) | 1.6e-2 |
| int8, int32 | exact | exact |
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import npu

TOL = {"fp32": (1e-5, 1e-5), "fp16": (2e-3, 2e-3), "bf16": (1.6e-2, 1.6e-2)}
FLOATS: dict[str, Any] = {"fp32": np.float32, "fp16": np.float16, "bf16": npu.bfloat16}
SHAPE = (5, 37)


@pytest.fixture(scope="module")
def cpu() -> Iterator[npu.Device]:
    with npu.Device("cpu") as dev:
        yield dev


def data(shape: tuple[int, ...], seed: int, *, positive: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    return np.abs(x) + 0.5 if positive else x


def both(
    dev: npu.Device,
    cpu: npu.Device,
    fn: Callable[..., npu.Tensor],
    *arrays: np.ndarray,
    dtype: str = "fp32",
) -> tuple[np.ndarray, np.ndarray]:
    """``fn`` of the arrays (as ``dtype`` tensors) on the device and on the CPU backend."""
    out = []
    for d in (dev, cpu):
        ts = [npu.tensor(a, device=d).astype(FLOATS[dtype]) for a in arrays]
        out.append(fn(*ts).astype(np.float32).numpy())
    return out[0], out[1]


def agree(got: np.ndarray, ref: np.ndarray, dtype: str, scale: float = 1.0) -> None:
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(got, ref, rtol=rtol * scale, atol=atol * scale)


BINARY: dict[str, Callable[[npu.Tensor, npu.Tensor], npu.Tensor]] = {
    "add": npu.add,
    "subtract": npu.subtract,
    "multiply": npu.multiply,
    "divide": npu.divide,
    "maximum": npu.maximum,
    "minimum": npu.minimum,
    "equal": npu.equal,
    "not_equal": npu.not_equal,
    "less": npu.less,
    "less_equal": npu.less_equal,
    "greater": npu.greater,
    "greater_equal": npu.greater_equal,
}
UNARY: dict[str, tuple[Callable[[npu.Tensor], npu.Tensor], bool]] = {
    "relu": (npu.relu, False),
    "gelu": (npu.gelu, False),
    "sigmoid": (npu.sigmoid, False),
    "tanh": (npu.tanh, False),
    "exp": (npu.exp, False),
    "log": (npu.log, True),
    "sqrt": (npu.sqrt, True),
    "abs": (npu.abs, False),
    "negative": (npu.negative, False),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", BINARY)
def test_binary_ops_agree(dev: npu.Device, cpu: npu.Device, name: str, dtype: str) -> None:
    a, b = data(SHAPE, 1), data((1, SHAPE[1]), 2, positive=name == "divide")
    agree(*both(dev, cpu, BINARY[name], a, b, dtype=dtype), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", UNARY)
def test_unary_ops_agree(dev: npu.Device, cpu: npu.Device, name: str, dtype: str) -> None:
    fn, positive = UNARY[name]
    scale = 10.0 if name == "gelu" and dtype == "fp32" else 1.0
    agree(*both(dev, cpu, fn, data(SHAPE, 3, positive=positive), dtype=dtype), dtype, scale)


REDUCTIONS: dict[str, Callable[[npu.Tensor], npu.Tensor]] = {
    "sum": lambda t: t.sum(axis=1),
    "mean": lambda t: t.mean(axis=0),
    "max": lambda t: t.max(axis=1),
    "min": lambda t: t.min(axis=(0, 1)),
    "softmax": lambda t: npu.softmax(t, axis=-1),
    "log_softmax": lambda t: npu.log_softmax(t, axis=0),
    "layer_norm": lambda t: npu.layer_norm(t, SHAPE[1:]),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_agree(dev: npu.Device, cpu: npu.Device, name: str, dtype: str) -> None:
    agree(*both(dev, cpu, REDUCTIONS[name], data(SHAPE, 4), dtype=dtype), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_matmul_and_linear_agree(dev: npu.Device, cpu: npu.Device, dtype: str) -> None:
    a, w, bias = data((3, 7, 64), 5), data((64, 24), 6), data((24,), 7)
    agree(*both(dev, cpu, npu.matmul, a, w, dtype=dtype), dtype, 10.0)
    lin = both(dev, cpu, npu.linear, a, w.T.copy(), bias, dtype=dtype)
    agree(*lin, dtype, 10.0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_conv2d_and_pools_agree(dev: npu.Device, cpu: npu.Device, dtype: str) -> None:
    x, w, b = data((2, 6, 11, 9), 8), data((4, 3, 3, 3), 9), data((4,), 10)

    def conv(t: npu.Tensor, k: npu.Tensor, c: npu.Tensor) -> npu.Tensor:
        return npu.conv2d(t, k, c, stride=2, padding=1, groups=2)

    agree(*both(dev, cpu, conv, x, w, b, dtype=dtype), dtype, 10.0)
    agree(*both(dev, cpu, lambda t: npu.max_pool2d(t, 3, stride=2), x, dtype=dtype), dtype)
    agree(*both(dev, cpu, lambda t: npu.avg_pool2d(t, 2, padding=1), x, dtype=dtype), dtype)


def test_quantized_linear_agrees_exactly(dev: npu.Device, cpu: npu.Device) -> None:
    rng = np.random.default_rng(11)
    x = rng.integers(-128, 128, (4, 48), dtype=np.int8)
    w = rng.integers(-128, 128, (16, 48), dtype=np.int8)
    bias = rng.integers(-1000, 1000, 16).astype(np.int32)
    out = []
    for d in (dev, cpu):
        xt, wt, bt = (npu.tensor(a, device=d) for a in (x, w, bias))
        out.append(npu.quantized_linear(xt, wt, bt, input_zero_point=3).numpy())
    np.testing.assert_array_equal(out[0], out[1])


@pytest.mark.parametrize("dst", ["float16", "bfloat16", "int8", "int32"])
def test_conversions_agree_exactly(dev: npu.Device, cpu: npu.Device, dst: str) -> None:
    x = data(SHAPE, 12) * 100
    x[0, :4] = [np.nan, np.inf, -np.inf, 1e10]
    dtype = npu.bfloat16 if dst == "bfloat16" else np.dtype(dst)
    got, ref = (npu.tensor(x, device=d).astype(dtype).numpy() for d in (dev, cpu))
    np.testing.assert_array_equal(got.view(np.uint8), ref.view(np.uint8))


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, npu.bfloat16, np.int8, np.int32, npu.bool]
)
def test_factories_agree_exactly(dev: npu.Device, cpu: npu.Device, dtype: Any) -> None:
    for make in (
        lambda d: npu.zeros(3, 37, dtype=dtype, device=d),
        lambda d: npu.ones(3, 37, dtype=dtype, device=d),
        lambda d: npu.full((3, 37), 1 if dtype is npu.bool else 5, dtype=dtype, device=d),
        lambda d: npu.arange(37, dtype=dtype if dtype is not npu.bool else np.int32, device=d),
    ):
        on_dev, on_cpu = make(dev).numpy(), make(cpu).numpy()
        assert on_dev.dtype == on_cpu.dtype
        np.testing.assert_array_equal(on_dev, on_cpu)


def test_streams_on_both_backends_agree(dev: npu.Device, cpu: npu.Device) -> None:
    x_np, w_np = data((16, 32), 40), data((32, 8), 41)
    got = []
    for d in (dev, cpu):
        s = npu.Stream(d)
        try:
            with s:
                y = npu.softmax(npu.relu(npu.tensor(x_np, device=d) @ npu.tensor(w_np, device=d)))
            got.append(y.numpy())
        finally:
            s.close()
    agree(got[0], got[1], "fp32", scale=10)
