"""How fast the engine parks: every opcode's worst case against every control event.

The device promises (docs/npu-spec.md 11, 12.1, 13) that a reset, a system
reset, a move to D3hot, a VM stop, the ``cmd-budget-ms`` budget and a
preempting higher-priority command each wait for at most one control
point's work of the running command, whatever the command; and that the
host memory of the commands in flight stays within ``mem-budget``. This
module builds, for every opcode, the command the validator accepts whose
single units of work between two control points are the largest it can make
(while the whole command still ends within seconds, so that a missing
control point shows as a long wait rather than a hang), and measures each
event's host latency against it, and QEMU's peak RSS against the budget.

Guest RAM stays small: with the device MMU on, every VA from 2 MiB to 4 GiB
maps one read-only page of fp32 ones (``IN_PAGE``) and every VA from 4 GiB to
8 GiB one writable page (``OUT_PAGE``); operands are stride-0 views of the
input page or huge tensors over those aliased windows, so a 4 GiB FILL or a
2^28-element output costs one page of RAM. Through aliased tables every
page of a transfer is a separate translation (a strided CONVERT store
re-walks the tables per element), the most a guest can make the MMU cost.

Used by ``test_device_qtest_park.py`` (ASan build, generous bounds) and
``scripts/bench_engine.py`` (release build, the 10 ms target).
"""

from __future__ import annotations

import contextlib
import statistics
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from qtest import (
    CPL_SIZE,
    DATA,
    Npu,
    QTestError,
    cmd,
    copy,
    fill,
    gemm,
    hw,
    hw_tensor,
    nop,
    queue_fence,
    queue_ring,
    setup_queue,
    tensor,
    tensor_params,
)

# -- guest layout -------------------------------------------------------------

L1 = DATA  # 4096 entries (32 KiB): the whole 8 GiB of VA
LOW_L2 = DATA + 0x1_0000  # VA [0, 2 MiB): the pages below
IN_L2 = DATA + 0x2_0000  # every entry -> IN_PAGE, read-only
OUT_L2 = DATA + 0x3_0000  # every entry -> OUT_PAGE, writable
IN_PAGE = DATA + 0x4_0000  # fp32 1.0 (also a finite scale > 0; cond bytes 0)
OUT_PAGE = DATA + 0x5_0000
PARAMS_PAGE = DATA + 0x6_0000
SYNC_PAGE = DATA + 0x7_0000  # a WAIT's value (0, never reached) and a SIGNAL's

VA_SMALL = 0x1000  # IN_PAGE: the stride-0 operands
VA_PARAMS = 0x2000  # PARAMS_PAGE
VA_SYNC = 0x3000  # SYNC_PAGE
VA_IN = 0x20_0000  # [2 MiB, 4 GiB): IN_PAGE everywhere
VA_OUT = 1 << 32  # [4 GiB, 8 GiB): OUT_PAGE everywhere
VA_END = 1 << 33
PRIO_Q = 3  # the preempting queue (priority 3; queue 0 has 0)

MiB = 1 << 20
GiB = 1 << 30

# A wait this long means the device did not park (a missing control point);
# the cell reads this and the QEMU is replaced.
GIVE_UP_S = 20.0
UNTOUCHED = 0xEEEE_EEEE_EEEE_EEEE  # a completion record the device did not write

EVENTS = ("reset", "system_reset", "d3hot", "vm_stop", "budget", "preempt")
PCI_CAP_ID_PM = 0x01
PCI_PM_CTRL = 4
D0, D3HOT = 0, 3


