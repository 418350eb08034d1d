"""Events: markers in the device's op queue, for waiting and for timing.

The model is CUDA's (``torch.cuda.Event``): :meth:`Event.record` puts a
marker after everything submitted so far; :meth:`Event.query` says whether
the device has passed it; :meth:`Event.synchronize` waits for it; and
:meth:`Event.elapsed_time` gives the device time between two markers in
milliseconds, from the device clock in the completion records
(``FENCE_INFO``), so host and Python overheads are not counted.

On the default stream (outside any ``with stream:``) tensor work runs on
the device's queue 0, in order, so a marker is reached once everything
recorded before it there is done. An event made with
``enable_timing=True`` records a NOP as its marker (the device stamps the
time when it reaches the NOP); without it, recording only remembers the last
fence, which costs nothing.

On a :class:`npu.Stream` (``record(stream)``, or ``record()`` inside ``with
stream:``) the marker is a SIGNAL of the stream's 64-bit counter, which
:meth:`npu.Stream.wait_event` of another stream waits for in the device; its
completion record gives the time (with or without ``enable_timing``).
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from ..errors import NpuDeviceError, NpuError, NpuTimeoutError
from ..kernels import ops
from .device import DEFAULT_TIMEOUT_S, DeviceArg, resolve_device

if TYPE_CHECKING:
    from .stream import Stream

__all__ = ["Event"]

_QUEUE = 0


class Event:
    """A marker in a device's queue.

    Args:
        device: the device (default: the default device).
        enable_timing: record a NOP the device timestamps, for
            :meth:`elapsed_time`.
    """

    def __init__(self, device: DeviceArg = None, enable_timing: bool = False) -> None:
        self._device_given = device is not None
        self.device = resolve_device(device)
        self.enable_timing = enable_timing
        self._fence: int | None = None
        # On a user stream: the stream, the counter's VA and the value its
        # SIGNAL stores, and the SIGNAL's completion time once seen.
        self._stream: Stream | None = None
        self._va = 0
        self._value = 0
        self._t_end_ns: int | None = None

    @property
    def fence(self) -> int | None:
        """The fence of the marker (on its stream's queue), or None before :meth:`record`."""
        return self._fence

    @property
    def stream(self) -> Stream | None:
        """The user stream the event was last recorded on (None: the default stream)."""
        return self._stream

    def record(self, stream: Stream | None = None) -> None:
        """Put the marker after everything launched so far on ``stream``.

        ``stream`` defaults to the current stream (:func:`npu.current_stream`):
        the innermost ``with stream:`` of the thread, else the default stream
        (the kernel path: after everything submitted to the device so far).
        An event not given a device takes the device of the stream.

        Raises:
            ValueError: the stream is of another device than the one given.
            RuntimeError: while an :class:`npu.Graph` captures.
            NpuError: the marker was refused (e.g. a closed stream).
        """
        from .stream import _current_user_stream

        target = stream if stream is not None else _current_user_stream()
        if target is not None and not target.is_default:
            if target.device is not self.device:
                if self._device_given:
                    raise ValueError(f"Event.record: {target!r} is of another device")
                self.device = target.device
            self._t_end_ns = None
            target._record(self)
            return
        if target is not None and target.device is not self.device:
            if self._device_given:
                raise ValueError(f"Event.record: {target!r} is of another device")
            self.device = target.device
        self._stream = None
        self._t_end_ns = None
        if self.enable_timing:
            self._fence = self.device.submit([ops.nop()], _QUEUE)
        else:
            if self.device.capturing is not None:
                raise RuntimeError("Event.record: not while a graph is capturing")
            self._fence = self.device.submitted_fences().get(_QUEUE, 0)

    def query(self) -> bool:
        """True once the device has passed the marker (or it was never recorded).

        Raises:
            NpuDeviceError: an op before the marker failed (reported once).
        """
        if self._fence is None or self._fence == 0:
            return True
        if self._stream is not None:
            return self._stream._event_done(self, 0)
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
        if self._stream is not None:
            self._stream._event_done(self, timeout_s)
        elif self._fence:
            self.device.wait(self._fence, timeout_s=timeout_s, queue=_QUEUE)

    def elapsed_time(self, end: Event) -> float:
        """Device milliseconds from this marker to ``end``'s (both done).

        The times are the device clock at the completion of each marker (a
        stream event's SIGNAL; a default-stream event's NOP), so events of
        different streams of a device can be compared.

        Raises:
            ValueError: an event of the default stream lacks
                ``enable_timing``, an event was not recorded, or they belong
                to different devices.
            RuntimeError: a marker is not reached yet (call
                :meth:`synchronize` on ``end`` first).
            NpuError: the record is gone (more than ``ring_entries`` later
                ops, or a device reset since), ``ENOENT``.
        """
        for ev in (self, end):
            if ev._fence is None or (ev._stream is None and not ev.enable_timing):
                raise ValueError("elapsed_time: both events need enable_timing and a record()")
        if end.device is not self.device:
            raise ValueError("elapsed_time: the events belong to different devices")
        stamps = []
        for ev in (self, end):
            assert ev._fence is not None
            if ev._stream is not None:
                stamps.append(ev._stream_stamp())
                continue
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

    # -- user streams (npu.stream) ---------------------------------------------

    def _set_stream_marker(self, stream: Stream, fence: int, va: int, value: int) -> None:
        self._stream = stream
        self._fence = fence
        self._va = va
        self._value = value
        self._t_end_ns = None

    def _note_stamp(self, t_end_ns: int | None) -> None:
        if t_end_ns is not None:
            self._t_end_ns = t_end_ns

    def _stream_stamp(self) -> int:
        """The device time of this stream event's SIGNAL (completed)."""
        assert self._stream is not None
        if self._t_end_ns is None:
            if not self._stream._event_done(self, 0):
                raise RuntimeError("elapsed_time: an event is not reached yet; synchronize() first")
            if self._t_end_ns is None:
                raise NpuError(
                    errno.ENOENT,
                    "the completion record of the marker was reused",
                    f"Event.elapsed_time({self._stream!r}, fence={self._fence})",
                )
        return self._t_end_ns

    def __repr__(self) -> str:
        where = repr(self._stream) if self._stream is not None else "default stream"
        return f"<npu.Event fence={self._fence} on {where}>"
