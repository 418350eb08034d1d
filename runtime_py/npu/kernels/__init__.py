"""Descriptors: the op builders (:mod:`npu.kernels.ops`), their packing
(:mod:`npu.kernels.descriptors`) and validation once per signature
(:mod:`npu.kernels.validate`). Above :mod:`npu.hal`, below everything that
launches work; no device state.
"""
