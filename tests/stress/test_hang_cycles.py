"""Hang/recovery cycles: each cycle hangs the device while another file's work waits.

Every cycle opens a fresh file (the *hanger*: a file is banned after three
hangs), arms the device's hang injection (debugfs ``inject``) and submits a
FILL, which hangs the command processor. Once the hang has fired, a second
file opened for the whole test (the *worker*) submits a batch of verified
jobs (COPY of random bytes, FILL, GEMM, and an ELTWISE whose parameter
block must be replayed too) that queue up behind the hung op. The watchdog
(``hang_timeout_ms`` = 200 here, restored after) resets the device: the
hanger's WAIT must fail with ``EIO`` / ``NPU_ST_TIMEOUT``, its FILL must
not have run, and every worker job must complete with the right result.
Between cycles the worker runs one more job on the recovered device.

Per cycle: the time from the hanger's SUBMIT to its WAIT's ``EIO``
(user-visible detection), the driver's ``last_hang_detect_ms`` and
``last_reset_recovery_us``. Their median, 90th percentile and maximum are
printed and recorded (junit properties -> build/stress-figures.json).

Size: NPU_STRESS_HANG_CYCLES (full 100, short 5).
"""

from __future__ import annotations

import ctypes
import errno
import os
import statistics
import threading
import time

import numpy as np
import pytest

from npu import _abi, ops

from . import stress_util as su

INJECT = "/sys/kernel/debug/npu/npu0/inject"
TIMEOUT_PARAM = "/sys/module/npu/parameters/hang_timeout_ms"
HANG_TIMEOUT_MS = 200
WD_PERIOD_MS = 100  # NPU_WD_PERIOD (kernel_module/npu_reset.c)
SLACK_MS = 400  # reset, wake-up, a loaded TCG guest
ST_TIMEOUT = 12  # NPU_ST_TIMEOUT
BO = 64 * 1024
F32 = _abi.DType.FP32
D = 24  # GEMM dimension


def _inject(fault: str) -> None:
    with open(INJECT, "w") as f:
        f.write(fault)


def _armed() -> int:
    with open(INJECT) as f:
        return int(f.read().strip(), 0)


def _wait_status(fd: int, fence: int, timeout_s: float = 60.0) -> tuple[int, int, int]:
    """WAIT through libc (drops the GIL): (errno or 0, status, error_fence)."""
    arg = _abi.NpuWait(fence=fence, deadline_ns=_abi.deadline_after(int(timeout_s * 1e9)), queue=0)
    e = su.raw_ioctl(fd, _abi.DRM_IOCTL_NPU_WAIT, ctypes.addressof(arg))
    return e, int(arg.status), int(arg.error_fence)


def _wait_into(fd: int, fence: int, out: list) -> None:
    """Thread body: WAIT, then append (errno, status, error_fence, when it returned)."""
    out.append((*_wait_status(fd, fence), time.monotonic()))


