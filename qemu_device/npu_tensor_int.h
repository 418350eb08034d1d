/*
 * NPU tensor ops: declarations shared by the files of the tensor-op
 * engine (npu_tensor.c, npu_dtype.c, npu_reduce.c, npu_nn.c and
 * npu_place.c), and the element conversions they all inline.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#ifndef HW_MISC_NPU_TENSOR_INT_H
#define HW_MISC_NPU_TENSOR_INT_H

#include "qemu/bswap.h"
#include <math.h>
#include "npu_dev.h"
#include "npu_tensor.h"

/* Ops of fewer output elements run as one tile on the command processor. */
#define NPU_TENSOR_TILE_MIN (1u << 20)

/* ---------------------------------------------------------------------- */
/* Element conversions */

static inline uint32_t npu_f2u(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float npu_u2f(uint32_t u)
{
    float f;

    memcpy(&f, &u, sizeof(f));
    return f;
}

/* binary16 -> fp32: exact, including subnormals, infinities and NaNs. */
static inline float npu_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;

    if (exp == 0x1f) {
        return npu_u2f(sign | 0x7f800000 | man << 13);
    }
    if (exp) {
        return npu_u2f(sign | (exp + 112) << 23 | man << 13);
    }
    /* Zero or subnormal: man * 2^-24, exact in fp32. */
    return npu_u2f(sign | npu_f2u((float)man / 16777216.0f));
}

/*
 * fp32 -> binary16, round to nearest even. Overflow gives infinity; a NaN
 * stays a NaN (quieted, with its sign and top payload bits).
 */
static inline uint16_t npu_f32_to_fp16(float f)
{
    uint32_t x = npu_f2u(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffff;
    uint32_t e, man, shift, q, rem, half;

    if (ax > 0x7f800000) {
        return sign | 0x7e00 | ((ax >> 13) & 0x3ff);
    }
    if (ax >= 0x477ff000) {         /* >= 65520 rounds to infinity */
        return sign | 0x7c00;
    }
    if (ax >= 0x38800000) {         /* normal binary16: >= 2^-14 */
        ax -= 112u << 23;
        ax += 0xfff + ((ax >> 13) & 1);
        return sign | (ax >> 13);
    }
    e = ax >> 23;
    if (e < 102) {                  /* below 2^-25: rounds to zero */
        return sign;
    }
    /* Subnormal binary16: units of 2^-24, may round up to 2^-14. */
    man = (ax & 0x7fffff) | 0x800000;
    shift = 126 - e;                /* 14..24 */
    q = man >> shift;
    rem = man & ((1u << shift) - 1);
    half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) {
        q++;
    }
    return sign | q;
}

static inline float npu_bf16_to_f32(uint16_t h)
{
    return npu_u2f((uint32_t)h << 16);
}

/* fp32 -> bfloat16, round to nearest even; NaN stays NaN (quieted). */
static inline uint16_t npu_f32_to_bf16(float f)
{
    uint32_t x = npu_f2u(f);

    if ((x & 0x7fffffff) > 0x7f800000) {
        return (x >> 16) | 0x40;
    }
    x += 0x7fff + ((x >> 16) & 1);
    return x >> 16;
}

/* np.maximum/np.minimum: a NaN in either operand gives a NaN. */
static inline float npu_maxf(float a, float b)
{
    return (a >= b || a != a) ? a : b;
}

static inline float npu_minf(float a, float b)
{
    return (a <= b || a != a) ? a : b;
}

/* Element @i of a float run as fp32. */
static inline float npu_ld_f(const uint8_t *p, uint32_t dtype, uint64_t i)
{
    switch (dtype) {
    case NPU_DTYPE_FP32:
        return npu_u2f(ldl_le_p(p + i * 4));
    case NPU_DTYPE_FP16:
        return npu_fp16_to_f32(lduw_le_p(p + i * 2));
    default: /* NPU_DTYPE_BF16 */
        return npu_bf16_to_f32(lduw_le_p(p + i * 2));
    }
}

/*
 * double -> fp32 rounded to odd (truncate, then set the last bit if
 * inexact). fp32 has at least two more significand bits than fp16 and
 * bf16, so rounding this to either of them to nearest even gives the
 * correctly rounded double: no double rounding.
 */
static inline float npu_d2f_odd(double d)
{
    float f = (float)d;

    if ((double)f != d && f == f) {
        if (fabs((double)f) > fabs(d)) {
            f = nextafterf(f, 0.0f);
        }
        f = npu_u2f(npu_f2u(f) | 1);
    }
    return f;
}

