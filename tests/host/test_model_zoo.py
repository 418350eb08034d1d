"""The benchmark zoo (examples/models/make_zoo.py) on the NPU provider (CPU backend).

Each model of ``make zoo`` runs at batch 1 on its own 224x224 inputs (the
first image of build/models/zoo_sample.npz): VGG-19's classifier fixes the
resolution, ShuffleNet's channel shuffle has constant shapes, and the
others take about a second each on the CPU backend, so nothing is gained by
a smaller resolution. The whole file takes about half a minute, most of it
VGG-19 (143.7 M parameters).

The requirements are docs/models.md's for ResNet-50: the whole network is
one NPU partition, and its logits are within 2e-3 x max |logit| of the
reference (here onnxruntime's, stored by make_zoo.py) with the same top-1
class. The models keep their symbolic batch: ShuffleNet v2's channel Split
and shuffle Transpose are placed on the NPU by their constants and rank,
and planned with the run's real shapes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import npu
from npu.hal import CpuBackend

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "models"))

from make_resnet50 import DEFAULT_OUT  # noqa: E402
from make_zoo import MODELS, SAMPLE  # noqa: E402

# docs/models.md, ResNet-50: |NPU - reference| <= LOGIT_RTOL * max |reference|.
LOGIT_RTOL = 2e-3
Array = npt.NDArray[Any]


def model_path(name: str) -> Path:
    """build/models/<name>.onnx, which must exist (make zoo; make test builds it)."""
    path = DEFAULT_OUT / f"{name}.onnx"
    assert path.exists(), f"{path} is missing: run make zoo"
    return path


@pytest.fixture(scope="module")
def zoo_device() -> Iterator[npu.Device]:
    """One CPU-backend device for the whole module (sessions upload their weights to it)."""
    with npu.Device(CpuBackend()) as dev:
        yield dev


@pytest.fixture(scope="module")
def sample() -> dict[str, Array]:
    """zoo_sample.npz: x [8, 3, 224, 224] and onnxruntime's logits_<model> [8, 1000]."""
    path = DEFAULT_OUT / SAMPLE
    assert path.exists(), f"{path} is missing: run make zoo"
    with np.load(path) as d:
        return {k: np.array(d[k]) for k in d.files}


@pytest.fixture(scope="module")
def zoo_run(
    request: pytest.FixtureRequest, zoo_device: npu.Device, sample: dict[str, Array]
) -> Iterator[tuple[str, npu.InferenceSession, Array]]:
    """(model name, its NPU session, its logits of the first sample image); the model
    is the test's indirect parameter."""
    name: str = request.param
    with npu.InferenceSession(str(model_path(name)), device=zoo_device) as sess:
        (got,) = sess.run(["logits"], {"input": sample["x"][:1]})
        yield name, sess, np.asarray(got)


@pytest.mark.parametrize("zoo_run", list(MODELS), indirect=True)
def test_logits_match_onnxruntime_within_the_resnet50_tolerance(
    zoo_run: tuple[str, npu.InferenceSession, Array], sample: dict[str, Array]
) -> None:
    name, _, got = zoo_run
    want = sample[f"logits_{name}"][:1]
    assert got.shape == (1, 1000) and np.isfinite(got).all()
    assert np.abs(got - want).max() <= LOGIT_RTOL * np.abs(want).max()
    assert got.argmax() == want.argmax()


@pytest.mark.parametrize("zoo_run", list(MODELS), indirect=True)
def test_the_whole_network_is_one_npu_partition(
    zoo_run: tuple[str, npu.InferenceSession, Array],
) -> None:
    _, sess, _ = zoo_run
    assert [p.provider for p in sess.partitions] == ["NPU"], sess.fallbacks


def test_a_batch_of_eight_runs_on_the_plan_of_its_own_shapes(
    zoo_device: npu.Device, sample: dict[str, Array]
) -> None:
    """ShuffleNet's channel Split and shuffle Transpose were placed at a symbolic batch;
    the plan of a batch of 8 (its real shapes) keeps them on the NPU."""
    with npu.InferenceSession(str(model_path("shufflenet_v2")), device=zoo_device) as sess:
        (got,) = sess.run(["logits"], {"input": sample["x"]})
        assert [p.provider for p in sess.partitions] == ["NPU"] and not sess.fallbacks
    want = sample["logits_shufflenet_v2"]
    assert np.abs(np.asarray(got) - want).max() <= LOGIT_RTOL * np.abs(want).max()
