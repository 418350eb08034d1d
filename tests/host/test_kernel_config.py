"""The kernel configuration fragments (guest/kernel/) say what the kernels get.

guest/kernel/npu.config is shared by the debug kernel and the Buildroot
image; guest/kernel/debug.config adds the bug finders. A symbol that
olddefconfig drops (a typo, a missing dependency, a promptless symbol) would
silently leave a kernel without what the project relies on.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRAGMENTS = ROOT / "guest" / "kernel"
NPU_CACHE = Path(os.environ.get("NPU_CACHE") or Path.home() / ".cache" / "npu-stack")
DEBUG_KERNEL = NPU_CACHE / "kernel-debug" / "current"


def requested(*names: str) -> dict[str, str]:
    want: dict[str, str] = {}
    for name in names:
        for line in (FRAGMENTS / name).read_text().splitlines():
            m = re.fullmatch(r"(CONFIG_\w+)=(.*)", line.strip())
            if m:
                want[m[1]] = m[2]
    return want


def test_the_fragments_request_the_bug_finders_the_issue_names() -> None:
    want = requested("npu.config", "debug.config")
    for sym in (
        "KASAN", "KASAN_GENERIC", "KFENCE", "UBSAN", "PROVE_LOCKING", "DEBUG_ATOMIC_SLEEP",
        "DEBUG_KMEMLEAK", "DMA_API_DEBUG", "DEBUG_OBJECTS", "FAULT_INJECTION", "FAILSLAB",
        "FAIL_PAGE_ALLOC", "FAULT_INJECTION_DEBUG_FS", "DRM_ACCEL", "UDMABUF", "PCI_IOV",
        "INTEL_IOMMU", "NET_9P_VIRTIO", "PCI_MSI", "DMA_SHARED_BUFFER",
    ):  # fmt: skip
        assert want.get(f"CONFIG_{sym}") == "y", f"CONFIG_{sym}=y is not requested"


def test_the_shared_fragment_has_no_debug_option() -> None:
    base = requested("npu.config")
    debug = requested("debug.config")
    assert not set(base) & set(debug) - {"CONFIG_LOCALVERSION"}


def test_every_requested_symbol_survives_merge_config_and_olddefconfig() -> None:
    assert (DEBUG_KERNEL / ".done").is_file(), (
        "the debug kernel's source tree is not built (make kernel-debug; make test builds it)"
    )
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-kernel.sh"), "check"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    lost = [ln for ln in r.stdout.splitlines() if ln.startswith(("base:", "debug:"))]
    assert not lost, "olddefconfig changed (symbol, wanted, got):\n" + "\n".join(lost)


def test_the_built_debug_kernel_has_every_requested_symbol() -> None:
    config = DEBUG_KERNEL / "build" / ".config"
    assert config.is_file(), (
        "the debug kernel is not built (make kernel-debug; make test builds it)"
    )
    have = {}
    for line in config.read_text().splitlines():
        if m := re.fullmatch(r"(CONFIG_\w+)=(.*)", line):
            have[m[1]] = m[2]
    want = requested("npu.config", "debug.config")
    lost = {s: (v, have.get(s, "n")) for s, v in want.items() if have.get(s, "n") != v}
    assert not lost, lost
