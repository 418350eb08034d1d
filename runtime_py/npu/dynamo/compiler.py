"""Compile an ATen torch.fx graph into NPU graph segments and torch CPU nodes.

:class:`CompiledGraph` is what the ``"npu"`` dynamo backend returns for
one forward graph (``aot_autograd``'s, in ATen ops). At construction it
splits the graph's nodes, in order, into segments: maximal runs of nodes
the NPU can run (:mod:`npu.dynamo.lowering`), and single nodes left to
torch on the CPU, each named once in a logged note with the reason.

At the first call it *captures* every NPU segment into an :class:`npu.Graph`
(the ops are recorded, not run: CUDA Graphs' model) reading device tensors
that hold the segment's inputs; every call then

1. copies each graph input that changed into its device tensor: a torch
   tensor is uploaded only when it is another object, or the same one with
   a new ``_version`` (an in-place update), so parameters and buffers are
   uploaded once;
2. replays the segments and runs the torch nodes between them, handing
   values across as zero-copy numpy views;
3. returns the outputs as new torch tensors (copies: the graph's memory is
   rewritten at the next call, as CUDA graphs' static outputs are).

A lowering that fails while capturing (the NPU refused something the
metadata check allowed) sends that node to torch and the capture starts
over, with a logged note.
"""

from __future__ import annotations

import logging
import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.device import Device
from ..graph import Graph
from ..tensors.factory import empty
from ..tensors.tensor import Tensor
from .lowering import LOWERINGS, Unsupported, check, target_name

__all__ = ["CompiledGraph"]

log = logging.getLogger(__name__)


@dataclass
class _Segment:
    """A run of nodes of one kind: captured NPU nodes, or one torch node."""

    npu: bool
    nodes: list[Any]
    # Values read from outside the segment (NPU segments: kept on the device).
    inputs: list[Any] = field(default_factory=list)
    graph: Graph | None = None
    # NPU segments: the device tensors holding each input during a replay.
    slots: dict[Any, Tensor] = field(default_factory=dict)
    # NPU segments: each node's value, made during the capture and rewritten by replays.
    values: dict[Any, Any] = field(default_factory=dict)


class _Upload:
    """A device tensor fed from torch tensors, re-uploaded only when they change."""

    def __init__(self, slot: Tensor) -> None:
        self.slot = slot
        self._src: weakref.ref[Any] | None = None
        self._version = -1

    def feed(self, value: Any) -> bool:
        """Upload ``value`` unless it is the tensor last uploaded, unchanged; True if copied."""
        src = self._src() if self._src is not None else None
        version = int(getattr(value, "_version", -1))
        if src is value and version == self._version and version >= 0:
            return False
        self.slot.copy_(_torch_to_numpy(value))
        try:
            self._src = weakref.ref(value)
        except TypeError:
            self._src = None
        self._version = version
        return True


def _torch_to_numpy(value: Any) -> np.ndarray[Any, Any]:
    """A torch CPU tensor as a numpy array (a view when the memory allows)."""
    arr: np.ndarray[Any, Any] = value.detach().numpy()
    return arr


