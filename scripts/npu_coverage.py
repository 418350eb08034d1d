#!/usr/bin/env python3
"""npu.ko's line coverage from the debug kernel's gcov data.

The debug kernel has CONFIG_GCOV_KERNEL and scripts/build-module.sh builds
npu.ko for it with GCOV_PROFILE=y, so the guest's debugfs holds the
module's counters (/sys/kernel/debug/gcov/.../npu_*.gcda; kept across
unloads by gcov_persist). ``collect_cmd()`` is the guest command that
copies them under build/; ``line_coverage()`` runs gcov (gcc-14's, in the
guest root tree that compiled the module, scripts/common.sh: guest_chroot)
over them and the module's .gcno files, and sums the lines of npu_*.c.

    scripts/npu_coverage.py GCDA_DIR KVER      print the figures as JSON
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUEST_ROOT = "/mnt/npu"  # the project tree in the guest (scripts/guest.py)
CHROOT_ROOT = "/src"  # the project tree in the build chroot (scripts/common.sh)

_FILE_RE = re.compile(r"^File '(?P<path>[^']+)'$")
_LINES_RE = re.compile(r"^Lines executed:(?P<pct>[\d.]+)% of (?P<n>\d+)$")


@dataclass
class Coverage:
    """Executed and executable lines of npu.ko's C files."""

    executed: int = 0
    lines: int = 0
    files: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (executed, lines)

    @property
    def percent(self) -> float:
        return 100.0 * self.executed / self.lines if self.lines else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "lines_executed": self.executed,
            "lines": self.lines,
            "percent": round(self.percent, 2),
            "files": {k: {"executed": e, "lines": n} for k, (e, n) in sorted(self.files.items())},
        }


def collect_cmd(dest: str) -> str:
    """The guest shell command that copies npu.ko's .gcda files from debugfs
    to ``dest`` (a path under the project tree, relative to its root)."""
    return (
        f"rm -rf {GUEST_ROOT}/{dest} && mkdir -p {GUEST_ROOT}/{dest} && "
        "find /sys/kernel/debug/gcov -name 'npu_*.gcda' "
        f"-exec cp {{}} {GUEST_ROOT}/{dest}/ \\; && ls {GUEST_ROOT}/{dest} | grep -c gcda"
    )


def parse_gcov(output: str) -> Coverage:
    """gcov's ``-n`` summary ("File 'x.c'" then "Lines executed:P% of N"),
    summed over the module's own C files (npu_*.c; headers left out)."""
    cov = Coverage()
    name = None
    for line in output.splitlines():
        m = _FILE_RE.match(line.strip())
        if m:
            name = Path(m["path"]).name
            continue
        m = _LINES_RE.match(line.strip())
        if m and name is not None:
            if re.fullmatch(r"npu_\w+\.c", name) and name not in cov.files:
                n = int(m["n"])
                executed = round(float(m["pct"]) * n / 100.0)
                cov.files[name] = (executed, n)
                cov.executed += executed
                cov.lines += n
            name = None
    return cov


def line_coverage(gcda_dir: Path, kver: str) -> Coverage:
    """Run gcov over the .gcda files in gcda_dir (under the project tree)
    and the .gcno files of build/module/<kver>/ (the module's build)."""
    build = ROOT / "build" / "module" / kver
    sources = sorted(p.name for p in build.glob("npu_*.c"))
    if not sources:
        raise FileNotFoundError(f"no npu_*.c in {build} (make module-debug)")
    gcno = sorted(build.glob("npu_*.gcno"))
    if not gcno:
        raise FileNotFoundError(f"no .gcno in {build}: was npu.ko built with GCOV_PROFILE=y?")
    for f in gcno:
        shutil.copy2(f, gcda_dir / f.name)
    rel = gcda_dir.resolve().relative_to(ROOT)
    src = f"{CHROOT_ROOT}/build/module/{kver}"
    script = (
        f'. "{ROOT}/scripts/common.sh" && guest_chroot sh -c '
        f"'cd {CHROOT_ROOT}/{rel} && gcov -n -o . " + " ".join(f"{src}/{s}" for s in sources) + "'"
    )
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"gcov failed ({r.returncode}):\n{r.stderr[-2000:]}")
    cov = parse_gcov(r.stdout)
    if not cov.lines:
        raise RuntimeError(f"gcov reported no lines of npu_*.c:\n{r.stdout[-2000:]}")
    return cov


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write(__doc__ or "")
        return 2
    cov = line_coverage(Path(argv[0]), argv[1])
    print(json.dumps(cov.as_dict(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
