"""The device firmware as the driver runs it: load, boot, mailbox, log, heartbeat recovery.

At probe the driver loads ``fw_name`` (a module parameter, default
``npu/npu_fw.bin``, under /lib/firmware: guest/npu-init installs the image
``make firmware`` built) with request_firmware(), checks its header (size,
magic, ABI, payload CRC) and boots it on the device, which checks it again.
Any failure fails the PCI probe: insmod itself succeeds (the module loads)
but no /dev/npu0 appears, and the kernel log says why. /sys/class/accel/accel0/device/npu/
fw_version is the running image's version; debugfs has ``fw_status`` (state,
version, heartbeat and a mailbox QUERY), ``fw_log`` (the firmware's log ring)
and ``fw_log_level`` (mailbox SET_LOG_LEVEL). The watchdog looks at the
heartbeat every 100 ms: standing still for 5 periods, the firmware is lost,
and the driver resets the device, boots the image again and replays the
unfinished ops.

The tests that reload the module put it back (loaded with the default
image, /dev/npu0 present) whatever happens: the files after this one need it.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import kmsg
import numpy as np
import pytest
from guest_util import MODULE, wait_until

import npu
from npu import ops

SCRIPTS = "/mnt/npu/scripts"
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)
import mkfw  # noqa: E402  (scripts/mkfw.py: build_image)

DEV_PATH = "/dev/npu0"
SYSFS = "/sys/class/accel/accel0/device/npu"
DEBUGFS = "/sys/kernel/debug/npu/npu0"
FW_DIR = "/lib/firmware/npu"
FW_NAME_PARAM = "/sys/module/npu/parameters/fw_name"
PCI_DRIVER = "/sys/bus/pci/drivers/npu"
with open("/mnt/npu/firmware/npu_fw.json") as _f:
    MANIFEST = json.load(_f)
DEFAULT_FW_NAME = "npu/npu_fw.bin"  # NPU_FW_NAME (include/npu_fw.h)
FW_RUNNING, FW_CRASHED = 1, 3  # enum npu_fw_state (include/npu_hw.h)
WD_PERIOD_S = 0.1  # NPU_WD_PERIOD (kernel_module/npu_reset.c)
HB_MISSES = 5  # NPU_HB_MISSES (kernel_module/npu_drv.h)
# A lost firmware is noticed after HB_MISSES periods standing still (0.5 s),
# plus up to one period before the first look; the rest is reset, reboot and
# a guest under TCG.
RECOVERY_BOUND_S = 1.5
NETLINK_KOBJECT_UEVENT = 15

pytestmark = pytest.mark.skipif(
    not os.path.exists(f"{DEBUGFS}/fw_status"), reason="driver without firmware support"
)


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def fw_status() -> dict[str, str]:
    """debugfs fw_status as a dict: state, version, heartbeat, commands, log_level
    (or mailbox: the errno of a QUERY that failed)."""
    lines = read(f"{DEBUGFS}/fw_status").splitlines()
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def recoveries() -> int:
    return int(read(f"{SYSFS}/recoveries").split()[0])


def boot_line(m: dict) -> str:
    names = m["opcodes"]
    mask = sum(1 << mkfw.header_constants()[f"NPU_OP_{n}"] for n in set(names))
    return (
        f"npu-fw {m['version']} booted: opcodes {mask:#x} heartbeat {m['heartbeat_us']} us"
        f" - {m['note']}"
    )


@contextlib.contextmanager
def uevents() -> Iterator[list[dict[str, str]]]:
    """Collect the kernel's uevents while the block runs (into the yielded list, after it)."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT)
        sock.bind((0, 1))  # the kernel's multicast group
    except OSError as e:
        pytest.skip(f"no uevent netlink socket: {e}")
    events: list[dict[str, str]] = []
    with sock:
        yield events
        while select.select([sock], [], [], 0.2)[0]:
            head, *fields = sock.recv(65536).decode(errors="replace").split("\0")
            events.append(dict(f.split("=", 1) for f in fields if "=" in f) | {"@": head})


# -- module reloads ------------------------------------------------------------


def module_loaded() -> bool:
    return os.path.isdir("/sys/module/npu")


def bound_devices() -> list[str]:
    if not os.path.isdir(PCI_DRIVER):
        return []
    return [d for d in os.listdir(PCI_DRIVER) if re.fullmatch(r"[0-9a-f]{4}:.*", d)]


