"""Partitioning: which nodes the NPU runs, the fallback notes, and the grouping into subgraphs."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import helper

from npu import _abi
from npu.inference.loader import load_model
from npu.inference.partition import Partition, npu_reason, partition
from npu.inference.rewrite import rewrite
from onnx_models import digits_cnn, make, op_cases, rnd, vi

ALL_CAPS = int(_abi.Cap.TENSOR | _abi.Cap.REDUCE | _abi.Cap.MATMUL | _abi.Cap.CONV)
CASES = op_cases()
# Single-op models whose node stays on the CPU, and why.
CPU_CASES = {
    "Conv_asym_pads": "asymmetric pads",
    "Softplus_reference": "no NPU kernel for Softplus",
    "AveragePool_1d_cpu": "AveragePool on a rank-3 input (NPU: 2-D)",
}


def labels(model: object, caps: int = ALL_CAPS) -> dict[str, str | None]:
    graph = load_model(model)  # type: ignore[arg-type]
    rewrite(graph)
    return {n.name: npu_reason(n, graph, caps) for n in graph.nodes}


def parts(model: object, caps: int = ALL_CAPS) -> list[Partition]:
    graph = load_model(model)  # type: ignore[arg-type]
    rewrite(graph)
    return partition(graph, {n.name: npu_reason(n, graph, caps) is None for n in graph.nodes})


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_single_op_model_lands_on_the_expected_provider(case: str) -> None:
    reasons = labels(CASES[case][0])
    if case in CPU_CASES:
        assert list(reasons.values()) == [CPU_CASES[case]] or all(
            r and CPU_CASES[case] in r for r in reasons.values()
        )
    else:
        assert all(r is None for r in reasons.values()), reasons


def test_digits_cnn_is_one_npu_partition() -> None:
    (p,) = parts(digits_cnn())
    assert p.provider == "NPU"
    assert p.nodes == ("conv1", "pool1", "conv2", "pool2", "flatten", "fc1", "fc2", "softmax")


@pytest.mark.parametrize("op", ["Softplus", "Sin", "Floor"])
def test_an_op_the_npu_lacks_splits_the_graph_npu_cpu_npu(op: str) -> None:
    ps = parts(digits_cnn(middle=op))
    assert [p.provider for p in ps] == ["NPU", "CPU", "NPU"]
    assert ps[1].nodes == ("middle",)


def test_independent_nodes_are_reordered_to_enlarge_npu_partitions() -> None:
    # relu_a (NPU), floor (CPU), relu_b (NPU, independent of floor), add (NPU)
    model = make(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu_a"),
            helper.make_node("Floor", ["x"], ["f"], name="floor"),
            helper.make_node("Relu", ["a"], ["b"], name="relu_b"),
            helper.make_node("Add", ["b", "a"], ["y"], name="add"),
        ],
        [vi("x", [4])],
        [vi("y", [4]), vi("f", [4])],
    )
    ps = parts(model)
    assert ps == [Partition("NPU", ("relu_a", "relu_b", "add")), Partition("CPU", ("floor",))]


def test_a_device_without_conv_caps_runs_convs_on_the_cpu() -> None:
    reasons = labels(digits_cnn(), caps=int(_abi.Cap.TENSOR | _abi.Cap.REDUCE | _abi.Cap.MATMUL))
    assert reasons["conv1"] == "the device lacks the capability for CONV2D"
    assert reasons["pool1"] == "the device lacks the capability for POOL2D"
    assert reasons["fc1"] is None


def test_int64_and_rank_5_tensors_stay_on_the_cpu() -> None:
    model = make(
        [
            helper.make_node("Add", ["i", "i"], ["j"], name="add64"),
            helper.make_node("Relu", ["x"], ["y"], name="relu5"),
        ],
        [vi("i", [3], 7), vi("x", [1, 2, 1, 2, 2])],
        [vi("j", [3], 7), vi("y", [1, 2, 1, 2, 2])],
    )
    reasons = labels(model)
    assert "int64" in str(reasons["add64"])
    assert "rank 5 > 4" in str(reasons["relu5"])


def test_each_fallen_back_node_is_logged_once(
    caplog: pytest.LogCaptureFixture, device: object
) -> None:
    import npu

    caplog.set_level(logging.INFO, logger="npu.inference")
    sess = npu.InferenceSession(digits_cnn(middle="Softplus"), device=device)  # type: ignore[arg-type]
    notes = [r.getMessage() for r in caplog.records if "falls back to the CPU" in r.getMessage()]
    assert notes == [
        "test: node 'middle' (Softplus) falls back to the CPU: no NPU kernel for Softplus"
    ]
    assert sess.fallbacks == [("middle", "Softplus", "no NPU kernel for Softplus")]
    sess.close()


def test_cpu_only_session_has_one_cpu_partition_and_every_node_in_fallbacks() -> None:
    import npu

    sess = npu.InferenceSession(digits_cnn(), providers=("CPU",))
    assert [p.provider for p in sess.partitions] == ["CPU"]
    assert len(sess.fallbacks) == len(sess.graph.nodes)
    x = rnd(np.random.default_rng(0), 1, 1, 28, 28)
    assert sess.run(None, {"x": x})[0].shape == (1, 10)


def test_split_and_transpose_of_a_symbolic_batch_are_placed_on_the_npu() -> None:
    """A channel shuffle with a dynamic batch: the constants and the rank decide."""
    model = make(
        [
            helper.make_node("Split", ["x"], ["a", "b"], axis=1, name="split"),
            helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1, 3], name="shuffle"),
        ],
        [vi("x", ["N", 4, 3, 5])],
        [vi("b", ["N", 2, 3, 5]), vi("t", ["N", 3, 2, 5])],
    )
    assert labels(model) == {"split": None, "shuffle": None}


def test_a_transpose_of_unknown_rank_stays_on_the_cpu() -> None:
    """A reshape to a shape tensor of dynamic length leaves the rank unknown."""
    model = make(
        [
            helper.make_node("Reshape", ["x", "s"], ["r"], name="reshape"),
            helper.make_node("Transpose", ["r"], ["t"], name="shuffle"),
        ],
        [vi("x", [2, 3]), vi("s", ["K"], 7)],
        [vi("t", [2, 3])],
    )
    assert "unknown rank" in str(labels(model)["shuffle"])
