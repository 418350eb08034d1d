"""Per-context memory: accounting in /proc/<pid>/fdinfo and the per-context
limit (module parameter ``ctx_mem_limit_mib``) that makes BO_CREATE fail
with ENOMEM, without touching other contexts or leaking anything."""

from __future__ import annotations

import errno
import mmap
import time
from collections.abc import Iterator

import pytest

import npu

LIMIT_PARAM = "/sys/module/npu/parameters/ctx_mem_limit_mib"
SYSFS = "/sys/class/accel/accel0/device/npu"
MiB = 1 << 20
PAGE = mmap.PAGESIZE


def fdinfo(dev: npu.Device) -> dict[str, str]:
    """The drm-* and npu-* keys of the device file's fdinfo."""
    out = {}
    with open(f"/proc/self/fdinfo/{dev.fileno()}") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.startswith(("npu-", "drm-")):
                out[key] = value.strip()
    return out


_UNITS = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def drm_usage_stats(dev: npu.Device) -> dict[str, str | int]:
    """The drm- keys of the file's fdinfo, parsed by the rules of the kernel's
    Documentation/gpu/drm-usage-stats.rst: one "<key>:<tab><value>" per line;
    drm-driver a string; drm-client-id an unsigned integer; drm-engine-<name>
    an unsigned integer and "ns"; drm-memory-,
    drm-total-, drm-shared-, drm-resident-, drm-active- and drm-purgeable-
    <region> an unsigned integer with an optional unit (KiB, MiB, GiB), here
    in bytes; no key twice."""
    stats: dict[str, str | int] = {}
    with open(f"/proc/self/fdinfo/{dev.fileno()}") as f:
        for line in f:
            if not line.startswith("drm-"):
                continue
            key, sep, value = line.rstrip("\n").partition(":")
            assert sep and value.startswith(("\t", " ")), f"not '<key>: <value>': {line!r}"
            value = value.strip()
            assert key not in stats, f"{key} twice"
            memory = ("drm-memory-", "drm-total-", "drm-shared-", "drm-resident-",
                      "drm-active-", "drm-purgeable-")  # fmt: skip
            if key.startswith(memory):
                number, _, unit = value.partition(" ")
                assert number.isdigit() and unit in _UNITS, f"{key}: {value!r}"
                stats[key] = int(number) * _UNITS[unit]
            elif key.startswith("drm-engine-") and not key.startswith("drm-engine-capacity-"):
                number, _, unit = value.partition(" ")
                assert number.isdigit() and unit == "ns", f"{key}: {value!r}"
                stats[key] = int(number)
            elif key == "drm-client-id":
                assert value.isdigit(), value
                stats[key] = int(value)
            else:
                stats[key] = value
    return stats


def host_kib(dev: npu.Device) -> int:
    value, unit = fdinfo(dev)["npu-memory-host"].split()
    assert unit == "KiB"
    return int(value)


def live_bo_bytes() -> int:
    with open(f"{SYSFS}/bo_bytes") as f:
        return int(f.read())


@pytest.fixture
def limit_mib() -> Iterator[None]:
    """Sets ctx_mem_limit_mib to 4 for the test, then back to what it was."""
    with open(LIMIT_PARAM) as f:
        old = f.read().strip()
    with open(LIMIT_PARAM, "w") as f:
        f.write("4")
    yield
    with open(LIMIT_PARAM, "w") as f:
        f.write(old)


def test_fdinfo_names_the_driver_device_and_client(dev_path: str) -> None:
    with npu.Device(dev_path) as a, npu.Device(dev_path) as b:
        ia, ib = drm_usage_stats(a), drm_usage_stats(b)
        assert fdinfo(a)["npu-bo-count"] == "0" and fdinfo(a)["npu-memory-host"] == "0 KiB"
    assert ia["drm-driver"] == "npu"
    assert str(ia["drm-pdev"]).count(":") == 2  # a PCI address like 0000:00:02.0
    assert ia["drm-client-id"] != ib["drm-client-id"]


def test_fdinfo_engine_time_is_the_device_time_of_the_files_ops(dev_path: str) -> None:
    from npu import ops

    with npu.Device(dev_path) as d, npu.Device(dev_path) as other:
        assert drm_usage_stats(d)["drm-engine-compute"] == 0
        buf = d.alloc(4 * MiB)
        fence = d.run([ops.fill(buf, 7, buf.size), ops.fill(buf, 9, buf.size)])
        other.run([ops.nop()])  # another file's work is not this file's time
        records = [d.fence_info(f) for f in (fence - 1, fence)]
        expected = sum(r.t_end_ns - r.t_start_ns for r in records)
        assert expected > 0
        deadline = time.monotonic() + 5
        while drm_usage_stats(d)["drm-engine-compute"] != expected:
            assert time.monotonic() < deadline, (drm_usage_stats(d), expected)
            time.sleep(0.01)
        buf.free()


