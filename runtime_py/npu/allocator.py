"""Caching allocator: device memory for tensors without an ioctl per allocation.

Every :class:`npu.Tensor` gets its memory from the :class:`CachingAllocator`
of its device, in the manner of PyTorch's CUDA caching allocator:

- Requests are rounded up to :data:`ALIGN` bytes. Requests of at most
  :data:`SMALL_REQUEST` bytes come from the *small pool*, whose segments (buffer
  objects) are :data:`SMALL_SEGMENT` bytes; larger ones from the *large pool*,
  whose segments are the request rounded up to :data:`LARGE_ROUND`.
- A request takes the smallest cached free block that fits (best fit) and
  splits off the rest when enough remains (any remainder in the small pool,
  at least :data:`LARGE_MIN_SPLIT` in the large pool). Only when nothing fits
  is a new segment created with BO_CREATE.
- A freed block (its last tensor and view garbage-collected) goes back to the
  pool and merges with free neighbours of its segment. Segments are returned
  to the driver only by :meth:`CachingAllocator.empty_cache`, or when
  BO_CREATE fails with ``ENOMEM`` (the cache is emptied and the request
  retried once).
- **A segment is never destroyed while a stream may still use it.** The
  driver keeps a buffer object alive for the jobs of its own queues, but a
  user stream's commands reach memory by device address, unknown to the
  driver: destroying the buffer under them makes the device fault. So a
  segment whose blocks were last used by stream work not yet completed is
  destroyed only after that work: ``empty_cache`` and the ``ENOMEM`` retry
  wait for it (as PyTorch's ``empty_cache`` synchronises the events of
  cached blocks), and with caching off a freed block's buffer object waits
  in a list until its streams pass their fences.

**Reuse is ordered by the timelines.** Each free block remembers the last
fence launched on each timeline when it was freed: the driver's queues (the
default stream: SUBMIT to queue 0) and every :class:`npu.Stream` with tensor
work. A block may be handed to a new tensor while ops that used the old one
are still queued *on the timeline the new tensor's ops go to*, since a
timeline runs in order; the fences of every other timeline must have
completed (a stream's fence record is read; a kernel fence counts once a
WAIT saw it), so work on two streams never shares memory while both may
run. The host is ordered with no timeline, so a block that the host is
about to write (an upload) must be idle on all of them. Busy blocks are
skipped; if none fits, the request gets fresh memory, and only when
BO_CREATE fails with ``ENOMEM`` does it wait for a busy block
(``num_host_waits`` counts those waits).

``NPU_NO_MEMORY_CACHING=1`` in the environment turns caching off: every
allocation is its own buffer object, destroyed when freed (for debugging,
like ``PYTORCH_NO_CUDA_MEMORY_CACHING``).
"""

from __future__ import annotations

import bisect
import collections
import errno
import itertools
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from . import _spans
from .core.device import Device, Timeline, default_device
from .core.eager import EagerQueue, eager_queue
from .errors import NpuError

if TYPE_CHECKING:
    from .core.buffer import Buffer

__all__ = [
    "ALIGN",
    "LARGE_MIN_SPLIT",
    "LARGE_ROUND",
    "NO_CACHING_ENV",
    "SMALL_REQUEST",
    "SMALL_SEGMENT",
    "Allocation",
    "CachingAllocator",
    "allocator",
    "empty_cache",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_peak_memory_stats",
]

log = logging.getLogger(__name__)

#: Every block starts and ends on this many bytes.
ALIGN: Final = 512
#: Largest request served from the small pool.
SMALL_REQUEST: Final = 1 << 20
#: Size of a small-pool segment.
SMALL_SEGMENT: Final = 2 << 20
#: Large-pool segments are multiples of this.
LARGE_ROUND: Final = 2 << 20
#: A large block is split only if at least this much would remain free.
LARGE_MIN_SPLIT: Final = 1 << 20
#: Set to ``1`` to allocate (and destroy) one buffer object per allocation.
NO_CACHING_ENV: Final = "NPU_NO_MEMORY_CACHING"

#: Waits for ``fence`` on a timeline of the device, a driver queue (int) or
#: a user stream (may raise on a timeout).
Waiter = Callable[["Device", "int | Timeline", int], None]

