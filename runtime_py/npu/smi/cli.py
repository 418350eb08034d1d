"""The ``npu-smi`` command line (``python3 -m npu.smi``).

::

    npu-smi [-i N] [-l SECONDS [-c COUNT]] [--json]     devices and processes
    npu-smi top [-i N] [-d SECONDS] [--once | --iterations N]
    npu-smi diag [-i N] [--json] [--interval S] [--log-lines N]

Exit status: 0 fine (``diag``: idle, running or waiting), 1 ``diag`` found
a stuck job (host, firmware, engine or interrupt), 2 an error (no device,
a file that cannot be read: the message names it and the errno).
``--root DIR`` (or ``NPU_SMI_ROOT``) reads ``DIR/sys``, ``DIR/proc`` and
``DIR/sys/kernel/debug`` instead of the real ones (tests). See docs/npu-smi.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from . import diag, render, top
from .fs import Roots, SmiError
from .monitor import Monitor
from .sysfs import require_devices, select_device

PROG = "npu-smi"
EXIT_OK, EXIT_STUCK, EXIT_ERROR = 0, 1, 2
#: The first and second samples of a single-shot run are this far apart.
SAMPLE_S = 0.1


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--id", type=int, metavar="N", dest="index",
                   help="only the device N (/dev/npuN)")  # fmt: skip
    p.add_argument(
        "--root",
        metavar="DIR",
        default=os.environ.get("NPU_SMI_ROOT"),
        help="read DIR/sys, DIR/proc, DIR/sys/kernel/debug (a fake tree; tests)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log what is read")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    main = argparse.ArgumentParser(
        prog=PROG,
        description="Show the NPUs, the processes using them, and where a stuck job is. "
        "Subcommands: top (live view), diag (hang triage).",
    )
    _common(main)
    main.add_argument("-l", "--loop", type=float, metavar="SECONDS",
                      help="refresh every SECONDS until interrupted")  # fmt: skip
    main.add_argument("-c", "--count", type=int, metavar="N", help="with -l: stop after N")
    main.add_argument("--json", action="store_true", help="machine output (docs/npu-smi.md)")

    t = argparse.ArgumentParser(prog=f"{PROG} top", description="A live view of the NPUs.")
    _common(t)
    t.add_argument("-d", "--delay", type=float, default=1.0, metavar="SECONDS",
                   help="time between frames (default 1)")  # fmt: skip
    g = t.add_mutually_exclusive_group()
    g.add_argument("--once", action="store_true", help="draw one frame and exit")
    g.add_argument("--iterations", type=int, metavar="N", help="draw N frames and exit")

    d = argparse.ArgumentParser(
        prog=f"{PROG} diag",
        description="Say on which side a stuck job is: never submitted by the host, not "
        "taken by the firmware, not finished by the engine, or its interrupt not handled. "
        "Needs root (debugfs).",
    )
    _common(d)
    d.add_argument("--json", action="store_true", help="machine output (docs/npu-smi.md)")
    d.add_argument("--interval", type=float, default=0.2, metavar="S",
                   help="time between the two reads of the queues (default 0.2)")  # fmt: skip
    d.add_argument("--log-lines", type=int, default=10, metavar="N",
                   help="firmware log lines to show (default 10)")  # fmt: skip
    return {"": main, "top": t, "diag": d}


def _roots(args: argparse.Namespace) -> Roots:
    return Roots() if not args.root else Roots.under(args.root)


def _status(args: argparse.Namespace, out: TextIO) -> int:
    monitor = Monitor(_roots(args), args.index)
    monitor.prime()
    time.sleep(SAMPLE_S if args.loop is None else args.loop)
    shown = 0
    try:
        while True:
            snap = monitor.refresh()
            if args.json:
                doc = render.status_json(snap.devices, snap.processes)
                out.write(json.dumps(doc, indent=None if args.loop else 2, sort_keys=True))
                out.write("\n")
            else:
                if args.loop is not None and shown:
                    out.write("\n")
                out.write(render.status_text(snap.devices, snap.processes))
            out.flush()
            shown += 1
            if args.loop is None or (args.count is not None and shown >= args.count):
                return EXIT_OK
            time.sleep(args.loop)
    except KeyboardInterrupt:
        return EXIT_OK


def _top(args: argparse.Namespace, out: TextIO) -> int:
    iterations = 1 if args.once else args.iterations
    ansi = out.isatty() and os.environ.get("TERM", "dumb") != "dumb"
    return top.run(Monitor(_roots(args), args.index), out, args.delay, iterations, ansi)


def _diag(args: argparse.Namespace, out: TextIO) -> int:
    roots = _roots(args)
    refs = select_device(require_devices(roots), args.index)
    results = [diag.run(roots, ref, args.interval, args.log_lines) for ref in refs]
    if args.json:
        out.write(json.dumps(render.diag_json(results), indent=2, sort_keys=True) + "\n")
    else:
        out.write("\n".join(render.diagnosis_text(r) for r in results))
    return EXIT_STUCK if any(r.stuck for r in results) else EXIT_OK


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``npu-smi`` with ``argv`` (default: ``sys.argv[1:]``); the exit status."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    command = args_in[0] if args_in and args_in[0] in ("top", "diag") else ""
    parser = _parsers()[command]
    args = parser.parse_args(args_in[1:] if command else args_in)
    if args.verbose:
        logging.basicConfig(level=logging.DEBUG, format=f"{PROG}: %(name)s: %(message)s")
    stream = sys.stdout if out is None else out
    try:
        if command == "top":
            return _top(args, stream)
        if command == "diag":
            return _diag(args, stream)
        return _status(args, stream)
    except SmiError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        return EXIT_OK
