"""What the driver shows of the device's work: tracepoints, the device's trace
ring, performance counters, the queue state and the watchdog switch.

- tracefs ``events/npu/``: the driver's own events (ioctl entry and exit,
  ring write, doorbell, interrupt, fence signal) and ``npu_fw_event``, the
  records of the device's trace ring (docs/npu-spec.md 4.8), each followed
  by an ``npu_clock_sync`` that pairs the device clock with the trace clock.
  Enabling ``npu_fw_event`` is what turns the device's tracing on.
- sysfs ``busy_us`` and ``device_time_us``; debugfs ``perf`` (a snapshot of
  the counters, 4.7), ``queues`` (what ``npu-smi diag`` reads), ``fwtrace``
  and ``watchdog``.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator

import pytest
from perf_util import device_awake, settle

import npu
from npu import ops

SYSFS = "/sys/class/accel/accel0/device/npu"
DEBUGFS = "/sys/kernel/debug/npu/npu0"
LINE = re.compile(
    r"^\s*(?P<task>.+?)-(?P<pid>\d+)\s+\[\d+\].*?\s(?P<ts>\d+\.\d+):\s(?P<event>\w+):\s(?P<rest>.*)$"
)


def tracefs() -> str:
    for root in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        if os.path.isdir(os.path.join(root, "events")):
            return root
    pytest.fail("no tracefs")


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


@pytest.fixture
def trace() -> Iterator[str]:
    """Every npu event on, the buffer empty; everything off afterwards."""
    root = tracefs()
    write(f"{root}/tracing_on", "0")
    write(f"{root}/trace", "")
    write(f"{root}/events/npu/enable", "1")
    write(f"{root}/tracing_on", "1")
    try:
        yield root
    finally:
        write(f"{root}/events/npu/enable", "0")
        write(f"{root}/trace", "")


def events(root: str) -> list[tuple[str, dict[str, str]]]:
    """(event, fields) of each npu line in the buffer, oldest first, after the
    driver drained the device's trace ring (a read of debugfs fwtrace)."""
    read(f"{DEBUGFS}/fwtrace")
    out = []
    for line in read(f"{root}/trace").splitlines():
        m = LINE.match(line)
        if m and m["event"].startswith("npu_"):
            fields = dict(kv.split("=", 1) for kv in m["rest"].split() if "=" in kv)
            out.append((m["event"], fields))
    return out


def perf() -> dict[str, dict[str, int]]:
    """debugfs perf by line key ("time", "queue=0", "core=1")."""
    out: dict[str, dict[str, int]] = {}
    for line in read(f"{DEBUGFS}/perf").splitlines():
        fields = dict(kv.split("=", 1) for kv in line.split())
        key = "time" if "time_ns" in fields else line.split()[0]
        out[key] = {k: int(v) for k, v in fields.items()}
    return out


def test_a_submit_shows_every_driver_step_in_order(dev: npu.Device, trace: str) -> None:
    dev.wait(dev.submit([ops.nop(), ops.nop()]), timeout_s=10)
    names = [e for e, _ in events(trace)]
    for step in (
        "npu_ioctl_enter",
        "npu_ring_write",
        "npu_submit",
        "npu_doorbell",
        "npu_irq",
        "npu_complete",
    ):
        assert step in names, f"{step} missing from {sorted(set(names))}"
    assert names.index("npu_ring_write") < names.index("npu_doorbell") < names.index("npu_irq")
    assert names.count("npu_ring_write") >= 2


def test_ioctl_exit_reports_the_return_value(dev: npu.Device, trace: str) -> None:
    dev.wait(dev.submit([ops.nop()]), timeout_s=10)
    exits = [f for e, f in events(trace) if e == "npu_ioctl_exit"]
    assert exits and all(f["ret"] == "0" for f in exits)


def test_the_device_trace_ring_shows_each_command_from_fetch_to_interrupt(
    dev: npu.Device, trace: str
) -> None:
    fence = dev.submit([ops.nop()])
    dev.wait(fence, timeout_s=10)
    fw = [f for e, f in events(trace) if e == "npu_fw_event" and f["queue"] == "0"]
    kinds = [f["kind"] for f in fw if int(f["fence"]) == fence]
    assert kinds[:4] == ["fetch", "cmd_start", "cmd_end", "cpl_write"], kinds
    times = [int(f["dev_ns"]) for f in fw]
    assert times == sorted(times)


def test_a_clock_sync_follows_the_device_records(dev: npu.Device, trace: str) -> None:
    dev.wait(dev.submit([ops.nop()]), timeout_s=10)
    evs = events(trace)
    last_fw = max(i for i, (e, _) in enumerate(evs) if e == "npu_fw_event")
    syncs = [i for i, (e, _) in enumerate(evs) if e == "npu_clock_sync"]
    assert any(i > last_fw for i in syncs)
    last = evs[last_fw][1]
    sync = evs[min(i for i in syncs if i > last_fw)][1]
    assert int(sync["dev_ns"]) >= int(last["dev_ns"])


