"""ctypes mirrors of ``include/npu_hw.h`` and ``include/npu_uapi.h``.

This module is the only place that knows the binary layout of the device
descriptors and of the ``/dev/npuN`` ioctl structures. Every struct, field and
constant of the headers has a counterpart here with the same name minus the
``npu_``/``NPU_`` prefix turned into CamelCase for types (``npu_tensor.h``
defines only inline functions; :func:`npu.ops.check_tensor_op` is the Python
version of its checks); the host test
``tests/host/test_abi_layout.py`` compiles the headers with gcc and checks that
sizes, offsets, constants and ioctl numbers agree.

Hardware structures (``npu_cmd``, ``npu_cpl``, ``npu_fence_wb``) are little
endian by contract; the uapi structures use the native byte order of the host,
as the kernel does.
"""

from __future__ import annotations

import ctypes
import enum
import time
from collections.abc import Callable, Sequence
from typing import Final

from ioctl_opt import IOR, IOW, IOWR

# --------------------------------------------------------------------------
# npu_hw.h: identity and versions
# --------------------------------------------------------------------------

NPU_PCI_VENDOR_ID: Final = 0x1234
NPU_PCI_DEVICE_ID: Final = 0x4E50
NPU_PCI_REVISION: Final = 0x01
NPU_PCI_CLASS: Final = 0x1200

NPU_MAGIC: Final = 0x4E505530
NPU_HW_VERSION: Final = 0x00010000
NPU_ABI_VERSION: Final = 1

# --------------------------------------------------------------------------
# npu_hw.h: capabilities, opcodes, flags, dtypes, limits, status codes
# --------------------------------------------------------------------------

NPU_CAP_COPY: Final = 1 << 0
NPU_CAP_FILL: Final = 1 << 1
NPU_CAP_GEMM_FP32: Final = 1 << 2
NPU_CAP_MSIX: Final = 1 << 3
NPU_CAP_TIMESTAMPS: Final = 1 << 4
NPU_CAP_MMU: Final = 1 << 5
NPU_CAP_TENSOR: Final = 1 << 6
NPU_CAP_REDUCE: Final = 1 << 7
NPU_CAP_MATMUL: Final = 1 << 8
NPU_CAP_CONV: Final = 1 << 9
NPU_CAP_QUANT: Final = 1 << 10
NPU_CAP_LOCAL_MEM: Final = 1 << 11
NPU_CAP_POOL_GEOMETRY: Final = 1 << 12
NPU_CAP_SELECT: Final = 1 << 13
NPU_CAP_STRIDED_OUT: Final = 1 << 14
NPU_CAP_CONV_ACCUMULATE: Final = 1 << 15
NPU_CAP_ACT_RELU6: Final = 1 << 16
NPU_CAP_CONCURRENT: Final = 1 << 17
NPU_CAP_PERF: Final = 1 << 18
NPU_CAP_TRACE: Final = 1 << 19

NPU_NUM_QUEUES: Final = 8
NPU_MAX_QUEUES: Final = 16
NPU_RING_MAX_ENTRIES: Final = 65536

NPU_OP_NOP: Final = 0
NPU_OP_COPY: Final = 1
NPU_OP_FILL: Final = 2
NPU_OP_GEMM: Final = 3
NPU_OP_ELTWISE: Final = 4
NPU_OP_UNARY: Final = 5
NPU_OP_CONVERT: Final = 6
NPU_OP_REDUCE: Final = 7
NPU_OP_SOFTMAX: Final = 8
NPU_OP_LAYERNORM: Final = 9
NPU_OP_MATMUL: Final = 10
NPU_OP_LINEAR: Final = 11
NPU_OP_CONV2D: Final = 12
NPU_OP_POOL2D: Final = 13
NPU_OP_REQUANT: Final = 14
NPU_OP_SIGNAL: Final = 15
NPU_OP_WAIT: Final = 16
NPU_OP_SELECT: Final = 17
NPU_OP_COUNT: Final = 18
#: The tensor opcodes (a ``struct npu_tensor_params`` block each).
TENSOR_OPCODES: Final = frozenset((*range(NPU_OP_ELTWISE, NPU_OP_REQUANT + 1), NPU_OP_SELECT))

NPU_CONV_P_STRIDE_H: Final = 0
NPU_CONV_P_STRIDE_W: Final = 1
NPU_CONV_P_PAD_H: Final = 2
NPU_CONV_P_PAD_W: Final = 3
NPU_CONV_P_DIL_H: Final = 4
NPU_CONV_P_DIL_W: Final = 5
NPU_CONV_P_GROUPS: Final = 6
NPU_CONV_P_IN_ZP: Final = 7
NPU_CONV_P_FLAGS: Final = 8
NPU_CONV_F_ACCUMULATE: Final = 1 << 0
NPU_CONV_F_MASK: Final = 0x1
NPU_MAX_PAD: Final = 65535

NPU_MM_P_IN_ZP: Final = 0
NPU_ZP_MIN: Final = -128
NPU_ZP_MAX: Final = 127
NPU_REQUANT_P_OUT_ZP: Final = 0

NPU_POOL_MAX: Final = 0
NPU_POOL_AVG: Final = 1
NPU_POOL_COUNT: Final = 2

