#!/usr/bin/env python3
"""Coverage-guided fuzzing of the NPU device model (docs/fuzzing.md).

    run_fuzz.py --time 600 [--runs N]      fuzz (make fuzz-device)
    run_fuzz.py --reproduce build/fuzz/crashes/crash-XXXX [-o FILE.qtest]
    run_fuzz.py --minimize build/fuzz/crashes/crash-XXXX
    run_fuzz.py --replay tests/fuzz/regressions/NAME.qtest   (or NAME.fuzz)
    run_fuzz.py --regressions                                  every one of them

Fuzzing runs QEMU's libFuzzer binary (scripts/build-qemu-fuzz.sh: clang,
ASan and UBSan) on the generic-fuzz target with the npu configuration
(``generic-fuzz-npu``: ``-machine q35 -device npu,boot-rom=on``, the npu's
MMIO regions and config space fuzzed, guest RAM filled through DMA
patterns), starting from the seed corpus in tests/fuzz/corpus/. New
inputs go to build/fuzz/corpus/, findings to build/fuzz/crashes/: crashes
and sanitizer reports (crash-*), inputs that run longer than --timeout
(timeout-*, a hang) and inputs over --rss-limit-mb (oom-*). The liveness
oracle of the patched fuzzer makes a crash-* of an input after which the
system reset takes longer than --reset-limit-ms (50) or during which an
engine thread (--engine-threads, npu-*) asks for the BQL. By default
libFuzzer runs in fork mode and keeps going after a finding; --stop-on-first
stops at the first. After the run each new finding is replayed once to keep
its report (FINDING.log) and a summary goes to build/fuzz/findings.json.
The exit status is non-zero if anything was found.

--reproduce turns an input into a qtest command sequence (the fuzzer's
QTEST_LOG trace, with each DMA fill moved before the command that caused
it, and a system reset at the end: the fuzzer resets after every input);
--replay runs such a sequence against the ASan build of qemu-system-x86_64
(make qemu-asan) and exits non-zero if QEMU hangs, dies or reports; given a
.fuzz file (a generic-fuzz input), it runs the fuzzer on it instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NPU_CACHE = Path(os.environ.get("NPU_CACHE") or Path.home() / ".cache" / "npu-stack")
FUZZER = Path(os.environ.get("NPU_FUZZ_BINARY") or NPU_CACHE / "bin" / "qemu-fuzz-x86_64")
SEEDS = REPO / "tests" / "fuzz" / "corpus"
REGRESSIONS = REPO / "tests" / "fuzz" / "regressions"
DICT = REPO / "tests" / "fuzz" / "npu.dict"
OUT = REPO / "build" / "fuzz"
TARGET = "generic-fuzz-npu"
# What the generic-fuzz-npu configuration runs (tests/qtest/fuzz/
# generic_fuzz_configs.h in the patched tree, plus generic_fuzz.c's own
# -m 512M): the same machine for --replay.
MACHINE_ARGS = ["-machine", "q35", "-m", "512M", "-device", "npu,boot-rom=on,mem-size=64M"]

SANITIZER_ENV = {
    # QEMU does not free everything by design: no leak checking (as for the
    # qtests). Reports abort so that libFuzzer keeps the input.
    "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=1:symbolize=1:"
    "allocator_may_return_null=1:handle_abrt=1",
    "UBSAN_OPTIONS": "halt_on_error=1:abort_on_error=1:print_stacktrace=1:symbolize=1",
}
FINDING_RE = re.compile(
    r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|"
    r"ERROR: libFuzzer: (?:timeout|out-of-memory|deadly signal|fuzz target exited)|"
    r"ALARM: working on the last Unit|==\d+== ERROR: libFuzzer|ERROR: liveness:"
)
# the fuzzer's reset statistics at exit (the liveness oracle)
LIVENESS_RE = re.compile(r"^liveness: \d+ resets, .*$", re.M)
# '#1234  NEW    cov: 2345 ft: 5678 corp: 45/12Kb lim: 4096 exec/s: 123 rss: 456Mb'
PROGRESS_RE = re.compile(
    r"^#(\d+)\s*:?\s+(\w+)?\s*cov: (\d+) ft: (\d+) corp: (\d+)\S*.*?exec/s:? (\d+)"
)
# fork mode: '#1234: cov: 2345 ft: 5678 corp: 45 exec/s 123 oom/timeout/crash: 0/1/0 time: 60s'
FORK_FINDINGS_RE = re.compile(r"oom/timeout/crash: (\d+)/(\d+)/(\d+)")
STAT_RE = re.compile(r"^stat::(\w+):\s+(\d+)")
# -print_coverage=1: 'COVERED_FUNC: hits: 34 edges: 1/1 npu_now_ns /path/hw/misc/npu/npu.c:28'
FUNC_RE = re.compile(r"^(?:UN)?COVERED_FUNC: hits: \d+ edges: (\d+)/(\d+) (\S+) (\S+):\d+")


@dataclass
class Stats:
    execs: int = 0
    exec_per_s: int = 0
    cov: int = 0
    ft: int = 0
    corpus: int = 0
    ooms: int = 0
    timeouts: int = 0
    crashes: int = 0
    seconds: float = 0.0
    reports: list[str] = field(default_factory=list)


@dataclass
class Finding:
    artifact: str
    kind: str  # crash, timeout, oom, leak, ...
    summary: str
    signature: str
    log: str
    reproduced: str = ""  # replays that reproduced it, e.g. "1/3"


def fail(msg: str) -> int:
    print(f"run_fuzz: {msg}", file=sys.stderr)
    return 2


def fuzzer_env(args: argparse.Namespace, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        **os.environ, **SANITIZER_ENV,
        "QEMU_FUZZ_SETTLE_US": str(args.settle_us),
        "QEMU_FUZZ_RESET_LIMIT_MS": str(args.reset_limit_ms),
        "QEMU_FUZZ_ENGINE_THREADS": args.engine_threads,
        "QEMU_FUZZ_RESET_RAW": "1" if args.reset_raw else "0",
    }  # fmt: skip
    symbolizer = shutil.which("llvm-symbolizer-14") or shutil.which("llvm-symbolizer")
    if symbolizer:
        env["ASAN_SYMBOLIZER_PATH"] = symbolizer
    env.update(extra or {})
    return env


def fuzzer_cmd(args: argparse.Namespace, *libfuzzer: str) -> list[str]:
    return [
        str(args.binary), f"--fuzz-target={TARGET}",
        f"-timeout={args.timeout}", f"-rss_limit_mb={args.rss_limit_mb}",
        f"-malloc_limit_mb={args.rss_limit_mb}", "-detect_leaks=0",
        *libfuzzer,
    ]  # fmt: skip


def parse_line(line: str, st: Stats) -> None:
    m = PROGRESS_RE.match(line)
    if m:
        st.execs, st.cov, st.ft = int(m[1]), int(m[3]), int(m[4])
        st.corpus, st.exec_per_s = int(m[5]), int(m[6])
    m = FORK_FINDINGS_RE.search(line)
    if m:
        st.ooms, st.timeouts, st.crashes = int(m[1]), int(m[2]), int(m[3])
    m = STAT_RE.match(line)
    if m and m[1] == "number_of_executed_units":
        st.execs = max(st.execs, int(m[2]))
    if m and m[1] == "average_exec_per_sec":
        st.exec_per_s = int(m[2])
    if FINDING_RE.search(line):
        st.reports.append(line.strip())


# -- findings ------------------------------------------------------------------


def classify(log: str, artifact: Path) -> tuple[str, str, str]:
    """(kind, one-line summary, signature) of a finding's replay log."""
    kind = artifact.name.split("-", 1)[0]
    summary = ""
    for pat in (
        r"ERROR: liveness: .*",
        r"SUMMARY: \w+Sanitizer: .*",
        r"^.*runtime error: .*$",
        r"ERROR: libFuzzer: .*",
        r"ALARM: working on the last Unit for \d+ seconds",
    ):
        m = re.search(pat, log, re.M)
        if m:
            summary = m[0].strip()
            break
    if "liveness:" in summary:
        kind = "liveness"
    elif "runtime error:" in summary:
        kind = "ubsan"
    elif "AddressSanitizer" in summary:
        kind = "asan"
    # The first frames in the device (else in QEMU) name the finding.
    frames = re.findall(r"^\s+#\d+ 0x[0-9a-f]+ in (\S+) (\S+)", log, re.M)
    dev = [f"{fn} {loc.rsplit('/', 1)[-1]}" for fn, loc in frames if "/npu/" in loc]
    top = dev[:3] or [f"{fn}" for fn, _ in frames[:3]]
    signature = f"{kind}: " + " < ".join(top) if top else f"{kind}: {summary}"
    return kind, summary, signature


