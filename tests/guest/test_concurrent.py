"""Independent ops run at the same time on the device's AI cores
(``NPU_TENSOR_OP_F_CONCURRENT``, ``Cap.CONCURRENT``), through the driver.

Overlap is read from the completion records (FENCE_INFO): on the guest's
clock, two concurrent ops start before the other ends.
"""

from __future__ import annotations

import errno
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "host"))

onnx = pytest.importorskip("onnx")

import npu  # noqa: E402
from npu import _abi  # noqa: E402
from onnx_models import inception_like, reference  # noqa: E402

N = 512  # a 512^3 MATMUL: milliseconds of work on one AI core


@pytest.fixture
def squares(dev):
    """(ops computing A @ B into three outputs, A, B, the output buffers)."""
    rng = np.random.default_rng(0)
    a, b = dev.alloc(N * N * 4), dev.alloc(N * N * 4)
    a.numpy(np.float32, (N * N,))[:] = rng.uniform(-1, 1, N * N)
    b.numpy(np.float32, (N * N,))[:] = rng.uniform(-1, 1, N * N)
    outs = [dev.alloc(N * N * 4) for _ in range(3)]

    def ref(buf):
        return npu.ops.tensor_ref(buf, _abi.NPU_DTYPE_FP32, (N, N))

    ops = [npu.ops.matmul_op(ref(a), ref(b), ref(o), buffers=(a, b, o)) for o in outs]
    yield ops, a, b, outs
    for buf in (a, b, *outs):
        buf.free()


def times(dev, fences):
    infos = [dev.fence_info(f) for f in fences]
    assert all(i.status == _abi.NPU_ST_OK for i in infos)
    return [(i.t_start_ns, i.t_end_ns) for i in infos]


def test_the_device_reports_concurrent_groups(dev):
    assert dev.info.has(npu.Cap.CONCURRENT)


def test_a_flagged_op_runs_at_the_same_time_as_the_one_before(dev, squares):
    ops, a, b, outs = squares
    last = dev.submit([ops[0], ops[1].with_concurrent()])
    dev.wait(last)
    (s0, e0), (s1, e1) = times(dev, [last - 1, last])
    assert s1 < e0 and s0 < e1, "the two MATMULs did not overlap"
    want = a.numpy(np.float32, (N, N)).astype(np.float64) @ b.numpy(np.float32, (N, N))
    got = [o.numpy(np.float32, (N, N)) for o in outs[:2]]
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(got[0], got[1])


def test_ops_without_the_flag_run_one_after_another(dev, squares):
    ops, *_ = squares
    last = dev.submit(ops[:2])
    dev.wait(last)
    (_, e0), (s1, _) = times(dev, [last - 1, last])
    assert s1 >= e0


def test_a_jobs_first_op_waits_for_the_job_before(dev, squares):
    ops, *_ = squares
    first = dev.submit([ops[0]])
    last = dev.submit([ops[1].with_concurrent()])
    dev.wait(last)
    (_, e0), (s1, _) = times(dev, [first, last])
    assert s1 >= e0, "concurrency crossed a SUBMIT"


def test_a_group_is_no_larger_than_the_device_has_cores(dev, squares):
    ops, *_ = squares
    last = dev.submit([ops[0], ops[1].with_concurrent(), ops[2].with_concurrent()])
    dev.wait(last)
    (_, e0), (_, e1), (s2, _) = times(dev, [last - 2, last - 1, last])
    assert s2 >= max(e0, e1)  # the device has two AI cores


def test_a_tensor_op_flag_outside_the_mask_is_refused_with_einval(dev, squares):
    ops, *_ = squares
    packed = dev.pack([ops[0]])
    packed[0].raw[0].flags = 1 << 1
    with pytest.raises(npu.NpuError) as info:
        dev.submit_packed(packed)
    assert info.value.errno == errno.EINVAL


def test_inception_gives_the_same_result_with_its_branches_concurrent(dev):
    model = inception_like(width=32, size=32)
    x = np.random.default_rng(3).uniform(0, 1, (2, 3, 32, 32)).astype(np.float32)
    with npu.InferenceSession(model, device=dev) as on:
        (got,) = on.run(None, {"x": x})
    with npu.InferenceSession(model, device=dev, concurrent=False) as off:
        (seq,) = off.run(None, {"x": x})
    np.testing.assert_array_equal(got, seq)
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_inception_on_a_user_stream_matches_the_reference(dev):
    model = inception_like(width=32, size=32)
    x = np.random.default_rng(4).uniform(0, 1, (2, 3, 32, 32)).astype(np.float32)
    stream = npu.Stream(dev)
    try:
        with npu.InferenceSession(model, device=dev) as sess:
            for _ in range(2):  # builds the program, then replays it
                with stream:
                    (got,) = sess.run(None, {"x": x})
                np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
    finally:
        stream.close()
