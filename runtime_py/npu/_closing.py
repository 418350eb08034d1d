"""The context-manager protocol of the runtime's objects that own a resource.

:class:`npu.Device`, :class:`npu.Buffer`, :class:`npu.UserQueue` and
:class:`npu.InferenceSession` give their resource back in an idempotent
``close()``; ``with obj:`` calls it when the block ends, also on an
exception.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Closing"]


class Closing:
    """Base class: ``with obj:`` returns ``obj`` and calls ``obj.close()`` at the end."""

    __slots__ = ()

    def close(self) -> None:
        """Give the resource back (idempotent)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
