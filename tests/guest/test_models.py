"""The example models (examples/models/, docs/models.md) through
npu.InferenceSession on the NPU, against onnx's ReferenceEvaluator.

- digits MLP and CNN: the NPU's predicted classes on the whole held-out
  test split (360 images, batches of 64) equal those of ReferenceEvaluator
  run here in the guest; the CNN's NPU accuracy is at least 95%;
- ResNet-style network, batch 8: the NPU's logits match ReferenceEvaluator
  within |got - want| <= RESNET_ATOL + RESNET_RTOL * |want| (docs/models.md,
  "Tolerances"; the same numbers as examples/inference_common.py).

Each model's NPU and reference outputs are computed once per module.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import npu

onnx_reference = pytest.importorskip("onnx.reference")

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
DIGITS = ("digits_mlp.onnx", "digits_cnn.onnx")
BATCH = 64
RESNET_RTOL = 1e-3
RESNET_ATOL = 1e-4


def _digits():
    with np.load(MODELS / "digits_test.npz") as d:
        return d["x"].astype(np.float32), d["y"]


def _as_input(model_path: Path, x: np.ndarray) -> np.ndarray:
    """x [N, 1, 8, 8] reshaped to the model's input (the MLP takes [N, 64])."""
    import onnx

    dims = onnx.load(str(model_path)).graph.input[0].type.tensor_type.shape.dim
    return np.ascontiguousarray(x.reshape(len(x), *(d.dim_value for d in dims[1:])))


def _batched(run, x: np.ndarray) -> np.ndarray:
    return np.concatenate([run(x[i : i + BATCH]) for i in range(0, len(x), BATCH)])


def _npu_logits(path: Path, x: np.ndarray) -> tuple[np.ndarray, object]:
    sess = npu.InferenceSession(str(path))
    name = sess.get_inputs()[0].name
    return _batched(lambda b: sess.run(None, {name: b})[0], x), sess


def _ref_logits(path: Path, x: np.ndarray) -> np.ndarray:
    ref = onnx_reference.ReferenceEvaluator(str(path))
    return _batched(lambda b: ref.run(None, {"input": b})[0], x)


