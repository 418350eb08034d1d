/*
 * NPU tensor ops: ELTWISE, UNARY, CONVERT, REDUCE, SOFTMAX, LAYERNORM,
 * MATMUL, LINEAR, CONV2D and POOL2D.
 *
 * The command processor reads the op's 256-byte parameter block once,
 * validates it with npu_tensor_op_check() (include/npu_tensor.h, the same
 * code the driver runs at submit), gathers the whole extent of every input
 * into host memory, and computes the contiguous output in tiles of output
 * rows, on the AI cores when the op is large. Each tile writes its own
 * slice of the output back to the guest.
 *
 * Element arithmetic: float dtypes (FP32, FP16, BF16) compute in fp32 and
 * round once to the output dtype; INT8 and INT32 compute in 32-bit two's
 * complement and wrap to the output dtype, as numpy does.
 *
 * REDUCE, SOFTMAX and LAYERNORM share the validation, the gather of the
 * inputs and the element conversions, but compute per slice in double
 * (tiles of slices) and write the whole output once at the end; see the
 * section of their own below. MATMUL and LINEAR run cblas_sgemm per
 * (batch, block of rows) tile with fp32 accumulation and write each tile's
 * output back as it finishes; see their section. CONV2D (im2col +
 * cblas_sgemm) and POOL2D (direct loops) have a section of their own too.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/units.h"
#include "qemu/log.h"
#include "qemu/bswap.h"
#include <math.h>
#include <cblas.h>
#include "npu_dev.h"
#include "npu_tensor.h"

/* Ops of fewer output elements run as one tile on the command processor. */
#define NPU_TENSOR_TILE_MIN (1u << 20)
/* Longest run of one output row handled as one unit of a tile. */
#define NPU_TENSOR_SEG (64 * 1024)
/* Elements converted and computed at a time (fits the stack scratch). */
#define NPU_TENSOR_BLK 1024

/* One input operand after dimension collapsing. */
typedef struct NpuTensorIn {
    const uint8_t *data;    /* host copy of the operand's extent */
    uint32_t dtype;
    uint32_t size;          /* bytes per element */
    uint64_t stride[NPU_MAX_RANK];  /* elements; 0 where broadcast */
} NpuTensorIn;

typedef struct NpuTensorJob {
    NpuWalk walk;           /* snapshot; each tile walks with its own copy */
    uint32_t opcode, kind;
    uint32_t nin;
    NpuTensorIn in[2];
    uint8_t *out;           /* host output buffer, numel * osize bytes */
    uint64_t out_va;
    uint32_t odtype, osize;
    uint32_t ndim;          /* collapsed rank, >= 1 */
    uint64_t shape[NPU_MAX_RANK];   /* collapsed output shape */
    uint64_t seg_len, nseg; /* each output row is nseg units of seg_len */
} NpuTensorJob;

/* Scratch of one tile: two inputs and one result block. */
typedef union NpuTensorBlk {
    float f[NPU_TENSOR_BLK];
    int32_t i[NPU_TENSOR_BLK];
} NpuTensorBlk;

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
static const float *npu_load_f32(const uint8_t *src, uint64_t stride,
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
    default: /* NPU_DTYPE_BF16 */
        for (i = 0; i < n; i++) {
            tmp[i] = npu_bf16_to_f32(lduw_le_p(src + i * stride * 2));
        }
        break;
    }
    return tmp;
}

