"""Plain-numpy layers (forward and backward) shared by the model scripts.

Used on the host by ``train_digits.py`` (training) and ``make_resnet.py``
(BN calibration and the reference forward pass). NCHW layout, float32
unless the caller passes float64. Nothing here needs the NPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]


def im2col(x: Array, kh: int, kw: int, stride: int, pad: int) -> tuple[Array, int, int]:
    """Patches of x [N, C, H, W] as a [N*OH*OW, C*KH*KW] matrix, with OH and OW."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else x
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    win = win[:, :, ::stride, ::stride]
    n, c, oh, ow = win.shape[:4]
    cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * kh * kw)
    return cols, oh, ow


def conv2d(x: Array, w: Array, b: Array | None, stride: int = 1, pad: int = 0) -> Array:
    """Cross-correlation of x [N, C, H, W] with w [O, C, KH, KW] (ONNX Conv), NCHW out."""
    o, _, kh, kw = w.shape
    cols, oh, ow = im2col(x, kh, kw, stride, pad)
    y = cols @ w.reshape(o, -1).T
    if b is not None:
        y += b
    return np.ascontiguousarray(y.reshape(x.shape[0], oh, ow, o).transpose(0, 3, 1, 2))


def conv2d_backward(x: Array, w: Array, dy: Array, pad: int) -> tuple[Array, Array, Array]:
    """Gradients (dx, dw, db) of a stride-1 conv2d of x with w, given dy."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    cols, oh, ow = im2col(x, kh, kw, 1, pad)
    dyr = dy.transpose(0, 2, 3, 1).reshape(-1, o)
    dw = (dyr.T @ cols).reshape(w.shape)
    db = dyr.sum(axis=0)
    dcols = (dyr @ w.reshape(o, -1)).reshape(n, oh, ow, c, kh, kw)
    dxp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i : i + oh, j : j + ow] += dcols[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    dx = dxp[:, :, pad : pad + h, pad : pad + wd] if pad else dxp
    return dx, dw, db


def maxpool2(x: Array) -> tuple[Array, Array]:
    """2x2 stride-2 max pooling of x [N, C, H, W] (H, W even): (y, argmax for backward)."""
    n, c, h, w = x.shape
    win = x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5)
    win = win.reshape(n, c, h // 2, w // 2, 4)
    idx = win.argmax(axis=-1)
    y = np.take_along_axis(win, idx[..., None], axis=-1)[..., 0]
    return y, idx


def maxpool2_backward(dy: Array, idx: Array) -> Array:
    """Gradient of maxpool2 with respect to its input, routed to the argmax."""
    n, c, oh, ow = dy.shape
    dwin = np.zeros((n, c, oh, ow, 4), dtype=dy.dtype)
    np.put_along_axis(dwin, idx[..., None], dy[..., None], axis=-1)
    dwin = dwin.reshape(n, c, oh, ow, 2, 2).transpose(0, 1, 2, 4, 3, 5)
    return dwin.reshape(n, c, oh * 2, ow * 2)


def batchnorm(x: Array, scale: Array, bias: Array, mean: Array, var: Array, eps: float) -> Array:
    """ONNX BatchNormalization in inference mode over the channel axis of NCHW x."""
    shape = (1, -1, 1, 1)
    inv = scale / np.sqrt(var + eps)
    return (x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)


def softmax_xent(logits: Array, y: Array) -> tuple[float, Array]:
    """Mean cross-entropy of integer labels y and its gradient with respect to logits."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    n = logits.shape[0]
    loss = float(-np.log(p[np.arange(n), y] + 1e-12).mean())
    p[np.arange(n), y] -= 1.0
    return loss, p / n


class Adam:
    """Adam (Kingma and Ba) over a dict of parameter arrays, updated in place."""

    def __init__(self, params: dict[str, Array], lr: float) -> None:
        self.params = params
        self.lr = lr
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, grads: dict[str, Array], b1: float = 0.9, b2: float = 0.999) -> None:
        """One update with the gradients grads (same keys as the parameters)."""
        self.t += 1
        c1 = 1.0 - b1**self.t
        c2 = 1.0 - b2**self.t
        for k, g in grads.items():
            self.m[k] = b1 * self.m[k] + (1.0 - b1) * g
            self.v[k] = b2 * self.v[k] + (1.0 - b2) * g * g
            update = self.lr * (self.m[k] / c1) / (np.sqrt(self.v[k] / c2) + 1e-8)
            self.params[k] -= update.astype(self.params[k].dtype)
