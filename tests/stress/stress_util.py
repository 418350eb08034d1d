"""Shared helpers of the in-guest reliability suite (tests/stress/).

Raw ioctls go through libc's ``ioctl`` with a 64-bit argument (``fcntl.ioctl``
passes an integer argument as a C int, too narrow for kernel addresses).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import re
import subprocess
import time
from collections.abc import Callable

from npu import _abi

DEV_PATH = "/dev/npu0"
# npu.ko as built for the running kernel (scripts/build-module.sh).
MODULE = f"/mnt/npu/build/module/{os.uname().release}/npu.ko"
SYSFS = "/sys/class/accel/accel0/device/npu"
PAGE = mmap.PAGESIZE
MiB = 1 << 20
RW = mmap.PROT_READ | mmap.PROT_WRITE

# name: (full size = the issue's, short size = make test)
SIZES = {
    "KILLS": (100, 10),
    "MODULE_CYCLES": (50, 5),
    "FUZZ_CALLS": (1_000_000, 100_000),
    "PROCS": (8, 8),
    "JOBS": (1000, 100),
    "HANG_CYCLES": (100, 5),
}


def scale() -> str:
    s = os.environ.get("NPU_STRESS_SCALE", "full").strip() or "full"
    if s not in ("full", "short"):
        raise ValueError(f"NPU_STRESS_SCALE={s!r}: full or short")
    return s


# make test's seed (NPU_STRESS_SCALE=short): two runs of one commit test the
# same calls. make stress (full) draws a new one from the clock each run.
FIXED_SEED = 20261206


def seed() -> int:
    """NPU_STRESS_SEED if set; else the fixed seed at the short scale (make
    test) and a new one from the clock at the full scale (make stress).
    Tests print it, and a failure names it, so any run can be replayed."""
    v = os.environ.get("NPU_STRESS_SEED", "").strip()
    if v:
        return int(v)
    return FIXED_SEED if scale() == "short" else time.time_ns() % 2**32


def size(name: str) -> int:
    """NPU_STRESS_<name> if set, else the full or short default."""
    v = os.environ.get(f"NPU_STRESS_{name}", "").strip()
    if v:
        return int(v)
    full, short = SIZES[name]
    return full if scale() == "full" else short


# --------------------------------------------------------------------------
# libc
# --------------------------------------------------------------------------

libc = ctypes.CDLL(None, use_errno=True)
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
libc.ioctl.restype = ctypes.c_int
libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
libc.mmap.restype = ctypes.c_void_p
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.munmap.restype = ctypes.c_int
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MAP_FAILED = ctypes.c_void_p(-1).value


def raw_ioctl(fd: int, request: int, arg: int) -> int:
    """ioctl(fd, request, arg): 0 or the positive errno."""
    if libc.ioctl(fd, request, arg) == 0:
        return 0
    return ctypes.get_errno()


def check_ioctl(fd: int, request: int, arg: ctypes.Structure) -> None:
    e = raw_ioctl(fd, request, ctypes.addressof(arg))
    if e:
        raise OSError(e, f"{os.strerror(e)} (ioctl {request:#x})")


def anon_map(length: int, prot: int = RW) -> int:
    addr = libc.mmap(None, length, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if addr in (None, MAP_FAILED):
        raise OSError(ctypes.get_errno(), "mmap")
    return int(addr)


# --------------------------------------------------------------------------
# BOs and jobs through raw ioctls
# --------------------------------------------------------------------------


class Bo:
    """A BO of an fd (handle, size, mmap offset); .map() maps all of it."""

    def __init__(self, fd: int, size_: int, flags: int = 0) -> None:
        arg = _abi.NpuBoCreate(size=size_, flags=flags)
        check_ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg)
        self.fd = fd
        self.handle = int(arg.handle)
        self.size = int(arg.alloc_size)
        self.mmap_offset = int(arg.mmap_offset)

    def map(self) -> mmap.mmap:
        return mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, RW, offset=self.mmap_offset)

    def destroy(self) -> None:
        check_ioctl(self.fd, _abi.DRM_IOCTL_NPU_BO_DESTROY, _abi.NpuBoDestroy(handle=self.handle))


def submit(fd: int, op_list: list, tensor: bool = False) -> int:
    """SUBMIT packed ops (NpuOp or NpuTensorOp structs) on queue 0; the fence."""
    struct = _abi.NpuTensorOp if tensor else _abi.NpuOp
    raw = (struct * len(op_list))(*op_list)
    arg = _abi.NpuSubmit(
        ops_ptr=ctypes.addressof(raw),
        num_ops=len(op_list),
        queue=0,
        flags=0,
        op_size=ctypes.sizeof(struct),
    )
    check_ioctl(fd, _abi.DRM_IOCTL_NPU_SUBMIT, arg)
    return int(arg.fence)


def wait(fd: int, fence: int, timeout_s: float = 120.0) -> None:
    arg = _abi.NpuWait(fence=fence, deadline_ns=_abi.deadline_after(int(timeout_s * 1e9)), queue=0)
    check_ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, arg)


# --------------------------------------------------------------------------
# Counters
# --------------------------------------------------------------------------


def read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


def bo_counters() -> tuple[int, int]:
    """(bo_count, bo_bytes) of the device, all files, driver BOs included."""
    return read_int(f"{SYSFS}/bo_count"), read_int(f"{SYSFS}/bo_bytes")


def fences() -> tuple[int, int]:
    with open(f"{SYSFS}/fences") as f:
        a, b = f.read().split()
    return int(a), int(b)


def poll(pred: Callable[[], bool], timeout_s: float = 30.0, interval_s: float = 0.05) -> bool:
    end = time.monotonic() + timeout_s
    while True:
        if pred():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(interval_s)


def wait_idle(timeout_s: float = 120.0) -> None:
    assert poll(lambda: fences()[1] == fences()[0], timeout_s), f"device not idle: {fences()}"


def fdinfo(fd: int, pid: int | str = "self") -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/fdinfo/{fd}") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k.strip()] = v.strip()
    return out


def meminfo() -> dict[str, int]:
    """/proc/meminfo in kB."""
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = int(v.split()[0])
    return out


def pinned_pages() -> int:
    """Pages pinned with FOLL_PIN system-wide (acquired - released, /proc/vmstat).

    The counters are folded from per-CPU deltas first (vm.stat_refresh):
    unfolded, they lag by up to the per-CPU threshold."""
    with open("/proc/sys/vm/stat_refresh", "w") as f:
        f.write("1\n")
    v = {}
    with open("/proc/vmstat") as f:
        for line in f:
            k, _, n = line.partition(" ")
            v[k] = int(n)
    return v["nr_foll_pin_acquired"] - v["nr_foll_pin_released"]


def slab_objects(pattern: str = r"^kmalloc-") -> dict[str, int]:
    """Active objects per slab cache whose name matches (from /proc/slabinfo).

    Each matching cache is shrunk first: SLUB counts the objects of its
    per-CPU slabs and per-CPU partial lists as all in use, so without the
    flush the count moves by whole slabs (tens of objects) with which slab a
    CPU happens to hold; after it, the count is the objects allocated.
    """
    rx = re.compile(pattern)
    for name in os.listdir("/sys/kernel/slab"):
        if rx.search(name):
            try:
                with open(f"/sys/kernel/slab/{name}/shrink", "w") as f:
                    f.write("1\n")
            except OSError:
                pass  # a cache without the control (or gone meanwhile)
    out = {}
    with open("/proc/slabinfo") as f:
        for line in f:
            if line.startswith(("slabinfo", "#")):
                continue
            parts = line.split()
            if rx.search(parts[0]):
                out[parts[0]] = int(parts[1])
    return out


def slab_sites(pattern: str = r"^kmalloc-") -> dict[str, int] | None:
    """Live objects per allocation call site, or None without tracking.

    With ``slub_debug=U`` for the matching caches (the test session's guest
    boots so), SLUB keeps the call stack of every allocated object and
    /sys/kernel/debug/slab/<cache>/alloc_traces lists the live ones grouped
    by stack: an exact count, unlike /proc/slabinfo's. Keys are
    "<cache>: <frame> < <frame> ..." (six frames, offsets dropped).
    """
    rx = re.compile(pattern)
    root = "/sys/kernel/debug/slab"
    out: dict[str, int] = {}
    tracked = False
    for cache in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if not rx.search(cache):
            continue
        try:
            with open(f"{root}/{cache}/alloc_traces") as f:
                text = f.read()
        except OSError:
            continue  # a cache without tracking has no such file
        for block in text.split("\n\n"):
            lines = [ln.strip() for ln in block.strip().splitlines()]
            m = re.match(r"(\d+) \S", lines[0]) if lines else None
            if not m:
                continue
            tracked = True
            stack = " < ".join(ln.split("+")[0] for ln in lines[1:7])
            key = f"{cache}: {stack}"
            out[key] = out.get(key, 0) + int(m.group(1))
    return out if tracked else None


def free_kb() -> int:
    """Free memory in kB: MemFree plus the pages on the per-CPU free lists.

    Since Linux 6.7 the per-CPU lists tune their size to the free rate: a
    large free parks ~100 MB there, which MemFree does not count.
    """
    with open("/proc/zoneinfo") as f:
        pcp_pages = sum(int(n) for n in re.findall(r"(?m)^\s+count:\s+(\d+)", f.read()))
    return meminfo()["MemFree"] + pcp_pages * (PAGE >> 10)


def drop_caches() -> None:
    """Let the kernel give back what it caches (for a quieter MemFree)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


