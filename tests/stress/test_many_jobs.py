"""N processes x M jobs, every result verified.

The processes are forked from this Python process (numpy already loaded)
and each opens its own file. A job is one SUBMIT and one WAIT: a COPY, a
FILL, a GEMM, an ELTWISE (ADD/MUL/MAX/SUB), a UNARY (RELU/NEG/ABS), a
CONVERT (fp32 to fp16/int32), or a dependent chain in one SUBMIT (FILL,
then COPY of what it filled, then ELTWISE on both) that only comes out right
if the ops of a queue run in order. Inputs are random per job; every output
is compared with numpy. All processes run at once, so their jobs interleave
in the one queue.

Size: NPU_STRESS_PROCS x NPU_STRESS_JOBS (full 8 x 1000, short 8 x 100).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

from npu import _abi, ops

from . import stress_util as su

BO = 256 * 1024
F32 = _abi.DType.FP32


def _job(fd: int, rng: np.random.Generator, bos: list, views: list, kind: int) -> None:
    a, b, c, d = bos
    va, vb, vc, _ = views  # uint8 views of the mappings
    fa, fb, fc = (v.view(np.float32) for v in (va, vb, vc))
    if kind == 0:  # COPY
        n = int(rng.integers(1, BO // 2))
        so, do = int(rng.integers(0, BO - n)), int(rng.integers(0, BO - n))
        va[so : so + n] = rng.integers(0, 256, n, dtype=np.uint8)
        su.wait(fd, su.submit(fd, [ops.copy(a, b, n, so, do).pack()]))
        assert np.array_equal(vb[do : do + n], va[so : so + n]), "COPY"
    elif kind == 1:  # FILL
        n = int(rng.integers(1, BO // 4)) * 4
        off = int(rng.integers(0, (BO - n) // 4 + 1)) * 4
        pat = int(rng.integers(0, 2**32))
        vc[:] = 0
        su.wait(fd, su.submit(fd, [ops.fill(c, pat, n, off).pack()]))
        w = vc.view(np.uint32)
        assert (w[off // 4 : (off + n) // 4] == pat).all(), "FILL"
        assert not w[: off // 4].any() and not w[(off + n) // 4 :].any(), "FILL outside range"
    elif kind == 2:  # GEMM
        m, n, k = (int(x) for x in rng.integers(1, 48, 3))
        av = rng.standard_normal((m, k), dtype=np.float32)
        bv = rng.standard_normal((k, n), dtype=np.float32)
        fa[: av.size] = av.ravel()
        fb[: bv.size] = bv.ravel()
        su.wait(fd, su.submit(fd, [ops.gemm(a, b, c, m, n, k).pack()]))
        got = fc[: m * n].reshape(m, n)
        np.testing.assert_allclose(got, av @ bv, rtol=1e-4, atol=1e-4, err_msg="GEMM")
    elif kind == 3:  # ELTWISE
        n = int(rng.integers(1, 4096))
        kk = [_abi.EltwiseKind.ADD, _abi.EltwiseKind.MUL, _abi.EltwiseKind.MAX][
            int(rng.integers(3))
        ]
        x = rng.standard_normal(n, dtype=np.float32)
        y = rng.standard_normal(n, dtype=np.float32)
        fa[:n], fb[:n] = x, y
        r = [ops.tensor_ref(t, F32, [n]) for t in (a, b, c)]
        su.wait(fd, su.submit(fd, [ops.eltwise(kk, *r).pack()], tensor=True))
        want = {0: x + y, 2: x * y, 4: np.maximum(x, y)}[int(kk)]
        np.testing.assert_allclose(fc[:n], want, rtol=1e-6, err_msg=f"ELTWISE {kk.name}")
    elif kind == 4:  # UNARY
        n = int(rng.integers(1, 4096))
        kk = [_abi.UnaryKind.RELU, _abi.UnaryKind.NEG, _abi.UnaryKind.ABS][int(rng.integers(3))]
        x = rng.standard_normal(n, dtype=np.float32)
        fa[:n] = x
        r = [ops.tensor_ref(t, F32, [n]) for t in (a, c)]
        su.wait(fd, su.submit(fd, [ops.unary(kk, *r).pack()], tensor=True))
        want = {0: np.maximum(x, 0), 8: -x, 7: np.abs(x)}[int(kk)]
        assert np.array_equal(fc[:n], want), f"UNARY {kk.name}"
    elif kind == 5:  # CONVERT
        rows, cols = (int(v) for v in rng.integers(1, 64, 2))
        x = (rng.standard_normal((rows, cols), dtype=np.float32) * 100).astype(np.float32)
        fa[: x.size] = x.ravel()
        to = [_abi.DType.FP16, _abi.DType.INT32][int(rng.integers(2))]
        # Transpose on the way: the input view is column-major.
        src = ops.tensor_ref(a, F32, [cols, rows], strides=[1, cols])
        dst = ops.tensor_ref(c, to, [cols, rows])
        su.wait(fd, su.submit(fd, [ops.convert(src, dst).pack()], tensor=True))
        npt = np.float16 if to == _abi.DType.FP16 else np.int32
        got = vc[: x.size * np.dtype(npt).itemsize].view(npt).reshape(cols, rows)
        assert np.array_equal(got, x.T.astype(npt)), f"CONVERT to {to.name}"
    else:  # a dependent chain in one SUBMIT: ordering within the queue
        n = int(rng.integers(1, 2048))
        pat = np.float32(rng.standard_normal())
        y = rng.standard_normal(n, dtype=np.float32)
        fb[:n] = y
        fill = ops.fill(d, int(np.array(pat).view(np.uint32)), n * 4)
        copy = ops.copy(d, a, n * 4)
        r = [ops.tensor_ref(t, F32, [n]) for t in (a, b, c)]
        add = ops.eltwise(_abi.EltwiseKind.ADD, *r)
        f1 = su.submit(fd, [fill.pack(), copy.pack()])
        f2 = su.submit(fd, [add.pack()], tensor=True)
        assert f2 > f1
        su.wait(fd, f2)
        np.testing.assert_allclose(fc[:n], pat + y, rtol=1e-6, err_msg="chain")


def _child(w: int, idx: int, jobs: int, seed: int) -> None:
    rng = np.random.default_rng([seed, idx])
    fd = os.open(su.DEV_PATH, os.O_RDWR)
    bos = [su.Bo(fd, BO) for _ in range(4)]
    maps = [bo.map() for bo in bos]
    views = [np.frombuffer(m, np.uint8) for m in maps]
    counts = [0] * 7
    for j in range(jobs):
        kind = int(rng.integers(7))
        try:
            _job(fd, rng, bos, views, kind)
        except Exception as e:
            raise AssertionError(f"process {idx} job {j} (kind {kind}): {e}") from e
        counts[kind] += 1
    os.write(w, json.dumps(counts).encode())
    os.close(fd)


def test_processes_times_jobs_all_results_verified(record_property):
    procs, jobs = su.size("PROCS"), su.size("JOBS")
    seed = su.seed()
    print(f"jobs: {procs} processes x {jobs} jobs, seed {seed}")
    su.wait_idle()
    base = su.bo_counters()
    children = []
    t0 = time.monotonic()
    for i in range(procs):
        r, w = os.pipe()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                _child(w, i, jobs, seed)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(w)
        children.append((pid, r))
    total = [0] * 7
    failed = []
    for i, (pid, r) in enumerate(children):
        data = b""
        while chunk := os.read(r, 4096):
            data += chunk
        os.close(r)
        _, status = os.waitpid(pid, 0)
        if status != 0 or not data:
            failed.append(f"process {i}: exit status {status:#x}")
            continue
        total = [t + c for t, c in zip(total, json.loads(data), strict=True)]
    seconds = time.monotonic() - t0
    assert not failed, f"seed {seed}: " + "; ".join(failed) + " (tracebacks above)"
    assert sum(total) == procs * jobs
    su.wait_idle()
    assert su.poll(lambda: su.bo_counters() == base, 30), (su.bo_counters(), base)
    record_property("jobs_total", sum(total))
    record_property("jobs_seconds", round(seconds, 1))
    record_property("jobs_per_s", round(sum(total) / seconds))
    names = ["copy", "fill", "gemm", "eltwise", "unary", "convert", "chain"]
    print(
        f"jobs: {sum(total)} verified in {seconds:.1f} s ({sum(total) / seconds:.0f}/s): "
        + ", ".join(f"{n} {c}" for n, c in zip(names, total, strict=True))
    )
