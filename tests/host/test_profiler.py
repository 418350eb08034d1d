"""npu.profiler on the CPU backend: host spans, ONNX nodes, the Chrome trace,
the table, the PNG and the cost of the hook when nothing records.

No tracefs or debugfs here (the fixture points the profiler at empty
directories): the driver and device layers are tested with synthetic trace
text in test_profiler_trace.py.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import npu
from npu import _spans
from npu.hal import CpuBackend
from npu.profiler import counters, tracefs
from onnx_models import digits_cnn, rnd


@pytest.fixture(autouse=True)
def no_kernel_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No tracefs and no debugfs, whatever the machine has."""
    monkeypatch.setattr(tracefs, "TRACEFS_ROOTS", [tmp_path / "no-tracefs"])
    monkeypatch.setattr(counters, "DEBUGFS_ROOT", tmp_path / "no-debugfs")


@pytest.fixture
def stream(device: npu.Device) -> Iterator[npu.Stream]:
    s = npu.Stream(device)
    yield s
    s.close()


def spans(prof: npu.profiler.Profile, name: str) -> list[npu.profiler.TraceEvent]:
    return [e for e in prof.events if e.name == name]


def run_digits(
    device: npu.Device, batch: int = 4, **kwargs: bool
) -> tuple[npu.profiler.Profile, npu.InferenceSession]:
    sess = npu.InferenceSession(digits_cnn(), device=device)
    x = rnd(np.random.default_rng(0), batch, 1, 28, 28)
    sess.run(None, {"x": x})  # plans built outside the profile
    with npu.profiler.profile(**kwargs) as prof:
        sess.run(None, {"x": x})
    return prof, sess


# -- host spans -------------------------------------------------------------------


def test_a_stream_fill_is_a_host_span_with_its_queue_and_fence(
    device: npu.Device, stream: npu.Stream
) -> None:
    buf = device.alloc(4096)
    with npu.profiler.profile() as prof:
        fence = stream.fill(buf, 7, 4096)
        stream.synchronize()
    (span,) = spans(prof, "Stream.fill")
    assert span.cat == "host" and span.pid == "host" and span.dur_us is not None
    assert span.args["queue"] == stream.queue.index  # type: ignore[union-attr]
    assert span.args["fences"] == (fence, fence)
    assert spans(prof, "Stream.synchronize")


def test_a_device_submit_is_a_host_span_with_queue_0_and_its_fences(device: npu.Device) -> None:
    buf = device.alloc(4096)
    with npu.profiler.profile() as prof:
        last = device.submit([npu.ops.fill(buf, 1, 4096), npu.ops.fill(buf, 2, 4096)])
        device.wait(last)
    (submit,) = spans(prof, "Device.submit")
    assert submit.args["queue"] == 0 and submit.args["fences"] == (last - 1, last)
    (wait,) = spans(prof, "Device.wait")
    assert wait.args == {"queue": 0, "fence": last}
    assert wait.ts_us >= submit.end_us


def test_alloc_and_free_are_host_spans(device: npu.Device) -> None:
    with npu.profiler.profile() as prof:
        device.alloc(8192).free()
    assert spans(prof, "Device.alloc")[0].args["size"] == 8192
    assert spans(prof, "Buffer.free")[0].args["size"] == 8192


def test_a_tensor_op_on_a_stream_is_a_host_span_around_its_launch(
    default_device: npu.Device, stream: npu.Stream
) -> None:
    a = npu.tensor(np.ones(64, np.float32))
    with npu.profiler.profile() as prof, stream:
        (a + 1).numpy()
    (op,) = spans(prof, "tensor.ELTWISE")
    launch = next(e for e in prof.events if e.name.startswith("Stream.") and "fences" in e.args)
    assert op.ts_us <= launch.ts_us and launch.end_us <= op.end_us
    assert op.args["fences"] == launch.args["fences"]


def test_record_shapes_adds_the_inputs_shapes(device: npu.Device) -> None:
    prof, _ = run_digits(device, record_shapes=True)
    (run,) = spans(prof, "InferenceSession.run")
    assert run.args["shapes"] == {"x": [4, 1, 28, 28]}
    prof, _ = run_digits(device)
    assert "shapes" not in spans(prof, "InferenceSession.run")[0].args


# -- nothing outside a profile --------------------------------------------------------


def test_nothing_is_recorded_outside_a_profile(device: npu.Device) -> None:
    buf = device.alloc(4096)
    with npu.profiler.profile() as prof:
        device.run([npu.ops.fill(buf, 1, 4096)])
    count = len(prof.events)
    assert _spans.recorder is None
    device.run([npu.ops.fill(buf, 2, 4096)])
    assert len(prof.events) == count