NPU_POOL_P_KH: Final = 0
NPU_POOL_P_KW: Final = 1
NPU_POOL_P_STRIDE_H: Final = 2
NPU_POOL_P_STRIDE_W: Final = 3
NPU_POOL_P_PAD_H: Final = 4
NPU_POOL_P_PAD_W: Final = 5
NPU_POOL_P_FLAGS: Final = 6
NPU_POOL_P_PAD_H_END: Final = 7
NPU_POOL_P_PAD_W_END: Final = 8
NPU_POOL_P_DIL_H: Final = 9
NPU_POOL_P_DIL_W: Final = 10
NPU_POOL_F_COUNT_PAD: Final = 1 << 0
NPU_POOL_F_GEOMETRY: Final = 1 << 1
NPU_POOL_F_CEIL: Final = 1 << 2
NPU_POOL_F_MASK: Final = 0x7

NPU_ACT_NONE: Final = 0
NPU_ACT_RELU: Final = 1
NPU_ACT_GELU: Final = 2
NPU_ACT_RELU6: Final = 3
NPU_ACT_COUNT: Final = 4

NPU_REDUCE_SUM: Final = 0
NPU_REDUCE_MEAN: Final = 1
NPU_REDUCE_MAX: Final = 2
NPU_REDUCE_MIN: Final = 3
NPU_REDUCE_COUNT: Final = 4

NPU_SOFTMAX_SOFTMAX: Final = 0
NPU_SOFTMAX_LOG: Final = 1
NPU_SOFTMAX_COUNT: Final = 2

NPU_ELTWISE_ADD: Final = 0
NPU_ELTWISE_SUB: Final = 1
NPU_ELTWISE_MUL: Final = 2
NPU_ELTWISE_DIV: Final = 3
NPU_ELTWISE_MAX: Final = 4
NPU_ELTWISE_MIN: Final = 5
NPU_ELTWISE_EQ: Final = 6
NPU_ELTWISE_NE: Final = 7
NPU_ELTWISE_LT: Final = 8
NPU_ELTWISE_LE: Final = 9
NPU_ELTWISE_GT: Final = 10
NPU_ELTWISE_GE: Final = 11
NPU_ELTWISE_COUNT: Final = 12

NPU_UNARY_RELU: Final = 0
NPU_UNARY_GELU: Final = 1
NPU_UNARY_SIGMOID: Final = 2
NPU_UNARY_TANH: Final = 3
NPU_UNARY_EXP: Final = 4
NPU_UNARY_LOG: Final = 5
NPU_UNARY_SQRT: Final = 6
NPU_UNARY_ABS: Final = 7
NPU_UNARY_NEG: Final = 8
NPU_UNARY_ERF: Final = 9
NPU_UNARY_RECIPROCAL: Final = 10
NPU_UNARY_COUNT: Final = 11

NPU_CMD_F_IRQ: Final = 1 << 0
NPU_CMD_F_CONCURRENT: Final = 1 << 1
NPU_CMD_F_MASK: Final = NPU_CMD_F_IRQ | NPU_CMD_F_CONCURRENT

NPU_GEMM_TRANS_A: Final = 1 << 0
NPU_GEMM_TRANS_B: Final = 1 << 1
NPU_GEMM_F_MASK: Final = NPU_GEMM_TRANS_A | NPU_GEMM_TRANS_B

NPU_DTYPE_FP32: Final = 0
NPU_DTYPE_FP16: Final = 1
NPU_DTYPE_BF16: Final = 2
NPU_DTYPE_INT8: Final = 3
NPU_DTYPE_INT32: Final = 4
NPU_DTYPE_BOOL: Final = 5
NPU_DTYPE_COUNT: Final = 6

NPU_MAX_RANK: Final = 4
NPU_TENSOR_OPERANDS: Final = 4
NPU_TENSOR_PARAMS: Final = 16
NPU_MAX_STRIDE: Final = 0x7FFFFFFF
NPU_MAX_ELEMS: Final = 1 << 28

NPU_MAX_XFER: Final = 1 << 32
NPU_MAX_DIM: Final = 65536
NPU_MAX_LD: Final = 1 << 24

NPU_ST_OK: Final = 0
NPU_ST_BAD_OPCODE: Final = 1
NPU_ST_BAD_FLAGS: Final = 2
NPU_ST_BAD_RESERVED: Final = 3
NPU_ST_BAD_ARGS: Final = 4
NPU_ST_BAD_ADDR: Final = 5
NPU_ST_DMA_ERROR: Final = 6
NPU_ST_ABORTED: Final = 7
NPU_ST_NO_MEMORY: Final = 8
NPU_ST_MMU_FAULT: Final = 9
NPU_ST_BAD_QUANT: Final = 10
NPU_ST_HW_ERROR: Final = 11
NPU_ST_TIMEOUT: Final = 12
NPU_ST_COUNT: Final = 13

NPU_ERR_NONE: Final = 0
NPU_ERR_RING_OVERRUN: Final = 1
NPU_ERR_RING_FETCH: Final = 2
NPU_ERR_CPL_WRITE: Final = 3
NPU_ERR_BAD_RING: Final = 4
NPU_ERR_MMU_FAULT: Final = 5

# --------------------------------------------------------------------------
# npu_uapi.h: constants
# --------------------------------------------------------------------------

#: DRM's ioctl encoding (DRM_IOCTL_BASE, DRM_COMMAND_BASE of drm.h): the
#: driver's ioctls are DRM driver ioctls of the accel device.
NPU_DRM_IOCTL_BASE: Final = ord("d")
NPU_DRM_COMMAND_BASE: Final = 0x40

