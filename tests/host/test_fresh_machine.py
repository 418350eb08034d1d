"""The build scripts work on a fresh machine.

A fresh host has no deb-src entry for the guest's suite: build-qemu.sh must
add one, update apt's lists and then find QEMU's source version, and two
builds started together by ``make -j2`` must not run ``apt-get update`` at
the same time (apt holds one lock on its lists and the second one fails).
apt itself is replaced by stand-ins on PATH, so nothing on the host changes.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QEMU_VERSION = "1:10.0.13+ds-0+deb13u1"

# apt-cache lists QEMU's source only once the deb-src entry exists.
FAKE_APT_CACHE = f"""#!/bin/sh
ls "$NPU_APT_SOURCES" | grep -q trixie-src || exit 0
echo "Package: qemu"
echo "Version: {QEMU_VERSION}"
"""

# apt-get update takes apt's lists lock for a second; a second update while
# the first holds it fails as apt does ("Could not get lock").
FAKE_APT_GET = """#!/bin/sh
[ "$1" = update ] || exit 0
echo update >>"$FAKE_APT_LOG"
mkdir "$FAKE_APT_LOG.lock" 2>/dev/null || { echo "E: Could not get lock" >&2; exit 100; }
sleep 1
rmdir "$FAKE_APT_LOG.lock"
"""


def fake_apt_env(tmp: Path) -> dict[str, str]:
    bin_dir, sources = tmp / "bin", tmp / "sources"
    bin_dir.mkdir()
    sources.mkdir()
    for name, text in (("apt-cache", FAKE_APT_CACHE), ("apt-get", FAKE_APT_GET)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "NPU_APT_SOURCES": str(sources),
        "NPU_CACHE": str(tmp / "cache"),
        "FAKE_APT_LOG": str(tmp / "apt.log"),
    }


def qemu_key(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "build-qemu.sh"), "release", "key"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_build_qemu_adds_the_suites_deb_src_when_the_host_has_none(tmp_path: Path) -> None:
    env = fake_apt_env(tmp_path)
    proc = qemu_key(env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.startswith("qemu-release ")
    entry = (tmp_path / "sources" / "npu-stack-trixie-src.sources").read_text()
    assert entry.startswith("Types: deb-src\n")


def test_two_builds_started_together_update_apt_once_and_both_succeed(tmp_path: Path) -> None:
    env = fake_apt_env(tmp_path)
    procs = [qemu_key(env), qemu_key(env)]
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in results]
    assert results[0][0] == results[1][0]
    assert (tmp_path / "apt.log").read_text() == "update\n"


def newest_build_of(cache: Path, version: str) -> subprocess.CompletedProcess[str]:
    common = ROOT / "scripts" / "common.sh"
    script = f'set -euo pipefail; . "{common}"; newest_build_of "$1" "$2"; echo done'
    return subprocess.run(
        ["bash", "-c", script, "bash", str(cache), version],
        env={**os.environ, "NPU_CACHE": str(cache.parent)},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_first_debug_kernel_build_finds_no_earlier_build_and_goes_on(tmp_path: Path) -> None:
    result = newest_build_of(tmp_path / "kernel-debug", "6.12.1-1")
    assert (result.returncode, result.stdout) == (0, "done\n"), result.stderr


def test_a_later_debug_kernel_build_starts_from_the_newest_one_of_its_source(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "kernel-debug"
    for name, version in (("a", "6.12.1-1"), ("b", "6.12.2-1"), ("c", "6.12.1-1")):
        (cache / name).mkdir(parents=True)
        (cache / name / "source-version").write_text(version + "\n")
        os.utime(cache / name / "source-version", (1, {"a": 1, "b": 3, "c": 2}[name]))
    result = newest_build_of(cache, "6.12.1-1")
    assert result.stdout == f"{cache}/c/source-version\ndone\n", result.stderr
