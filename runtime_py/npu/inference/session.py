"""``InferenceSession``: the model runner's public face (onnxruntime-like).

A session loads and checks the model (:mod:`.loader`), rewrites it
(:mod:`.rewrite`), labels each node NPU or CPU and partitions the graph
(:mod:`.partition`), uploads the NPU's weights (:mod:`.npu_provider`) and
picks a CPU kernel for every other node (:mod:`.cpu`). :meth:`run` executes
the partitions in order; NPU partitions are compiled into plans on the first
run of each input-shape signature and replayed afterwards.
"""

from __future__ import annotations

import errno
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from onnx import helper

from .. import _spans
from .._abi import Cap
from .._closing import Closing
from ..core.device import DeviceArg, resolve_device
from ..core.stream import current_user_stream
from ..errors import NpuError, NpuTimeoutError
from .cpu import Array, Kernel, cpu_kernel
from .graph import Dim, ModelError, Node, elem_type
from .loader import ModelSource, load_model
from .npu_provider import NpuProvider, PartitionPlan, Val, free_buffers
from .partition import Partition, npu_reason, partition
from .rewrite import rewrite

__all__ = ["InferenceSession", "NodeArg", "NodeTime", "RunFuture", "RunProfile"]

log = logging.getLogger(__name__)

_PROVIDERS = ("NPU", "CPU")
#: Runs of :meth:`InferenceSession.run_async` in flight at once (each has a plan).
_PIPELINE_SLOTS: Final = 2


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output: name, shape (ints, dim names or None) and numpy dtype."""

    name: str
    shape: list[Dim]
    dtype: np.dtype[Any] | None

    @property
    def type(self) -> str:
        """The onnxruntime-style type string, e.g. ``"tensor(float)"``."""
        if self.dtype is None:
            return "tensor(unknown)"
        elem = elem_type(self.dtype)
        name = helper.tensor_dtype_to_string(elem).removeprefix("TensorProto.").lower()
        return f"tensor({name})"


@dataclass
class RunProfile:
    """Where the time of one :meth:`InferenceSession.run` went, in seconds.

    ``upload_s``: copying inputs into device buffers; ``compute_s``: NPU
    submit + wait; ``cpu_s``: CPU partitions; ``download_s``: copying the
    outputs out; ``total_s``: the whole call. ``planned`` is true when the
    run had to compile a plan first (its time is in ``total_s`` only).
    """

    upload_s: float = 0.0
    compute_s: float = 0.0
    cpu_s: float = 0.0
    download_s: float = 0.0
    total_s: float = 0.0
    planned: bool = False


@dataclass(frozen=True)
class NodeTime:
    """The device time of one node's NPU ops in the last run (:meth:`InferenceSession.node_times`).

    ``name`` and ``op_type`` are the node's after the rewrites (a Conv that
    absorbed a BatchNormalization and a Relu lists them in ``fused``);
    ``ops`` is how many device ops it became, ``device_us`` their summed
    device time (each op's completion record, ``t_end - t_start``).
    """

    name: str
    op_type: str
    fused: tuple[str, ...]
    ops: int
    device_us: float


Signature = tuple[tuple[str, tuple[int, ...], str], ...]


class RunFuture:
    """The outputs of one :meth:`InferenceSession.run_async`, once its run completes.

    Like ``concurrent.futures.Future``: :meth:`done` polls, :meth:`result`
    waits. A run completes when the caller waits for it, or when the session
    needs its buffers (a later ``run_async``, :meth:`InferenceSession.run`
    or ``close``): its outputs are then copied out, and a device error is
    kept to be raised by :meth:`result`.

    Attributes:
        profile: the :class:`RunProfile` of the run: ``upload_s`` writing its
            inputs, ``compute_s`` its SUBMIT and the wait for it,
            ``download_s`` copying its outputs, ``total_s`` from
            ``run_async`` to completion.
        device_ns: ``(t_start, t_end)`` of its ops on the device clock (the
            first op's start, the last op's end, from their completion
            records), or None (not pipelined, or the records were reused).
    """

    def __init__(
        self,
        names: list[str],
        profile: RunProfile,
        outs: list[Array] | None = None,
        run: tuple[NpuProvider, PartitionPlan, int, Callable[[RunFuture], None]] | None = None,
        started: float | None = None,
    ) -> None:
        self._names = names
        self.profile = profile
        self.device_ns: tuple[int, int] | None = None
        self._started = time.perf_counter() if started is None else started
        self._outs = outs
        self._error: Exception | None = None
        # In flight: the provider, the plan whose buffers the run uses, the
        # fence of its last op, and the session's hook to call on completion.
        self._run = run

    def __repr__(self) -> str:
        return f"<npu.RunFuture {'done' if self._run is None else 'in flight'}>"

    @property
    def plan(self) -> PartitionPlan | None:
        """The plan whose buffers the run uses while in flight (None once done)."""
        return None if self._run is None else self._run[1]

    def done(self) -> bool:
        """True once the run has completed (its outputs or its error are ready)."""
        try:
            self._complete(0.0)
        except NpuTimeoutError:
            return False
        return True

    def result(self, timeout_s: float | None = None) -> list[Array]:
        """Wait for the run (up to ``timeout_s`` seconds; None: the runner's
        usual wait) and return its outputs, as :meth:`InferenceSession.run` does.

        Raises:
            NpuTimeoutError: not done within ``timeout_s`` (the run goes on).
            NpuDeviceError: an op failed on the device (the context names the node).
        """
        self._complete(timeout_s)
        if self._error is not None:
            raise self._error
        assert self._outs is not None
        return self._outs

    def wait(self) -> None:
        """Complete the run (its outputs copied out, or its error kept)."""
        self._complete(None)

    def _complete(self, timeout_s: float | None) -> None:
        """Wait up to ``timeout_s`` (None: WAIT_TIMEOUT_S, a timeout then kept as
        the run's error); NpuTimeoutError when a given ``timeout_s`` expires."""
        if self._run is None:
            return
        provider, plan, fence, finished = self._run
        t0 = time.perf_counter()
        try:
            if timeout_s is None:
                provider.wait_plan(plan, fence)
            else:
                provider.wait_plan(plan, fence, timeout_s)
        except NpuTimeoutError as exc:
            if timeout_s is not None:
                raise
            self._error = exc
        except (NpuError, RuntimeError) as exc:
            self._error = exc
        t1 = time.perf_counter()
        self.profile.compute_s += t1 - t0
        if self._error is None:
            outputs = dict(plan.outputs)
            self._outs = [_copy_value(outputs[n]) for n in self._names]
            self.profile.download_s = time.perf_counter() - t1
            self.device_ns = provider.device_span(plan)
        self.profile.total_s = time.perf_counter() - self._started
        self._run = None
        finished(self)


class InferenceSession(Closing):
    """Run an ONNX model with the NPU and a numpy CPU fallback.

    Args:
        model: a path, the bytes of a model file or an ``onnx.ModelProto``.
        device: the NPU (default: :func:`npu.default_device`, opened only
            when the NPU provider is used).
        providers: ``("NPU", "CPU")`` (default) or ``("CPU",)`` to run
            everything with numpy (the CPU provider always backs the NPU).
        concurrent: let independent NPU ops (Inception's branches, a
            projection shortcut) run at the same time on the device's AI
            cores, where it can (``Cap.CONCURRENT``); False keeps one op at
            a time. The results are the same either way.

    Raises:
        ModelError: the model is malformed or uses an op neither provider
            runs (the message names the node and the reason).
        ValueError: an unknown provider name.

    Attributes:
        partitions: the :class:`Partition` runs, in execution order.
        fallbacks: ``(node name, op_type, reason)`` of every node not on the NPU.
        last_profile: the :class:`RunProfile` of the last :meth:`run`.
        rewrites: how often each graph rewrite applied.
    """

    def __init__(
        self,
        model: ModelSource,
        device: DeviceArg = None,
        providers: Sequence[str] = _PROVIDERS,
        *,
        concurrent: bool = True,
    ) -> None:
        provs = tuple(providers)
        bad = [p for p in provs if p not in _PROVIDERS]
        if bad or not provs:
            raise ValueError(f"unknown providers {bad or provs}; choose from {_PROVIDERS}")
        graph = load_model(model)
        self.source = graph.source
        self._declared = {n: graph.tensor_info(n) for n in [*graph.inputs, *graph.outputs]}
        self.providers = provs
        use_npu = "NPU" in provs
        self.device: DeviceArg = None
        caps = 0
        if use_npu:
            self.device = resolve_device(device)
            caps = int(self.device.info.caps)
        # Residual adds and ReLU6 fuse into convolutions only for an NPU that
        # has them (a CPU-only session keeps the ONNX nodes).
        self.rewrites = rewrite(
            graph,
            residual=bool(caps & Cap.CONV_ACCUMULATE),
            relu6=bool(caps & Cap.ACT_RELU6),
        )
        self.graph = graph
        self.fallbacks: list[tuple[str, str, str]] = []
        on_npu: dict[str, bool] = {}
        for node in graph.nodes:
            reason = npu_reason(node, graph, caps) if use_npu else "the NPU provider is not enabled"
            on_npu[node.name] = reason is None
            if reason is not None:
                self.fallbacks.append((node.name, node.op_type, reason))
                if use_npu:
                    log.info(
                        "%s: %s falls back to the CPU: %s", graph.source, node.describe(), reason
                    )
        self._nodes = {n.name: n for n in graph.nodes}
        self._kernels: dict[str, Kernel] = {
            n.name: cpu_kernel(n, graph) for n in graph.nodes if not on_npu[n.name]
        }
        self.partitions: list[Partition] = partition(graph, on_npu)
        self._part_nodes = [[self._nodes[n] for n in p.nodes] for p in self.partitions]
        self._escapes = self._escape_sets()
        self._npu: NpuProvider | None = None
        self._buffers: list[Any] = []
        if use_npu and any(on_npu.values()):
            assert self.device is not None
            self._npu = NpuProvider(
                self.device,
                graph,
                [n for n in graph.nodes if on_npu[n.name]],
                concurrent=concurrent,
            )
            self._buffers = self._npu.buffers
        self._finalizer = weakref.finalize(self, free_buffers, self._buffers)
        self._plans: dict[Signature, list[PartitionPlan | None]] = {}
        # The NPU plans the last run executed, in order (node_times reads them).
        self._last_plans: list[PartitionPlan] | None = None
        self._device_vals: dict[Signature, dict[str, Val]] = {}
        # Per input signature, the NPU partitions the NPU could not plan.
        self._cpu_parts: dict[Signature, set[int]] = {}
        self._on_cpu: set[str] = set()
        # run_async: the plans each signature's pipelined runs take turns
        # on, and the runs in flight, oldest first.
        self._slots: dict[Signature, list[PartitionPlan]] = {}
        self._inflight: deque[RunFuture] = deque()
        self.last_profile = RunProfile()
        # Node-time reads deferred to the end of a profile: (ops, read), and the
        # profile's log they belong to.
        self._node_reads: list[tuple[int, Callable[[_spans.SpanLog], None]]] = []
        self._node_reads_log: _spans.SpanLog | None = None
        log.info(
            "%s: %d nodes in %d partitions (%d on the NPU); rewrites %s",
            graph.source,
            len(graph.nodes),
            len(self.partitions),
            sum(on_npu.values()),
            self.rewrites or "none",
        )

    # -- introspection ------------------------------------------------------------

    def get_inputs(self) -> list[NodeArg]:
        """The graph inputs (initializers excluded)."""
        return [self._arg(n) for n in self.graph.inputs]

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs."""
        return [self._arg(n) for n in self.graph.outputs]

    def _arg(self, name: str) -> NodeArg:
        info = self._declared[name]
        return NodeArg(name, list(info.shape or ()), info.dtype)

    @property
    def weight_uploads(self) -> int:
        """How many times weights were uploaded to the device (1 with NPU nodes, else 0)."""
        return self._npu.weight_uploads if self._npu is not None else 0

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        """Complete the runs in flight, then free the session's device buffers
        (weights and plans). Idempotent."""
        self._drain()
        self._slots.clear()
        self._plans.clear()
        self._device_vals.clear()
        self._finalizer()

    # -- running ------------------------------------------------------------------------

    def _escape_sets(self) -> list[set[str]]:
        """Per partition, the tensors it produces that are read after it."""
        owner: dict[str, int] = {}
        for k, nodes in enumerate(self._part_nodes):
            for n in nodes:
                for o in n.outputs:
                    owner[o] = k
        escapes: list[set[str]] = [set() for _ in self._part_nodes]
        for k, nodes in enumerate(self._part_nodes):
            for n in nodes:
                for i in n.inputs:
                    if i in owner and owner[i] != k:
                        escapes[owner[i]].add(i)
        for o in self.graph.outputs:
            if o in owner:
                escapes[owner[o]].add(o)
        # Views alias their producer: an escaping view keeps its base live too
        # (storage lifetime is per storage, so the view's name suffices).
        return escapes

    def _feeds(self, feeds: Mapping[str, npt.ArrayLike]) -> dict[str, Array]:
        unknown = [k for k in feeds if k not in self.graph.inputs]
        if unknown:
            raise ValueError(
                f"{self.source}: unknown inputs {unknown}; inputs: {self.graph.inputs}"
            )
        env: dict[str, Array] = {}
        for name in self.graph.inputs:
            if name not in feeds:
                raise ValueError(f"{self.source}: missing input {name!r}")
            info = self._declared[name]
            value = feeds[name]
            if value is None or isinstance(value, (list, tuple, dict)):
                # A sequence, map or empty optional: the CPU kernels take it as is.
                env[name] = value  # type: ignore[assignment]
                continue
            arr = np.asarray(value)
            if (
                info.dtype is not None
                and info.dtype.fields is not None
                and arr.dtype.fields is None
                and arr.dtype.itemsize == info.dtype.itemsize
                and arr.dtype.kind in "uiV"
            ):
                # bfloat16, float8, int4: the raw bits (numpy_helper gives uint16
                # for bfloat16) in onnx.reference's dtype.
                arr = arr.view(info.dtype)
            if info.dtype is not None and arr.dtype != info.dtype:
                if not np.can_cast(arr.dtype, info.dtype, casting="same_kind"):
                    raise ValueError(
                        f"{self.source}: input {name!r} is {arr.dtype}, the model wants "
                        f"{info.dtype}"
                    )
                arr = arr.astype(info.dtype)
            if info.shape is not None:
                ok = len(info.shape) == arr.ndim and all(
                    not isinstance(d, int) or d == s
                    for d, s in zip(info.shape, arr.shape, strict=False)
                )
                if not ok:
                    raise ValueError(
                        f"{self.source}: input {name!r} has shape {arr.shape}, the model "
                        f"wants {list(info.shape)}"
                    )
            env[name] = arr
        return env

    def run(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, npt.ArrayLike]
    ) -> list[Array]:
        """Run the model; return the requested outputs (all when ``output_names`` is None).

        Raises:
            ValueError: missing, unknown or mis-shaped inputs, or an unknown output.
            NpuError: the device or driver failed (the context names the node).
            RuntimeError: a CPU kernel failed (the message names the node).

        While an :func:`npu.profiler.profile` records, the run is a host span
        (``InferenceSession.run``), each node run on the CPU a host span, and
        each NPU node a device span from its ops' completion records.
        """
        rec = _spans.recorder
        if rec is None:
            return self._run(output_names, input_feed, None)
        t0 = _spans.now()
        args: dict[str, Any] = {"model": str(self.source)}
        try:
            return self._run(output_names, input_feed, rec)
        finally:
            if rec.record_shapes:
                args["shapes"] = {
                    k: list(np.shape(v)) for k, v in input_feed.items() if isinstance(v, np.ndarray)
                }
            rec.add("InferenceSession.run", t0, _spans.now(), args)

    def _run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, npt.ArrayLike],
        rec: _spans.SpanLog | None,
    ) -> list[Array]:
        t_start = time.perf_counter()
        names = self._output_names(output_names)
        self._check_open()
        env = self._feeds(input_feed)
        self._drain()  # the buffers of the plans are the runs' in flight
        prof = RunProfile()
        sig = self._signature_of(env)
        plans = self._plans_for(sig)
        ran: list[PartitionPlan] = []
        initializers = self.graph.initializers
        opset = self.graph.opset
        for k, part in enumerate(self.partitions):
            nodes = self._part_nodes[k]
            if part.provider == "CPU":
                t0 = time.perf_counter()
                for node in nodes:
                    self._run_cpu(node, env, initializers, opset)
                prof.cpu_s += time.perf_counter() - t0
                continue
            assert self._npu is not None
            cpu_parts = self._cpu_parts.setdefault(sig, set())
            if k in cpu_parts:
                t0 = time.perf_counter()
                for node in nodes:
                    self._run_cpu(node, env, initializers, opset)
                prof.cpu_s += time.perf_counter() - t0
                continue
            plan = plans[k]
            if plan is None:
                plan = self._build_plan(k, sig, env)
                if plan is None:
                    t0 = time.perf_counter()
                    for node in nodes:
                        self._run_cpu(node, env, initializers, opset)
                    prof.cpu_s += time.perf_counter() - t0
                    continue
                prof.planned = True
            up, comp = self._npu.run_plan(plan, env)
            if rec is not None:
                self._defer_nodes(rec, plan)
            ran.append(plan)
            prof.upload_s += up
            prof.compute_s += comp
        t0 = time.perf_counter()
        outs = []
        for n in names:
            outs.append(_copy_value(env[n] if n in env else initializers[n]))
        prof.download_s = time.perf_counter() - t0
        prof.total_s = time.perf_counter() - t_start
        self.last_profile = prof
        self._last_plans = ran
        return outs

    def run_async(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, npt.ArrayLike]
    ) -> RunFuture:
        """Start a run and return at once: a :class:`RunFuture` of its outputs.

        Pipelining: while the device computes one run, the caller can feed
        the next. Up to two runs are in flight, each with its own input,
        activation and output buffers (a second copy of the plan, made at
        the first run that overlaps another), so the inputs of run k+1 are
        written, and the outputs of run k-1 read, while run k computes. A
        third ``run_async`` first completes the oldest run in flight (its
        outputs are copied into its future); :meth:`run` and :meth:`close`
        complete them all. Results equal :meth:`run`'s.

        Runs are pipelined when the model is one NPU partition that the NPU
        plans for these shapes, on the default stream; any other run
        happens inside this call (the future is done when it returns).

        Raises:
            ValueError, NpuError: as :meth:`run`, for errors found before the
                device runs; device errors raise from :meth:`RunFuture.result`.
        """
        t_start = time.perf_counter()
        names = self._output_names(output_names)
        self._check_open()
        env = self._feeds(input_feed)
        plan = self._async_slot(env)
        if plan is None:
            outs = self.run(names, env)
            return RunFuture(names, self.last_profile, outs)
        assert self._npu is not None
        rec = _spans.recorder
        t_rec = _spans.now() if rec is not None else 0
        prof = RunProfile()
        prof.upload_s = self._npu.upload(plan, env)
        t0 = time.perf_counter()
        fence = self._npu.submit_plan(plan)
        prof.compute_s = time.perf_counter() - t0
        if rec is not None:
            args = {"model": str(self.source), "queue": 0, "fence": fence}
            rec.add("InferenceSession.run_async", t_rec, _spans.now(), args)
        future = RunFuture(names, prof, run=(self._npu, plan, fence, self._finish), started=t_start)
        self._inflight.append(future)
        return future

    def _async_slot(self, env: dict[str, Array]) -> PartitionPlan | None:
        """The plan the next pipelined run of ``env`` uses (its runs completed), or
        None when such a run cannot be pipelined."""
        if (
            self._npu is None
            or len(self.partitions) != 1
            or self.partitions[0].provider != "NPU"
            or current_user_stream(self._npu.device) is not None
        ):
            return None
        sig = self._signature_of(env)
        plans = self._plans_for(sig)
        if sig in self._cpu_parts:
            return None
        first = plans[0] if plans[0] is not None else self._build_plan(0, sig, env)
        if first is None:
            return None
        slots = self._slots.setdefault(sig, [first])
        while True:
            busy = {id(f.plan) for f in self._inflight}
            free = [p for p in slots if id(p) not in busy]
            if free:
                return free[0]
            if len(slots) < _PIPELINE_SLOTS:
                nodes = self._part_nodes[0]
                known = dict(self._npu.weights)
                extra = self._npu.build(
                    nodes, known, _host_shapes(nodes, known, env), self._escapes[0]
                )
                slots.append(extra)
                return extra
            self._inflight[0].wait()

    def _drain(self) -> None:
        """Complete every run in flight, oldest first (their errors stay in their futures)."""
        while self._inflight:
            self._inflight[0].wait()

    def _finish(self, future: RunFuture) -> None:
        """``future`` completed (called by it): it no longer holds its plan."""
        if future in self._inflight:
            self._inflight.remove(future)

    def _output_names(self, output_names: Sequence[str] | None) -> list[str]:
        names = list(self.graph.outputs) if output_names is None else list(output_names)
        bad = [n for n in names if n not in self.graph.outputs]
        if bad:
            raise ValueError(f"{self.source}: unknown outputs {bad}; outputs: {self.graph.outputs}")
        return names

    def _check_open(self) -> None:
        if self._finalizer is not None and not self._finalizer.alive and self._npu is not None:
            raise NpuError(errno.EBADF, "session is closed", f"InferenceSession({self.source})")

    def _signature_of(self, env: dict[str, Array]) -> Signature:
        return tuple(_signature(n, env[n]) for n in self.graph.inputs)

    def _plans_for(self, sig: Signature) -> list[PartitionPlan | None]:
        plans = self._plans.get(sig)
        if plans is None:
            plans = [None] * len(self.partitions)
            self._plans[sig] = plans
            self._device_vals[sig] = dict(self._npu.weights) if self._npu is not None else {}
        return plans

    def _build_plan(self, k: int, sig: Signature, env: dict[str, Array]) -> PartitionPlan | None:
        """Compile NPU partition ``k`` for ``sig`` (None: it runs on the CPU for ``sig``)."""
        assert self._npu is not None
        known = self._device_vals[sig]
        nodes = self._part_nodes[k]
        host = _host_shapes(nodes, known, env)
        try:
            plan = self._npu.build(nodes, known, host, self._escapes[k])
        except ModelError as exc:
            # The NPU cannot plan these shapes: the partition runs on the CPU
            # for this input signature (a note, not an error).
            self._plan_on_cpu(k, nodes, sig, str(exc))
            return None
        self._plans[sig][k] = plan
        for name in self._escapes[k]:
            if name in plan.vals:
                known[name] = plan.vals[name]
        return plan

    def node_times(self) -> list[NodeTime]:
        """Per NPU node, the device time of its ops in the last :meth:`run`, in run order.

        Read from the device's completion records, so call it right after
        the run (the records of a partition are reused after
        ``ring_entries`` later ops on queue 0). Runs inside ``with stream:``
        are not covered.

        Raises:
            NpuError: no run yet, the last run was on a user stream, or its
                records were reused (``ENOENT``).
        """
        if self._last_plans is None:
            raise NpuError(errno.ENOENT, "no run to report", f"InferenceSession({self.source})")
        times: dict[str, list[Any]] = {}
        for plan in self._last_plans:
            assert self._npu is not None  # only the NPU provider makes plans
            for node, ns in self._npu.op_times(plan):
                t = times.setdefault(node.name, [node, 0, 0])
                t[1] += 1
                t[2] += ns
        return [
            NodeTime(n.name, n.op_type, tuple(n.fused), ops, ns / 1000.0)
            for n, ops, ns in times.values()
        ]

    def _defer_nodes(self, rec: _spans.SpanLog, plan: PartitionPlan) -> None:
        """Have the profile read ``plan``'s run's node times when it ends (the
        FENCE_INFO ioctls stay out of the run), or sooner: before later runs
        could reuse the completion records (half a ring of ops pending)."""
        assert self._npu is not None
        if len(plan.fences) != len(plan.chunks):  # a user-stream run: no records
            return
        fences = list(plan.fences)
        host_end = _spans.now()
        done = [False]

        def read(log_: _spans.SpanLog) -> None:
            if not done[0]:
                done[0] = True
                self._record_nodes(log_, plan, fences, host_end)

        ops = sum(len(c) for c in plan.chunks)
        pending = self._node_reads if self._node_reads_log is rec else []
        if sum(n for n, _ in pending) + ops > self._npu.device.info.ring_entries // 2:
            for _, earlier in pending:
                earlier(rec)
            pending = []
        pending.append((ops, read))
        self._node_reads, self._node_reads_log = pending, rec
        rec.defer(read)

    def _record_nodes(
        self, rec: _spans.SpanLog, plan: PartitionPlan, fences: list[int], host_end: int
    ) -> None:
        """One device span per NPU node of ``plan``'s run that ended with
        ``fences``, from its ops' completion records: the first op's start to
        the last op's end."""
        assert self._npu is not None
        try:
            records = self._npu.op_records(plan, fences)
        except NpuError as exc:  # records reused
            log.debug("%s: no node times for the profile: %s", self.source, exc)
            return
        if not records:
            return
        device = self._npu.device
        name = device.name.replace(":", "")
        host_clock = device.kind == "cpu"
        anchor = (records[-1][3], host_end)
        by_node: dict[str, list[Any]] = {}
        for node, fence, t0, t1 in records:
            entry = by_node.get(node.name)
            if entry is None:
                by_node[node.name] = [node, fence, fence, t0, t1, 1, t1 - t0]
            else:
                entry[2] = fence
                entry[3] = min(entry[3], t0)
                entry[4] = max(entry[4], t1)
                entry[5] += 1
                entry[6] += t1 - t0
        for node, first, last, t0, t1, count, busy in by_node.values():
            args = {
                "op_type": node.op_type,
                "fused": list(node.fused),
                "ops": count,
                "fences": (first, last),
                "device_us": busy / 1000.0,
                "provider": "NPU",
            }
            rec.device(
                _spans.DeviceSpan(node.name, name, 0, first, t0, t1, host_clock, anchor, args)
            )

    def _plan_on_cpu(self, k: int, nodes: list[Node], sig: Signature, why: str) -> None:
        self._cpu_parts.setdefault(sig, set()).add(k)
        for node in nodes:
            if node.name not in self._kernels:
                self._kernels[node.name] = cpu_kernel(node, self.graph)
            entry = (node.name, node.op_type, why)
            if entry not in self.fallbacks:  # once per reason, not per input signature
                self.fallbacks.append(entry)
            self._on_cpu.add(node.name)
        log.info("%s: partition %d runs on the CPU: %s", self.source, k, why)

    @property
    def placement(self) -> dict[str, str]:
        """Node name -> ``"NPU"`` or ``"CPU"``: where each node ran (or will run).

        A node of an NPU partition that the NPU could not plan for the input
        shapes of a run counts as ``"CPU"`` from that run on.
        """
        out = {}
        for part, nodes in zip(self.partitions, self._part_nodes, strict=True):
            for n in nodes:
                cpu = part.provider == "CPU" or n.name in self._on_cpu
                out[n.name] = "CPU" if cpu else "NPU"
        return out

    def _run_cpu(
        self, node: Node, env: dict[str, Array], initializers: dict[str, Array], opset: int
    ) -> None:
        xs: list[Array | None] = []
        for i in node.inputs:
            if not i:
                xs.append(None)
            elif i in env:
                xs.append(env[i])
            else:
                xs.append(initializers[i])
        rec = _spans.recorder
        t0 = _spans.now() if rec is not None else 0
        try:
            outs = self._kernels[node.name](node, xs, opset)
        except Exception as exc:
            raise RuntimeError(
                f"{self.source}: {node.describe()} failed on the CPU: {type(exc).__name__}: {exc}"
            ) from exc
        if rec is not None:
            rec.add(node.name, t0, _spans.now(), {"op_type": node.op_type, "provider": "CPU"})
        for name, val in zip(node.outputs, outs, strict=False):
            if name:
                env[name] = val


def _host_shapes(
    nodes: list[Node], known: Mapping[str, Val], env: Mapping[str, Any]
) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
    """Shape and dtype of each host array that ``nodes`` read (not on the device)."""
    host = {}
    for node in nodes:
        for i in node.inputs:
            if i and i not in known and i in env:
                host[i] = (tuple(env[i].shape), env[i].dtype)
    return host


def _signature(name: str, value: Any) -> tuple[str, tuple[int, ...], str]:
    """What a plan depends on: a tensor's shape and dtype (other values: their type)."""
    if isinstance(value, np.ndarray):
        return (name, tuple(value.shape), value.dtype.str)
    return (name, (), type(value).__name__)


def _copy_value(value: Any) -> Any:
    """An output the caller owns: a tensor copied, a sequence element by element."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [_copy_value(v) for v in value]
    if isinstance(value, dict):
        return dict(value)
    return np.array(value, copy=True)
