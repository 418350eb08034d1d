"""The hardware abstraction layer: what the runtime needs of a device.

A backend owns one open device (a driver file, or the CPU backend's
in-process state) and offers buffer objects, their mappings, their sharing
as dma-bufs, submission of
packed command descriptors (arrays of ``struct npu_op`` or ``struct
npu_tensor_op``: the device's command format, not the driver's ABI), fences
and user-mode queues. Every failure is an :class:`OSError` with the errno the
driver would return; the layers above add the context of the call. Nothing
above this package knows how a backend reaches its device.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Any, Protocol, runtime_checkable

from .types import BoInfo, FenceTimes, HalInfo, QueueInfo

__all__ = ["Backend"]


@runtime_checkable
class Backend(Protocol):
    """One open device. Methods raise :class:`OSError` (errno kept)."""

    #: "driver" or "cpu".
    kind: str
    #: The device node, or "cpu".
    path: str

    def fileno(self) -> int:
        """A file descriptor that polls readable when a completion may be waiting."""
        ...

    def close(self) -> None:
        """Release the device; every buffer and queue of it is gone."""
        ...

    def query(self) -> HalInfo:
        """The device's properties."""
        ...

    def bo_create(self, size: int, flags: int) -> BoInfo:
        """A buffer object of at least ``size`` bytes (``NPU_BO_*`` flags)."""
        ...

    def bo_userptr(self, addr: int, size: int, flags: int) -> BoInfo:
        """Pinned process memory ``[addr, addr + size)`` as a buffer object."""
        ...

    def bo_destroy(self, handle: int) -> None:
        """Free a buffer object (its mappings stay valid until unmapped)."""
        ...

    def bo_info(self, handle: int) -> BoInfo:
        """What the backend knows of buffer object ``handle`` (BO_INFO), with its flags."""
        ...

    def dmabuf_export(self, handle: int) -> int:
        """Share buffer object ``handle`` as a dma-buf: a new file descriptor the caller owns
        (close-on-exec, read-write). Device-memory and user-pointer buffers fail with
        ``EOPNOTSUPP``."""
        ...

    def dmabuf_import(self, fd: int) -> BoInfo:
        """A buffer object of this device over the dma-buf ``fd`` (which stays the caller's).

        Importing a dma-buf this device exported, or one already imported,
        gives that buffer object's handle again, not a new one.
        """
        ...

    def map(self, offset: int, length: int, prot: int) -> mmap.mmap:
        """A shared mapping of ``length`` bytes at a mapping ``offset``."""
        ...

    def submit(self, ops: ctypes.Array[Any], op_size: int, queue: int) -> int:
        """Queue packed descriptors (``len(ops)`` of ``op_size`` bytes); the last fence."""
        ...

    def wait(self, fence: int, timeout_ns: int, queue: int) -> None:
        """Return once ``fence`` completed on ``queue``.

        Raises ``TimeoutError`` (``ETIMEDOUT``), ``InterruptedError`` or
        :class:`WaitFailed` (``EIO``: an op failed; ``EBADFD``: the queue stopped).
        """
        ...

    def fence_info(self, fence: int, queue: int) -> FenceTimes:
        """Status and timestamps of a completed fence."""
        ...

    def queue_create(self, entries: int, priority: int) -> QueueInfo:
        """Lend a hardware queue to this process (user-mode submission)."""
        ...

    def queue_destroy(self, index: int) -> None:
        """Give a lent queue back."""
        ...