class CompiledGraph:
    """One forward graph split into NPU segments and torch nodes (see the module docs).

    Args:
        gm: the ``torch.fx.GraphModule`` (ATen ops) to run.
        device: the NPU.
        name: a label for the logged notes.
    """

    def __init__(self, gm: Any, device: Device, name: str = "graph") -> None:
        self.gm = gm
        self.device = device
        self.name = name
        self._placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._output = next(n for n in gm.graph.nodes if n.op == "output")
        self._body = [n for n in gm.graph.nodes if n.op == "call_function"]
        self._on_cpu: dict[Any, str] = {}
        for node in self._body:
            reason = self._reason(node)
            if reason is not None:
                self._on_cpu[node] = reason
        self._segments: list[_Segment] = []
        self._uploads: dict[Any, _Upload] = {}
        self._captured = False
        #: Host-to-device copies of graph inputs so far (parameters count once).
        self.uploads = 0
        for node, reason in self._on_cpu.items():
            if node.target is not operator.getitem:
                log.info("%s: %s runs on the CPU (torch): %s", name, node.name, reason)

    # -- planning ---------------------------------------------------------------------------

    @property
    def npu_nodes(self) -> list[str]:
        """Names of the nodes the NPU runs."""
        return [n.name for n in self._body if n not in self._on_cpu]

    @property
    def num_graphs(self) -> int:
        """How many captured NPU graphs a call replays (0 before the first call)."""
        return sum(1 for s in self._segments if s.npu and s.graph is not None)

    @property
    def cpu_nodes(self) -> dict[str, str]:
        """Names of the nodes torch runs on the CPU, with the reason."""
        return {n.name: r for n, r in self._on_cpu.items() if n.target is not operator.getitem}

    def _reason(self, node: Any) -> str | None:
        if node.target is operator.getitem:
            return "its tuple is computed by torch" if node.args[0] in self._on_cpu else None
        op = target_name(node.target)
        fakes = [a.meta.get("val") for a in _arg_nodes(node) if hasattr(a.meta.get("val"), "shape")]
        used = {int(u.args[1]) for u in node.users if u.target is operator.getitem}
        return check(op, fakes, node.meta.get("val"), used or {0})

    def _segment(self) -> None:
        self._segments = []
        for node in self._body:
            npu = node not in self._on_cpu
            if npu and self._segments and self._segments[-1].npu:
                self._segments[-1].nodes.append(node)
            else:
                self._segments.append(_Segment(npu, [node]))
        for seg in self._segments:
            inside = set(seg.nodes)
            seen: set[Any] = set()
            for node in seg.nodes:
                for a in _arg_nodes(node):
                    if a not in inside and a not in seen:
                        seen.add(a)
                        seg.inputs.append(a)

    # -- running ----------------------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        env: dict[Any, Any] = dict(zip(self._placeholders, args, strict=True))
        if not self._captured:
            self._capture(env)
        for seg in self._segments:
            if seg.npu:
                self._feed(seg, env)
                assert seg.graph is not None
                seg.graph.replay()
                env.update(seg.values)
            else:
                self._run_torch(seg.nodes[0], env)
        return self._outputs(env)

    def _capture(self, env: dict[Any, Any]) -> None:
        while True:
            self._segment()
            try:
                for seg in self._segments:
                    if seg.npu:
                        self._capture_segment(seg, env)
                    else:
                        self._run_torch(seg.nodes[0], env)
            except _Refused as exc:
                self._on_cpu[exc.node] = exc.reason
                log.info("%s: %s runs on the CPU (torch): %s", self.name, exc.node.name, exc.reason)
                for n in list(env):
                    if n not in self._placeholders:
                        del env[n]
                continue
            self._captured = True
            log.info("%s: captured %s", self.name, describe(self._segments))
            return

    def _capture_segment(self, seg: _Segment, env: dict[Any, Any]) -> None:
        seg.slots = {}
        for a in seg.inputs:
            val = env[a]
            if _is_torch_tensor(val):
                seg.slots[a] = self._upload(a).slot
        self._feed(seg, env)
        local: dict[Any, Any] = {}
        for a in seg.inputs:
            local[a] = seg.slots.get(a, env[a])
        graph = Graph(self.device)
        with graph.capture():
            for node in seg.nodes:
                local[node] = self._lower(node, local)
        seg.graph = graph
        graph.replay()
        seg.values = {node: local[node] for node in seg.nodes}
        env.update(seg.values)

    def _upload(self, node: Any) -> _Upload:
        """The device tensor that holds torch value ``node`` for the NPU segments reading it."""
        up = self._uploads.get(node)
        if up is None:
            fake = node.meta.get("val")
            shape = tuple(int(s) for s in (fake.shape if fake is not None else ()))
            up = _Upload(empty(shape, device=self.device))
            self._uploads[node] = up
        return up

    def _feed(self, seg: _Segment, env: dict[Any, Any]) -> None:
        for a in seg.slots:
            self.uploads += self._uploads[a].feed(env[a])

    def _lower(self, node: Any, local: dict[Any, Any]) -> Any:
        if node.target is operator.getitem:
            return local[node.args[0]][int(node.args[1])]
        fn = LOWERINGS[target_name(node.target)]
        args = _map(node.args, local)
        kwargs = {k: _map(v, local) for k, v in node.kwargs.items()}
        try:
            return fn(*args, **kwargs)
        except (Unsupported, ValueError, TypeError) as exc:
            raise _Refused(node, f"the NPU refused it: {exc}") from exc

    def _run_torch(self, node: Any, env: dict[Any, Any]) -> None:
        args = _map(node.args, env, to_torch=True)
        kwargs = {k: _map(v, env, to_torch=True) for k, v in node.kwargs.items()}
        env[node] = node.target(*args, **kwargs)

    def _outputs(self, env: dict[Any, Any]) -> Any:
        def out(v: Any) -> Any:
            val = env[v] if _is_node(v) else v
            if isinstance(val, Tensor):
                return val.to_torch().clone()
            return val

        return _tree_map(self._output.args[0], out)


class _Refused(Exception):
    def __init__(self, node: Any, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


def _is_node(v: Any) -> bool:
    return hasattr(v, "op") and hasattr(v, "target") and hasattr(v, "users")


def _is_torch_tensor(v: Any) -> bool:
    return type(v).__module__.startswith("torch") and hasattr(v, "_version")


def _arg_nodes(node: Any) -> list[Any]:
    found: list[Any] = []
    _tree_map((node.args, node.kwargs), lambda v: found.append(v) if _is_node(v) else None)
    return found


def _tree_map(value: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_tree_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _tree_map(v, fn) for k, v in value.items()}
    return fn(value)


def _map(value: Any, env: dict[Any, Any], to_torch: bool = False) -> Any:
    def one(v: Any) -> Any:
        if not _is_node(v):
            return v
        val = env[v]
        if to_torch and isinstance(val, Tensor):
            return val.to_torch()
        return val

    return _tree_map(value, one)


def describe(segments: Sequence[_Segment]) -> str:
    """``"NPU[12] CPU[1] NPU[30]"``: the segments' kinds and sizes."""
    return " ".join(f"{'NPU' if s.npu else 'CPU'}[{len(s.nodes)}]" for s in segments)
