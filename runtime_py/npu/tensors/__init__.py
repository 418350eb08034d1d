"""Device-resident tensors: :class:`~npu.tensors.tensor.Tensor` and its ops
(:mod:`~npu.tensors.elementwise`, :mod:`~npu.tensors.reduce`,
:mod:`~npu.tensors.nn`, :mod:`~npu.tensors.quant`), which register their
functions as the tensor's operators (:mod:`npu.tensors.dispatch`).
"""
