"""``python3 -m npu.profiler TRACE.json [--png OUT.png] [--title T] [--sort KEY] [--rows N]``

Reads a trace that ``Profile.export_chrome_trace`` wrote, prints its
``key_averages()`` table and the counters, and with ``--png`` draws its
timeline (matplotlib needed: draw a guest's trace on the host).
"""

from __future__ import annotations

import argparse
import sys

from . import load


def main(argv: list[str] | None = None) -> int:
    """The command line; 0 on success, 1 when the trace cannot be read or drawn."""
    ap = argparse.ArgumentParser(prog="python3 -m npu.profiler", description=__doc__)
    ap.add_argument("trace", help="a Chrome trace JSON written by Profile.export_chrome_trace")
    ap.add_argument("--png", help="draw the timeline into this PNG (needs matplotlib)")
    ap.add_argument("--title", help="the picture's title")
    ap.add_argument("--sort", default="device_time_total", help="the table's sort_by key")
    ap.add_argument("--rows", type=int, default=30, help="table rows (0: all)")
    args = ap.parse_args(argv)
    try:
        prof = load(args.trace)
        sys.stdout.write(prof.key_averages().table(sort_by=args.sort, row_limit=args.rows))
        for name, c in sorted(prof.counters.items()):
            busy = {k: v.get("busy_ns", 0) for k, v in sorted(c.cores.items())}
            sys.stdout.write(
                f"{name}: {c.total('cmds')} commands, queues busy {c.total('busy_ns')} ns, "
                f"{c.total('macs')} MACs, {c.total('read_bytes')} B read, "
                f"{c.total('write_bytes')} B written; cores busy (ns) {busy}\n"
            )
        if args.png:
            prof.save_timeline_png(args.png, title=args.title)
    except (OSError, ValueError, RuntimeError) as exc:
        sys.stderr.write(f"npu.profiler: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