def test_a_large_copy_shows_its_transfers_and_tiles(dev: npu.Device, trace: str) -> None:
    size = 8 << 20
    with dev.alloc(size) as a, dev.alloc(size) as b:
        fence = dev.submit([ops.copy(a, b, size)])
        dev.wait(fence, timeout_s=30)
    kinds = {
        f["kind"] for e, f in events(trace) if e == "npu_fw_event" and int(f["fence"]) == fence
    }
    assert {"tile_start", "tile_end", "dma_start", "dma_end"} <= kinds


def test_tracing_stops_on_the_device_when_the_event_is_disabled(
    dev: npu.Device, trace: str
) -> None:
    dev.wait(dev.submit([ops.nop()]), timeout_s=10)
    assert read(f"{DEBUGFS}/fwtrace").startswith("on=1")
    write(f"{trace}/events/npu/npu_fw_event/enable", "0")
    dev.wait(dev.submit([ops.nop()]), timeout_s=10)
    assert read(f"{DEBUGFS}/fwtrace").startswith("on=0")


@pytest.fixture
def awake() -> Iterator[None]:
    """The device held awake, so that each perf read is a fresh snapshot, not
    the one the driver kept when the device last went to sleep (perf_util.py)."""
    with device_awake():
        settle()
        yield


def test_perf_counts_the_commands_the_device_completed(dev: npu.Device, awake: None) -> None:
    before = perf()["queue=0"]["cmds"]
    dev.wait(dev.submit([ops.nop()] * 5), timeout_s=10)
    settle()  # the device counts a command just after its fence (6.3 steps 7, 8)
    after = perf()
    assert after["queue=0"]["cmds"] - before == 5
    assert "core=0" in after and after["time"]["time_ns"] > 0


def test_perf_counts_the_bytes_a_copy_moves(dev: npu.Device, awake: None) -> None:
    size = 1 << 20
    with dev.alloc(size) as a, dev.alloc(size) as b:
        before = perf()["queue=0"]
        dev.wait(dev.submit([ops.copy(a, b, size)]), timeout_s=10)
        settle()
        after = perf()["queue=0"]
    assert after["read_bytes"] - before["read_bytes"] == size
    assert after["write_bytes"] - before["write_bytes"] == size


def test_sysfs_busy_time_grows_with_work_and_stays_below_the_device_clock(dev: npu.Device) -> None:
    busy0, t0 = int(read(f"{SYSFS}/busy_us")), int(read(f"{SYSFS}/device_time_us"))
    size = 16 << 20
    with dev.alloc(size) as a, dev.alloc(size) as b:
        dev.wait(dev.submit([ops.copy(a, b, size)]), timeout_s=30)
    busy1, t1 = int(read(f"{SYSFS}/busy_us")), int(read(f"{SYSFS}/device_time_us"))
    assert busy1 > busy0
    assert 0 < busy1 - busy0 <= t1 - t0


def test_queues_shows_the_drivers_queue_settled_and_the_firmware_running(dev: npu.Device) -> None:
    dev.wait(dev.submit([ops.nop()]), timeout_s=10)
    lines = read(f"{DEBUGFS}/queues").splitlines()
    q0 = dict(kv.split("=", 1) for kv in lines[0].split())
    assert (q0["queue"], q0["kind"]) == ("0", "kernel")
    assert q0["submitted"] == q0["retired"] == q0["fence_mem"] == q0["done"]
    assert q0["head"] == q0["tail"] and q0["pending_jobs"] == "0"
    assert lines[-1].startswith("fw state=running heartbeat=")


def test_the_watchdog_switch_reads_back_and_refuses_other_values() -> None:
    path = f"{DEBUGFS}/watchdog"
    assert read(path).strip() == "1"
    try:
        write(path, "0")
        assert read(path).strip() == "0"
        with pytest.raises(OSError) as e:
            write(path, "2")
        assert e.value.errno == errno.EINVAL
    finally:
        write(path, "1")
    assert read(path).strip() == "1"


def test_sysfs_names_the_devices_timing_model() -> None:
    # The guests of the test suite run the device natively (docs/npu-spec.md 12.2).
    assert read(f"{SYSFS}/timing").strip() == "native"


def test_a_long_burst_loses_no_device_record(dev: npu.Device, trace: str, awake: None) -> None:
    # Awake: reading the burst's records takes longer than the autosuspend
    # delay, and a suspended device's fwtrace shows no drop count.
    fences = [dev.submit([ops.nop()] * 200) for _ in range(20)]
    dev.wait(fences[-1], timeout_s=120)
    fetched = [f for e, f in events(trace) if e == "npu_fw_event" and f["kind"] == "fetch"]
    assert len(fetched) >= 4000
    assert "dropped=0" in read(f"{DEBUGFS}/fwtrace")
