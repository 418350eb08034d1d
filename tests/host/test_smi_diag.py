"""npu-smi diag: one verdict per stuck queue, from the driver's debugfs ``queues``.

The verdicts are decided on synthetic ``queues`` text in the driver's format
(kernel_module/npu_debugfs.c); the command line runs on a fake tree
(smi_fake.FakeTree) with ``--root``.
"""

from __future__ import annotations

import errno
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from npu import _abi
from npu.smi import cli
from npu.smi.debugfs import QueuesSnapshot, parse_fw_status, parse_queues
from npu.smi.diag import Verdict, diagnose
from npu.smi.fdinfo import Waiter
from smi_fake import FakeTree, blocked_in_ioctl

FW_OK = "fw state=running heartbeat={hb}"
FW_CRASHED = "fw state=crashed heartbeat=4711"


def kq(
    head: int, tail: int, status: int, done: int, fence_mem: int, submitted: int, retired: int,
    jobs: int = 0, oldest: int = 0, error: int = 0,
) -> str:  # fmt: skip
    """A kernel-queue line of ``queues``."""
    return (
        f"queue=0 kind=kernel head={head} tail={tail} status={status:#x} error={error} "
        f"done={done} fence_mem={fence_mem} submitted={submitted} retired={retired} "
        f"pending_jobs={jobs} oldest_ms={oldest}"
    )


def uq(index: int, head: int, tail: int, status: int, fence_mem: int) -> str:
    """A user-queue line of ``queues``."""
    return (
        f"queue={index} kind=user head={head} tail={tail} status={status:#x} error=0 "
        f"done={fence_mem} fence_mem={fence_mem} submitted=- retired=- pending_jobs=0 oldest_ms=0"
    )


def snap(*lines: str, t: float = 0.0) -> QueuesSnapshot:
    return parse_queues("\n".join(lines) + "\n", t)


def two_reads(*lines: str, fw_before: str | None = None) -> tuple[QueuesSnapshot, QueuesSnapshot]:
    """The same state read twice; the firmware line of the first read may differ."""
    qs = [ln for ln in lines if not ln.startswith("fw ")]
    fw = [ln for ln in lines if ln.startswith("fw ")]
    first = snap(*qs, *([fw_before] if fw_before else fw), t=1.0)
    return first, snap(*lines, t=1.2)


# --------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------


def test_a_queues_line_in_the_drivers_format_parses_to_its_fields() -> None:
    s = snap(kq(16, 18, 0x4, 16, 16, 18, 16, jobs=1, oldest=250), uq(3, 2, 2, 0x1, 9), FW_CRASHED)
    k, u = s.queues
    assert (k.index, k.kind, k.head, k.tail, k.status, k.done, k.fence_mem) == (
        0, "kernel", 16, 18, 0x4, 16, 16)  # fmt: skip
    assert (k.submitted, k.retired, k.pending_jobs, k.oldest_ms) == (18, 16, 1, 250)
    assert (k.outstanding, k.active, k.status_text) == (2, True, "ACTIVE")
    assert (u.kind, u.submitted, u.retired) == ("user", None, None)
    assert s.fw is not None and (s.fw.state, s.fw.heartbeat) == ("CRASHED", 4711)


def test_outstanding_commands_count_across_the_u32_wrap() -> None:
    (q,) = snap(kq(0xFFFFFFFF, 1, 0x0, 5, 5, 7, 5)).queues
    assert q.outstanding == 2


def test_a_suspended_device_reads_as_no_queue() -> None:
    s = snap("suspended")
    assert s.suspended and s.queues == () and s.fw is None


def test_fw_status_parses_with_the_state_named() -> None:
    fw = parse_fw_status("state: 3\nversion: 1.0\nheartbeat: 812\nmailbox: -110\n")
    assert (fw.state, fw.version, fw.heartbeat, fw.mailbox_error) == ("CRASHED", "1.0", 812, -110)


