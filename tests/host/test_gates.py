"""The gates that turn a report into a failed test: the kernel-log pattern
of the guest suites and the sanitizer check of the qtests.

Each gate is tried with a real report of the kind it must catch (taken from
the formats the kernel and the sanitizers print) and with the harmless
lines around it that it must let through.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

import qtest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


kmsg = _load("npu_kmsg", ROOT / "tests" / "guest" / "kmsg.py")
guest = _load("npu_guest_gate", ROOT / "scripts" / "guest.py")

KERNEL_REPORTS = [
    "BUG: KASAN: slab-use-after-free in npu_poll+0x4c/0x120 [npu]",
    "UBSAN: shift-out-of-bounds in drivers/accel/npu/npu_mmu.c:120:23",
    "BUG: KFENCE: out-of-bounds read in npu_bo_create+0x1a/0x90 [npu]",
    "WARNING: possible circular locking dependency detected",
    "WARNING: inconsistent lock state",
    "WARNING: possible recursive locking detected",
    "WARNING: suspicious RCU usage",
    "DMA-API: npu 0000:00:02.0: device driver frees DMA memory with different size",
    "BUG: sleeping function called from invalid context at mm/slub.c:4117",
    "Oops: general protection fault, probably for non-canonical address",
    "WARNING: CPU: 0 PID: 311 at drivers/npu/npu_job.c:88 npu_job_done+0x1/0x2 [npu]",
    "INFO: trying to register non-static key.",
    "turning off the locking correctness validator.",
    "refcount_t: underflow; use-after-free.",
    "list_del corruption. prev->next should be ffff888003a1c0a8, but was dead000000000100",
    "INFO: task python3:312 blocked for more than 61 seconds.",
    "watchdog: BUG: soft lockup - CPU#1 stuck for 26s! [python3:301]",
    "rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
    "rcu: INFO: rcu_preempt self-detected stall on CPU",
    "rcu: rcu_preempt kthread starved for 10502 jiffies! g1234 f0x0 RCU_GP_WAIT_FQS(5)",
    "BUG: workqueue lockup - pool cpus=0 node=0 flags=0x0 nice=0 stuck for 33s!",
    "NMI watchdog: Watchdog detected hard LOCKUP on cpu 1",
]
HARMLESS = [
    "npu 0000:00:02.0: NPU 1.0, ABI 1, 8 queues, 2 cores, 512 MiB device memory: /dev/npu0",
    "DMA-API: preallocated 65536 debug entries",
    "DMA-API: debugging enabled by kernel config",
    "npu: loading out-of-tree module taints kernel.",
    "kasan: KernelAddressSanitizer initialized",
    "rcu: \tRCU CPU stall warnings timeout set to 60 (rcu_cpu_stall_timeout).",
    "watchdog: Disabling watchdog on nohz_full cores by default",
    "khungtaskd: hung_task_timeout_secs is 60",
]


@pytest.mark.parametrize("line", KERNEL_REPORTS)
def test_the_in_guest_kernel_log_gate_catches_a_report(line: str) -> None:
    assert kmsg.BAD_KMSG_RE.search(line)


@pytest.mark.parametrize("line", KERNEL_REPORTS)
def test_the_host_dmesg_gate_catches_a_report(line: str) -> None:
    assert guest.bad_dmesg_lines(["[   12.5] " + line])


@pytest.mark.parametrize("line", HARMLESS)
def test_the_kernel_log_gates_let_ordinary_lines_through(line: str) -> None:
    assert not kmsg.BAD_KMSG_RE.search(line)
    assert not guest.bad_dmesg_lines([line])


def test_both_gates_read_one_pattern_list() -> None:
    assert kmsg.BAD_KMSG_RE.pattern == guest.BAD_DMESG_RE.pattern


def test_the_fault_injection_gate_expects_allocation_failure_warnings() -> None:
    line = "python3: page allocation failure: order:0, mode:0xcc0(GFP_KERNEL)"
    assert kmsg.BAD_KMSG_RE.search(line)
    assert kmsg.ALLOC_FAILURE_RE.search(line)


def test_kmemleak_reports_are_kept_only_with_a_frame_in_the_driver() -> None:
    ours = (
        "unreferenced object 0xffff888012345678 (size 64):\n"
        "  backtrace (crc 0):\n"
        "    [<ffffffffc0201234>] npu_bo_create+0x9a/0x1f0 [npu]\n"
    )
    theirs = "unreferenced object 0xffff888087654321 (size 32):\n    [<ff>] kmalloc_trace+0x1\n"
    assert kmsg.NPU_FRAME_RE.search(ours) and not kmsg.NPU_FRAME_RE.search(theirs)


ASAN = b"""==1234==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6020
READ of size 4 at 0x602000000014 thread T3
    #0 0x55d in npu_exec_fill ../hw/misc/npu/npu_exec.c:120
"""
UBSAN = b"../hw/misc/npu/npu_nn.c:311:17: runtime error: signed integer overflow\n"


@pytest.mark.parametrize("report", [ASAN, UBSAN], ids=["asan", "ubsan"])
def test_a_sanitizer_report_on_qemus_stderr_fails_the_qtest(tmp_path: Path, report: bytes) -> None:
    qt = qtest.QTest.__new__(qtest.QTest)  # the check alone, no QEMU process
    qt.log_path = tmp_path / "qemu.log"
    (tmp_path / "qemu.stderr").write_bytes(b"qemu-system-x86_64: warning: x\n" + report)
    with pytest.raises(qtest.SanitizerReport, match="sanitizer report"):
        qt.check_sanitizers()


def test_a_clean_stderr_passes_the_sanitizer_check(tmp_path: Path) -> None:
    qt = qtest.QTest.__new__(qtest.QTest)
    qt.log_path = tmp_path / "qemu.log"
    (tmp_path / "qemu.stderr").write_bytes(b"qemu-system-x86_64: terminating on signal 15\n")
    qt.check_sanitizers()


def test_the_qtests_run_the_sanitizer_build_of_qemu() -> None:
    assert qtest.QEMU.name.endswith("-asan") or "NPU_QTEST_QEMU" in os.environ
    assert "halt_on_error=1" in qtest.SANITIZER_ENV["UBSAN_OPTIONS"]
