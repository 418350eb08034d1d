"""Chrome trace / Perfetto JSON, as PyTorch's profiler writes it.

``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``:

- ``ph: "M"`` metadata naming each process (``process_name``, with a
  ``process_sort_index``: host, driver, then each device's firmware,
  engine and dma) and each thread (``thread_name``, ``thread_sort_index``);
- ``ph: "X"`` spans with ``ts`` and ``dur`` in microseconds;
- ``ph: "i"`` instants (``s: "t"``, thread scope);
- ``ph: "s"`` / ``ph: "f"`` flow arrows (same ``id``, ``name`` and ``cat``;
  each 1 ns into its span, so that the span and not a parent beginning with
  it encloses it; ``bp: "e"`` binds the end to the enclosing slice);

every event's ``cat`` is its layer (``host``, ``driver``, ``firmware``,
``engine``, ``dma``; a process's metadata carries its layer too, a flow its
source's). ``otherData.counters`` holds the device counters' changes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .counters import DeviceCounters
from .events import CATS, DEVICE_CATS, Flow, TraceEvent, layer_of_process

__all__ = ["chrome_trace", "load_chrome_trace", "process_order", "write_chrome_trace"]

_NUM = re.compile(r"(\d+)")


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in _NUM.split(name)]


def process_order(processes: Iterable[str]) -> list[str]:
    """Processes top down: ``host``, ``driver``, then per device (by name) its
    firmware, engine and dma, then any other."""

    def key(p: str) -> tuple[int, list[Any], int]:
        if p == "host":
            return (0, [], 0)
        if p == "driver":
            return (1, [], 0)
        dev, _, layer = p.rpartition(" ")
        if dev and layer in DEVICE_CATS:
            return (2, _natural(dev), DEVICE_CATS.index(layer))
        return (3, _natural(p), 0)

    return sorted(set(processes), key=key)


def _thread_key(name: str) -> tuple[int, list[Any]]:
    if name == "MainThread":
        return (0, [])
    return (1, _natural(name))


def _json_value(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_json_value(x) for x in v]
    if isinstance(v, list):
        return [_json_value(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def _ts(us: float) -> float:
    return round(us, 3)


def _inside(e: TraceEvent) -> float:
    """A flow end's time: 1 ns into a span (so that the span, not its parent
    beginning at the same time, encloses it), an instant's own time."""
    if e.dur_us is None or e.dur_us < 0.002:
        return _ts(e.ts_us)
    return _ts(e.ts_us + 0.001)


def chrome_trace(
    events: Sequence[TraceEvent],
    flows: Sequence[Flow] = (),
    counters: Mapping[str, DeviceCounters] | None = None,
) -> dict[str, Any]:
    """The Chrome trace object of ``events`` and ``flows`` (see the module doc)."""
    procs = process_order(e.pid for e in events)
    pids = {p: i + 1 for i, p in enumerate(procs)}
    threads: dict[str, set[str]] = {p: set() for p in procs}
    for e in events:
        threads[e.pid].add(e.tid)
    tids: dict[tuple[str, str], int] = {}
    out: list[dict[str, Any]] = []
    for p in procs:
        pid = pids[p]
        cat = layer_of_process(p)
        out.append(
            {
                "name": "process_name",
                "ph": "M",
                "cat": cat,
                "pid": pid,
                "tid": 0,
                "args": {"name": p},
            }
        )
        out.append(
            {
                "name": "process_sort_index",
                "ph": "M",
                "cat": cat,
                "pid": pid,
                "tid": 0,
                "args": {"sort_index": pid},
            }
        )
        for i, t in enumerate(sorted(threads[p], key=_thread_key)):
            tid = tids[(p, t)] = i + 1
            out.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "cat": cat,
                    "pid": pid,
                    "tid": tid,
                    "args": {"name": t},
                }
            )
            out.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "cat": cat,
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
    for e in events:
        ev: dict[str, Any] = {
            "name": e.name,
            "cat": e.cat,
            "ph": "i" if e.dur_us is None else "X",
            "ts": _ts(e.ts_us),
            "pid": pids[e.pid],
            "tid": tids[(e.pid, e.tid)],
            "args": _json_value(dict(e.args)),
        }
        if e.dur_us is None:
            ev["s"] = "t"
        else:
            ev["dur"] = _ts(e.dur_us)
        out.append(ev)
    for f in flows:
        common = {"name": f"{f.src.cat} to {f.dst.cat}", "cat": f.src.cat, "id": f.id}
        out.append(
            {
                **common,
                "ph": "s",
                "ts": _inside(f.src),
                "pid": pids[f.src.pid],
                "tid": tids[(f.src.pid, f.src.tid)],
            }
        )
        out.append(
            {
                **common,
                "ph": "f",
                "bp": "e",
                "ts": _inside(f.dst),
                "pid": pids[f.dst.pid],
                "tid": tids[(f.dst.pid, f.dst.tid)],
            }
        )
    other: dict[str, Any] = {"clock": "CLOCK_MONOTONIC", "layers": list(CATS)}
    if counters:
        other["counters"] = {name: c.to_dict() for name, c in sorted(counters.items())}
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(
    path: str | os.PathLike[str],
    events: Sequence[TraceEvent],
    flows: Sequence[Flow] = (),
    counters: Mapping[str, DeviceCounters] | None = None,
) -> None:
    """Write :func:`chrome_trace` of the arguments to ``path`` as JSON."""
    with open(path, "w") as f:
        json.dump(chrome_trace(events, flows, counters), f, separators=(",", ":"))