#: How many fitting free blocks an upload looks at for one no queued op uses.
_IDLE_SCAN: Final = 64

_POOLS: Final = ("small_pool", "large_pool")
_ALL_POOLS: Final = ("all", *_POOLS)
_STATS: Final = ("allocation", "segment", "allocated_bytes", "reserved_bytes", "requested_bytes")


def _matters(queue: int | Timeline, on: Timeline | None) -> bool:
    """Must ops launched on ``queue`` complete before memory is used on ``on``?

    Not on ``on`` itself (it runs in order), not the driver's queue 0 for
    the default stream's ops (its eager queue submits there, in order), and
    not the driver's queues other than 0 for device work (tensor ops never
    go there); for the host (``on`` None), every timeline matters.
    """
    if queue is on:
        return False
    if on is None:
        return True
    if isinstance(queue, int):
        return queue == 0 and not isinstance(on, EagerQueue)
    return True


def _count_block(counters: tuple[_Counter, ...], size: int, requested: int) -> None:
    """An allocation of ``requested`` bytes in a block of ``size``: the pool's and
    all pools' allocation, allocated_bytes and requested_bytes counters
    (unrolled: this runs for every tensor an op makes)."""
    n, b, r, n_all, b_all, r_all = counters
    n.current += 1
    n.allocated += 1
    if n.current > n.peak:
        n.peak = n.current
    b.current += size
    b.allocated += size
    if b.current > b.peak:
        b.peak = b.current
    r.current += requested
    r.allocated += requested
    if r.current > r.peak:
        r.peak = r.current
    n_all.current += 1
    n_all.allocated += 1
    if n_all.current > n_all.peak:
        n_all.peak = n_all.current
    b_all.current += size
    b_all.allocated += size
    if b_all.current > b_all.peak:
        b_all.peak = b_all.current
    r_all.current += requested
    r_all.allocated += requested
    if r_all.current > r_all.peak:
        r_all.peak = r_all.current


def _uncount_block(counters: tuple[_Counter, ...], size: int, requested: int) -> None:
    n, b, r, n_all, b_all, r_all = counters
    n.current -= 1
    n.freed += 1
    b.current -= size
    b.freed += size
    r.current -= requested
    r.freed += requested
    n_all.current -= 1
    n_all.freed += 1
    b_all.current -= size
    b_all.freed += size
    r_all.current -= requested
    r_all.freed += requested


def _round_up(value: int, step: int) -> int:
    return (value + step - 1) // step * step


@dataclass(eq=False)
class _Segment:
    """One buffer object of a pool."""

    buffer: Buffer
    pool: str
    size: int


class _Block:
    """A byte range of a segment, free or allocated (a plain slotted class:
    blocks are made and merged on the allocation path)."""

    __slots__ = (
        "allocated",
        "fences",
        "next",
        "offset",
        "prev",
        "requested",
        "segment",
        "seq",
        "size",
    )

    def __init__(
        self,
        segment: _Segment,
        offset: int,
        size: int,
        seq: int,
        prev: _Block | None = None,
        next: _Block | None = None,
        fences: dict[int | Timeline, int] | None = None,
    ) -> None:
        self.segment = segment
        self.offset = offset
        self.size = size
        self.seq = seq
        self.allocated = False
        self.requested = 0
        self.prev = prev
        self.next = next
        # timeline -> last fence launched there when the block was freed
        self.fences: dict[int | Timeline, int] = {} if fences is None else fences


class _Counter:
    """current/peak/allocated/freed of one statistic."""

    __slots__ = ("allocated", "current", "freed", "peak")

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self.allocated = 0
        self.freed = 0


