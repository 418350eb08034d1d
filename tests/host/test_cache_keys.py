"""Cache keys hash what a build is made of, never where the clone is.

CI runs in a fresh clone in another folder; a key that hashed an absolute
path (sha256sum's file-name column, say) would rebuild QEMU, the guest and
the debug kernel there. scripts/cache-keys.sh prints every key.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cache_keys(tree: Path) -> list[str]:
    out = subprocess.run(
        ["bash", str(tree / "scripts" / "cache-keys.sh")],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    return out.splitlines()


def copy_of_the_tree(dst: Path) -> Path:
    """The project's files (tracked and new, not ignored) copied to dst."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, names):
        src = ROOT / name.decode()
        if src.is_file():
            (dst / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name.decode())
    return dst


def test_every_build_product_has_a_cache_key() -> None:
    names = [line.split()[0] for line in cache_keys(ROOT)]
    assert names == ["deps", "qemu-release", "qemu-asan", "guest", "kernel-debug"]


def test_a_copy_in_another_folder_gets_the_same_cache_keys(tmp_path: Path) -> None:
    clone = copy_of_the_tree(tmp_path / "elsewhere" / "npu-clone")
    assert cache_keys(clone) == cache_keys(ROOT)


def test_a_changed_kernel_fragment_changes_the_debug_kernel_key(tmp_path: Path) -> None:
    clone = copy_of_the_tree(tmp_path / "changed")
    with open(clone / "guest" / "kernel" / "debug.config", "a") as f:
        f.write("CONFIG_DEBUG_VM=y\n")
    before = dict(line.split() for line in cache_keys(ROOT))
    after = dict(line.split() for line in cache_keys(clone))
    assert after["kernel-debug"] != before["kernel-debug"]
    assert after["guest"] == before["guest"]