class _Worker:
    """The innocent file: four mapped BOs and the jobs it checks."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.fd = os.open(su.DEV_PATH, os.O_RDWR)
        self.bos = [su.Bo(self.fd, BO) for _ in range(6)]
        self.maps = [bo.map() for bo in self.bos]
        self.views = [np.frombuffer(m, np.uint8) for m in self.maps]

    def close(self) -> None:
        self.views.clear()  # the arrays export the mappings: gone before close()
        for m in self.maps:
            m.close()
        os.close(self.fd)

    def submit_batch(self) -> tuple[int, list]:
        """Submit the batch (two SUBMITs, nothing waited for); (last fence, checks)."""
        src, cpy, fil, a, b, c = self.bos
        vs, vcpy, vfil, va, vb, vc = self.views
        n = int(self.rng.integers(1, BO))
        vs[:n] = self.rng.integers(0, 256, n, dtype=np.uint8)
        vcpy[:] = 0
        pat = int(self.rng.integers(0, 2**32))
        vfil[:] = 0
        am = self.rng.standard_normal((D, D), dtype=np.float32)
        bm = self.rng.standard_normal((D, D), dtype=np.float32)
        va.view(np.float32)[: D * D] = am.ravel()
        vb.view(np.float32)[: D * D] = bm.ravel()
        vc[:] = 0
        su.submit(
            self.fd,
            [
                ops.copy(src, cpy, n).pack(),
                ops.fill(fil, pat, BO).pack(),
                ops.gemm(a, b, c, D, D, D).pack(),
            ],
        )
        # ELTWISE after the GEMM: c[D*D:2*D*D] = a + b (its parameter block is replayed).
        refs = [
            ops.tensor_ref(a, F32, [D * D]),
            ops.tensor_ref(b, F32, [D * D]),
            ops.tensor_ref(c, F32, [D * D], offset=D * D * 4),
        ]
        last = su.submit(self.fd, [ops.eltwise(_abi.EltwiseKind.ADD, *refs).pack()], tensor=True)
        return last, [n, vs[:n].copy(), pat, am, bm]

    def check(self, checks: list) -> None:
        n, data, pat, am, bm = checks
        _, vcpy, vfil, _, _, vc = self.views
        assert np.array_equal(vcpy[:n], data) and not vcpy[n:].any(), "COPY"
        assert (vfil.view(np.uint32) == pat).all(), "FILL"
        got = vc.view(np.float32)
        np.testing.assert_allclose(
            got[: D * D].reshape(D, D), am @ bm, rtol=1e-4, atol=1e-4, err_msg="GEMM"
        )
        np.testing.assert_allclose(got[D * D : 2 * D * D], (am + bm).ravel(), err_msg="ELTWISE")

    def run_batch(self) -> None:
        fence, checks = self.submit_batch()
        su.wait(self.fd, fence)
        self.check(checks)


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))]


def test_hang_recovery_cycles_with_another_files_work_verified(record_property):
    cycles = su.size("HANG_CYCLES")
    seed = su.seed()
    print(f"hang cycles: {cycles} cycles, hang_timeout_ms={HANG_TIMEOUT_MS}, seed {seed}")
    if not os.path.exists(INJECT) or not os.path.exists(TIMEOUT_PARAM):
        pytest.skip("driver without hang injection or hang_timeout_ms")
    with open(TIMEOUT_PARAM) as f:
        saved = f.read().strip()
    su.wait_idle()
    assert _armed() == 0
    base_bos = su.bo_counters()
    hangs0, rec0 = su.read_int(f"{su.SYSFS}/hangs"), su.read_int(f"{su.SYSFS}/recoveries")
    worker = _Worker(np.random.default_rng(seed))
    seen_ms: list[float] = []  # SUBMIT to the hanger's EIO
    detect_ms: list[float] = []  # last_hang_detect_ms
    recovery_us: list[float] = []  # last_reset_recovery_us
    worker_ms: list[float] = []  # the batch queued behind the hang: SUBMIT to done
    t_start = time.monotonic()
    with open(TIMEOUT_PARAM, "w") as f:
        f.write(f"{HANG_TIMEOUT_MS}\n")
    try:
        worker.run_batch()
        for cycle in range(cycles):
            try:
                hanger = os.open(su.DEV_PATH, os.O_RDWR)
                bo = su.Bo(hanger, 4096)
                m = bo.map()
                _inject("hang")
                t0 = time.monotonic()
                fence = su.submit(hanger, [ops.fill(bo, 0xBAD0BAD0, 4096).pack()])
                result: list = []
                waiter = threading.Thread(target=_wait_into, args=(hanger, fence, result))
                waiter.start()
                assert su.poll(lambda: _armed() == 0, 5, 0.002), "the hang did not fire"
                t1 = time.monotonic()
                wfence, checks = worker.submit_batch()  # behind the hung FILL
                su.wait(worker.fd, wfence)
                worker_ms.append((time.monotonic() - t1) * 1e3)
                worker.check(checks)
                waiter.join(60)
                assert result, "the hanger's WAIT did not return"
                e, status, efence, t_eio = result[0]
                assert (e, status, efence) == (errno.EIO, ST_TIMEOUT, fence), (
                    f"hanger WAIT: {su.errname(e)}, status {status}, fence {efence}/{fence}"
                )
                assert not np.frombuffer(m, np.uint32).any(), "the hung FILL ran"
                seen_ms.append((t_eio - t0) * 1e3)
                detect_ms.append(su.read_int(f"{su.SYSFS}/last_hang_detect_ms"))
                recovery_us.append(su.read_int(f"{su.SYSFS}/last_reset_recovery_us"))
                assert seen_ms[-1] >= HANG_TIMEOUT_MS, f"detected after {seen_ms[-1]:.0f} ms"
                assert seen_ms[-1] <= HANG_TIMEOUT_MS + 2 * WD_PERIOD_MS + SLACK_MS, seen_ms[-1]
                m.close()
                bo.destroy()
                os.close(hanger)
                worker.run_batch()  # the recovered device computes right
            except Exception as exc:
                raise AssertionError(f"cycle {cycle} (seed {seed}): {exc}") from exc
    finally:
        with open(TIMEOUT_PARAM, "w") as f:
            f.write(f"{saved}\n")
        worker.close()
    seconds = time.monotonic() - t_start
    su.wait_idle()
    assert su.read_int(f"{su.SYSFS}/hangs") == hangs0 + cycles
    assert su.read_int(f"{su.SYSFS}/recoveries") == rec0 + cycles
    assert su.poll(lambda: su.bo_counters() == base_bos, 30), (su.bo_counters(), base_bos)

    figures = {
        "hang_cycles": cycles,
        "hang_cycle_seconds": round(seconds, 1),
        "hang_timeout_ms": HANG_TIMEOUT_MS,
        "hang_detect_ms_median": statistics.median(detect_ms),
        "hang_detect_ms_p90": _pct(detect_ms, 0.9),
        "hang_detect_ms_max": max(detect_ms),
        "hang_eio_ms_median": round(statistics.median(seen_ms), 1),
        "hang_eio_ms_max": round(max(seen_ms), 1),
        "hang_reset_recovery_us_median": statistics.median(recovery_us),
        "hang_reset_recovery_us_max": max(recovery_us),
        "hang_worker_batch_ms_median": round(statistics.median(worker_ms), 1),
    }
    for k, v in figures.items():
        record_property(k, v)
    print(
        f"hang cycles: {cycles} in {seconds:.1f} s; detection (driver) median "
        f"{figures['hang_detect_ms_median']} ms, p90 {figures['hang_detect_ms_p90']} ms, "
        f"max {figures['hang_detect_ms_max']} ms; SUBMIT to EIO median "
        f"{figures['hang_eio_ms_median']} ms, max {figures['hang_eio_ms_max']} ms; "
        f"reset recovery median {figures['hang_reset_recovery_us_median']} us, max "
        f"{figures['hang_reset_recovery_us_max']} us; worker batch behind the hang median "
        f"{figures['hang_worker_batch_ms_median']} ms, all {cycles * 2 + 1} batches verified"
    )
