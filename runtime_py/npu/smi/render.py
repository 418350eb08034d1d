"""What ``npu-smi`` prints: tables for people, JSON for programs.

The JSON objects have stable keys, documented in ``docs/npu-smi.md``; a
value the driver does not provide is ``null``. ``SCHEMA`` is bumped when a
key changes meaning or goes away (new keys may be added at any time).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any, Final

from .debugfs import FwInfo, QueueState
from .diag import Diagnosis
from .fdinfo import ProcessInfo, Waiter
from .sysfs import DeviceInfo

SCHEMA: Final = 1

Json = dict[str, Any]


def timestamp() -> str:
    """Now, UTC, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def size(n: int | None) -> str:
    """Bytes for people: ``512B``, ``4KiB``, ``1.5MiB``; ``-`` for None."""
    if n is None:
        return "-"
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.0f}{unit}" if unit == "B" or value >= 100 else f"{value:.1f}{unit}"


def duration_ns(ns: int) -> str:
    """A duration for people: ``850us``, ``12.3ms``, ``4.56s``."""
    if ns < 1_000_000:
        return f"{ns / 1e3:.0f}us"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.1f}ms"
    return f"{ns / 1e9:.2f}s"


def percent(p: float | None) -> str:
    """``42%`` or ``N/A``."""
    return "N/A" if p is None else f"{p:.0f}%"


def _text(v: object) -> str:
    return "-" if v is None else str(v)


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    """Columns padded to their widest cell; columns in ``right`` right-aligned."""
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return [line(header), *(line(r) for r in rows)]


# --------------------------------------------------------------------------
# Devices and processes
# --------------------------------------------------------------------------


def device_json(d: DeviceInfo, util: float | None) -> Json:
    """One device as JSON (keys in docs/npu-smi.md)."""
    return {
        "index": d.ref.index,
        "node": d.ref.node,
        "pci_address": d.ref.pci_address,
        "hw_version": d.hw_version,
        "fw_version": d.fw_version,
        "driver_version": d.driver_version,
        "abi_version": d.abi_version,
        "num_queues": d.num_queues,
        "num_cores": d.num_cores,
        "memory": {
            "device_used_bytes": d.mem_device_used,
            "device_total_bytes": d.mem_device_total,
            "bo_bytes": d.bo_bytes,
            "bo_count": d.bo_count,
        },
        "utilization_percent": None if util is None else round(util, 2),
        "busy_us": d.sample.busy_us,
        "device_time_us": d.sample.device_time_us,
        "power_state": d.power_state,
        "hangs": d.hangs,
        "resets": d.recoveries,
        "op_errors": d.op_errors,
        "irq_count": d.irq_count,
    }


def process_json(p: ProcessInfo) -> Json:
    """One process row as JSON."""
    return {
        "pid": p.pid,
        "name": p.name,
        "device": p.device,
        "pci_address": p.pci_address,
        "client_ids": list(p.client_ids),
        "fds": list(p.fds),
        "memory_host_bytes": p.memory_host,
        "memory_device_bytes": p.memory_device,
        "memory_bytes": p.memory,
        "engine_ns": p.engine_ns,
    }


def status_json(
    devices: Sequence[tuple[DeviceInfo, float | None]], procs: Sequence[ProcessInfo]
) -> Json:
    """The ``npu-smi --json`` document."""
    return {
        "schema": SCHEMA,
        "timestamp": timestamp(),
        "devices": [device_json(d, u) for d, u in devices],
        "processes": [process_json(p) for p in procs],
    }


def _memory_cell(d: DeviceInfo) -> str:
    if d.mem_device_total:
        return f"{size(d.mem_device_used)} / {size(d.mem_device_total)}"
    return f"{size(d.bo_bytes)} (host BOs)"


