"""The profiler's event model: one :class:`TraceEvent` per span or instant, and
:class:`Flow` arrows between events of different layers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["CATS", "Flow", "TraceEvent", "device_process", "layer_of_process"]

#: The layers, top down; every event's ``cat`` is one of them.
CATS: Final = ("host", "driver", "firmware", "engine", "dma")
#: Device-side layers: ``"<device> <layer>"`` names their process (``"npu0 engine"``).
DEVICE_CATS: Final = ("firmware", "engine", "dma")


def device_process(device: str, cat: str) -> str:
    """The process of a device's layer: ``device_process("npu0", "engine") == "npu0 engine"``."""
    return f"{device} {cat}"


def layer_of_process(process: str) -> str:
    """The layer (a :data:`CATS` entry) whose events a process holds."""
    last = process.rsplit(" ", 1)[-1]
    return last if last in CATS else "host"


@dataclass(frozen=True, eq=False, slots=True)
class TraceEvent:
    """One event of a profile.

    Attributes:
        name: what happened (``"Device.submit"``, ``"ioctl SUBMIT"``,
            ``"CONV2D"``, ``"tile"``, ``"dma read"``, an ONNX node's name...).
        cat: its layer, one of :data:`CATS`.
        ts_us: start, in microseconds of ``CLOCK_MONOTONIC`` (the host's
            ``time.monotonic()``; device times are mapped onto it).
        dur_us: length in microseconds; None for an instant.
        pid: the process it belongs to, by name: ``"host"``, ``"driver"``,
            ``"npu0 firmware"``, ``"npu0 engine"``, ``"npu0 dma"``.
        tid: the thread, by name: a Python thread's name, ``"queue 0"``,
            ``"core 1"``, ``"command processor"``, a kernel task ``"python3-123"``.
        args: details (``queue``, ``fences``/``fence``, ``core``, ``op_type``...).
    """

    name: str
    cat: str
    ts_us: float
    dur_us: float | None
    pid: str
    tid: str
    args: Mapping[str, Any] = field(default_factory=dict)

    @property
    def instant(self) -> bool:
        """True for an instant (no duration)."""
        return self.dur_us is None

    @property
    def end_us(self) -> float:
        """The end (``ts_us`` for an instant)."""
        return self.ts_us + (self.dur_us or 0.0)


@dataclass(frozen=True, eq=False, slots=True)
class Flow:
    """An arrow from ``src`` (a host call) to ``dst`` (its driver or device
    counterpart of the same queue and fence)."""

    id: int
    src: TraceEvent
    dst: TraceEvent