/* @n elements as int32; returns @src itself when it already is that. */
static const int32_t *npu_load_i32(const uint8_t *src, uint64_t stride,
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
static void npu_store_f32(uint8_t *dst, uint32_t dtype, const float *v,
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
static void npu_store_i32(uint8_t *dst, uint32_t dtype, const int32_t *v,
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

/* ---------------------------------------------------------------------- */
/* Kernels on contiguous blocks */

/* np.maximum/np.minimum: a NaN in either operand gives a NaN. */
static inline float npu_maxf(float a, float b)
{
    return (a >= b || a != a) ? a : b;
}

static inline float npu_minf(float a, float b)
{
    return (a <= b || a != a) ? a : b;
}

/* 1 / (1 + e^-x) without overflow in e^-x for large negative x. */
static inline float npu_sigmoidf(float x)
{
    float e;

    if (x >= 0.0f) {
        return 1.0f / (1.0f + expf(-x));
    }
    e = expf(x);
    return e / (1.0f + e);
}

/*
 * The fp32 kernels of the cheap kinds run on 4-lane vectors (GCC vector
 * extensions, as in tcg-runtime-gvec.c): -O2 does not vectorise loops of
 * unknown length by itself. Loads and stores go through memcpy, so the
 * operands need no alignment.
 */
typedef float NpuV4f __attribute__((vector_size(16)));
typedef int32_t NpuV4i __attribute__((vector_size(16)));
#define NPU_V4 4

static inline NpuV4f npu_v4f_ld(const float *p)
{
    NpuV4f v;

    memcpy(&v, p, sizeof(v));
    return v;
}

static inline void npu_v4f_st(float *p, NpuV4f v)
{
    memcpy(p, &v, sizeof(v));
}

/* Lanes of @a where @m is all ones, else lanes of @b. */
static inline NpuV4f npu_v4f_sel(NpuV4i m, NpuV4f a, NpuV4f b)
{
    return (NpuV4f)((m & (NpuV4i)a) | (~m & (NpuV4i)b));
}

static inline NpuV4f npu_v4f_add(NpuV4f a, NpuV4f b)
{
    return a + b;
}

static inline NpuV4f npu_v4f_sub(NpuV4f a, NpuV4f b)
{
    return a - b;
}

static inline NpuV4f npu_v4f_mul(NpuV4f a, NpuV4f b)
{
    return a * b;
}

static inline NpuV4f npu_v4f_div(NpuV4f a, NpuV4f b)
{
    return a / b;
}

static inline NpuV4f npu_v4f_max(NpuV4f a, NpuV4f b)
{
    return npu_v4f_sel((a >= b) | (a != a), a, b);
}

static inline NpuV4f npu_v4f_min(NpuV4f a, NpuV4f b)
{
    return npu_v4f_sel((a <= b) | (a != a), a, b);
}

static inline float npu_addf(float a, float b)
{
    return a + b;
}

static inline float npu_subf(float a, float b)
{
    return a - b;
}

static inline float npu_mulf(float a, float b)
{
    return a * b;
}

static inline float npu_divf(float a, float b)
{
    return a / b;
}

/* o[i] = a[i] <op> b[i]: vector body, scalar tail. */
#define NPU_F32_BINARY(vop, sop) do {                                   \
        for (i = 0; i + NPU_V4 <= n; i += NPU_V4) {                     \
            npu_v4f_st(o + i, vop(npu_v4f_ld(a + i), npu_v4f_ld(b + i))); \
        }                                                               \
        for (; i < n; i++) {                                            \
            o[i] = sop(a[i], b[i]);                                     \
        }                                                               \
    } while (0)

static void npu_eltwise_f32(uint32_t kind, float *o, const float *a,
                            const float *b, size_t n)
{
    size_t i;

    switch (kind) {
    case NPU_ELTWISE_ADD:
        NPU_F32_BINARY(npu_v4f_add, npu_addf);
        break;
    case NPU_ELTWISE_SUB:
        NPU_F32_BINARY(npu_v4f_sub, npu_subf);
        break;
    case NPU_ELTWISE_MUL:
        NPU_F32_BINARY(npu_v4f_mul, npu_mulf);
        break;
    case NPU_ELTWISE_DIV:
        NPU_F32_BINARY(npu_v4f_div, npu_divf);
        break;
    case NPU_ELTWISE_MAX:
        NPU_F32_BINARY(npu_v4f_max, npu_maxf);
        break;
    default: /* NPU_ELTWISE_MIN */
        NPU_F32_BINARY(npu_v4f_min, npu_minf);
        break;
    }
}

/* 32-bit two's complement arithmetic: the store wraps to the dtype. */
static void npu_eltwise_i32(uint32_t kind, int32_t *o, const int32_t *a,
                            const int32_t *b, size_t n)
{
    size_t i;

    switch (kind) {
    case NPU_ELTWISE_ADD:
        for (i = 0; i < n; i++) {
            o[i] = (uint32_t)a[i] + (uint32_t)b[i];
        }
        break;
    case NPU_ELTWISE_SUB:
        for (i = 0; i < n; i++) {
            o[i] = (uint32_t)a[i] - (uint32_t)b[i];
        }
        break;
    case NPU_ELTWISE_MUL:
        for (i = 0; i < n; i++) {
            o[i] = (uint32_t)a[i] * (uint32_t)b[i];
        }
        break;
    case NPU_ELTWISE_MAX:
        for (i = 0; i < n; i++) {
            o[i] = a[i] > b[i] ? a[i] : b[i];
        }
        break;
    case NPU_ELTWISE_MIN:
        for (i = 0; i < n; i++) {
            o[i] = a[i] < b[i] ? a[i] : b[i];
        }
        break;
    default: /* DIV: rejected by npu_tensor_op_check() */
        memset(o, 0, n * sizeof(*o));
        break;
    }
}

static void npu_unary_f32(uint32_t kind, float *o, const float *a, size_t n)
{
    size_t i;

    switch (kind) {
    case NPU_UNARY_RELU:
        /* x < 0 ? 0 : x, so that NaN stays NaN (np.maximum(x, 0)). */
        for (i = 0; i + NPU_V4 <= n; i += NPU_V4) {
            NpuV4f x = npu_v4f_ld(a + i);

            npu_v4f_st(o + i, npu_v4f_sel(x < (NpuV4f){ 0 }, (NpuV4f){ 0 }, x));
        }
        for (; i < n; i++) {
            o[i] = a[i] < 0.0f ? 0.0f : a[i];
        }
        break;
    case NPU_UNARY_GELU:
        for (i = 0; i < n; i++) {
            o[i] = 0.5f * a[i] * (1.0f + erff(a[i] * (float)M_SQRT1_2));
        }
        break;
    case NPU_UNARY_SIGMOID:
        for (i = 0; i < n; i++) {
            o[i] = npu_sigmoidf(a[i]);
        }
        break;
    case NPU_UNARY_TANH:
        for (i = 0; i < n; i++) {
            o[i] = tanhf(a[i]);
        }
        break;
    case NPU_UNARY_EXP:
        for (i = 0; i < n; i++) {
            o[i] = expf(a[i]);
        }
        break;
    case NPU_UNARY_LOG:
        for (i = 0; i < n; i++) {
            o[i] = logf(a[i]);
        }
        break;
    case NPU_UNARY_SQRT:
        for (i = 0; i < n; i++) {
            o[i] = sqrtf(a[i]);
        }
        break;
    case NPU_UNARY_ABS:
        for (i = 0; i + NPU_V4 <= n; i += NPU_V4) {
            NpuV4i x = (NpuV4i)npu_v4f_ld(a + i);

            npu_v4f_st(o + i, (NpuV4f)(x & 0x7fffffff));
        }
        for (; i < n; i++) {
            o[i] = fabsf(a[i]);
        }
        break;
    default: /* NPU_UNARY_NEG */
        for (i = 0; i + NPU_V4 <= n; i += NPU_V4) {
            npu_v4f_st(o + i, -npu_v4f_ld(a + i));
        }
        for (; i < n; i++) {
            o[i] = -a[i];
        }
        break;
    }
}

static void npu_unary_i32(uint32_t kind, int32_t *o, const int32_t *a,
                          size_t n)
{
    size_t i;

    switch (kind) {
    case NPU_UNARY_RELU:
        for (i = 0; i < n; i++) {
            o[i] = a[i] > 0 ? a[i] : 0;
        }
        break;
    case NPU_UNARY_ABS:
        for (i = 0; i < n; i++) {
            o[i] = a[i] < 0 ? 0u - (uint32_t)a[i] : (uint32_t)a[i];
        }
        break;
    case NPU_UNARY_NEG:
        for (i = 0; i < n; i++) {
            o[i] = 0u - (uint32_t)a[i];
        }
        break;
    default: /* float-only kinds: rejected by npu_tensor_op_check() */
        memset(o, 0, n * sizeof(*o));
        break;
    }
}

/* ---------------------------------------------------------------------- */
/* Tiles */

/*
 * @n output elements starting at output element @oidx; input i starts at
 * element offset off[i] and steps by its innermost collapsed stride.
 */
static void npu_tensor_run(const NpuTensorJob *job, const uint64_t *off,
                           uint64_t oidx, uint64_t n, NpuTensorBlk *blk)
{
    const uint8_t *src[2];
    uint64_t step[2];
    uint8_t *dst = job->out + oidx * job->osize;
    bool fsrc = npu_dtype_is_float(job->in[0].dtype);
    uint32_t i;

    for (i = 0; i < job->nin; i++) {
        const NpuTensorIn *in = &job->in[i];

        step[i] = in->stride[job->ndim - 1];
        src[i] = in->data + off[i] * in->size;
    }
    while (n) {
        size_t m = MIN(n, (uint64_t)NPU_TENSOR_BLK);

        if (fsrc) {
            const float *a = npu_load_f32(src[0], step[0], job->in[0].dtype,
                                          blk[0].f, m);
            /* fp32 output on a little-endian host: compute in place. */
            float *o = (!HOST_BIG_ENDIAN && job->odtype == NPU_DTYPE_FP32) ?
                       (float *)dst : blk[2].f;
            const float *r = o;

            if (job->opcode == NPU_OP_ELTWISE) {
                npu_eltwise_f32(job->kind, o, a,
                                npu_load_f32(src[1], step[1],
                                             job->in[1].dtype, blk[1].f, m),
                                m);
            } else if (job->opcode == NPU_OP_UNARY) {
                npu_unary_f32(job->kind, o, a, m);
            } else {
                r = a;              /* CONVERT: store as the output dtype */
            }
            npu_store_f32(dst, job->odtype, r, m);
        } else {
            const int32_t *a = npu_load_i32(src[0], step[0], job->in[0].dtype,
                                            blk[0].i, m);
            int32_t *o = (!HOST_BIG_ENDIAN && job->odtype == NPU_DTYPE_INT32) ?
                         (int32_t *)dst : blk[2].i;
            const int32_t *r = o;

            if (job->opcode == NPU_OP_ELTWISE) {
                npu_eltwise_i32(job->kind, o, a,
                                npu_load_i32(src[1], step[1],
                                             job->in[1].dtype, blk[1].i, m),
                                m);
            } else if (job->opcode == NPU_OP_UNARY) {
                npu_unary_i32(job->kind, o, a, m);
            } else {
                r = a;
            }
            npu_store_i32(dst, job->odtype, r, m);
        }
        for (i = 0; i < job->nin; i++) {
            src[i] += m * step[i] * job->in[i].size;
        }
        dst += m * job->osize;
        n -= m;
    }
}

/* First output element of unit @u (the row-major order of the units). */
static uint64_t npu_tensor_unit_start(const NpuTensorJob *job, uint64_t u)
{
    return (u / job->nseg) * job->shape[job->ndim - 1] +
           (u % job->nseg) * job->seg_len;
}

/* Units [begin, end) of the output, then their write-back. */
static uint32_t npu_tensor_tile(NpuCore *core, void *opaque, uint64_t begin,
                                uint64_t end)
{
    const NpuTensorJob *job = opaque;
    NpuWalk w = job->walk;
    NpuTensorBlk blk[3];
    uint32_t outer = job->ndim - 1, i, d;
    uint64_t len = job->shape[outer];
    uint64_t row = begin / job->nseg, seg = begin % job->nseg;
    uint64_t first = npu_tensor_unit_start(job, begin);
    uint64_t last = npu_tensor_unit_start(job, end);
    uint64_t idx[NPU_MAX_RANK] = { 0 }, off[2] = { 0, 0 }, r = row, u;

    /* Multi-index of the first row over the outer dimensions. */
    for (d = outer; d-- > 0;) {
        idx[d] = r % job->shape[d];
        r /= job->shape[d];
        for (i = 0; i < job->nin; i++) {
            off[i] += idx[d] * job->in[i].stride[d];
        }
    }
    for (u = begin; u < end; u++) {
        uint64_t c0 = seg * job->seg_len;
        uint64_t o[2];

        for (i = 0; i < job->nin; i++) {
            o[i] = off[i] + c0 * job->in[i].stride[outer];
        }
        npu_tensor_run(job, o, row * len + c0, MIN(len - c0, job->seg_len),
                       blk);
        if (++seg < job->nseg) {
            continue;
        }
        seg = 0;
        row++;
        for (d = outer; d-- > 0;) {     /* next row: odometer step */
            for (i = 0; i < job->nin; i++) {
                off[i] += job->in[i].stride[d];
            }
            if (++idx[d] < job->shape[d]) {
                break;
            }
            idx[d] = 0;
            for (i = 0; i < job->nin; i++) {
                off[i] -= job->shape[d] * job->in[i].stride[d];
            }
        }
    }
    return npu_mem_write(core->s, &w, job->out_va + first * job->osize,
                         job->out + first * job->osize,
                         (last - first) * job->osize);
}

/*
 * Collapse the output's dimensions for the tiles: drop those of size 1 and
 * merge neighbours that every input walks as one (the output is
 * contiguous, so it always does). Inputs broadcast with stride 0.
 */
static void npu_tensor_collapse(NpuTensorJob *job,
                                const struct npu_tensor_params *p)
{
    const struct npu_hw_tensor *out = &p->t[job->nin];
    uint32_t nd = 0, d, i;

    for (d = 0; d < out->ndim; d++) {
        uint64_t st[2];
        bool merge = nd > 0;

        if (out->shape[d] == 1) {
            continue;
        }
        for (i = 0; i < job->nin; i++) {
            st[i] = p->t[i].shape[d] == 1 ? 0 : p->t[i].strides[d];
            merge = merge &&
                    job->in[i].stride[nd - 1] == st[i] * out->shape[d];
        }
        if (merge) {
            job->shape[nd - 1] *= out->shape[d];
        } else {
            job->shape[nd++] = out->shape[d];
        }
        for (i = 0; i < job->nin; i++) {
            job->in[i].stride[nd - 1] = st[i];
        }
    }
    if (!nd) {                          /* a single element */
        job->shape[nd++] = 1;
        for (i = 0; i < job->nin; i++) {
            job->in[i].stride[0] = 0;
        }
    }
    job->ndim = nd;
}

/* ---------------------------------------------------------------------- */
/* REDUCE, SOFTMAX and LAYERNORM */

/*
 * These ops split the input's dimensions into kept ones, which index
 * independent slices, and reduced ones, which each slice runs over:
 *   REDUCE: the masked axes are reduced; one output element per slice;
 *   SOFTMAX: params[0] is reduced; a slice is one line along that axis;
 *   LAYERNORM: the last params[0] axes are reduced; a slice is one row.
 * The slices are the units of the tiles. Every value is computed in double
 * and rounded once to the output dtype (see npu_store_d()).
 */

/* Operands walked by a slice: in, out, gamma, beta. */
#define NPU_RED_T 4

typedef struct NpuDims {
    uint32_t nd;                    /* >= 1 (a single dim of size 1 at worst) */
    uint64_t shape[NPU_MAX_RANK];
    uint64_t stride[NPU_RED_T][NPU_MAX_RANK];  /* elements; 0 if unused */
} NpuDims;

typedef struct NpuRedJob {
    uint32_t opcode, kind, dtype;
    const uint8_t *src[NPU_RED_T];  /* in, -, gamma, beta */
    uint8_t *out;                   /* host output buffer, contiguous */
    NpuDims keep, red;
    uint64_t count;                 /* elements per slice */
    double eps;
} NpuRedJob;

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

static inline int32_t npu_ld_i(const uint8_t *p, uint32_t dtype, uint64_t i)
{
    if (dtype == NPU_DTYPE_INT8) {
        return (int8_t)p[i];
    }
    return (int32_t)ldl_le_p(p + i * 4);
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

/* Element @i of an int output: @v wrapped to the dtype. */
static inline void npu_store_i64(uint8_t *p, uint32_t dtype, uint64_t i,
                                 int64_t v)
{
    if (dtype == NPU_DTYPE_INT8) {
        p[i] = (uint8_t)v;
    } else {
        stl_le_p(p + i * 4, (uint32_t)v);
    }
}

/*
 * Offsets of row @row of a slice (the rows are the reduced dims but the
 * innermost one) from the slice's offsets @base.
 */
static void npu_red_row(const NpuDims *r, uint64_t row, const uint64_t *base,
                        uint64_t *off)
{
    uint32_t t, d;

    for (t = 0; t < NPU_RED_T; t++) {
        off[t] = base[t];
    }
    for (d = r->nd - 1; d-- > 0;) {
        uint64_t i = row % r->shape[d];

        row /= r->shape[d];
        for (t = 0; t < NPU_RED_T; t++) {
            off[t] += i * r->stride[t][d];
        }
    }
}

/* REDUCE of one slice into output element base[1]. */
static void npu_reduce_slice(const NpuRedJob *job, const uint64_t *base)
{
    const NpuDims *r = &job->red;
    const uint8_t *in = job->src[0];
    uint64_t len = r->shape[r->nd - 1], st = r->stride[0][r->nd - 1];
    uint64_t rows = job->count / len, row, k, off[NPU_RED_T];
    bool fl = npu_dtype_is_float(job->dtype);
    double sum = 0.0;
    int64_t isum = 0;
    float m = fl ? npu_ld_f(in, job->dtype, base[0]) : 0.0f;
    int32_t im = fl ? 0 : npu_ld_i(in, job->dtype, base[0]);

    for (row = 0; row < rows; row++) {
        npu_red_row(r, row, base, off);
        for (k = 0; k < len; k++) {
            uint64_t i = off[0] + k * st;

            if (fl) {
                float x = npu_ld_f(in, job->dtype, i);

                switch (job->kind) {
                case NPU_REDUCE_SUM:
                case NPU_REDUCE_MEAN:
                    sum += x;
                    break;
                case NPU_REDUCE_MAX:
                    m = npu_maxf(m, x);
                    break;
                default: /* NPU_REDUCE_MIN */
                    m = npu_minf(m, x);
                    break;
                }
            } else {
                int32_t x = npu_ld_i(in, job->dtype, i);

                switch (job->kind) {
                case NPU_REDUCE_MAX:
                    im = MAX(im, x);
                    break;
                case NPU_REDUCE_MIN:
                    im = MIN(im, x);
                    break;
                default: /* SUM; MEAN is rejected for ints */
                    isum += x;
                    break;
                }
            }
        }
    }
    if (!fl) {
        npu_store_i64(job->out, job->dtype, base[1],
                      job->kind == NPU_REDUCE_MAX ||
                      job->kind == NPU_REDUCE_MIN ? im : isum);
    } else if (job->kind == NPU_REDUCE_SUM) {
        npu_store_d(job->out, job->dtype, base[1], sum);
    } else if (job->kind == NPU_REDUCE_MEAN) {
        npu_store_d(job->out, job->dtype, base[1], sum / job->count);
    } else {
        npu_store_d(job->out, job->dtype, base[1], m);
    }
}

/* (LOG)SOFTMAX of one line: max, sum of exponentials, then the output. */
static void npu_softmax_slice(const NpuRedJob *job, const uint64_t *base)
{
    uint64_t len = job->count, k;
    uint64_t si = job->red.stride[0][0], so = job->red.stride[1][0];
    const uint8_t *in = job->src[0];
    float m = npu_ld_f(in, job->dtype, base[0]);
    double sum = 0.0, lse;

    for (k = 1; k < len; k++) {
        m = npu_maxf(m, npu_ld_f(in, job->dtype, base[0] + k * si));
    }
    for (k = 0; k < len; k++) {
        sum += exp((double)npu_ld_f(in, job->dtype, base[0] + k * si) - m);
    }
    lse = log(sum);
    for (k = 0; k < len; k++) {
        double x = (double)npu_ld_f(in, job->dtype, base[0] + k * si) - m;

        npu_store_d(job->out, job->dtype, base[1] + k * so,
                    job->kind == NPU_SOFTMAX_LOG ? x - lse : exp(x) / sum);
    }
}

/* LAYERNORM of one row: mean, biased variance, then the output. */
static void npu_layernorm_slice(const NpuRedJob *job, const uint64_t *base)
{
    const NpuDims *r = &job->red;
    uint32_t dt = job->dtype, last = r->nd - 1, pass;
    uint64_t len = r->shape[last], rows = job->count / len, row, k;
    uint64_t off[NPU_RED_T];
    double mean = 0.0, var = 0.0, rstd = 0.0;

    for (pass = 0; pass < 3; pass++) {
        for (row = 0; row < rows; row++) {
            npu_red_row(r, row, base, off);
            for (k = 0; k < len; k++) {
                double x = npu_ld_f(job->src[0], dt,
                                    off[0] + k * r->stride[0][last]);

                if (pass == 0) {
                    mean += x;
                } else if (pass == 1) {
                    var += (x - mean) * (x - mean);
                } else {
                    double g = npu_ld_f(job->src[2], dt,
                                        off[2] + k * r->stride[2][last]);
                    double b = npu_ld_f(job->src[3], dt,
                                        off[3] + k * r->stride[3][last]);

                    npu_store_d(job->out, dt, off[1] + k * r->stride[1][last],
                                (x - mean) * rstd * g + b);
                }
            }
        }
        if (pass == 0) {
            mean /= job->count;
        } else if (pass == 1) {
            rstd = 1.0 / sqrt(var / job->count + job->eps);
        }
    }
}

/* Slices [begin, end) into the host output buffer. */
static uint32_t npu_red_tile(NpuCore *core, void *opaque, uint64_t begin,
                             uint64_t end)
{
    const NpuRedJob *job = opaque;
    const NpuDims *kd = &job->keep;
    uint64_t u, base[NPU_RED_T];
    uint32_t t, d;

    for (u = begin; u < end; u++) {
        uint64_t rest = u;

        memset(base, 0, sizeof(base));
        for (d = kd->nd; d-- > 0;) {
            uint64_t i = rest % kd->shape[d];

            rest /= kd->shape[d];
            for (t = 0; t < NPU_RED_T; t++) {
                base[t] += i * kd->stride[t][d];
            }
        }
        switch (job->opcode) {
        case NPU_OP_REDUCE:
            npu_reduce_slice(job, base);
            break;
        case NPU_OP_SOFTMAX:
            npu_softmax_slice(job, base);
            break;
        default: /* NPU_OP_LAYERNORM */
            npu_layernorm_slice(job, base);
            break;
        }
    }
    return NPU_ST_OK;
}

/* Add dim @d (strides @st) to @dims, merged into the last one if it can. */
static void npu_dims_push(NpuDims *dims, bool adjacent, uint64_t shape,
                          const uint64_t *st)
{
    uint32_t n = dims->nd, t;
    bool merge = adjacent && n > 0;

    for (t = 0; t < NPU_RED_T && merge; t++) {
        merge = dims->stride[t][n - 1] == st[t] * shape;
    }
    if (merge) {
        dims->shape[n - 1] *= shape;
    } else {
        dims->shape[n] = shape;
        dims->nd = ++n;
    }
    for (t = 0; t < NPU_RED_T; t++) {
        dims->stride[t][n - 1] = st[t];
    }
}

/* At least one dim, so that the loops need no special case. */
static void npu_dims_fixup(NpuDims *dims)
{
    uint32_t t;

    if (!dims->nd) {
        dims->nd = 1;
        dims->shape[0] = 1;
        for (t = 0; t < NPU_RED_T; t++) {
            dims->stride[t][0] = 0;
        }
    }
}

/*
 * Split the dims of a checked REDUCE/SOFTMAX/LAYERNORM into kept and
 * reduced ones: size-1 dims dropped, neighbours of the same kind that
 * every operand walks as one merged. The output's strides are its dense
 * row-major ones (only its shape is meaningful in size-1 dims).
 */
static void npu_red_split(NpuRedJob *job, const struct npu_tensor_params *p)
{
    const struct npu_hw_tensor *in = &p->t[0];
    const struct npu_hw_tensor *out = &p->t[job->opcode == NPU_OP_LAYERNORM ?
                                            3 : 1];
    uint64_t ostride[NPU_MAX_RANK], acc = 1;
    int last = -1;                  /* kind of the previous dim kept */
    uint32_t d;

    for (d = out->ndim; d-- > 0;) {
        ostride[d] = acc;
        acc *= out->shape[d];
    }
    job->count = 1;
    for (d = 0; d < in->ndim; d++) {
        uint64_t st[NPU_RED_T] = { in->strides[d], 0, 0, 0 };
        bool red;

        if (in->shape[d] == 1) {
            continue;
        }
        switch (job->opcode) {
        case NPU_OP_REDUCE:
            red = p->params[0] & (1u << d);
            break;
        case NPU_OP_SOFTMAX:
            red = d == p->params[0];
            break;
        default: /* NPU_OP_LAYERNORM */
            red = d + p->params[0] >= in->ndim;
            st[2] = red ? p->t[1].strides[d] : 0;
            st[3] = red ? p->t[2].strides[d] : 0;
            break;
        }
        st[1] = out->shape[d] == 1 ? 0 : ostride[d];
        if (red) {
            job->count *= in->shape[d];
        }
        npu_dims_push(red ? &job->red : &job->keep, last == red,
                      in->shape[d], st);
        last = red;
    }
    npu_dims_fixup(&job->red);
    npu_dims_fixup(&job->keep);
}

/* A checked REDUCE/SOFTMAX/LAYERNORM whose inputs are in @bufs. */
static uint32_t npu_exec_red(NpuState *s, NpuWalk *w,
                             const struct npu_tensor_params *p,
                             uint32_t opcode, uint32_t kind,
                             uint8_t *const *bufs, uint8_t *out)
{
    NpuRedJob job = {
        .opcode = opcode, .kind = kind, .dtype = p->t[0].dtype,
        .src = { bufs[0], NULL, bufs[1], bufs[2] }, .out = out,
        .eps = npu_u2f(p->params[1]),
    };
    const struct npu_hw_tensor *o = &p->t[npu_tensor_op_operands(opcode) - 1];
    uint64_t units = 1, grain;
    uint32_t d, st;

    npu_red_split(&job, p);
    for (d = 0; d < job.keep.nd; d++) {
        units *= job.keep.shape[d];
    }
    /* Large ops: about two tiles of whole slices per core. */
    grain = npu_tensor_numel(&p->t[0]) < NPU_TENSOR_TILE_MIN ? units :
            DIV_ROUND_UP(units, s->cores.n * 2);
    st = npu_run_tiles(s, npu_red_tile, &job, units, grain);
    if (st == NPU_ST_OK) {
        st = npu_mem_write(s, w, o->va, out,
                           npu_tensor_numel(o) * npu_dtype_size(o->dtype));
    }
    return st;
}

/* ---------------------------------------------------------------------- */
/* MATMUL and LINEAR */

/*
 * out[b] = act(a[b] @ b[b] (+ bias)) for every batch index b of out's
 * leading r - 2 dims. The units of the tiles are (batch, block of rows of
 * M) in output order, so a tile's output is one contiguous run. Per unit,
 * op(a) and b are handed to cblas_sgemm as they are when they already are
 * fp32 matrices BLAS can address (unit stride on one side, a leading
 * dimension on the other: row-major, or a plain transpose), otherwise
 * packed into contiguous fp32 (widened from fp16/bf16). BLAS accumulates
 * in fp32 into an fp32 [rows, N] block (the output buffer itself for an
 * fp32 output on a little-endian host); bias and activation are applied
 * in fp32, and the block is rounded once to the output dtype.
 */

/* Ops of fewer multiply-adds run as one tile on the command processor. */
#define NPU_MM_TILE_MIN_FLOP (1ull << 22)
/* Bound of a row block's A and C scratch, in fp32 elements (8 MiB). */
#define NPU_MM_BLOCK_ELEMS ((8 * MiB) / sizeof(float))

/* One matrix operand: rows x cols per batch index. */
typedef struct NpuMmOp {
    const uint8_t *data;    /* host copy of the operand's extent */
    uint32_t dtype, size;
    uint64_t rs, cs;        /* row and column strides; 0 for a size-1 dim */
    uint64_t bstride[NPU_MAX_RANK - 2];     /* batch strides; 0: broadcast */
} NpuMmOp;

typedef struct NpuMmJob {
    NpuWalk walk;           /* snapshot; each tile walks with its own copy */
    NpuMmOp a, b;
    const float *bias;      /* N values (LINEAR), else NULL */
    uint32_t kind;          /* enum npu_act_kind */
    uint32_t nb;            /* batch dims */
    uint64_t bshape[NPU_MAX_RANK - 2];
    uint64_t m, n, k;
    uint64_t mb, nblk;      /* rows per unit, units per batch index */
    uint8_t *out;           /* host output buffer, contiguous */
    uint64_t out_va;
    uint32_t odtype, osize;
    bool direct_out;        /* BLAS writes fp32 results into @out */
} NpuMmJob;

/* First output element of unit @u. */
static uint64_t npu_mm_unit_start(const NpuMmJob *job, uint64_t u)
{
    uint64_t row = MIN((u % job->nblk) * job->mb, job->m);

    return ((u / job->nblk) * job->m + row) * job->n;
}

/*
 * The rows x cols matrix of @op at element offset @off as BLAS takes it:
 * in place when it is fp32 with a usable layout, else packed into
 * *@scratch (allocated on first use, @cap elements). Packing follows the
 * operand's smaller stride, so that its reads are sequential, and gives a
 * transposed matrix when the columns are the far apart ones. NULL when
 * the scratch cannot be allocated.
 */
static const float *npu_mm_view(const NpuMmOp *op, uint64_t off,
                                uint64_t rows, uint64_t cols, float **scratch,
                                size_t cap, int *ld, bool *trans)
{
    const uint8_t *src = op->data + off * op->size;
    uint64_t rs = rows > 1 ? op->rs : 0, cs = cols > 1 ? op->cs : 0;
    uint64_t r, c;

    if (!HOST_BIG_ENDIAN && op->dtype == NPU_DTYPE_FP32) {
        if ((cols == 1 || cs == 1) && (rows == 1 || rs >= cols)) {
            *ld = rows == 1 ? cols : rs;
            *trans = false;
            return (const float *)src;
        }
        if ((rows == 1 || rs == 1) && (cols == 1 || cs >= rows)) {
            *ld = cols == 1 ? rows : cs;
            *trans = true;
            return (const float *)src;
        }
    }
    if (!*scratch) {
        *scratch = g_try_malloc(cap * sizeof(float));
        if (!*scratch) {
            return NULL;
        }
    }
    *trans = cs > rs;
    if (*trans) {                   /* column c at scratch[c * rows] */
        for (c = 0; c < cols; c++) {
            float *dst = *scratch + c * rows;
            const float *v = npu_load_f32(src + c * cs * op->size, rs,
                                          op->dtype, dst, rows);

            if (v != dst) {
                memcpy(dst, v, rows * sizeof(float));
            }
        }
        *ld = rows;
    } else {                        /* row r at scratch[r * cols] */
        for (r = 0; r < rows; r++) {
            float *dst = *scratch + r * cols;
            const float *v = npu_load_f32(src + r * rs * op->size, cs,
                                          op->dtype, dst, cols);

            if (v != dst) {
                memcpy(dst, v, cols * sizeof(float));
            }
        }
        *ld = cols;
    }
    return *scratch;
}

/* Units [begin, end) of the output, then their write-back. */
static uint32_t npu_mm_tile(NpuCore *core, void *opaque, uint64_t begin,
                            uint64_t end)
{
    const NpuMmJob *job = opaque;
    NpuWalk w = job->walk;
    float *apack = NULL, *bpack = NULL, *ctile = NULL;
    const float *bp = NULL;
    uint64_t first = npu_mm_unit_start(job, begin);
    uint64_t last = npu_mm_unit_start(job, end);
    uint64_t n = job->n, k = job->k, bcur = UINT64_MAX, u;
    uint32_t st = NPU_ST_OK, d;
    int ldb = 0;
    bool tb = false;

    for (u = begin; u < end; u++) {
        uint64_t bi = u / job->nblk, m0 = (u % job->nblk) * job->mb;
        uint64_t rows = MIN(job->mb, job->m - m0), rest = bi, r, j;
        uint64_t aoff = 0, boff = 0, o = (bi * job->m + m0) * n;
        const float *ap;
        float *c;
        int lda;
        bool ta;

        for (d = job->nb; d-- > 0;) {
            uint64_t i = rest % job->bshape[d];

            rest /= job->bshape[d];
            aoff += i * job->a.bstride[d];
            boff += i * job->b.bstride[d];
        }
        if (boff != bcur) {         /* b changes only with the batch */
            bp = npu_mm_view(&job->b, boff, k, n, &bpack, k * n, &ldb, &tb);
            bcur = boff;
        }
        ap = npu_mm_view(&job->a, aoff + m0 * job->a.rs, rows, k, &apack,
                         job->mb * k, &lda, &ta);
        if (job->direct_out) {
            c = (float *)job->out + o;
        } else {
            if (!ctile) {
                ctile = g_try_malloc(job->mb * n * sizeof(float));
            }
            c = ctile;
        }
        if (!ap || !bp || !c) {
            st = NPU_ST_NO_MEMORY;
            break;
        }
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                    tb ? CblasTrans : CblasNoTrans, rows, n, k, 1.0f, ap, lda,
                    bp, ldb, 0.0f, c, n);
        if (job->bias) {
            for (r = 0; r < rows; r++) {
                for (j = 0; j < n; j++) {
                    c[r * n + j] += job->bias[j];
                }
            }
        }
        if (job->kind != NPU_ACT_NONE) {
            npu_unary_f32(job->kind == NPU_ACT_RELU ? NPU_UNARY_RELU :
                          NPU_UNARY_GELU, c, c, rows * n);
        }
        npu_store_f32(job->out + o * job->osize, job->odtype, c, rows * n);
    }
    g_free(apack);
    g_free(bpack);
    g_free(ctile);
    if (st != NPU_ST_OK) {
        qemu_log_mask(LOG_GUEST_ERROR, "npu: matmul %" PRIu64 "x%" PRIu64
                      "x%" PRIu64 ": out of device memory\n", job->m, k, n);
        return st;
    }
    return npu_mem_write(core->s, &w, job->out_va + first * job->osize,
                         job->out + first * job->osize,
                         (last - first) * job->osize);
}

static void npu_mm_op_init(NpuMmOp *op, const struct npu_hw_tensor *t,
                           const uint8_t *data)
{
    uint32_t r = t->ndim, d;

    op->data = data;
    op->dtype = t->dtype;
    op->size = npu_dtype_size(t->dtype);
    op->rs = t->shape[r - 2] > 1 ? t->strides[r - 2] : 0;
    op->cs = t->shape[r - 1] > 1 ? t->strides[r - 1] : 0;
    for (d = 0; d + 2 < r; d++) {
        op->bstride[d] = t->shape[d] > 1 ? t->strides[d] : 0;
    }
}

/* A checked MATMUL/LINEAR whose inputs are in @bufs. */
static uint32_t npu_exec_matmul(NpuState *s, NpuWalk *w,
                                const struct npu_tensor_params *p,
                                uint32_t opcode, uint32_t kind,
                                uint8_t *const *bufs, uint8_t *out)
{
    const struct npu_hw_tensor *o = &p->t[npu_tensor_op_operands(opcode) - 1];
    uint32_t r = o->ndim, cores = MAX(s->cores.n, 1), d, st;
    NpuMmJob job = {
        .walk = *w, .kind = kind, .nb = r - 2,
        .m = o->shape[r - 2], .n = o->shape[r - 1],
        .k = p->t[0].shape[r - 1],
        .out = out, .out_va = o->va, .odtype = o->dtype,
        .osize = npu_dtype_size(o->dtype),
        .direct_out = !HOST_BIG_ENDIAN && o->dtype == NPU_DTYPE_FP32,
    };
    uint64_t batch = 1, flop, units, grain;
    float *bias = NULL;

    npu_mm_op_init(&job.a, &p->t[0], bufs[0]);
    npu_mm_op_init(&job.b, &p->t[1], bufs[1]);
    for (d = 0; d < job.nb; d++) {
        job.bshape[d] = o->shape[d];
        batch *= o->shape[d];
    }
    if (opcode == NPU_OP_LINEAR) {
        const struct npu_hw_tensor *bt = &p->t[2];
        const float *v;

        bias = g_try_malloc(job.n * sizeof(float));
        if (!bias) {
            return NPU_ST_NO_MEMORY;
        }
        v = npu_load_f32(bufs[2], job.n > 1 ? bt->strides[r - 1] : 0,
                         bt->dtype, bias, job.n);
        if (v != bias) {
            memcpy(bias, v, job.n * sizeof(float));
        }
        job.bias = bias;
    }

    /* Row blocks bounded in size; large ops: at least two per core. */
    job.mb = MIN(job.m, MAX(NPU_MM_BLOCK_ELEMS / (job.k + job.n), 1));
    flop = batch * job.m * job.n * job.k;
    if (flop >= NPU_MM_TILE_MIN_FLOP && cores > 1 &&
        batch * DIV_ROUND_UP(job.m, job.mb) < cores * 2) {
        job.mb = DIV_ROUND_UP(job.m, DIV_ROUND_UP(cores * 2, batch));
    }
    job.nblk = DIV_ROUND_UP(job.m, job.mb);
    units = batch * job.nblk;
    grain = flop < NPU_MM_TILE_MIN_FLOP ? units :
            DIV_ROUND_UP(units, cores * 2);
    st = npu_run_tiles(s, npu_mm_tile, &job, units, grain);
    g_free(bias);
    return st;
}

/* ---------------------------------------------------------------------- */
/* CONV2D and POOL2D */

/*
 * CONV2D is im2col + cblas_sgemm. The units of the tiles are (image,
 * group, block of output positions) in that order; the positions are the
 * flattened OH x OW plane, so a block is a run of whole or partial output
 * rows. Per unit, the columns matrix [C/g * KH * KW, positions] is filled
 * from the input (widened to fp32, zeros for the padding), multiplied by
 * the group's packed fp32 weights [O/g, C/g * KH * KW] with fp32
 * accumulation, the bias is added, the activation applied, and the result
 * rounded once to the output dtype. A block's columns and result together
 * hold at most NPU_MM_BLOCK_ELEMS fp32 values (at least one position).
 * Each unit writes back its O/g runs of the output (one per channel).
 */
typedef struct NpuConvJob {
    NpuWalk walk;           /* snapshot; each tile walks with its own copy */
    const uint8_t *in;      /* host copy of the input's extent */
    uint32_t dtype, size, kind;
    uint64_t is[4];         /* input strides, elements; 0 for size-1 dims */
    uint64_t c, h, w, o, kh, kw, oh, ow, ohw;
    uint64_t sh, sw, ph, pw, dh, dw;
    uint64_t g, cg, og, kk; /* groups, C / g, O / g, C / g * KH * KW */
    const float *wt;        /* weights as fp32 [O, kk] */
    const float *bias;      /* O values */
    uint64_t pb, nblk;      /* positions per unit, units per (image, group) */
    uint8_t *out;           /* host output buffer, contiguous */
    uint64_t out_va;
    uint32_t osize;
    bool direct_out;        /* BLAS writes fp32 results into @out */
} NpuConvJob;

/* Ops of fewer multiply-adds (or pooled taps) run as one tile. */
#define NPU_CONV_TILE_MIN_FLOP (1ull << 22)

/* Row @k of the columns matrix for positions [p0, p0 + n) of image @img. */
static void npu_conv_im2col_row(const NpuConvJob *job, uint64_t img,
                                uint64_t grp, uint64_t k, uint64_t p0,
                                uint64_t n, float *dst)
{
    uint64_t kj = k % job->kw, ki = k / job->kw % job->kh;
    uint64_t ci = grp * job->cg + k / (job->kw * job->kh);
    int64_t offw = (int64_t)(kj * job->dw) - (int64_t)job->pw;
    const uint8_t *plane = job->in +
        (img * job->is[0] + ci * job->is[1]) * job->size;
    uint64_t p = p0, lo, hi;

    while (p < p0 + n) {
        uint64_t oh = p / job->ow, ow0 = p % job->ow;
        uint64_t ow1 = MIN(job->ow, ow0 + (p0 + n - p));
        int64_t ih = (int64_t)(oh * job->sh + ki * job->dh) - (int64_t)job->ph;
        float *d = dst + (p - p0);  /* d[ow - ow0] for ow in [ow0, ow1) */

        /* Output columns whose input column iw = ow * sw + offw is in W. */
        lo = offw >= 0 ? 0 : DIV_ROUND_UP((uint64_t)-offw, job->sw);
        hi = offw > (int64_t)job->w - 1 ? 0 :
             ((uint64_t)((int64_t)job->w - 1 - offw)) / job->sw + 1;
        if (ih < 0 || ih >= (int64_t)job->h) {
            lo = hi = ow1;
        }
        lo = MIN(MAX(lo, ow0), ow1);
        hi = MIN(MAX(hi, lo), ow1);
        memset(d, 0, (lo - ow0) * sizeof(float));
        if (hi > lo) {
            uint64_t iw = lo * job->sw + offw;
            const float *v = npu_load_f32(plane + (ih * job->is[2] +
                                                   iw * job->is[3]) * job->size,
                                          job->sw * job->is[3], job->dtype,
                                          d + lo - ow0, hi - lo);

            if (v != d + lo - ow0) {
                memcpy(d + lo - ow0, v, (hi - lo) * sizeof(float));
            }
        }
        memset(d + hi - ow0, 0, (ow1 - hi) * sizeof(float));
        p += ow1 - ow0;
    }
}

static uint32_t npu_conv_tile(NpuCore *core, void *opaque, uint64_t begin,
                              uint64_t end)
{
    const NpuConvJob *job = opaque;
    NpuWalk w = job->walk;
    float *col = g_try_malloc(job->kk * job->pb * sizeof(float));
    float *cbuf = job->direct_out ? NULL :
                  g_try_malloc(job->og * job->pb * sizeof(float));
    uint32_t st = NPU_ST_OK;
    uint64_t u, k, oc;

    if (!col || (!job->direct_out && !cbuf)) {
        qemu_log_mask(LOG_GUEST_ERROR, "npu: conv2d: out of device memory\n");
        st = NPU_ST_NO_MEMORY;
        goto out;
    }
    for (u = begin; u < end && st == NPU_ST_OK; u++) {
        uint64_t img = u / (job->g * job->nblk), grp = u / job->nblk % job->g;
        uint64_t p0 = u % job->nblk * job->pb;
        uint64_t n = MIN(job->pb, job->ohw - p0);
        uint64_t first = (img * job->o + grp * job->og) * job->ohw + p0;
        float *c;
        uint64_t ldc;

        for (k = 0; k < job->kk; k++) {
            npu_conv_im2col_row(job, img, grp, k, p0, n, col + k * n);
        }
        if (job->direct_out) {
            c = (float *)job->out + first;
            ldc = job->ohw;
        } else {
            c = cbuf;
            ldc = n;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, job->og, n,
                    job->kk, 1.0f, job->wt + grp * job->og * job->kk,
                    job->kk, col, n, 0.0f, c, ldc);
        for (oc = 0; oc < job->og && st == NPU_ST_OK; oc++) {
            float *row = c + oc * ldc, b = job->bias[grp * job->og + oc];
            uint64_t off = first + oc * job->ohw, i;

            for (i = 0; i < n; i++) {
                row[i] += b;
            }
            if (job->kind != NPU_ACT_NONE) {
                npu_unary_f32(job->kind == NPU_ACT_RELU ? NPU_UNARY_RELU :
                              NPU_UNARY_GELU, row, row, n);
            }
            npu_store_f32(job->out + off * job->osize, job->dtype, row, n);
            st = npu_mem_write(core->s, &w, job->out_va + off * job->osize,
                               job->out + off * job->osize, n * job->osize);
        }
    }
out:
    g_free(col);
    g_free(cbuf);
    return st;
}

/* @n fp32 values of a strided run, into @dst. */
static void npu_load_f32_to(float *dst, const uint8_t *src, uint64_t stride,
                            uint32_t dtype, uint64_t n)
{
    const float *v = npu_load_f32(src, stride, dtype, dst, n);

    if (v != dst) {
        memcpy(dst, v, n * sizeof(float));
    }
}

/* A checked CONV2D whose inputs are in @bufs. */
static uint32_t npu_exec_conv(NpuState *s, NpuWalk *w,
                              const struct npu_tensor_params *p,
                              uint32_t kind, uint8_t *const *bufs,
                              uint8_t *out)
{
    const struct npu_hw_tensor *in = &p->t[0], *wt = &p->t[1];
    const struct npu_hw_tensor *bt = &p->t[2], *o = &p->t[3];
    const uint32_t *q = p->params;
    uint32_t cores = MAX(s->cores.n, 1), d, st;
    NpuConvJob job = {
        .walk = *w, .in = bufs[0], .dtype = o->dtype,
        .size = npu_dtype_size(o->dtype), .kind = kind,
        .c = in->shape[1], .h = in->shape[2], .w = in->shape[3],
        .o = o->shape[1], .kh = wt->shape[2], .kw = wt->shape[3],
        .oh = o->shape[2], .ow = o->shape[3],
        .sh = q[NPU_CONV_P_STRIDE_H], .sw = q[NPU_CONV_P_STRIDE_W],
        .ph = q[NPU_CONV_P_PAD_H], .pw = q[NPU_CONV_P_PAD_W],
        .dh = q[NPU_CONV_P_DIL_H], .dw = q[NPU_CONV_P_DIL_W],
        .g = q[NPU_CONV_P_GROUPS],
        .out = out, .out_va = o->va, .osize = npu_dtype_size(o->dtype),
        .direct_out = !HOST_BIG_ENDIAN && o->dtype == NPU_DTYPE_FP32,
    };
    uint64_t batch = in->shape[0], flop, units, grain, r, i, j;
    float *wpack = NULL, *bias;

    for (d = 0; d < 4; d++) {
        job.is[d] = in->shape[d] > 1 ? in->strides[d] : 0;
    }
    job.ohw = job.oh * job.ow;
    job.cg = job.c / job.g;
    job.og = job.o / job.g;
    job.kk = job.cg * job.kh * job.kw;

    bias = g_try_malloc(job.o * sizeof(float));
    if (!HOST_BIG_ENDIAN && wt->dtype == NPU_DTYPE_FP32 &&
        npu_tensor_is_contiguous(wt)) {
        job.wt = (const float *)bufs[1];
    } else {
        /* Rows of KW taps: [O, C / g, KH] rows into [O, kk]. */
        wpack = g_try_malloc(job.o * job.kk * sizeof(float));
        job.wt = wpack;
    }
    if (!bias || !job.wt) {
        qemu_log_mask(LOG_GUEST_ERROR, "npu: conv2d: out of device memory\n");
        st = NPU_ST_NO_MEMORY;
        goto out;
    }
    if (wpack) {
        for (r = 0; r < job.o * job.cg * job.kh; r++) {
            uint64_t oc = r / (job.cg * job.kh), ci = r / job.kh % job.cg;
            uint64_t ki = r % job.kh;

            i = (job.o > 1 ? oc * wt->strides[0] : 0) +
                (job.cg > 1 ? ci * wt->strides[1] : 0) +
                (job.kh > 1 ? ki * wt->strides[2] : 0);
            npu_load_f32_to(wpack + r * job.kw, bufs[1] + i * job.size,
                            job.kw > 1 ? wt->strides[3] : 0, wt->dtype,
                            job.kw);
        }
    }
    npu_load_f32_to(bias, bufs[2], job.o > 1 ? bt->strides[1] : 0,
                    bt->dtype, job.o);
    job.bias = bias;

    /* Position blocks bounded in size; large ops: two units per core. */
    job.pb = MIN(job.ohw, MAX(NPU_MM_BLOCK_ELEMS / (job.kk + job.og), 1));
    flop = batch * job.o * job.ohw * job.kk;
    j = batch * job.g;
    if (flop >= NPU_CONV_TILE_MIN_FLOP && cores > 1 &&
        j * DIV_ROUND_UP(job.ohw, job.pb) < cores * 2) {
        job.pb = DIV_ROUND_UP(job.ohw, DIV_ROUND_UP(cores * 2, j));
    }
    job.nblk = DIV_ROUND_UP(job.ohw, job.pb);
    units = j * job.nblk;
    grain = flop < NPU_CONV_TILE_MIN_FLOP ? units :
            DIV_ROUND_UP(units, cores * 2);
    st = npu_run_tiles(s, npu_conv_tile, &job, units, grain);
out:
    g_free(wpack);
    g_free(bias);
    return st;
}

/*
 * POOL2D: direct loops over the in-bounds taps of each window (every
 * window has at least one, as pads are below the kernel size), in tiles
 * of whole (image, channel) planes, whose output is one contiguous run.
 * MAX propagates NaN like np.max; AVG sums in double and divides by the
 * kernel area (NPU_POOL_F_COUNT_PAD) or the in-bounds count. Either is
 * rounded once to the output dtype.
 */
typedef struct NpuPoolJob {
    NpuWalk walk;
    const uint8_t *in;
    uint32_t dtype, kind;
    uint64_t is[4];
    uint64_t c, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
    bool count_pad;
    uint8_t *out;
    uint64_t out_va;
    uint32_t osize;
} NpuPoolJob;

/* In-bounds taps [*lo, *hi) of the window at output index @o. */
static void npu_pool_range(uint64_t o, uint64_t stride, uint64_t pad,
                           uint64_t k, uint64_t n, uint64_t *lo, uint64_t *hi)
{
    uint64_t start = o * stride;    /* in padded coordinates */

    *lo = MAX(start, pad) - pad;
    *hi = MIN(start + k, n + pad) - pad;
}

static uint32_t npu_pool_tile(NpuCore *core, void *opaque, uint64_t begin,
                              uint64_t end)
{
    const NpuPoolJob *job = opaque;
    NpuWalk w = job->walk;
    uint64_t ohw = job->oh * job->ow, u, oh, ow, h, x, h0, h1, w0, w1;

    for (u = begin; u < end; u++) {
        const uint8_t *plane = job->in;
        uint64_t base = (u / job->c) * job->is[0] + (u % job->c) * job->is[1];
        uint64_t o = u * ohw;

        for (oh = 0; oh < job->oh; oh++) {
            npu_pool_range(oh, job->sh, job->ph, job->kh, job->h, &h0, &h1);
            for (ow = 0; ow < job->ow; ow++, o++) {
                double sum = 0.0, div;
                float m;

                npu_pool_range(ow, job->sw, job->pw, job->kw, job->w, &w0, &w1);
                if (job->kind == NPU_POOL_MAX) {
                    m = npu_ld_f(plane, job->dtype, base + h0 * job->is[2] +
                                 w0 * job->is[3]);
                    for (h = h0; h < h1; h++) {
                        for (x = w0; x < w1; x++) {
                            m = npu_maxf(m, npu_ld_f(plane, job->dtype,
                                                     base + h * job->is[2] +
                                                     x * job->is[3]));
                        }
                    }
                    npu_store_d(job->out, job->dtype, o, m);
                    continue;
                }
                for (h = h0; h < h1; h++) {
                    for (x = w0; x < w1; x++) {
                        sum += npu_ld_f(plane, job->dtype,
                                        base + h * job->is[2] + x * job->is[3]);
                    }
                }
                div = job->count_pad ? (double)job->kh * job->kw :
                      (double)(h1 - h0) * (w1 - w0);
                npu_store_d(job->out, job->dtype, o, sum / div);
            }
        }
    }
    return npu_mem_write(core->s, &w, job->out_va + begin * ohw * job->osize,
                         job->out + begin * ohw * job->osize,
                         (end - begin) * ohw * job->osize);
}

/* A checked POOL2D whose input is in @bufs[0]. */
static uint32_t npu_exec_pool(NpuState *s, NpuWalk *w,
                              const struct npu_tensor_params *p,
                              uint32_t kind, uint8_t *const *bufs,
                              uint8_t *out)
{
    const struct npu_hw_tensor *in = &p->t[0], *o = &p->t[1];
    const uint32_t *q = p->params;
    uint32_t cores = MAX(s->cores.n, 1), d;
    NpuPoolJob job = {
        .walk = *w, .in = bufs[0], .dtype = o->dtype, .kind = kind,
        .c = in->shape[1], .h = in->shape[2], .w = in->shape[3],
        .oh = o->shape[2], .ow = o->shape[3],
        .kh = q[NPU_POOL_P_KH], .kw = q[NPU_POOL_P_KW],
        .sh = q[NPU_POOL_P_STRIDE_H], .sw = q[NPU_POOL_P_STRIDE_W],
        .ph = q[NPU_POOL_P_PAD_H], .pw = q[NPU_POOL_P_PAD_W],
        .count_pad = q[NPU_POOL_P_FLAGS] & NPU_POOL_F_COUNT_PAD,
        .out = out, .out_va = o->va, .osize = npu_dtype_size(o->dtype),
    };
    uint64_t units = in->shape[0] * job.c, taps, grain;

    for (d = 0; d < 4; d++) {
        job.is[d] = in->shape[d] > 1 ? in->strides[d] : 0;
    }
    taps = units * job.oh * job.ow * MIN(job.kh, job.h) * MIN(job.kw, job.w);
    grain = taps < NPU_CONV_TILE_MIN_FLOP ? units :
            DIV_ROUND_UP(units, cores * 2);
    return npu_run_tiles(s, npu_pool_tile, &job, units, grain);
}

static const char *const npu_tensor_names[NPU_OP_COUNT][NPU_TENSOR_OPERANDS] = {
    [NPU_OP_ELTWISE] = { "eltwise a", "eltwise b", "eltwise out" },
    [NPU_OP_UNARY] = { "unary in", "unary out" },
    [NPU_OP_CONVERT] = { "convert in", "convert out" },
    [NPU_OP_REDUCE] = { "reduce in", "reduce out" },
    [NPU_OP_SOFTMAX] = { "softmax in", "softmax out" },
    [NPU_OP_LAYERNORM] = { "layernorm in", "layernorm gamma",
                           "layernorm beta", "layernorm out" },
    [NPU_OP_MATMUL] = { "matmul a", "matmul b", "matmul out" },
    [NPU_OP_LINEAR] = { "linear a", "linear b", "linear bias", "linear out" },
    [NPU_OP_CONV2D] = { "conv2d in", "conv2d weight", "conv2d bias",
                        "conv2d out" },
    [NPU_OP_POOL2D] = { "pool2d in", "pool2d out" },
};

/* The parameter block in host byte order. */
static void npu_tensor_params_to_cpu(struct npu_tensor_params *p)
{
    uint32_t i, d;

    for (i = 0; i < NPU_TENSOR_OPERANDS; i++) {
        struct npu_hw_tensor *t = &p->t[i];

        t->va = le64_to_cpu(t->va);
        t->dtype = le32_to_cpu(t->dtype);
        t->ndim = le32_to_cpu(t->ndim);
        for (d = 0; d < NPU_MAX_RANK; d++) {
            t->shape[d] = le32_to_cpu(t->shape[d]);
            t->strides[d] = le32_to_cpu(t->strides[d]);
        }
    }
    for (i = 0; i < NPU_TENSOR_PARAMS; i++) {
        p->params[i] = le32_to_cpu(p->params[i]);
    }
}

uint32_t npu_exec_tensor(NpuState *s, NpuWalk *w, const struct npu_cmd *cmd)
{
    uint32_t opcode = cmd->opcode;
    uint32_t kind = le32_to_cpu(cmd->tensor.kind);
    uint64_t pva = le64_to_cpu(cmd->tensor.params);
    struct npu_tensor_params p;
    NpuTensorJob job = { .walk = *w, .opcode = opcode, .kind = kind };
    const struct npu_hw_tensor *out;
    uint8_t *bufs[NPU_TENSOR_OPERANDS - 1] = { NULL, NULL, NULL };
    uint64_t numel, len, units, grain;
    uint32_t st, i;

    if (cmd->tensor.rsvd) {
        qemu_log_mask(LOG_GUEST_ERROR, "npu: tensor op reserved field set\n");
        return NPU_ST_BAD_RESERVED;
    }
    if (pva % 64) {
        qemu_log_mask(LOG_GUEST_ERROR, "npu: tensor params at 0x%" PRIx64
                      " not 64-byte aligned\n", pva);
        return NPU_ST_BAD_ARGS;
    }
    st = npu_check_range("tensor params", pva, sizeof(p));
    if (st == NPU_ST_OK) {
        st = npu_mem_read(s, w, pva, &p, sizeof(p));
    }
    if (st != NPU_ST_OK) {
        return st;
    }
    npu_tensor_params_to_cpu(&p);
    st = npu_tensor_op_check(opcode, kind, &p);
    if (st != NPU_ST_OK) {
        qemu_log_mask(LOG_GUEST_ERROR, "npu: tensor op %u kind %u: invalid"
                      " parameter block (status %u)\n", opcode, kind, st);
        return st;
    }

    job.nin = npu_tensor_op_operands(opcode) - 1;
    out = &p.t[job.nin];
    for (i = 0; i <= job.nin; i++) {
        st = npu_check_range(npu_tensor_names[opcode][i], p.t[i].va,
                             npu_tensor_extent(&p.t[i]));
        if (st != NPU_ST_OK) {
            return st;
        }
    }

    numel = npu_tensor_numel(out);
    job.odtype = out->dtype;
    job.osize = npu_dtype_size(out->dtype);
    job.out_va = out->va;
    job.out = g_try_malloc(numel * job.osize);
    for (i = 0; i < job.nin; i++) {
        bufs[i] = g_try_malloc(npu_tensor_extent(&p.t[i]));
        if (!bufs[i]) {
            break;
        }
    }
    if (!job.out || i < job.nin) {
        qemu_log_mask(LOG_GUEST_ERROR, "npu: tensor op of %" PRIu64
                      " elements: out of device memory\n", numel);
        st = NPU_ST_NO_MEMORY;
        goto out;
    }
    /* All inputs are read before any output is written: they may alias. */
    for (i = 0; i < job.nin && st == NPU_ST_OK; i++) {
        st = npu_mem_read(s, w, p.t[i].va, bufs[i],
                          npu_tensor_extent(&p.t[i]));
    }
    if (st != NPU_ST_OK) {
        goto out;
    }
    if (opcode == NPU_OP_MATMUL || opcode == NPU_OP_LINEAR) {
        st = npu_exec_matmul(s, w, &p, opcode, kind, bufs, job.out);
        goto out;
    }
    if (opcode == NPU_OP_CONV2D) {
        st = npu_exec_conv(s, w, &p, kind, bufs, job.out);
        goto out;
    }
    if (opcode == NPU_OP_POOL2D) {
        st = npu_exec_pool(s, w, &p, kind, bufs, job.out);
        goto out;
    }
    if (opcode >= NPU_OP_REDUCE) {
        st = npu_exec_red(s, w, &p, opcode, kind, bufs, job.out);
        goto out;
    }

    for (i = 0; i < job.nin; i++) {
        job.in[i].data = bufs[i];
        job.in[i].dtype = p.t[i].dtype;
        job.in[i].size = npu_dtype_size(p.t[i].dtype);
    }
    npu_tensor_collapse(&job, &p);
    len = job.shape[job.ndim - 1];
    job.seg_len = MIN(len, (uint64_t)NPU_TENSOR_SEG);
    job.nseg = DIV_ROUND_UP(len, job.seg_len);
    units = numel / len * job.nseg;
    /* Large ops: about two tiles per core for load balance. */
    grain = numel < NPU_TENSOR_TILE_MIN ? units :
            DIV_ROUND_UP(units, s->cores.n * 2);
    st = npu_run_tiles(s, npu_tensor_tile, &job, units, grain);
out:
    g_free(job.out);
    for (i = 0; i < ARRAY_SIZE(bufs); i++) {
        g_free(bufs[i]);
    }
    return st;
}