def _enclosing(events: Sequence[TraceEvent], ts: float) -> TraceEvent | None:
    """The innermost event of a thread at ``ts`` (latest start at or before it
    whose end is not before it), or None."""
    best: TraceEvent | None = None
    for e in events:
        if e.ts_us <= ts <= e.end_us + 1e-6 and (best is None or e.ts_us >= best.ts_us):
            best = e
    return best


def load_chrome_trace(
    path: str | os.PathLike[str],
) -> tuple[list[TraceEvent], list[Flow], dict[str, DeviceCounters]]:
    """Read a trace :func:`write_chrome_trace` wrote: its events, flows and counters.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a Chrome trace JSON object.
    """
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents list)")
    procs: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    raw = data["traceEvents"]
    for ev in raw:
        if ev.get("ph") == "M" and ev.get("name") == "process_name":
            procs[ev["pid"]] = ev["args"]["name"]
        elif ev.get("ph") == "M" and ev.get("name") == "thread_name":
            threads[(ev["pid"], ev["tid"])] = ev["args"]["name"]
    events: list[TraceEvent] = []
    by_thread: dict[tuple[int, int], list[TraceEvent]] = {}
    for ev in raw:
        ph = ev.get("ph")
        if ph not in ("X", "i"):
            continue
        pid, tid = ev["pid"], ev["tid"]
        e = TraceEvent(
            ev["name"],
            ev.get("cat", "host"),
            float(ev["ts"]),
            float(ev["dur"]) if ph == "X" else None,
            procs.get(pid, str(pid)),
            threads.get((pid, tid), str(tid)),
            ev.get("args", {}),
        )
        events.append(e)
        by_thread.setdefault((pid, tid), []).append(e)
    starts: dict[int, TraceEvent] = {}
    flows: list[Flow] = []
    for ev in raw:
        ph = ev.get("ph")
        if ph not in ("s", "f"):
            continue
        found = _enclosing(by_thread.get((ev["pid"], ev["tid"]), []), float(ev["ts"]))
        if found is None:
            continue
        if ph == "s":
            starts[ev["id"]] = found
        elif ev["id"] in starts:
            flows.append(Flow(ev["id"], starts[ev["id"]], found))
    counters: dict[str, DeviceCounters] = {}
    for name, c in (data.get("otherData", {}).get("counters") or {}).items():
        counters[name] = DeviceCounters(
            int(c.get("time_ns", 0)),
            {int(k): dict(v) for k, v in c.get("queues", {}).items()},
            {int(k): dict(v) for k, v in c.get("cores", {}).items()},
        )
    events.sort(key=lambda e: e.ts_us)
    return events, flows, counters
