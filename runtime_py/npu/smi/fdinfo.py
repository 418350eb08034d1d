"""The processes using an NPU, from DRM fdinfo (``/proc/PID/fdinfo/FD``).

An open file of the device shows ``drm-driver: npu`` in its fdinfo, with
the keys of the kernel's ``Documentation/gpu/drm-usage-stats.rst``
(``drm-client-id``, ``drm-pdev``, ``drm-engine-compute`` in ns,
``drm-total-<region>``, ``drm-resident-<region>``, ...) and the driver's
own ``npu-*`` keys (``kernel_module/npu_drv.c``: ``npu-memory-host`` and
``npu-memory-device``, what is charged to the file). One process may hold
several files (several clients) and several descriptors of one file (one
client, ``dup``): :func:`processes` gives one row per process and device,
counting each client once.

:func:`waiters` finds threads blocked in a wait ioctl on a device file (the
NPU WAIT, or a DRM syncobj wait): ``/proc/PID/task/TID/syscall`` names the
system call, its descriptor and its request. Both need root to see other
users' processes; without it only the caller's own show.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from npu import _abi

from .fs import Roots, read_optional

log = logging.getLogger(__name__)

DRIVER_NAME: Final = "npu"
_UNITS: Final[dict[str, int]] = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_ACCEL_NODE_RE = re.compile(r"/dev/accel/accel(\d+)$")

#: The ioctl system call's number (``/proc/PID/syscall`` gives numbers).
_IOCTL_NR: Final[dict[str, int]] = {"x86_64": 16, "aarch64": 29, "riscv64": 29}


def _ioctl_key(request: int) -> tuple[int, int]:
    """An ioctl request's type letter and number (its size and direction left out)."""
    return (request >> 8) & 0xFF, request & 0xFF


_DRM_SYNCOBJ_WAIT_NR: Final = 0xC3  # drm.h DRM_IOCTL_SYNCOBJ_WAIT
#: The ioctls that block until a fence signals, by (type, nr).
WAIT_IOCTLS: Final[dict[tuple[int, int], str]] = {
    _ioctl_key(_abi.DRM_IOCTL_NPU_WAIT): "NPU_WAIT",
    (_abi.NPU_DRM_IOCTL_BASE, _DRM_SYNCOBJ_WAIT_NR): "SYNCOBJ_WAIT",
    _ioctl_key(_abi.DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT): "SYNCOBJ_TIMELINE_WAIT",
}


def parse_value(text: str) -> int | None:
    """A fdinfo value in bytes or ns: ``"4096"``, ``"12 KiB"``, ``"5000 ns"``; None if not one."""
    parts = text.split()
    if not parts:
        return None
    try:
        value = int(parts[0])
    except ValueError:
        return None
    unit = parts[1] if len(parts) > 1 else ""
    if unit == "ns":
        return value
    scale = _UNITS.get(unit)
    return None if scale is None else value * scale


def parse_fdinfo(text: str) -> dict[str, str]:
    """The ``key: value`` lines of one fdinfo file."""
    keys: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            keys[key.strip()] = value.strip()
    return keys


