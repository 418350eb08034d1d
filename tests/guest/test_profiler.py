"""npu.profiler against the real driver and device, in the guest.

One digits-CNN inference (examples/models/digits_cnn.onnx, batch 64) is
profiled once per module; the tests check that the trace shows all five
layers, that flows lead from a host submit to the engine's work on the
same fence, that the device's spans fall inside the host's run once the
device clock is mapped, that the counters moved, and that tracefs is left
as it was found. With NPU_PROFILE_OUT set, the trace is also written there
(docs/runtime.md draws its picture from such a trace).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import npu

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
BATCH = 64
# How far (us) a mapped device time may stray outside the host's run span.
SLACK_US = 2000.0


def tracefs_root() -> Path | None:
    for root in (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")):
        if (root / "events" / "npu").is_dir():
            return root
    return None


def clock_of(root: Path) -> str:
    text = (root / "trace_clock").read_text()
    return text[text.index("[") + 1 : text.index("]")]


@pytest.fixture(scope="module")
def traced() -> tuple[npu.profiler.Profile, str]:
    """(the profile of one batch-64 run, the trace clock before it)."""
    root = tracefs_root()
    if root is None:
        pytest.fail("no tracefs with events/npu: the driver's tracepoints are missing")
    if not (root / "events" / "npu" / "npu_fw_event").is_dir():
        pytest.fail("the driver has no npu_fw_event tracepoint")
    clock = clock_of(root)
    with np.load(MODELS / "digits_test.npz") as d:
        x = np.ascontiguousarray(d["x"][:BATCH], dtype=np.float32)
    dev = npu.open_device(0)
    sess = npu.InferenceSession(str(MODELS / "digits_cnn.onnx"), device=dev)
    try:
        name = sess.get_inputs()[0].name
        sess.run(None, {name: x})  # the plan is built outside the profile
        with npu.profiler.profile() as prof:
            sess.run(None, {name: x})
    finally:
        sess.close()
        dev.close()
    out = os.environ.get("NPU_PROFILE_OUT")
    if out:
        prof.export_chrome_trace(out)
    return prof, clock


def run_span(prof: npu.profiler.Profile) -> npu.profiler.TraceEvent:
    (run,) = [e for e in prof.events if e.name == "InferenceSession.run"]
    return run


def test_the_trace_shows_all_five_layers(traced: tuple[npu.profiler.Profile, str]) -> None:
    prof, _ = traced
    assert {e.cat for e in prof.events} == set(npu.profiler.CATS)
    names = {(e.cat, e.name) for e in prof.events}
    assert ("driver", "ioctl SUBMIT") in names and ("driver", "submit") in names
    assert ("firmware", "fetch") in names and ("firmware", "cpl_write") in names
    assert any(c == "engine" and n == "CONV2D" for c, n in names)
    assert any(c == "dma" for c, _ in names)


def test_flows_lead_from_a_host_submit_to_engine_work_of_the_same_fence(
    traced: tuple[npu.profiler.Profile, str],
) -> None:
    prof, _ = traced
    hits = []
    for f in prof.flows:
        if f.src.cat != "host" or f.dst.cat != "engine" or f.dst.tid.startswith("ONNX"):
            continue
        first, last = f.src.args["fences"]
        assert f.dst.args["queue"] == f.src.args["queue"]
        assert first <= f.dst.args["fence"] <= last
        hits.append(f)
    assert hits, "no flow from a host submit to the engine"
    assert {f.src.name for f in hits} == {"Device.submit"}
    kinds = {f.dst.cat for f in prof.flows if f.src is hits[0].src}
    assert kinds == {"driver", "firmware", "engine"}


def test_device_spans_fall_inside_the_host_run_after_clock_mapping(
    traced: tuple[npu.profiler.Profile, str],
) -> None:
    prof, _ = traced
    run = run_span(prof)
    device = [e for e in prof.events if e.cat in ("engine", "dma") and not e.instant]
    assert device
    for e in device:
        assert run.ts_us - SLACK_US <= e.ts_us, (e, run)
        assert e.end_us <= run.end_us + SLACK_US, (e, run)
    # The per-node spans (completion records) and the trace ring agree on
    # where the first convolution ran.
    node = next(e for e in device if e.tid.startswith("ONNX") and e.args["op_type"] == "Conv")
    cmd = next(e for e in device if e.name == "CONV2D" and e.args["fence"] == node.args["fence"])
    assert abs(cmd.ts_us - node.ts_us) <= SLACK_US


def test_the_counters_moved_by_the_run(traced: tuple[npu.profiler.Profile, str]) -> None:
    prof, _ = traced
    c = prof.counters["npu0"]
    assert c.total("cmds") > 0 and c.total("busy_ns") > 0 and c.total("macs") > 0
    assert c.time_ns > 0
    assert any(core["busy_ns"] > 0 for core in c.cores.values())


def test_the_table_names_the_nodes_and_their_device_time(
    traced: tuple[npu.profiler.Profile, str],
) -> None:
    prof, _ = traced
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["CONV2D"].device_time_total_us > 0
    convs = [r for r in rows.values() if r.op_type == "Conv"]
    assert convs and all(r.device_time_total_us > 0 for r in convs)
    assert "InferenceSession.run" in prof.key_averages().table(sort_by="cpu_time_total")


def test_tracefs_is_left_as_it_was(traced: tuple[npu.profiler.Profile, str]) -> None:
    _, clock = traced
    root = tracefs_root()
    assert root is not None
    assert clock_of(root) == clock
    assert (root / "events" / "npu" / "npu_fw_event" / "enable").read_text().strip() == "0"