# --------------------------------------------------------------------------
# The verdicts
# --------------------------------------------------------------------------


def test_nothing_pending_and_nobody_waiting_is_idle() -> None:
    first, second = two_reads(kq(5, 5, 0x1, 5, 5, 5, 5), FW_OK.format(hb=10))
    d = diagnose(second, first)
    assert d.verdict is Verdict.IDLE and d.queues == () and not d.stuck


def test_a_wait_with_nothing_submitted_is_never_submitted_by_the_host() -> None:
    first, second = two_reads(kq(5, 5, 0x1, 5, 5, 5, 5), FW_OK.format(hb=10))
    waiter = Waiter(100, 101, "python3", 3, "SYNCOBJ_TIMELINE_WAIT", 7, "0000:00:03.0", 0)
    d = diagnose(second, first, waiting_threads=[waiter])
    assert d.verdict is Verdict.HOST and d.stuck
    assert "never submitted by the host" in d.explanation
    assert "pid 100" in d.explanation and "SYNCOBJ_TIMELINE_WAIT" in d.explanation
    assert "head 5 == tail 5, submitted 5 == retired 5" in d.explanation


def test_fences_the_driver_handed_out_with_an_empty_ring_are_the_hosts() -> None:
    first, second = two_reads(kq(5, 5, 0x1, 5, 5, 7, 5, jobs=1), FW_OK.format(hb=10))
    d = diagnose(second, first)
    (q,) = d.queues
    assert (d.verdict, q.verdict) == (Verdict.HOST, Verdict.HOST)


def test_commands_in_the_ring_of_a_crashed_firmware_are_not_taken_by_the_firmware() -> None:
    first, second = two_reads(kq(5, 6, 0x0, 5, 5, 6, 5, jobs=1, oldest=900), FW_CRASHED)
    d = diagnose(second, first)
    (q,) = d.queues
    assert (d.verdict, q.verdict) == (Verdict.FIRMWARE, Verdict.FIRMWARE)
    assert "submitted but not taken by the firmware" in q.explanation
    assert "tail 6 - head 5 = 1 command(s)" in q.explanation
    assert "firmware CRASHED, heartbeat 4711 (standing still)" in q.explanation
    assert (q.evidence["head"], q.evidence["tail"], q.evidence["submitted"]) == (5, 6, 6)
    assert d.heartbeat_moving is False


def test_an_untaken_command_with_a_stopped_heartbeat_is_the_firmwares() -> None:
    first, second = two_reads(
        kq(5, 6, 0x0, 5, 5, 6, 5, jobs=1), FW_OK.format(hb=50), fw_before=FW_OK.format(hb=50)
    )
    (q,) = diagnose(second, first).queues
    assert q.verdict is Verdict.FIRMWARE and "standing still" in q.explanation


def test_a_taken_command_that_does_not_finish_is_the_engines() -> None:
    first, second = two_reads(kq(5, 6, 0x4, 5, 5, 6, 5, jobs=1, oldest=1200), FW_OK.format(hb=9))
    d = diagnose(second, first)
    (q,) = d.queues
    assert (d.verdict, q.verdict) == (Verdict.ENGINE, Verdict.ENGINE)
    assert "taken but not finished by the engine" in q.explanation
    assert "fence_mem 5 < submitted 6" in q.explanation and "1200 ms" in q.explanation


def test_a_finished_command_the_driver_did_not_retire_is_a_lost_interrupt() -> None:
    first, second = two_reads(kq(6, 6, 0x1, 6, 6, 6, 5, jobs=1, oldest=700), FW_OK.format(hb=9))
    d = diagnose(second, first)
    (q,) = d.queues
    assert (d.verdict, q.verdict) == (Verdict.INTERRUPT, Verdict.INTERRUPT)
    assert "finished but its interrupt not handled" in q.explanation
    assert "completed fence 6" in q.explanation and "retired only up to 5" in q.explanation