@dataclass(frozen=True)
class Client:
    """One descriptor of a device file, as its fdinfo shows it."""

    pid: int
    fd: int
    client_id: int
    pdev: str | None  #: the PCI address (``drm-pdev``)
    minor: int | None  #: the accel minor, from the descriptor's link, if readable
    engine_ns: int
    memory_host: int  #: bytes charged to the file (``npu-memory-host``, else ``drm-total-host``)
    memory_device: int  #: the same for device memory
    keys: dict[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class ProcessInfo:
    """A process using a device: its clients of that device, summed."""

    pid: int
    name: str
    device: int | None  #: the device index, None if unknown
    pci_address: str | None
    client_ids: tuple[int, ...]
    fds: tuple[int, ...]
    memory_host: int
    memory_device: int
    engine_ns: int

    @property
    def memory(self) -> int:
        """Host and device memory together, in bytes."""
        return self.memory_host + self.memory_device


@dataclass(frozen=True)
class Waiter:
    """A thread blocked in a wait ioctl on a device file."""

    pid: int
    tid: int
    name: str
    fd: int
    ioctl: str  #: ``NPU_WAIT``, ``SYNCOBJ_WAIT`` or ``SYNCOBJ_TIMELINE_WAIT``
    client_id: int
    pdev: str | None
    minor: int | None


def _pids(roots: Roots) -> Iterator[int]:
    try:
        names = os.listdir(roots.proc)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def _memory(keys: dict[str, str], region: str) -> int:
    for key in (f"npu-memory-{region}", f"drm-total-{region}"):
        if key in keys:
            value = parse_value(keys[key])
            if value is not None:
                return value
    return 0


def _minor(roots: Roots, pid: int, fd: int) -> int | None:
    try:
        target = os.readlink(roots.proc / str(pid) / "fd" / str(fd))
    except OSError:
        return None
    m = _ACCEL_NODE_RE.search(target)
    return int(m.group(1)) if m else None


def clients_of(roots: Roots, pid: int) -> list[Client]:
    """The device files ``pid`` holds (one entry per descriptor); [] if it went away."""
    fdinfo = roots.proc / str(pid) / "fdinfo"
    try:
        fds = sorted(int(n) for n in os.listdir(fdinfo) if n.isdigit())
    except OSError:
        return []
    found: list[Client] = []
    for fd in fds:
        text = read_optional(fdinfo / str(fd))
        if not text or "drm-driver" not in text:
            continue
        keys = parse_fdinfo(text)
        if keys.get("drm-driver") != DRIVER_NAME:
            continue
        try:
            client_id = int(keys.get("drm-client-id", ""))
        except ValueError:
            log.debug("pid %d fd %d: no drm-client-id", pid, fd)
            continue
        found.append(
            Client(
                pid=pid,
                fd=fd,
                client_id=client_id,
                pdev=keys.get("drm-pdev"),
                minor=_minor(roots, pid, fd),
                engine_ns=parse_value(keys.get("drm-engine-compute", "")) or 0,
                memory_host=_memory(keys, "host"),
                memory_device=_memory(keys, "device"),
                keys=keys,
            )
        )
    return found


def all_clients(roots: Roots) -> list[Client]:
    """Every device descriptor of every process under ``roots.proc``."""
    found: list[Client] = []
    for pid in _pids(roots):
        found.extend(clients_of(roots, pid))
    return found


def process_name(roots: Roots, pid: int) -> str:
    """``/proc/PID/comm``, or ``"?"``."""
    return read_optional(roots.proc / str(pid) / "comm") or "?"


def device_of(
    pdev: str | None, minor: int | None, by_address: dict[str, int]
) -> tuple[int | None, str | None]:
    """(device index, PCI address) of a client: by ``drm-pdev``, else by its node's minor."""
    if pdev is not None:
        return by_address.get(pdev), pdev
    if minor is not None:
        for address, index in by_address.items():
            if index == minor:
                return index, address
        return minor, pdev
    return None, pdev


def processes(
    roots: Roots, by_address: dict[str, int], clients: Iterable[Client] | None = None
) -> list[ProcessInfo]:
    """One row per process and device; a client (``drm-client-id``) counts once
    however many descriptors of it the process holds. ``by_address`` maps
    PCI addresses to device indexes."""
    groups: dict[tuple[int, int | None], dict[int, Client]] = {}
    fds: dict[tuple[int, int | None], list[int]] = {}
    addresses: dict[tuple[int, int | None], str | None] = {}
    for c in all_clients(roots) if clients is None else clients:
        index, address = device_of(c.pdev, c.minor, by_address)
        key = (c.pid, index)
        groups.setdefault(key, {}).setdefault(c.client_id, c)
        fds.setdefault(key, []).append(c.fd)
        addresses[key] = address
    rows = []
    for (pid, index), members in groups.items():
        unique = list(members.values())
        rows.append(
            ProcessInfo(
                pid=pid,
                name=process_name(roots, pid),
                device=index,
                pci_address=addresses[(pid, index)],
                client_ids=tuple(sorted(members)),
                fds=tuple(sorted(fds[(pid, index)])),
                memory_host=sum(c.memory_host for c in unique),
                memory_device=sum(c.memory_device for c in unique),
                engine_ns=sum(c.engine_ns for c in unique),
            )
        )
    return sorted(rows, key=lambda r: (r.device if r.device is not None else -1, r.pid))


def _blocked_ioctl(text: str, ioctl_nr: int) -> tuple[int, int] | None:
    """(fd, request) of a thread blocked in ioctl, from its ``syscall`` file."""
    parts = text.split()
    if len(parts) < 3 or parts[0] in ("running", "-1"):
        return None
    try:
        if int(parts[0]) != ioctl_nr:
            return None
        return int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


def waiters(roots: Roots, clients: Iterable[Client] | None = None) -> list[Waiter]:
    """Threads blocked in a wait ioctl (:data:`WAIT_IOCTLS`) on a device descriptor."""
    ioctl_nr = _IOCTL_NR.get(platform.machine(), 16)
    by_pid: dict[int, dict[int, Client]] = {}
    for c in all_clients(roots) if clients is None else clients:
        by_pid.setdefault(c.pid, {})[c.fd] = c
    found: list[Waiter] = []
    for pid, fds in sorted(by_pid.items()):
        tasks = roots.proc / str(pid) / "task"
        try:
            tids = sorted(int(t) for t in os.listdir(tasks) if t.isdigit())
        except OSError:
            continue
        for tid in tids:
            text = read_optional(tasks / str(tid) / "syscall")
            call = _blocked_ioctl(text or "", ioctl_nr)
            if call is None:
                continue
            fd, request = call
            name = WAIT_IOCTLS.get(_ioctl_key(request))
            client = fds.get(fd)
            if name is None or client is None:
                continue
            comm = read_optional(tasks / str(tid) / "comm") or process_name(roots, pid)
            found.append(
                Waiter(pid, tid, comm, fd, name, client.client_id, client.pdev, client.minor)
            )
    return found