def replay_artifact(args: argparse.Namespace, artifact: Path) -> str:
    """Run the fuzzer on one input; its output (the stack of a crash)."""
    cmd = fuzzer_cmd(args, "-runs=1", str(artifact))
    try:
        p = subprocess.run(
            cmd, env=fuzzer_env(args), capture_output=True, text=True,
            errors="replace", timeout=args.timeout * 3 + 60,
        )  # fmt: skip
        return p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        text = out.decode(errors="replace") if isinstance(out, bytes) else out
        return text + "\nrun_fuzz: the replay did not finish (a hang)\n"


def hang_stacks(args: argparse.Namespace, artifact: Path, wait: float = 15.0) -> str:
    """Every thread's stack while the fuzzer hangs on one input (gdb), or ''.

    libFuzzer's timeout report shows the main thread only; a deadlock
    needs the device threads too.
    """
    gdb = shutil.which("gdb")
    if not gdb:
        return ""
    cmd = [str(args.binary), f"--fuzz-target={TARGET}", "-timeout=0", "-runs=1", str(artifact)]
    proc = subprocess.Popen(
        cmd, env=fuzzer_env(args), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        proc.wait(wait)
        return ""  # it finished: not a hang without libFuzzer's timer
    except subprocess.TimeoutExpired:
        pass
    try:
        out = subprocess.run(
            [gdb, "-p", str(proc.pid), "-batch", "-ex", "thread apply all bt 40"],
            capture_output=True, text=True, errors="replace", timeout=120,
        ).stdout  # fmt: skip
    except subprocess.TimeoutExpired:
        out = ""
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    keep = [ln for ln in out.splitlines() if ln.startswith(("Thread ", "#"))]
    return f"\n== all threads after {wait:.0f} s on this input (gdb) ==\n" + "\n".join(keep) + "\n"


REPLAYS = 3
FUZZ_LOG = "fuzz.log"  # the fuzzing run's output, in the crashes' parent directory


def collect_findings(args: argparse.Namespace, before: set[str]) -> list[Finding]:
    found = []
    for artifact in sorted(args.crashes.iterdir()):
        if artifact.name in before or artifact.suffix == ".log" or not artifact.is_file():
            continue
        # A finding may depend on timing (the device runs on threads of its
        # own): replay it up to REPLAYS times, keep the first report.
        tries, hits, log = 0, 0, ""
        while tries < REPLAYS and not hits:
            tries += 1
            out = replay_artifact(args, artifact)
            if FINDING_RE.search(out) or "did not finish" in out:
                hits, log = 1, out
            elif not log:
                log = out
        if artifact.name.startswith("timeout-"):
            log += hang_stacks(args, artifact)
        log_path = artifact.with_name(artifact.name + ".log")
        log_path.write_text(log)
        kind, summary, signature = classify(log, artifact)
        if not hits:
            summary = summary or f"did not reproduce in {tries} replays (see {FUZZ_LOG})"
        found.append(
            Finding(str(artifact), kind, summary, signature, str(log_path), f"{hits}/{tries}")
        )
    return found


def device_coverage(
    args: argparse.Namespace, dirs: Sequence[Path]
) -> tuple[dict[str, list[int]], str]:
    """Edges of hw/misc/npu/ the corpus covers, per file: {file: [covered, total]}.

    Also the fuzzer's reset statistics over the corpus (one reset per input).
    """
    cmd = fuzzer_cmd(args, "-runs=0", "-print_coverage=1", *map(str, dirs))
    try:
        out = subprocess.run(
            cmd, env=fuzzer_env(args), capture_output=True, text=True,
            errors="replace", timeout=1800,
        ).stderr  # fmt: skip
    except subprocess.TimeoutExpired:
        return {}, ""
    m = LIVENESS_RE.search(out)
    liveness = m[0] if m else ""
    files: dict[str, list[int]] = {}
    for line in out.splitlines():
        m = FUNC_RE.match(line)
        if m and "/hw/misc/npu/" in m[4]:
            acc = files.setdefault(m[4].rsplit("/", 1)[-1], [0, 0])
            acc[0] += int(m[1])
            acc[1] += int(m[2])
    if files:
        files["total"] = [sum(v[0] for v in files.values()), sum(v[1] for v in files.values())]
    return files, liveness


# -- fuzzing -------------------------------------------------------------------


def fuzz(args: argparse.Namespace) -> int:
    if not os.access(args.binary, os.X_OK):
        return fail(f"no fuzzer at {args.binary} (make fuzz-build)")
    corpus: Path = args.corpus
    corpus.mkdir(parents=True, exist_ok=True)
    args.crashes.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in args.crashes.iterdir()}
    opts = [
        f"-max_total_time={args.time}", f"-artifact_prefix={args.crashes}/",
        f"-max_len={args.max_len}", "-use_value_profile=1", "-print_final_stats=1",
        "-reload=0",
    ]  # fmt: skip
    if args.runs is not None:
        opts.append(f"-runs={args.runs}")
    if DICT.is_file():
        opts.append(f"-dict={DICT}")
    if not args.stop_on_first:
        opts += [f"-fork={args.jobs}", "-ignore_crashes=1", "-ignore_timeouts=1", "-ignore_ooms=1"]
    cmd = fuzzer_cmd(args, *opts, str(corpus), str(SEEDS))
    print("run_fuzz:", " ".join(cmd), flush=True)
    log_path = args.crashes.parent / FUZZ_LOG
    st = Stats()
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, env=fuzzer_env(args), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", cwd=args.crashes.parent,
            start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None
        # A backstop: libFuzzer stops by itself after --time (and reports a
        # hung input after --timeout); if it does not, stop it.
        overran = threading.Event()

        def stop() -> None:
            overran.set()
            os.killpg(proc.pid, signal.SIGKILL)

        watchdog = threading.Timer(args.time + max(120, args.timeout * 6), stop)
        watchdog.start()
        try:
            for line in proc.stdout:
                log.write(line)
                parse_line(line, st)
                if not args.quiet and (
                    line.startswith(("#", "INFO: ", "==", "SUMMARY", "ALARM", "stat::"))
                    or FINDING_RE.search(line)
                ):
                    print(line, end="", flush=True)
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait()
        watchdog.cancel()
        if overran.is_set():
            msg = "run_fuzz: libFuzzer overran its time and was killed (a hang it did not catch)"
            print(msg, flush=True)
            st.reports.append(msg)
    st.seconds = round(time.monotonic() - t0, 1)
    findings = collect_findings(args, before)
    coverage, liveness = ({}, "") if args.no_coverage else device_coverage(args, [corpus, SEEDS])
    report(args, st, findings, rc, coverage, liveness)
    if findings or st.reports or rc != 0 or st.crashes + st.timeouts + st.ooms:
        return 1
    return 0


