"""``npu-smi top``: a live view of the devices and the processes using them.

Each frame shows every device's utilisation (with a bar), memory, power
state and hang count, and the processes sorted by their share of the
engine since the previous frame. On a terminal the screen is redrawn in
place (ANSI); otherwise frames follow one another, so that ``--once`` or
``--iterations N`` can be captured by a test or a log.
"""

from __future__ import annotations

import time
from typing import TextIO

from . import render
from .monitor import Monitor, Snapshot

CLEAR = "\x1b[H\x1b[2J"
BAR_WIDTH = 30


def bar(pct: float | None, width: int = BAR_WIDTH) -> str:
    """``[#####.....]`` for a percentage; blank for None."""
    if pct is None:
        return "[" + " " * width + "]"
    filled = round(width * max(0.0, min(100.0, pct)) / 100)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def frame(snap: Snapshot, delay_s: float) -> str:
    """One screen of ``top``."""
    lines = [f"npu-smi top  {render.timestamp()}  (every {delay_s:g} s; Ctrl-C quits)", ""]
    lines += render.device_lines(snap.devices)
    lines.append("")
    for d, util in snap.devices:
        lines.append(f"NPU {d.ref.index} {bar(util)} {render.percent(util):>4}")
    procs = sorted(
        snap.processes,
        key=lambda p: (-snap.engine_percent.get((p.pid, p.device), 0.0), -p.engine_ns, p.pid),
    )
    lines += ["", "Processes:"]
    lines += ["  " + ln for ln in render.process_lines(procs, snap.engine_percent)]
    return "\n".join(lines) + "\n"


def run(
    monitor: Monitor,
    out: TextIO,
    delay_s: float = 1.0,
    iterations: int | None = None,
    ansi: bool = True,
) -> int:
    """Draw frames every ``delay_s`` until ``iterations`` were drawn (None: until Ctrl-C)."""
    monitor.prime()
    time.sleep(min(delay_s, 0.1) if iterations == 1 else delay_s)
    shown = 0
    try:
        while True:
            text = frame(monitor.refresh(), delay_s)
            out.write((CLEAR + text) if ansi else (text + "\n"))
            out.flush()
            shown += 1
            if iterations is not None and shown >= iterations:
                return 0
            time.sleep(delay_s)
    except KeyboardInterrupt:
        return 0