NPU_INFO_CAP_COPY: Final = 1 << 0
NPU_INFO_CAP_FILL: Final = 1 << 1
NPU_INFO_CAP_GEMM_FP32: Final = 1 << 2
NPU_INFO_CAP_MSIX: Final = 1 << 3
NPU_INFO_CAP_TIMESTAMPS: Final = 1 << 4
NPU_INFO_CAP_MMU: Final = 1 << 5
NPU_INFO_CAP_TENSOR: Final = 1 << 6
NPU_INFO_CAP_REDUCE: Final = 1 << 7
NPU_INFO_CAP_MATMUL: Final = 1 << 8
NPU_INFO_CAP_CONV: Final = 1 << 9
NPU_INFO_CAP_QUANT: Final = 1 << 10
NPU_INFO_CAP_LOCAL_MEM: Final = 1 << 11
NPU_INFO_CAP_POOL_GEOMETRY: Final = 1 << 12
NPU_INFO_CAP_SELECT: Final = 1 << 13
NPU_INFO_CAP_STRIDED_OUT: Final = 1 << 14
NPU_INFO_CAP_CONV_ACCUMULATE: Final = 1 << 15
NPU_INFO_CAP_ACT_RELU6: Final = 1 << 16
NPU_INFO_CAP_CONCURRENT: Final = 1 << 17
NPU_INFO_CAP_PERF: Final = 1 << 18
NPU_INFO_CAP_TRACE: Final = 1 << 19
NPU_TENSOR_OP_F_CONCURRENT: Final = 1 << 0
NPU_TENSOR_OP_F_MASK: Final = NPU_TENSOR_OP_F_CONCURRENT

NPU_BO_MAX_SIZE: Final = 1 << 30
NPU_OP_MAX_BUFS: Final = 3
NPU_OP_MAX_PARAMS: Final = 8
#: Entries of ``npu_tensor_op.params`` (not a C constant: the array size).
TENSOR_OP_PARAMS: Final = 12
NPU_SUBMIT_MAX_OPS: Final = 256

U32_MAX: Final = (1 << 32) - 1
U64_MAX: Final = (1 << 64) - 1
S64_MAX: Final = (1 << 63) - 1


class Opcode(enum.IntEnum):
    """Operation codes (``enum npu_opcode``)."""

    NOP = NPU_OP_NOP
    COPY = NPU_OP_COPY
    FILL = NPU_OP_FILL
    GEMM = NPU_OP_GEMM
    ELTWISE = NPU_OP_ELTWISE
    UNARY = NPU_OP_UNARY
    CONVERT = NPU_OP_CONVERT
    REDUCE = NPU_OP_REDUCE
    SOFTMAX = NPU_OP_SOFTMAX
    LAYERNORM = NPU_OP_LAYERNORM
    MATMUL = NPU_OP_MATMUL
    LINEAR = NPU_OP_LINEAR
    CONV2D = NPU_OP_CONV2D
    POOL2D = NPU_OP_POOL2D
    REQUANT = NPU_OP_REQUANT
    SIGNAL = NPU_OP_SIGNAL
    WAIT = NPU_OP_WAIT
    SELECT = NPU_OP_SELECT


class EltwiseKind(enum.IntEnum):
    """Kinds of the binary ELTWISE op (``enum npu_eltwise_kind``)."""

    ADD = NPU_ELTWISE_ADD
    SUB = NPU_ELTWISE_SUB
    MUL = NPU_ELTWISE_MUL
    DIV = NPU_ELTWISE_DIV
    MAX = NPU_ELTWISE_MAX
    MIN = NPU_ELTWISE_MIN
    EQ = NPU_ELTWISE_EQ
    NE = NPU_ELTWISE_NE
    LT = NPU_ELTWISE_LT
    LE = NPU_ELTWISE_LE
    GT = NPU_ELTWISE_GT
    GE = NPU_ELTWISE_GE

    @property
    def is_compare(self) -> bool:
        """True for EQ..GE: the output is BOOL (``npu_eltwise_is_compare``)."""
        return self >= EltwiseKind.EQ


class UnaryKind(enum.IntEnum):
    """Kinds of the UNARY op (``enum npu_unary_kind``); GELU..SQRT are float-only."""

    RELU = NPU_UNARY_RELU
    GELU = NPU_UNARY_GELU
    SIGMOID = NPU_UNARY_SIGMOID
    TANH = NPU_UNARY_TANH
    EXP = NPU_UNARY_EXP
    LOG = NPU_UNARY_LOG
    SQRT = NPU_UNARY_SQRT
    ABS = NPU_UNARY_ABS
    NEG = NPU_UNARY_NEG
    ERF = NPU_UNARY_ERF
    RECIPROCAL = NPU_UNARY_RECIPROCAL


class ReduceKind(enum.IntEnum):
    """Kinds of the REDUCE op (``enum npu_reduce_kind``); MEAN is float-only."""

    SUM = NPU_REDUCE_SUM
    MEAN = NPU_REDUCE_MEAN
    MAX = NPU_REDUCE_MAX
    MIN = NPU_REDUCE_MIN


