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

/*
 * npu_f32_to_fp16() on 4 lanes at once (GCC vector extensions), the same
 * bits: each case is computed and the lane's own selected. Subnormal
 * results come from an fp32 addition of 0.5, whose rounding (to nearest
 * even, the host default) is exactly the binary16 one at 2^-24.
 */
typedef uint32_t NpuV4u __attribute__((vector_size(16)));
typedef int32_t NpuV4m __attribute__((vector_size(16)));
typedef float NpuV4f32 __attribute__((vector_size(16)));
typedef uint16_t NpuV4h __attribute__((vector_size(8)));

static inline NpuV4u npu_v4_sel(NpuV4m m, NpuV4u a, NpuV4u b)
{
    return ((NpuV4u)m & a) | (~(NpuV4u)m & b);
}

static inline NpuV4h npu_v4_f32_to_fp16(NpuV4u x)
{
    NpuV4u sign = (x >> 16) & 0x8000;
    NpuV4u ax = x & 0x7fffffff;
    NpuV4u nan = 0x7e00 | ((ax >> 13) & 0x3ff);
    NpuV4u nrm = (ax - (112u << 23) + 0xfff + ((ax >> 13) & 1)) >> 13;
    NpuV4u half = { 0x3f000000, 0x3f000000, 0x3f000000, 0x3f000000 };
    NpuV4u sub = (NpuV4u)((NpuV4f32)ax + (NpuV4f32)half) - half;
    NpuV4u r;

    r = npu_v4_sel((NpuV4m)(ax >= 0x38800000), nrm, sub);
    r = npu_v4_sel((NpuV4m)(ax >= 0x477ff000), (NpuV4u){ 0x7c00, 0x7c00,
                   0x7c00, 0x7c00 }, r);
    r = npu_v4_sel((NpuV4m)(ax > 0x7f800000), nan, r);
    return __builtin_convertvector(sign | r, NpuV4h);
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
    case NPU_DTYPE_BOOL:            /* any nonzero byte is true */
        for (i = 0; i < n; i++) {
            tmp[i] = src[i * stride] != 0;
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
    if (dtype == NPU_DTYPE_BOOL) {
        for (i = 0; i < n; i++) {
            tmp[i] = src[i * stride] != 0;
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
        if (!HOST_BIG_ENDIAN) {
            memcpy(dst, v, n * 4);
            return;
        }
        for (i = 0; i < n; i++) {
            stl_le_p(dst + i * 4, npu_f2u(v[i]));
        }
        break;
    case NPU_DTYPE_FP16:
        for (i = 0; !HOST_BIG_ENDIAN && i + 4 <= n; i += 4) {
            NpuV4u x;
            NpuV4h h;

            memcpy(&x, v + i, sizeof(x));
            h = npu_v4_f32_to_fp16(x);
            memcpy(dst + i * 2, &h, sizeof(h));
        }
        for (; i < n; i++) {
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
    case NPU_DTYPE_BOOL:            /* NaN is nonzero: true */
        for (i = 0; i < n; i++) {
            dst[i] = v[i] != 0.0f;
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
    case NPU_DTYPE_BOOL:
        for (i = 0; i < n; i++) {
            dst[i] = v[i] != 0;
        }
        break;
    default: /* NPU_DTYPE_INT32 */
        if ((const uint8_t *)v == dst) {
            return;
        }
        if (!HOST_BIG_ENDIAN) {
            memcpy(dst, v, n * 4);
            return;
        }
        for (i = 0; i < n; i++) {
            stl_le_p(dst + i * 4, v[i]);
        }
        break;
    }
}
