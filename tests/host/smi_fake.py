"""A fake /sys, /proc and debugfs for the npu-smi host tests.

``FakeTree(tmp_path)`` lays out what the driver would show for each device
added: the PCI device (vendor/device IDs, ``npu/`` attributes,
``power/runtime_status``), its ``/sys/class/accel/accelN`` entry, its
debugfs directory; processes with fdinfo files of device descriptors and
threads blocked in ioctls; devcoredumps. ``roots`` points npu.smi at it.
"""

from __future__ import annotations

import os
from pathlib import Path

from npu import _abi
from npu.smi.fs import Roots

FW_LOG = "npu-fw 1.0: boot\nqueue 0: created\nheartbeat ok\n"
IDLE_QUEUES = (
    "queue=0 kind=kernel head=5 tail=5 status=0x1 error=0 done=5 fence_mem=5 submitted=5 "
    "retired=5 pending_jobs=0 oldest_ms=0\n"
    "fw state=running heartbeat=100\n"
)
FW_STATUS = "state: 1\nversion: 1.0\nheartbeat: 100\ncommands: 5\nlog_level: 1\n"


class FakeTree:
    """A tree under ``root`` standing for /sys, /proc and debugfs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.roots = Roots.under(root)
        self.roots.accel_class.mkdir(parents=True)
        self.roots.proc.mkdir(parents=True)
        self.roots.npu_debugfs.mkdir(parents=True)
        self.pci: dict[int, Path] = {}

    # -- devices ------------------------------------------------------------

    def add_device(self, index: int = 0, address: str = "0000:00:03.0", **attrs: str | int) -> Path:
        """A device with the driver's attributes (``attrs`` override the defaults)."""
        pci = self.roots.sys / "devices" / "pci0000:00" / address
        (pci / "npu").mkdir(parents=True)
        (pci / "power").mkdir()
        (pci / "vendor").write_text(f"{_abi.NPU_PCI_VENDOR_ID:#06x}\n")
        (pci / "device").write_text(f"{_abi.NPU_PCI_DEVICE_ID:#06x}\n")
        (pci / "power" / "runtime_status").write_text("active\n")
        values: dict[str, str | int] = {
            "hw_version": "1.0",
            "fw_version": "1.0",
            "driver_version": "1.4",
            "abi_version": "3",
            "num_queues": 8,
            "num_cores": 2,
            "mem_device_total": 256 << 20,
            "mem_device_used": 16 << 20,
            "bo_bytes": 3 << 20,
            "bo_count": 4,
            "hangs": 2,
            "recoveries": 3,
            "op_errors": 1,
            "irq_count": 77,
            "fences": "5 5",
            "busy_us": 1000,
            "device_time_us": 50_000,
        }
        values.update(attrs)
        for name, value in values.items():
            (pci / "npu" / name).write_text(f"{value}\n")
        accel = self.roots.accel_class / f"accel{index}"
        accel.mkdir()
        (accel / "device").symlink_to(pci)
        self.pci[index] = pci
        d = self.debugfs(index)
        d.mkdir()
        (d / "queues").write_text(IDLE_QUEUES)
        (d / "fw_status").write_text(FW_STATUS)
        (d / "fw_log").write_text(FW_LOG)
        (d / "watchdog").write_text("1\n")
        (d / "perf").write_text(
            "time_ns=50000000\nqueue=0 cmds=5 busy_ns=1000000 macs=0 read_bytes=0 "
            "write_bytes=4096 walks=0 walk_hits=0 wait_ns=0\ncore=0 busy_ns=900000\n"
        )
        return pci

    def set_attr(self, index: int, name: str, value: str | int) -> None:
        (self.pci[index] / "npu" / name).write_text(f"{value}\n")

    def set_power(self, index: int, state: str) -> None:
        (self.pci[index] / "power" / "runtime_status").write_text(f"{state}\n")

    def debugfs(self, index: int = 0) -> Path:
        return self.roots.npu_debugfs / f"npu{index}"

    def set_queues(self, text: str, index: int = 0) -> None:
        (self.debugfs(index) / "queues").write_text(text)

    # -- processes ----------------------------------------------------------

    def add_fd(
        self,
        pid: int,
        fd: int,
        client_id: int,
        address: str = "0000:00:03.0",
        engine_ns: int = 0,
        host_kib: int = 0,
        device_kib: int = 0,
        comm: str = "python3",
        driver: str = "npu",
    ) -> None:
        """A descriptor of a device file in process ``pid``."""
        proc = self.roots.proc / str(pid)
        (proc / "fdinfo").mkdir(parents=True, exist_ok=True)
        (proc / "fd").mkdir(exist_ok=True)
        (proc / "comm").write_text(f"{comm}\n")
        (proc / "fdinfo" / str(fd)).write_text(
            "pos:\t0\nflags:\t02100002\nmnt_id:\t24\nino:\t1043\n"
            f"drm-driver:\t{driver}\ndrm-client-id:\t{client_id}\ndrm-pdev:\t{address}\n"
            f"drm-engine-compute:\t{engine_ns} ns\n"
            f"drm-shared-host:\t0\ndrm-total-host:\t{host_kib} KiB\n"
            f"drm-resident-host:\t{host_kib} KiB\n"
            f"drm-total-device:\t{device_kib} KiB\n"
            "npu-bo-count:\t1\n"
            f"npu-memory-host:\t{host_kib} KiB\nnpu-memory-device:\t{device_kib} KiB\n"
            "npu-ctx:\t1\nnpu-faulted:\t0\n"
        )
        os.symlink("/dev/accel/accel0", proc / "fd" / str(fd))

    def add_other_fd(self, pid: int, fd: int) -> None:
        """A descriptor of a plain file in process ``pid``."""
        proc = self.roots.proc / str(pid)
        (proc / "fdinfo").mkdir(parents=True, exist_ok=True)
        (proc / "fdinfo" / str(fd)).write_text("pos:\t0\nflags:\t0100002\nmnt_id:\t24\n")

    def add_thread(self, pid: int, tid: int, syscall: str, comm: str = "python3") -> None:
        """A thread of ``pid`` with ``syscall`` as its /proc/PID/task/TID/syscall."""
        task = self.roots.proc / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "syscall").write_text(f"{syscall}\n")
        (task / "comm").write_text(f"{comm}\n")

    # -- devcoredump --------------------------------------------------------

    def add_coredump(self, n: int, data: bytes, index: int = 0) -> Path:
        devcd = self.roots.devcoredump / f"devcd{n}"
        devcd.mkdir(parents=True)
        (devcd / "data").write_bytes(data)
        (devcd / "failing_device").symlink_to(self.pci[index])
        return devcd / "data"


def blocked_in_ioctl(fd: int, request: int) -> str:
    """A /proc/PID/task/TID/syscall line of a thread blocked in ioctl(fd, request) (x86-64)."""
    return f"16 {fd:#x} {request:#x} 0x7ffc1000 0x0 0x0 0x0 0x7ffc0ff8 0x7f0011223344"
