#!/usr/bin/env python3
"""First contact with the NPU: device info, a DMA copy and a GEMM, each
checked against numpy, with the time each took next to numpy in this guest.

Run inside the guest (``make demo`` does it for you)::

    python3 examples/hello_npu.py
"""

from __future__ import annotations

import sys
import time

import numpy as np

import npu


def timed(fn, *args):  # type: ignore[no-untyped-def]
    """Return (result, seconds) of one call."""
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def main() -> int:
    found = npu.devices()
    if not found:
        print("no NPU found: is the driver loaded? (insmod kernel_module/npu.ko)")
        return 1
    dev = npu.open_device(found[0])
    npu.set_default_device(dev)
    info = dev.info
    print(f"device      {info.path}  PCI {info.pci_vendor:04x}:{info.pci_device:04x}")
    print(
        f"hardware    v{info.hw_version_str}  ABI {info.abi_version}  "
        f"driver v{info.driver_version_str}"
    )
    print(f"caps        {info.caps!s}")
    print(
        f"queues      {info.num_queues} x {info.ring_entries} entries, "
        f"{info.num_cores} core(s), max BO {info.max_bo_size >> 20} MiB"
    )

    ok = True
    rng = np.random.default_rng(0)

    # COPY: 16 MiB through the device's DMA engine.
    src = rng.integers(0, 255, size=16 << 20, dtype=np.uint8)
    out, t_npu = timed(npu.copy_array, src)
    same = bool(np.array_equal(out, src))
    ok &= same
    print(
        f"copy        16 MiB  {'OK ' if same else 'BAD'}  {t_npu * 1e3:7.1f} ms "
        f"(incl. upload/download)"
    )

    # GEMM: fp32, against numpy in this guest.
    for m, k, n in [(3, 5, 7), (127, 255, 63), (512, 512, 512)]:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c, t_npu = timed(npu.matmul, a, b)
        ref, t_np = timed(np.matmul, a, b)
        err = float(np.max(np.abs(c - ref))) if c.size else 0.0
        good = bool(np.allclose(c, ref, rtol=1e-4, atol=1e-3 * np.sqrt(k)))
        ok &= good
        flop = 2.0 * m * n * k
        print(
            f"gemm        {m}x{k} @ {k}x{n}  {'OK ' if good else 'BAD'}  "
            f"max err {err:.2e}  npu {flop / t_npu / 1e9:7.2f} GFLOP/s  "
            f"numpy {flop / t_np / 1e9:7.2f} GFLOP/s  ({t_np / t_npu:5.1f}x)"
        )

    # A two-layer MLP on device-resident tensors: upload once, run the whole
    # forward pass on the NPU (no host round trip), download the result.
    x = rng.standard_normal((256, 784), dtype=np.float32)
    w1 = rng.standard_normal((512, 784), dtype=np.float32) * np.float32(0.03)
    b1 = rng.standard_normal(512, dtype=np.float32) * np.float32(0.1)
    w2 = rng.standard_normal((10, 512), dtype=np.float32) * np.float32(0.05)
    b2 = rng.standard_normal(10, dtype=np.float32) * np.float32(0.1)
    params = [npu.tensor(v) for v in (w1, b1, w2, b2)]

    def mlp_npu(batch: np.ndarray) -> np.ndarray:
        tw1, tb1, tw2, tb2 = params
        hidden = npu.linear(npu.tensor(batch), tw1, tb1, activation="relu")
        return npu.softmax(npu.linear(hidden, tw2, tb2), axis=-1).numpy()

    def mlp_numpy(batch: np.ndarray) -> np.ndarray:
        logits = np.maximum(batch @ w1.T + b1, 0) @ w2.T + b2
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    probs, t_npu = timed(mlp_npu, x)
    ref, t_np = timed(mlp_numpy, x)
    good = bool(np.allclose(probs, ref, rtol=1e-4, atol=1e-5))
    ok &= good
    print(
        f"mlp         784-512-10, batch 256  {'OK ' if good else 'BAD'}  "
        f"npu {t_npu * 1e3:7.1f} ms  numpy {t_np * 1e3:7.1f} ms  ({t_np / t_npu:5.1f}x)"
    )

    dev.close()
    print("all results match numpy" if ok else "MISMATCH against numpy")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
