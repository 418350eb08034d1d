"""Anonymous memory files: the CPU backend's buffers and queue memory."""

from __future__ import annotations

import errno
import os
import resource

__all__ = ["memfd"]


def memfd(name: str, size: int) -> int:
    """An anonymous memory file of ``size`` bytes (more open files allowed if needed)."""
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.EMFILE:
            raise
        # One open file per buffer: take the hard limit rather than fail.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft >= hard:
            raise
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd
