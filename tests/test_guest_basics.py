"""Guest basics: the device, its node, sysfs, module unload/reload."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.guest

SYSFS = "/sys/class/accel/accel0/device/npu"
HW_HEADER = Path(__file__).resolve().parent.parent / "include" / "npu_hw.h"


def _all_caps() -> int:
    """Every NPU_CAP_* bit of the header: the device implements all of them."""
    bits = re.findall(r"^#define\s+NPU_CAP_\w+\s+\(1u << (\d+)\)", HW_HEADER.read_text(), re.M)
    return sum(1 << int(b) for b in bits)


# What the device model reports (include/npu_hw.h) and the driver shows.
SYSFS_VALUES = {
    "hw_version": "1.0",
    "abi_version": "1",
    "driver_version": "1.1",
    "caps": f"0x{_all_caps():08x}",
    "num_queues": "1",
    "num_cores": "2",
    "ring_entries": "4096",
}


def _reload(guest):
    guest.unload_module()
    guest.load_module()


def test_pci_device_listed(guest):
    rc, out = guest.run("lspci -n")
    assert rc == 0, out
    # e.g. "00:03.0 1200: 1234:4e50 (rev 01)"
    assert re.search(r"^\S+ 1200: 1234:4e50\b", out, re.M), out


def test_dev_node_group_and_mode(guest):
    rc, out = guest.run("stat -L -c '%G %a' /dev/npu0")
    assert rc == 0, out
    assert out.strip() == "npu 660"


def test_dev_node_links_the_drm_accel_device(guest):
    rc, out = guest.run("readlink -f /dev/npu0; stat -L -c '%F %t' /dev/npu0")
    assert rc == 0, out
    # DRM accel devices have major 261 (0x105).
    assert out.split() == ["/dev/accel/accel0", "character", "special", "file", "105"], out


@pytest.mark.parametrize("attr", list(SYSFS_VALUES))
def test_sysfs_attribute_shows_the_device_value(guest, attr):
    rc, out = guest.run(f"cat {SYSFS}/{attr}")
    assert rc == 0, out
    assert out.strip() == SYSFS_VALUES[attr]


def test_unload_removes_node_and_reload_restores_it(guest):
    try:
        guest.unload_module()
        rc, out = guest.run("test -e /dev/npu0 || test -d /sys/module/npu")
        assert rc != 0, "/dev/npu0 or /sys/module/npu still there after rmmod"
    finally:
        if not guest.module_loaded():
            guest.load_module()
    rc, out = guest.run("stat -L -c '%G %a' /dev/npu0")
    assert rc == 0, out
    assert out.strip() == "npu 660"


def test_three_reload_cycles_leave_no_oops(guest):
    mark = guest.dmesg_mark()
    try:
        for _ in range(3):
            _reload(guest)
    finally:
        if not guest.module_loaded():
            guest.load_module()
    assert guest.run("test -e /dev/npu0")[0] == 0
    gm = __import__("sys").modules["npu_guest"]
    bad = gm.bad_dmesg_lines(guest.new_dmesg(mark))
    assert not bad, "\n".join(bad)
