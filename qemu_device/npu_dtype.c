/*
 * NPU tensor ops: conversion of runs of elements between the guest
 * dtypes (FP32, FP16, BF16, INT8, INT32) and the fp32 / int32 the
 * kernels compute in. Float -> int saturates, int -> int wraps, and
 * every conversion rounds once (to nearest even).
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/bswap.h"
#include "npu_tensor_int.h"

/*
 * int32 -> bfloat16 with a single rounding (to nearest even): going through
 * fp32 would round twice for magnitudes of 2^24 and above.
 */
static inline uint16_t npu_i32_to_bf16(int32_t v)
{
    uint32_t u = v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
    uint32_t shift, rem, half;
    uint64_t q;
    float f;

    if (u >= (1u << 24)) {
        shift = 32 - clz32(u) - 8;  /* keep 8 significant bits */
        q = u >> shift;
        rem = u & ((1u << shift) - 1);
        half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) {
            q++;
        }
        f = (float)(q << shift);    /* now exact in bfloat16 */
    } else {
        f = (float)u;               /* exact in fp32 */
    }
    return npu_f32_to_bf16(v < 0 ? -f : f);
}

/*
 * float -> int: truncate toward zero, NaN gives 0, values out of the
 * type's range saturate to its minimum or maximum. The range checks come
 * before the C conversion, which is undefined for out-of-range values.
 */
static inline int32_t npu_f32_to_i8(float f)
{
    if (f != f) {
        return 0;
    }
    if (f >= 128.0f) {
        return INT8_MAX;
    }
    if (f <= -129.0f) {
        return INT8_MIN;
    }
    return (int32_t)f;
}

static inline int32_t npu_f32_to_i32(float f)
{
    if (f != f) {
        return 0;
    }
    if (f >= 2147483648.0f) {
        return INT32_MAX;
    }
    if (f <= -2147483648.0f) {
        return INT32_MIN;
    }
    return (int32_t)f;
}

/* ---------------------------------------------------------------------- */
/* Loads and stores of runs of elements (strides in elements) */

/* @n elements as fp32; returns @src itself when it already is that. */
const float *npu_load_f32(const uint8_t *src, uint64_t stride,
                          uint32_t dtype, float *tmp, size_t n)
{
    size_t i;

    switch (dtype) {
    case NPU_DTYPE_FP32:
        if (!HOST_BIG_ENDIAN && stride == 1) {
            return (const float *)src;
        }
        for (i = 0; i < n; i++) {
            tmp[i] = npu_u2f(ldl_le_p(src + i * stride * 4));
        }
        break;
    case NPU_DTYPE_FP16:
        for (i = 0; i < n; i++) {
            tmp[i] = npu_fp16_to_f32(lduw_le_p(src + i * stride * 2));
        }
        break;
    case NPU_DTYPE_INT8:            /* exact */
        for (i = 0; i < n; i++) {
            tmp[i] = (int8_t)src[i * stride];
        }
        break;
    default: /* NPU_DTYPE_BF16 */
        for (i = 0; i < n; i++) {
            tmp[i] = npu_bf16_to_f32(lduw_le_p(src + i * stride * 2));
        }
        break;
    }
    return tmp;
}

/* @n elements as int32; returns @src itself when it already is that. */
const int32_t *npu_load_i32(const uint8_t *src, uint64_t stride,
                            uint32_t dtype, int32_t *tmp, size_t n)
{
    size_t i;

    if (dtype == NPU_DTYPE_INT8) {
        for (i = 0; i < n; i++) {
            tmp[i] = (int8_t)src[i * stride];
        }
        return tmp;
    }
    if (!HOST_BIG_ENDIAN && stride == 1) {
        return (const int32_t *)src;
    }
    for (i = 0; i < n; i++) {
        tmp[i] = ldl_le_p(src + i * stride * 4);
    }
    return tmp;
}

/* Store fp32 values as @dtype to a contiguous run. */
void npu_store_f32(uint8_t *dst, uint32_t dtype, const float *v,
                   size_t n)
{
    size_t i;

    switch (dtype) {
    case NPU_DTYPE_FP32:
        if ((const uint8_t *)v == dst) {
            return;                 /* computed in place */
        }
        for (i = 0; i < n; i++) {
            stl_le_p(dst + i * 4, npu_f2u(v[i]));
        }
        break;
    case NPU_DTYPE_FP16:
        for (i = 0; i < n; i++) {
            stw_le_p(dst + i * 2, npu_f32_to_fp16(v[i]));
        }
        break;
    case NPU_DTYPE_BF16:
        for (i = 0; i < n; i++) {
            stw_le_p(dst + i * 2, npu_f32_to_bf16(v[i]));
        }
        break;
    case NPU_DTYPE_INT8:
        for (i = 0; i < n; i++) {
            dst[i] = (uint8_t)npu_f32_to_i8(v[i]);
        }
        break;
    default: /* NPU_DTYPE_INT32 */
        for (i = 0; i < n; i++) {
            stl_le_p(dst + i * 4, npu_f32_to_i32(v[i]));
        }
        break;
    }
}

/* Store int32 values as @dtype to a contiguous run; ints wrap. */
void npu_store_i32(uint8_t *dst, uint32_t dtype, const int32_t *v,
                   size_t n)
{
    size_t i;

    switch (dtype) {
    case NPU_DTYPE_FP32:
        for (i = 0; i < n; i++) {
            stl_le_p(dst + i * 4, npu_f2u((float)v[i]));
        }
        break;
    case NPU_DTYPE_FP16:
        /* Exact in fp32 below 2^24; anything above is infinity anyway. */
        for (i = 0; i < n; i++) {
            stw_le_p(dst + i * 2, npu_f32_to_fp16((float)v[i]));
        }
        break;
    case NPU_DTYPE_BF16:
        for (i = 0; i < n; i++) {
            stw_le_p(dst + i * 2, npu_i32_to_bf16(v[i]));
        }
        break;
    case NPU_DTYPE_INT8:
        for (i = 0; i < n; i++) {
            dst[i] = (uint8_t)v[i];
        }
        break;
    default: /* NPU_DTYPE_INT32 */
        if ((const uint8_t *)v == dst) {
            return;
        }
        for (i = 0; i < n; i++) {
            stl_le_p(dst + i * 4, v[i]);
        }
        break;
    }
}
