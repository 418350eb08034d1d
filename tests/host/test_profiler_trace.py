"""npu.profiler's driver and device layers from synthetic tracefs text: the
parser (every tracepoint the driver emits), ioctl pairing, the device clock
mapping, the device's layers, flows, a fake tracefs and debugfs driven by
a profile, and the counters' deltas."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import npu
from npu import _spans
from npu.profiler import ClockMap, TraceEvent, counters, parse_trace, tracefs
from npu.profiler.table import key_averages
from npu.profiler.tracefs import device_events, driver_events

HEADER = """\
# tracer: nop
#
# entries-in-buffer/entries-written: 20/20   #P:2
#
#                                _-----=> irqs-off/BH-disabled
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
#              | |         |   |||||     |         |
"""


def line(ts_s: float | str, event: str, body: str, task: str = "python3-123", cpu: int = 0) -> str:
    ts = ts_s if isinstance(ts_s, str) else f"{ts_s:.6f}"
    return f"{task:>16} [{cpu:03d}] ..... {ts:>12}: {event}: {body}"


# One line of each tracepoint and what the parser makes of it.
LINES = {
    "npu_ioctl_enter": ("nr=0x43", {"nr": 0x43}),
    "npu_ioctl_exit": ("nr=0x43 ret=-22", {"nr": 0x43, "ret": -22}),
    "npu_submit": ("queue=0 fences=5..7", {"queue": 0, "fences": (5, 7)}),
    "npu_ring_write": (
        "queue=0 fence=5 opcode=13 slot=4",
        {"queue": 0, "fence": 5, "opcode": 13, "slot": 4},
    ),
    "npu_doorbell": ("queue=2 tail=8", {"queue": 2, "tail": 8}),
    "npu_irq": ("queue=1", {"queue": 1}),
    "npu_complete": ("queue=0 fence=7", {"queue": 0, "fence": 7}),
    "npu_wait_done": ("queue=0 fence=7", {"queue": 0, "fence": 7}),
    "npu_job_retire": ("fences=5..7 status=0", {"fences": (5, 7), "status": 0}),
    "npu_clock_sync": ("dev_ns=5000000", {"dev_ns": 5000000}),
    "npu_fw_event": (
        "dev_ns=4999300 kind=tile_start queue=0 core=1 fence=5 arg32=0 arg=3",
        {
            "dev_ns": 4999300,
            "kind": "tile_start",
            "queue": 0,
            "core": 1,
            "fence": 5,
            "arg32": 0,
            "arg": 3,
        },
    ),
}


@pytest.mark.parametrize("event", sorted(LINES))
def test_the_parser_reads_each_tracepoint_line(event: str) -> None:
    body, fields = LINES[event]
    (rec,) = parse_trace(HEADER + line("12.345678", event, body) + "\n")
    assert rec.event == event and dict(rec.fields) == fields
    assert rec.task == "python3" and rec.pid == 123 and rec.cpu == 0
    assert rec.ts_ns == 12_345_678_000


def test_the_parser_reads_tasks_with_dashes_and_lines_without_flags_or_with_tgid() -> None:
    text = "\n".join(
        [
            "  my-prog-name-77 [001] 1.000001: npu_irq: queue=0",
            "     kworker/u8:2-45      (   45) [000] d.h1. 2.5: npu_irq: queue=3",
            "this is no trace line",
            "",
        ]
    )
    a, b = parse_trace(text)
    assert (a.task, a.pid, a.ts_ns) == ("my-prog-name", 77, 1_000_001_000)
    assert (b.task, b.pid, b.cpu, b.ts_ns, b.fields["queue"]) == (
        "kworker/u8:2",
        45,
        0,
        2_500_000_000,
        3,
    )


# -- the driver's layer -------------------------------------------------------------------


def test_ioctl_enter_and_exit_pair_into_one_span_named_after_the_ioctl() -> None:
    text = "\n".join(
        [
            line(1.000010, "npu_ioctl_enter", "nr=0x43"),
            line(1.000012, "npu_ioctl_enter", "nr=0x44", task="other-9"),
            line(1.000030, "npu_submit", "queue=0 fences=1..1"),
            line(1.000050, "npu_ioctl_exit", "nr=0x43 ret=0"),
            line(1.000090, "npu_ioctl_exit", "nr=0x44 ret=-110", task="other-9"),
        ]
    )
    evs = driver_events(parse_trace(text))
    ioctls = {e.name: e for e in evs if e.name.startswith("ioctl")}
    submit = ioctls["ioctl SUBMIT"]
    assert submit.cat == "driver" and submit.pid == "driver" and submit.tid == "python3-123"
    assert submit.ts_us == pytest.approx(1_000_010.0) and submit.dur_us == pytest.approx(40.0)
    assert ioctls["ioctl WAIT"].args == {"nr": 0x44, "ret": -110}
    (sub,) = [e for e in evs if e.name == "submit"]
    assert sub.instant and sub.tid == "queue 0" and sub.args["fences"] == [1, 1]


def test_an_ioctl_without_its_partner_stays_an_instant() -> None:
    text = "\n".join(
        [line(1.0, "npu_ioctl_exit", "nr=0x03 ret=0"), line(2.0, "npu_ioctl_enter", "nr=0x7f")]
    )
    evs = driver_events(parse_trace(text))
    assert [(e.name, e.instant) for e in evs] == [("ioctl SUBMIT exit", True), ("ioctl 0x7f", True)]


def test_driver_events_without_a_queue_stay_on_their_task() -> None:
    text = line(1.0, "npu_job_retire", "fences=5..7 status=0", task="kworker/0:1-45")
    (ev,) = driver_events(parse_trace(text))
    assert ev.name == "job_retire" and ev.tid == "kworker/0:1-45"


# -- the device clock -----------------------------------------------------------------------


def test_the_clock_map_uses_the_latest_sync_at_or_before_each_event() -> None:
    clock = ClockMap([(1_000, 10_000), (5_000, 14_100)])
    assert clock.to_host(1_000) == 10_000
    assert clock.to_host(4_999) == 13_999
    assert clock.to_host(5_000) == 14_100
    assert clock.to_host(6_000) == 15_100


def test_the_clock_map_uses_the_first_sync_before_any_sync() -> None:
    clock = ClockMap([(1_000, 10_000), (5_000, 14_100)])
    assert clock.to_host(400) == 9_400
    assert not ClockMap().known


def test_the_clock_map_is_built_from_the_sync_lines() -> None:
    recs = parse_trace(line(100.000010, "npu_clock_sync", "dev_ns=5000000"))
    assert ClockMap.from_records(recs).to_host(5_000_500) == 100_000_010_000 + 500


# -- the device's layers -----------------------------------------------------------------------


def fw(
    dev_ns: int,
    kind: str,
    queue: int = 0,
    core: int = 255,
    fence: int = 5,
    arg32: int = 0,
    arg: int = 0,
) -> str:
    body = f"dev_ns={dev_ns} kind={kind} queue={queue} core={core} fence={fence} "
    return line(100.002, "npu_fw_event", body + f"arg32={arg32} arg={arg}", task="kworker/0:1-45")


DEVICE_TRACE = "\n".join(
    [
        line(100.000010, "npu_clock_sync", "dev_ns=1000000", task="kworker/0:1-45"),
        fw(1_000_100, "fetch", arg32=int(npu.Opcode.CONV2D)),
        fw(1_000_110, "dispatch", core=1),
        fw(1_000_120, "cmd_start", core=1),
        fw(1_000_130, "dma_start", core=1, arg32=0, arg=4096),
        fw(1_000_150, "dma_end", core=1, arg32=0, arg=4096),
        fw(1_000_160, "tile_start", core=1, arg=0),
        fw(1_000_200, "tile_end", core=1, arg=0),
        fw(1_000_210, "dma_start", core=1, arg32=1, arg=512),
        fw(1_000_220, "dma_end", core=1, arg32=1, arg=512),
        fw(1_000_230, "cmd_end", core=1, arg32=0),
        fw(1_000_240, "cpl_write"),
        fw(1_000_250, "irq", arg32=2),
        fw(1_000_300, "mbox_req", arg32=4),
        fw(1_000_310, "mbox_reply", arg32=0),
        fw(1_000_400, "tile_start", core=2, fence=6, arg=0),
    ]
)


def test_fw_events_become_the_firmware_engine_and_dma_layers() -> None:
    evs = device_events(parse_trace(DEVICE_TRACE))
    got = {(e.cat, e.name, e.pid, e.tid, e.instant) for e in evs}
    assert got == {
        ("firmware", "fetch", "npu0 firmware", "queue 0", True),
        ("firmware", "dispatch", "npu0 firmware", "queue 0", True),
        ("engine", "CONV2D", "npu0 engine", "core 1", False),
        ("dma", "dma read", "npu0 dma", "core 1", False),
        ("engine", "tile", "npu0 engine", "core 1", False),
        ("dma", "dma write", "npu0 dma", "core 1", False),
        ("firmware", "cpl_write", "npu0 firmware", "queue 0", True),
        ("firmware", "irq", "npu0 firmware", "queue 0", True),
        ("firmware", "mbox_req", "npu0 firmware", "mailbox", True),
        ("firmware", "mbox_reply", "npu0 firmware", "mailbox", True),
        ("engine", "tile_start", "npu0 engine", "core 2", True),  # no tile_end: an instant
    }


def test_device_spans_are_placed_on_host_time_with_the_sync() -> None:
    evs = {e.name: e for e in device_events(parse_trace(DEVICE_TRACE))}
    # sync: dev 1_000_000 ns == host 100.000010 s; cmd_start at +120 ns, end at +230 ns.
    cmd = evs["CONV2D"]
    assert cmd.ts_us == pytest.approx(100_000_010.120)
    assert cmd.dur_us == pytest.approx(0.110)
    assert cmd.args["fence"] == 5 and cmd.args["status"] == 0
    assert evs["dma read"].args["bytes"] == 4096 and evs["dma write"].args["bytes"] == 512
    assert evs["fetch"].args["opcode"] == "CONV2D"


def test_without_a_sync_the_first_event_places_the_device_clock() -> None:
    (ev,) = device_events(parse_trace(fw(7_000, "fetch")))
    assert ev.ts_us == pytest.approx(100_002_000.0)


# -- flows ---------------------------------------------------------------------------------------


def test_flows_link_a_host_submit_to_the_drivers_submit_the_fetch_and_the_engine_work() -> None:
    recs = parse_trace(DEVICE_TRACE + "\n" + line(100.000009, "npu_submit", "queue=0 fences=5..5"))
    host = TraceEvent(
        "Device.submit",
        "host",
        100_000_008.0,
        3.0,
        "host",
        "MainThread",
        {"queue": 0, "fences": (5, 5)},
    )
    inner_free = TraceEvent(
        "Device.wait", "host", 100_000_020.0, 3.0, "host", "MainThread", {"queue": 0, "fence": 5}
    )
    events = [host, inner_free, *driver_events(recs), *device_events(recs)]
    flows = npu.profiler.link_flows(events)
    assert {(f.src.name, f.dst.cat, f.dst.name) for f in flows} == {
        ("Device.submit", "driver", "submit"),
        ("Device.submit", "firmware", "fetch"),
        ("Device.submit", "engine", "CONV2D"),
    }
    assert len({f.id for f in flows}) == 3


def test_only_the_innermost_host_call_of_a_fence_is_a_flow_source() -> None:
    outer = TraceEvent(
        "tensor.CONV2D", "host", 10.0, 10.0, "host", "T", {"queue": 1, "fences": (5, 5)}
    )
    inner = TraceEvent(
        "Stream.launch", "host", 12.0, 2.0, "host", "T", {"queue": 1, "fences": (5, 5)}
    )
    fetch = TraceEvent(
        "fetch", "firmware", 15.0, None, "npu0 firmware", "queue 1", {"queue": 1, "fence": 5}
    )
    (flow,) = npu.profiler.link_flows([outer, inner, fetch])
    assert flow.src is inner and flow.dst is fetch


# -- tracefs and debugfs driven by a profile ---------------------------------------------


def fake_tracefs(root: Path) -> Path:
    (root / "events" / "npu").mkdir(parents=True)
    for ev in ("npu_submit", "npu_fw_event", "npu_clock_sync", "npu_irq"):
        (root / "events" / "npu" / ev).mkdir()
        (root / "events" / "npu" / ev / "enable").write_text("0\n")
    (root / "events" / "npu" / "npu_irq" / "enable").write_text("1\n")  # already on
    (root / "trace_clock").write_text("[local] global counter uptime perf mono mono_raw boot\n")
    (root / "buffer_size_kb").write_text("1408\n")
    (root / "tracing_on").write_text("1\n")
    (root / "trace").write_text(line(1.0, "npu_irq", "queue=0") + "\n")  # stale
    return root


def perf(cmds: int, busy: int, core_busy: int, t: int) -> str:
    return (
        f"time_ns={t}\n"
        f"queue=0 cmds={cmds} busy_ns={busy} macs=10 read_bytes=4096 write_bytes=512 "
        "walks=3 walk_hits=2 wait_ns=0\n"
        f"core=0 busy_ns={core_busy}\ncore=1 busy_ns=0\n"
    )


def test_a_profile_drives_tracefs_and_debugfs_and_restores_them(
    device: npu.Device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = fake_tracefs(tmp_path / "tracing")
    monkeypatch.setattr(tracefs, "TRACEFS_ROOTS", [tmp_path / "missing", root])
    dbg = tmp_path / "debug" / "npu"
    (dbg / "npu0").mkdir(parents=True)
    (dbg / "npu0" / "perf").write_text(perf(10, 1000, 900, 5_000))
    monkeypatch.setattr(counters, "DEBUGFS_ROOT", dbg)
    buf = device.alloc(4096)
    with npu.profiler.profile() as prof:
        assert (root / "trace_clock").read_text().strip() == "mono"
        assert (root / "events/npu/npu_submit/enable").read_text().strip() == "1"
        assert (root / "trace").read_text() == ""  # cleared
        assert (root / "buffer_size_kb").read_text().strip() == str(tracefs.MIN_BUFFER_KB)
        fence = device.submit([npu.ops.fill(buf, 1, 4096)])
        device.wait(fence)
        now_s = time.monotonic_ns() / 1e9
        dev0 = 2_000_000
        (root / "trace").write_text(
            "\n".join(
                [
                    HEADER,
                    line(now_s, "npu_submit", f"queue=0 fences={fence}..{fence}"),
                    line(now_s, "npu_clock_sync", f"dev_ns={dev0}"),
                    fw(dev0 + 1000, "fetch", fence=fence, arg32=int(npu.Opcode.FILL)),
                    fw(dev0 + 2000, "cmd_start", fence=fence),
                    fw(dev0 + 9000, "cmd_end", fence=fence),
                ]
            )
        )
        (dbg / "npu0" / "perf").write_text(perf(13, 4000, 2900, 9_000))
    assert (root / "trace_clock").read_text().strip() == "local"
    assert (root / "buffer_size_kb").read_text().strip() == "1408"
    assert (root / "events/npu/npu_submit/enable").read_text().strip() == "0"
    assert (root / "events/npu/npu_irq/enable").read_text().strip() == "1"  # not ours
    assert {e.cat for e in prof.events} == {"host", "driver", "firmware", "engine"}
    (submit,) = [e for e in prof.events if e.name == "Device.submit"]
    assert {f.dst.name for f in prof.flows if f.src is submit} == {"submit", "fetch", "FILL"}
    c = prof.counters["npu0"]
    assert c.time_ns == 4_000 and c.total("cmds") == 3
    assert c.queues[0]["busy_ns"] == 3000 and c.queues[0]["walks"] == 0
    assert c.cores == {0: {"busy_ns": 2000}, 1: {"busy_ns": 0}}
    assert _spans.recorder is None


@pytest.mark.parametrize(("with_driver", "with_device"), [(True, False), (False, True)])
def test_a_profile_enables_only_the_layers_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_driver: bool, with_device: bool
) -> None:
    root = fake_tracefs(tmp_path / "tracing")
    monkeypatch.setattr(tracefs, "TRACEFS_ROOTS", [root])
    monkeypatch.setattr(counters, "DEBUGFS_ROOT", tmp_path / "none")
    with npu.profiler.profile(driver=with_driver, device=with_device):
        on = {
            p.parent.name
            for p in (root / "events" / "npu").glob("*/enable")
            if p.read_text().strip() == "1"
        }
    assert ({"npu_fw_event", "npu_clock_sync"} <= on) == with_device
    assert ("npu_submit" in on) == with_driver


def test_an_unusable_tracefs_is_left_alone(
    device: npu.Device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = fake_tracefs(tmp_path / "tracing")
    (root / "trace_clock").unlink()  # reading it fails: OSError
    monkeypatch.setattr(tracefs, "TRACEFS_ROOTS", [root])
    monkeypatch.setattr(counters, "DEBUGFS_ROOT", tmp_path / "none")
    with npu.profiler.profile() as prof:
        device.alloc(4096).free()
    assert {e.cat for e in prof.events} == {"host"}
    assert (root / "events/npu/npu_submit/enable").read_text().strip() == "0"


def test_parse_perf_reads_time_queues_and_cores() -> None:
    snap = npu.profiler.parse_perf(perf(1, 2, 3, 4) + "bogus line\n")
    assert snap.time_ns == 4
    assert snap.queues[0] == {
        "cmds": 1,
        "busy_ns": 2,
        "macs": 10,
        "read_bytes": 4096,
        "write_bytes": 512,
        "walks": 3,
        "walk_hits": 2,
        "wait_ns": 0,
    }
    assert snap.cores == {0: {"busy_ns": 3}, 1: {"busy_ns": 0}}


def modelled_trace(compute_ns: int, memory_ns: int, fence: int) -> list[str]:
    """A command's fetch, start and end under a chip timing model."""
    arg = compute_ns | memory_ns << 32
    return [
        fw(1_000_000 + fence * 100, "fetch", fence=fence, arg32=int(npu.Opcode.GEMM)),
        fw(1_000_001 + fence * 100, "cmd_start", fence=fence),
        fw(1_000_090 + fence * 100, "cmd_end", fence=fence, arg=arg),
    ]


