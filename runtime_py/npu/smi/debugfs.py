"""The driver's debugfs files of one device: ``/sys/kernel/debug/npu/npuN/``.

- ``queues``: ``suspended`` while the device sleeps (runtime PM), else one
  line per enabled hardware queue, ``queue=Q kind=kernel|user
  head=H tail=T status=0xS error=E done=D fence_mem=F submitted=S retired=R
  pending_jobs=J oldest_ms=A`` (``-`` where the driver cannot know: a user
  queue's submitted and retired), then ``fw state=NAME heartbeat=N``;
- ``perf``: ``time_ns=N``, per queue ``queue=Q cmds=N busy_ns=N ...``, per AI
  core ``core=K busy_ns=N``;
- ``fw_status``: ``state: N``, ``version``, ``heartbeat``, and the mailbox
  QUERY's ``commands`` and ``log_level`` (or ``mailbox: -errno``);
- ``fw_log``: the firmware's log ring, oldest line first;
- ``watchdog``: ``0`` pauses the driver's watchdog (hang detection,
  heartbeat check, lost-interrupt fallback), ``1`` resumes it.

debugfs is root's (mode 0700) and must be mounted; :func:`device_dir`
raises :class:`~npu.smi.fs.SmiError` saying which of the two is missing.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from .fs import Roots, SmiError, read_optional, read_text, write_text

#: ``enum npu_fw_state`` (include/npu_hw.h).
FW_STATES: Final[dict[int, str]] = {0: "OFF", 1: "RUNNING", 2: "FAILED", 3: "CRASHED"}

#: ``Q_STATUS`` bits (docs/npu-spec.md 5.1.1).
QSTAT_IDLE: Final = 1 << 0
QSTAT_STOPPED: Final = 1 << 1
QSTAT_ACTIVE: Final = 1 << 2
QSTAT_WAITING: Final = 1 << 3
QSTAT_NAMES: Final = (
    (QSTAT_IDLE, "IDLE"),
    (QSTAT_STOPPED, "STOPPED"),
    (QSTAT_ACTIVE, "ACTIVE"),
    (QSTAT_WAITING, "WAITING"),
)

Value = int | str | None


def status_names(status: int) -> str:
    """``Q_STATUS`` bits by name: ``"ACTIVE"``, ``"IDLE|STOPPED"``, ``"0"``."""
    names = [n for bit, n in QSTAT_NAMES if status & bit]
    return "|".join(names) or "0"


def fw_state_name(value: str | int | None) -> str | None:
    """A firmware state as its name (``"RUNNING"``), from a number or a name."""
    if value is None:
        return None
    if isinstance(value, int):
        return FW_STATES.get(value, f"STATE_{value}")
    text = value.strip()
    if text.lstrip("-").isdigit():
        return FW_STATES.get(int(text), f"STATE_{text}")
    return text.upper()


def parse_fields(line: str) -> dict[str, Value]:
    """``key=value`` tokens; a value is an int (decimal or 0x hex), None for ``-``, else text."""
    out: dict[str, Value] = {}
    for token in line.split():
        key, sep, raw = token.partition("=")
        if not sep:
            continue
        if raw == "-":
            out[key] = None
            continue
        try:
            out[key] = int(raw, 0)
        except ValueError:
            out[key] = raw
    return out


def _int(fields: dict[str, Value], key: str, default: int = 0) -> int:
    v = fields.get(key)
    return v if isinstance(v, int) else default


def _opt_int(fields: dict[str, Value], key: str) -> int | None:
    v = fields.get(key)
    return v if isinstance(v, int) else None


@dataclass(frozen=True)
class QueueState:
    """One line of ``queues``: a hardware queue as the device and the driver see it."""

    index: int
    kind: str  #: ``kernel`` (the driver's queue 0) or ``user`` (lent to a process)
    head: int  #: Q_HEAD: commands completed (free-running u32)
    tail: int  #: Q_TAIL: the producer index (doorbell)
    status: int  #: Q_STATUS bits
    error: int | str  #: Q_ERROR
    done: int  #: Q_DONE: the fence of the last command completed
    fence_mem: int  #: the fence write-back in memory
    submitted: int | None  #: last fence the driver handed to the device (None: user queue)
    retired: int | None  #: last fence the driver retired (None: user queue)
    pending_jobs: int | None  #: driver jobs not retired
    oldest_ms: int | None  #: age of the oldest of them (0: none)
    raw: str = field(default="", compare=False)

    @property
    def outstanding(self) -> int:
        """Commands in the ring not completed: ``(tail - head) mod 2**32``."""
        return (self.tail - self.head) & 0xFFFFFFFF

    @property
    def active(self) -> bool:
        """A command of the queue is running (Q_STATUS.ACTIVE)."""
        return bool(self.status & QSTAT_ACTIVE)

    @property
    def waiting(self) -> bool:
        """The head command is a WAIT whose value is not there (Q_STATUS.WAITING)."""
        return bool(self.status & QSTAT_WAITING)

    @property
    def stopped(self) -> bool:
        """The queue stopped on a device error (Q_STATUS.STOPPED)."""
        return bool(self.status & QSTAT_STOPPED)

    @property
    def status_text(self) -> str:
        """The status bits by name."""
        return status_names(self.status)


@dataclass(frozen=True)
class FwInfo:
    """The firmware as ``queues`` or ``fw_status`` shows it."""

    state: str | None  #: ``RUNNING``, ``CRASHED``, ...
    heartbeat: int | None
    version: str | None = None
    commands: int | None = None  #: commands completed, from the mailbox QUERY
    log_level: int | None = None
    mailbox_error: int | None = None  #: the QUERY's -errno when the firmware did not answer


@dataclass(frozen=True)
class QueuesSnapshot:
    """One read of ``queues``."""

    queues: tuple[QueueState, ...]
    fw: FwInfo | None
    monotonic_s: float = 0.0
    suspended: bool = False  #: the device was asleep (runtime PM): no queue runs


def parse_queues(text: str, monotonic_s: float = 0.0) -> QueuesSnapshot:
    """Parse the text of ``queues``; a line it does not know is skipped."""
    queues: list[QueueState] = []
    fw: FwInfo | None = None
    suspended = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "suspended":
            suspended = True
            continue
        if stripped.startswith("fw ") or stripped == "fw":
            f = parse_fields(stripped)
            state = f.get("state")
            fw = FwInfo(
                state=fw_state_name(state if isinstance(state, int | str) else None),
                heartbeat=_opt_int(f, "heartbeat"),
            )
            continue
        f = parse_fields(stripped)
        if not isinstance(f.get("queue"), int):
            continue
        err = f.get("error")
        queues.append(
            QueueState(
                index=_int(f, "queue"),
                kind=str(f.get("kind") or "kernel"),
                head=_int(f, "head"),
                tail=_int(f, "tail"),
                status=_int(f, "status"),
                error=err if isinstance(err, int | str) else 0,
                done=_int(f, "done"),
                fence_mem=_int(f, "fence_mem"),
                submitted=_opt_int(f, "submitted"),
                retired=_opt_int(f, "retired"),
                pending_jobs=_opt_int(f, "pending_jobs"),
                oldest_ms=_opt_int(f, "oldest_ms"),
                raw=stripped,
            )
        )
    return QueuesSnapshot(tuple(queues), fw, monotonic_s, suspended)


def parse_fw_status(text: str) -> FwInfo:
    """Parse ``fw_status`` (``state: 1``, ``version: 1.0``, ``heartbeat: 42``, ...)."""
    keys: dict[str, str] = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep:
            keys[k.strip()] = v.strip()

    def num(name: str) -> int | None:
        try:
            return int(keys[name], 0)
        except (KeyError, ValueError):
            return None

    return FwInfo(
        state=fw_state_name(keys.get("state")),
        heartbeat=num("heartbeat"),
        version=keys.get("version"),
        commands=num("commands"),
        log_level=num("log_level"),
        mailbox_error=num("mailbox"),
    )


@dataclass(frozen=True)
class PerfCounters:
    """One read of ``perf``."""

    time_ns: int | None
    queues: dict[int, dict[str, int]]
    cores: dict[int, int]  #: busy ns per AI core


def parse_perf(text: str) -> PerfCounters:
    """Parse ``perf``."""
    time_ns: int | None = None
    queues: dict[int, dict[str, int]] = {}
    cores: dict[int, int] = {}
    for line in text.splitlines():
        f = parse_fields(line)
        if "queue" in f and isinstance(f["queue"], int):
            queues[f["queue"]] = {k: v for k, v in f.items() if k != "queue" and isinstance(v, int)}
        elif "core" in f and isinstance(f["core"], int):
            cores[f["core"]] = _int(f, "busy_ns")
        elif "time_ns" in f:
            time_ns = _opt_int(f, "time_ns")
    return PerfCounters(time_ns, queues, cores)


def device_dir(roots: Roots, index: int) -> Path:
    """``npu/npuN`` in debugfs; :class:`SmiError` (which file, errno, what to do) if absent."""
    path = roots.npu_debugfs / f"npu{index}"
    try:
        os.stat(path)
        return path
    except OSError as e:
        first = e
    # Say why: not root, debugfs not mounted, or no such device.
    try:
        os.listdir(roots.debugfs)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            raise SmiError.from_oserror(
                roots.debugfs, e, "debugfs is readable by root only: run npu-smi diag as root"
            ) from None
        raise SmiError.from_oserror(roots.debugfs, e, "is debugfs mounted?") from None
    if not os.path.isdir(roots.npu_debugfs):
        if not any(os.scandir(roots.debugfs)):
            hint = "debugfs is not mounted: mount -t debugfs none /sys/kernel/debug"
        else:
            hint = "the npu driver is not loaded, or built without debugfs"
        raise SmiError(roots.npu_debugfs, errno.ENOENT, "[Errno 2] No such file or directory", hint)
    raise SmiError.from_oserror(path, first, f"no debugfs directory for device {index}")


def read_queues(directory: Path) -> QueuesSnapshot:
    """Read and parse ``queues``."""
    text = read_text(directory / "queues", "a driver without the queues file is too old for diag")
    return parse_queues(text, time.monotonic())


def read_fw_status(directory: Path) -> FwInfo | None:
    """Read and parse ``fw_status``; None when the driver has no such file."""
    text = read_optional(directory / "fw_status")
    return None if text is None else parse_fw_status(text)


def read_perf(directory: Path) -> PerfCounters | None:
    """Read and parse ``perf``; None when the driver has no such file."""
    text = read_optional(directory / "perf")
    return None if text is None else parse_perf(text)


def fw_log_tail(directory: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of ``fw_log`` ([] when there is none)."""
    text = read_optional(directory / "fw_log")
    if not text or lines <= 0:
        return []
    return text.splitlines()[-lines:]


def watchdog(directory: Path) -> bool | None:
    """Whether the driver's watchdog runs (None: no ``watchdog`` file)."""
    text = read_optional(directory / "watchdog")
    if text is None:
        return None
    return text.strip() not in ("0", "N", "n")


def set_watchdog(directory: Path, enabled: bool) -> None:
    """Pause (False) or resume (True) the driver's watchdog."""
    write_text(directory / "watchdog", "1" if enabled else "0", "run as root")
