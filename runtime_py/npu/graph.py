"""Graphs: record a sequence of tensor ops once, replay it with one SUBMIT.

The model is CUDA Graphs' (``torch.cuda.graph``): inside
:meth:`Graph.capture` the tensor functions (``npu.add``, ``npu.matmul``,
``x @ w``, ...) do not submit anything; they allocate their outputs and
record their ops. :meth:`Graph.replay` then submits the recorded ops,
packed once, in as few SUBMITs as the driver allows, and the tensors made
during the capture hold the new results once :meth:`Graph.synchronize` (or
their ``.numpy()``) returns. A replay on the default stream costs one ioctl
per 256 ops instead of the Python work and the ioctl of every op; inside
``with stream:`` (or with ``replay(stream)``) the ops go to that user stream
with no ioctl at all: their descriptors and parameter blocks are built at
the first such replay, and each replay copies them into the ring and the
stream's arena (a few numpy statements per half ring) and rings the
doorbell.

Rules, as for CUDA graphs:

- The graph keeps the memory of every tensor made during the capture, so
  the same buffers are read and written at every replay. Inputs are tensors
  made before the capture; change them between replays with
  :meth:`npu.Tensor.copy_` (or use :func:`npu.from_numpy` tensors and change
  the array), never while a replay runs. A replay is ordered after inputs
  still being computed on another stream, as an eager op is (see
  :mod:`npu.tensors.tensor`), after reads of its outputs still pending on other
  streams, and after the graph's previous replay when that ran on another
  stream (both use the graph's memory).
- No waiting inside a capture: ``.numpy()``, ``.wait()`` and ``.item()``
  raise ``RuntimeError``. Uploads (``npu.tensor(...)``) run at once; their
  values are constants of the graph.
- Ops of the raw layer (``Device.submit``) are not recorded and raise
  ``RuntimeError`` during a capture.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from .core.device import DEFAULT_TIMEOUT_S, DeviceArg, PackedOps, resolve_device
from .core.eager import eager_queue
from .core.stream import Program, Stream, current_stream
from .kernels import ops
from .tensors.tensor import (
    dependencies,
    has_readers,
    merge_deps,
    note_reads,
    note_write,
    order_write,
)

if TYPE_CHECKING:
    from .allocator import Allocation
    from .tensors.tensor import Tensor

__all__ = ["Graph"]

log = logging.getLogger(__name__)


class _TensorSet:
    """Tensors by identity, held weakly. (A ``weakref.WeakSet`` compares its
    members with ``==``, which is element-wise for tensors.)"""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Tensor]] = {}

    def add(self, t: Tensor) -> None:
        key = id(t)
        old = self._refs.get(key)
        if old is not None and old() is t:
            return
        refs = self._refs

        def gone(ref: weakref.ref[Tensor], key: int = key) -> None:
            if refs.get(key) is ref:
                del refs[key]

        refs[key] = weakref.ref(t, gone)

    def __contains__(self, t: object) -> bool:
        ref = self._refs.get(id(t))
        return ref is not None and ref() is t

    def __iter__(self) -> Iterator[Tensor]:
        for ref in list(self._refs.values()):
            t = ref()
            if t is not None:
                yield t

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Graph:
    """A recorded sequence of tensor ops of one device (see the module documentation).

    Args:
        device: the device whose tensor ops are recorded (default: the
            default device).
    """

    def __init__(self, device: DeviceArg = None) -> None:
        self.device = resolve_device(device)
        self._ops: list[ops.AnyOp] = []
        self._packed: list[PackedOps] = []
        self._memory: list[Allocation] = []
        self._outputs = _TensorSet()
        # Tensors made before the capture that its ops read or overwrite.
        self._inputs = _TensorSet()
        self._captured = False
        self._fence: int | None = None
        # The user stream of the last replay (None: the default stream).
        self._stream: Stream | None = None
        # The ops prebuilt for user streams, at the first replay on one.
        self._program: Program | None = None

    @property
    def num_ops(self) -> int:
        """How many ops a replay submits."""
        return len(self._ops)

    @contextlib.contextmanager
    def capture(self) -> Iterator[Graph]:
        """Record the tensor ops of the device until the block ends.

        Only the ops of the calling thread are recorded (PyTorch's
        ``thread_local`` capture mode): other threads' ops on the device run
        as usual meanwhile, and another thread may capture its own graph.

        Raises:
            RuntimeError: the graph was captured already, or this thread
                already captures a graph on the device.
        """
        if self._captured:
            raise RuntimeError("Graph.capture: this graph is already captured")
        self.device.begin_capture(self)
        try:
            yield self
        finally:
            self.device.end_capture(self)
            self._captured = True
        if self._ops:
            self._packed = self.device.pack(self._ops)
        log.debug("captured %d ops, %d allocations", len(self._ops), len(self._memory))

    def replay(self, stream: Stream | None = None) -> int:
        """Launch the recorded ops on ``stream`` (default: the current stream), no wait.

        Returns the fence of the last op (on the driver's queue 0 for the
        default stream, else on the stream's queue).

        Raises:
            RuntimeError: not captured yet, or nothing was recorded.
            ValueError: ``stream`` is of another device.
            NpuError: the driver refused the submission (``EBADF`` for a
                freed buffer, on either path), or the stream is closed or has
                no room (as :meth:`npu.Stream.launch`).
        """
        if not self._captured:
            raise RuntimeError("Graph.replay: capture the graph first")
        if not self._packed:
            raise RuntimeError("Graph.replay: the capture recorded no ops")
        if stream is None:
            stream = current_stream(self.device)
        elif stream.device is not self.device:
            raise ValueError(f"Graph.replay: {stream!r} is of another device")
        target = None if stream.is_default else stream
        # Inputs still being made elsewhere: as for an eager op (npu.tensor).
        inputs = list(self._inputs)
        after, deps, _ = dependencies(target, inputs)
        # Tensors the replay rewrites that other streams may still read.
        for t in self._outputs:
            if has_readers(t):
                order_write(t, target, after)
        # The previous replay on another timeline still uses the graph's memory.
        last, last_stream = self._fence, self._stream
        if last is not None and last_stream is not target:
            if last_stream is None or target is None:
                self.synchronize()
            else:
                after.append((last_stream, last))
        if target is None:
            first, fence = eager_queue(self.device).submit_packed(self._packed)
        else:
            if self._program is None:
                self._program = target.build_program(self._ops)
            first, fence = target.replay_program(self._program, after)
        note_reads(inputs, target, fence)
        inherited = merge_deps(deps) if deps else ()
        for t in self._outputs:
            note_write(t, target, first, fence, inherited)  # after its readers, above
        self._fence = fence
        self._stream = target
        return fence

    def synchronize(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        """Wait for the last replay (device errors raise as at any wait)."""
        if self._fence is None:
            return
        if self._stream is not None:
            self._stream.wait_fence(self._fence, timeout_s)
        else:
            eager_queue(self.device).wait(self._fence, timeout_s)

    # -- called by npu.tensor while capturing ---------------------------------

    def record(self, batch: list[ops.AnyOp], out: Tensor, inputs: Sequence[Tensor]) -> None:
        """Record ``batch``, which makes ``out`` from ``inputs`` (npu.tensor's hook)."""
        self._ops.extend(batch)
        for t in (*inputs, out):
            if t not in self._outputs:
                self._inputs.add(t)
        self._outputs.add(out)

    def keep(self, memory: Allocation) -> None:
        """Hold ``memory`` for every replay (npu.tensor's hook)."""
        self._memory.append(memory)

    def add_output(self, tensor: Tensor) -> None:
        """``tensor`` is made during the capture: each replay sets its fence."""
        self._outputs.add(tensor)