class SoftmaxKind(enum.IntEnum):
    """Kinds of the SOFTMAX op (``enum npu_softmax_kind``)."""

    SOFTMAX = NPU_SOFTMAX_SOFTMAX
    LOG = NPU_SOFTMAX_LOG


class PoolKind(enum.IntEnum):
    """Kinds of the POOL2D op (``enum npu_pool_kind``)."""

    MAX = NPU_POOL_MAX
    AVG = NPU_POOL_AVG


class ActKind(enum.IntEnum):
    """Activations of MATMUL, LINEAR and CONV2D, applied last (``enum npu_act_kind``).

    GELU is the exact (erf) form; RELU6 is ``min(max(x, 0), 6)`` (needs
    ``Cap.ACT_RELU6``).
    """

    NONE = NPU_ACT_NONE
    RELU = NPU_ACT_RELU
    GELU = NPU_ACT_GELU
    RELU6 = NPU_ACT_RELU6


class Status(enum.IntEnum):
    """Device completion status codes (``enum npu_status``, ``NPU_ST_*``)."""

    OK = NPU_ST_OK
    BAD_OPCODE = NPU_ST_BAD_OPCODE
    BAD_FLAGS = NPU_ST_BAD_FLAGS
    BAD_RESERVED = NPU_ST_BAD_RESERVED
    BAD_ARGS = NPU_ST_BAD_ARGS
    BAD_ADDR = NPU_ST_BAD_ADDR
    DMA_ERROR = NPU_ST_DMA_ERROR
    ABORTED = NPU_ST_ABORTED
    NO_MEMORY = NPU_ST_NO_MEMORY
    MMU_FAULT = NPU_ST_MMU_FAULT
    BAD_QUANT = NPU_ST_BAD_QUANT
    HW_ERROR = NPU_ST_HW_ERROR
    TIMEOUT = NPU_ST_TIMEOUT


class DevError(enum.IntEnum):
    """Queue-level device errors (``enum npu_dev_error``, ``NPU_ERR_*``)."""

    NONE = NPU_ERR_NONE
    RING_OVERRUN = NPU_ERR_RING_OVERRUN
    RING_FETCH = NPU_ERR_RING_FETCH
    CPL_WRITE = NPU_ERR_CPL_WRITE
    BAD_RING = NPU_ERR_BAD_RING
    MMU_FAULT = NPU_ERR_MMU_FAULT


class Cap(enum.IntFlag):
    """Capability bits reported by GET_INFO (``NPU_INFO_CAP_*``)."""

    COPY = NPU_INFO_CAP_COPY
    FILL = NPU_INFO_CAP_FILL
    GEMM_FP32 = NPU_INFO_CAP_GEMM_FP32
    MSIX = NPU_INFO_CAP_MSIX
    TIMESTAMPS = NPU_INFO_CAP_TIMESTAMPS
    MMU = NPU_INFO_CAP_MMU
    TENSOR = NPU_INFO_CAP_TENSOR
    REDUCE = NPU_INFO_CAP_REDUCE
    MATMUL = NPU_INFO_CAP_MATMUL
    CONV = NPU_INFO_CAP_CONV
    QUANT = NPU_INFO_CAP_QUANT
    LOCAL_MEM = NPU_INFO_CAP_LOCAL_MEM
    POOL_GEOMETRY = NPU_INFO_CAP_POOL_GEOMETRY
    SELECT = NPU_INFO_CAP_SELECT
    STRIDED_OUT = NPU_INFO_CAP_STRIDED_OUT
    CONV_ACCUMULATE = NPU_INFO_CAP_CONV_ACCUMULATE
    ACT_RELU6 = NPU_INFO_CAP_ACT_RELU6
    CONCURRENT = NPU_INFO_CAP_CONCURRENT
    PERF = NPU_INFO_CAP_PERF
    TRACE = NPU_INFO_CAP_TRACE

    def __str__(self) -> str:
        """Names of the set bits, e.g. ``"COPY|FILL"`` (``"0"`` if none)."""
        names = [cap.name for cap in Cap if cap.name and cap in self]
        return "|".join(names) or "0"


class DType(enum.IntEnum):
    """Element types (``enum npu_dtype``): GEMM takes FP32, tensor ops all of them.

    MATMUL, LINEAR, CONV2D and POOL2D take the float ones (FP32, FP16, BF16);
    MATMUL, LINEAR and CONV2D also INT8 operands (``Cap.QUANT``: int32
    accumulation, INT32 bias, INT32 or INT8 output), and REQUANT maps INT32
    to INT8 with FP32 scales.
    """

    FP32 = NPU_DTYPE_FP32
    FP16 = NPU_DTYPE_FP16
    BF16 = NPU_DTYPE_BF16
    INT8 = NPU_DTYPE_INT8
    INT32 = NPU_DTYPE_INT32
    BOOL = NPU_DTYPE_BOOL

    @property
    def itemsize(self) -> int:
        """Bytes per element (``npu_dtype_size``)."""
        return _DTYPE_SIZES[self]

    @property
    def is_float(self) -> bool:
        """True for FP32, FP16 and BF16 (``npu_dtype_is_float``)."""
        return self in (DType.FP32, DType.FP16, DType.BF16)


_DTYPE_SIZES: Final = {
    DType.FP32: 4,
    DType.FP16: 2,
    DType.BF16: 2,
    DType.INT8: 1,
    DType.INT32: 4,
    DType.BOOL: 1,
}


