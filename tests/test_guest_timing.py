"""The chip timing model seen from a guest (docs/npu-spec.md 12.2).

A guest of its own, its device started with ``timing=edge``: the driver
names the mode in sysfs, and the runtime's completion records give each
command exactly the duration the chip description's roofline gives
(``npu.chips``, the spec's arithmetic in Python), whether the host was
faster than the chip (the device waits) or slower (the device clock skips
the difference).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.guest

ROOT = Path(__file__).resolve().parent.parent

# Run in the guest: one op on the device, its device time and its roofline.
OP_TIMES = r"""
import json, time
import numpy as np, npu
from npu import ops
from npu.chips import CHIPS
chip = CHIPS["edge"]
out = {}
with npu.open_device(0) as dev:
    m = n = k = 512
    a, b, c = dev.alloc(m * k * 4), dev.alloc(k * n * 4), dev.alloc(m * n * 4)
    f = dev.submit([ops.gemm(a, b, c, m, n, k)])
    dev.wait(f, timeout_s=120)
    i = dev.fence_info(f)
    want = chip.roofline(m * n * k, (m * k + k * n + m * n) * 4).duration_ns
    out["gemm"] = [i.t_end_ns - i.t_start_ns, want]
    size = 64 << 20
    src, dst = dev.alloc(size), dev.alloc(size)
    t0 = time.monotonic()
    f = dev.submit([ops.copy(src, dst, size)])
    dev.wait(f, timeout_s=120)
    wall = time.monotonic() - t0
    i = dev.fence_info(f)
    out["copy"] = [i.t_end_ns - i.t_start_ns, chip.roofline(0, 2 * size).duration_ns, wall * 1e9]
    fences = [dev.submit([ops.nop()] * 8)]
    dev.wait(fences[-1], timeout_s=60)
    infos = [dev.fence_info(x) for x in range(fences[0] - 7, fences[0] + 1)]
    out["nops"] = [[x.t_start_ns, x.t_end_ns] for x in infos]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def edge(guest_module: Any) -> Iterator[Any]:
    """A guest whose device runs the edge chip's timing model, driver loaded."""
    gm = guest_module
    old = os.environ.get("NPU_DEVICES")
    os.environ["NPU_DEVICES"] = "-device npu,timing=edge"
    g = gm.Guest(log_path=ROOT / "build" / "guest-console-timing.log")
    try:
        g.start()
    finally:
        if old is None:
            os.environ.pop("NPU_DEVICES", None)
        else:
            os.environ["NPU_DEVICES"] = old
    try:
        g.load_module()
        mark = g.dmesg_mark()
        yield g
        bad = gm.bad_dmesg_lines(g.new_dmesg(mark))
        assert not bad, "\n".join(bad)
    finally:
        g.close()


@pytest.fixture(scope="module")
def op_times(edge: Any) -> dict[str, Any]:
    (ROOT / "build").mkdir(exist_ok=True)
    script = ROOT / "build" / "timing_op_times.py"
    script.write_text(OP_TIMES)
    rc, out = edge.run(f"python3 {script.relative_to(ROOT)}", timeout=600)
    assert rc == 0, out
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def test_sysfs_names_the_devices_timing_model(edge: Any) -> None:
    rc, out = edge.run("cat /sys/class/accel/accel0/device/npu/timing", timeout=30)
    assert (rc, out.strip()) == (0, "edge")


def test_a_gemm_takes_exactly_its_roofline_time(op_times: dict[str, Any]) -> None:
    got, want = op_times["gemm"]
    assert got == want


def test_a_copy_takes_its_roofline_time_and_completes_no_sooner(op_times: dict[str, Any]) -> None:
    got, want, wall_ns = op_times["copy"]
    assert got == want
    assert wall_ns >= want, "the device completed before the chip would have"


def test_back_to_back_commands_never_overlap_on_the_device_clock(op_times: dict[str, Any]) -> None:
    spans = op_times["nops"]
    assert all(end - start == 2000 for start, end in spans), "each NOP: the edge chip's overhead"
    assert all(nxt[0] >= prev[1] for prev, nxt in itertools.pairwise(spans))