@pytest.fixture(scope="module")
def digits_run():
    """digits_run(model) -> (NPU logits, reference logits, labels, NPU session) on the
    whole test split; each model runs once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            path = MODELS / name
            x, y = _digits()
            x = _as_input(path, x)
            got, sess = _npu_logits(path, x)
            cache[name] = got, _ref_logits(path, x), y, sess
        return cache[name]

    yield get
    for *_, sess in cache.values():
        sess.close()  # frees its device buffers (weights, activations)


@pytest.fixture(scope="module")
def resnet_run():
    """(NPU logits, reference logits) of the ResNet on its batch-8 sample."""
    path = MODELS / "resnet_small.onnx"
    with np.load(MODELS / "resnet_sample.npz") as d:
        x = d["x"].astype(np.float32)[:8]
    sess = npu.InferenceSession(str(path))
    got = sess.run(None, {"input": x})[0]
    yield got, _ref_logits(path, x), sess
    sess.close()


@pytest.mark.parametrize("name", DIGITS)
def test_digits_model_runs_on_the_npu(digits_run, name):
    sess = digits_run(name)[3]
    assert any(p.provider == "NPU" for p in sess.partitions), f"{name}: no NPU partition"


@pytest.mark.parametrize("name", DIGITS)
def test_digits_npu_predictions_equal_reference(digits_run, name):
    got, want, y, _ = digits_run(name)
    assert got.shape == want.shape == (len(y), 10)
    differ = np.flatnonzero(got.argmax(axis=1) != want.argmax(axis=1))
    assert differ.size == 0, f"{name}: NPU and ReferenceEvaluator differ on images {differ}"


def test_digits_cnn_npu_accuracy_at_least_95_percent(digits_run):
    got, _, y, _ = digits_run("digits_cnn.onnx")
    acc = float(np.mean(got.argmax(axis=1) == y))
    assert acc >= 0.95, f"CNN accuracy on the NPU {acc:.4f}"


def test_resnet_runs_on_the_npu(resnet_run):
    _, _, sess = resnet_run
    assert any(p.provider == "NPU" for p in sess.partitions)


def test_resnet_logits_match_reference_within_tolerance(resnet_run):
    got, want, _ = resnet_run
    assert got.shape == want.shape == (8, 10)
    err = np.abs(got - want)
    bound = RESNET_ATOL + RESNET_RTOL * np.abs(want)
    assert np.all(err <= bound), (
        f"max err {err.max():.3g}, {float(np.max(err / bound)):.3g}x the bound"
    )


# -- ResNet-50, the flagship example (examples/infer_resnet50.py; make resnet50) --------------

EXAMPLES = MODELS.parent


@pytest.fixture(scope="module")
def resnet50():
    import sys

    sys.path.insert(0, str(EXAMPLES))
    import infer_resnet50 as ex

    assert ex.MODEL.exists(), f"{ex.MODEL} is missing: make test builds it (make resnet50)"
    with np.load(ex.SAMPLE) as d:
        sample = {k: d[k] for k in ("images", "x", "logits")}
    sess = npu.InferenceSession(str(ex.MODEL))
    yield ex, sess, sample
    sess.close()


def test_resnet50_input_pipeline_on_the_npu_matches_float64(resnet50):
    ex, _, sample = resnet50
    pipe = ex.Pipeline(*sample["images"].shape[1:3])
    x = pipe(sample["images"][:2])
    assert x.shape == (2, 3, 224, 224) and x.dtype == np.float32
    np.testing.assert_allclose(x, sample["x"][:2], rtol=0, atol=ex.PIPELINE_ATOL)


def test_resnet50_is_one_npu_partition_and_matches_the_reference(resnet50):
    ex, sess, sample = resnet50
    assert [p.provider for p in sess.partitions] == ["NPU"], sess.fallbacks
    got = sess.run(None, {sess.get_inputs()[0].name: sample["x"][:2]})[0]
    want = sample["logits"][:2]
    assert np.abs(got - want).max() <= ex.LOGIT_ATOL * np.abs(want).max()
    assert (got.argmax(1) == want.argmax(1)).all()
    times = sess.node_times()  # every node that became device ops (Flatten is a view)
    assert {t.op_type for t in times} == {"Conv", "MaxPool", "GlobalAveragePool", "Gemm"}
    # The 16 residual Adds run inside their blocks' last convolutions, in place.
    assert sess.rewrites["fuse_residual"] == 16
    assert sum(1 for t in times if any("add" in f.lower() for f in t.fused)) == 16
    assert sum(t.ops for t in times) == 56 and sum(t.device_us for t in times) > 0


# -- int8 models (examples/infer_int8.py; examples/models/quantize_models.py) -----------------


def _predict(sess: npu.InferenceSession, x: np.ndarray) -> np.ndarray:
    name = sess.get_inputs()[0].name
    return np.concatenate(
        [sess.run(None, {name: x[i : i + BATCH]})[0] for i in range(0, len(x), BATCH)]
    )


def test_int8_digits_cnn_is_one_npu_partition_within_a_point_of_fp32():
    x, y = _digits()
    with (
        npu.InferenceSession(str(MODELS / "digits_cnn_int8.onnx")) as s8,
        npu.InferenceSession(str(MODELS / "digits_cnn.onnx")) as s32,
        npu.InferenceSession(str(MODELS / "digits_cnn_int8.onnx"), providers=["CPU"]) as c8,
    ):
        assert [p.provider for p in s8.partitions] == ["NPU"], s8.fallbacks
        assert s8.rewrites.get("fuse_qdq") == 5  # 3 Conv + 2 Gemm: integer ops
        got8, got32 = _predict(s8, x), _predict(s32, x)
        np.testing.assert_array_equal(got8[:BATCH], _predict(c8, x[:BATCH]))
    acc8 = float(np.mean(got8.argmax(1) == y))
    acc32 = float(np.mean(got32.argmax(1) == y))
    assert acc8 >= acc32 - 0.01, (acc8, acc32)


def test_int8_small_resnet_is_one_npu_partition_and_agrees_with_numpy():
    x = np.random.default_rng(12).standard_normal((64, 3, 32, 32)).astype(np.float32)
    with (
        npu.InferenceSession(str(MODELS / "resnet_small_int8.onnx")) as s8,
        npu.InferenceSession(str(MODELS / "resnet_small_int8.onnx"), providers=["CPU"]) as c8,
    ):
        assert [p.provider for p in s8.partitions] == ["NPU"], s8.fallbacks
        got, want = _predict(s8, x), _predict(c8, x)
    # Its pool and residual adds are float sums (last bit order-dependent), so
    # a value before a QuantizeLinear can move by one step: not bit for bit.
    assert float(np.mean(got.argmax(1) == want.argmax(1))) >= 0.95
    step = 0.1  # an upper bound of the logits' output scale (about 0.03)
    assert float(np.mean(np.abs(got - want) > step)) < 0.05
