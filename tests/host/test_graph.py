"""npu.Graph on the CPU backend: capture records without submitting, a replay
is one SUBMIT of the packed ops, inputs change between replays with copy_,
and the graph's memory is never handed to anyone else."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import npu
from npu.hal import CpuBackend


def submits(driver: CpuBackend) -> int:
    return sum(1 for call in driver.calls if call.name == "submit")


@pytest.fixture
def inputs(default_device: npu.Device) -> tuple[npu.Tensor, npu.Tensor]:
    x = npu.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    w = npu.tensor(np.ones((4, 2), np.float32))
    return x, w


def test_capture_records_the_ops_without_submitting(
    driver: CpuBackend, inputs: tuple[npu.Tensor, npu.Tensor]
) -> None:
    x, w = inputs
    before = submits(driver)
    g = npu.Graph()
    with g.capture():
        y = npu.relu(x @ w - 20)
    assert submits(driver) == before
    assert g.num_ops == 3 and y.fence is None


def test_a_replay_is_one_submit_and_gives_the_result(
    driver: CpuBackend, inputs: tuple[npu.Tensor, npu.Tensor]
) -> None:
    x, w = inputs
    g = npu.Graph()
    with g.capture():
        y = npu.relu(x @ w - 20)
    before = submits(driver)
    g.replay()
    assert submits(driver) == before + 1
    want = np.maximum(np.arange(12, dtype=np.float32).reshape(3, 4) @ np.ones((4, 2)) - 20, 0)
    np.testing.assert_array_equal(y.numpy(), want)


def test_inputs_changed_with_copy_are_used_by_the_next_replay(
    inputs: tuple[npu.Tensor, npu.Tensor],
) -> None:
    x, w = inputs
    g = npu.Graph()
    with g.capture():
        y = x @ w
    for scale in (1.0, -2.0, 3.5):
        x.copy_(np.full((3, 4), scale, np.float32))
        g.replay()
        g.synchronize()
        np.testing.assert_array_equal(y.numpy(), np.full((3, 2), 4 * scale, np.float32))


def test_copy_broadcasts_and_converts_to_the_tensor_dtype(default_device: npu.Device) -> None:
    t = npu.tensor(np.zeros((2, 3), np.float16))
    t.copy_([1.5, 2.5, -1.0])
    np.testing.assert_array_equal(t.numpy(), np.tile(np.float16([1.5, 2.5, -1.0]), (2, 1)))
    with pytest.raises(ValueError):
        t.copy_(np.ones(4))


def test_waiting_inside_a_capture_raises(inputs: tuple[npu.Tensor, npu.Tensor]) -> None:
    x, _ = inputs
    g = npu.Graph()
    with g.capture(), pytest.raises(RuntimeError, match="capturing"):
        npu.relu(x).numpy()


def test_raw_submits_inside_a_capture_raise(default_device: npu.Device) -> None:
    g = npu.Graph()
    with g.capture(), pytest.raises(RuntimeError, match="not recorded"):
        default_device.submit([npu.ops.nop()])


def test_the_graph_keeps_its_memory_from_other_tensors(
    inputs: tuple[npu.Tensor, npu.Tensor],
) -> None:
    x, w = inputs
    g = npu.Graph()
    with g.capture():
        y = npu.relu(x @ w)  # the x @ w intermediate dies here
    places = {(t.buffer.handle, t.offset) for t in (y,) if t.buffer is not None}
    fresh = [npu.tensor(np.zeros((3, 2), np.float32)) for _ in range(8)]
    taken = {(t.buffer.handle, t.offset) for t in fresh if t.buffer is not None}
    assert not places & taken
    assert npu.memory_stats()["allocation.all.current"] >= 2 + 2 + 8  # inputs, graph, fresh


def test_replay_before_capture_or_of_nothing_raises(default_device: npu.Device) -> None:
    with pytest.raises(RuntimeError, match="capture the graph first"):
        npu.Graph().replay()
    g = npu.Graph()
    with g.capture():
        pass
    with pytest.raises(RuntimeError, match="no ops"):
        g.replay()


def test_a_graph_is_captured_once_and_captures_do_not_nest(default_device: npu.Device) -> None:
    g = npu.Graph()
    with g.capture(), pytest.raises(RuntimeError, match="already captures"), npu.Graph().capture():
        pass
    with pytest.raises(RuntimeError, match="already captured"), g.capture():
        pass


def test_another_threads_eager_ops_run_and_are_not_recorded_during_a_capture(
    inputs: tuple[npu.Tensor, npu.Tensor],
) -> None:
    x, w = inputs
    capturing, done = threading.Event(), threading.Event()
    seen: list[np.ndarray] = []

    def eager() -> None:
        capturing.wait(5)
        seen.append((x + 1).numpy())  # neither recorded nor refused as a wait
        done.set()

    worker = threading.Thread(target=eager)
    worker.start()
    g = npu.Graph()
    with g.capture():
        y = x @ w
        capturing.set()
        assert done.wait(5)
    worker.join()
    assert g.num_ops == 1
    np.testing.assert_array_equal(seen[0], np.arange(12, dtype=np.float32).reshape(3, 4) + 1)
    g.replay()
    np.testing.assert_array_equal(
        y.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4) @ w.numpy()
    )


def test_two_threads_capture_two_graphs_of_one_device_at_once(
    inputs: tuple[npu.Tensor, npu.Tensor],
) -> None:
    x, _ = inputs
    barrier = threading.Barrier(2)
    graphs: dict[int, tuple[npu.Graph, npu.Tensor]] = {}

    def capture(k: int) -> None:
        g = npu.Graph()
        with g.capture():
            barrier.wait(5)  # both captures are open here
            out = x * float(k) + float(k)
            barrier.wait(5)
        graphs[k] = (g, out)

    threads = [threading.Thread(target=capture, args=(k,)) for k in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    for k, (g, out) in graphs.items():
        assert g.num_ops == 2
        g.replay()
        np.testing.assert_array_equal(out.numpy(), base * k + k)


def test_a_capture_never_takes_a_block_queued_default_stream_work_may_still_use(
    inputs: tuple[npu.Tensor, npu.Tensor],
) -> None:
    x, _ = inputs
    t = npu.relu(x)  # queued on the default stream, never waited for
    assert t.buffer is not None
    where = (t.buffer.handle, t.offset)
    del t
    g = npu.Graph()
    with g.capture():
        y = npu.relu(x)  # its replays may run on any stream, racing the first relu
    assert y.buffer is not None
    assert (y.buffer.handle, y.offset) != where
    eager = npu.relu(x)  # eager work on the default stream may still reuse it at once
    assert eager.buffer is not None
    assert (eager.buffer.handle, eager.offset) == where
