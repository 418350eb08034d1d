"""Device coredumps: what a hang and a lost firmware leave in devcoredump.

Before the watchdog resets the device it captures the registers, the queues,
the hung command and the firmware log (include/npu_coredump.h); once the
recovery is over the dump is in /sys/class/devcoredump/devcdN/data, whose
failing_device is the NPU's PCI device, until a write to data dismisses it
(or 5 minutes pass). npu.coredump decodes it.

The hang is injected as in test_recovery.py (debugfs ``inject``,
``hang_timeout_ms`` = 300 for this module, restored after). One hang of a
FILL serves the tests that read its dump: a module fixture arms it, from a
file of its own, after dismissing the NPU dumps earlier tests left (the core
keeps one per device: a pending one would swallow ours), and reads the
dump once; the test that dismisses it runs on the live file. The module
leaves no dump behind.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kmsg
import numpy as np
import pytest
from guest_util import wait_until

import npu
from npu import _abi, coredump, ops

DEVCD = Path("/sys/class/devcoredump")
PCI_DEVICE = Path("/sys/class/accel/accel0/device")
SYSFS = PCI_DEVICE / "npu"
INJECT = "/sys/kernel/debug/npu/npu0/inject"
TIMEOUT_PARAM = "/sys/module/npu/parameters/hang_timeout_ms"
HANG_TIMEOUT_MS = 300
# A lost firmware is noticed after 5 heartbeat periods standing still
# (test_firmware.py: RECOVERY_BOUND_S), then reset and reboot.
FW_RECOVERY_S = 2.5
PATTERN = 0xC0DEDEAD

pytestmark = [
    pytest.mark.skipif(not DEVCD.is_dir(), reason="kernel without devcoredump"),
    pytest.mark.skipif(not os.path.exists(TIMEOUT_PARAM), reason="driver without hang detection"),
]


def write(path: str | Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def npu_dumps() -> list[Path]:
    """data files of the pending dumps whose failing device is an NPU."""
    return coredump.find_dumps(DEVCD)


def dismiss_npu_dumps() -> None:
    """Dismiss every pending NPU dump and wait for them to go (the core
    deletes them from a work item)."""
    for data in npu_dumps():
        coredump.dismiss(data)
    assert wait_until(lambda: not npu_dumps(), 10), f"not dismissed: {npu_dumps()}"


def drm_client_id(dev: npu.Device) -> int:
    with open(f"/proc/self/fdinfo/{dev.fileno()}") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "drm-client-id":
                return int(value)
    raise AssertionError("no drm-client-id in fdinfo")


def recoveries() -> int:
    return int((SYSFS / "recoveries").read_text().split()[0])


@pytest.fixture(scope="module", autouse=True)
def hang_timeout() -> Iterator[None]:
    """hang_timeout_ms = HANG_TIMEOUT_MS for this module; no NPU dump pending
    before it or after it."""
    if not os.path.exists(INJECT):
        pytest.skip(f"{INJECT} missing (debugfs not mounted?)")
    if (DEVCD / "disabled").read_text().strip() != "0":
        pytest.skip("devcoredump is disabled (/sys/class/devcoredump/disabled)")
    saved = Path(TIMEOUT_PARAM).read_text().strip()
    write(TIMEOUT_PARAM, f"{HANG_TIMEOUT_MS}\n")
    dismiss_npu_dumps()
    try:
        yield
    finally:
        write(TIMEOUT_PARAM, f"{saved}\n")
        dismiss_npu_dumps()


@dataclass(frozen=True)
class Hang:
    """A hung FILL and the dump it left."""

    fence: int  # what SUBMIT returned
    error_fence: int  # what the WAIT reported
    client: int  # drm-client-id of the file
    dumps: list[Path]  # the NPU dumps pending once it was recovered
    raw: bytes  # the dump's data
    dump: coredump.Coredump


@pytest.fixture(scope="module")
def hang(hang_timeout: None) -> Iterator[Hang]:
    """Hang a FILL of a fresh file (its first hang: no ban) and read the dump."""
    with kmsg.checked(), npu.open_device(0) as dev, dev.alloc(4096) as buf:
        buf.numpy(np.uint32)[:] = 0
        client = drm_client_id(dev)
        # A command done just before: Q_DONE restarts at 0 when the queue
        # is enabled again, after a runtime resume among others.
        dev.wait(dev.submit([ops.nop()]), timeout_s=30)
        write(INJECT, "hang")
        fence = dev.submit([ops.fill(buf, PATTERN, 4096)])
        with pytest.raises(npu.NpuDeviceError) as err:
            dev.wait(fence, timeout_s=30)
        assert (err.value.errno, err.value.status) == (errno.EIO, _abi.NPU_ST_TIMEOUT)
        # The dump goes to devcoredump at the end of the recovery, after the WAIT's wake-up.
        assert wait_until(lambda: bool(npu_dumps()), 10), "no NPU dump after the hang"
        dumps = npu_dumps()
        raw = dumps[0].read_bytes()
    yield Hang(fence, err.value.fence, client, dumps, raw, coredump.parse(raw))


def test_a_hang_leaves_one_dump_whose_failing_device_is_the_npu(hang: Hang) -> None:
    (data,) = hang.dumps
    assert (data.parent / "failing_device").resolve() == PCI_DEVICE.resolve()


def test_the_npu_pci_device_links_to_its_dump(hang: Hang) -> None:
    """The core's link on the failing device: .../0000:00:xx.0/devcoredump/data."""
    (data,) = hang.dumps
    assert (PCI_DEVICE / "devcoredump").resolve() == data.parent.resolve()


