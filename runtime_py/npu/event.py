"""Events: markers in the device's op queue, for waiting and for timing.

The model is CUDA's (``torch.cuda.Event``): :meth:`Event.record` puts a
marker after everything submitted so far; :meth:`Event.query` says whether
the device has passed it; :meth:`Event.synchronize` waits for it; and
:meth:`Event.elapsed_time` gives the device time between two markers in
milliseconds, from the device clock in the completion records
(``FENCE_INFO``), so host and Python overheads are not counted.

All tensor work of a device runs on its queue 0, in order, so a marker is
reached once everything recorded before it is done. An event made with
``enable_timing=True`` records a NOP as its marker (the device stamps the
time when it reaches the NOP); without it, recording only remembers the last
fence, which costs nothing.
"""

from __future__ import annotations

import errno

from . import ops
from .device import DEFAULT_TIMEOUT_S, Device, default_device
from .errors import NpuDeviceError, NpuError, NpuTimeoutError

__all__ = ["Event"]

_QUEUE = 0


class Event:
    """A marker in a device's queue.

    Args:
        device: the device (default: the default device).
        enable_timing: record a NOP the device timestamps, for
            :meth:`elapsed_time`.
    """

    def __init__(self, device: Device | None = None, enable_timing: bool = False) -> None:
        self.device = device if device is not None else default_device()
        self.enable_timing = enable_timing
        self._fence: int | None = None

    @property
    def fence(self) -> int | None:
        """The fence of the marker, or None before :meth:`record`."""
        return self._fence

    def record(self) -> None:
        """Put the marker after everything submitted to the device so far.

        Raises:
            RuntimeError: while an :class:`npu.Graph` captures.
            NpuError: the marker NOP was refused.
        """
        if self.enable_timing:
            self._fence = self.device.submit([ops.nop()], _QUEUE)
        else:
            if self.device._capturing is not None:
                raise RuntimeError("Event.record: not while a graph is capturing")
            self._fence = self.device.submitted_fences().get(_QUEUE, 0)

    def query(self) -> bool:
        """True once the device has passed the marker (or it was never recorded).

        Raises:
            NpuDeviceError: an op before the marker failed (reported once).
        """
        if self._fence is None or self._fence == 0:
            return True
        if self.device.completed(_QUEUE, self._fence):
            return True
        try:
            self.device.wait(self._fence, timeout_s=0, queue=_QUEUE)
        except NpuTimeoutError:
            return False
        return True

    def synchronize(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Wait until the device has passed the marker.

        Raises:
            NpuDeviceError: an op before the marker failed (reported once).
            NpuTimeoutError: not within ``timeout_s``.
        """
        if self._fence:
            self.device.wait(self._fence, timeout_s=timeout_s, queue=_QUEUE)

    def elapsed_time(self, end: Event) -> float:
        """Device milliseconds from this marker to ``end``'s (both done).

        Raises:
            ValueError: either event lacks ``enable_timing``, was not
                recorded, or belongs to another device.
            RuntimeError: a marker is not reached yet (call
                :meth:`synchronize` on ``end`` first).
            NpuError: the record is gone (more than ``ring_entries`` later
                ops, or a device reset since), ``ENOENT``.
        """
        for ev in (self, end):
            if not ev.enable_timing or ev._fence is None:
                raise ValueError("elapsed_time: both events need enable_timing and a record()")
        if end.device is not self.device:
            raise ValueError("elapsed_time: the events belong to different devices")
        stamps = []
        for ev in (self, end):
            assert ev._fence is not None
            try:
                info = self.device.fence_info(ev._fence, _QUEUE)
            except NpuError as exc:
                if exc.errno == errno.EBUSY:
                    raise RuntimeError(
                        "elapsed_time: an event is not reached yet; synchronize() first"
                    ) from exc
                raise
            if info.status:
                raise NpuDeviceError(info.status, ev._fence, None, "Event marker")
            stamps.append(info.t_end_ns)
        return (stamps[1] - stamps[0]) / 1e6