def holders() -> str:
    """What of this process still holds the device (for a failed rmmod)."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith(DEV_PATH):
                fds.append(fd)
    maps = [ln for ln in read("/proc/self/maps").splitlines() if DEV_PATH in ln]
    return f"fds {fds}, {len(maps)} mappings"


def rmmod() -> None:
    npu.close_default_device()  # a test file before this one may have opened it
    gc.collect()
    r = subprocess.run(["rmmod", "npu"], capture_output=True, text=True)
    assert r.returncode == 0, f"rmmod npu: {r.stderr.strip()} (this process: {holders()})"
    assert wait_until(lambda: not os.path.exists(DEV_PATH), 10), f"{DEV_PATH} stayed"


def insmod(*params: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["insmod", MODULE, *params], capture_output=True, text=True)
    subprocess.run(["udevadm", "settle", "-t", "30"], check=False)
    return r


def restore_driver() -> None:
    """The driver loaded with its default image and /dev/npu0 present (as the session began)."""
    if module_loaded() and (read(FW_NAME_PARAM).strip() != DEFAULT_FW_NAME or not bound_devices()):
        subprocess.run(["rmmod", "npu"], capture_output=True, text=True)
    if not module_loaded():
        r = insmod()
        assert r.returncode == 0, f"insmod {MODULE}: {r.stderr.strip()}"
    assert wait_until(lambda: os.path.exists(DEV_PATH), 10), f"{DEV_PATH} did not come back"


@contextlib.contextmanager
def reloaded(*params: str) -> Iterator[subprocess.CompletedProcess[str]]:
    """rmmod, then insmod with ``params``; the default driver is back afterwards."""
    rmmod()
    try:
        yield insmod(*params)
    finally:
        restore_driver()


@contextlib.contextmanager
def firmware_file(name: str, data: bytes | None) -> Iterator[str]:
    """/lib/firmware/npu/<name> holding ``data`` (None: no such file); its fw_name."""
    path = os.path.join(FW_DIR, name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    if data is not None:
        with open(path, "wb") as f:
            f.write(data)
    try:
        yield f"npu/{name}"
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@contextlib.contextmanager
def kernel_log() -> Iterator[list[str]]:
    """The kernel log records added while the block runs (into the yielded list, after it)."""
    fd = kmsg.kmsg_open()
    lines: list[str] = []
    try:
        yield lines
        lines.extend(kmsg.kmsg_read(fd))
    finally:
        os.close(fd)


def image(**changes: object) -> bytes:
    """The project's image, with manifest fields or build_image() arguments changed."""
    kwargs = {k: changes.pop(k) for k in ("abi", "magic", "extra_sections") if k in changes}
    return bytes(mkfw.build_image({**MANIFEST, **changes}, **kwargs))


def flipped(img: bytes, offset: int) -> bytes:
    return img[:offset] + bytes([img[offset] ^ 1]) + img[offset + 1 :]


# --------------------------------------------------------------------------
# The running firmware
# --------------------------------------------------------------------------


def test_sysfs_fw_version_is_the_images_version() -> None:
    assert read(f"{SYSFS}/fw_version").strip() == MANIFEST["version"] == "1.0"


def test_fw_status_shows_a_running_firmware_and_answers_a_query() -> None:
    st = fw_status()
    assert st["state"] == str(FW_RUNNING), st
    assert st["version"] == MANIFEST["version"], st
    assert "mailbox" not in st, f"the QUERY failed: {st}"
    assert st["log_level"] == str(MANIFEST["log_level"]), st
    assert int(st["commands"]) >= 0


def test_the_heartbeat_advances_while_the_firmware_runs() -> None:
    first = int(fw_status()["heartbeat"])
    time.sleep(3 * MANIFEST["heartbeat_us"] / 1e6 + 0.05)
    assert int(fw_status()["heartbeat"]) > first


def test_the_query_counts_the_commands_the_device_completed(dev: npu.Device) -> None:
    before = int(fw_status()["commands"])
    dev.wait(dev.submit([ops.nop(), ops.nop(), ops.nop()]), timeout_s=10)
    # The QUERY count is device-wide: other clients may add to it, never take away.
    assert int(fw_status()["commands"]) - before >= 3


def test_fw_log_has_the_boot_line() -> None:
    log = read(f"{DEBUGFS}/fw_log")
    assert boot_line(MANIFEST) in log.splitlines(), log