def report(
    args: argparse.Namespace,
    st: Stats,
    findings: list[Finding],
    rc: int,
    coverage: dict[str, list[int]],
    liveness: str = "",
) -> None:
    distinct: dict[str, list[Finding]] = {}
    for f in findings:
        distinct.setdefault(f.signature, []).append(f)
    summary = {
        "target": TARGET,
        "seconds": st.seconds,
        "executions": st.execs,
        "exec_per_s": round(st.execs / st.seconds) if st.seconds else 0,
        "libfuzzer_exec_per_s": st.exec_per_s,
        "coverage": {"cov": st.cov, "ft": st.ft, "corpus": st.corpus},
        "device_edges": coverage,
        "reset_limit_ms": args.reset_limit_ms,
        "corpus_resets": liveness,
        "libfuzzer_exit": rc,
        "findings": [asdict(f) for f in findings],
        "distinct": sorted(distinct),
    }
    (args.crashes.parent / "findings.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"run_fuzz: {st.execs} executions in {st.seconds:.0f} s"
        f" ({summary['exec_per_s']}/s overall, libFuzzer's last exec/s: {st.exec_per_s});"
        f" coverage cov: {st.cov} ft: {st.ft}, corpus {st.corpus} inputs"
    )
    if coverage:
        c, n = coverage["total"]
        per_file = ", ".join(
            f"{f} {v[0]}/{v[1]}" for f, v in sorted(coverage.items()) if f != "total"
        )
        print(
            f"run_fuzz: device edges covered by the corpus: {c}/{n}"
            f" ({100 * c / n:.0f}%): {per_file}"
        )
    if liveness:
        print(f"run_fuzz: the corpus replayed once: {liveness}")
    if not findings:
        print("run_fuzz: no crash, hang, liveness finding, sanitizer report or OOM")
        return
    print(f"run_fuzz: {len(findings)} findings, {len(distinct)} distinct:")
    for sig, fs in sorted(distinct.items()):
        print(
            f"  {sig}  x{len(fs)}\n    {fs[0].summary}\n    e.g. {fs[0].artifact}"
            f" (reproduced in {fs[0].reproduced} replays)"
        )


