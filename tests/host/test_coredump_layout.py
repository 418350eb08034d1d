"""The ctypes mirror in npu.coredump matches include/npu_coredump.h.

As tests/host/test_abi_layout.py does for npu._abi: a C program compiled
against the header prints the size of every struct, the offset and size of
every field and every constant, and the mirror must agree; compiled for
i386 the layout must not move. The decoder's register names must be those
of npu_hw.h's register enums, and the driver must dump each of them. A dump
written by C code through the header's structs decodes.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from npu import _abi, coredump

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "include" / "npu_coredump.h"

# Every field of every struct (members of npu_cmd and npu_tensor_params are
# test_abi_layout.py's business).
FIELDS: dict[str, list[str]] = {
    "npu_dump_header": [
        "magic", "version", "size", "num_sections", "reason", "cause", "queue", "rsvd0",
        "fence", "client", "timestamp_ns", "hw_version", "fw_version", "driver_version", "rsvd1",
    ],
    "npu_dump_section": ["type", "size"],
    "npu_dump_regs": ["count", "when"],
    "npu_dump_reg": ["offset", "value"],
    "npu_dump_queue": [
        "index", "flags", "head", "tail", "status", "error", "done", "next_fence", "completed",
        "client", "entries", "rsvd",
    ],
    "npu_dump_cmd": ["queue", "slot", "flags", "rsvd", "cmd", "params"],
    "npu_dump_fw_log": ["length", "written"],
}  # fmt: skip

# npu_hw.h values the decoder carries for naming registers and states.
HW_CONSTANTS = [
    "NPU_QREG_BASE", "NPU_QREG_STRIDE", "NPU_STATUS_READY", "NPU_STATUS_ENABLED",
    "NPU_STATUS_RESETTING", "NPU_STATUS_ERROR", "NPU_QSTAT_IDLE", "NPU_QSTAT_STOPPED",
    "NPU_QSTAT_ACTIVE", "NPU_QSTAT_WAITING", "NPU_FW_OFF", "NPU_FW_RUNNING", "NPU_FW_FAILED",
    "NPU_FW_CRASHED",
]  # fmt: skip


def header_constants() -> list[str]:
    """Every NPU_DUMP_* macro and enum member of the header."""
    text = HEADER.read_text()
    names = re.findall(r"^#define\s+(NPU_DUMP_[A-Z0-9_]+)\s", text, re.M)
    names += re.findall(r"^\s+(NPU_DUMP_[A-Z0-9_]+)\s*=", text, re.M)
    return sorted(set(names))


def _gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is not installed (scripts/deps.sh installs build-essential)")
    return gcc


def _run_c(tmp: Path, source: str) -> bytes:
    src, exe = tmp / "prog.c", tmp / "prog"
    src.write_text(source)
    subprocess.run(
        [_gcc(), "-std=gnu11", "-Wall", "-Werror", "-I", str(REPO / "include"), "-o", str(exe),
         str(src)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return subprocess.run([str(exe)], check=True, capture_output=True).stdout


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], int]:
    lines = [
        "#include <stddef.h>",
        "#include <stdio.h>",
        '#include "npu_coredump.h"',
        "#define MEMBER_SIZE(s, f) sizeof(((struct s *)0)->f)",
        "int main(void) {",
    ]
    for struct, fields in FIELDS.items():
        lines.append(f'  printf("sizeof {struct} %zu\\n", sizeof(struct {struct}));')
        for f in fields:
            lines.append(
                f'  printf("field {struct} {f} %zu %zu\\n", '
                f"offsetof(struct {struct}, {f}), MEMBER_SIZE({struct}, {f}));"
            )
    for name in header_constants() + HW_CONSTANTS:
        lines.append(f'  printf("const {name} %llu\\n", (unsigned long long)({name}));')
    lines += ["  return 0;", "}"]
    out = _run_c(tmp_path_factory.mktemp("coredump"), "\n".join(lines) + "\n").decode()
    result: dict[tuple[str, ...], int] = {}
    for line in out.splitlines():
        kind, *rest = line.split()
        if kind == "sizeof":
            result[("sizeof", rest[0])] = int(rest[1])
        elif kind == "field":
            result[("offset", rest[0], rest[1])] = int(rest[2])
            result[("size", rest[0], rest[1])] = int(rest[3])
        else:
            result[("const", rest[0])] = int(rest[1])
    return result


@pytest.mark.parametrize("struct", sorted(FIELDS))
def test_struct_size_matches_c(struct: str, c_layout: dict[tuple[str, ...], int]) -> None:
    assert ctypes.sizeof(coredump.STRUCTS[struct]) == c_layout[("sizeof", struct)]


@pytest.mark.parametrize(
    ("struct", "field"), [(s, f) for s, fields in FIELDS.items() for f in fields]
)
def test_field_offset_and_size_match_c(
    struct: str, field: str, c_layout: dict[tuple[str, ...], int]
) -> None:
    descriptor = getattr(coredump.STRUCTS[struct], field)
    assert (descriptor.offset, descriptor.size) == (
        c_layout[("offset", struct, field)],
        c_layout[("size", struct, field)],
    )


@pytest.mark.parametrize("struct", sorted(FIELDS))
def test_mirror_has_exactly_the_c_fields(struct: str) -> None:
    names = [f[0] for f in coredump.STRUCTS[struct]._fields_]
    assert names == FIELDS[struct]


def test_every_header_struct_is_mirrored() -> None:
    declared = set(re.findall(r"^struct\s+(npu_dump_\w+)\s*\{", HEADER.read_text(), re.M))
    assert declared == set(FIELDS) == set(coredump.STRUCTS)


@pytest.mark.parametrize("struct", sorted(FIELDS))
def test_every_struct_is_a_multiple_of_8_bytes(
    struct: str, c_layout: dict[tuple[str, ...], int]
) -> None:
    assert c_layout[("sizeof", struct)] % 8 == 0


@pytest.mark.parametrize("struct", sorted(FIELDS))
def test_no_struct_has_implicit_padding(struct: str, c_layout: dict[tuple[str, ...], int]) -> None:
    fields = sorted(
        (c_layout[("offset", struct, f)], c_layout[("size", struct, f)]) for f in FIELDS[struct]
    )
    end = 0
    for offset, size in fields:
        assert offset == end, f"{struct}: a hole at {end}..{offset}"
        end = offset + size
    assert end == c_layout[("sizeof", struct)], f"{struct}: tail padding"


@pytest.mark.parametrize("name", header_constants() + HW_CONSTANTS)
def test_constant_matches_c(name: str, c_layout: dict[tuple[str, ...], int]) -> None:
    assert getattr(coredump, name) == c_layout[("const", name)]


def test_reason_and_section_enums_are_mirrored() -> None:
    assert {r.name: r.value for r in coredump.Reason} == {
        "HANG": coredump.NPU_DUMP_HANG,
        "FW_LOST": coredump.NPU_DUMP_FW_LOST,
        "FATAL": coredump.NPU_DUMP_FATAL,
    }
    assert {s.name: s.value for s in coredump.SectionType} == {
        "REGS": coredump.NPU_DUMP_SEC_REGS,
        "QUEUE": coredump.NPU_DUMP_SEC_QUEUE,
        "CMD": coredump.NPU_DUMP_SEC_CMD,
        "FW_LOG": coredump.NPU_DUMP_SEC_FW_LOG,
    }


# As test_abi_layout.py: the basic types for an i386 compile without 32-bit
# libc or kernel headers installed (<asm-generic/int-ll64.h>, <linux/types.h>).
_I386_TYPES = """\
typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef signed int __s32;
__extension__ typedef unsigned long long __u64;
__extension__ typedef signed long long __s64;
typedef __u16 __le16;
typedef __u32 __le32;
typedef __u64 __le64;
"""


def test_layout_is_the_same_for_32_bit_decoders(
    tmp_path: Path, c_layout: dict[tuple[str, ...], int]
) -> None:
    """Compiled with -m32 (i386: 8-byte integers 4-aligned), every struct and
    field keeps its x86-64 size and offset."""
    gcc = _gcc()
    (tmp_path / "linux").mkdir()
    (tmp_path / "linux" / "types.h").write_text(_I386_TYPES)
    lines = ["#include <stddef.h>", '#include "npu_coredump.h"']
    for struct, fields in FIELDS.items():
        size = c_layout[("sizeof", struct)]
        lines.append(f'_Static_assert(sizeof(struct {struct}) == {size}, "{struct} size");')
        for f in fields:
            off = c_layout[("offset", struct, f)]
            lines.append(
                f'_Static_assert(offsetof(struct {struct}, {f}) == {off}, "{struct}.{f}");'
            )
    src = tmp_path / "layout32.c"
    src.write_text("\n".join(lines) + "\n")
    gcc_include = subprocess.run(
        [gcc, "-print-file-name=include"], check=True, capture_output=True, text=True
    ).stdout.strip()
    r = subprocess.run(
        [gcc, "-m32", "-std=gnu11", "-Wall", "-Werror", "-fsyntax-only", "-nostdinc",
         "-isystem", gcc_include, "-I", str(tmp_path), "-I", str(REPO / "include"), str(src)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------
# Register names: npu_hw.h's enums, the decoder's tables, the driver's lists
# --------------------------------------------------------------------------


def hw_enum(name: str, prefix: str) -> dict[int, str]:
    """Members of ``enum name`` in npu_hw.h: value -> name without ``prefix``."""
    text = (REPO / "include" / "npu_hw.h").read_text()
    body = re.search(rf"enum {name} \{{(.*?)\}};", text, re.S)
    assert body, name
    members = re.findall(rf"^\s+{prefix}(\w+)\s*=\s*(0x[0-9a-fA-F]+|\d+)", body[1], re.M)
    return {int(value, 0): member for member, value in members}


def driver_list(array: str) -> list[str]:
    """The names in a ``static const ... array[] = { ... };`` of npu_coredump.c."""
    text = (REPO / "kernel_module" / "npu_coredump.c").read_text()
    body = re.search(rf"{array}\[\] = \{{(.*?)\}};", text, re.S)
    assert body, array
    return re.findall(r"NPU_\w+", body[1])


def test_decoder_names_every_device_register_of_npu_hw_h() -> None:
    assert hw_enum("npu_reg", "NPU_REG_") == coredump.DEVICE_REGISTERS


def test_decoder_names_every_queue_register_of_npu_hw_h() -> None:
    assert hw_enum("npu_qreg", "NPU_Q_") == coredump.QUEUE_REGISTERS


def write_only_registers() -> set[str]:
    """Registers of npu_hw.h whose comment says WO: a read of one is an error."""
    text = (REPO / "include" / "npu_hw.h").read_text()
    return set(re.findall(r"^\s+NPU_REG_(\w+)\s*=\s*0x[0-9a-fA-F]+,\s*/\* WO\b", text, re.M))


def test_the_only_write_only_register_is_fw_control() -> None:
    assert write_only_registers() == {"FW_CONTROL"}


def test_driver_dumps_every_readable_device_register_of_npu_hw_h() -> None:
    readable = [
        n for n in hw_enum("npu_reg", "NPU_REG_").values() if n not in write_only_registers()
    ]
    assert driver_list("npu_dump_dev_regs") == [f"NPU_REG_{n}" for n in readable]


def test_driver_dumps_every_queue_register_of_npu_hw_h() -> None:
    enum = hw_enum("npu_qreg", "NPU_Q_")
    assert driver_list("npu_dump_queue_regs") == [f"NPU_Q_{n}" for n in enum.values()]


def test_register_names_of_queue_blocks() -> None:
    assert coredump.register_name(0x0B0) == "FW_STATUS"
    assert coredump.register_name(0x1000 + 2 * 0x100 + 0x10) == "Q2.HEAD"
    assert coredump.register_name(0x01C) == "?0x1c"


# --------------------------------------------------------------------------
# A dump written in C decodes
# --------------------------------------------------------------------------

_C_WRITER = r"""
#include <stdio.h>
#include <string.h>
#include "npu_coredump.h"