def device_lines(devices: Sequence[tuple[DeviceInfo, float | None]]) -> list[str]:
    """The device table."""
    rows = [
        [
            str(d.ref.index),
            d.ref.pci_address,
            _text(d.hw_version),
            _text(d.fw_version),
            _text(d.driver_version),
            _memory_cell(d),
            percent(u),
            _text(d.power_state),
            _text(d.hangs),
            _text(d.recoveries),
        ]
        for d, u in devices
    ]
    header = ["NPU", "PCI address", "HW", "FW", "Driver", "Memory used/total", "Util",
              "Power", "Hangs", "Resets"]  # fmt: skip
    return table(header, rows, right={0, 5, 6, 8, 9})


def process_lines(
    procs: Sequence[ProcessInfo], engine_pct: dict[tuple[int, int | None], float] | None = None
) -> list[str]:
    """The process table (``engine_pct``: (pid, device) -> engine share, for ``top``)."""
    if not procs:
        return ["No running processes found"]
    header = ["NPU", "PID", "Name", "Clients", "Host mem", "Device mem", "Engine time"]
    if engine_pct is not None:
        header.append("Engine")
    rows = []
    for p in procs:
        row = [
            _text(p.device),
            str(p.pid),
            p.name,
            str(len(p.client_ids)),
            size(p.memory_host),
            size(p.memory_device),
            duration_ns(p.engine_ns),
        ]
        if engine_pct is not None:
            row.append(percent(engine_pct.get((p.pid, p.device))))
        rows.append(row)
    return table(header, rows, right={0, 1, 3, 4, 5, 6, 7})