def test_a_timing_models_roofline_marks_each_command_compute_or_memory_bound() -> None:
    lines = [line(100.0, "npu_clock_sync", "dev_ns=1000000", task="kworker/0:1-45")]
    lines += modelled_trace(70, 20, 1) + modelled_trace(10, 80, 2)
    cmds = [e for e in device_events(parse_trace("\n".join(lines))) if e.name == "GEMM"]
    got = [(e.args["compute_ns"], e.args["memory_ns"], e.args["bound"]) for e in cmds]
    assert got == [(70, 20, "compute"), (10, 80, "memory")]


def test_the_table_gives_each_modelled_op_its_bound() -> None:
    lines = [line(100.0, "npu_clock_sync", "dev_ns=1000000", task="kworker/0:1-45")]
    lines += modelled_trace(70, 20, 1) + modelled_trace(10, 80, 2) + modelled_trace(50, 5, 3)
    rows = {r.key: r for r in key_averages(device_events(parse_trace("\n".join(lines))))}
    assert rows["GEMM"].bound == "mixed 2/1"
    table = key_averages(device_events(parse_trace("\n".join(lines)))).table()
    assert "Bound" in table.splitlines()[1] and "mixed 2/1" in table


def test_the_table_has_no_bound_column_without_a_timing_model() -> None:
    table = key_averages(device_events(parse_trace(DEVICE_TRACE))).table()
    assert "Bound" not in table


def test_stopping_reads_each_devices_fwtrace_so_the_driver_drains_its_ring(tmp_path: Path) -> None:
    for name in ("npu0", "npu1"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "fwtrace").write_text("on=1 records=16384 head=0 tail=0 dropped=0\n")
    (tmp_path / "other").mkdir()
    assert tracefs.drain_device_rings(tmp_path) == 2


def test_a_model_nodes_span_gets_the_roofline_of_its_commands() -> None:
    from npu.profiler.profile import build

    lines = [line(100.0, "npu_clock_sync", "dev_ns=1000000", task="kworker/0:1-45")]
    lines += modelled_trace(70, 20, 1) + modelled_trace(10, 80, 2) + modelled_trace(50, 5, 3)
    log_ = _spans.SpanLog()
    args = {"op_type": "Conv", "fences": (1, 2)}
    log_.device(_spans.DeviceSpan("conv1", "npu0", 0, 1, 1_000_001, 1_000_290, False, None, args))
    events, _ = build(log_, parse_trace("\n".join(lines)))
    node = next(e for e in events if e.name == "conv1")
    roofline = (node.args["compute_ns"], node.args["memory_ns"], node.args["bound"])
    assert roofline == (80, 100, "memory")
