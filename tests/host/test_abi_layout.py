"""The ctypes mirror in npu._abi matches include/npu_hw.h and include/npu_uapi.h.

A C program compiled against the real headers prints the size of every
struct, the offset and size of every field, every constant and every ioctl
number; the mirror must agree on all of them.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from npu import _abi

REPO = Path(__file__).resolve().parents[2]

# Every field of every struct, as C member designators (the layout spec).
FIELDS: dict[str, list[str]] = {
    "npu_cmd": [
        "opcode", "flags", "ctx", "rsvd0", "fence",
        "copy", "copy.src", "copy.dst", "copy.len",
        "fill", "fill.dst", "fill.len", "fill.pattern", "fill.rsvd",
        "gemm", "gemm.a", "gemm.b", "gemm.c", "gemm.m", "gemm.n", "gemm.k",
        "gemm.lda", "gemm.ldb", "gemm.ldc", "gemm.dtype", "gemm.flags",
        "sync", "sync.va", "sync.value",
        "tensor", "tensor.params", "tensor.kind", "tensor.rsvd",
        "raw",
    ],
    "npu_cpl": ["fence", "status", "opcode", "rsvd", "t_start", "t_end"],
    "npu_fence_wb": ["value", "timestamp"],
    "npu_hw_tensor": ["va", "dtype", "ndim", "shape", "strides"],
    "npu_tensor_params": ["t", "params"],
    "npu_info": [
        "hw_version", "abi_version", "driver_version", "caps", "num_queues", "num_cores",
        "max_submit", "ring_entries", "max_bo_size", "pci_vendor", "pci_device",
        "user_queues", "device_memory", "rsvd",
    ],
    "npu_bo_create": ["size", "flags", "handle", "mmap_offset", "alloc_size", "va"],
    "npu_bo_destroy": ["handle", "rsvd"],
    "npu_bo_userptr": ["addr", "size", "flags", "handle", "va"],
    "npu_queue_create": [
        "entries", "priority", "flags", "queue", "mem_offset", "mem_size", "cpl_offset",
        "fence_offset", "doorbell_offset",
    ],
    "npu_queue_destroy": ["queue", "rsvd"],
    "npu_bo_info": ["handle", "flags", "size", "mmap_offset", "va"],
    "npu_fence_info": ["fence", "queue", "status", "t_start", "t_end"],
    "npu_buf_ref": ["handle", "rsvd", "offset", "size"],
    "npu_op": ["opcode", "flags", "num_bufs", "bufs", "params", "rsvd"],
    "npu_tensor_ref": [
        "handle", "dtype", "offset", "ndim", "rsvd", "shape", "strides", "rsvd2",
    ],
    "npu_tensor_op": ["opcode", "flags", "kind", "t", "params", "rsvd"],
    "npu_submit": [
        "ops_ptr", "num_ops", "queue", "flags", "op_size", "fence", "in_syncs",
        "num_in_syncs", "out_syncobj", "out_point",
    ],
    "npu_sync": ["handle", "flags", "point"],
    "npu_wait": [
        "fence", "deadline_ns", "queue", "flags", "status", "rsvd", "error_fence",
    ],
}  # fmt: skip

CONSTANTS = [
    "NPU_PCI_VENDOR_ID", "NPU_PCI_DEVICE_ID", "NPU_PCI_REVISION", "NPU_PCI_CLASS",
    "NPU_MAGIC", "NPU_HW_VERSION", "NPU_ABI_VERSION",
    "NPU_CAP_COPY", "NPU_CAP_FILL", "NPU_CAP_GEMM_FP32", "NPU_CAP_MSIX", "NPU_CAP_TIMESTAMPS",
    "NPU_CAP_MMU", "NPU_CAP_TENSOR", "NPU_CAP_REDUCE", "NPU_CAP_MATMUL", "NPU_CAP_CONV",
    "NPU_CAP_QUANT", "NPU_CAP_LOCAL_MEM", "NPU_CAP_POOL_GEOMETRY", "NPU_CAP_SELECT",
    "NPU_CAP_STRIDED_OUT", "NPU_CAP_CONV_ACCUMULATE", "NPU_CAP_ACT_RELU6", "NPU_CAP_CONCURRENT",
    "NPU_CAP_PERF", "NPU_CAP_TRACE",
    "NPU_CONV_P_FLAGS", "NPU_CONV_F_ACCUMULATE", "NPU_CONV_F_MASK",
    "NPU_POOL_P_KH", "NPU_POOL_P_KW", "NPU_POOL_P_STRIDE_H", "NPU_POOL_P_STRIDE_W",
    "NPU_POOL_P_PAD_H", "NPU_POOL_P_PAD_W", "NPU_POOL_P_FLAGS", "NPU_POOL_P_PAD_H_END",
    "NPU_POOL_P_PAD_W_END", "NPU_POOL_P_DIL_H", "NPU_POOL_P_DIL_W", "NPU_POOL_F_COUNT_PAD",
    "NPU_POOL_F_GEOMETRY", "NPU_POOL_F_CEIL", "NPU_POOL_F_MASK",
    "NPU_NUM_QUEUES", "NPU_MAX_QUEUES", "NPU_RING_MAX_ENTRIES",
    "NPU_OP_NOP", "NPU_OP_COPY", "NPU_OP_FILL", "NPU_OP_GEMM", "NPU_OP_ELTWISE",
    "NPU_OP_UNARY", "NPU_OP_CONVERT", "NPU_OP_REDUCE", "NPU_OP_SOFTMAX", "NPU_OP_LAYERNORM",
    "NPU_OP_MATMUL", "NPU_OP_LINEAR", "NPU_OP_CONV2D", "NPU_OP_POOL2D", "NPU_OP_REQUANT",
    "NPU_OP_COUNT",
    "NPU_CONV_P_STRIDE_H", "NPU_CONV_P_STRIDE_W", "NPU_CONV_P_PAD_H", "NPU_CONV_P_PAD_W",
    "NPU_CONV_P_DIL_H", "NPU_CONV_P_DIL_W", "NPU_CONV_P_GROUPS", "NPU_CONV_P_IN_ZP",
    "NPU_MAX_PAD", "NPU_MM_P_IN_ZP", "NPU_ZP_MIN", "NPU_ZP_MAX", "NPU_REQUANT_P_OUT_ZP",
    "NPU_POOL_MAX", "NPU_POOL_AVG", "NPU_POOL_COUNT",
    "NPU_POOL_P_KH", "NPU_POOL_P_KW", "NPU_POOL_P_STRIDE_H", "NPU_POOL_P_STRIDE_W",
    "NPU_POOL_P_PAD_H", "NPU_POOL_P_PAD_W", "NPU_POOL_P_FLAGS", "NPU_POOL_F_COUNT_PAD",
    "NPU_ACT_NONE", "NPU_ACT_RELU", "NPU_ACT_GELU", "NPU_ACT_RELU6", "NPU_ACT_COUNT",
    "NPU_REDUCE_SUM", "NPU_REDUCE_MEAN", "NPU_REDUCE_MAX", "NPU_REDUCE_MIN", "NPU_REDUCE_COUNT",
    "NPU_SOFTMAX_SOFTMAX", "NPU_SOFTMAX_LOG", "NPU_SOFTMAX_COUNT",
    "NPU_ELTWISE_ADD", "NPU_ELTWISE_SUB", "NPU_ELTWISE_MUL", "NPU_ELTWISE_DIV",
    "NPU_ELTWISE_MAX", "NPU_ELTWISE_MIN", "NPU_ELTWISE_EQ", "NPU_ELTWISE_NE",
    "NPU_ELTWISE_LT", "NPU_ELTWISE_LE", "NPU_ELTWISE_GT", "NPU_ELTWISE_GE", "NPU_ELTWISE_COUNT",
    "NPU_UNARY_RELU", "NPU_UNARY_GELU", "NPU_UNARY_SIGMOID", "NPU_UNARY_TANH",
    "NPU_UNARY_EXP", "NPU_UNARY_LOG", "NPU_UNARY_SQRT", "NPU_UNARY_ABS", "NPU_UNARY_NEG",
    "NPU_UNARY_ERF", "NPU_UNARY_RECIPROCAL",
    "NPU_UNARY_COUNT",
    "NPU_CMD_F_IRQ", "NPU_CMD_F_CONCURRENT", "NPU_CMD_F_MASK",
    "NPU_GEMM_TRANS_A", "NPU_GEMM_TRANS_B", "NPU_GEMM_F_MASK",
    "NPU_DTYPE_FP32", "NPU_DTYPE_FP16", "NPU_DTYPE_BF16", "NPU_DTYPE_INT8", "NPU_DTYPE_INT32",
    "NPU_DTYPE_BOOL", "NPU_DTYPE_COUNT",
    "NPU_MAX_RANK", "NPU_TENSOR_OPERANDS", "NPU_TENSOR_PARAMS", "NPU_MAX_STRIDE",
    "NPU_MAX_ELEMS", "NPU_MAX_XFER", "NPU_MAX_DIM", "NPU_MAX_LD",
    "NPU_ST_OK", "NPU_ST_BAD_OPCODE", "NPU_ST_BAD_FLAGS", "NPU_ST_BAD_RESERVED",
    "NPU_ST_BAD_ARGS", "NPU_ST_BAD_ADDR", "NPU_ST_DMA_ERROR", "NPU_ST_ABORTED",
    "NPU_ST_NO_MEMORY", "NPU_ST_MMU_FAULT", "NPU_ST_BAD_QUANT", "NPU_ST_HW_ERROR",
    "NPU_ST_TIMEOUT", "NPU_ST_COUNT", "NPU_OP_SIGNAL", "NPU_OP_WAIT", "NPU_OP_SELECT",
    "NPU_ERR_NONE", "NPU_ERR_RING_OVERRUN", "NPU_ERR_RING_FETCH", "NPU_ERR_CPL_WRITE",
    "NPU_ERR_BAD_RING", "NPU_ERR_MMU_FAULT",
    "NPU_DRM_IOCTL_BASE", "NPU_DRM_COMMAND_BASE",
    "DRM_NPU_GET_INFO", "DRM_NPU_BO_CREATE", "DRM_NPU_BO_DESTROY", "DRM_NPU_SUBMIT",
    "DRM_NPU_WAIT", "DRM_NPU_BO_USERPTR", "DRM_NPU_FENCE_INFO", "DRM_NPU_QUEUE_CREATE",
    "DRM_NPU_QUEUE_DESTROY", "DRM_NPU_BO_INFO", "DRM_IOCTL_NPU_BO_INFO",
    "NPU_BO_INFO_DEVICE", "NPU_BO_INFO_USERPTR", "NPU_BO_INFO_IMPORTED", "NPU_BO_INFO_READONLY",
    "NPU_INFO_CAP_COPY", "NPU_INFO_CAP_FILL", "NPU_INFO_CAP_GEMM_FP32", "NPU_INFO_CAP_MSIX",
    "NPU_INFO_CAP_TIMESTAMPS", "NPU_INFO_CAP_MMU", "NPU_INFO_CAP_TENSOR", "NPU_INFO_CAP_REDUCE",
    "NPU_INFO_CAP_MATMUL", "NPU_INFO_CAP_CONV", "NPU_INFO_CAP_QUANT", "NPU_INFO_CAP_LOCAL_MEM",
    "NPU_INFO_CAP_POOL_GEOMETRY", "NPU_INFO_CAP_SELECT", "NPU_INFO_CAP_STRIDED_OUT",
    "NPU_INFO_CAP_CONV_ACCUMULATE", "NPU_INFO_CAP_ACT_RELU6", "NPU_INFO_CAP_CONCURRENT",
    "NPU_INFO_CAP_PERF", "NPU_INFO_CAP_TRACE",
    "NPU_TENSOR_OP_F_CONCURRENT", "NPU_TENSOR_OP_F_MASK",
    "NPU_BO_DEVICE", "NPU_BO_CREATE_FLAGS",
    "NPU_QUEUE_MIN_ENTRIES", "NPU_QUEUE_MAX_ENTRIES", "NPU_QUEUE_PRIORITY_USER",
    "NPU_BO_MAX_SIZE", "NPU_OP_MAX_BUFS", "NPU_OP_MAX_PARAMS", "NPU_SUBMIT_MAX_OPS",
    "NPU_SUBMIT_MAX_SYNCS", "NPU_SYNC_USER_QUEUE", "NPU_SYNC_FLAGS",
    "DRM_IOCTL_NPU_GET_INFO", "DRM_IOCTL_NPU_BO_CREATE", "DRM_IOCTL_NPU_BO_DESTROY",
    "DRM_IOCTL_NPU_SUBMIT",
    "DRM_IOCTL_NPU_WAIT", "DRM_IOCTL_NPU_BO_USERPTR", "DRM_IOCTL_NPU_FENCE_INFO",
    "DRM_IOCTL_NPU_QUEUE_CREATE", "DRM_IOCTL_NPU_QUEUE_DESTROY",
    "NPU_BO_USERPTR_READONLY", "NPU_BO_USERPTR_FLAGS",
]  # fmt: skip


def _c_program() -> str:
    lines = [
        "#include <stddef.h>",
        "#include <stdio.h>",
        '#include "npu_hw.h"',
        '#include "npu_uapi.h"',
        '#include "npu_tensor.h"',
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
    for name in CONSTANTS:
        lines.append(f'  printf("const {name} %llu\\n", (unsigned long long)({name}));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], int]:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is not installed (scripts/deps.sh installs build-essential)")
    work = tmp_path_factory.mktemp("abi")
    src, exe = work / "layout.c", work / "layout"
    src.write_text(_c_program())
    subprocess.run(
        [
            gcc,
            "-std=gnu11",
            "-Wall",
            "-Werror",
            "-I",
            str(REPO / "include"),
            "-o",
            str(exe),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
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


# The uapi's basic types for an i386 compile without 32-bit libc or kernel
# headers installed: as <asm-generic/int-ll64.h> and <linux/types.h> (the
# __le types, plain integers outside sparse) define them.
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


def test_uapi_layout_is_the_same_for_32_bit_callers(
    tmp_path: Path, c_layout: dict[tuple[str, ...], int]
) -> None:
    """Compiled with -m32 (i386: 8-byte integers 4-aligned), every struct and field
    keeps its x86-64 size and offset, and so every ioctl its number."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is not installed (scripts/deps.sh installs build-essential)")
    (tmp_path / "linux").mkdir()
    (tmp_path / "linux" / "types.h").write_text(_I386_TYPES)
    (tmp_path / "linux" / "ioctl.h").write_text("#include <asm-generic/ioctl.h>\n")
    lines = ["#include <stddef.h>", '#include "npu_hw.h"', '#include "npu_uapi.h"']
    for struct, fields in FIELDS.items():
        size = c_layout[("sizeof", struct)]
        lines.append(f'_Static_assert(sizeof(struct {struct}) == {size}, "{struct} size");')
        for f in fields:
            off = c_layout[("offset", struct, f)]
            lines.append(
                f'_Static_assert(offsetof(struct {struct}, {f}) == {off}, "{struct}.{f}");'
            )
    for name in CONSTANTS:
        if name.startswith("DRM_IOCTL_NPU_"):
            value = c_layout[("const", name)]
            lines.append(f'_Static_assert({name} == {value}u, "{name}");')
    src = tmp_path / "layout32.c"
    src.write_text("\n".join(lines) + "\n")
    gcc_include = subprocess.run(
        [gcc, "-print-file-name=include"], check=True, capture_output=True, text=True
    ).stdout.strip()
    r = subprocess.run(
        [gcc, "-m32", "-std=gnu11", "-Wall", "-Werror", "-fsyntax-only", "-nostdinc",
         "-isystem", gcc_include, "-I", str(tmp_path), "-isystem", "/usr/include",
         "-I", str(REPO / "include"), str(src)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


def _mirror_field(struct: str, designator: str) -> tuple[int, int]:
    """Offset and size of a (possibly dotted) field in the ctypes mirror."""
    ctype: type = _abi.STRUCTS[struct]
    offset = 0
    size = 0
    for part in designator.split("."):
        descriptor = getattr(ctype, part)
        offset += descriptor.offset
        size = descriptor.size
        ctype = dict(_all_fields(ctype))[part]
    return offset, size


def _all_fields(ctype: type) -> list[tuple[str, type]]:
    """Fields of a ctypes struct, with anonymous members flattened as C sees them."""
    fields: list[tuple[str, type]] = []
    anonymous = getattr(ctype, "_anonymous_", ())
    for name, ftype, *_ in ctype._fields_:  # type: ignore[attr-defined]
        if name in anonymous:
            fields.extend(_all_fields(ftype))
        else:
            fields.append((name, ftype))
    return fields


def _mirror_designators(ctype: type, prefix: str = "") -> list[str]:
    names: list[str] = []
    for name, ftype in _all_fields(ctype):
        names.append(prefix + name)
        if isinstance(ftype, type) and issubclass(ftype, ctypes.Structure | ctypes.Union):
            names.extend(_mirror_designators(ftype, f"{prefix}{name}."))
    return names


@pytest.mark.parametrize("struct", sorted(FIELDS))
def test_struct_size_matches_c(struct: str, c_layout: dict[tuple[str, ...], int]) -> None:
    assert ctypes.sizeof(_abi.STRUCTS[struct]) == c_layout[("sizeof", struct)]


@pytest.mark.parametrize(
    ("struct", "field"), [(s, f) for s, fields in FIELDS.items() for f in fields]
)
def test_field_offset_and_size_match_c(
    struct: str, field: str, c_layout: dict[tuple[str, ...], int]
) -> None:
    offset, size = _mirror_field(struct, field)
    assert (offset, size) == (
        c_layout[("offset", struct, field)],
        c_layout[("size", struct, field)],
    )


@pytest.mark.parametrize("struct", sorted(FIELDS))
def test_mirror_has_exactly_the_c_fields(struct: str) -> None:
    assert sorted(_mirror_designators(_abi.STRUCTS[struct])) == sorted(FIELDS[struct])


def test_every_header_struct_is_mirrored() -> None:
    assert set(_abi.STRUCTS) == set(FIELDS)


@pytest.mark.parametrize("name", CONSTANTS)
def test_constant_matches_c(name: str, c_layout: dict[tuple[str, ...], int]) -> None:
    # The program prints every constant as unsigned long long: NPU_ZP_MIN
    # (-128) comes out modulo 2^64.
    assert getattr(_abi, name) % (1 << 64) == c_layout[("const", name)]


def test_every_constant_of_the_headers_is_checked() -> None:
    import re

    defined: set[str] = set()
    for header in ("npu_hw.h", "npu_uapi.h", "npu_tensor.h"):
        text = (REPO / "include" / header).read_text()
        defined |= set(re.findall(r"^#define\s+((?:DRM_(?:IOCTL_)?)?NPU_[A-Z0-9_]+)\s", text, re.M))
        enum_member = (
            r"^\s+(NPU_(?:OP|ST|ERR|DTYPE|ELTWISE|UNARY|REDUCE|SOFTMAX|ACT|POOL)_[A-Z0-9_]+)\b"
        )
        defined |= set(re.findall(enum_member, text, re.M))
    # Register map, BARs, MSI-X, MMU tables and function-like macros are driver/device business.
    driver_only = re.compile(
        r"NPU_(H$|HW_H$|UAPI_H$|TENSOR_H$|BAR|REG_|Q_|QREG|QCTL|QSTAT|DOORBELL|MSIX|VEC_|STATUS_|"
        r"CONTROL_|IRQ_|MMU_|PTE_|PAGE_|FAULT_|INJECT_|FW_|PERF_|TRACE_|TR_)"
    )
    expected = {name for name in defined if not driver_only.match(name)}
    assert expected <= set(CONSTANTS), sorted(expected - set(CONSTANTS))


def test_tensor_op_params_array_matches_c(c_layout: dict[tuple[str, ...], int]) -> None:
    assert c_layout[("size", "npu_tensor_op", "params")] == _abi.TENSOR_OP_PARAMS * 4


def test_every_enum_kind_is_mirrored() -> None:
    assert [k.value for k in _abi.ReduceKind] == list(range(_abi.NPU_REDUCE_COUNT))
    assert [k.value for k in _abi.SoftmaxKind] == list(range(_abi.NPU_SOFTMAX_COUNT))
    assert [k.value for k in _abi.Opcode] == list(range(_abi.NPU_OP_COUNT))
    assert _abi.Cap.REDUCE == _abi.NPU_CAP_REDUCE
    assert [k.value for k in _abi.ActKind] == list(range(_abi.NPU_ACT_COUNT))
    assert _abi.Cap.MATMUL == _abi.NPU_CAP_MATMUL == _abi.NPU_INFO_CAP_MATMUL
    assert _abi.Opcode.MATMUL == _abi.NPU_OP_MATMUL and _abi.Opcode.LINEAR == _abi.NPU_OP_LINEAR
    assert [k.value for k in _abi.PoolKind] == list(range(_abi.NPU_POOL_COUNT))
    assert _abi.Cap.CONV == _abi.NPU_CAP_CONV == _abi.NPU_INFO_CAP_CONV
    assert _abi.Opcode.CONV2D == _abi.NPU_OP_CONV2D and _abi.Opcode.POOL2D == _abi.NPU_OP_POOL2D
    assert _abi.Cap.QUANT == _abi.NPU_CAP_QUANT == _abi.NPU_INFO_CAP_QUANT
    assert _abi.Opcode.REQUANT == _abi.NPU_OP_REQUANT
    assert [s.value for s in _abi.Status] == list(range(_abi.NPU_ST_COUNT))


def test_cmd_is_128_bytes_as_the_ring_requires() -> None:
    assert ctypes.sizeof(_abi.NpuCmd) == 128


def test_cmd_union_members_are_reachable_without_the_union_name() -> None:
    cmd = _abi.NpuCmd()
    cmd.gemm.m = 7
    assert cmd.args.gemm.m == 7
    assert cmd.raw[3] & 0xFFFFFFFF == 7