def test_a_queue_blocked_on_a_wait_is_waiting_on_a_dependency() -> None:
    first, second = two_reads(uq(2, 0, 3, 0x8, 0), kq(5, 5, 0x1, 5, 5, 5, 5), FW_OK.format(hb=9))
    d = diagnose(second, first)
    (q,) = d.queues
    assert (q.queue, q.verdict, d.verdict) == (2, Verdict.WAITING, Verdict.WAITING)
    assert "waiting on a dependency" in q.explanation and not d.stuck


def test_a_queue_that_moved_between_the_reads_is_running() -> None:
    first = snap(kq(5, 9, 0x4, 5, 5, 9, 5, jobs=4), FW_OK.format(hb=1))
    second = snap(kq(7, 9, 0x4, 7, 7, 9, 7, jobs=2), FW_OK.format(hb=2))
    d = diagnose(second, first)
    assert d.verdict is Verdict.RUNNING and not d.stuck


def test_a_queue_that_drained_between_the_reads_is_running_not_idle() -> None:
    first = snap(kq(5, 9, 0x4, 5, 5, 9, 5, jobs=4), FW_OK.format(hb=1))
    second = snap(kq(9, 9, 0x1, 9, 9, 9, 9), FW_OK.format(hb=2))
    d = diagnose(second, first)
    assert d.verdict is Verdict.RUNNING and d.queues == ()
    assert "head 5 -> 9" in d.explanation


def test_a_hang_holds_other_queues_but_the_verdict_is_the_engine() -> None:
    # The command processor stops on the hung command: the other queue's work is not taken.
    first, second = two_reads(
        kq(5, 6, 0x4, 5, 5, 6, 5, jobs=1), uq(1, 0, 2, 0x0, 0), FW_OK.format(hb=9)
    )
    d = diagnose(second, first)
    assert [(q.queue, q.verdict) for q in d.queues] == [(0, Verdict.ENGINE), (1, Verdict.FIRMWARE)]
    assert "the command processor is on queue 0" in d.queues[1].explanation
    assert d.verdict is Verdict.ENGINE


def test_a_suspended_device_is_idle() -> None:
    d = diagnose(snap("suspended"), snap("suspended"))
    assert d.verdict is Verdict.IDLE and "suspended" in d.explanation


# --------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> FakeTree:
    t = FakeTree(tmp_path)
    t.add_device(0, "0000:00:03.0")
    return t


