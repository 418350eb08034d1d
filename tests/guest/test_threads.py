"""Several Python threads on one device and on one stream (docs/runtime.md, "Threads").

Each of four threads runs a thousand chained ops and checks its values now
and then: the results must be exact and in each thread's program order,
whether the threads share the default stream, one user stream or have one
each.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

import npu

THREADS = 4
OPS = 1000


def run_threads(work: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    return errors


def chain(dev: npu.Device, k: int) -> None:
    x = npu.tensor(np.full(64, 1000.0 * k, np.float32), device=dev)
    for i in range(OPS):
        x = x + 1
        if i % 100 == 99:
            np.testing.assert_array_equal(x.numpy(), np.full(64, 1000.0 * k + i + 1))


def test_four_threads_on_the_default_stream_get_exact_results_in_order(dev: npu.Device) -> None:
    assert run_threads(lambda k: chain(dev, k)) == []


def test_four_threads_sharing_one_user_stream_get_exact_results_in_order(
    dev: npu.Device,
) -> None:
    s = npu.Stream(dev)

    def work(k: int) -> None:
        with s:  # the current stream is per thread
            chain(dev, k)

    try:
        assert run_threads(work) == []
    finally:
        s.close()


def test_four_threads_with_a_stream_each_get_exact_results_in_order(dev: npu.Device) -> None:
    def work(k: int) -> None:
        s = npu.Stream(dev)
        try:
            with s:
                chain(dev, k)
        finally:
            s.close()

    assert run_threads(work) == []