def status_text(
    devices: Sequence[tuple[DeviceInfo, float | None]], procs: Sequence[ProcessInfo]
) -> str:
    """The ``npu-smi`` screen: a header line, the devices, the processes."""
    lines = [f"npu-smi  {timestamp()}", ""]
    lines += device_lines(devices)
    lines += ["", "Processes:"]
    lines += ["  " + ln for ln in process_lines(procs)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# diag
# --------------------------------------------------------------------------


def fw_json(fw: FwInfo | None, moving: bool | None) -> Json | None:
    """The firmware part of a diagnosis."""
    if fw is None:
        return None
    return {
        "state": fw.state,
        "heartbeat": fw.heartbeat,
        "heartbeat_moving": moving,
        "version": fw.version,
        "commands": fw.commands,
        "log_level": fw.log_level,
        "mailbox_error": fw.mailbox_error,
    }


def queue_state_json(q: QueueState) -> Json:
    """One ``queues`` line as JSON."""
    return {
        "queue": q.index,
        "kind": q.kind,
        "head": q.head,
        "tail": q.tail,
        "status": q.status,
        "status_names": q.status_text,
        "error": q.error,
        "done": q.done,
        "fence_mem": q.fence_mem,
        "submitted": q.submitted,
        "retired": q.retired,
        "pending_jobs": q.pending_jobs,
        "oldest_ms": q.oldest_ms,
    }


def waiter_json(w: Waiter) -> Json:
    """A thread blocked in a wait ioctl."""
    return {"pid": w.pid, "tid": w.tid, "name": w.name, "fd": w.fd, "ioctl": w.ioctl,
            "client_id": w.client_id}  # fmt: skip


def diagnosis_json(d: Diagnosis) -> Json:
    """One device's diagnosis as JSON (keys in docs/npu-smi.md)."""
    info = d.info
    return {
        "device": d.device,
        "pci_address": d.pci_address,
        "verdict": d.verdict.value,
        "stuck": d.stuck,
        "explanation": d.explanation,
        "queues": [
            {
                "queue": v.queue,
                "kind": v.kind,
                "verdict": v.verdict.value,
                "explanation": v.explanation,
                "evidence": v.evidence,
            }
            for v in d.queues
        ],
        "queue_states": [queue_state_json(q) for q in d.queue_states],
        "firmware": fw_json(d.fw, d.heartbeat_moving),
        "fw_log_tail": list(d.fw_log),
        "waiters": [waiter_json(w) for w in d.waiters],
        "watchdog": d.watchdog,
        "coredump": None if d.coredump is None else dataclasses.asdict(d.coredump),
        "counters": None
        if info is None
        else {
            "hangs": info.hangs,
            "resets": info.recoveries,
            "op_errors": info.op_errors,
            "irq_count": info.irq_count,
            "fences": None if info.fences is None else list(info.fences),
        },
        "perf": None
        if d.perf is None
        else {
            "time_ns": d.perf.time_ns,
            "queues": {str(k): v for k, v in d.perf.queues.items()},
            "cores": {str(k): v for k, v in d.perf.cores.items()},
        },
        "interval_s": round(d.interval_s, 3),
        "notes": list(d.notes),
    }


def overall(diagnoses: Sequence[Diagnosis]) -> str:
    """The verdict of all devices: the first stuck one's, else the first's."""
    for d in diagnoses:
        if d.stuck:
            return d.verdict.value
    return diagnoses[0].verdict.value if diagnoses else "idle"


def diag_json(diagnoses: Sequence[Diagnosis]) -> Json:
    """The ``npu-smi diag --json`` document."""
    return {
        "schema": SCHEMA,
        "timestamp": timestamp(),
        "verdict": overall(diagnoses),
        "devices": [diagnosis_json(d) for d in diagnoses],
    }


def diagnosis_text(d: Diagnosis) -> str:
    """One device's diagnosis for people."""
    lines = [
        f"NPU {d.device} ({d.pci_address}): verdict {d.verdict.value.upper()}",
        f"  {d.explanation}",
        "",
    ]
    if d.queue_states:
        rows = [
            [
                str(q.index), q.kind, str(q.head), str(q.tail), f"{q.status:#x} {q.status_text}",
                str(q.error), str(q.done), str(q.fence_mem), _text(q.submitted),
                _text(q.retired), _text(q.pending_jobs), _text(q.oldest_ms),
            ]
            for q in d.queue_states
        ]  # fmt: skip
        header = ["Queue", "Kind", "Head", "Tail", "Status", "Error", "Done", "Fence mem",
                  "Submitted", "Retired", "Jobs", "Oldest ms"]  # fmt: skip
        right = {0, 2, 3, 6, 7, 8, 9, 10, 11}
        lines += ["Queues:"] + ["  " + ln for ln in table(header, rows, right)]
        lines.append("")
    for v in d.queues:
        lines.append(f"Queue {v.queue} ({v.kind}): {v.verdict.value} - {v.explanation}")
    if d.queues:
        lines.append("")
    if d.fw is not None:
        moving = {True: "advancing", False: "standing still", None: "not compared"}
        lines.append(
            f"Firmware: {d.fw.state or '?'}, version {_text(d.fw.version)}, heartbeat "
            f"{_text(d.fw.heartbeat)} ({moving[d.heartbeat_moving]})"
            + (f", mailbox {d.fw.mailbox_error}" if d.fw.mailbox_error is not None else "")
        )
    for w in d.waiters:
        lines.append(
            f"Waiter: pid {w.pid} ({w.name}) thread {w.tid} in {w.ioctl} on fd {w.fd} "
            f"(client {w.client_id})"
        )
    if d.info is not None:
        i = d.info
        lines.append(
            f"Counters: hangs {_text(i.hangs)}, resets {_text(i.recoveries)}, op_errors "
            f"{_text(i.op_errors)}, irqs {_text(i.irq_count)}"
            + (f", fences {i.fences[0]} submitted / {i.fences[1]} retired" if i.fences else "")
        )
    if d.watchdog is not None:
        lines.append(f"Watchdog: {'running' if d.watchdog else 'PAUSED'}")
    c = d.coredump
    if c is None:
        lines.append("Coredump: none pending")
    elif c.error:
        lines.append(f"Coredump: {c.path}: {c.error}")
    else:
        lines.append(
            f"Coredump: {c.path}: {c.reason}, queue {_text(c.queue)}, fence {_text(c.fence)}, "
            f"client {_text(c.client)}, at {c.timestamp_s:.3f} s (python3 -m npu.coredump {c.path})"
        )
    for note in d.notes:
        lines.append(f"Note: {note}")
    if d.fw_log:
        lines += ["", f"Firmware log (last {len(d.fw_log)} lines):"]
        lines += [f"  {ln}" for ln in d.fw_log]
    return "\n".join(lines) + "\n"