def diag(tree: FakeTree, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    rc = cli.main(["diag", "--interval", "0", "--root", str(tree.root), *args], out=out)
    return rc, out.getvalue()


def test_diag_of_an_idle_device_exits_0(tree: FakeTree) -> None:
    rc, text = diag(tree)
    assert rc == 0
    assert text.startswith("NPU 0 (0000:00:03.0): verdict IDLE")
    assert "Coredump: none pending" in text and "heartbeat ok" in text


def test_diag_of_a_stuck_device_exits_1_and_says_why(tree: FakeTree) -> None:
    tree.set_queues(kq(5, 6, 0x4, 5, 5, 6, 5, jobs=1, oldest=300) + "\n" + FW_OK.format(hb=3))
    rc, text = diag(tree)
    assert rc == 1
    assert "verdict ENGINE" in text and "Queue 0 (kernel): engine" in text


def test_diag_json_has_the_verdict_and_its_evidence(tree: FakeTree) -> None:
    tree.set_queues(kq(6, 6, 0x1, 6, 6, 6, 5, jobs=1) + "\n" + FW_OK.format(hb=3))
    rc, text = diag(tree, "--json")
    assert rc == 1
    doc = json.loads(text)
    assert set(doc) == {"schema", "timestamp", "verdict", "devices"}
    assert doc["verdict"] == "interrupt"
    (dev,) = doc["devices"]
    assert {"device", "pci_address", "verdict", "stuck", "explanation", "queues",
            "queue_states", "firmware", "fw_log_tail", "waiters", "watchdog", "coredump",
            "counters", "perf", "interval_s", "notes"} == set(dev)  # fmt: skip
    (q,) = dev["queues"]
    assert (q["queue"], q["kind"], q["verdict"]) == (0, "kernel", "interrupt")
    assert (q["evidence"]["done"], q["evidence"]["retired"]) == (6, 5)
    assert dev["firmware"]["state"] == "RUNNING" and dev["firmware"]["version"] == "1.0"
    assert dev["counters"]["hangs"] == 2 and dev["perf"]["queues"]["0"]["cmds"] == 5


def test_diag_finds_a_thread_blocked_in_a_wait_on_the_device(tree: FakeTree) -> None:
    tree.add_fd(100, 3, client_id=7)
    tree.add_thread(100, 100, "running")
    tree.add_thread(100, 104, blocked_in_ioctl(3, _abi.DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT))
    tree.add_thread(100, 105, blocked_in_ioctl(3, _abi.DRM_IOCTL_NPU_SUBMIT))  # not a wait
    rc, text = diag(tree, "--json")
    (dev,) = json.loads(text)["devices"]
    assert rc == 1 and dev["verdict"] == "host"
    assert dev["waiters"] == [{"pid": 100, "tid": 104, "name": "python3", "fd": 3,
                               "ioctl": "SYNCOBJ_TIMELINE_WAIT", "client_id": 7}]  # fmt: skip


def test_diag_reports_the_devices_latest_coredump(tree: FakeTree) -> None:
    from test_coredump import hang_dump

    tree.add_coredump(0, b"not a dump")
    path = tree.add_coredump(3, hang_dump())
    rc, text = diag(tree, "--json")
    dump = json.loads(text)["devices"][0]["coredump"]
    assert rc == 0
    assert dump["path"] == str(path)
    assert (dump["reason"], dump["queue"], dump["fence"], dump["client"]) == ("HANG", 0, 17, 5)
    assert f"Coredump: {path}: HANG, queue 0, fence 17" in diag(tree)[1]


def test_diag_notes_a_paused_watchdog(tree: FakeTree) -> None:
    (tree.debugfs(0) / "watchdog").write_text("0\n")
    rc, text = diag(tree)
    assert rc == 0 and "Watchdog: PAUSED" in text


def test_diag_without_debugfs_is_a_clear_error_with_exit_2(
    tree: FakeTree, capsys: pytest.CaptureFixture[str]
) -> None:
    for f in tree.debugfs(0).iterdir():
        f.unlink()
    tree.debugfs(0).rmdir()
    tree.roots.npu_debugfs.rmdir()
    rc, _ = diag(tree)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert f"npu-smi: {tree.roots.debugfs}/npu: [Errno 2] No such file or directory" in err
    assert "debugfs is not mounted" in err


def test_diag_with_a_driver_lacking_the_queues_file_names_it(
    tree: FakeTree, capsys: pytest.CaptureFixture[str]
) -> None:
    (tree.debugfs(0) / "queues").unlink()
    rc, _ = diag(tree)
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{tree.debugfs(0)}/queues: [Errno 2] No such file or directory" in err


def test_diag_of_unreadable_debugfs_says_to_run_as_root(
    tree: FakeTree, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # debugfs is mode 0700: a user's stat and listdir of it fail with EACCES.
    def refusing(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
            if str(path).startswith(str(tree.roots.debugfs)):
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real(path, *args, **kwargs)

        return call

    monkeypatch.setattr(os, "stat", refusing(os.stat))
    monkeypatch.setattr(os, "listdir", refusing(os.listdir))
    rc, _ = diag(tree)
    err = capsys.readouterr().err
    assert rc == 2
    assert f"npu-smi: {tree.roots.debugfs}: [Errno 13] Permission denied" in err
    assert "run npu-smi diag as root" in err