class Allocation:
    """Device memory handed out by a :class:`CachingAllocator`.

    ``buffer`` is the segment's :class:`npu.Buffer`; the allocation is the
    ``size`` bytes at byte ``offset`` of it. The memory goes back to the
    allocator when the allocation is garbage-collected or :meth:`release`
    is called (after which it must not be used).
    """

    __slots__ = ("__weakref__", "_block", "_owner", "buffer", "offset", "size")

    def __init__(
        self, owner: CachingAllocator, block: _Block, buffer: Buffer, offset: int, size: int
    ) -> None:
        self.buffer = buffer
        self.offset = offset
        self.size = size
        self._owner: CachingAllocator | None = owner
        self._block = block

    def release(self) -> None:
        """Give the memory back now instead of at garbage collection. Idempotent."""
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._queue_free(self._block)
            rec = _spans.recorder
            if rec is not None:
                rec.instant("allocator.free", {"size": self.size})

    def __del__(self) -> None:
        # No locks here (a collection may run anywhere): only a queue append.
        owner = self._owner
        if owner is not None:
            self._owner = None
            owner._queue_free(self._block)
            rec = _spans.recorder
            if rec is not None:
                rec.instant("allocator.free", {"size": self.size})

    def __repr__(self) -> str:
        handle = "freed" if self.buffer.freed else self.buffer.handle
        return f"<npu.Allocation handle={handle} offset={self.offset} size={self.size}>"


