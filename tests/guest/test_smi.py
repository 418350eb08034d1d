"""npu-smi on the real driver: the device and process tables, and hang triage.

``npu-smi --json`` (the project's wrapper, /mnt/npu/guest/bin/npu-smi, which
scripts/guest.py puts on PATH) must list /dev/npu0 and this test process,
which holds it open. ``npu-smi diag`` must place each of the four kinds of
stuck job, made with the device's fault injection (debugfs ``inject``) and
held in place by pausing the driver's watchdog (debugfs ``watchdog`` = 0):

- host: a thread waits on a syncobj point nobody submits; nothing pending.
  With nothing pending and no thread waiting, an open device is ``idle``;
- firmware: ``fw_crash``, then a NOP: it stays in the ring, untaken;
- engine: ``hang``, then a NOP: taken (ACTIVE), never finished;
- interrupt: ``drop_irq``, then a FILL: its fence is written, the driver
  has not retired it.

The cases are examples/bench_diag.py's (``make bench`` scores them as
``diag_verdicts_correct``). After each, the watchdog is resumed and the
device recovers (a reset for the firmware and the hang, the lost-interrupt
fallback for the interrupt) before the next test starts.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from guest_util import wait_until

import npu
from npu import coredump
from npu.smi import cli
from npu.smi.diag import Diagnosis, Verdict

EXAMPLES = "/mnt/npu/examples"
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)
import bench_diag  # noqa: E402  (examples/bench_diag.py: the four cases)

WRAPPER = "/mnt/npu/guest/bin/npu-smi"
DEVICE = "/sys/class/accel/accel0/device"
DEBUGFS = bench_diag.DEBUGFS


@pytest.fixture
def needs_diag() -> None:
    """npu-smi diag reads the driver's debugfs queues and pauses its
    watchdog: both are part of the driver, so their absence is a failure,
    not a reason to skip."""
    for name in ("queues", "watchdog"):
        assert os.path.exists(f"{DEBUGFS}/{name}"), f"the driver has no debugfs {name}"


def fences() -> tuple[int, int]:
    submitted, retired = bench_diag.read(f"{DEVICE}/npu/fences").split()
    return int(submitted), int(retired)


def dismiss_dumps() -> None:
    """Free pending NPU coredumps: the kernel keeps one per device and drops newer ones."""
    for data in coredump.find_dumps():
        coredump.dismiss(data)


@pytest.fixture(scope="module")
def hang_timeout() -> Iterator[None]:
    """hang_timeout_ms = 300 for this module (the hang's recovery is quick), restored after."""
    assert os.path.exists(bench_diag.TIMEOUT_PARAM), "the driver has no hang_timeout_ms"
    with bench_diag.hang_timeout():
        yield


@pytest.fixture
def quiet(hang_timeout: None) -> Iterator[None]:
    """Each diag test starts and ends with the device idle, nothing armed, the watchdog
    running and no coredump pending."""
    assert wait_until(lambda: fences()[0] == fences()[1], 30), f"device busy: {fences()}"
    assert int(bench_diag.read(f"{DEBUGFS}/inject").strip(), 0) == 0, "a fault is armed"
    dismiss_dumps()
    yield
    bench_diag.write(f"{DEBUGFS}/watchdog", "1")
    assert bench_diag.read(f"{DEBUGFS}/watchdog").strip() == "1"
    assert wait_until(lambda: fences()[0] == fences()[1], 30), f"not recovered: {fences()}"
    dismiss_dumps()


def diag_json() -> tuple[int, dict[str, Any]]:
    """``npu-smi diag -i 0 --json`` in this process: (exit status, document)."""
    out = io.StringIO()
    rc = cli.main(["diag", "-i", "0", "--json"], out=out)
    doc: dict[str, Any] = json.loads(out.getvalue())
    return rc, doc


def queue0(d: Diagnosis) -> Any:
    (q,) = [v for v in d.queues if v.queue == 0]
    return q


# --------------------------------------------------------------------------
# npu-smi
# --------------------------------------------------------------------------


def test_npu_smi_json_lists_npu0_and_this_process_holding_it(dev: npu.Device) -> None:
    r = subprocess.run([WRAPPER, "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (d,) = [x for x in doc["devices"] if x["index"] == 0]
    assert d["node"] == "/dev/npu0"
    assert d["pci_address"] == os.path.basename(os.path.realpath(DEVICE))
    assert d["driver_version"] and d["hw_version"] and d["fw_version"]
    assert d["power_state"] in ("active", "suspended", "resuming", "suspending")
    assert d["memory"]["bo_bytes"] is not None
    if os.path.exists(f"{DEVICE}/npu/busy_us"):
        assert 0.0 <= d["utilization_percent"] <= 100.0
    (me,) = [p for p in doc["processes"] if p["pid"] == os.getpid()]
    assert me["device"] == 0 and dev.fileno() in me["fds"]
    assert me["name"] == bench_diag.read(f"/proc/{os.getpid()}/comm").strip()


def test_npu_smi_is_on_the_guest_shells_path() -> None:
    assert "/mnt/npu/guest/bin" in os.environ.get("PATH", "").split(":"), (
        "guest/bin is not on PATH (scripts/guest.py puts it there)"
    )
    r = subprocess.run(["npu-smi", "-i", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "PCI address" in r.stdout and os.path.basename(os.path.realpath(DEVICE)) in r.stdout


# --------------------------------------------------------------------------
# diag
# --------------------------------------------------------------------------


@pytest.mark.usefixtures("needs_diag")
def test_diag_of_an_open_device_with_nothing_submitted_is_idle(
    dev: npu.Device, quiet: None
) -> None:
    rc, doc = diag_json()
    (d,) = doc["devices"]
    assert (rc, doc["verdict"], d["queues"], d["waiters"]) == (0, "idle", [], []), d
    # A suspended device has no heartbeat to compare (queues reads "suspended").
    assert d["firmware"]["state"] == "RUNNING" and d["firmware"]["heartbeat_moving"] is not False


@pytest.mark.usefixtures("needs_diag")
def test_diag_says_host_for_a_wait_on_a_point_nobody_submitted(
    dev: npu.Device, quiet: None
) -> None:
    d = bench_diag.case_host(dev, bench_diag.diagnose)
    assert d.verdict is Verdict.HOST, d.explanation
    assert "never submitted by the host" in d.explanation
    (w,) = d.waiters
    assert (w.pid, w.ioctl, w.fd) == (os.getpid(), "SYNCOBJ_TIMELINE_WAIT", dev.fileno())
    assert d.queues == ()


@pytest.mark.usefixtures("needs_diag")
def test_diag_says_firmware_for_a_job_a_crashed_firmware_never_took(
    dev: npu.Device, quiet: None
) -> None:
    d = bench_diag.case_firmware(dev, bench_diag.diagnose)
    assert d.verdict is Verdict.FIRMWARE, d.explanation
    q = queue0(d)
    assert q.verdict is Verdict.FIRMWARE
    assert q.evidence["outstanding"] >= 1 and q.evidence["submitted"] > q.evidence["retired"]
    assert d.fw is not None and d.fw.state == "CRASHED"
    assert d.heartbeat_moving is False
    assert "submitted but not taken by the firmware" in q.explanation


@pytest.mark.usefixtures("needs_diag")
def test_diag_says_engine_for_a_taken_job_that_never_finishes(dev: npu.Device, quiet: None) -> None:
    rc, doc = bench_diag.case_engine(dev, diag_json)
    assert (rc, doc["verdict"]) == (1, "engine"), doc
    (d,) = doc["devices"]
    (q,) = [v for v in d["queues"] if v["queue"] == 0]
    assert q["verdict"] == "engine" and "ACTIVE" in q["evidence"]["status"]
    assert q["evidence"]["fence_mem"] < q["evidence"]["submitted"]
    assert d["watchdog"] is False, "the state was held by a paused watchdog"


@pytest.mark.usefixtures("needs_diag")
def test_diag_says_interrupt_for_a_finished_job_whose_interrupt_was_lost(
    dev: npu.Device, quiet: None
) -> None:
    d = bench_diag.case_interrupt(dev, bench_diag.diagnose)
    assert d.verdict is Verdict.INTERRUPT, d.explanation
    q = queue0(d)
    assert q.evidence["retired"] < q.evidence["done"] <= q.evidence["fence_mem"]
    assert q.evidence["head"] == q.evidence["tail"]
    assert "finished but its interrupt not handled" in q.explanation


@pytest.mark.usefixtures("needs_diag")
def test_diag_reports_the_coredump_a_recovered_hang_left(dev: npu.Device, quiet: None) -> None:
    bench_diag.case_engine(dev, bench_diag.diagnose)
    assert wait_until(lambda: bool(coredump.find_dumps()), 10), "no coredump after the hang"
    d = bench_diag.diagnose()
    assert d.verdict is Verdict.IDLE, d.explanation
    assert d.coredump is not None and d.coredump.reason == "HANG" and d.coredump.queue == 0
