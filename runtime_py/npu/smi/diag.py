"""Hang triage: on which side of the host/firmware boundary a stuck job is.

:func:`diagnose` looks at two reads of debugfs ``queues`` (some time
apart), the firmware's state and heartbeat, and the threads blocked in a
wait ioctl, and gives each queue with pending work one verdict:

========== ==================================================================
``running``   the queue made progress between the two reads (not stuck)
``waiting``   its head command is a WAIT whose value is not there
              (``Q_STATUS.WAITING``): it waits on a dependency
``engine``    taken but not finished by the engine: a command is running
              (``Q_STATUS.ACTIVE``) and its fence is not written
              (``fence_mem < submitted``)
``firmware``  submitted but not taken by the firmware: the ring holds
              commands (``tail != head``) and none runs or waits; the
              firmware is not running, its heartbeat stands still, the
              queue stopped, or it just did not take them
``interrupt`` finished but its interrupt not handled: the device completed
              the fence (``done``/``fence_mem``) the driver has not retired
              (``retired < done``)
``host``      the driver counts fences as submitted (``submitted >
              retired``) but the ring holds no command for them
========== ==================================================================

The device's overall verdict is the most telling of its queues' (engine,
firmware, interrupt, host, waiting, running, in that order); with nothing
pending it is ``host`` (never submitted by the host) if a thread waits on
the device anyway (an unflushed stream, a wait on a point nobody
submitted), ``running`` if a queue drained between the reads, else
``idle``. :func:`run` gathers the evidence of a real
device; the verdicts come with the values they rest on.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from npu import coredump

from . import debugfs
from .debugfs import FwInfo, PerfCounters, QueuesSnapshot, QueueState
from .fdinfo import Waiter, all_clients, device_of, waiters
from .fs import Roots
from .sysfs import DeviceInfo, DeviceRef, read_device

log = logging.getLogger(__name__)


class Verdict(enum.Enum):
    """What holds a queue (or the device) up."""

    IDLE = "idle"
    RUNNING = "running"
    WAITING = "waiting"
    HOST = "host"
    FIRMWARE = "firmware"
    ENGINE = "engine"
    INTERRUPT = "interrupt"


#: One line per verdict, as the issue words it.
MEANING: Final[dict[Verdict, str]] = {
    Verdict.IDLE: "nothing pending",
    Verdict.RUNNING: "work is pending and making progress",
    Verdict.WAITING: "waiting on a dependency (a WAIT whose value is not there)",
    Verdict.HOST: "never submitted by the host",
    Verdict.FIRMWARE: "submitted but not taken by the firmware",
    Verdict.ENGINE: "taken but not finished by the engine",
    Verdict.INTERRUPT: "finished but its interrupt not handled",
}

#: The verdicts of a stuck job (``npu-smi diag`` exits 1).
STUCK: Final = frozenset({Verdict.HOST, Verdict.FIRMWARE, Verdict.ENGINE, Verdict.INTERRUPT})

#: The overall verdict is the first of these any queue has.
PRIORITY: Final = (
    Verdict.ENGINE,
    Verdict.FIRMWARE,
    Verdict.INTERRUPT,
    Verdict.HOST,
    Verdict.WAITING,
    Verdict.RUNNING,
)


@dataclass(frozen=True)
class QueueVerdict:
    """The verdict on one queue with pending work, and the values it rests on."""

    queue: int
    kind: str
    verdict: Verdict
    explanation: str
    evidence: dict[str, int | str | None]


@dataclass(frozen=True)
class CoredumpSummary:
    """The newest devcoredump of the device."""

    path: str
    reason: str | None
    queue: int | None
    fence: int | None
    client: int | None
    timestamp_s: float | None  #: CLOCK_MONOTONIC of the capture
    error: str | None = None  #: why it could not be decoded


@dataclass(frozen=True)
class Diagnosis:
    """Everything ``npu-smi diag`` reports about one device."""

    device: int
    pci_address: str
    verdict: Verdict
    explanation: str
    queues: tuple[QueueVerdict, ...]
    queue_states: tuple[QueueState, ...] = ()
    fw: FwInfo | None = None
    heartbeat_moving: bool | None = None
    waiters: tuple[Waiter, ...] = ()
    watchdog: bool | None = None
    coredump: CoredumpSummary | None = None
    fw_log: tuple[str, ...] = ()
    info: DeviceInfo | None = None
    perf: PerfCounters | None = None
    interval_s: float = 0.0
    notes: tuple[str, ...] = field(default=())

    @property
    def stuck(self) -> bool:
        """True when the verdict is one of the four sides of a stuck job."""
        return self.verdict in STUCK


def has_pending(q: QueueState) -> bool:
    """The queue has work the device or the driver has not finished."""
    return (
        q.outstanding > 0
        or q.active
        or q.waiting
        or bool(q.pending_jobs)
        or (q.submitted is not None and q.retired is not None and q.submitted != q.retired)
    )


def _fw_text(fw: FwInfo | None, moving: bool | None) -> str:
    if fw is None:
        return "firmware state unknown"
    beat = "?" if fw.heartbeat is None else fw.heartbeat
    text = f"firmware {fw.state or '?'}, heartbeat {beat}"
    if moving is False:
        text += " (standing still)"
    elif moving:
        text += " (advancing)"
    return text


def _firmware_healthy(fw: FwInfo | None, moving: bool | None) -> bool:
    if fw is None:
        return True
    return fw.state in (None, "RUNNING") and moving is not False


def _moved(before: QueueState, after: QueueState) -> bool:
    """The queue completed or retired something between two reads."""
    return (before.head, before.done, before.retired) != (after.head, after.done, after.retired)


def classify(
    q: QueueState,
    fw: FwInfo | None = None,
    heartbeat_moving: bool | None = None,
    previous: QueueState | None = None,
    others: Sequence[QueueState] = (),
) -> QueueVerdict | None:
    """The verdict on one queue (None when it has nothing pending).

    ``previous`` is the same queue in an earlier read: a queue that moved
    since is ``running``. ``others`` are the other queues of the device (a
    command processor busy on another queue explains an untaken one).
    """
    if not has_pending(q):
        return None
    ev: dict[str, int | str | None] = {
        "head": q.head,
        "tail": q.tail,
        "outstanding": q.outstanding,
        "status": f"{q.status:#x} ({q.status_text})",
        "error": q.error,
        "done": q.done,
        "fence_mem": q.fence_mem,
        "submitted": q.submitted,
        "retired": q.retired,
        "pending_jobs": q.pending_jobs,
        "oldest_ms": q.oldest_ms,
    }

    def verdict(v: Verdict, why: str) -> QueueVerdict:
        return QueueVerdict(q.index, q.kind, v, f"{MEANING[v]}: {why}", ev)

    age = f", oldest job {q.oldest_ms} ms old" if q.oldest_ms else ""
    if previous is not None and _moved(previous, q):
        return verdict(
            Verdict.RUNNING,
            f"head {previous.head} -> {q.head}, done {previous.done} -> {q.done}, "
            f"retired {previous.retired} -> {q.retired}",
        )
    if q.waiting:
        return verdict(
            Verdict.WAITING,
            f"Q_STATUS {q.status:#x} has WAITING: the command at head {q.head} is a WAIT "
            f"whose value is not there yet; {q.outstanding} command(s) in the ring{age}",
        )
    if q.active:
        target = q.submitted
        if target is not None and q.fence_mem >= target:
            # Its fence is written: the command is finishing (ACTIVE clears next).
            return verdict(Verdict.RUNNING, f"Q_STATUS {q.status:#x}, fence_mem {q.fence_mem}")
        upto = f" < submitted {target}" if target is not None else ""
        return verdict(
            Verdict.ENGINE,
            f"Q_STATUS {q.status:#x} has ACTIVE: the command at head {q.head} was taken "
            f"and runs, its fence is not written (fence_mem {q.fence_mem}{upto}, "
            f"done {q.done}){age}",
        )
    if q.outstanding > 0:
        reasons = []
        if q.stopped:
            reasons.append(f"the device stopped the queue (Q_STATUS.STOPPED, error {q.error})")
        if not _firmware_healthy(fw, heartbeat_moving):
            reasons.append(_fw_text(fw, heartbeat_moving))
        busy = [o.index for o in others if o.index != q.index and o.active]
        if busy:
            reasons.append(f"the command processor is on queue {busy[0]} (ACTIVE)")
        if not reasons:
            reasons.append(_fw_text(fw, heartbeat_moving) + ", but it has not taken them")
        return verdict(
            Verdict.FIRMWARE,
            f"tail {q.tail} - head {q.head} = {q.outstanding} command(s) in the ring, none "
            f"ACTIVE or WAITING (Q_STATUS {q.status:#x}); " + "; ".join(reasons) + age,
        )
    finished = max(q.done, q.fence_mem)
    if q.retired is not None and finished > q.retired:
        return verdict(
            Verdict.INTERRUPT,
            f"head == tail == {q.head}: the device completed fence {finished} (done {q.done}, "
            f"fence_mem {q.fence_mem}) but the driver retired only up to {q.retired}; "
            f"{q.pending_jobs if q.pending_jobs is not None else '?'} job(s) pending{age}",
        )
    if q.submitted is not None and q.retired is not None and q.submitted > q.retired:
        return verdict(
            Verdict.HOST,
            f"the driver handed out fences up to {q.submitted} (retired {q.retired}), but "
            f"head == tail == {q.head} and the device completed only {q.done}: no command "
            f"for them reached the ring{age}",
        )
    return None


def diagnose(
    second: QueuesSnapshot,
    first: QueuesSnapshot | None = None,
    fw: FwInfo | None = None,
    waiting_threads: Sequence[Waiter] = (),
    device: int = 0,
    pci_address: str = "",
) -> Diagnosis:
    """The verdicts from two reads of ``queues`` (``first`` may be None: one read).

    ``fw`` is the firmware as ``fw_status`` shows it; the ``fw`` lines of the
    reads give the state and heartbeat when present. ``waiting_threads``
    are the threads blocked in a wait on this device.
    """
    fw_now = second.fw or fw
    moving: bool | None = None
    before = first.fw if first is not None and first.fw is not None else None
    if (
        before is not None
        and fw_now is not None
        and before.heartbeat is not None
        and fw_now.heartbeat is not None
    ):
        moving = fw_now.heartbeat != before.heartbeat
    if fw_now is not None and fw is not None and fw_now is not fw:
        fw_now = FwInfo(
            state=fw_now.state or fw.state,
            heartbeat=fw_now.heartbeat if fw_now.heartbeat is not None else fw.heartbeat,
            version=fw.version,
            commands=fw.commands,
            log_level=fw.log_level,
            mailbox_error=fw.mailbox_error,
        )
    prev = {q.index: q for q in first.queues} if first is not None else {}
    verdicts = []
    for q in second.queues:
        v = classify(q, fw_now, moving, prev.get(q.index), second.queues)
        if v is not None:
            verdicts.append(v)
    overall, explanation = _overall(
        verdicts, second.queues, waiting_threads, fw_now, moving, second.suspended
    )
    moved = [q for q in second.queues if q.index in prev and _moved(prev[q.index], q)]
    if overall is Verdict.IDLE and moved:
        q = moved[0]
        overall = Verdict.RUNNING
        explanation = (
            f"{MEANING[overall]}: queue {q.index} completed work between the reads "
            f"(head {prev[q.index].head} -> {q.head}) and has drained"
        )
    return Diagnosis(
        device=device,
        pci_address=pci_address,
        verdict=overall,
        explanation=explanation,
        queues=tuple(verdicts),
        queue_states=second.queues,
        fw=fw_now,
        heartbeat_moving=moving,
        waiters=tuple(waiting_threads),
        interval_s=(second.monotonic_s - first.monotonic_s) if first is not None else 0.0,
    )


def _overall(
    verdicts: Sequence[QueueVerdict],
    queues: Sequence[QueueState],
    waiting_threads: Sequence[Waiter],
    fw: FwInfo | None,
    moving: bool | None,
    suspended: bool = False,
) -> tuple[Verdict, str]:
    for v in PRIORITY:
        hit = [qv for qv in verdicts if qv.verdict == v]
        if hit:
            names = ", ".join(f"queue {qv.queue}" for qv in hit)
            return v, f"{MEANING[v]} ({names}): {hit[0].explanation.partition(': ')[2]}"
    drained = ", ".join(
        f"queue {q.index}: head {q.head} == tail {q.tail}"
        + (f", submitted {q.submitted} == retired {q.retired}" if q.submitted is not None else "")
        for q in queues
    )
    if suspended:
        drained = "the device is suspended by runtime PM, which a pending job would prevent"
    if waiting_threads:
        who = "; ".join(
            f"pid {w.pid} ({w.name}) thread {w.tid} blocked in {w.ioctl} on fd {w.fd}"
            for w in waiting_threads
        )
        return Verdict.HOST, (
            f"{MEANING[Verdict.HOST]}: {who}, but no queue has outstanding work "
            f"({drained or 'no queue enabled'}): what it waits for was never submitted "
            "(an unflushed stream, a wait on a point nobody submitted)"
        )
    fw_text = "" if suspended else "; " + _fw_text(fw, moving)
    return Verdict.IDLE, f"{MEANING[Verdict.IDLE]} ({drained or 'no queue enabled'}{fw_text})"


def latest_coredump(roots: Roots, ref: DeviceRef) -> CoredumpSummary | None:
    """The newest pending devcoredump whose failing device is ``ref``'s, decoded."""
    mine = [
        p
        for p in coredump.find_dumps(roots.devcoredump)
        if Path(os.path.realpath(p.parent / "failing_device")) == ref.device_dir
    ]
    if not mine:
        return None
    path = mine[-1]
    try:
        dump = coredump.parse(path.read_bytes())
    except (OSError, ValueError) as e:
        return CoredumpSummary(str(path), None, None, None, None, None, error=str(e))
    return CoredumpSummary(
        path=str(path),
        reason=dump.reason_name,
        queue=dump.queue,
        fence=dump.fence or None,
        client=dump.client or None,
        timestamp_s=dump.timestamp_ns / 1e9,
    )