def test_fdinfo_reports_memory_per_region_in_drm_usage_stats_keys(dev_path: str) -> None:
    with npu.Device(dev_path) as d:
        empty = drm_usage_stats(d)
        assert empty["drm-total-host"] == empty["drm-resident-host"] == 0
        assert empty["drm-total-device"] == 0
        host = d.alloc(MiB + 1)  # rounded up to whole pages
        stats = drm_usage_stats(d)
        assert stats["drm-total-host"] == stats["drm-resident-host"] == MiB + PAGE
        if d.info.device_memory:
            local = d.alloc(3 * PAGE, device_memory=True)
            stats = drm_usage_stats(d)
            assert stats["drm-total-device"] == stats["drm-resident-device"] == 3 * PAGE
            assert stats["drm-total-host"] == MiB + PAGE
            local.free()
        host.free()
        assert drm_usage_stats(d)["drm-total-host"] == 0


def test_fdinfo_counts_the_pages_of_each_buffer_object(dev_path: str) -> None:
    with npu.Device(dev_path) as d:
        a = d.alloc(MiB + 1)  # rounded up to whole pages
        b = d.alloc(1)
        assert fdinfo(d)["npu-bo-count"] == "2"
        assert host_kib(d) == (MiB + 2 * PAGE) // 1024
        a.free()
        assert host_kib(d) == PAGE // 1024
        b.free()
        assert host_kib(d) == 0 and fdinfo(d)["npu-bo-count"] == "0"


def test_a_mapping_keeps_its_buffer_charged_until_it_is_unmapped(dev_path: str) -> None:
    with npu.Device(dev_path) as d:
        handle, offset, size = d.bo_create(MiB)
        view = mmap.mmap(d.fileno(), size, offset=offset)
        d.bo_destroy(handle)
        assert host_kib(d) == MiB // 1024  # the pages live on in the mapping
        view.close()
        assert host_kib(d) == 0


def test_the_limit_refuses_bo_create_with_enomem(dev_path: str, limit_mib: None) -> None:
    del limit_mib
    baseline = live_bo_bytes()
    with npu.Device(dev_path) as d:
        kept = d.alloc(3 * MiB)
        with pytest.raises(npu.NpuError) as info:
            d.alloc(2 * MiB)
        assert info.value.errno == errno.ENOMEM
        assert "BO_CREATE" in str(info.value)
        assert host_kib(d) == 3 * MiB // 1024  # the refused one left no charge
        assert fdinfo(d)["npu-memory-limit"] == f"{4 * MiB // 1024} KiB"
        d.alloc(MiB).free()  # exactly up to the limit still fits
        kept.free()
        d.alloc(4 * MiB).free()
    assert live_bo_bytes() == baseline


def test_the_limit_is_per_context(dev_path: str, limit_mib: None) -> None:
    del limit_mib
    with npu.Device(dev_path) as a, npu.Device(dev_path) as b:
        big_a = a.alloc(4 * MiB)
        big_b = b.alloc(4 * MiB)  # another file has its own allowance
        assert host_kib(a) == host_kib(b) == 4 * MiB // 1024
        big_a.free()
        big_b.free()


def test_closing_the_file_releases_every_charge(dev_path: str) -> None:
    baseline = live_bo_bytes()
    d = npu.Device(dev_path)
    for _ in range(8):
        handle, _, _ = d.bo_create(MiB)
        del handle
    assert live_bo_bytes() == baseline + 8 * MiB
    d.close()
    assert live_bo_bytes() == baseline


def test_buffer_memory_is_charged_to_the_callers_memory_cgroup(dev_path: str) -> None:
    # BO pages are allocated with __GFP_ACCOUNT: a process in a memory
    # cgroup sees them in its memory.current (they were outside any limit).
    import ctypes
    import fcntl
    import os
    import subprocess

    from npu import _abi

    root = "/sys/fs/cgroup"
    if not os.path.exists(f"{root}/cgroup.controllers"):
        r = subprocess.run(["mount", "-t", "cgroup2", "none", root], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"no cgroup2: {r.stderr!r}")
    with open(f"{root}/cgroup.controllers") as f:
        if "memory" not in f.read().split():
            pytest.skip("the kernel has no memory controller (CONFIG_MEMCG)")
    with open(f"{root}/cgroup.subtree_control", "w") as f:
        f.write("+memory")
    group = f"{root}/npu-test-{os.getpid()}"
    os.mkdir(group)
    size = 16 * MiB
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with open(f"{group}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
            fd = os.open(dev_path, os.O_RDWR)
            with open(f"{group}/memory.current") as f:
                before = int(f.read())
            arg = _abi.NpuBoCreate(size=size)
            fcntl.ioctl(fd, _abi.DRM_IOCTL_NPU_BO_CREATE, arg, True)
            with open(f"{group}/memory.current") as f:
                after = int(f.read())
            os.write(w, ctypes.c_int64(after - before))
            os.close(fd)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        delta = ctypes.c_int64.from_buffer_copy(os.read(r, 8)).value
    finally:
        os.close(r)
        os.waitpid(pid, 0)
        os.rmdir(group)
    # Charges are batched per CPU (64 pages), so allow a little less.
    assert delta >= size - MiB, delta