class CachingAllocator:
    """The caching allocator of one device (see the module documentation).

    Get a device's allocator with :func:`allocator`. Thread-safe: frees
    arriving from garbage collection (any thread, any moment) are queued and
    processed at the next call under the allocator's lock.
    """

    def __init__(self, device: Device, caching: bool | None = None) -> None:
        self.device = device
        self.caching = (
            os.environ.get(NO_CACHING_ENV, "") not in ("1", "true", "yes")
            if caching is None
            else caching
        )
        # Protects the pools, the segments and the counters.
        self._lock = threading.Lock()
        self._eager: EagerQueue | None = None
        # Blocks freed by finalizers, processed under _lock by the next call.
        self._pending: collections.deque[tuple[_Block, dict[int | Timeline, int]]] = (
            collections.deque()
        )
        self._free: dict[str, list[tuple[int, int, _Block]]] = {p: [] for p in _POOLS}
        self._segments: list[_Segment] = []
        # Caching off: segments freed while a stream may still use them,
        # destroyed once their streams pass those fences.
        self._doomed: list[tuple[_Segment, dict[int | Timeline, int]]] = []
        self._seq = itertools.count()
        self._stats = {(s, p): _Counter() for s in _STATS for p in _ALL_POOLS}
        # The counters every allocation and free updates, per pool: the
        # pool's and then "all"'s allocation, allocated_bytes, requested_bytes.
        self._block_counters = {
            pool: tuple(
                self._stats[(stat, where)]
                for where in (pool, "all")
                for stat in ("allocation", "allocated_bytes", "requested_bytes")
            )
            for pool in _POOLS
        }
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_host_waits = 0

    # -- allocation -----------------------------------------------------------

    def allocate(
        self,
        size: int,
        host_write: bool = False,
        wait: Waiter | None = None,
        stream: Timeline | None = None,
        any_timeline: bool = False,
    ) -> Allocation:
        """Return ``size`` bytes (``size`` > 0) of device memory.

        Args:
            size: bytes wanted.
            host_write: the host writes the memory before any new op uses it;
                wait for the ops that used a reused block first.
            wait: how to wait for a fence (default :meth:`npu.Device.wait`).
            stream: the user stream whose ops use the memory first (its
                :class:`npu.core.stream.StreamKey`); None: the default stream.
            any_timeline: ops of any timeline will use the memory (a graph's,
                which replays on any stream): like an upload, only a block
                idle on every timeline will do.

        Raises:
            ValueError: ``size`` is not positive.
            NpuError: BO_CREATE failed (``ENOMEM`` after emptying the cache
                and retrying once).
        """
        if size <= 0:
            raise ValueError(f"allocate: size={size} must be positive")
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        rounded = _round_up(size, ALIGN)
        pool = "small_pool" if rounded <= SMALL_REQUEST else "large_pool"
        # The timeline the memory is used on first; None: the host.
        on: Timeline | None = None
        if not (host_write or any_timeline):
            on = self._eager_queue() if stream is None else stream
        fences: dict[int | Timeline, int] = {}
        with self._lock:
            if self._pending or self._doomed:
                self._drain()
            block = self._take_free(pool, rounded, on) if self.caching else None
            if block is None and self.caching and self._coalesce(pool):
                block = self._take_free(pool, rounded, on)
            if block is None:
                try:
                    block = self._new_segment(pool, rounded)
                except NpuError as exc:
                    # Out of memory: a block still in use by queued ops will do
                    # after a wait.
                    if exc.errno != errno.ENOMEM:
                        raise
                    block = self._take_free(pool, rounded, on, busy_ok=True)
                    if block is None:
                        raise
                    fences = {q: f for q, f in block.fences.items() if _matters(q, on)}
            block.allocated = True
            block.requested = size
            block.fences = {}
            _count_block(self._block_counters[pool], block.size, size)
        if fences:
            self._wait_fences(fences, wait)
        if rec is not None:
            rec.add("allocator.allocate", t0, _spans.now(), {"size": size, "pool": pool})
        return Allocation(self, block, block.segment.buffer, block.offset, size)

    def _eager_queue(self) -> EagerQueue:
        """The device's default-stream queue (looked up once)."""
        eager = self._eager
        if eager is None:
            eager = self._eager = eager_queue(self.device)
        return eager

    def _queue_free(self, block: _Block) -> None:
        """Finalizer of an :class:`Allocation`: no locks here, only a queue append."""
        # last_fences() takes no lock: taking the device's lock here could
        # deadlock if the collection ran inside one of its critical sections.
        self._pending.append((block, self.device.last_fences()))

    def _wait_fences(self, fences: dict[int | Timeline, int], wait: Waiter | None) -> None:
        for queue, fence in fences.items():
            if self._done(queue, fence):
                continue
            self.num_host_waits += 1
            if wait is not None:
                wait(self.device, queue, fence)
            elif isinstance(queue, int):
                self.device.wait(fence, queue=queue)
            else:
                queue.wait(fence)

    def _take_free(
        self, pool: str, size: int, on: Timeline | None, busy_ok: bool = False
    ) -> _Block | None:
        """Best fit from the pool's free list, split if worth it (lock held).

        Only blocks that no op queued on a timeline other than ``on`` can
        still use are taken (``on`` None: the host is about to write them,
        so no queued op at all), unless ``busy_ok``.
        """
        free = self._free[pool]
        i = bisect.bisect_left(free, (size, -1))
        if not busy_ok:
            end = min(len(free), i + _IDLE_SCAN)
            while i < end and not self._usable(free[i][2], on):
                i += 1
            if i == end:
                return None
        if i == len(free):
            return None
        block = free.pop(i)[2]
        rest = block.size - size
        if rest >= (ALIGN if pool == "small_pool" else LARGE_MIN_SPLIT):
            tail = _Block(
                block.segment,
                block.offset + size,
                rest,
                next(self._seq),
                prev=block,
                next=block.next,
                fences=dict(block.fences),
            )
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._insert_free(tail)
        return block

    def _done(self, queue: int | Timeline, fence: int) -> bool:
        if isinstance(queue, int):
            return self.device.completed(queue, fence)
        return queue.completed(fence)

    def _usable(self, block: _Block, on: Timeline | None) -> bool:
        """True if every op launched before the block was freed has completed,
        except those on timeline ``on``, which will run before ops ``on`` it."""
        for queue, fence in block.fences.items():
            if _matters(queue, on) and not self._done(queue, fence):
                return False
        return True

    def _new_segment(self, pool: str, size: int) -> _Block:
        """A new buffer object holding one block of ``size`` bytes (lock held)."""
        if not self.caching:
            seg_size = size
        elif pool == "small_pool":
            seg_size = SMALL_SEGMENT
        else:
            seg_size = _round_up(size, LARGE_ROUND)
        try:
            buffer = self.device.alloc(seg_size)
        except NpuError as exc:
            if exc.errno != errno.ENOMEM or not self._segments:
                if exc.errno == errno.ENOMEM:
                    self.num_ooms += 1
                raise
            self.num_alloc_retries += 1
            log.info("BO_CREATE(%d) failed with ENOMEM; emptying the cache and retrying", seg_size)
            self._release_free_segments()
            try:
                buffer = self.device.alloc(seg_size)
            except NpuError as again:
                if again.errno == errno.ENOMEM:
                    self.num_ooms += 1
                raise
        segment = _Segment(buffer, pool, seg_size)
        self._segments.append(segment)
        self._count(pool, "segment", 1)
        self._count(pool, "reserved_bytes", seg_size)
        block = _Block(segment, 0, seg_size, next(self._seq))
        if seg_size > size:
            tail = _Block(segment, size, seg_size - size, next(self._seq), prev=block)
            block.next = tail
            block.size = size
            self._insert_free(tail)
        return block

    # -- freeing --------------------------------------------------------------

    def _drain(self) -> None:
        """Process the frees queued by finalizers (lock held)."""
        while self._pending:
            block, fences = self._pending.popleft()
            self._free_block(block, fences)
        if self._doomed:
            self._destroy_doomed(wait=False)

    def _stream_fences_done(self, fences: dict[int | Timeline, int]) -> bool:
        """Has every user stream passed its fence? (The driver's queues keep
        their buffer objects alive themselves.)"""
        return all(isinstance(q, int) or q.completed(f) for q, f in fences.items())

    def _wait_streams(self, fences: dict[int | Timeline, int]) -> bool:
        """Wait until every user stream passed its fence (lock held); False if a
        wait failed (a timeout, a failed op: the error is the stream's to
        report), so the memory must stay."""
        for queue, fence in fences.items():
            if not isinstance(queue, int) and not queue.completed(fence):
                self.num_host_waits += 1
                try:
                    queue.wait(fence)
                except NpuError as exc:
                    log.warning("keeping a segment %r may still use: %s", queue, exc)
                    return False
        return True

    def _destroy_doomed(self, wait: bool) -> int:
        """Destroy the doomed segments whose streams are done (all, after
        waiting, with ``wait``); return the bytes released (lock held)."""
        released = 0
        keep = []
        for segment, fences in self._doomed:
            done = self._wait_streams(fences) if wait else self._stream_fences_done(fences)
            if not done:
                keep.append((segment, fences))
                continue
            released += segment.size
            self._drop_segment(segment)
        self._doomed = keep
        return released

    def _free_block(self, block: _Block, fences: dict[int | Timeline, int]) -> None:
        pool = block.segment.pool
        block.allocated = False
        _uncount_block(self._block_counters[pool], block.size, block.requested)
        block.requested = 0
        block.fences = fences
        if block.segment.buffer.freed:
            self._drop_segment(block.segment)
            return
        if not self.caching:
            if self._stream_fences_done(fences):
                self._drop_segment(block.segment)
            else:
                self._doomed.append((block.segment, fences))
            return
        # Merging with free neighbours waits until a request finds no fit
        # (_coalesce): a block freed and asked for again, the common case,
        # costs one list insert and one pop.
        self._insert_free(block)

    def _coalesce(self, pool: str) -> bool:
        """Merge every run of adjacent free blocks of the pool; True if any merged."""
        merged = False
        survivors = []
        for _, _, block in self._free[pool]:
            if block.offset < 0:  # absorbed by a block before it
                continue
            while block.next is not None and not block.next.allocated:
                other = block.next
                self._merge(block, other)
                other.offset = -1
                merged = True
            survivors.append(block)
        if merged:
            self._free[pool] = sorted(
                ((b.size, b.seq, b) for b in survivors if b.offset >= 0),
                key=lambda e: (e[0], e[1]),
            )
        return merged

    def _merge(self, block: _Block, other: _Block) -> _Block:
        """Merge two adjacent free blocks into the first of them."""
        first, second = (block, other) if block.offset < other.offset else (other, block)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        for queue, fence in second.fences.items():
            first.fences[queue] = max(fence, first.fences.get(queue, 0))
        return first

    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._free[block.segment.pool], (block.size, block.seq, block))

    def _drop_segment(self, segment: _Segment) -> None:
        """Destroy a segment's buffer object (lock held)."""
        self._segments.remove(segment)
        self._uncount(segment.pool, "segment", 1)
        self._uncount(segment.pool, "reserved_bytes", segment.size)
        try:
            segment.buffer.free()
        except NpuError as exc:
            log.warning("freeing segment %r failed: %s", segment.buffer, exc)

    def _release_free_segments(self) -> int:
        """Destroy every segment that is one free block, once no stream may
        still use it (waiting for those that may); return the bytes released."""
        released = self._destroy_doomed(wait=True)
        for pool in _POOLS:
            self._coalesce(pool)
            keep = []
            for entry in self._free[pool]:
                block = entry[2]
                if block.prev is None and block.next is None and self._wait_streams(block.fences):
                    released += block.segment.size
                    self._drop_segment(block.segment)
                else:
                    keep.append(entry)
            self._free[pool] = keep
        return released

    def empty_cache(self) -> int:
        """Return every wholly free segment to the driver; return the bytes released.

        Segments still holding an allocation stay. A segment that queued
        stream work may still use is returned after that work completed
        (this waits for it); the driver's own queues keep their buffer
        objects alive until their ops retire.
        """
        with self._lock:
            self._drain()
            released = self._release_free_segments()
        log.debug("empty_cache released %d bytes", released)
        return released

    # -- statistics -----------------------------------------------------------

    def _count(self, pool: str, stat: str, amount: int) -> None:
        for c in (self._stats[(stat, pool)], self._stats[(stat, "all")]):
            c.current += amount
            c.allocated += amount
            if c.current > c.peak:
                c.peak = c.current

    def _uncount(self, pool: str, stat: str, amount: int) -> None:
        for c in (self._stats[(stat, pool)], self._stats[(stat, "all")]):
            c.current -= amount
            c.freed += amount

    def memory_stats(self) -> dict[str, int]:
        """Counters with PyTorch's key names, e.g. ``allocated_bytes.all.current``.

        For each of ``allocation``, ``segment``, ``allocated_bytes``,
        ``reserved_bytes`` and ``requested_bytes``, and each of ``all``,
        ``small_pool`` and ``large_pool``: ``current``, ``peak``,
        ``allocated`` and ``freed``; plus ``num_alloc_retries``, ``num_ooms``
        and ``num_host_waits`` (allocations for an upload that had to wait
        for queued ops).
        """
        with self._lock:
            self._drain()
            out: dict[str, int] = {}
            for (stat, pool), c in self._stats.items():
                out[f"{stat}.{pool}.current"] = c.current
                out[f"{stat}.{pool}.peak"] = c.peak
                out[f"{stat}.{pool}.allocated"] = c.allocated
                out[f"{stat}.{pool}.freed"] = c.freed
            out["num_alloc_retries"] = self.num_alloc_retries
            out["num_ooms"] = self.num_ooms
            out["num_host_waits"] = self.num_host_waits
        return dict(sorted(out.items()))

    def reset_peak_stats(self) -> None:
        """Set every ``peak`` to its ``current`` value."""
        with self._lock:
            self._drain()
            for c in self._stats.values():
                c.peak = c.current

    def memory_allocated(self) -> int:
        """Bytes in live allocations (``allocated_bytes.all.current``)."""
        with self._lock:
            self._drain()
            return self._stats[("allocated_bytes", "all")].current

    def memory_reserved(self) -> int:
        """Bytes in segments held from the driver (``reserved_bytes.all.current``)."""
        with self._lock:
            self._drain()
            return self._stats[("reserved_bytes", "all")].current


def allocator(device: Device) -> CachingAllocator:
    """The caching allocator of ``device`` (created on first use, dropped at close)."""
    return device.attachment(CachingAllocator)


def _resolve(device: Device | None) -> Device:
    return default_device() if device is None else device


def memory_stats(device: Device | None = None) -> dict[str, int]:
    """:meth:`CachingAllocator.memory_stats` of ``device`` (default: the default device)."""
    return allocator(_resolve(device)).memory_stats()


def memory_allocated(device: Device | None = None) -> int:
    """Bytes held by live tensors on ``device``."""
    return allocator(_resolve(device)).memory_allocated()


def memory_reserved(device: Device | None = None) -> int:
    """Bytes the caching allocator holds from the driver on ``device``."""
    return allocator(_resolve(device)).memory_reserved()


def reset_peak_memory_stats(device: Device | None = None) -> None:
    """Reset the ``peak`` counters of ``device``'s allocator."""
    allocator(_resolve(device)).reset_peak_stats()


def empty_cache(device: Device | None = None) -> int:
    """Return the cached free segments of ``device`` to the driver; bytes released."""
    return allocator(_resolve(device)).empty_cache()