def test_the_hook_reads_no_clock_when_no_profile_records(
    device: npu.Device, stream: npu.Stream, monkeypatch: pytest.MonkeyPatch
) -> None:
    def clock() -> int:
        raise AssertionError("a span was timed with no profile recording")

    monkeypatch.setattr(_spans, "now", clock)
    buf = device.alloc(4096)
    device.run([npu.ops.fill(buf, 1, 4096)])
    stream.fill(buf, 3, 4096)
    stream.synchronize()
    buf.free()
    sess = npu.InferenceSession(digits_cnn(), device=device)
    sess.run(None, {"x": rnd(np.random.default_rng(0), 1, 1, 28, 28)})


def test_the_inactive_hook_costs_well_under_a_microsecond() -> None:
    def hooked() -> None:
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        if rec is not None:
            rec.add("x", t0, _spans.now())

    n = 200_000
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            hooked()
        best = min(best, (time.perf_counter() - t) / n)
    assert best < 1e-6, f"{best * 1e9:.0f} ns per inactive hook"


def test_profiles_do_not_nest() -> None:
    with npu.profiler.profile(), pytest.raises(RuntimeError, match="already recording"):
        npu.profiler.profile().start()
    assert _spans.recorder is None


# -- the model runner ------------------------------------------------------------------


def test_each_npu_node_is_a_device_span_inside_its_run(device: npu.Device) -> None:
    prof, sess = run_digits(device)
    (run,) = spans(prof, "InferenceSession.run")
    nodes = [e for e in prof.events if e.args.get("provider") == "NPU"]
    assert [n.name for n in nodes] == [t.name for t in sess.node_times()]
    for n in nodes:
        assert n.cat == "engine" and n.pid == "cpu engine" and n.dur_us is not None
        assert run.ts_us <= n.ts_us and n.end_us <= run.end_us
    conv1 = nodes[0]
    assert conv1.name == "conv1" and conv1.args["op_type"] == "Conv"
    assert conv1.args["fused"] == ["bn1", "relu1"]


def test_node_times_are_read_when_the_profile_ends_not_inside_the_runs(
    device: npu.Device, driver: CpuBackend
) -> None:
    sess = npu.InferenceSession(digits_cnn(), device=device)
    x = rnd(np.random.default_rng(0), 2, 1, 28, 28)
    sess.run(None, {"x": x})
    with npu.profiler.profile() as prof:
        for _ in range(3):
            sess.run(None, {"x": x})
        inside = [c for c in driver.calls if c.name == "fence_info"]
    after = [c for c in driver.calls if c.name == "fence_info"]
    assert inside == [] and len(after) == 3 * 7
    runs = spans(prof, "InferenceSession.run")
    nodes = [e for e in prof.events if e.args.get("provider") == "NPU"]
    assert len(nodes) == 3 * 7
    for run, group in zip(runs, (nodes[i : i + 7] for i in range(0, 21, 7)), strict=True):
        assert all(run.ts_us <= n.ts_us and n.end_us <= run.end_us for n in group)


def test_pending_node_reads_are_done_before_the_ring_could_reuse_their_records(
    device: npu.Device, driver: CpuBackend
) -> None:
    sess = npu.InferenceSession(digits_cnn(), device=device)
    x = rnd(np.random.default_rng(0), 1, 1, 28, 28)
    sess.run(None, {"x": x})
    runs = device.info.ring_entries // 7 + 2  # more ops than the ring holds
    with npu.profiler.profile() as prof:
        for _ in range(runs):
            sess.run(None, {"x": x})
        assert [c for c in driver.calls if c.name == "fence_info"]  # some read already
    assert len([e for e in prof.events if e.args.get("provider") == "NPU"]) == runs * 7


def test_a_node_run_on_the_cpu_is_a_host_span(device: npu.Device) -> None:
    sess = npu.InferenceSession(digits_cnn(middle="Softplus"), device=device)
    x = rnd(np.random.default_rng(1), 2, 1, 28, 28)
    with npu.profiler.profile() as prof:
        sess.run(None, {"x": x})
    cpu = [e for e in prof.events if e.args.get("provider") == "CPU"]
    assert [e.args["op_type"] for e in cpu] == ["Softplus"]
    assert cpu[0].cat == "host"


def test_flows_link_the_runs_submit_to_each_nodes_device_span(device: npu.Device) -> None:
    prof, _ = run_digits(device)
    (submit,) = spans(prof, "Device.submit")
    targets = {f.dst.name for f in prof.flows if f.src is submit}
    nodes = {e.name for e in prof.events if e.args.get("provider") == "NPU"}
    assert targets == nodes


# -- the Chrome trace ------------------------------------------------------------------


