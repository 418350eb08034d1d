#!/usr/bin/env python3
"""Handwritten-digit recognition with ONNX models on the NPU (``make demo``).

Loads the digits CNN and MLP of examples/models/ (trained on the host by
examples/models/train_digits.py; docs/models.md) with
``npu.InferenceSession``, once on the NPU and once on the CPU provider
(numpy in this guest), classifies the 360 held-out test images with both
and prints, for each model: accuracy, whether the two agree image by image,
batch-1 latency, batch-64 throughput, and where the NPU's time goes
(upload, compute, download, CPU work). Exits 1 if the NPU's predictions
differ from numpy's or an accuracy is below 95%. Run in the guest::

    python3 examples/infer_digits.py          # or, on the host: make demo
"""

from __future__ import annotations

import sys
import time

import inference_common as ic


def show_digits_sample(x: ic.Array, pred: int, label: int) -> None:
    """Print one 8x8 test image as text art with its label and prediction."""
    shades = " .:-=+*#%@"
    for row in x.reshape(8, 8):
        print("    " + "".join(shades[min(int(v * 9.99), 9)] * 2 for v in row))
    print(f"    label {label}, NPU says {pred}")


def report(r: ic.DigitsResult) -> None:
    """Print one model's table."""
    print(
        f"\n{r.model}  (NPU partitions: {', '.join(r.partitions) or 'none'}; "
        f"CPU fallbacks: {', '.join(r.fallbacks) or 'none'})"
    )
    print(ic.header())
    print(
        f"  {'accuracy (' + str(r.n) + ' test images)':<30}{r.accuracy_npu * 100:>11.2f} %"
        f"{r.accuracy_cpu * 100:>13.2f} %"
    )
    verdict = "all agree" if r.agree == r.n else f"{r.n - r.agree} DIFFER"
    print(f"  {'NPU vs numpy predictions':<30}{f'{r.agree}/{r.n} {verdict}':>28}")
    for row in ic.speed_rows(r.npu, r.cpu):
        print(row)
    for what, bd in (
        ("batch 1", r.npu.breakdown_b1),
        (f"batch {r.npu.batch}", r.npu.breakdown_batch),
    ):
        if bd is not None:
            print(f"  NPU time per run, {what} (medians): {bd.line()}")


def main() -> int:
    """Run both digits models; 0 if the NPU agrees with numpy and is accurate enough."""
    dev = ic.device_line()
    if dev is None:
        print("no NPU found: is the driver loaded? (insmod kernel_module/npu.ko)")
        return 1
    x, y = ic.load_digits_split()
    print("Digits on the NPU: scikit-learn's 8x8 handwritten digits, ONNX models")
    print(f"device {dev}")
    print(f"test split: {len(x)} held-out images (examples/models/digits_test.npz)")
    t0 = time.perf_counter()
    results = [ic.digits(m) for m in ic.DIGITS_MODELS]

    sess = ic.session(ic.DIGITS_MODELS[0], ic.NPU_PROVIDERS)
    show_digits_sample(x[0], int(ic.run(sess, x[:1]).argmax()), int(y[0]))
    for r in results:
        report(r)

    print(
        "\nNPU = npu.InferenceSession(path); numpy = the same session with "
        "providers=('CPU',),\nrunning the graph with numpy on this guest's CPU. "
        "Speedups are numpy time / NPU time."
    )
    ok = all(r.ok for r in results)
    print(
        f"done in {time.perf_counter() - t0:.0f} s: "
        + ("NPU predictions equal numpy's, accuracy >= 95%" if ok else "FAILED (see above)")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
