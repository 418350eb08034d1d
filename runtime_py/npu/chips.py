"""The chip descriptions of the device's timing model (docs/npu-spec.md 12.2).

A device started with ``-device npu,timing=edge`` (or ``datacenter``) gives
every command the duration this roofline gives, on the device clock; sysfs
``npu/timing`` names the mode. This module holds the same descriptions and
the same arithmetic, so that a program can predict what a command takes
on a chip, and say whether it is compute-bound or memory-bound::

    >>> from npu.chips import CHIPS
    >>> r = CHIPS["edge"].roofline(macs=256**3, nbytes=3 * 256 * 256 * 4, dtype=npu.DType.FP32)
    >>> r.duration_ns, r.bound
    (100304, 'memory')

It imports nothing else from ``npu`` but the ABI constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from . import _abi

_MIB: Final = 1 << 20


@dataclass(frozen=True)
class Roofline:
    """The modelled time of one command: its duration and the two bounds."""

    duration_ns: int
    compute_ns: int
    memory_ns: int

    @property
    def bound(self) -> str:
        """``"compute"`` when ``compute_ns >= memory_ns``, else ``"memory"``."""
        return "compute" if self.compute_ns >= self.memory_ns else "memory"


@dataclass(frozen=True)
class Chip:
    """A chip description: MAC array (int8 cells), clock, SRAM, DMA, vector unit."""

    name: str
    mac_rows: int
    mac_cols: int
    clock_mhz: int
    sram_bytes: int
    dma_mb_per_s: int
    vector_bytes_per_cycle: int
    cmd_overhead_ns: int
    eff_gemm_pct: int
    eff_conv_pct: int

    def macs_per_cycle(self, dtype: int) -> int:
        """Multiply-adds per cycle on operands of ``dtype`` (int8: every cell)."""
        cells = self.mac_rows * self.mac_cols
        if dtype == _abi.DType.INT8:
            return cells
        if dtype in (_abi.DType.BF16, _abi.DType.FP16):
            return cells // 2
        return cells // 4

    def peak_macs_per_s(self, dtype: int) -> float:
        return self.macs_per_cycle(dtype) * self.clock_mhz * 1e6

    def roofline(
        self, macs: int, nbytes: int, dtype: int = _abi.DType.FP32, *, conv: bool = False
    ) -> Roofline:
        """The modelled duration of a command of ``macs`` multiply-adds on
        ``dtype`` operands that moves ``nbytes`` operand bytes; ``conv``: a
        CONV2D (its own efficiency), else GEMM/MATMUL/LINEAR or, with no
        multiply-adds, a vector op."""
        ghz = self.clock_mhz / 1000.0
        if macs:
            eff = self.eff_conv_pct if conv else self.eff_gemm_pct
            compute = math.ceil(macs / (self.macs_per_cycle(dtype) * ghz * eff / 100.0))
        else:
            compute = math.ceil(nbytes / (self.vector_bytes_per_cycle * ghz))
        traffic = nbytes + max(0, nbytes - self.sram_bytes)
        memory = math.ceil(traffic * 1000.0 / self.dma_mb_per_s)
        return Roofline(self.cmd_overhead_ns + max(compute, memory), compute, memory)


CHIPS: Final[dict[str, Chip]] = {
    "edge": Chip("edge", 32, 32, 1000, 2 * _MIB, 8000, 64, 2000, 85, 75),
    "datacenter": Chip("datacenter", 128, 128, 1500, 64 * _MIB, 1_000_000, 512, 1000, 90, 70),
}