def run(roots: Roots, ref: DeviceRef, interval_s: float = 0.2, log_lines: int = 10) -> Diagnosis:
    """Gather the evidence of one device and diagnose it.

    Reads debugfs ``queues`` twice ``interval_s`` apart, ``fw_status``,
    ``perf`` and the tail of ``fw_log``, the sysfs counters, the threads
    blocked in a wait on the device, and the newest devcoredump.
    :class:`~npu.smi.fs.SmiError` when debugfs or ``queues`` cannot be read.
    """
    directory = debugfs.device_dir(roots, ref.index)
    first = debugfs.read_queues(directory)
    time.sleep(max(0.0, interval_s))
    second = debugfs.read_queues(directory)
    fw = debugfs.read_fw_status(directory)
    clients = all_clients(roots)
    by_address = {ref.pci_address: ref.index}
    mine = [c for c in clients if device_of(c.pdev, c.minor, by_address)[0] == ref.index]
    blocked = waiters(roots, mine)
    d = diagnose(second, first, fw, blocked, ref.index, ref.pci_address)
    notes = []
    wd = debugfs.watchdog(directory)
    if wd is False:
        notes.append("the driver's watchdog is paused (debugfs watchdog = 0)")
    return dataclasses.replace(
        d,
        watchdog=wd,
        coredump=latest_coredump(roots, ref),
        fw_log=tuple(debugfs.fw_log_tail(directory, log_lines)),
        info=read_device(ref),
        perf=debugfs.read_perf(directory),
        notes=tuple(notes),
    )
