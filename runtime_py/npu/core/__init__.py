"""The device layer: :class:`~npu.core.device.Device` (an open backend),
:class:`~npu.core.buffer.Buffer`, :class:`~npu.core.userqueue.UserQueue`,
:class:`~npu.core.stream.Stream` and :class:`~npu.core.stream.Event` (the
timelines). It knows buffers, queues and fences, never tensors.
"""