def test_the_dump_is_a_hang_of_queue_0(hang: Hang) -> None:
    assert (hang.dump.reason_name, hang.dump.cause_name, hang.dump.queue) == ("HANG", "HANG", 0)


def test_the_dumps_fence_is_the_error_fence_of_the_wait(hang: Hang) -> None:
    assert hang.error_fence == hang.fence
    assert hang.dump.fence == hang.error_fence


def test_the_dumps_client_is_the_files_drm_client_id(hang: Hang) -> None:
    assert hang.client > 0
    assert hang.dump.client == hang.client


def test_the_dumps_command_is_the_hung_fill(hang: Hang) -> None:
    c = hang.dump.command
    assert c is not None
    assert (c.queue, c.opcode_name, c.fence) == (0, "FILL", hang.fence)
    assert (c.descriptor.fill.len, c.descriptor.fill.pattern) == (4096, PATTERN)
    assert c.params is None


def test_the_dumps_queue_0_shows_the_fill_running(hang: Hang) -> None:
    q0 = next(q for q in hang.dump.queues if q.index == 0)
    assert q0.status & coredump.NPU_QSTAT_ACTIVE
    assert q0.next_fence == hang.fence
    assert q0.completed == q0.done == hang.fence - 1
    assert q0.entries > 0
    assert hang.dump.command is not None and hang.dump.command.slot == q0.head % q0.entries


def test_the_dumps_registers_were_read_before_the_reset(hang: Hang) -> None:
    (regs,) = hang.dump.registers
    assert regs.when == coredump.NPU_DUMP_BEFORE_RESET
    assert regs["MAGIC"] == _abi.NPU_MAGIC
    assert regs["FW_STATUS"] == coredump.NPU_FW_RUNNING
    assert regs["Q0.STATUS"] & coredump.NPU_QSTAT_ACTIVE
    assert regs["Q0.DONE_LO"] == (hang.fence - 1) & 0xFFFFFFFF