def test_fw_log_level_3_shows_in_the_query_and_logs_mailbox_requests() -> None:
    try:
        write(f"{DEBUGFS}/fw_log_level", "3")
        st = fw_status()  # its QUERY is logged at level 3
        assert st["log_level"] == "3", st
        log = read(f"{DEBUGFS}/fw_log").splitlines()
        assert "log level 3" in log, log
        assert any(re.fullmatch(r"mbox seq \d+ cmd 2 arg 0x0: status 0", ln) for ln in log), log
    finally:
        write(f"{DEBUGFS}/fw_log_level", "1")
    assert fw_status()["log_level"] == "1"


def test_fw_log_level_above_3_is_refused_with_einval() -> None:
    with pytest.raises(OSError) as info:
        write(f"{DEBUGFS}/fw_log_level", "4")
    assert info.value.errno == errno.EINVAL
    assert fw_status()["log_level"] == str(MANIFEST["log_level"])


# --------------------------------------------------------------------------
# A crashed firmware
# --------------------------------------------------------------------------


def test_a_firmware_crash_is_recovered_and_ops_before_and_after_complete(
    dev: npu.Device,
) -> None:
    size = 256 * 1024
    # A firmware up for a while: its heartbeat is far above what a fresh boot shows.
    assert wait_until(lambda: int(fw_status()["heartbeat"]) >= 200, 5)
    write(f"{DEBUGFS}/fw_log_level", "3")  # a reboot goes back to the image's level
    with dev.alloc(size) as a, dev.alloc(size) as b, dev.alloc(size) as c:
        for buf in (a, b, c):
            buf.numpy(np.uint32)[:] = 0
        count = recoveries()
        hb = int(fw_status()["heartbeat"])
        with kernel_log() as klog, uevents() as events:
            before = dev.submit([ops.fill(a, 0xA0A0A0A0, size), ops.fill(b, 0xB1B1B1B1, size)])
            write(f"{DEBUGFS}/inject", "fw_crash")
            t0 = time.monotonic()
            st = fw_status()
            if recoveries() == count:  # not recovered yet (it takes 5 watchdog periods)
                assert st["state"] == str(FW_CRASHED), st
                assert st["mailbox"] == str(-errno.ETIMEDOUT), "a crashed firmware answers"
            after = dev.submit([ops.copy(a, c, size), ops.fill(b, 0xB2B2B2B2, size // 2)])
            assert wait_until(lambda: recoveries() > count, RECOVERY_BOUND_S + 1)
            took = time.monotonic() - t0
            dev.wait(before, timeout_s=10)
            dev.wait(after, timeout_s=10)
        assert (HB_MISSES - 2) * WD_PERIOD_S <= took <= RECOVERY_BOUND_S, f"{took:.3f} s"
        assert recoveries() == count + 1
        assert (a.numpy(np.uint32) == 0xA0A0A0A0).all()
        assert (c.numpy(np.uint32) == 0xA0A0A0A0).all(), "the copy ran after the fill"
        half = size // 8
        assert (b.numpy(np.uint32)[:half] == 0xB2B2B2B2).all()
        assert (b.numpy(np.uint32)[half:] == 0xB1B1B1B1).all()

    st = fw_status()
    assert st["state"] == str(FW_RUNNING), st
    assert st["log_level"] == str(MANIFEST["log_level"]), "the firmware booted again"
    assert int(st["heartbeat"]) < hb, "the heartbeat restarted"
    time.sleep(0.1)
    assert int(fw_status()["heartbeat"]) > int(st["heartbeat"]), "and it runs"
    assert read(f"{DEBUGFS}/fw_log").splitlines()[0] == boot_line(MANIFEST), "a fresh log"
    assert any(f"firmware heartbeat lost (status {FW_CRASHED})" in ln for ln in klog), klog
    resets = [e for e in events if e.get("NPU_RESET") == "1"]
    assert [e.get("NPU_REASON") for e in resets] == ["firmware"], events
    dev.wait(dev.submit([ops.nop()]), timeout_s=5)


def test_a_crash_of_an_idle_device_is_recovered_too(dev: npu.Device) -> None:
    count = recoveries()
    write(f"{DEBUGFS}/inject", "fw_crash")
    assert wait_until(lambda: recoveries() == count + 1, RECOVERY_BOUND_S + 1)
    assert fw_status()["state"] == str(FW_RUNNING)
    with dev.alloc(4096) as buf:
        dev.wait(dev.submit([ops.fill(buf, 0x600DF00D, 4096)]), timeout_s=5)
        assert (buf.numpy(np.uint32) == 0x600DF00D).all()
    time.sleep(3 * HB_MISSES * WD_PERIOD_S)
    assert recoveries() == count + 1, "a rebooted firmware is not lost again"


# --------------------------------------------------------------------------
# Loading an image
# --------------------------------------------------------------------------


def test_fw_name_loads_another_image() -> None:
    with (
        firmware_file("fwtest-1.1.bin", image(version="1.1")) as name,
        kernel_log() as klog,
        reloaded(f"fw_name={name}") as r,
    ):
        assert r.returncode == 0, r.stderr
        assert wait_until(lambda: os.path.exists(DEV_PATH), 10)
        assert read(FW_NAME_PARAM).strip() == name
        assert read(f"{SYSFS}/fw_version").strip() == "1.1"
        assert fw_status()["state"] == str(FW_RUNNING)
        with npu.open_device(0) as d:
            d.wait(d.submit([ops.nop()]), timeout_s=5)
    assert any(f"firmware {name} 1.1 booted" in ln for ln in klog), klog
    assert read(f"{SYSFS}/fw_version").strip() == "1.0"


BAD_IMAGES = {
    # name: (image bytes or None for no file, the kernel's message, the probe's errno)
    "missing": (None, "firmware {name} unavailable: -2", errno.ENOENT),
    "too-short": (image()[:40], "firmware {name}: size 40 outside 64..1048576", errno.EINVAL),
    "bad-magic": (
        image(magic=0x0BADF00D),
        "firmware {name}: not an NPU image (magic 0x0badf00d)",
        errno.EINVAL,
    ),
    "abi-mismatch": (
        image(abi=99),
        "firmware {name}: built for ABI 99, the driver speaks 1",
        errno.EINVAL,
    ),
    "payload-crc": (
        flipped(image(), len(image()) - 4),
        "firmware {name}: corrupt (size or checksum)",
        errno.EINVAL,
    ),
    # Checks only the device makes: the driver passes the image on.
    "header-crc": (
        flipped(image(), 40),  # the build id: covered by the header CRC only
        "firmware {name} rejected by the device: checksum mismatch",
        errno.ENOEXEC,
    ),
    "malformed-section": (
        image(heartbeat_us=50),
        "firmware {name} rejected by the device: malformed sections",
        errno.ENOEXEC,
    ),
}


@pytest.mark.parametrize(("data", "message", "err"), BAD_IMAGES.values(), ids=BAD_IMAGES.keys())
def test_a_bad_image_fails_the_probe_with_a_clear_message(
    request: pytest.FixtureRequest, data: bytes | None, message: str, err: int
) -> None:
    with (
        firmware_file(f"fwtest-{request.node.callspec.id}.bin", data) as name,
        kernel_log() as klog,
        reloaded(f"fw_name={name}") as r,
    ):
        # The module loads; the PCI probe fails: no device node, nothing bound.
        assert r.returncode == 0, r.stderr
        assert module_loaded()
        time.sleep(0.2)
        assert not os.path.exists(DEV_PATH)
        assert not os.path.exists(SYSFS)
        assert bound_devices() == []
    text = "\n".join(klog)
    assert message.format(name=name) in text, text
    # Linux 6.12 words it "<dev>: probe with driver npu failed with error -N".
    assert re.search(rf"probe with driver npu failed with error -{err}\b", text), text
    assert not any(kmsg.BAD_KMSG_RE.search(ln) for ln in klog), text
    # restore_driver() put the default image back.
    assert os.path.exists(DEV_PATH)
    assert read(f"{SYSFS}/fw_version").strip() == "1.0"
    with npu.open_device(0) as d, d.alloc(4096) as buf:
        d.wait(d.submit([ops.fill(buf, 0x0DDBA11, 4096)]), timeout_s=5)
        assert (buf.numpy(np.uint32) == 0x0DDBA11).all()


def test_a_valid_image_with_a_slow_heartbeat_is_not_declared_lost() -> None:
    with (
        firmware_file("fwtest-slow-heartbeat.bin", image(heartbeat_us=1_000_000)) as name,
        reloaded(f"fw_name={name}") as r,
    ):
        assert r.returncode == 0, r.stderr
        assert wait_until(lambda: os.path.exists(DEV_PATH), 10)
        time.sleep(2.5)
        assert recoveries() == 0
