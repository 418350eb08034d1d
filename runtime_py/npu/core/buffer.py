"""Device buffers: a buffer object (BO) of the driver mapped into this process.

A :class:`Buffer` is created by :meth:`npu.Device.alloc`: BO_CREATE allocates
the memory, ``mmap`` of the device file descriptor at the returned offset
maps it, and :meth:`Buffer.numpy` / :attr:`Buffer.view` expose the mapping
without copying. :meth:`Buffer.free` (or leaving a ``with`` block) drops the
runtime's view, unmaps and destroys the BO; it is idempotent.

Using a freed buffer raises :class:`npu.NpuError` with ``errno.EBADF``, the
same error a closed file descriptor gives. If numpy arrays returned by
:meth:`Buffer.numpy` are still alive when the buffer is freed, the mapping
stays valid until the last of them is garbage-collected (the driver keeps the
pages of a mapped BO alive), so such arrays never dangle.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import math
import mmap
import weakref
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from .. import _spans
from .._closing import Closing
from ..errors import NpuError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    from ..hal import Backend

__all__ = ["BackendOwner", "Buffer", "BufferOwner", "UserBuffer"]

log = logging.getLogger(__name__)


class BackendOwner(Protocol):
    """An open device as the layers below it see it: a backend while not closed.

    Buffers and user queues sit below :class:`npu.Device`, so they name it by
    protocols (this one, :class:`BufferOwner`, ``npu.core.userqueue.QueueOwner``)
    rather than importing it.
    """

    @property
    def closed(self) -> bool:
        """True once the device is closed (its buffers and queues are gone with it)."""
        ...

    @property
    def backend(self) -> Backend:
        """The device's backend."""
        ...


class BufferOwner(BackendOwner, Protocol):
    """What a buffer needs of its device (an :class:`npu.Device`)."""

    def bo_destroy(self, handle: int) -> None:
        """Destroy the buffer object ``handle`` (BO_DESTROY)."""
        ...

    def forget_buffer(self, buf: Buffer) -> None:
        """Drop a freed buffer from the device's list."""
        ...

    def export_dmabuf(self, buffer: Buffer) -> int:
        """Share ``buffer`` as a dma-buf: a new file descriptor (PRIME_HANDLE_TO_FD)."""
        ...


