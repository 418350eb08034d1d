"""Ordering and grouping a partition's ops so independent ones run at the same time.

The device runs a command flagged ``concurrent`` together with the commands
before it back to the last one without the flag, each on its own AI core
(``Cap.CONCURRENT``, docs/npu-spec.md section 6.3). Two steps make use of it:

1. :func:`level_order` reorders the ops by dependency level (a stable,
   as-soon-as-possible topological order): the branches of an Inception
   block, or the projection shortcut next to ResNet's main path, become
   neighbours. Dependencies come from the tensors each op reads and writes
   (read after write, write after read, write after write), before memory
   is placed.
2. :func:`concurrent_flags` then walks the ops in that order, after memory
   is placed, and flags an op when its byte ranges conflict with none of
   the ops since the last unflagged one. Placement may reuse memory, so
   this second check sees the hazards the first cannot.

Only the order changes: every op still runs after every op it depends on,
so the results are those of the sequential order.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Final

from .. import _abi
from ..kernels.descriptors import TensorOp

__all__ = ["MIN_CONCURRENT_WORK", "Range", "concurrent_flags", "level_order", "op_work"]

# (buffer key, first byte, end byte) of an operand in device memory.
Range = tuple[int, int, int]

# The least work (multiply-adds, or elements for the other ops) for which an
# op joins a group: handing an op to another AI core costs about as much as
# running 2^20 multiply-adds (tens of microseconds), so smaller ops run in
# turn on the command processor.
MIN_CONCURRENT_WORK: Final = 1 << 20


def op_work(op: TensorOp) -> int:
    """Rough work of ``op``: multiply-adds of a CONV2D, MATMUL or LINEAR,
    else the output's elements."""
    out = math.prod(op.operands[-1].shape)
    if op.opcode == _abi.Opcode.CONV2D:
        return out * math.prod(op.operands[1].shape[1:])  # (C / groups) * KH * KW
    if op.opcode in (_abi.Opcode.MATMUL, _abi.Opcode.LINEAR):
        return out * op.operands[0].shape[-1]
    return out


def level_order(
    accesses: Sequence[tuple[Sequence[Hashable], Sequence[Hashable]]],
) -> tuple[list[int], list[int]]:
    """A topological order of ops given as ``(reads, writes)`` storage keys.

    Op ``j`` depends on an earlier op ``i`` when ``i`` writes what ``j``
    reads or writes, or reads what ``j`` writes. Each op's level is one
    more than its dependencies' highest (0 without any). Returns the op
    indices by level, in their original order within a level, and the
    level of each op in that order.
    """
    writer: dict[Hashable, int] = {}
    readers: dict[Hashable, list[int]] = {}
    level: list[int] = []
    for j, (reads, writes) in enumerate(accesses):
        deps: set[int] = set()
        for key in reads:
            if key in writer:
                deps.add(writer[key])
        for key in writes:
            if key in writer:
                deps.add(writer[key])
            deps.update(readers.get(key, ()))
        deps.discard(j)
        level.append(1 + max((level[d] for d in deps), default=-1))
        for key in reads:
            readers.setdefault(key, []).append(j)
        for key in writes:
            writer[key] = j
            readers[key] = []
    order = sorted(range(len(accesses)), key=lambda j: (level[j], j))
    return order, [level[j] for j in order]


def _overlaps(a: Range, b: Range) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _conflicts(xs: Sequence[Range], ys: Sequence[Range]) -> bool:
    return any(_overlaps(x, y) for x in xs for y in ys)


def concurrent_flags(
    ranges: Sequence[tuple[Sequence[Range], Sequence[Range]]],
    barriers: Sequence[int] = (),
    small: Sequence[bool] = (),
) -> list[bool]:
    """Which ops may run with the ops before them: ``ranges`` are each op's
    ``(reads, writes)`` byte ranges in submission order.

    An op is flagged when it neither writes what an op of its group reads
    or writes nor reads what one writes; else it starts a new group. An op
    whose index is in ``barriers`` (the first of each submission), or that
    is ``small`` (too little work to hand to another core), always starts
    one.
    """
    starts = set(barriers) | {i for i, s in enumerate(small) if s}
    flags: list[bool] = []
    group_reads: list[Range] = []
    group_writes: list[Range] = []
    for i, (reads, writes) in enumerate(ranges):
        joins = (
            bool(flags)
            and i not in starts
            and not _conflicts(writes, group_reads)
            and not _conflicts(writes, group_writes)
            and not _conflicts(reads, group_writes)
        )
        if not joins:
            group_reads, group_writes = [], []
        flags.append(joins)
        group_reads.extend(reads)
        group_writes.extend(writes)
    return flags
