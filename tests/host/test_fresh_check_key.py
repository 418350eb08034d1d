"""The fresh-machine check's key: what decides how the project is built and installed.

scripts/fresh-check.sh runs `make demo` in a clean Debian root (about half an
hour), and its ci mode runs it again only when the key changed. The key must
change with every input of the build and install recipe (Makefile, scripts/,
guest/ with the kernel fragments, requirements*.txt, pyproject.toml,
firmware/, npu.ko's Kbuild, the host's model script and the set of device
source files that the QEMU splice names), stay put for everything else
(docs, source code) and not depend on where the clone is.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from test_cache_keys import copy_of_the_tree

ROOT = Path(__file__).resolve().parents[2]


def key(tree: Path, *args: str, cache: Path | None = None, script: Path | None = None) -> str:
    """`fresh-check.sh key` of tree (by tree's own script unless given one)."""
    env = dict(os.environ)
    if cache is not None:
        env["NPU_CACHE"] = str(cache)
    script = script or tree / "scripts" / "fresh-check.sh"
    out = subprocess.run(
        ["bash", str(script), "--src", str(tree), "key", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    ).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{16}", out), out
    return out


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's files (tracked and new, not ignored), copied once."""
    return copy_of_the_tree(tmp_path_factory.mktemp("base") / "npu")


@pytest.fixture
def copy(tree: Path, tmp_path: Path) -> Path:
    """A private copy of the tree for one test to change."""
    dst = tmp_path / "copy" / "npu"
    shutil.copytree(tree, dst, symlinks=True)
    return dst


def append(path: str, text: str = "\n# changed\n") -> Callable[[Path], None]:
    def change(t: Path) -> None:
        (t / path).parent.mkdir(parents=True, exist_ok=True)
        with open(t / path, "a") as f:
            f.write(text)

    return change


def rename(old: str, new: str) -> Callable[[Path], None]:
    def change(t: Path) -> None:
        (t / old).rename(t / new)

    return change


INPUTS = {
    "Makefile": append("Makefile"),
    "the deps script": append("scripts/deps.sh"),
    "the shared build settings": append("scripts/common.sh"),
    "the QEMU splice": append("scripts/build-qemu.sh"),
    "the guest build": append("scripts/build-guest.sh"),
    "the check itself": append("scripts/fresh-check.sh"),
    "a new script": append("scripts/new-step.sh", "#!/bin/sh\n"),
    "the guest's packages": append("guest/packages.txt", "htop\n"),
    "the guest's pip list": append("guest/requirements.txt", "tqdm\n"),
    "the guest's init": append("guest/npu-init"),
    "a kernel fragment": append("guest/kernel/npu.config", "CONFIG_DEBUG_VM=y\n"),
    "the debug kernel fragment": append("guest/kernel/debug.config", "CONFIG_KCOV=y\n"),
    "the host's pip list": append("requirements-dev.txt", "tqdm\n"),
    "a new requirements file": append("requirements-extra.txt", "tqdm\n"),
    "pyproject.toml": append("pyproject.toml"),
    "the firmware": append("firmware/npu_fw.json", "\n"),
    "npu.ko's Kbuild": append("kernel_module/Kbuild"),
    "the host's model script": append("examples/models/make_resnet50.py"),
    "a new device source file": append("qemu_device/npu_new.c", "/* new */\n"),
    "a renamed device source file": rename("qemu_device/npu_mmu.c", "qemu_device/npu_iommu.c"),
}

OUTSIDE = {
    "docs": append("docs/decisions.md"),
    "the README": append("README.md"),
    "a device source file's contents": append("qemu_device/npu.c", "/* changed */\n"),
    "a device header": append("qemu_device/npu_new.h", "/* new */\n"),
    "the driver's source": append("kernel_module/npu_drv.c", "/* changed */\n"),
    "the runtime": append("runtime_py/npu/__init__.py"),
    "a test": append("tests/host/test_api.py"),
    "an example": append("examples/hello_npu.py"),
    "Python's caches": append("scripts/__pycache__/guest.cpython-311.pyc", "\0"),
}


@pytest.mark.parametrize("change", INPUTS.values(), ids=INPUTS.keys())
def test_the_key_changes_with_each_input(
    tree: Path, copy: Path, tmp_path: Path, change: Callable[[Path], None]
) -> None:
    before = key(tree, cache=tmp_path / "cache")
    change(copy)
    assert key(copy, cache=tmp_path / "cache") != before


@pytest.mark.parametrize("change", OUTSIDE.values(), ids=OUTSIDE.keys())
def test_the_key_stays_for_what_is_not_an_input(
    tree: Path, copy: Path, tmp_path: Path, change: Callable[[Path], None]
) -> None:
    before = key(tree, cache=tmp_path / "cache")
    change(copy)
    assert key(copy, cache=tmp_path / "cache") == before


def test_a_copy_in_another_folder_has_the_same_key(tree: Path, tmp_path: Path) -> None:
    assert key(tree, cache=tmp_path / "cache") == key(ROOT, cache=tmp_path / "cache")


def test_a_clone_in_another_folder_has_the_key_of_head(tmp_path: Path) -> None:
    clone = tmp_path / "elsewhere" / "npu-clone"
    subprocess.run(
        ["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # The check's script of this tree for both (the clone's HEAD may predate it).
    script = ROOT / "scripts" / "fresh-check.sh"
    cache = tmp_path / "cache"
    assert key(clone, cache=cache, script=script) == key(ROOT, "--head", cache=cache, script=script)


def test_ci_takes_turns_by_the_keys_last_hex_digit() -> None:
    # The documented rule, checked on the script's own function.
    script = ROOT / "scripts" / "fresh-check.sh"
    text = script.read_text()
    body = re.search(r"^turn_release\(\) \{\n.*?^\}\n", text, re.S | re.M)
    assert body is not None
    for digit, release in (("0", "bookworm"), ("7", "trixie"), ("a", "bookworm"), ("f", "trixie")):
        out = subprocess.run(
            ["bash", "-c", body.group(0) + f"turn_release 0123456789abcde{digit}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert out == release, digit
