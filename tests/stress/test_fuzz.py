"""ioctl fuzzer: every call, real objects passed along stale, foreign and at
boundary values, from several threads on shared files; 0 reports.

The model is tests/stress/fuzz_model.py. A seeded generator
(NPU_STRESS_SEED, printed; a failure names it, the thread and the call)
drives THREADS (3) worker threads over three shared open files, plus a
thread that signals the sw_sync timeline:

- every ioctl of the driver (GET_INFO, BO_CREATE, BO_DESTROY, BO_USERPTR,
  BO_INFO, SUBMIT in both op formats and with the 32-byte struct of driver
  1.0, WAIT, FENCE_INFO, QUEUE_CREATE, QUEUE_DESTROY) and DRM's GEM_CLOSE,
  PRIME export and import and every syncobj ioctl (CREATE, DESTROY,
  HANDLE_TO_FD with and without EXPORT_SYNC_FILE, FD_TO_HANDLE with and
  without IMPORT_SYNC_FILE, WAIT, TIMELINE_WAIT, RESET, SIGNAL, QUERY,
  TIMELINE_SIGNAL, TRANSFER, EVENTFD), the sync_file ioctls (FILE_INFO,
  MERGE), poll(), mmap() and munmap();
- each field drawn from boundary values (0, 1, -1, page boundaries, 2^24,
  2^31, 2^32, 2^63, U64_MAX, ...), random bits, or real values: live
  handles and syncobjs of the file, destroyed ones, another file's, sizes
  that fit, the file's fences, user-queue indices and the fence values
  pushed to them;
- SUBMIT op arrays mixing valid ops on live handles (COPY/FILL/GEMM,
  ELTWISE/UNARY/CONVERT, broadcasting views, extremes), valid ops with a
  few fields mutated, and random bytes; dependencies (``in_syncs``) on
  syncobj points (binary, timeline, past the last point), on sw_sync fences
  imported into syncobjs (a few points ahead, already passed, or one that
  never comes: a hang the watchdog resolves) and on user-queue fence values
  (NOPs pushed and rung); ``out_syncobj``/``out_point`` binary and timeline;
- arguments, op arrays and handle arrays at bad pointers (NULL, kernel
  addresses, unmapped and read-only pages, arrays running into a hole);
  wrong ioctl numbers (sizes, directions, numbers, type letters);
- userptr BOs over anonymous, read-only, unmapped and device-mapped memory;
  dma-bufs, sync_files and syncobj fds passed between the files (and closed
  while other threads use them); mappings unmapped with work in flight;
  files closed with work in flight and opened again; the sw_sync timeline
  signalled to its last point and replaced (closing it with fences pending
  deadlocks Linux 6.12's sw_sync itself: Shared.sw_signal_all);
- forked children making a few calls on the inherited files, on a file of
  their own they never close, closing their copies, ringing doorbells, and
  _exit-ing with work in flight.

Each call must return 0 or an errno the table in docs/uapi.md (DRM core's
and the dma-buf core's own for their ioctls) allows for it. Afterwards the
BO counters and pinned pages are back at their baseline, kmemleak (when the
kernel has it) finds nothing from npu.ko, the device computes correctly,
and the module unloads and loads cleanly. The fuzzing files run with
ctx_mem_limit_mib=8 (random sizes get ENOMEM, not the OOM killer) and
hang_timeout_ms=1000 (a dependency that never comes costs a second).

Size: NPU_STRESS_FUZZ_CALLS (full 1,000,000, short 100,000);
NPU_STRESS_FUZZ_THREADS (default 3). ``make test`` runs the short size on
the debug kernel (KASAN, lockdep, ...: tests/test_guest_debug.py) and only
10,000 calls in the distro kernel's short suite (tests/test_stress_suite.py);
``make stress`` the full size on the kernel it boots (``NPU_KERNEL=debug``:
the KASAN variant).
"""

from __future__ import annotations

import os
import time

import kmsg
import numpy as np
import pytest

from npu import _abi, ops

from . import fuzz_model as fm
from . import stress_util as su


