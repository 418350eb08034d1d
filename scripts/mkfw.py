#!/usr/bin/env python3
"""Build the NPU firmware image (include/npu_fw.h, docs/firmware.md).

    python3 scripts/mkfw.py [firmware/npu_fw.json] [-o build/firmware/npu/npu_fw.bin]

The manifest names the image's version, build id, heartbeat period, log
level, note and the opcodes the firmware runs; the opcode values and the
ABI version come from include/npu_hw.h, so the image always matches the
headers it was built with. ``build_image`` is importable for tests that
need images with chosen defects.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HW_H = ROOT / "include" / "npu_hw.h"
FW_H = ROOT / "include" / "npu_fw.h"

MAGIC = 0x4657504E
HEADER_SIZE = 64
SEC_OPCODES, SEC_HEARTBEAT, SEC_LOG_LEVEL = 1, 2, 3
SEC_NOTE = 4 | (1 << 31)


def header_constants() -> dict[str, int]:
    """NPU_OP_* and NPU_ABI_VERSION from npu_hw.h."""
    text = HW_H.read_text()
    consts = {m[1]: int(m[2], 0) for m in re.finditer(r"\b(NPU_OP_\w+)\s*=\s*(\w+)", text)}
    abi = re.search(r"#define\s+NPU_ABI_VERSION\s+(\d+)", text)
    assert abi, "NPU_ABI_VERSION missing from npu_hw.h"
    consts["NPU_ABI_VERSION"] = int(abi[1])
    return consts


def _section(kind: int, data: bytes) -> bytes:
    pad = (-len(data)) % 4
    return struct.pack("<II", kind, len(data)) + data + b"\0" * pad


def build_image(
    manifest: dict,
    *,
    abi: int | None = None,
    magic: int = MAGIC,
    extra_sections: bytes = b"",
) -> bytes:
    """The image bytes of @manifest (optionally with a chosen ABI, magic or
    extra raw sections, for tests of the rejection paths)."""
    consts = header_constants()
    mask = 0
    for name in manifest["opcodes"]:
        mask |= 1 << consts[f"NPU_OP_{name}"]
    payload = (
        _section(SEC_OPCODES, struct.pack("<I", mask))
        + _section(SEC_HEARTBEAT, struct.pack("<I", int(manifest["heartbeat_us"])))
        + _section(SEC_LOG_LEVEL, struct.pack("<I", int(manifest["log_level"])))
        + _section(SEC_NOTE, manifest.get("note", "").encode())
        + extra_sections
    )
    major, minor = (int(x) for x in str(manifest["version"]).split("."))
    build_id = manifest["build_id"].encode()[:32].ljust(32, b"\0")
    fields = [
        magic, HEADER_SIZE, major << 16 | minor,
        consts["NPU_ABI_VERSION"] if abi is None else abi,
        len(payload), zlib.crc32(payload), 0, 0,
    ]  # fmt: skip
    header = struct.pack("<8I", *fields) + build_id
    assert len(header) == HEADER_SIZE
    fields[6] = zlib.crc32(header)
    return struct.pack("<8I", *fields) + build_id + payload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("manifest", nargs="?", default=str(ROOT / "firmware" / "npu_fw.json"))
    ap.add_argument("-o", "--output", default=str(ROOT / "build/firmware/npu/npu_fw.bin"))
    args = ap.parse_args(argv)
    image = build_image(json.loads(Path(args.manifest).read_text()))
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(image)
    tmp.replace(out)
    print(f"mkfw: {out} ({len(image)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
