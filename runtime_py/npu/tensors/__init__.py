"""Device-resident tensors: :class:`~npu.tensors.tensor.Tensor` and its ops
(:mod:`~npu.tensors.elementwise`, :mod:`~npu.tensors.reduce`,
:mod:`~npu.tensors.nn`, :mod:`~npu.tensors.quant`), which register their
functions as the tensor's operators (:mod:`npu.tensors.dispatch`).
"""

# The op modules register the tensor's operators when imported: import them
# with the package, so that a Tensor always has its operators.
from . import elementwise, nn, quant, reduce  # noqa: F401  (registration)