def test_the_chrome_trace_has_the_documented_schema(device: npu.Device, tmp_path: Path) -> None:
    prof, _ = run_digits(device)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    data = json.loads(path.read_text())
    assert data["displayTimeUnit"] == "ms"
    events = data["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X", "s", "f"}
    assert all(e["cat"] in npu.profiler.CATS for e in events)
    names = {
        (e["pid"], e["args"]["name"])
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert {n for _, n in names} == {"host", "cpu engine"}
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {"MainThread", "ONNX nodes (queue 0)"}
    run = next(e for e in events if e["name"] == "InferenceSession.run")
    want = spans(prof, "InferenceSession.run")[0]
    assert run["ts"] == pytest.approx(want.ts_us, abs=1e-3)
    assert run["dur"] == pytest.approx(want.dur_us, abs=1e-3)  # microseconds
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = [e for e in events if e["ph"] == "f"]
    assert len(ends) == len(starts) == len(prof.flows)
    assert all(e["bp"] == "e" and e["id"] in starts for e in ends)


def test_an_instant_is_exported_with_thread_scope(tmp_path: Path) -> None:
    ev = npu.profiler.TraceEvent("irq", "driver", 5.0, None, "driver", "queue 0")
    data = npu.profiler.chrome_trace([ev])
    (inst,) = [e for e in data["traceEvents"] if e["ph"] == "i"]
    assert inst["s"] == "t" and "dur" not in inst and inst["cat"] == "driver"


def test_load_reads_back_an_exported_trace(device: npu.Device, tmp_path: Path) -> None:
    prof, _ = run_digits(device)
    prof.export_chrome_trace(tmp_path / "t.json")
    back = npu.profiler.load(tmp_path / "t.json")
    assert [(e.name, e.pid, e.tid) for e in back.events] == [
        (e.name, e.pid, e.tid) for e in prof.events
    ]
    assert len(back.flows) == len(prof.flows)


# -- key_averages -----------------------------------------------------------------------


def test_the_table_lists_nodes_with_op_type_calls_and_device_time(device: npu.Device) -> None:
    prof, sess = run_digits(device)
    rows = {r.key: r for r in prof.key_averages()}
    times = {t.name: t for t in sess.node_times()}
    assert rows["conv1"].op_type == "Conv" and rows["conv1"].count == 1
    assert rows["conv1"].device_time_total_us > 0 and rows["conv1"].host_time_total_us == 0
    assert rows["InferenceSession.run"].host_time_total_us > 0
    text = prof.key_averages().table(sort_by="device_time_total", row_limit=3)
    lines = text.splitlines()
    assert lines[1].split()[:4] == ["Name", "Layer", "Op", "type"]
    body = lines[3:6]
    slowest = sorted(times, key=lambda n: times[n].device_us, reverse=True)[:3]
    assert [b.split()[0] for b in body] == slowest
    assert "Device time total" in text and "Host time total" in text


def test_the_table_sorts_by_host_time_as_torch_names_it(device: npu.Device) -> None:
    prof, _ = run_digits(device)
    text = prof.key_averages().table(sort_by="cpu_time_total", row_limit=1)
    assert text.splitlines()[3].split()[0] == "InferenceSession.run"
    with pytest.raises(ValueError, match="sort_by"):
        prof.key_averages().table(sort_by="bogus")


# -- the PNG ----------------------------------------------------------------------------


def test_the_timeline_png_is_written(device: npu.Device, tmp_path: Path) -> None:
    import matplotlib  # noqa: F401

    prof, _ = run_digits(device)
    path = tmp_path / "timeline.png"
    prof.save_timeline_png(path, title="digits CNN")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_timeline_png_without_matplotlib_says_so(
    device: npu.Device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prof, _ = run_digits(device)
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(RuntimeError, match="matplotlib"):
        prof.save_timeline_png(tmp_path / "t.png")
    assert not (tmp_path / "t.png").exists()


# -- without the kernel's files -----------------------------------------------------------


def test_without_tracefs_or_debugfs_only_host_and_node_events_are_recorded(
    device: npu.Device,
) -> None:
    prof, _ = run_digits(device)
    assert {e.cat for e in prof.events} == {"host", "engine"}
    assert prof.counters == {} and prof.trace_text == ""


def test_the_command_line_prints_the_table_of_an_exported_trace(
    device: npu.Device, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from npu.profiler.__main__ import main

    prof, _ = run_digits(device)
    prof.export_chrome_trace(tmp_path / "t.json")
    assert main([str(tmp_path / "t.json"), "--rows", "2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[0] == "Name" and "Device time total" in out
    assert main([str(tmp_path / "missing.json")]) == 1