# --------------------------------------------------------------------------
# The module and the PCI device
# --------------------------------------------------------------------------


def module_loaded() -> bool:
    return os.path.isdir("/sys/module/npu")


def wait_dev(present: bool = True, timeout_s: float = 30.0) -> None:
    if not poll(lambda: os.path.exists(DEV_PATH) == present, timeout_s, 0.02):
        raise RuntimeError(f"{DEV_PATH} {'did not appear' if present else 'did not go'}")


def insmod(params: str = "") -> None:
    # What npu.ko needs and insmod does not load (a no-op where built in).
    subprocess.run(["modprobe", "-q", "drm_shmem_helper"], check=False)
    r = subprocess.run(["insmod", MODULE, *params.split()], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"insmod {MODULE} failed: {r.stderr.strip()}")
    wait_dev(True)


def rmmod() -> None:
    r = subprocess.run(["rmmod", "npu"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"rmmod npu failed: {r.stderr.strip()}")
    wait_dev(False)


def ensure_loaded() -> None:
    if not module_loaded():
        insmod()
    subprocess.run(["udevadm", "settle", "-t", "30"], check=False)
    wait_dev(True)


def pci_address() -> str:
    return os.path.basename(os.path.realpath(os.path.dirname(SYSFS)))


def errname(e: int) -> str:
    return errno.errorcode.get(e, str(e))