class Buffer(Closing):
    """A mapped buffer object of a :class:`npu.Device`.

    Do not construct directly; use :meth:`npu.Device.alloc` (or
    :meth:`npu.Device.import_dmabuf` for a dma-buf shared by another device,
    process or driver).

    Attributes:
        device: the device owning the buffer object.
        size: usable size in bytes (the size asked for).
        alloc_size: size of the allocation after the driver rounded it up.
        mmap_offset: the offset the mapping was made at.
    """

    def __init__(
        self,
        device: BufferOwner,
        handle: int,
        size: int,
        alloc_size: int,
        mmap_offset: int,
        *,
        va: int = 0,
    ) -> None:
        self.device = device
        self.size = size
        self.alloc_size = alloc_size
        self.mmap_offset = mmap_offset
        self._handle = handle
        self._va = va
        self._view: memoryview | None = None
        try:
            self._mmap: mmap.mmap | memoryview | None = device.backend.map(
                mmap_offset, alloc_size, mmap.PROT_READ | mmap.PROT_WRITE
            )
        except OSError as exc:
            raise NpuError.from_oserror(
                exc, f"mmap(handle={handle}, offset={mmap_offset:#x}, size={alloc_size})"
            ) from exc
        # Destroys the BO if the buffer is garbage-collected without free().
        self._finalizer = weakref.finalize(self, _destroy_unreferenced, weakref.ref(device), handle)
        self._finalizer.atexit = False

    # -- state ---------------------------------------------------------------

    @property
    def handle(self) -> int:
        """The BO handle (raises :class:`npu.NpuError` ``EBADF`` once freed)."""
        self._check_alive("handle")
        return self._handle

    @property
    def va(self) -> int:
        """The buffer's device virtual address in its file's address space.

        What user-queue descriptors (:class:`npu.UserQueue`) carry; it means
        nothing to another open file. 0 if the driver did not report one.
        Raises :class:`npu.NpuError` ``EBADF`` once freed.
        """
        self._check_alive("va")
        return self._va

    @property
    def freed(self) -> bool:
        """True once :meth:`free` has run (or the device was closed)."""
        return self._mmap is None

    @property
    def view(self) -> memoryview:
        """A writable ``memoryview`` of the ``size`` usable bytes of the mapping."""
        mapping = self._check_alive("view")
        if self._view is None:
            self._view = memoryview(mapping)[: self.size]
        return self._view

    # -- data access ----------------------------------------------------------

    def numpy(
        self,
        dtype: npt.DTypeLike = np.uint8,
        shape: int | tuple[int, ...] | None = None,
        offset: int = 0,
    ) -> npt.NDArray[Any]:
        """Return a writable ndarray viewing the buffer (no copy).

        Args:
            dtype: element type.
            shape: array shape; by default a 1-D array of as many elements as
                fit between ``offset`` and ``size``.
            offset: byte offset of the first element.

        Raises:
            ValueError: the array does not fit in the buffer.
            NpuError: the buffer was freed (``EBADF``).
        """
        mapping = self._check_alive("numpy")
        dt = np.dtype(dtype)
        if offset < 0 or offset > self.size:
            raise ValueError(f"offset={offset} is outside the buffer of {self.size} bytes")
        if shape is None:
            count = (self.size - offset) // dt.itemsize
            dims: tuple[int, ...] = (count,)
        else:
            dims = (shape,) if isinstance(shape, int) else tuple(shape)
            count = math.prod(dims)
        if count < 0 or offset + count * dt.itemsize > self.size:
            raise ValueError(
                f"array of shape {dims} and dtype {dt} at offset {offset} does not fit "
                f"the buffer of {self.size} bytes"
            )
        array: npt.NDArray[Any] = np.frombuffer(mapping, dtype=dt, count=count, offset=offset)
        return array.reshape(dims)

    def write(self, data: ReadableBuffer | npt.NDArray[Any], offset: int = 0) -> None:
        """Copy the bytes of ``data`` into the buffer at ``offset``.

        ``data`` is any bytes-like object or an ndarray (whose raw bytes, in C
        order, are written).

        Raises:
            ValueError: the data does not fit.
            NpuError: the buffer was freed (``EBADF``).
        """
        self._check_alive("write")
        if isinstance(data, np.ndarray):
            src: npt.NDArray[Any] = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        else:
            src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        if offset < 0 or offset + src.nbytes > self.size:
            raise ValueError(
                f"{src.nbytes} bytes at offset {offset} do not fit the buffer of {self.size} bytes"
            )
        self.numpy(np.uint8, src.nbytes, offset)[:] = src

    def read(self, nbytes: int | None = None, offset: int = 0) -> bytes:
        """Return a copy of ``nbytes`` bytes (default: up to the end) from ``offset``.

        Raises:
            ValueError: the range is outside the buffer.
            NpuError: the buffer was freed (``EBADF``).
        """
        end = self.size if nbytes is None else offset + nbytes
        if offset < 0 or end < offset or end > self.size:
            raise ValueError(f"range [{offset}, {end}) is outside the buffer of {self.size} bytes")
        return bytes(self.view[offset:end])

    # -- sharing --------------------------------------------------------------

    def export_dmabuf(self) -> int:
        """Share the buffer as a dma-buf; return its new file descriptor (the caller's to close).

        Import it with :meth:`npu.Device.import_dmabuf` on another device
        (or in another process, or into another driver); see
        :meth:`npu.Device.export_dmabuf`.

        Raises:
            NpuError: ``EBADF`` (the buffer was freed), ``EOPNOTSUPP``
                (device memory, user memory, or the CPU backend), as
                :meth:`npu.Device.export_dmabuf`.
        """
        self._check_alive("export_dmabuf")
        return self.device.export_dmabuf(self)

    # -- lifetime -------------------------------------------------------------

    def free(self) -> None:
        """Release the view, unmap and destroy the buffer object. Idempotent.

        Raises:
            NpuError: BO_DESTROY failed (the buffer is considered freed anyway).
        """
        mapping = self._mmap
        if mapping is None:
            return
        self._mmap = None
        self._finalizer.detach()
        if self._view is not None:
            self._view.release()
            self._view = None
        try:
            if isinstance(mapping, memoryview):
                mapping.release()
            else:
                mapping.close()
        except BufferError:
            log.debug(
                "buffer %d: numpy views still reference the mapping; it is unmapped "
                "when they are garbage-collected",
                self._handle,
            )
        self.device.forget_buffer(self)
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        if not self.device.closed:
            self.device.bo_destroy(self._handle)
        if rec is not None:
            rec.add(
                "Buffer.free", t0, _spans.now(), {"size": self.alloc_size, "handle": self._handle}
            )

    def close(self) -> None:
        """Alias of :meth:`free`."""
        self.free()

    def __repr__(self) -> str:
        state = " freed" if self.freed else ""
        return f"<npu.Buffer handle={self._handle} size={self.size}{state}>"

    def _check_alive(self, what: str) -> mmap.mmap | memoryview:
        if self._mmap is None:
            raise NpuError(
                errno.EBADF,
                "buffer has been freed",
                f"Buffer(handle={self._handle}).{what}",
            )
        return self._mmap


class UserBuffer(Buffer):
    """Existing user memory made a buffer object without a copy (BO_USERPTR).

    Do not construct directly; use :meth:`npu.Device.userptr`. The driver
    pins the pages of ``[base, base + size)`` until the buffer object is
    destroyed (:meth:`free`, garbage collection, or the end of the last job
    using it). ``owner`` (e.g. the numpy array) is kept alive as long as the
    buffer. :meth:`numpy` views the user memory itself.

    Attributes:
        base: the page-aligned user address of the first byte.
        readonly: the device may only read the memory.
    """

    def __init__(
        self,
        device: BufferOwner,
        handle: int,
        base: int,
        size: int,
        readonly: bool,
        owner: object,
        *,
        va: int = 0,
    ) -> None:
        self.device = device
        self.size = size
        self.alloc_size = size
        self.mmap_offset = 0
        self.base = base
        self.readonly = readonly
        self._handle = handle
        self._va = va
        self._owner = owner
        self._view = None
        raw = (ctypes.c_uint8 * size).from_address(base)
        self._mmap = memoryview(raw).cast("B")
        if readonly:
            self._mmap = self._mmap.toreadonly()
        self._finalizer = weakref.finalize(self, _destroy_unreferenced, weakref.ref(device), handle)
        self._finalizer.atexit = False

    def __repr__(self) -> str:
        state = " freed" if self.freed else ""
        return f"<npu.UserBuffer handle={self._handle} base={self.base:#x} size={self.size}{state}>"


def _destroy_unreferenced(device_ref: weakref.ref[BufferOwner], handle: int) -> None:
    """Finalizer: destroy the BO of a buffer collected without :meth:`Buffer.free`."""
    device = device_ref()
    if device is None or device.closed:
        return
    log.debug("buffer %d collected without free(); destroying it", handle)
    try:
        device.bo_destroy(handle)
    except NpuError as exc:
        log.warning("destroying unreferenced buffer %d failed: %s", handle, exc)