# -- reproducers ------------------------------------------------------------------


def qtest_trace(args: argparse.Namespace, artifact: Path) -> tuple[list[str], str]:
    """The qtest commands the fuzzer issues for one input, DMA fills reordered."""
    env = fuzzer_env(args, {"QTEST_LOG": "1", "FUZZ_SERIALIZE_QTEST": "1"})
    cmd = fuzzer_cmd(args, "-runs=1", str(artifact))
    try:
        p = subprocess.run(
            cmd, env=env, capture_output=True, text=True, errors="replace",
            timeout=args.timeout * 3 + 60,
        )  # fmt: skip
        out = p.stderr
    except subprocess.TimeoutExpired as e:
        err = e.stderr or b""
        out = err.decode(errors="replace") if isinstance(err, bytes) else err
    lines: list[str] = []
    for raw in out.splitlines():
        if "[R +" not in raw:
            continue
        command = raw.split("]")[-1].strip()
        if "[DMA]" in raw:
            # The fill precedes the last MMIO/PIO command (the one that
            # made the device read): move it before that command, after
            # the fills already moved there.
            i = len(lines)
            while i > 0 and lines[i - 1].startswith("#dma "):
                i -= 1
            lines.insert(max(i - 1, 0), "#dma " + command)
        else:
            lines.append(command)
    commands = [c.removeprefix("#dma ") for c in lines]
    return commands, out