/* Element @i of a float output: @v rounded once to nearest even. */
static inline void npu_store_d(uint8_t *p, uint32_t dtype, uint64_t i,
                               double v)
{
    switch (dtype) {
    case NPU_DTYPE_FP32:
        stl_le_p(p + i * 4, npu_f2u((float)v));
        break;
    case NPU_DTYPE_FP16:
        stw_le_p(p + i * 2, npu_f32_to_fp16(npu_d2f_odd(v)));
        break;
    default: /* NPU_DTYPE_BF16 */
        stw_le_p(p + i * 2, npu_f32_to_bf16(npu_d2f_odd(v)));
        break;
    }
}

/* ---------------------------------------------------------------------- */
/* npu_dtype.c: loads and stores of runs of elements */

const float *npu_load_f32(const uint8_t *src, uint64_t stride,
                          uint32_t dtype, float *tmp, size_t n);
const int32_t *npu_load_i32(const uint8_t *src, uint64_t stride,
                            uint32_t dtype, int32_t *tmp, size_t n);
void npu_store_f32(uint8_t *dst, uint32_t dtype, const float *v, size_t n);
void npu_store_i32(uint8_t *dst, uint32_t dtype, const int32_t *v, size_t n);

/* ---------------------------------------------------------------------- */
/* npu_tensor.c: kernels on contiguous blocks */

void npu_unary_f32(uint32_t kind, float *o, const float *a, size_t n);

/* ---------------------------------------------------------------------- */
/* Checked ops whose inputs are in @bufs, computing into @out */

/* npu_reduce.c */
uint32_t npu_exec_red(NpuState *s, NpuWalk *w,
                      const struct npu_tensor_params *p, uint32_t opcode,
                      uint32_t kind, uint8_t *const *bufs, uint8_t *out);

/* npu_dnnl.c: CONV2D on oneDNN */

/* One tile's convolution; all fields are 64 bits (the cache hashes bytes). */
typedef struct NpuDnnlConvShape {
    uint64_t dtype;             /* of the input and weights: FP32 or BF16 */
    uint64_t c, h, w;           /* input channels, height, width */
    uint64_t o, oh, ow;         /* output channels, height, width */
    uint64_t kh, kw, sh, sw, ph, pw, dh, dw;
    uint64_t g;                 /* groups (weights [o, c / g, kh, kw]) */
    uint64_t is[4];             /* input strides, elements */
} NpuDnnlConvShape;

/* One tile's matmul: a [m, k] @ b [k, n] into a dense [m, n]. */
typedef struct NpuDnnlMmShape {
    uint64_t dtype;             /* of a and b: BF16 (fp32 out), INT8 (int32) */
    uint64_t m, k, n;
    uint64_t as[2], bs[2];      /* row and column strides, elements; 0: dense */
} NpuDnnlMmShape;

typedef struct NpuDnnlPrim NpuDnnlPrim;

/* The cached oneDNN form of @shape (a reference), or NULL: declined. */
NpuDnnlPrim *npu_dnnl_conv_get(const NpuDnnlConvShape *shape);
NpuDnnlPrim *npu_dnnl_mm_get(const NpuDnnlMmShape *shape);
void npu_dnnl_put(NpuDnnlPrim *c);
/*
 * out [o, oh, ow] (fp32, contiguous) = conv(@in, @wt) + @bias on the calling
 * thread, with @core's scratch; false if oneDNN failed or no scratch.
 */
bool npu_dnnl_conv_run(NpuDnnlPrim *c, NpuCore *core, const void *in,
                       const void *wt, const float *bias, float *out);
/*
 * out [m, n] = @a @ @b: int8 operands into exact int32 (wrapping; no zero
 * point: oneDNN's zero points round through fp32 above 2^24), or bf16
 * operands into fp32; on the calling thread, as above.
 */
bool npu_dnnl_mm_run(NpuDnnlPrim *c, NpuCore *core, const void *a,
                     const void *b, void *out);

/* npu_nn.c */
uint32_t npu_exec_matmul(NpuState *s, NpuWalk *w,
                         const struct npu_tensor_params *p, uint32_t opcode,
                         uint32_t kind, uint8_t *const *bufs, uint8_t *out);
uint32_t npu_exec_conv(NpuState *s, NpuWalk *w,
                       const struct npu_tensor_params *p, uint32_t kind,
                       uint8_t *const *bufs, uint8_t *out);
uint32_t npu_exec_pool(NpuState *s, NpuWalk *w,
                       const struct npu_tensor_params *p, uint32_t kind,
                       uint8_t *const *bufs, uint8_t *out);
uint32_t npu_exec_requant(NpuState *s, NpuWalk *w,
                          const struct npu_tensor_params *p, uint32_t kind,
                          uint8_t *const *bufs, uint8_t *out);

/* npu_place.c: SELECT, and CONVERT into a strided output */
uint32_t npu_exec_place(NpuState *s, NpuWalk *w,
                        const struct npu_tensor_params *p, uint32_t opcode,
                        uint8_t *const *bufs, uint8_t *out);

#endif
