"""Pad and Resize as per-axis index maps: what the NPU provider copies where.

Both ops are separable: along each axis an output index reads one input
index (Pad, nearest Resize) or a weighted pair (linear Resize). This module
reads a node's attributes and constant inputs into those maps, following
the ONNX specification, and says why when the NPU cannot take a node:
:func:`pad_spec` and :func:`resize_maps` return a reason string then. The
NPU provider turns the maps into strided CONVERT copies (and, for linear
Resize, weighted sums); :func:`block_pattern` finds the maps a single
strided view can express.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from .._abi import NPU_MAX_RANK
from .graph import Graph, Node

__all__ = [
    "MAX_COPIES",
    "PAD_MODES",
    "AxisMap",
    "LinearPiece",
    "PadSpec",
    "block_pattern",
    "linear_pieces",
    "merge_dims",
    "pad_spec",
    "resize_dims",
    "resize_maps",
]

#: A copy's dimension: ``(size, source stride, destination stride)`` in elements.
Dim = tuple[int, int, int]

#: The most device ops one Pad or Resize may take on the NPU (reflect rows,
#: copies of a view past the device's rank, linear pieces).
MAX_COPIES: Final = 256
#: Pad modes the NPU provider plans.
PAD_MODES: Final = frozenset({"constant", "edge", "reflect", "wrap"})
_COORD_MODES: Final = frozenset({"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"})
_NEAREST_MODES: Final = frozenset({"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})


@dataclass(frozen=True)
class PadSpec:
    """A Pad node resolved: per-axis pads before and after (>= 0), mode and fill value."""

    mode: str
    begin: tuple[int, ...]
    end: tuple[int, ...]
    value: float


def _ints(graph: Graph, node: Node, i: int) -> list[int] | None:
    c = graph.const(node.input(i)) if node.input(i) else None
    return None if c is None else [int(v) for v in np.asarray(c).reshape(-1)]


def pad_spec(node: Node, graph: Graph, shape: Sequence[int]) -> PadSpec | str:
    """The :class:`PadSpec` of a Pad over an input of ``shape``, or why the NPU cannot run it."""
    a = node.attrs
    mode = a.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in PAD_MODES:
        return f"Pad mode {mode!r}"
    r = len(shape)
    value = 0.0
    if graph.opset < 11:
        pads = [int(p) for p in a.get("pads", [])]
        value = float(a.get("value", 0.0))
        axes = list(range(r))
    else:
        got = _ints(graph, node, 1)
        if got is None:
            return "Pad with non-constant pads"
        pads = got
        if node.input(2):
            c = graph.const(node.input(2))
            if c is None:
                return "Pad with a non-constant value"
            value = float(np.asarray(c).reshape(-1)[0]) if np.asarray(c).size else 0.0
        axes_in = _ints(graph, node, 3) if node.input(3) else list(range(r))
        if axes_in is None:
            return "Pad with non-constant axes"
        axes = [x + r if x < 0 else x for x in axes_in]
    if len(pads) != 2 * len(axes) or any(not 0 <= x < r for x in axes):
        return f"Pad with {len(pads)} pads for axes {axes}"
    begin, end = [0] * r, [0] * r
    for k, ax in enumerate(axes):
        begin[ax], end[ax] = pads[k], pads[k + len(axes)]
    if min(begin + end) < 0:
        return "Pad with negative pads (crops)"
    for d, n in enumerate(shape):
        if mode == "reflect" and max(begin[d], end[d]) > n - 1:
            return f"reflect pads {begin[d]}, {end[d]} reach past axis {d} of size {n}"
        if mode == "wrap" and max(begin[d], end[d]) > n:
            return f"wrap pads {begin[d]}, {end[d]} exceed axis {d} of size {n}"
    return PadSpec(mode, tuple(begin), tuple(end), value)


@dataclass(frozen=True)
class AxisMap:
    """One axis of a Resize: output index ``o`` reads ``(1 - w1[o]) * x[i0[o]] + w1[o] * x[i1[o]]``.

    For nearest, ``i1 == i0`` and ``w1`` is 0.
    """

    size_in: int
    i0: tuple[int, ...]
    i1: tuple[int, ...]
    w1: tuple[float, ...]

    @property
    def size_out(self) -> int:
        """Output size along the axis."""
        return len(self.i0)

    @property
    def identity(self) -> bool:
        """Whether the axis is copied unchanged."""
        return (
            self.size_out == self.size_in
            and self.i0 == tuple(range(self.size_in))
            and not any(self.w1)
        )


def _round_nearest(x: float, mode: str) -> int:
    if mode == "floor":
        return math.floor(x)
    if mode == "ceil":
        return math.ceil(x)
    if x - math.floor(x) == 0.5:
        return math.floor(x) if mode == "round_prefer_floor" else math.ceil(x)
    return math.floor(x + 0.5)


def _axis_map(
    n_in: int, n_out: int, scale: float, coord: str, linear: bool, nearest: str
) -> AxisMap:
    i0: list[int] = []
    i1: list[int] = []
    w1: list[float] = []
    for o in range(n_out):
        if coord == "align_corners":
            x = o * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        elif coord == "asymmetric":
            x = o / scale
        elif coord == "pytorch_half_pixel" and n_out == 1:
            x = 0.0
        else:  # half_pixel, pytorch_half_pixel
            x = (o + 0.5) / scale - 0.5
        if linear:
            x = min(max(x, 0.0), n_in - 1.0)
            lo = min(math.floor(x), n_in - 1)
            hi = min(lo + 1, n_in - 1)
            frac = x - lo
            i0.append(lo)
            i1.append(hi if frac else lo)
            w1.append(frac if hi != lo else 0.0)
        else:
            k = min(max(_round_nearest(x, nearest), 0), n_in - 1)
            i0.append(k)
            i1.append(k)
            w1.append(0.0)
    return AxisMap(n_in, tuple(i0), tuple(i1), tuple(w1))


def _floats(graph: Graph, node: Node, i: int) -> list[float] | None:
    c = graph.const(node.input(i)) if node.input(i) else None
    return None if c is None else [float(v) for v in np.asarray(c).reshape(-1)]


def resize_maps(node: Node, graph: Graph, shape: Sequence[int]) -> list[AxisMap] | str:
    """Per-axis maps of a Resize (opset 11+) over an input of ``shape``, or why not.

    The NPU provider takes modes ``nearest`` and ``linear`` with the
    coordinate modes half_pixel, pytorch_half_pixel, align_corners and
    asymmetric, static scales or sizes, and the ``stretch`` aspect policy.
    """
    a = node.attrs

    def attr(name: str, default: str) -> str:
        v = a.get(name, default)
        return v.decode() if isinstance(v, bytes) else str(v)

    if graph.opset < 11:
        return "Resize before opset 11 (its rounding differs between runtimes)"
    mode, coord = attr("mode", "nearest"), attr("coordinate_transformation_mode", "half_pixel")
    nearest = attr("nearest_mode", "round_prefer_floor")
    if mode not in ("nearest", "linear"):
        return f"Resize mode {mode!r}"
    if coord not in _COORD_MODES:
        return f"Resize coordinate mode {coord!r}"
    if mode == "nearest" and nearest not in _NEAREST_MODES:
        return f"Resize nearest mode {nearest!r}"
    if int(a.get("antialias", 0)) or attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        return "Resize with antialias or a keep_aspect_ratio_policy"
    r = len(shape)
    axes = [int(x) + r if int(x) < 0 else int(x) for x in a.get("axes", range(r))]
    scales = _floats(graph, node, 2) if node.input(2) else None
    sizes = _ints(graph, node, 3) if node.input(3) else None
    if (node.input(2) and scales is None) or (node.input(3) and sizes is None):
        return "Resize with non-constant scales or sizes"
    if scales:
        if len(scales) != len(axes) or not all(s > 0 and math.isfinite(s) for s in scales):
            return f"Resize scales {scales}"
        per = dict(zip(axes, scales, strict=True))
        outs = {d: math.floor(shape[d] * per[d]) for d in axes}
    elif sizes:
        if len(sizes) != len(axes):
            return f"Resize sizes {sizes}"
        outs = dict(zip(axes, sizes, strict=True))
        per = {d: outs[d] / shape[d] for d in axes}
    else:
        return "Resize without scales or sizes"
    maps = []
    for d, n in enumerate(shape):
        if d not in per:
            maps.append(AxisMap(n, tuple(range(n)), tuple(range(n)), (0.0,) * n))
            continue
        if outs[d] < 1:
            return f"Resize to an empty axis {d}"
        maps.append(_axis_map(n, outs[d], per[d], coord, mode == "linear", nearest))
    return maps


def block_pattern(index: Sequence[int]) -> tuple[int, int, int] | None:
    """``(k, s, c)`` with ``index[o] == c + (o // k) * s`` for every ``o``, else None.

    ``k`` consecutive outputs repeat one input (an integer upscale), and
    blocks step ``s`` inputs apart (an integer downscale): one strided view.
    """
    n = len(index)
    c = index[0]
    k = 1
    while k < n and index[k] == c:
        k += 1
    s = index[k] - c if k < n else 1
    if s < 0 or any(index[o] != c + (o // k) * s for o in range(n)):
        return None
    return k, s, c


def _strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def resize_dims(maps: Sequence[AxisMap]) -> tuple[int, list[Dim]] | None:
    """A nearest Resize as one strided copy: ``(source offset, dims)``, or None.

    Each axis must be a :func:`block_pattern` whose repeat divides the
    output size; it becomes the dims ``(out / k, s, k * out_stride)`` and
    ``(k, 0, out_stride)``. The destination comes out row-major. None too
    when the view needs more than :data:`MAX_COPIES` copies (past the
    device's rank).
    """
    xs = _strides([m.size_in for m in maps])
    os_ = _strides([m.size_out for m in maps])
    start = 0
    dims: list[Dim] = []
    for m, xst, ost in zip(maps, xs, os_, strict=True):
        pat = block_pattern(m.i0)
        if pat is None or any(m.w1) or m.size_out % pat[0]:
            return None
        k, step, c = pat
        start += c * xst
        dims += [(m.size_out // k, step * xst, k * ost), (k, 0, ost)]
    outer, _ = merge_dims(dims, NPU_MAX_RANK)
    if math.prod(d[0] for d in outer) > MAX_COPIES:
        return None
    return start, dims


def merge_dims(dims: Sequence[Dim], max_rank: int) -> tuple[list[Dim], list[Dim]]:
    """Merge adjacent dims that step alike; split off the outer ones past ``max_rank``.

    Size-1 dims drop out. Returns ``(outer, inner)``: ``inner`` (at most
    ``max_rank``, at least one) is one copy's view; ``outer`` indexes the
    copies (their count is the product of its sizes).
    """
    merged: list[Dim] = []
    for size, ss, ds in dims:
        if size == 1:
            continue
        if merged and merged[-1][1] == size * ss and merged[-1][2] == size * ds:
            merged[-1] = (merged[-1][0] * size, ss, ds)
        else:
            merged.append((size, ss, ds))
    merged = merged or [(1, 1, 1)]
    return merged[:-max_rank], merged[-max_rank:]


#: The most phases a linear Resize axis is split into (the period of its map).
MAX_PHASES: Final = 16
_W_TOL: Final = 1e-9


@dataclass(frozen=True)
class LinearPiece:
    """Outputs ``out0 + j * out_step`` (``0 <= j < count``) of one axis of a linear Resize.

    Output ``out0 + j * out_step`` is ``(1 - w1) * x[in0 + j * in_step] +
    w1 * x[in1 + j * in_step]``; a piece with ``w1 == 0`` is a plain copy.
    """

    out0: int
    out_step: int
    count: int
    in0: int
    in1: int
    in_step: int
    w1: float


def _periodic(m: AxisMap, p: int) -> tuple[int, int, int] | None:
    """The longest run ``[lo, hi)`` of outputs that repeats with period ``p``: (lo, hi, advance)."""
    n = m.size_out
    if n < 2 * p:
        return None
    mid = (n - p) // 2
    q = m.i0[mid + p] - m.i0[mid]
    good = [
        m.i0[o + p] == m.i0[o] + q
        and m.i1[o + p] == m.i1[o] + q
        and abs(m.w1[o + p] - m.w1[o]) < _W_TOL
        for o in range(n - p)
    ]
    best = (0, 0)
    start = None
    for o, ok in enumerate([*good, False]):
        if ok and start is None:
            start = o
        elif not ok and start is not None:
            if o - start > best[1] - best[0]:
                best = (start, o)
            start = None
    lo, end = best
    if end - lo < p:
        return None
    return lo, end + p, q


def linear_pieces(m: AxisMap) -> list[LinearPiece]:
    """One axis of a linear Resize as few strided pieces as the map allows.

    The interior of the axis repeats with some period P (P outputs advance
    Q inputs, e.g. P = 2, Q = 1 for 2x upsampling): one piece per phase.
    The outputs outside it (where the taps clamp at the borders) are one
    piece each. The period with the fewest pieces wins.
    """
    n = m.size_out
    single = [LinearPiece(o, 1, 1, m.i0[o], m.i1[o], 1, m.w1[o]) for o in range(n)]
    best = single
    for p in range(1, min(MAX_PHASES, n // 2) + 1):
        run = _periodic(m, p)
        if run is None:
            continue
        lo, hi, q = run
        pieces = [single[o] for o in range(lo)]
        for r in range(p):
            o0 = lo + r
            count = len(range(o0, hi, p))
            pieces.append(LinearPiece(o0, p, count, m.i0[o0], m.i1[o0], q, m.w1[o0]))
        pieces += [single[o] for o in range(hi, n)]
        if len(pieces) < len(best):
            best = pieces
    return best