def _device_computes() -> None:
    """A GEMM, an ELTWISE and a FILL give the right results."""
    fd = os.open(su.DEV_PATH, os.O_RDWR)
    try:
        rng = np.random.default_rng(5)
        m, n, k = 19, 23, 41
        av = rng.standard_normal((m, k), dtype=np.float32)
        bv = rng.standard_normal((k, n), dtype=np.float32)
        a, b, c = su.Bo(fd, av.nbytes), su.Bo(fd, bv.nbytes), su.Bo(fd, m * n * 4)
        maps = [x.map() for x in (a, b, c)]
        np.frombuffer(maps[0], np.float32)[: av.size] = av.ravel()
        np.frombuffer(maps[1], np.float32)[: bv.size] = bv.ravel()
        su.wait(fd, su.submit(fd, [ops.gemm(a, b, c, m, n, k).pack()]))
        got = np.frombuffer(maps[2], np.float32)[: m * n].reshape(m, n)
        np.testing.assert_allclose(got, av @ bv, rtol=1e-4, atol=1e-4)
        x, y = ops.tensor_ref(a, _abi.DType.FP32, [64]), ops.tensor_ref(b, _abi.DType.FP32, [64])
        out = ops.tensor_ref(c, _abi.DType.FP32, [64])
        op = ops.eltwise(_abi.EltwiseKind.ADD, x, y, out)
        su.wait(fd, su.submit(fd, [op.pack()], tensor=True))
        want = av.ravel()[:64] + bv.ravel()[:64]
        np.testing.assert_allclose(np.frombuffer(maps[2], np.float32)[:64], want, rtol=1e-6)
        su.wait(fd, su.submit(fd, [ops.fill(c, 0x01020304, c.size).pack()]))
        assert (np.frombuffer(maps[2], np.uint32) == 0x01020304).all()
        del got
        for mm in maps:
            mm.close()
    finally:
        os.close(fd)


@pytest.mark.filterwarnings("ignore:.*fork.. may lead to deadlocks:DeprecationWarning")
def test_ioctl_fuzzer_no_oops_only_documented_errnos_then_clean_unload(record_property):
    t_test = time.monotonic()
    n_calls = su.size("FUZZ_CALLS")
    threads = int(os.environ.get("NPU_STRESS_FUZZ_THREADS", "") or fm.THREADS)
    seed = su.seed()
    print(
        f"fuzz: {n_calls} calls, {threads} threads, seed {seed} "
        f"(NPU_STRESS_SEED={seed} repeats each thread's choices)"
    )
    su.wait_idle()
    base = su.bo_counters()
    base_pins = su.pinned_pages()
    hangs0 = su.read_int(f"{su.SYSFS}/hangs")
    if kmsg.kmemleak_available():
        kmsg.kmemleak_scan()  # forget what was there before
    with fm.module_params():
        res = fm.run(seed, n_calls, threads)
    hangs = su.read_int(f"{su.SYSFS}/hangs") - hangs0
    print(
        f"fuzz: {res.calls} calls in {res.seconds:.1f} s = {res.rate:.0f} calls/s "
        f"({res.threads} threads, seed {seed}, sw_sync {'on' if res.sw_sync else 'absent'})"
    )
    print(
        "fuzz: calls (succeeded) by command: "
        + ", ".join(f"{k} {n} ({res.ok[k]})" for k, n in sorted(res.by_cmd.items()))
    )
    print(f"fuzz: results {dict(res.by_errno.most_common())}")
    print(
        "fuzz: seconds in ioctls by command: "
        + ", ".join(f"{k} {t:.1f}" for k, t in res.busy.most_common(12))
    )
    print(
        "fuzz: seconds by action, all told: "
        + ", ".join(f"{k} {t:.1f}" for k, t in res.spent.most_common(12))
    )
    print(
        f"fuzz: {res.forks} forks ({res.child_calls} calls in children), doorbells "
        f"{dict(res.rings)}, {res.sw_signals} sw_sync signals, {hangs} hangs recovered, "
        f"{res.leaked_fds} fds left to us by failed copy-outs"
    )
    record_property("fuzz_seed", seed)
    record_property("fuzz_calls", res.calls)
    record_property("fuzz_threads", res.threads)
    record_property("fuzz_seconds", round(res.seconds, 1))
    record_property("fuzz_calls_per_s", round(res.rate))
    record_property("fuzz_results", repr(dict(res.by_errno.most_common())))
    record_property("fuzz_forks", res.forks)
    record_property("fuzz_hangs", hangs)
    record_property("fuzz_sw_sync", res.sw_sync)
    assert not res.violations, f"seed {seed}: undocumented results:\n" + "\n".join(res.violations)
    assert res.calls >= n_calls
    assert res.by_errno.get("OK", 0) > n_calls // 20, f"seed {seed}: few calls succeeded"

    su.wait_idle()
    assert su.poll(lambda: su.bo_counters() == base, 30), (
        f"seed {seed}: BO counters {su.bo_counters()} != baseline {base}"
    )
    assert su.poll(lambda: su.pinned_pages() == base_pins, 5), "userptr pages still pinned"
    _device_computes()
    kmsg.fail_on_kmemleak()
    # A clean unload (nothing holds the module), and back.
    assert su.read_int("/sys/module/npu/refcnt") == 0
    su.rmmod()
    su.insmod()
    _device_computes()
    print(f"fuzz: the test took {time.monotonic() - t_test:.0f} s in all")