def _f32(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def _dense(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def _t(
    va: int, dtype: int, shape: tuple[int, ...], strides: tuple[int, ...] | None = None
) -> bytes:
    """An operand: dense when ``strides`` is None, else those strides."""
    return hw_tensor(va, dtype, shape, _dense(shape) if strides is None else strides)


def _bcast(dtype: int, shape: tuple[int, ...]) -> bytes:
    """A stride-0 view of IN_PAGE of ``shape``: one element, repeated."""
    return hw_tensor(VA_SMALL, dtype, shape, (0,) * len(shape))


# -- the worst case of each opcode --------------------------------------------


@dataclass(frozen=True)
class Worst:
    """An opcode's worst-case command: ``build(npu, fence)`` writes what it
    needs into the guest and returns its descriptor."""

    opcode: str
    build: Callable[[Npu, int], bytes]
    why: str
    # The command runs until an event stops it (False: it completes at
    # once, NOP and SIGNAL, and the events hit an idle device after it).
    runs: bool = True
    blocks: bool = False  # it waits (WAIT): Q_STATUS.WAITING, not ACTIVE
    settle: float = 0.15  # host seconds it runs before the event: past its set-up
    # The device's cmd-budget-ms: past settle and the event, and a third or
    # less of the whole run on a quiet host (ASan), where commands run fastest.
    budget_ms: int = 1500


def _tensor_op(npu: Npu, fence: int, op: int, kind: int, params: bytes) -> bytes:
    npu.qt.memwrite(PARAMS_PAGE, params)
    return tensor(op, VA_PARAMS, kind, fence=fence)


def _nop(npu: Npu, fence: int) -> bytes:
    return nop(fence)


def _copy(npu: Npu, fence: int) -> bytes:
    return copy(VA_IN, VA_OUT, 2 * GiB, fence)


def _fill(npu: Npu, fence: int) -> bytes:
    return fill(VA_OUT, VA_END - VA_OUT, 0x5A5A_5A5A, fence)


GEMM_N = 4096


def _gemm(npu: Npu, fence: int) -> bytes:
    n = GEMM_N
    return gemm(VA_IN, VA_IN + n * n * 4, VA_OUT, n, n, n, n, n, n, fence=fence)


BIG = 1 << 28  # NPU_MAX_ELEMS


def _eltwise(npu: Npu, fence: int) -> bytes:
    shape = (BIG,)
    x = _bcast(hw.DTYPE_FP32, shape)
    p = tensor_params([x, x, _t(VA_OUT, hw.DTYPE_FP32, shape)])
    return _tensor_op(npu, fence, hw.OP_ELTWISE, hw.ELTWISE_DIV, p)


def _unary(npu: Npu, fence: int) -> bytes:
    shape = (BIG,)
    p = tensor_params([_bcast(hw.DTYPE_FP32, shape), _t(VA_OUT, hw.DTYPE_FP32, shape)])
    return _tensor_op(npu, fence, hw.OP_UNARY, hw.UNARY_ERF, p)


CONVERT_ROW = 1 << 24


def _convert(npu: Npu, fence: int) -> bytes:
    # A strided output through aliased tables: each 1-byte store is a walk.
    shape = (4, CONVERT_ROW)
    out = _t(VA_OUT, hw.DTYPE_INT8, shape, (2 * CONVERT_ROW, 2))
    p = tensor_params([_bcast(hw.DTYPE_FP32, shape), out])
    return _tensor_op(npu, fence, hw.OP_CONVERT, 0, p)


def _reduce(npu: Npu, fence: int) -> bytes:
    p = tensor_params([_bcast(hw.DTYPE_FP32, (BIG,)), _t(VA_OUT, hw.DTYPE_FP32, (1,))], [1])
    return _tensor_op(npu, fence, hw.OP_REDUCE, hw.REDUCE_SUM, p)


SLICE = 1 << 25


def _softmax(npu: Npu, fence: int) -> bytes:
    shape = (SLICE,)
    p = tensor_params([_bcast(hw.DTYPE_FP32, shape), _t(VA_OUT, hw.DTYPE_FP32, shape)], [0])
    return _tensor_op(npu, fence, hw.OP_SOFTMAX, hw.SOFTMAX_SOFTMAX, p)


def _layernorm(npu: Npu, fence: int) -> bytes:
    shape = (SLICE,)
    x = _bcast(hw.DTYPE_FP32, shape)
    p = tensor_params([x, x, x, _t(VA_OUT, hw.DTYPE_FP32, shape)], [1, _f32(1e-5)])
    return _tensor_op(npu, fence, hw.OP_LAYERNORM, 0, p)


# int8 MATMUL: K blocks of 1024 terms summed exactly; a unit is a row block
# of 2^21 / (K + 2N) = 85 rows x N x K = 5.7e9 multiply-adds, accounted
# once, before it runs.
MM_M, MM_K, MM_N = 1024, 8192, 8192


def _matmul(npu: Npu, fence: int) -> bytes:
    a = _bcast(hw.DTYPE_INT8, (MM_M, MM_K))
    b = _bcast(hw.DTYPE_INT8, (MM_K, MM_N))
    out = _t(VA_OUT, hw.DTYPE_INT32, (MM_M, MM_N))
    return _tensor_op(npu, fence, hw.OP_MATMUL, hw.ACT_NONE, tensor_params([a, b, out], [0]))


LIN_N = 4096


def _linear(npu: Npu, fence: int) -> bytes:
    # fp32: BLAS calls of 2^27 multiply-adds (256 rows x 128 columns x K).
    n = LIN_N
    a = _bcast(hw.DTYPE_FP32, (n, n))
    bias = _bcast(hw.DTYPE_FP32, (1, n))
    out = _t(VA_OUT, hw.DTYPE_FP32, (n, n))
    return _tensor_op(npu, fence, hw.OP_LINEAR, hw.ACT_NONE, tensor_params([a, a, bias, out]))


# CONV2D on im2col + BLAS (a stride-0 input is no oneDNN layout): one group
# of O = 4096 channels, kk = C x KH x KW = 16 x 16 x 16 = 4096; a position
# block is 2^21 / (kk + O) = 256 positions: 2^32 multiply-adds per unit,
# 16 units (64 x 64 positions): about a second on two cores.
CONV_O, CONV_C, CONV_K, CONV_OHW = 4096, 16, 16, 64


def _conv2d(npu: Npu, fence: int) -> bytes:
    h = CONV_OHW + CONV_K - 1
    x = _bcast(hw.DTYPE_FP32, (1, CONV_C, h, h))
    wt = _bcast(hw.DTYPE_FP32, (CONV_O, CONV_C, CONV_K, CONV_K))
    bias = _bcast(hw.DTYPE_FP32, (1, CONV_O, 1, 1))
    out = _t(VA_OUT, hw.DTYPE_FP32, (1, CONV_O, CONV_OHW, CONV_OHW))
    params = [1, 1, 0, 0, 1, 1, 1, 0, 0]
    return _tensor_op(
        npu, fence, hw.OP_CONV2D, hw.ACT_NONE, tensor_params([x, wt, bias, out], params)
    )


# POOL2D's row kernel: a control point per input row, whose work is
# OW x KW taps: 2^15 x 2^15 = 2^30 per row here, four rows.
POOL_W = 1 << 15


def _pool2d(npu: Npu, fence: int) -> bytes:
    w = 2 * POOL_W - 1
    x = _bcast(hw.DTYPE_FP32, (1, 1, 4, w))
    out = _t(VA_OUT, hw.DTYPE_FP32, (1, 1, 4, POOL_W))
    return _tensor_op(npu, fence, hw.OP_POOL2D, hw.POOL_MAX,
                      tensor_params([x, out], [1, POOL_W, 1, 1, 0, 0, 0]))  # fmt: skip


RQ_ROW = 1 << 26


def _requant(npu: Npu, fence: int) -> bytes:
    # Its scale pre-check reads every scale element with no control point,
    # then each unit is a whole row of 2^26 elements.
    shape = (4, RQ_ROW)
    acc = _bcast(hw.DTYPE_INT32, shape)
    scale = _bcast(hw.DTYPE_FP32, (1, RQ_ROW))
    out = _t(VA_OUT, hw.DTYPE_INT8, shape)
    return _tensor_op(npu, fence, hw.OP_REQUANT, hw.ACT_NONE, tensor_params([acc, scale, out], [0]))


def _select(npu: Npu, fence: int) -> bytes:
    shape = (4, RQ_ROW)
    p = tensor_params(
        [_bcast(hw.DTYPE_BOOL, shape), _bcast(hw.DTYPE_INT8, shape),
         _bcast(hw.DTYPE_INT8, shape), _t(VA_OUT, hw.DTYPE_INT8, shape)]
    )  # fmt: skip
    return _tensor_op(npu, fence, hw.OP_SELECT, 0, p)


def _sync(op: int, value: int, fence: int, va: int) -> bytes:
    return cmd(op, struct.pack("<QQ", va, value), fence=fence)


def _signal(npu: Npu, fence: int) -> bytes:
    return _sync(hw.OP_SIGNAL, 1, fence, VA_SYNC + 8)


def _wait(npu: Npu, fence: int) -> bytes:
    npu.qt.memwrite(SYNC_PAGE, bytes(8))
    return _sync(hw.OP_WAIT, 1, fence, VA_SYNC)


WORST: dict[str, Worst] = {
    w.opcode: w
    for w in (
        Worst("NOP", _nop, "nothing to do: the events hit an idle device", runs=False),
        Worst(
            "COPY",
            _copy,
            "2 GiB between aliased windows: 4 MiB pieces, a walk per page",
            settle=0.04,
            budget_ms=120,
        ),
        Worst(
            "FILL", _fill, "4 GiB (NPU_MAX_XFER) into an aliased window", settle=0.04, budget_ms=120
        ),
        Worst("GEMM", _gemm, "4096^3 fp32: blocks of C of 2^27 multiply-adds", budget_ms=600),
        Worst(
            "ELTWISE",
            _eltwise,
            "DIV of 2^28 fp32 elements, stride-0 inputs",
            settle=0.1,
            budget_ms=250,
        ),
        Worst("UNARY", _unary, "ERF of 2^28 fp32 elements, stride-0 input", budget_ms=600),
        Worst("CONVERT", _convert, "4 rows of 2^24 into a stride-2 int8 output: a walk per store"),
        Worst("REDUCE", _reduce, "SUM of one slice of 2^28 elements", budget_ms=400),
        Worst("SOFTMAX", _softmax, "one slice of 2^25 elements", budget_ms=250),
        Worst("LAYERNORM", _layernorm, "one slice of 2^25 elements", budget_ms=600),
        Worst(
            "MATMUL",
            _matmul,
            "int8 1024x8192x8192: units of 85 rows = 5.7e9 multiply-adds",
            budget_ms=800,
        ),
        Worst("LINEAR", _linear, "fp32 4096^3: BLAS calls of 2^27 multiply-adds", budget_ms=600),
        Worst("CONV2D", _conv2d, "O=4096 x kk=4096 x 256 positions = 2^32 per unit", budget_ms=250),
        Worst("POOL2D", _pool2d, "rows of OW x KW = 2^30 taps per control point"),
        Worst("REQUANT", _requant, "2^26 scale elements checked, rows of 2^26", budget_ms=800),
        Worst("SIGNAL", _signal, "one 8-byte store", runs=False),
        Worst("WAIT", _wait, "a value never reached", blocks=True),
        Worst("SELECT", _select, "rows of 2^26 int8 elements", budget_ms=800),
    )
}
assert set(WORST) == {k[7:] for k in hw.all if k.startswith("NPU_OP_") and k != "NPU_OP_COUNT"}


# -- host memory: commands whose host scratch is sized by guest numbers -------


def _rss_matmul(npu: Npu, fence: int) -> bytes:
    # [1, 2^28] @ [2^28, 1] fp32, both stride 0: packed a and b, 1 GiB each.
    a = _bcast(hw.DTYPE_FP32, (1, BIG))
    b = _bcast(hw.DTYPE_FP32, (BIG, 1))
    out = _t(VA_OUT, hw.DTYPE_FP32, (1, 1))
    return _tensor_op(npu, fence, hw.OP_MATMUL, hw.ACT_NONE, tensor_params([a, b, out], [0]))


def _rss_conv2d(npu: Npu, fence: int) -> bytes:
    # One output of kk = 2^16 x 64 x 64 = 2^28 taps: packed weights and
    # the columns of one position, 1 GiB each.
    c, k = 1 << 16, 64
    x = _bcast(hw.DTYPE_FP32, (1, c, k, k))
    wt = _bcast(hw.DTYPE_FP32, (1, c, k, k))
    bias = _bcast(hw.DTYPE_FP32, (1, 1, 1, 1))
    out = _t(VA_OUT, hw.DTYPE_FP32, (1, 1, 1, 1))
    params = [1, 1, 0, 0, 1, 1, 1, 0, 0]
    return _tensor_op(
        npu, fence, hw.OP_CONV2D, hw.ACT_NONE, tensor_params([x, wt, bias, out], params)
    )


def _rss_pool2d(npu: Npu, fence: int) -> bytes:
    # A row of 2^28 fp32 widened once per input row: 1 GiB.
    x = _bcast(hw.DTYPE_FP32, (1, 1, 1, BIG))
    out = _t(VA_OUT, hw.DTYPE_FP32, (1, 1, 1, 1))
    return _tensor_op(npu, fence, hw.OP_POOL2D, hw.POOL_MAX,
                      tensor_params([x, out], [1, BIG, 1, 1, 0, 0, 0]))  # fmt: skip


RSS_WORST: dict[str, Worst] = {
    w.opcode: w
    for w in (
        Worst("MATMUL", _rss_matmul, "fp32 [1, 2^28] @ [2^28, 1], stride 0: a and b packed"),
        Worst("CONV2D", _rss_conv2d, "kk = 2^28, stride 0: weights packed, im2col of a position"),
        Worst("POOL2D", _rss_pool2d, "an input row of 2^28 widened into scratch"),
        Worst("GEMM", _gemm, "4096^3: packed staging, charged (exceeds 16 MiB: NO_MEMORY)"),
    )
}
RSS_BUDGET = "16M"
RSS_BUDGET_BYTES = 16 * MiB


def device_for(worst: Worst) -> str:
    """The -device value of the QEMU that runs ``worst``."""
    return f"npu,cmd-budget-ms={worst.budget_ms}"


# -- a device set up for the matrix -------------------------------------------


def map_aliases(npu: Npu) -> None:
    """Write the page tables and turn the MMU on (the device disabled, as the
    MMU registers want): see the module docstring."""
    qt = npu.qt
    entry = hw.PTE_VALID
    qt.memwrite(IN_PAGE, struct.pack("<f", 1.0) * 1024)
    qt.memwrite(IN_L2, struct.pack("<512Q", *[IN_PAGE | entry] * 512))
    qt.memwrite(OUT_L2, struct.pack("<512Q", *[OUT_PAGE | entry | hw.PTE_WRITE] * 512))
    low = [0] * 512
    low[VA_SMALL >> 12] = IN_PAGE | entry
    low[VA_PARAMS >> 12] = PARAMS_PAGE | entry
    low[VA_SYNC >> 12] = SYNC_PAGE | entry | hw.PTE_WRITE
    qt.memwrite(LOW_L2, struct.pack("<512Q", *low))
    n = VA_END >> 21
    l1 = [LOW_L2 | entry] + [IN_L2 | entry] * ((VA_OUT >> 21) - 1)
    l1 += [OUT_L2 | entry] * (n - len(l1))
    qt.memwrite(L1, struct.pack(f"<{n}Q", *l1))
    npu.wr(hw.REG_CONTROL, 0)
    npu.wr(hw.REG_MMU_L1_LO, L1)
    npu.wr(hw.REG_MMU_L1_HI, 0)
    npu.wr(hw.REG_MMU_L1_ENTRIES, n)
    npu.wr(hw.REG_MMU_CONTROL, hw.MMU_ENABLE)


class Rig:
    """One QEMU with the NPU (``device``: its properties; a QMP
    socket), its MMU aliasing set up and queue 0 running."""

    def __init__(self, tmp: Path, device: str = "npu,cmd-budget-ms=1500") -> None:
        from test_device_qtest_engine import Qmp  # the tests' minimal QMP client

        tmp.mkdir(parents=True, exist_ok=True)
        sock = tmp / "qmp.sock"
        self.npu = Npu(tmp / "qemu.log", device=device,
                       extra_args=["-qmp", f"unix:{sock},server=on,wait=off"])  # fmt: skip
        try:
            self.qmp = Qmp(sock)
            self.ready()
        except BaseException:
            self.npu.close()
            raise
        self.fence = 0

    @property
    def pid(self) -> int:
        return int(self.npu.qt._proc.pid)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.qmp.close()
        self.npu.close()

    def ready(self) -> None:
        """After power-on or any reset: MMU, queue 0 and queue PRIO_Q."""
        map_aliases(self.npu)
        self.npu.start()
        setup_queue(self.npu, PRIO_Q, priority=hw.Q_PRIORITY_MAX)

    def next_fence(self) -> int:
        self.fence += 1
        return self.fence

    def vm_status(self, key: str) -> int:
        """A ``/proc/<pid>/status`` figure of QEMU, in bytes (VmRSS, VmHWM)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    def reset_hwm(self) -> None:
        """Start VmHWM afresh from the current RSS (``clear_refs`` 5)."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")


def _until(cond: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``cond`` until true; return the host time then. TimeoutError past ``timeout``."""
    deadline = time.perf_counter() + timeout
    while True:
        if cond():
            return time.perf_counter()
        if time.perf_counter() > deadline:
            raise TimeoutError(what)


@dataclass
class Cell:
    """One measurement: ``ms`` from the event until the device answered
    (None: the event does not apply), and what was checked besides."""

    opcode: str
    event: str
    ms: float | None
    note: str = ""
    wrote_nothing: bool | None = None  # an aborted command's completion and fence untouched
    status: int | None = None  # the completion status (budget)
    alive: bool = True  # a NOP ran OK afterwards


@dataclass
class Launch:
    """A command submitted on queue 0 and seen running."""

    fence: int
    index: int
    t_start: float  # host time at or before the command started


def launch(rig: Rig, worst: Worst) -> Launch:
    """Submit ``worst`` on queue 0 and wait until it runs (or blocks)."""
    npu = rig.npu
    fence = rig.next_fence()
    desc = worst.build(npu, fence)
    bit = hw.QSTAT_WAITING if worst.blocks else hw.QSTAT_ACTIVE
    t_prev = time.perf_counter()
    (index,) = npu.submit(desc)
    if not worst.runs:
        npu.wait_head(index + 1, timeout=10)
        return Launch(fence, index, t_prev)
    deadline = t_prev + 10
    while not npu.qrd(hw.Q_STATUS) & bit:
        if npu.qrd(hw.Q_HEAD) == (index + 1) & 0xFFFF_FFFF:
            c = npu.completion(index)
            raise AssertionError(f"{worst.opcode} ended at once with status {c.status}")
        t_prev = time.perf_counter()
        assert t_prev < deadline, f"{worst.opcode} did not start"
    return Launch(fence, index, t_prev)


def _nothing_written(rig: Rig, run: Launch) -> bool:
    c = rig.npu.completion(run.index)
    return c.fence == UNTOUCHED and rig.npu.fence_wb()[0] != run.fence


def _pm(rig: Rig) -> int:
    return rig.npu.pci.find_capability(PCI_CAP_ID_PM)


def _set_power(rig: Rig, cap: int, state: int) -> None:
    pci = rig.npu.pci
    pci.write16(cap + PCI_PM_CTRL, (pci.read16(cap + PCI_PM_CTRL) & ~3) | state)


def _soft_reset(rig: Rig) -> float:
    npu = rig.npu
    t0 = time.perf_counter()
    npu.wr(hw.REG_CONTROL, hw.CONTROL_RESET)
    t1 = _until(lambda: not npu.rd(hw.REG_STATUS) & hw.STATUS_RESETTING, GIVE_UP_S, "soft reset")
    npu.tail = 0
    return t1 - t0


def _system_reset(rig: Rig) -> float:
    npu = rig.npu
    t0 = time.perf_counter()
    npu.qt.command("outb 0xcf9 0x6")
    # The reset's hold phase holds the BQL until the engine parked: config
    # reads answer again once it is done, with memory decoding off.
    t1 = _until(lambda: not npu.pci.read32(0x04) & 0x2, GIVE_UP_S, "system reset")
    npu.pci.map_bar(hw.BAR_REGS, npu.bar0)
    npu.pci.map_bar(hw.BAR_MSIX, npu.bar4)
    npu.pci.enable()
    npu.tail = 0
    return t1 - t0


def measure_event(rig: Rig, worst: Worst, event: str) -> Cell:
    """Run ``worst``, hit it with ``event`` SETTLE_S later, time the answer.

    Leaves the device ready for the next measurement (queue 0 running, the
    MMU on); raises TimeoutError (QTestError if QEMU stopped answering) when
    the device did not park within GIVE_UP_S.
    """
    npu = rig.npu
    run = launch(rig, worst)
    if worst.runs:
        time.sleep(worst.settle)
        if npu.qrd(hw.Q_HEAD) == (run.index + 1) & 0xFFFF_FFFF:
            c = npu.completion(run.index)
            raise AssertionError(f"{worst.opcode} ended before the event (status {c.status})")
    cell = Cell(worst.opcode, event, None)
    aborts = worst.runs and event in ("reset", "system_reset", "d3hot")
    if event == "reset":
        cell.ms = _soft_reset(rig) * 1e3
    elif event == "system_reset":
        cell.ms = _system_reset(rig) * 1e3
        assert npu.rd(hw.REG_STATUS) == hw.STATUS_READY
    elif event == "d3hot":
        cap = _pm(rig)
        t0 = time.perf_counter()
        _set_power(rig, cap, D3HOT)
        cell.ms = (time.perf_counter() - t0) * 1e3
        _set_power(rig, cap, D0)
        npu.tail = 0
    elif event == "vm_stop":
        t0 = time.perf_counter()
        rig.qmp.execute("stop")
        cell.ms = (time.perf_counter() - t0) * 1e3
        rig.qmp.execute("cont")
    elif event == "budget":
        if not worst.runs:
            cell.note = "ends at once: no budget to run out"
        elif worst.blocks:
            # A blocked WAIT holds no engine (spec 8.4): no budget runs out;
            # it must still be blocked, with nothing written, past the budget.
            time.sleep(worst.budget_ms / 1e3 + 0.2)
            cell.wrote_nothing = _nothing_written(rig, run)
            cell.note = "a blocked WAIT has no budget"
        else:
            slot = npu.cpl + (run.index & (npu.ring_size - 1)) * CPL_SIZE
            seen = _until(
                lambda: npu.qt.memread(slot, 8) != b"\xee" * 8,
                worst.budget_ms / 1e3 + GIVE_UP_S,
                "budget",
            )
            cell.status = npu.completion(run.index).status
            cell.ms = max(0.0, (seen - run.t_start) * 1e3 - worst.budget_ms)
    elif event == "preempt":
        fence = 0x5000 + rig.next_fence()
        npu.qt.memwrite(queue_fence(PRIO_Q), bytes(16))
        npu.qt.memwrite(queue_ring(PRIO_Q), nop(fence))  # its queue is fresh: head 0
        t0 = time.perf_counter()
        npu.wr(hw.doorbell(PRIO_Q), 1)
        t1 = _until(
            lambda: struct.unpack("<Q", npu.qt.memread(queue_fence(PRIO_Q), 8))[0] == fence,
            GIVE_UP_S,
            "preempting NOP",
        )
        cell.ms = (t1 - t0) * 1e3
        if worst.runs and npu.qrd(hw.Q_HEAD) == (run.index + 1) & 0xFFFF_FFFF:
            cell.note = "the command ended before the NOP"
    else:
        raise ValueError(event)
    if aborts:
        cell.wrote_nothing = _nothing_written(rig, run)
    # Back to a known state: whatever still runs is reset away.
    if event in ("vm_stop", "preempt", "budget"):
        _soft_reset(rig)
    rig.ready()
    f = rig.next_fence()
    c = npu.run(nop(f), timeout=10)
    cell.alive = c.status == hw.ST_OK and npu.fence_wb()[0] == f
    npu.assert_alive()
    return cell


# -- matrices -------------------------------------------------------------------


@contextlib.contextmanager
def rig_for(tmp: Path, device: str = "npu,cmd-budget-ms=1500") -> Iterator[Rig]:
    rig = Rig(tmp, device)
    try:
        yield rig
    finally:
        rig.close()


@dataclass
class Matrix:
    """Every cell's runs (ms; None where an event does not apply)."""

    runs: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def median(self) -> dict[str, dict[str, float | None]]:
        out: dict[str, dict[str, float | None]] = {}
        for op, row in self.runs.items():
            out[op] = {}
            for ev, vals in row.items():
                got = [v for v in vals if v is not None]
                out[op][ev] = statistics.median(got) if got else None
        return out


def measure_matrix(
    tmp: Path, opcodes: list[str] | None = None, events: tuple[str, ...] = EVENTS,
    runs: int = 1,
) -> Matrix:  # fmt: skip
    """Every opcode x event, ``runs`` times, one QEMU per opcode (replaced
    after a cell that did not park within GIVE_UP_S: it reads GIVE_UP_S)."""
    m = Matrix()
    for op in opcodes or list(WORST):
        worst = WORST[op]
        m.runs[op] = {ev: [] for ev in events}
        rig: Rig | None = None
        try:
            for i in range(runs):
                for ev in events:
                    if rig is None:
                        rig = Rig(tmp / f"{op}-{i}-{ev}", device_for(worst))
                    try:
                        cell = measure_event(rig, worst, ev)
                    except (TimeoutError, QTestError, AssertionError) as e:
                        m.notes.append(f"{op} {ev}: {type(e).__name__}: {str(e)[:200]}")
                        m.runs[op][ev].append(GIVE_UP_S * 1e3)
                        rig.close()
                        rig = None
                        continue
                    m.runs[op][ev].append(cell.ms)
                    if cell.note:
                        m.notes.append(f"{op} {ev}: {cell.note}")
                    if cell.wrote_nothing is False:
                        m.notes.append(f"{op} {ev}: the aborted command wrote its completion")
        finally:
            if rig is not None:
                rig.close()
    return m


@dataclass
class RssFigure:
    """QEMU's RSS around one command on a device with mem-budget=16M."""

    opcode: str
    rss_before: int  # bytes
    hwm: int  # VmHWM after the command ran (or was reset away)
    status: int | None  # its completion status, None if it was still running

    @property
    def over_budget(self) -> int:
        """Bytes of peak RSS beyond the RSS before it plus the budget."""
        return self.hwm - self.rss_before - RSS_BUDGET_BYTES


RSS_RUN_S = 3.0  # let the command allocate and run this long, then reset it


def measure_rss(tmp: Path, opcode: str, worst: Worst | None = None) -> RssFigure:
    """Peak RSS of QEMU while ``opcode``'s host-memory worst case runs."""
    worst = worst or RSS_WORST[opcode]
    with rig_for(tmp, f"npu,mem-budget={RSS_BUDGET},cmd-budget-ms=0") as rig:
        npu = rig.npu
        # Warm: a small command of the same kind maps the device's buffers.
        assert npu.run(fill(VA_OUT, 1 * MiB, 0, rig.next_fence())).status == hw.ST_OK
        rig.reset_hwm()
        before = rig.vm_status("VmRSS")
        fence = rig.next_fence()
        (index,) = npu.submit(worst.build(npu, fence))
        status: int | None = None
        deadline = time.perf_counter() + RSS_RUN_S
        while time.perf_counter() < deadline:
            if npu.qrd(hw.Q_HEAD) == index + 1:
                status = npu.completion(index).status
                break
            time.sleep(0.01)
        hwm = rig.vm_status("VmHWM")
        if status is None:
            _soft_reset(rig)
            hwm = max(hwm, rig.vm_status("VmHWM"))
        rig.ready()
        npu.assert_alive()
        return RssFigure(opcode, before, hwm, status)


def measure_rss_baseline(tmp: Path) -> dict[str, int]:
    """RSS growth (bytes) of small commands, the overhead of the RSS bound."""
    out: dict[str, int] = {}

    def gemm64(npu: Npu, fence: int) -> bytes:
        return gemm(VA_IN, VA_IN, VA_OUT, 64, 64, 64, 64, 64, 64, fence=fence)

    small = {"NOP": Worst("NOP", _nop, ""), "GEMM64": Worst("GEMM64", gemm64, "")}
    for name, w in small.items():
        fig = measure_rss(tmp / f"base-{name}", name, w)
        out[name] = fig.hwm - fig.rss_before
    return out