def reproduce(args: argparse.Namespace) -> int:
    artifact: Path = args.reproduce
    commands, log = qtest_trace(args, artifact)
    if not commands:
        print(log[-4000:], file=sys.stderr)
        return fail("the fuzzer logged no qtest command")
    # generic-fuzz resets the machine after every input (fuzz_reset); the
    # reset control register does the same, then QEMU must answer.
    commands += ["outb 0xcf9 0x6", "outl 0xcf8 0x80000000", "inl 0xcfc"]
    digest = hashlib.sha1(artifact.read_bytes()).hexdigest()[:12]
    text = (
        f"# generic-fuzz-npu input {artifact.name} (sha1 {digest}), as qtest commands:\n"
        f"# qemu-system-x86_64 -accel qtest -qtest stdio -display none -nodefaults"
        f" {' '.join(MACHINE_ARGS)} < THIS_FILE\n"
        "# (tests/fuzz/run_fuzz.py --replay THIS_FILE; it skips lines starting with #)\n"
        + "\n".join(commands)
        + "\n"
    )
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        print(f"run_fuzz: {len(commands)} commands in {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def minimize(args: argparse.Namespace) -> int:
    artifact: Path = args.minimize
    out = args.output or artifact.with_name("min-" + artifact.name)
    # A hang minimises too: under -timeout it is a crash to libFuzzer.
    opts = [
        "-minimize_crash=1", f"-max_total_time={args.time}", f"-exact_artifact_path={out}",
        str(artifact),
    ]  # fmt: skip
    p = subprocess.run(fuzzer_cmd(args, *opts), env=fuzzer_env(args), check=False)
    if out.is_file():
        print(f"run_fuzz: minimised {artifact.stat().st_size} -> {out.stat().st_size} bytes: {out}")
        return 0
    return p.returncode or 1


def replay_input(args: argparse.Namespace, path: Path) -> int:
    """Run the fuzzer on one generic-fuzz input (a .fuzz regression)."""
    if not os.access(args.binary, os.X_OK):
        return fail(f"no fuzzer at {args.binary} (make fuzz-build)")
    t0 = time.monotonic()
    log = replay_artifact(args, path)
    reports = [ln.strip() for ln in log.splitlines() if FINDING_RE.search(ln)]
    if reports or "did not finish" in log:
        print(log[-6000:])
        print(f"run_fuzz: REPRODUCED ({time.monotonic() - t0:.1f} s): {(reports or ['hang'])[0]}")
        return 1
    print(f"run_fuzz: {path.name} ran clean ({time.monotonic() - t0:.1f} s)")
    return 0


def replay(args: argparse.Namespace) -> int:
    if args.replay.suffix == ".fuzz":
        return replay_input(args, args.replay)
    if args.qemu:
        os.environ["NPU_QTEST_QEMU"] = str(args.qemu)
    sys.path.insert(0, str(REPO / "tests" / "host"))
    import qtest  # the qtest wire protocol and the ASan QEMU's settings

    path: Path = args.replay
    commands = [c for c in path.read_text().splitlines() if c.strip() and not c.startswith("#")]
    log_dir = OUT / "replay"
    log_dir.mkdir(parents=True, exist_ok=True)
    qt = qtest.QTest(MACHINE_ARGS, log_dir / f"{path.stem}.log", timeout=args.timeout)
    t0 = time.monotonic()
    failed = ""
    try:
        for i, c in enumerate(commands):
            try:
                answer = qt.command(c)
                if args.verbose:
                    print(f"{c[:100]} -> OK {answer}".rstrip())
            except qtest.QTestRefused as e:
                print(f"run_fuzz: command {i + 1} refused: {e}")
            if args.delay_ms:
                time.sleep(args.delay_ms / 1000)
    except qtest.QTestError as e:
        failed = f"QEMU stopped answering at command {i + 1} ({c!r}): {e}"
    try:
        qt.close()
    except qtest.SanitizerReport as e:
        failed = failed or "sanitizer report"
        print(e)
    took = time.monotonic() - t0
    if failed:
        print(f"run_fuzz: REPRODUCED ({took:.1f} s): {failed}")
        return 1
    print(f"run_fuzz: {len(commands)} commands ran, QEMU answered throughout ({took:.1f} s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--time", type=int, default=600, help="seconds of fuzzing (default 600)")
    ap.add_argument("--runs", type=int, help="stop after this many executions")
    ap.add_argument("--jobs", type=int, default=1, help="fuzzing processes (fork mode)")
    ap.add_argument("--stop-on-first", action="store_true", help="stop at the first finding")
    ap.add_argument("--timeout", type=int, default=10, help="seconds per input before a hang")
    ap.add_argument("--rss-limit-mb", type=int, default=2048, help="memory per process: OOM")
    ap.add_argument("--max-len", type=int, default=4096, help="bytes per input")
    ap.add_argument(
        "--settle-us", type=int, default=50,
        help="us the device gets after each write (QEMU_FUZZ_SETTLE_US)",
    )  # fmt: skip
    ap.add_argument(
        "--reset-limit-ms", type=int, default=50,
        help="liveness: ms the reset after each input may take (QEMU_FUZZ_RESET_LIMIT_MS, 0: off)",
    )  # fmt: skip
    ap.add_argument(
        "--reset-raw", action="store_true",
        help="liveness: count the reset's host time in full, its threads' waits for a CPU too",
    )  # fmt: skip
    ap.add_argument(
        "--engine-threads", default="npu-",
        help="liveness: threads named PREFIX* may not ask for the BQL"
        " (QEMU_FUZZ_ENGINE_THREADS, '': off)",
    )  # fmt: skip
    ap.add_argument("--binary", type=Path, default=FUZZER)
    ap.add_argument("--corpus", type=Path, default=OUT / "corpus", help="working corpus")
    ap.add_argument("--crashes", type=Path, default=OUT / "crashes")
    ap.add_argument("-q", "--quiet", action="store_true")
    ap.add_argument("--no-coverage", action="store_true", help="skip the device coverage report")
    ap.add_argument("-v", "--verbose", action="store_true", help="--replay: print the answers")
    ap.add_argument("--reproduce", type=Path, metavar="INPUT", help="input -> qtest commands")
    ap.add_argument("--minimize", type=Path, metavar="INPUT", help="minimise a finding")
    ap.add_argument(
        "--replay", type=Path, metavar="FILE",
        help="run a .qtest on the ASan QEMU (a .fuzz input: on the fuzzer)",
    )  # fmt: skip
    ap.add_argument("--regressions", action="store_true", help="--replay each regression")
    ap.add_argument("--delay-ms", type=float, default=0, help="--replay: pause per command")
    ap.add_argument(
        "--qemu", type=Path,
        help="--replay: the QEMU to run (default: qemu-system-x86_64-asan, make qemu-asan)",
    )  # fmt: skip
    ap.add_argument("-o", "--output", type=Path, help="--reproduce/--minimize: output file")
    args = ap.parse_args(argv)
    args.crashes = args.crashes.resolve()
    if args.regressions:
        failed = []
        for path in sorted(REGRESSIONS.glob("*.*")):
            args.replay = path
            if replay(args):
                failed.append(path.name)
        print(f"run_fuzz: {len(failed)} regressions reproduce: {' '.join(failed)}".rstrip(": "))
        return 1 if failed else 0
    if args.replay:
        return replay(args)
    if args.reproduce:
        return reproduce(args)
    if args.minimize:
        return minimize(args)
    return fuzz(args)


if __name__ == "__main__":
    sys.exit(main())
