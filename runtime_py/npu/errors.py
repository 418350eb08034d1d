"""Exception hierarchy of the NPU runtime.

Every failure that comes from the kernel driver or the device is an
:class:`NpuError`, a subclass of :class:`OSError` that keeps the ``errno`` and
``strerror`` of the failed system call and adds a ``context`` string naming
what failed, e.g. ``"BO_CREATE(size=0)"``::

    NpuError
     +-- NpuDeviceError      the device completed an op with an error status (EIO)
     +-- NpuTimeoutError     WAIT timed out (ETIMEDOUT); also a TimeoutError
     +-- NpuOutOfMemoryError no memory (ENOMEM); also a MemoryError
     +-- DeviceNotFoundError no such /dev/npuN (ENOENT / ENODEV)

Invalid arguments detected in Python before anything reaches the driver
(wrong shapes, out-of-range offsets, ...) raise :class:`ValueError` instead.
"""

from __future__ import annotations

import errno as _errno
import os
from typing import Any, Final

from ._abi import status_name as _status_name

#: Default timeout of every wait (:meth:`npu.Device.wait` and the functions above it).
DEFAULT_TIMEOUT_S: Final = 10.0

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DeviceNotFoundError",
    "NpuDeviceError",
    "NpuError",
    "NpuOutOfMemoryError",
    "NpuTimeoutError",
]


class NpuError(OSError):
    """A failed NPU operation.

    Attributes:
        errno: the error number (``errno.EINVAL``, ...), as for any ``OSError``.
        strerror: the error text; defaults to ``os.strerror(errno)``.
        context: what failed, e.g. ``"BO_CREATE(size=0)"`` or ``"open(/dev/npu0)"``.
    """

    def __init__(self, errno: int, strerror: str | None = None, context: str = "") -> None:
        if strerror is None:
            strerror = os.strerror(errno)
        super().__init__(errno, strerror)
        self.context = context

    def __str__(self) -> str:
        base = f"[Errno {self.errno}] {self.strerror}"
        return f"{self.context}: {base}" if self.context else base

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.errno, self.strerror, self.context))

    @classmethod
    def from_oserror(cls, exc: OSError, context: str) -> NpuError:
        """Wrap an ``OSError`` raised by a system call, keeping its errno and text."""
        code = exc.errno if exc.errno is not None else _errno.EIO
        if cls is NpuError and code == _errno.ENOMEM:
            return NpuOutOfMemoryError(code, exc.strerror, context)
        return cls(code, exc.strerror, context)


class NpuDeviceError(NpuError):
    """The device completed an operation with a non-OK status.

    Raised by WAIT when the driver reports ``-EIO``; ``errno`` is ``EIO``.

    Attributes:
        status: the ``NPU_ST_*`` completion status (int).
        status_name: its C name, e.g. ``"NPU_ST_BAD_ARGS"``.
        fence: the fence of the failed operation (``npu_wait.error_fence``).
        op: the failed :class:`npu.Op` when the runtime submitted it, else ``None``.
    """

    def __init__(
        self,
        status: int,
        fence: int,
        op: object | None = None,
        context: str = "",
        errno: int = _errno.EIO,
        strerror: str | None = None,
    ) -> None:
        super().__init__(errno, strerror, context)
        self.status = status
        self.status_name = _status_name(status)
        self.fence = fence
        self.op = op

    def __str__(self) -> str:
        where = f" in {self.op}" if self.op is not None else ""
        detail = f"device error {self.status_name} ({self.status}) at fence {self.fence}{where}"
        return f"{super().__str__()}: {detail}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.status, self.fence, self.op, self.context, self.errno, self.strerror),
        )


class NpuTimeoutError(NpuError, TimeoutError):
    """WAIT did not see the fence complete in time; ``errno`` is ``ETIMEDOUT``.

    It is also a builtin :class:`TimeoutError`.

    Attributes:
        fence: the fence waited for.
        timeout_s: the timeout that expired, in seconds.
    """

    def __init__(
        self,
        fence: int,
        timeout_s: float,
        context: str = "",
        errno: int = _errno.ETIMEDOUT,
        strerror: str | None = None,
    ) -> None:
        super().__init__(errno, strerror, context)
        self.fence = fence
        self.timeout_s = timeout_s

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.fence, self.timeout_s, self.context, self.errno, self.strerror),
        )


class NpuOutOfMemoryError(NpuError, MemoryError):
    """Out of memory (``ENOMEM``): device memory, the driver's limits or the host's.

    Every ``ENOMEM`` of a driver or backend call is one, so ``except
    MemoryError`` catches the runtime's out-of-memory errors, as with
    ``torch.cuda.OutOfMemoryError``.
    """


class DeviceNotFoundError(NpuError):
    """No NPU device matches the request.

    ``errno`` is ``ENOENT`` when a device node does not exist and ``ENODEV``
    when no NPU is present at all.
    """

    def __init__(
        self, context: str = "", errno: int = _errno.ENODEV, strerror: str | None = None
    ) -> None:
        super().__init__(errno, strerror, context)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.context, self.errno, self.strerror))
