"""udmabuf: a dma-buf over a sealed memfd, to import into the device."""

from __future__ import annotations

import fcntl
import os
import struct

UDMABUF = "/dev/udmabuf"
# <linux/udmabuf.h>: struct udmabuf_create { u32 memfd, flags; u64 offset, size; }
UDMABUF_FLAGS_CLOEXEC = 0x01
UDMABUF_CREATE = (1 << 30) | (24 << 16) | (ord("u") << 8) | 0x42  # _IOW('u', 0x42, 24 bytes)
F_ADD_SEALS = 1033
F_SEAL_SHRINK = 0x0002


def udmabuf(size: int) -> tuple[int, int]:
    """(memfd, dma-buf fd) of a sealed memfd of ``size`` bytes; the caller closes both."""
    assert os.path.exists(UDMABUF), "the guest kernels have CONFIG_UDMABUF=y"
    memfd = os.memfd_create("npu-udmabuf", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(memfd, size)
        fcntl.fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK)
        dev = os.open(UDMABUF, os.O_RDWR)
        try:
            arg = bytearray(struct.pack("=IIQQ", memfd, UDMABUF_FLAGS_CLOEXEC, 0, size))
            dmabuf = fcntl.ioctl(dev, UDMABUF_CREATE, arg)
        finally:
            os.close(dev)
    except BaseException:
        os.close(memfd)
        raise
    return memfd, dmabuf