def test_the_dumps_registers_are_every_readable_device_and_queue_register(hang: Hang) -> None:
    (regs,) = hang.dump.registers
    queues = min(regs["NUM_QUEUES"], _abi.NPU_NUM_QUEUES)  # the driver's hw_queues
    expected = set(coredump.DEVICE_REGISTERS.values()) - {"FW_CONTROL"} | {
        f"Q{q}.{name}" for q in range(queues) for name in coredump.QUEUE_REGISTERS.values()
    }
    names = [coredump.register_name(o) for o in regs.values]
    assert len(names) == len(expected)
    assert set(names) == expected


def test_the_dump_carries_the_firmware_log(hang: Hang) -> None:
    assert hang.dump.fw_log is not None
    assert hang.dump.fw_log.text.strip()
    assert hang.dump.fw_log.written >= len(hang.dump.fw_log.text.encode())


def test_the_decoder_prints_the_dump(hang: Hang, tmp_path: Path) -> None:
    saved = tmp_path / "dump.bin"
    saved.write_bytes(hang.raw)
    runtime = Path(npu.__file__).resolve().parents[1]
    r = subprocess.run(
        [sys.executable, "-m", "npu.coredump", str(saved)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(runtime)},
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "reason     HANG" in r.stdout
    assert f"fence      {hang.fence}\n" in r.stdout
    assert f"FILL  fence {hang.fence}" in r.stdout
    assert "Firmware log (" in r.stdout


def test_writing_to_data_dismisses_the_dump(hang: Hang) -> None:
    (data,) = hang.dumps
    assert data.exists(), "the dump went before it was dismissed"
    coredump.dismiss(data)
    assert wait_until(lambda: not data.parent.exists(), 10), f"{data.parent} is still there"
    # The link on the failing device goes when devcoredump releases its device, a little later.
    assert wait_until(lambda: not (PCI_DEVICE / "devcoredump").exists(), 10)


def test_a_lost_firmware_leaves_a_dump_without_a_queue() -> None:
    dismiss_npu_dumps()
    count = recoveries()
    write(INJECT, "fw_crash")
    assert wait_until(lambda: recoveries() == count + 1, FW_RECOVERY_S), "not recovered"
    assert wait_until(lambda: bool(npu_dumps()), 5), "no NPU dump after the firmware crash"
    (data,) = npu_dumps()
    dump = coredump.parse(data.read_bytes())
    assert (dump.reason_name, dump.queue, dump.fence, dump.client) == ("FW_LOST", None, 0, 0)
    assert dump.command is None
    (regs,) = dump.registers
    assert regs["FW_STATUS"] == coredump.NPU_FW_CRASHED
    dismiss_npu_dumps()


@pytest.mark.skipif(not hasattr(npu.Device, "create_queue"), reason="runtime without user queues")
def test_a_hung_user_queue_leaves_a_dump_of_its_queue_and_command() -> None:
    dismiss_npu_dumps()
    with npu.open_device(0) as dev, dev.alloc(4096) as buf, dev.create_queue(16) as q:
        write(INJECT, "hang")
        fence = q.fill(buf, PATTERN, 4096, irq=True)
        q.kick()
        with pytest.raises(npu.NpuDeviceError) as err:
            q.wait(fence, timeout_s=30)
        assert err.value.status == _abi.NPU_ST_TIMEOUT
        assert wait_until(lambda: bool(npu_dumps()), 10), "no NPU dump after the hang"
        (data,) = npu_dumps()
        dump = coredump.parse(data.read_bytes())
        assert (dump.reason_name, dump.queue, dump.fence) == ("HANG", q.index, fence)
        assert dump.client == drm_client_id(dev)
        c = dump.command
        assert c is not None
        assert (c.queue, c.opcode_name, c.fence) == (q.index, "FILL", fence)
        assert c.descriptor.fill.pattern == PATTERN
        uq = next(s for s in dump.queues if s.index == q.index)
        assert uq.is_user and uq.client == dump.client
        assert uq.status & coredump.NPU_QSTAT_ACTIVE
        assert c.slot == uq.head % uq.entries
    dismiss_npu_dumps()
