"""Several Python threads on one device: each gets its own results, in its own order.

The rules (docs/runtime.md, "Threads"): a Device, its allocator and its
streams may be shared by threads; each thread's ops run in the order that
thread issued them; a tensor used by two threads needs the user's own
ordering (as with numpy arrays).
"""

from __future__ import annotations

import threading

import numpy as np

import npu

THREADS = 4
OPS = 1000


def run_threads(work: object) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)  # type: ignore[operator]
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def test_four_threads_of_a_thousand_chained_ops_each_get_exact_results(
    default_device: npu.Device,
) -> None:
    def work(k: int) -> None:
        x = npu.tensor(np.full(64, 1000.0 * k, np.float32))
        for i in range(OPS):
            x = x + 1
            if i % 100 == 99:  # a host sync now and then, in program order
                np.testing.assert_array_equal(x.numpy(), np.full(64, 1000.0 * k + i + 1))

    assert run_threads(work) == []


def test_threads_mixing_ops_and_allocations_leave_no_memory_behind(
    default_device: npu.Device,
) -> None:
    base = npu.memory_allocated()

    def work(k: int) -> None:
        rng = np.random.default_rng(k)
        for _ in range(OPS // 4):
            a = rng.standard_normal((8, 16)).astype(np.float32)
            b = rng.standard_normal((16, 4)).astype(np.float32)
            got = npu.relu(npu.tensor(a) @ npu.tensor(b)).numpy()
            np.testing.assert_allclose(got, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)

    assert run_threads(work) == []
    assert npu.memory_allocated() == base
