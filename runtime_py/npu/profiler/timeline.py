"""A profile's timeline as a PNG picture (matplotlib, imported only here and
only when called; the Agg canvas, no pyplot, so no global backend changes)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Final

from .chrome import process_order
from .events import CATS, Flow, TraceEvent

__all__ = ["COLORS", "save_timeline_png"]

#: The color of each layer.
COLORS: Final = {
    "host": "#4C72B0",
    "driver": "#DD8452",
    "firmware": "#55A868",
    "engine": "#C44E52",
    "dma": "#8172B3",
}
_ROW_HEIGHT_IN: Final = 0.32
_MAX_ROWS: Final = 60
_MAX_DEPTH: Final = 3


def _matplotlib() -> tuple[Any, Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise RuntimeError(
            "save_timeline_png needs matplotlib, which is not installed "
            "(pip install matplotlib, or apt-get install python3-matplotlib); "
            "export_chrome_trace() works without it"
        ) from exc
    return Figure, FigureCanvasAgg, Patch


def save_timeline_png(
    events: Sequence[TraceEvent],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    flows: Sequence[Flow] = (),
) -> None:
    """Draw ``events`` into a PNG at ``path``: one row per process and thread
    (processes top down as in the Chrome trace), spans as bars and instants
    as ticks colored by layer, flows as thin lines, time in ms from the
    first event.

    Raises:
        RuntimeError: matplotlib is not installed.
        ValueError: no events.
    """
    figure_cls, canvas_cls, patch_cls = _matplotlib()
    if not events:
        raise ValueError("save_timeline_png: the profile has no events")
    rows: list[tuple[str, str]] = []
    for p in process_order(e.pid for e in events):
        threads = sorted({e.tid for e in events if e.pid == p})
        rows += [(p, t) for t in threads]
    rows = rows[:_MAX_ROWS]
    index = {r: i for i, r in enumerate(rows)}
    t0 = min(e.ts_us for e in events)
    t1 = max(e.end_us for e in events)
    span_ms = max((t1 - t0) / 1000.0, 1e-3)
    fig = figure_cls(figsize=(14, 1.2 + _ROW_HEIGHT_IN * len(rows)), dpi=110)
    canvas_cls(fig)
    ax = fig.add_subplot(1, 1, 1)
    # Per (row, nesting depth, layer): the bars; a span inside another of its
    # thread is drawn thinner on top of it.
    bars: dict[tuple[int, int, str], list[tuple[float, float]]] = {}
    ticks: dict[str, tuple[list[float], list[int]]] = {}
    open_ends: dict[int, list[tuple[float, int]]] = {}
    labels: list[tuple[float, int, int, float, str]] = []
    parents: set[int] = set()  # labels of spans with a span inside: not drawn
    for e in sorted(events, key=lambda e: (e.ts_us, -(e.dur_us or 0.0))):
        row = index.get((e.pid, e.tid))
        if row is None:
            continue
        x = (e.ts_us - t0) / 1000.0
        if e.dur_us is None:
            xs, ys = ticks.setdefault(e.cat, ([], []))
            xs.append(x)
            ys.append(row)
            continue
        stack = open_ends.setdefault(row, [])
        while stack and stack[-1][0] <= e.ts_us:
            stack.pop()
        if stack:
            parents.add(stack[-1][1])
        depth = min(len(stack), _MAX_DEPTH)
        stack.append((e.end_us, len(labels)))
        # A span too short to see gets a minimum width of 1/2000 of the axis.
        width = max(e.dur_us / 1000.0, span_ms / 2000)
        bars.setdefault((row, depth, e.cat), []).append((x, width))
        labels.append((x, row, depth, width, e.name))
    for (row, depth, cat), segs in sorted(bars.items(), key=lambda kv: kv[0][1]):
        height = 0.7 * (1 - depth / (_MAX_DEPTH + 1))
        ax.broken_barh(
            segs,
            (row - height / 2, height),
            facecolors=COLORS.get(cat, "grey"),
            edgecolor="white",
            linewidth=0.3,
            alpha=1.0 if depth == 0 else 0.75,
        )
    for i, (x, row, _depth, width, name) in enumerate(labels):
        if i in parents or width < span_ms / 25:
            continue
        chars = max(1, int(width / span_ms * 160))
        text = name if len(name) <= chars else name[: max(1, chars - 1)] + "~"
        ax.text(x + width / 2, row, text, ha="center", va="center", fontsize=5.5, color="white")
    for cat, (xs, ys) in ticks.items():
        lo = [y - 0.4 for y in ys]
        hi = [y + 0.4 for y in ys]
        ax.vlines(xs, lo, hi, colors=COLORS.get(cat, "grey"), linewidth=0.6)
    for f in flows:
        a, b = index.get((f.src.pid, f.src.tid)), index.get((f.dst.pid, f.dst.tid))
        if a is None or b is None:
            continue
        ax.plot(
            [(f.src.ts_us - t0) / 1000.0, (f.dst.ts_us - t0) / 1000.0],
            [a, b],
            color="black",
            linewidth=0.3,
            alpha=0.35,
        )
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{p} / {t}" for p, t in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, span_ms * 1.01)
    ax.set_xlabel("ms")
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    present = {e.cat for e in events}
    handles = [patch_cls(color=COLORS[c], label=c) for c in CATS if c in present]
    ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=len(handles))
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(os.fspath(path))
