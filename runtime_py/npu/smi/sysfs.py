"""The NPU devices and their sysfs attributes.

A device is an accel device (``/sys/class/accel/accelN``) whose PCI device
has the driver's attribute group ``npu`` (``kernel_module/npu_sysfs.c``):
``/sys/class/accel/accelN/device/npu/``. Its index is ``N`` (the accel
minor, as in ``/dev/npuN`` and debugfs ``npu/npuN``), its PCI address the
name of the ``device`` link's target. Power state:
``device/power/runtime_status``.

Utilisation comes from two samples of ``busy_us`` (device busy time summed
over the queues) and ``device_time_us`` (the device clock):
:func:`utilisation`.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .fs import Roots, SmiError, read_int, read_optional

log = logging.getLogger(__name__)

_ACCEL_RE = re.compile(r"accel(\d+)")


@dataclass(frozen=True)
class DeviceRef:
    """Where one NPU lives: its index and sysfs directories."""

    index: int  #: the accel minor: /dev/npuN, /dev/accel/accelN, debugfs npu/npuN
    device_dir: Path  #: the PCI device's sysfs directory (the ``device`` link resolved)
    attr_dir: Path  #: ``device/npu``: the driver's attributes
    pci_address: str  #: ``0000:00:03.0``
    node: str  #: ``/dev/npuN`` if udev made the link, else ``/dev/accel/accelN``


@dataclass(frozen=True)
class Sample:
    """One reading of the busy and device-clock counters."""

    busy_us: int | None
    device_time_us: int | None
    monotonic_s: float  #: the host's CLOCK_MONOTONIC when read


@dataclass(frozen=True)
class DeviceInfo:
    """What sysfs says about one device (None: an attribute this driver lacks)."""

    ref: DeviceRef
    hw_version: str | None
    fw_version: str | None
    driver_version: str | None
    abi_version: str | None
    num_queues: int | None
    num_cores: int | None
    mem_device_used: int | None  #: bytes of device memory (BAR2) allocated
    mem_device_total: int | None  #: bytes of device memory
    bo_bytes: int | None  #: bytes of every buffer object of the device
    bo_count: int | None
    hangs: int | None
    recoveries: int | None  #: device resets (hang or firmware recovery)
    op_errors: int | None
    irq_count: int | None
    fences: tuple[int, int] | None  #: queue 0: (last fence handed out, last retired)
    power_state: str | None  #: ``active``, ``suspended``, ... (runtime PM)
    sample: Sample


def find_devices(roots: Roots) -> list[DeviceRef]:
    """Every NPU under ``roots``, by index."""
    found: list[DeviceRef] = []
    base = roots.accel_class
    try:
        names = os.listdir(base)
    except OSError:
        return []
    for name in names:
        m = _ACCEL_RE.fullmatch(name)
        if m is None:
            continue
        link = base / name / "device"
        attr = link / "npu"
        if not attr.is_dir():
            continue
        device_dir = Path(os.path.realpath(link))
        index = int(m.group(1))
        npu_node = roots.dev / f"npu{index}"
        node = f"/dev/npu{index}" if os.path.lexists(npu_node) else f"/dev/accel/accel{index}"
        found.append(DeviceRef(index, device_dir, attr, device_dir.name, node))
    return sorted(found, key=lambda d: d.index)


def require_devices(roots: Roots) -> list[DeviceRef]:
    """:func:`find_devices`, or :class:`SmiError` when there is none."""
    found = find_devices(roots)
    if not found:
        raise SmiError(
            roots.accel_class,
            errno.ENODEV,
            "no NPU found (no accel device with an npu attribute group)",
            "is the npu driver loaded? insmod npu.ko",
        )
    return found


def select_device(devices: list[DeviceRef], index: int | None) -> list[DeviceRef]:
    """``devices``, or only the one of ``index``; :class:`SmiError` if none matches."""
    if index is None:
        return devices
    chosen = [d for d in devices if d.index == index]
    if not chosen:
        have = ", ".join(str(d.index) for d in devices) or "none"
        raise SmiError(
            f"/dev/npu{index}", errno.ENODEV, f"no NPU with index {index} (devices: {have})"
        )
    return chosen


def sample(ref: DeviceRef) -> Sample:
    """Read ``busy_us`` and ``device_time_us`` now."""
    return Sample(
        busy_us=read_int(ref.attr_dir / "busy_us"),
        device_time_us=read_int(ref.attr_dir / "device_time_us"),
        monotonic_s=time.monotonic(),
    )


def utilisation(first: Sample, second: Sample) -> float | None:
    """Percent of the time between two samples the device was busy, in [0, 100].

    ``Δbusy_us / Δdevice_time_us``; where the device clock did not advance
    (it restarts when the device is powered up again) the host's clock
    stands in. None when the driver has no ``busy_us`` or nothing elapsed.
    """
    if first.busy_us is None or second.busy_us is None:
        return None
    busy = second.busy_us - first.busy_us
    elapsed: float = 0.0
    if first.device_time_us is not None and second.device_time_us is not None:
        elapsed = second.device_time_us - first.device_time_us
    if elapsed <= 0:
        elapsed = (second.monotonic_s - first.monotonic_s) * 1e6
    if elapsed <= 0 or busy < 0:
        return None
    return max(0.0, min(100.0, 100.0 * busy / elapsed))


def _fences(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    parts = text.split()
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def read_device(ref: DeviceRef, first: Sample | None = None) -> DeviceInfo:
    """The attributes of ``ref``; ``first`` is kept as the sample when given,
    else one is taken now.

    :class:`SmiError` when the attribute directory itself cannot be read (the
    device went away); a missing attribute reads as None.
    """
    if not ref.attr_dir.is_dir():
        raise SmiError(ref.attr_dir, 2, "no such directory (device removed?)")

    def attr(name: str) -> str | None:
        return read_optional(ref.attr_dir / name)

    def num(name: str) -> int | None:
        return read_int(ref.attr_dir / name)

    return DeviceInfo(
        ref=ref,
        hw_version=attr("hw_version"),
        fw_version=attr("fw_version"),
        driver_version=attr("driver_version"),
        abi_version=attr("abi_version"),
        num_queues=num("num_queues"),
        num_cores=num("num_cores"),
        mem_device_used=num("mem_device_used"),
        mem_device_total=num("mem_device_total"),
        bo_bytes=num("bo_bytes"),
        bo_count=num("bo_count"),
        hangs=num("hangs"),
        recoveries=num("recoveries"),
        op_errors=num("op_errors"),
        irq_count=num("irq_count"),
        fences=_fences(attr("fences")),
        power_state=read_optional(ref.device_dir / "power" / "runtime_status"),
        sample=first if first is not None else sample(ref),
    )
