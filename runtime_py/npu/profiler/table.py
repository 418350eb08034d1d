"""``key_averages()``: a profile's spans grouped by name, and their table.

Like ``torch.profiler``'s: one row per name with the number of calls and
the total and average time, here split into host time (spans of the
``host`` and ``driver`` layers: CPU time in the process and the kernel)
and device time (``engine`` and ``dma`` spans: the device's own
timestamps, mapped to the host clock), plus the ONNX op type of a model's
nodes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from .events import TraceEvent

__all__ = ["SORT_KEYS", "KeyAverage", "KeyAverages", "key_averages"]

HOST_CATS: Final = frozenset({"host", "driver"})
DEVICE_CATS: Final = frozenset({"engine", "dma"})

#: ``table(sort_by=...)`` keys, and the torch names they also answer to.
SORT_KEYS: Final = {
    "device_time_total": "device_time_total_us",
    "device_time": "device_time_avg_us",
    "cuda_time_total": "device_time_total_us",
    "host_time_total": "host_time_total_us",
    "host_time": "host_time_avg_us",
    "cpu_time_total": "host_time_total_us",
    "cpu_time": "host_time_avg_us",
    "count": "count",
    "calls": "count",
}


@dataclass
class KeyAverage:
    """The spans of one name.

    Attributes:
        key: the name.
        cat: the layer of its spans (the first seen).
        op_type: the ONNX op type of a model node ("" otherwise).
        count: how many spans.
        host_time_total_us: their summed length if host or driver spans.
        device_time_total_us: their summed length if engine or dma spans.
        compute_bound, memory_bound: how many of its device commands the
            chip timing model found compute-bound and memory-bound.
    """

    key: str
    cat: str
    op_type: str = ""
    count: int = 0
    host_time_total_us: float = 0.0
    device_time_total_us: float = 0.0
    compute_bound: int = 0
    memory_bound: int = 0

    @property
    def bound(self) -> str:
        """The roofline of its commands under a chip timing model: ``"compute"``,
        ``"memory"``, ``"mixed C/M"`` (how many of each), or "" (not modelled)."""
        if self.compute_bound and self.memory_bound:
            return f"mixed {self.compute_bound}/{self.memory_bound}"
        if self.compute_bound:
            return "compute"
        return "memory" if self.memory_bound else ""

    @property
    def host_time_avg_us(self) -> float:
        """Host time per call."""
        return self.host_time_total_us / self.count if self.count else 0.0

    @property
    def device_time_avg_us(self) -> float:
        """Device time per call."""
        return self.device_time_total_us / self.count if self.count else 0.0


def _fmt(us: float) -> str:
    if us == 0:
        return "0.000us"
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


class KeyAverages(list[KeyAverage]):
    """The rows of :func:`key_averages` (a list), printable with :meth:`table`.

    Attributes:
        host_time_us: how long some host span was open (their union: nested
            calls count once).
        device_time_us: how long some engine span was open (the device busy).
    """

    host_time_us: float = 0.0
    device_time_us: float = 0.0

    def table(self, sort_by: str | None = "device_time_total", row_limit: int = 100) -> str:
        """The rows as a text table, like torch's ``key_averages().table()``.

        Args:
            sort_by: a :data:`SORT_KEYS` key (descending), ``"name"``, or None
                (first seen first).
            row_limit: at most this many rows (<= 0: all).

        Raises:
            ValueError: an unknown ``sort_by``.
        """
        rows = list(self)
        if sort_by == "name":
            rows.sort(key=lambda r: r.key)
        elif sort_by is not None:
            attr = SORT_KEYS.get(sort_by)
            if attr is None:
                raise ValueError(
                    f"table: sort_by={sort_by!r}; choose from {sorted(SORT_KEYS)} or 'name'"
                )
            rows.sort(key=lambda r: float(getattr(r, attr)), reverse=True)
        if row_limit > 0:
            rows = rows[:row_limit]
        heads: tuple[str, ...] = (
            "Name",
            "Layer",
            "Op type",
            "# of Calls",
            "Host total",
            "Host avg",
            "Device total",
            "Device avg",
        )
        roofline = any(r.bound for r in rows)
        if roofline:
            heads = (*heads, "Bound")
        cells = [
            (
                r.key,
                r.cat,
                r.op_type,
                str(r.count),
                _fmt(r.host_time_total_us),
                _fmt(r.host_time_avg_us),
                _fmt(r.device_time_total_us),
                _fmt(r.device_time_avg_us),
                *((r.bound,) if roofline else ()),
            )
            for r in rows
        ]
        widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(heads)]
        widths[0] = min(widths[0], 60)
        sep = "  ".join("-" * w for w in widths)

        def line(values: Iterable[str]) -> str:
            parts = []
            for i, (v, w) in enumerate(zip(values, widths, strict=True)):
                v = v if len(v) <= w else v[: w - 3] + "..."
                parts.append(v.ljust(w) if i < 3 or i == 8 else v.rjust(w))
            return "  ".join(parts).rstrip()

        out = [sep, line(heads), sep, *(line(c) for c in cells), sep]
        out.append(f"Host time total: {_fmt(self.host_time_us)}")
        out.append(f"Device time total: {_fmt(self.device_time_us)}")
        return "\n".join(out) + "\n"

    def __str__(self) -> str:
        return self.table()


def key_averages(events: Iterable[TraceEvent]) -> KeyAverages:
    """The spans of ``events`` grouped by name, in order of first appearance.

    Instants are not counted. Spans of the host and driver layers add host
    time, engine and dma spans device time; an ONNX node's spans (args
    ``op_type``) name its op type.
    """
    rows: dict[str, KeyAverage] = {}
    host: list[tuple[float, float]] = []
    device: list[tuple[float, float]] = []
    for e in events:
        if e.dur_us is not None and e.cat == "host":
            host.append((e.ts_us, e.end_us))
        elif e.dur_us is not None and e.cat == "engine":
            device.append((e.ts_us, e.end_us))
        if e.dur_us is None or e.cat == "firmware":
            continue
        row = rows.get(e.name)
        if row is None:
            row = rows[e.name] = KeyAverage(e.name, e.cat)
        op_type = e.args.get("op_type")
        if isinstance(op_type, str) and not row.op_type:
            row.op_type = op_type
        row.count += 1
        if e.cat in HOST_CATS:
            row.host_time_total_us += e.dur_us
        elif e.cat in DEVICE_CATS:
            row.device_time_total_us += e.dur_us
        bound = e.args.get("bound")
        if bound == "compute":
            row.compute_bound += 1
        elif bound == "memory":
            row.memory_bound += 1
    out = KeyAverages(rows.values())
    out.host_time_us = _union(host)
    out.device_time_us = _union(device)
    return out


def _union(spans: list[tuple[float, float]]) -> float:
    """The length of the union of intervals."""
    total = 0.0
    end = float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
