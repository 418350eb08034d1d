"""npu.profiler against the real driver and device, in the guest.

One digits-CNN inference (examples/models/digits_cnn.onnx, batch 64) is
profiled once per module; the tests check that the trace shows all five
layers, that flows lead from a host submit to the engine's work on the
same fence, that the device's spans fall inside the host's run once the
device clock is mapped, that the work the run did (commands, multiply-adds,
bytes) is exactly what the model implies (model_work.py works it out from
the ONNX file, not from the runtime's plan), and that tracefs is left as it
was found. With NPU_PROFILE_OUT set, the trace is also written there
(docs/runtime.md draws its picture from such a trace).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from model_work import Work, expected_work
from perf_util import device_awake, settle

import npu

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
MODEL = MODELS / "digits_cnn.onnx"
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


class Traced(NamedTuple):
    prof: npu.profiler.Profile
    clock: str  # the trace clock before the profile
    fences: int  # fences the driver handed out during the run (one per command)


@pytest.fixture(scope="module")
def traced() -> Traced:
    """The profile of one batch-64 run; the device is held awake and settled
    at both ends of the profile, so its counters are exact (perf_util.py)."""
    root = tracefs_root()
    if root is None:
        pytest.fail("no tracefs with events/npu: the driver's tracepoints are missing")
    if not (root / "events" / "npu" / "npu_fw_event").is_dir():
        pytest.fail("the driver has no npu_fw_event tracepoint")
    clock = clock_of(root)
    with np.load(MODELS / "digits_test.npz") as d:
        x = np.ascontiguousarray(d["x"][:BATCH], dtype=np.float32)
    dev = npu.open_device(0)
    sess = npu.InferenceSession(str(MODEL), device=dev)
    try:
        with device_awake():
            name = sess.get_inputs()[0].name
            sess.run(None, {name: x})  # the plan is built outside the profile
            before = settle()
            with npu.profiler.profile() as prof:
                sess.run(None, {name: x})
                after = settle()
    finally:
        sess.close()
        dev.close()
    out = os.environ.get("NPU_PROFILE_OUT")
    if out:
        prof.export_chrome_trace(out)
    return Traced(prof, clock, after["submitted"] - before["submitted"])


@pytest.fixture(scope="module")
def work() -> Work:
    return expected_work(MODEL, BATCH)


def run_span(prof: npu.profiler.Profile) -> npu.profiler.TraceEvent:
    (run,) = [e for e in prof.events if e.name == "InferenceSession.run"]
    return run


def test_the_trace_shows_all_five_layers(traced: Traced) -> None:
    prof = traced.prof
    assert {e.cat for e in prof.events} == set(npu.profiler.CATS)
    names = {(e.cat, e.name) for e in prof.events}
    assert ("driver", "ioctl SUBMIT") in names and ("driver", "submit") in names
    assert ("firmware", "fetch") in names and ("firmware", "cpl_write") in names
    assert any(c == "engine" and n == "CONV2D" for c, n in names)
    assert any(c == "dma" for c, _ in names)


def test_flows_lead_from_a_host_submit_to_engine_work_of_the_same_fence(
    traced: Traced,
) -> None:
    prof = traced.prof
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
    traced: Traced,
) -> None:
    prof = traced.prof
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


def test_the_reference_figures_of_the_model(work: Work) -> None:
    """model_work.py's arithmetic against figures worked out by hand from
    the digits CNN (8x8 inputs; N = 64; fp32, 4 bytes an element):

    ====== ==================== ============================ ============= ==========
    node   command              multiply-adds                read (elems)  written
    ====== ==================== ============================ ============= ==========
    conv1  CONV2D 1->32 3x3 +R  N*32*8*8*1*9   =    18432 N  64N + 320     2048N
    conv2  CONV2D 32->64 3x3 +R N*64*8*8*32*9  =  1179648 N  2048N + 18496 4096N
    pool   POOL2D 2x2 /2                                     4096N         1024N
    conv3  CONV2D 64->64 3x3 +R N*64*4*4*64*9  =   589824 N  1024N + 36928 1024N
    pool   POOL2D 2x2 /2                                     1024N         256N
    fc1    LINEAR 256->128 +R   N*128*256      =    32768 N  256N + 32896  128N
    logits LINEAR 128->10       N*10*128       =     1280 N  128N + 1290   10N
    ====== ==================== ============================ ============= ==========

    (The constant reads are weights and biases: 89930 elements, the model's
    parameters, each read by the one command that uses it.)
    """
    n = BATCH
    assert dict(work.commands) == {"CONV2D": 3, "POOL2D": 2, "LINEAR": 2}
    assert work.macs == 1_821_952 * n == 116_604_928
    assert work.operand_read == 4 * (8640 * n + 89_930) == 2_571_560
    assert work.written == 4 * 8586 * n == 2_198_016


def test_the_run_submitted_one_command_per_fused_node(traced: Traced, work: Work) -> None:
    """Three views of the commands of one run, each against the model.

    The reference, ``work.commands``, comes from the ONNX graph and the
    fusion rules docs/inference.md states (Conv+Relu: one CONV2D, Gemm
    with a [N] bias (+Relu): one LINEAR, MaxPool: one POOL2D, Flatten: a
    view), not from the runtime's plan. Against it: the driver's fences
    (one per command it put on the ring: a dependency WAIT would take one
    too, and this run has none), the device's NPU_PERF_CMDS, and, by
    opcode, the ``fetch`` records of the device's trace ring.
    """
    c = traced.prof.counters["npu0"]
    fetched = Counter(
        e.args["opcode"] for e in traced.prof.events if e.cat == "firmware" and e.name == "fetch"
    )
    assert traced.fences == work.num_commands == 7, work.nodes
    assert c.total("cmds") == c.queues[0]["cmds"] == work.num_commands
    assert fetched == work.commands


def test_the_counters_count_the_models_multiply_adds_and_bytes_exactly(
    traced: Traced, work: Work
) -> None:
    """NPU_PERF_MACS, READ_BYTES and WRITE_BYTES of the run, exactly.

    MACS is docs/npu-spec.md 4.7's N*O*OH*OW*C/g*KH*KW per CONV2D and
    M*N*K per LINEAR, over the model's shapes. For the bytes, the device
    (qemu_device/npu_tensor.c) reads each input operand of a CONV2D,
    POOL2D or LINEAR whole, once, into host memory before computing
    (im2col, padding and the transposed view of a Gemm weight then work on
    that copy: no operand is read twice) and writes each output element
    once; so WRITE_BYTES is the sum of the commands' outputs, and the
    READ_BYTES the sum of their inputs (activations, weights, biases), both
    from the model's shapes. Parameter blocks are not operands (4.7): the
    device counted each tensor op's 256-byte block until issue 34.
    """
    c = traced.prof.counters["npu0"]
    assert c.total("macs") == work.macs
    assert c.total("write_bytes") == work.written
    assert c.total("read_bytes") == work.operand_read
    # Times cannot be known exactly; only that they were counted.
    assert c.total("busy_ns") > 0 and c.time_ns > 0
    assert any(core["busy_ns"] > 0 for core in c.cores.values())


def test_the_table_names_the_nodes_and_their_device_time(
    traced: Traced,
) -> None:
    prof = traced.prof
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["CONV2D"].device_time_total_us > 0
    convs = [r for r in rows.values() if r.op_type == "Conv"]
    assert convs and all(r.device_time_total_us > 0 for r in convs)
    assert "InferenceSession.run" in prof.key_averages().table(sort_by="cpu_time_total")


def test_tracefs_is_left_as_it_was(traced: Traced) -> None:
    clock = traced.clock
    root = tracefs_root()
    assert root is not None
    assert clock_of(root) == clock
    assert (root / "events" / "npu" / "npu_fw_event" / "enable").read_text().strip() == "0"
