"""The onnx package's backend test data, where the guest and the host read it.

Debian's python3-onnx ships without ``onnx/backend/test/data``; the host
venv's onnx (requirements-dev.txt pins the guest's version) has it. The
host part of the conformance suite reads it there (:func:`host_data`); for
the guest, :func:`ensure_data` copies it once into build/onnx-data (in the
clone, which the guest mounts at /mnt/npu; ~50 MB, seconds), with a stamp
naming the onnx version.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "build" / "onnx-data"
GUEST_DATA = "/mnt/npu/build/onnx-data"


def host_data() -> tuple[Path, str]:
    """The host venv's onnx test data directory and the onnx version."""
    import onnx

    src = Path(onnx.__file__).parent / "backend" / "test" / "data"
    if not (src / "node").is_dir():
        raise FileNotFoundError(f"onnx {onnx.__version__} at {src.parent} has no node test data")
    return src, onnx.__version__


def ensure_data() -> tuple[Path, str]:
    """The data directory (copied when missing or of another version) and the onnx version."""
    import onnx

    src, _ = host_data()
    stamp = DATA / "ONNX_VERSION"
    if not stamp.is_file() or stamp.read_text().strip() != onnx.__version__:
        shutil.rmtree(DATA, ignore_errors=True)
        shutil.copytree(src, DATA)
        stamp.write_text(onnx.__version__ + "\n")
    return DATA, onnx.__version__
