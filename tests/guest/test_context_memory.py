"""Per-context memory: accounting in /proc/<pid>/fdinfo and the per-context
limit (module parameter ``ctx_mem_limit_mib``) that makes BO_CREATE fail
with ENOMEM, without touching other contexts or leaking anything."""

from __future__ import annotations

import errno
import mmap
from collections.abc import Iterator

import pytest

import npu

LIMIT_PARAM = "/sys/module/npu/parameters/ctx_mem_limit_mib"
SYSFS = "/sys/class/npu/npu0"
MiB = 1 << 20
PAGE = mmap.PAGESIZE


def fdinfo(dev: npu.Device) -> dict[str, str]:
    """The npu-* keys of the device file's fdinfo."""
    out = {}
    with open(f"/proc/self/fdinfo/{dev.fileno()}") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.startswith("npu-"):
                out[key] = value.strip()
    return out


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
        ia, ib = fdinfo(a), fdinfo(b)
    assert ia["npu-driver"] == "npu"
    assert ia["npu-pdev"].count(":") == 2  # a PCI address like 0000:00:02.0
    assert ia["npu-client-id"] != ib["npu-client-id"]
    assert ia["npu-bo-count"] == "0" and ia["npu-memory-host"] == "0 KiB"


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