def status_name(status: int) -> str:
    """Return the C name of a completion status, e.g. ``"NPU_ST_BAD_ARGS"``.

    Unknown values are rendered as ``"NPU_ST_UNKNOWN(<n>)"``.
    """
    try:
        return f"NPU_ST_{Status(status).name}"
    except ValueError:
        return f"NPU_ST_UNKNOWN({status})"


# --------------------------------------------------------------------------
# npu_hw.h: structures (little endian)
# --------------------------------------------------------------------------


class NpuCmdCopy(ctypes.LittleEndianStructure):
    """``npu_cmd.copy``."""

    _fields_ = [
        ("src", ctypes.c_uint64),
        ("dst", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
    ]


class NpuCmdFill(ctypes.LittleEndianStructure):
    """``npu_cmd.fill``."""

    _fields_ = [
        ("dst", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
        ("pattern", ctypes.c_uint32),
        ("rsvd", ctypes.c_uint32),
    ]


class NpuCmdGemm(ctypes.LittleEndianStructure):
    """``npu_cmd.gemm``."""

    _fields_ = [
        ("a", ctypes.c_uint64),
        ("b", ctypes.c_uint64),
        ("c", ctypes.c_uint64),
        ("m", ctypes.c_uint32),
        ("n", ctypes.c_uint32),
        ("k", ctypes.c_uint32),
        ("lda", ctypes.c_uint32),
        ("ldb", ctypes.c_uint32),
        ("ldc", ctypes.c_uint32),
        ("dtype", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
    ]


class NpuCmdTensor(ctypes.LittleEndianStructure):
    """``npu_cmd.tensor``: the tensor ops (ELTWISE .. POOL2D)."""

    _fields_ = [
        ("params", ctypes.c_uint64),
        ("kind", ctypes.c_uint32),
        ("rsvd", ctypes.c_uint32),
    ]


class NpuCmdSync(ctypes.LittleEndianStructure):
    """``npu_cmd.sync``: SIGNAL and WAIT (a 64-bit value at a device VA)."""

    _fields_ = [
        ("va", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
    ]


class NpuCmdArgs(ctypes.LittleEndianUnion):
    """The anonymous union of ``struct npu_cmd``."""

    _fields_ = [
        ("copy", NpuCmdCopy),
        ("fill", NpuCmdFill),
        ("gemm", NpuCmdGemm),
        ("sync", NpuCmdSync),
        ("tensor", NpuCmdTensor),
        ("raw", ctypes.c_uint64 * 14),
    ]


class NpuCmd(ctypes.LittleEndianStructure):
    """``struct npu_cmd``: a 128-byte ring descriptor.

    The C union is anonymous, so its members are reachable directly
    (``cmd.gemm.m``) as well as through ``cmd.args``.
    """

    _anonymous_ = ("args",)
    _fields_ = [
        ("opcode", ctypes.c_uint16),
        ("flags", ctypes.c_uint16),
        ("ctx", ctypes.c_uint16),
        ("rsvd0", ctypes.c_uint16),
        ("fence", ctypes.c_uint64),
        ("args", NpuCmdArgs),
    ]


class NpuHwTensor(ctypes.LittleEndianStructure):
    """``struct npu_hw_tensor``: a tensor operand in a parameter block."""

    _fields_ = [
        ("va", ctypes.c_uint64),
        ("dtype", ctypes.c_uint32),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_uint32 * NPU_MAX_RANK),
        ("strides", ctypes.c_uint32 * NPU_MAX_RANK),
    ]


class NpuTensorParams(ctypes.LittleEndianStructure):
    """``struct npu_tensor_params``: the 256-byte parameter block of a tensor op."""

    _fields_ = [
        ("t", NpuHwTensor * NPU_TENSOR_OPERANDS),
        ("params", ctypes.c_uint32 * NPU_TENSOR_PARAMS),
    ]


class NpuCpl(ctypes.LittleEndianStructure):
    """``struct npu_cpl``: a 32-byte completion record."""

    _fields_ = [
        ("fence", ctypes.c_uint64),
        ("status", ctypes.c_uint32),
        ("opcode", ctypes.c_uint16),
        ("rsvd", ctypes.c_uint16),
        ("t_start", ctypes.c_uint64),
        ("t_end", ctypes.c_uint64),
    ]


class NpuFenceWb(ctypes.LittleEndianStructure):
    """``struct npu_fence_wb``: the fence write-back record."""

    _fields_ = [
        ("value", ctypes.c_uint64),
        ("timestamp", ctypes.c_uint64),
    ]


# --------------------------------------------------------------------------
# npu_uapi.h: structures (native byte order)
# --------------------------------------------------------------------------


class NpuInfo(ctypes.Structure):
    """``struct npu_info`` (GET_INFO)."""

    _fields_ = [
        ("hw_version", ctypes.c_uint32),
        ("abi_version", ctypes.c_uint32),
        ("driver_version", ctypes.c_uint32),
        ("caps", ctypes.c_uint32),
        ("num_queues", ctypes.c_uint32),
        ("num_cores", ctypes.c_uint32),
        ("max_submit", ctypes.c_uint32),
        ("ring_entries", ctypes.c_uint32),
        ("max_bo_size", ctypes.c_uint64),
        ("pci_vendor", ctypes.c_uint16),
        ("pci_device", ctypes.c_uint16),
        ("user_queues", ctypes.c_uint32),
        ("device_memory", ctypes.c_uint64),
        ("rsvd", ctypes.c_uint32 * 2),
    ]


#: BO_CREATE flag: place the buffer in device memory (BAR2).
NPU_BO_DEVICE: Final = 1 << 0
NPU_BO_CREATE_FLAGS: Final = NPU_BO_DEVICE


class NpuBoCreate(ctypes.Structure):
    """``struct npu_bo_create`` (BO_CREATE)."""

    _fields_ = [
        ("size", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("handle", ctypes.c_uint32),
        ("mmap_offset", ctypes.c_uint64),
        ("alloc_size", ctypes.c_uint64),
        ("va", ctypes.c_uint64),
    ]


class NpuBoDestroy(ctypes.Structure):
    """``struct npu_bo_destroy`` (BO_DESTROY)."""

    _fields_ = [
        ("handle", ctypes.c_uint32),
        ("rsvd", ctypes.c_uint32),
    ]


class NpuFenceInfo(ctypes.Structure):
    """``struct npu_fence_info`` (FENCE_INFO: a completed op's timestamps)."""

    _fields_ = [
        ("fence", ctypes.c_uint64),
        ("queue", ctypes.c_uint32),
        ("status", ctypes.c_uint32),
        ("t_start", ctypes.c_uint64),
        ("t_end", ctypes.c_uint64),
    ]


#: BO_USERPTR flag: the device may only read the memory.
NPU_BO_USERPTR_READONLY: Final = 1 << 0
NPU_BO_USERPTR_FLAGS: Final = NPU_BO_USERPTR_READONLY


class NpuBoUserptr(ctypes.Structure):
    """``struct npu_bo_userptr`` (BO_USERPTR: pinned user memory as a BO)."""

    _fields_ = [
        ("addr", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("handle", ctypes.c_uint32),
        ("va", ctypes.c_uint64),
    ]


#: QUEUE_CREATE limits: ring entries (a power of two) and the highest
#: priority without CAP_SYS_NICE.
NPU_QUEUE_MIN_ENTRIES: Final = 16
NPU_QUEUE_MAX_ENTRIES: Final = 4096
NPU_QUEUE_PRIORITY_USER: Final = 1


class NpuQueueCreate(ctypes.Structure):
    """``struct npu_queue_create`` (QUEUE_CREATE: a user-mode queue)."""

    _fields_ = [
        ("entries", ctypes.c_uint32),
        ("priority", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("queue", ctypes.c_uint32),
        ("mem_offset", ctypes.c_uint64),
        ("mem_size", ctypes.c_uint64),
        ("cpl_offset", ctypes.c_uint64),
        ("fence_offset", ctypes.c_uint64),
        ("doorbell_offset", ctypes.c_uint64),
    ]


NPU_BO_INFO_DEVICE: Final = 1 << 0
NPU_BO_INFO_USERPTR: Final = 1 << 1
NPU_BO_INFO_IMPORTED: Final = 1 << 2
NPU_BO_INFO_READONLY: Final = 1 << 3


class NpuBoInfo(ctypes.Structure):
    """``struct npu_bo_info`` (BO_INFO: size, mmap offset and VA of a handle)."""

    _fields_ = [
        ("handle", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("size", ctypes.c_uint64),
        ("mmap_offset", ctypes.c_uint64),
        ("va", ctypes.c_uint64),
    ]


class DrmPrimeHandle(ctypes.Structure):
    """``struct drm_prime_handle`` (drm.h: PRIME_HANDLE_TO_FD, PRIME_FD_TO_HANDLE)."""

    _fields_ = [
        ("handle", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("fd", ctypes.c_int32),
    ]


class DrmGemClose(ctypes.Structure):
    """``struct drm_gem_close`` (drm.h: GEM_CLOSE)."""

    _fields_ = [
        ("handle", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class NpuQueueDestroy(ctypes.Structure):
    """``struct npu_queue_destroy`` (QUEUE_DESTROY)."""

    _fields_ = [
        ("queue", ctypes.c_uint32),
        ("rsvd", ctypes.c_uint32),
    ]


class NpuBufRef(ctypes.Structure):
    """``struct npu_buf_ref``: a byte range of a buffer object."""

    _fields_ = [
        ("handle", ctypes.c_uint32),
        ("rsvd", ctypes.c_uint32),
        ("offset", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
    ]


class NpuOp(ctypes.Structure):
    """``struct npu_op``: one operation of a SUBMIT."""

    _fields_ = [
        ("opcode", ctypes.c_uint16),
        ("flags", ctypes.c_uint16),
        ("num_bufs", ctypes.c_uint32),
        ("bufs", NpuBufRef * NPU_OP_MAX_BUFS),
        ("params", ctypes.c_uint32 * NPU_OP_MAX_PARAMS),
        ("rsvd", ctypes.c_uint64),
    ]


class NpuTensorRef(ctypes.Structure):
    """``struct npu_tensor_ref``: a strided view into a buffer object (64 bytes)."""

    _fields_ = [
        ("handle", ctypes.c_uint32),
        ("dtype", ctypes.c_uint32),
        ("offset", ctypes.c_uint64),
        ("ndim", ctypes.c_uint32),
        ("rsvd", ctypes.c_uint32),
        ("shape", ctypes.c_uint32 * NPU_MAX_RANK),
        ("strides", ctypes.c_uint32 * NPU_MAX_RANK),
        ("rsvd2", ctypes.c_uint64),
    ]


class NpuTensorOp(ctypes.Structure):
    """``struct npu_tensor_op``: one tensor op of a SUBMIT (320 bytes)."""

    _fields_ = [
        ("opcode", ctypes.c_uint16),
        ("flags", ctypes.c_uint16),
        ("kind", ctypes.c_uint32),
        ("t", NpuTensorRef * NPU_TENSOR_OPERANDS),
        ("params", ctypes.c_uint32 * TENSOR_OP_PARAMS),
        ("rsvd", ctypes.c_uint64),
    ]


NPU_SYNC_USER_QUEUE: Final = 1 << 0
NPU_SYNC_FLAGS: Final = NPU_SYNC_USER_QUEUE
NPU_SUBMIT_MAX_SYNCS: Final = 16


class NpuSync(ctypes.Structure):
    """``struct npu_sync``: a SUBMIT dependency (a syncobj point or a user-queue fence)."""

    _fields_ = [
        ("handle", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("point", ctypes.c_uint64),
    ]


class NpuSubmit(ctypes.Structure):
    """``struct npu_submit`` (SUBMIT): ops, dependencies and an out syncobj."""

    _fields_ = [
        ("ops_ptr", ctypes.c_uint64),
        ("num_ops", ctypes.c_uint32),
        ("queue", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("op_size", ctypes.c_uint32),
        ("fence", ctypes.c_uint64),
        ("in_syncs", ctypes.c_uint64),
        ("num_in_syncs", ctypes.c_uint32),
        ("out_syncobj", ctypes.c_uint32),
        ("out_point", ctypes.c_uint64),
    ]


class NpuWait(ctypes.Structure):
    """``struct npu_wait`` (WAIT); ``deadline_ns`` is CLOCK_MONOTONIC (:func:`deadline_after`)."""

    _fields_ = [
        ("fence", ctypes.c_uint64),
        ("deadline_ns", ctypes.c_int64),
        ("queue", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("status", ctypes.c_uint32),
        ("rsvd", ctypes.c_uint32),
        ("error_fence", ctypes.c_uint64),
    ]


#: C struct name -> ctypes mirror, for introspection and the layout test.
STRUCTS: Final[dict[str, type[ctypes.Structure] | type[ctypes.Union]]] = {
    "npu_cmd": NpuCmd,
    "npu_cpl": NpuCpl,
    "npu_fence_wb": NpuFenceWb,
    "npu_hw_tensor": NpuHwTensor,
    "npu_tensor_params": NpuTensorParams,
    "npu_info": NpuInfo,
    "npu_bo_create": NpuBoCreate,
    "npu_bo_destroy": NpuBoDestroy,
    "npu_bo_userptr": NpuBoUserptr,
    "npu_fence_info": NpuFenceInfo,
    "npu_buf_ref": NpuBufRef,
    "npu_op": NpuOp,
    "npu_tensor_ref": NpuTensorRef,
    "npu_tensor_op": NpuTensorOp,
    "npu_submit": NpuSubmit,
    "npu_sync": NpuSync,
    "npu_wait": NpuWait,
    "npu_queue_create": NpuQueueCreate,
    "npu_queue_destroy": NpuQueueDestroy,
    "npu_bo_info": NpuBoInfo,
}

# --------------------------------------------------------------------------
# npu_uapi.h: ioctl request numbers
# --------------------------------------------------------------------------

DRM_NPU_GET_INFO: Final = 0x00
DRM_NPU_BO_CREATE: Final = 0x01
DRM_NPU_BO_DESTROY: Final = 0x02
DRM_NPU_SUBMIT: Final = 0x03
DRM_NPU_WAIT: Final = 0x04
DRM_NPU_BO_USERPTR: Final = 0x05
DRM_NPU_FENCE_INFO: Final = 0x06
DRM_NPU_QUEUE_CREATE: Final = 0x07
DRM_NPU_QUEUE_DESTROY: Final = 0x08
DRM_NPU_BO_INFO: Final = 0x09


def _drm(direction: Callable[[int, int, object], int], nr: int, struct: type) -> int:
    return int(direction(NPU_DRM_IOCTL_BASE, NPU_DRM_COMMAND_BASE + nr, struct))


DRM_IOCTL_NPU_GET_INFO: Final[int] = _drm(IOR, DRM_NPU_GET_INFO, NpuInfo)
DRM_IOCTL_NPU_BO_CREATE: Final[int] = _drm(IOWR, DRM_NPU_BO_CREATE, NpuBoCreate)
DRM_IOCTL_NPU_BO_DESTROY: Final[int] = _drm(IOW, DRM_NPU_BO_DESTROY, NpuBoDestroy)
DRM_IOCTL_NPU_SUBMIT: Final[int] = _drm(IOWR, DRM_NPU_SUBMIT, NpuSubmit)
DRM_IOCTL_NPU_WAIT: Final[int] = _drm(IOWR, DRM_NPU_WAIT, NpuWait)
DRM_IOCTL_NPU_BO_USERPTR: Final[int] = _drm(IOWR, DRM_NPU_BO_USERPTR, NpuBoUserptr)
DRM_IOCTL_NPU_FENCE_INFO: Final[int] = _drm(IOWR, DRM_NPU_FENCE_INFO, NpuFenceInfo)
DRM_IOCTL_NPU_QUEUE_CREATE: Final[int] = _drm(IOWR, DRM_NPU_QUEUE_CREATE, NpuQueueCreate)
DRM_IOCTL_NPU_QUEUE_DESTROY: Final[int] = _drm(IOW, DRM_NPU_QUEUE_DESTROY, NpuQueueDestroy)
DRM_IOCTL_NPU_BO_INFO: Final[int] = _drm(IOWR, DRM_NPU_BO_INFO, NpuBoInfo)

# DRM core ioctls (drm.h) the driver serves: GEM handles and PRIME dma-bufs.
DRM_CLOEXEC: Final = 0o2000000  # O_CLOEXEC
DRM_RDWR: Final = 0o2  # O_RDWR
DRM_IOCTL_GEM_CLOSE: Final[int] = int(IOW(NPU_DRM_IOCTL_BASE, 0x09, DrmGemClose))
DRM_IOCTL_PRIME_HANDLE_TO_FD: Final[int] = int(IOWR(NPU_DRM_IOCTL_BASE, 0x2D, DrmPrimeHandle))
DRM_IOCTL_PRIME_FD_TO_HANDLE: Final[int] = int(IOWR(NPU_DRM_IOCTL_BASE, 0x2E, DrmPrimeHandle))


class DrmSyncobjCreate(ctypes.Structure):
    """``struct drm_syncobj_create`` (drm.h: SYNCOBJ_CREATE)."""

    _fields_ = [("handle", ctypes.c_uint32), ("flags", ctypes.c_uint32)]


class DrmSyncobjDestroy(ctypes.Structure):
    """``struct drm_syncobj_destroy`` (drm.h: SYNCOBJ_DESTROY)."""

    _fields_ = [("handle", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class DrmSyncobjHandle(ctypes.Structure):
    """``struct drm_syncobj_handle`` (drm.h: SYNCOBJ_HANDLE_TO_FD, SYNCOBJ_FD_TO_HANDLE).

    Without the ``point`` member of later kernels: DRM zero-extends it.
    """

    _fields_ = [
        ("handle", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("fd", ctypes.c_int32),
        ("pad", ctypes.c_uint32),
    ]


class DrmSyncobjTimelineWait(ctypes.Structure):
    """``struct drm_syncobj_timeline_wait`` (drm.h: SYNCOBJ_TIMELINE_WAIT); the
    timeout is an absolute CLOCK_MONOTONIC time."""

    _fields_ = [
        ("handles", ctypes.c_uint64),
        ("points", ctypes.c_uint64),
        ("timeout_nsec", ctypes.c_int64),
        ("count_handles", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("first_signaled", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class DrmSyncobjTimelineArray(ctypes.Structure):
    """``struct drm_syncobj_timeline_array`` (drm.h: SYNCOBJ_QUERY, SYNCOBJ_TIMELINE_SIGNAL)."""

    _fields_ = [
        ("handles", ctypes.c_uint64),
        ("points", ctypes.c_uint64),
        ("count_handles", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
    ]


DRM_SYNCOBJ_CREATE_SIGNALED: Final = 1 << 0
DRM_SYNCOBJ_HANDLE_TO_FD_FLAGS_EXPORT_SYNC_FILE: Final = 1 << 0
DRM_SYNCOBJ_FD_TO_HANDLE_FLAGS_IMPORT_SYNC_FILE: Final = 1 << 0
DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL: Final = 1 << 0
DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT: Final = 1 << 1
DRM_IOCTL_SYNCOBJ_CREATE: Final[int] = int(IOWR(NPU_DRM_IOCTL_BASE, 0xBF, DrmSyncobjCreate))
DRM_IOCTL_SYNCOBJ_DESTROY: Final[int] = int(IOWR(NPU_DRM_IOCTL_BASE, 0xC0, DrmSyncobjDestroy))
DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD: Final[int] = int(IOWR(NPU_DRM_IOCTL_BASE, 0xC1, DrmSyncobjHandle))
DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE: Final[int] = int(IOWR(NPU_DRM_IOCTL_BASE, 0xC2, DrmSyncobjHandle))
DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT: Final[int] = int(
    IOWR(NPU_DRM_IOCTL_BASE, 0xCA, DrmSyncobjTimelineWait)
)
DRM_IOCTL_SYNCOBJ_QUERY: Final[int] = int(IOWR(NPU_DRM_IOCTL_BASE, 0xCB, DrmSyncobjTimelineArray))
DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL: Final[int] = int(
    IOWR(NPU_DRM_IOCTL_BASE, 0xCD, DrmSyncobjTimelineArray)
)


def strides_disjoint(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """``npu_tensor_is_disjoint``: no two elements of a strided view share an address.

    Sorted by stride, each dim of size > 1 must step past the extent of the
    smaller ones (what a strided CONVERT output must be).
    """
    extent = 0
    for stride, dim in sorted((s, d) for d, s in zip(shape, strides, strict=True) if d > 1):
        if stride <= extent:
            return False
        extent += (dim - 1) * stride
    return True


def deadline_after(timeout_ns: int) -> int:
    """The ``npu_wait.deadline_ns`` ``timeout_ns`` from now (CLOCK_MONOTONIC, as the driver's)."""
    return min(time.monotonic_ns() + timeout_ns, S64_MAX)
