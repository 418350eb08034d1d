"""The onnx package's backend test data of the conformance list's onnx version.

The list (tests/conformance/expected.json) is of the guest's onnx, Debian
13's python3-onnx 1.17.0, which ships without ``onnx/backend/test/data``.
:func:`ensure_data` puts that version's data into build/onnx-data (in the
clone, which the guest mounts at /mnt/npu and the guest-root chroot at
/src; ~50 MB, seconds), with a stamp naming the version. It comes from the
host venv's onnx when that is the list's version (a Debian 12 host), else
from that version's wheel, fetched once from the package index into
$NPU_CACHE/onnx-test-data/<version> (a Debian 13 host, whose Python 3.13
has no onnx 1.17.0: requirements-dev.txt).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "build" / "onnx-data"
GUEST_DATA = "/mnt/npu/build/onnx-data"
CHROOT_DATA = "/src/build/onnx-data"  # scripts/common.sh: guest_chroot
EXPECTED = ROOT / "tests" / "conformance" / "expected.json"
NPU_CACHE = Path(os.environ.get("NPU_CACHE") or Path.home() / ".cache" / "npu-stack")
_MEMBER = "onnx/backend/test/data/"


def list_version() -> str:
    """The onnx version the conformance list was made with (the guest's)."""
    version: str = json.loads(EXPECTED.read_text())["onnx"]
    return version


def _venv_data(version: str) -> Path | None:
    """The host venv's onnx test data, if the venv has that onnx version."""
    try:
        import onnx
    except ImportError:
        return None
    src = Path(onnx.__file__).parent / "backend" / "test" / "data"
    return src if onnx.__version__ == version and (src / "node").is_dir() else None


def _wheel_data(version: str) -> Path:
    """That version's test data out of its manylinux wheel (fetched once)."""
    dest = NPU_CACHE / "onnx-test-data" / version
    if (dest / "node").is_dir():
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "-q", f"onnx=={version}", "--no-deps",
            "--only-binary=:all:", "--platform", "manylinux_2_17_x86_64",
            "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
            "--dest", tmp,
        ]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        wheels = list(Path(tmp).glob("onnx-*.whl"))
        if r.returncode != 0 or not wheels:
            raise RuntimeError(f"pip could not fetch the onnx {version} wheel:\n{r.stderr[-2000:]}")
        part = dest.with_name(dest.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        with zipfile.ZipFile(wheels[0]) as z:
            for m in z.namelist():
                if m.startswith(_MEMBER) and not m.endswith("/"):
                    out = part / m[len(_MEMBER) :]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(z.read(m))
        if not (part / "node").is_dir():
            raise RuntimeError(f"the onnx {version} wheel has no {_MEMBER}node")
        shutil.rmtree(dest, ignore_errors=True)
        part.rename(dest)
    return dest


def ensure_data() -> tuple[Path, str]:
    """build/onnx-data with the list's version's data (copied when missing or stale),
    and that version."""
    version = list_version()
    stamp = DATA / "ONNX_VERSION"
    if not stamp.is_file() or stamp.read_text().strip() != version:
        src = _venv_data(version) or _wheel_data(version)
        shutil.rmtree(DATA, ignore_errors=True)
        shutil.copytree(src, DATA)
        stamp.write_text(version + "\n")
    return DATA, version
