"""Taking a user queue back while the device may still use it (issue 36).

QUEUE_DESTROY (and close) disable the hardware queue; the device stops its
command at the next control point, or a command preempted by a higher
priority once the command in front of it ends (docs/npu-spec.md 5.2). Until
then the queue is *draining*: out of its file's reach, but holding the
hardware queue and the file's memory, so nothing the command may still
write is freed or unpinned under it. The doorbell is mapped by fault and
checked under the lock its zap holds, so no mapping made while the queue
is taken back survives it.

These races need two vCPUs to show (``NPU_SMP=2``, or ``NPU_DEBUG_SMP=2``
for the debug pass of ``make test``, which keeps one by default for now).
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

import npu
from npu import _abi, ops

PAGE = mmap.PAGESIZE
MiB = 1 << 20
# The preempted command: a FILL of a pinned user array, several 4 MiB
# control points long (about 0.1 s of device work).
FILL_BYTES = 256 * MiB
PATTERN = 0xA5A5A5A5
# Queue 0 (priority 1) ahead of a priority-0 user queue: COPYs of this
# size, a few ms each, kept queued until told to stop.
FLOOD_BYTES = 16 * MiB
FLOOD_BATCH = 8
# The flood goes on this long after QUEUE_DESTROY returned: a command that
# was not stopped would resume then.
AFTER_DESTROY_S = 1.0
ATTEMPTS = 3  # to catch the FILL running (not yet done) when the flood comes
DOORBELL_RACES = 300


class Flood:
    """Another file keeping queue 0 busy from a thread until stopped."""

    def __init__(self, dev_path: str) -> None:
        self.dev = npu.Device(dev_path)
        self.src = self.dev.alloc(FLOOD_BYTES)
        self.dst = self.dev.alloc(FLOOD_BYTES)
        self.stop = threading.Event()
        self.batches = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            batch = [ops.copy(self.src, self.dst, FLOOD_BYTES)] * FLOOD_BATCH
            pending = self.dev.submit(batch)
            while not self.stop.is_set():
                nxt = self.dev.submit(batch)  # always one batch queued behind
                self.dev.wait(pending, timeout_s=60)
                pending = nxt
                self.batches += 1
            self.dev.wait(pending, timeout_s=60)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "the flood did not end"
        assert self.error is None, f"the flood failed: {self.error!r}"

    def close(self) -> None:
        self.src.free()
        self.dst.free()
        self.dev.close()


@pytest.fixture
def flood(dev_path: str) -> Iterator[Flood]:
    f = Flood(dev_path)
    yield f
    if f.thread.is_alive():
        f.stop.set()
        f.thread.join(timeout=120)
    f.close()


def _wait_started(array: np.ndarray, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while array[0] == 0:
        assert time.monotonic() < deadline, "the FILL did not start"
        time.sleep(0.0005)


def test_destroying_a_preempted_queue_stops_its_command_before_its_memory_goes(
    dev: npu.Device, flood: Flood
) -> None:
    """The old driver waited 10 s for the preempted command, gave up, freed
    (here: unpinned) the file's memory, and the command resumed once the
    flood ended and wrote it."""
    for _attempt in range(ATTEMPTS):
        array = np.zeros(FILL_BYTES // 4, np.uint32)
        buf, off = dev.userptr(array)
        q = dev.create_queue(16, priority=0)
        q.fill(buf, PATTERN, FILL_BYTES, off)
        q.kick()
        _wait_started(array)
        if not flood.thread.is_alive():
            flood.start()
        while flood.batches == 0 and array[-1] == 0:
            time.sleep(0.0005)
        if array[-1] == 0:
            break  # preempted half way: the case under test
        q.close()  # the FILL ended before the flood came: try again
        buf.free()
    else:
        pytest.fail(f"the FILL was never caught running in {ATTEMPTS} attempts")
    q.close()  # QUEUE_DESTROY: disables the queue, drains it
    snapshot = array.copy()
    buf.free()  # BO_DESTROY: unpins the array's pages
    assert flood.thread.is_alive(), "QUEUE_DESTROY waited for the whole flood"
    time.sleep(AFTER_DESTROY_S)
    flood.finish()
    time.sleep(0.2)
    changed = int(np.count_nonzero(array != snapshot))
    assert changed == 0, f"{changed * 4} bytes written after QUEUE_DESTROY returned"
    assert 0 < np.count_nonzero(snapshot) < snapshot.size, "the FILL was not stopped half way"


def _pte_present(pagemap: int, addr: int) -> bool:
    """Whether a page table entry maps ``addr`` (/proc/self/pagemap bit 63)."""
    (entry,) = struct.unpack("<Q", os.pread(pagemap, 8, (addr // PAGE) * 8))
    return bool(entry >> 63)


def _map_until(fd: int, offset: int, maps: list[mmap.mmap], done: threading.Event) -> None:
    """Map the doorbell at ``offset`` again and again until ``done`` or refused."""
    while not done.is_set():
        try:
            maps.append(mmap.mmap(fd, PAGE, mmap.MAP_SHARED, mmap.PROT_WRITE, offset=offset))
        except OSError:
            return  # the queue is gone: EINVAL from here on


def test_no_doorbell_mapping_made_while_its_queue_is_destroyed_survives(fd: int) -> None:
    """mmap of the doorbell racing QUEUE_DESTROY from another thread: no
    mapping keeps a page table entry once QUEUE_DESTROY returned (the old
    driver inserted it in mmap, before the vma could be zapped)."""
    pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    survivors = 0
    made = 0
    try:
        for _ in range(DOORBELL_RACES):
            arg = _abi.NpuQueueCreate(entries=16, priority=0)
            fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_QUEUE_CREATE, arg, True)
            maps: list[mmap.mmap] = []
            done = threading.Event()
            t = threading.Thread(target=_map_until, args=(fd, int(arg.doorbell_offset), maps, done))
            t.start()
            destroy = _abi.NpuQueueDestroy(queue=arg.queue)
            fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_QUEUE_DESTROY, destroy, True)
            done.set()
            t.join()
            for m in maps:
                addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
                survivors += _pte_present(pagemap, addr)
                m.close()
            made += len(maps)
    finally:
        os.close(pagemap)
    assert made > 0, "no doorbell mapping was made: the race was not run"
    assert survivors == 0, f"{survivors} of {made} doorbell mappings survived QUEUE_DESTROY"