static unsigned char buf[4096];
static size_t len;

static void *section(__u32 type, __u32 size)
{
	struct npu_dump_section *s = (void *)(buf + len);

	s->type = type;
	s->size = (size + 7) & ~7u;
	len += sizeof(*s) + s->size;
	((struct npu_dump_header *)buf)->num_sections++;
	return s + 1;
}

int main(void)
{
	struct npu_dump_header *h = (void *)buf;
	struct npu_dump_regs *regs;
	struct npu_dump_reg *r;
	struct npu_dump_queue *q;
	struct npu_dump_cmd *c;
	struct npu_dump_fw_log *log;
	static const char text[] = "fw: boot\nfw: queue 0 hung\n";

	len = sizeof(*h);
	h->magic = NPU_DUMP_MAGIC;
	h->version = NPU_DUMP_VERSION;
	h->reason = NPU_DUMP_FATAL;
	h->cause = NPU_DUMP_HANG;
	h->queue = 0;
	h->fence = 0x1122334455ull;
	h->client = 42;
	h->timestamp_ns = 123456789;
	h->hw_version = NPU_HW_VERSION;
	h->fw_version = 0x00010002;
	h->driver_version = 0x00010001;
	regs = section(NPU_DUMP_SEC_REGS, sizeof(*regs) + 2 * sizeof(*r));
	regs->count = 2;
	regs->when = NPU_DUMP_AFTER_RESET;
	r = (void *)(regs + 1);
	r[0].offset = NPU_REG_FW_STATUS;
	r[0].value = NPU_FW_CRASHED;
	r[1].offset = NPU_QREG(0, NPU_Q_STATUS);
	r[1].value = NPU_QSTAT_ACTIVE;
	q = section(NPU_DUMP_SEC_QUEUE, sizeof(*q));
	q->head = 7;
	q->status = NPU_QSTAT_ACTIVE;
	q->next_fence = 0x1122334460ull;
	q->entries = 4096;
	c = section(NPU_DUMP_SEC_CMD, sizeof(*c));
	c->slot = 6;
	c->cmd.opcode = NPU_OP_FILL;
	c->cmd.fence = 0x1122334455ull;
	c->cmd.fill.len = 4096;
	c->cmd.fill.pattern = 0xdeadbeef;
	log = section(NPU_DUMP_SEC_FW_LOG, sizeof(*log) + sizeof(text) - 1);
	log->length = sizeof(text) - 1;
	log->written = 1000;
	memcpy(log + 1, text, sizeof(text) - 1);
	h->size = len;
	fwrite(buf, 1, len, stdout);
	return 0;
}
"""


def test_a_dump_written_through_the_c_structs_decodes(tmp_path: Path) -> None:
    dump = coredump.parse(_run_c(tmp_path, _C_WRITER))
    assert (dump.reason_name, dump.cause_name) == ("FATAL", "HANG")
    assert (dump.queue, dump.fence, dump.client) == (0, 0x1122334455, 42)
    assert dump.timestamp_ns == 123456789
    (regs,) = dump.registers
    assert regs.when == coredump.NPU_DUMP_AFTER_RESET
    assert regs["FW_STATUS"] == coredump.NPU_FW_CRASHED
    assert regs["Q0.STATUS"] == coredump.NPU_QSTAT_ACTIVE
    (q,) = dump.queues
    assert (q.index, q.head, q.next_fence, q.entries) == (0, 7, 0x1122334460, 4096)
    assert dump.command is not None
    assert dump.command.opcode == _abi.NPU_OP_FILL
    assert dump.command.descriptor.fill.pattern == 0xDEADBEEF
    assert dump.fw_log == coredump.FirmwareLog(text="fw: boot\nfw: queue 0 hung\n", written=1000)
