/*
 * NPU tensor ops: ELTWISE, UNARY, CONVERT, REDUCE, SOFTMAX, LAYERNORM,
 * MATMUL, LINEAR, CONV2D, POOL2D, REQUANT and SELECT.
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
 * complement and wrap to the output dtype, as numpy does. Integer
 * MATMUL/LINEAR/CONV2D sum int8 products exactly in int32 (K blocks of
 * sgemm, each exact in fp32); REQUANT rounds int32 * fp32 exactly.
 *
 * This file holds the common part (parameter block, validation, gather of
 * the inputs, dispatch) and ELTWISE, UNARY and CONVERT. The other ops are
 * computed in npu_reduce.c (REDUCE, SOFTMAX, LAYERNORM: per slice in
 * double) and npu_nn.c (MATMUL, LINEAR, CONV2D, POOL2D: oneDNN sgemm with
 * fp32 accumulation, and direct loops) and npu_place.c (SELECT, and
 * CONVERT into a strided output); the conversions of runs of elements
 * are in npu_dtype.c.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/log.h"
#include "qemu/units.h"
#include "qemu/madvise.h"
#include "qemu/memalign.h"
#include "qemu/bswap.h"
#include "qemu/atomic.h"
#include <math.h>
#include "hw/misc/trace.h"
#include "npu_tensor_int.h"

/*
 * Units of work: each unit computes a contiguous piece of the output (one
 * or several whole rows of the collapsed innermost dimension, or a segment
 * of one row) into its core's chunk and writes it back with one DMA.
 *
 * Streamed ops read each unit's input ranges themselves, into staging
 * areas of the chunk: NPU_TENSOR_PIECE output elements per unit, each
 * input's range staged at once when it fits NPU_TENSOR_STAGE bytes, else
 * row by row. Gathered ops (strided inner dimensions, overlaps) have their
 * inputs in host memory and compute bands of up to NPU_TENSOR_BAND rows
 * (NPU_TENSOR_GPIECE elements); a strided input is first packed densely
 * in 16 x 16 tiles, so that a transposed input is read a cache line at a
 * time.
 */
#define NPU_TENSOR_PIECE (16 * 1024)
#define NPU_TENSOR_STAGE (128 * KiB)
#define NPU_TENSOR_GPIECE (64 * 1024)
#define NPU_TENSOR_BAND 64
/* Elements converted and computed at a time (fits the stack scratch). */
#define NPU_TENSOR_BLK 1024
/* Gathers of at least this many bytes are split across the cores. */
#define NPU_GATHER_SPLIT (1 * MiB)
/*
 * ELTWISE/UNARY/CONVERT of fewer output elements run as one tile: handing
 * tiles to the cores costs tens of microseconds, which only pays off from
 * about 512K elements for memory-bound ops, and much earlier for the
 * others (transcendentals, fp16/bf16 rounding, transposes).
 */
#define NPU_TENSOR_SPLIT_MIN (1u << 16)
#define NPU_TENSOR_SPLIT_MIN_CHEAP (1u << 19)
/* Largest gather scratch kept between ops. */
#define NPU_SCRATCH_KEEP (64 * MiB)

QEMU_BUILD_BUG_ON(NPU_TENSOR_PIECE * 4 + 2 * NPU_TENSOR_STAGE > NPU_CHUNK);
QEMU_BUILD_BUG_ON(NPU_TENSOR_STAGE < 2 * 4 * NPU_TENSOR_PIECE);
/* Room for the padding of NPU_TENSOR_BAND packed rows. */
#define NPU_TENSOR_PACK_SLACK (NPU_TENSOR_BAND * 16 * 4)
QEMU_BUILD_BUG_ON(3 * 4 * NPU_TENSOR_GPIECE + 2 * NPU_TENSOR_PACK_SLACK >
                  NPU_CHUNK);

/* One input operand after dimension collapsing. */
typedef struct NpuTensorIn {
    const uint8_t *data;    /* host copy of the extent; NULL if streamed */
    uint64_t va, end;       /* the extent in VA space */
    uint32_t dtype;
    uint32_t size;          /* bytes per element */
    uint64_t stride[NPU_MAX_RANK];  /* elements; 0 where broadcast */
} NpuTensorIn;

typedef struct NpuTensorJob {
    NpuWalk walk;           /* snapshot; each tile walks with its own copy */
    uint32_t opcode, kind;
    uint32_t nin;
    bool stream;            /* inputs read by the units themselves */
    bool direct;            /* ... in place in guest RAM (aligned) */
    NpuTensorIn in[2];
    uint64_t out_va;
    uint32_t odtype, osize;
    uint32_t ndim;          /* collapsed rank, >= 1 */
    uint64_t shape[NPU_MAX_RANK];   /* collapsed output shape */
    uint64_t rows;          /* numel / shape[ndim - 1] */
    uint64_t band;          /* rows per unit (1 when rows are split) */
    uint64_t seg_len, nseg; /* each band is nseg units of seg_len columns */
    uint32_t weight;        /* work per element (npu_engine_work units) */
} NpuTensorJob;

/*
 * Work of one element of a streamed or gathered op, in npu_engine_work()
 * units: bytes moved, times about 4 for a UNARY kind (a transcendental
 * such as erf or tanh costs tens of nanoseconds in scalar code).
 */
#define NPU_TENSOR_WORK 4
#define NPU_TENSOR_WORK_UNARY 16

/* Scratch of one tile: two inputs and one result block. */
typedef union NpuTensorBlk {
    float f[NPU_TENSOR_BLK];
    int32_t i[NPU_TENSOR_BLK];
} NpuTensorBlk;
/* ---------------------------------------------------------------------- */
/* Kernels on contiguous blocks */

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

/* Comparisons as in C (and IEEE 754: only != holds with a NaN). */
#define NPU_COMPARE(kind, o, a, b, n, one, zero) do {                  \
        size_t i_;                                                      \
                                                                        \
        for (i_ = 0; i_ < (n); i_++) {                                  \
            bool r_;                                                    \
                                                                        \
            switch (kind) {                                             \
            case NPU_ELTWISE_EQ:                                        \
                r_ = (a)[i_] == (b)[i_];                                \
                break;                                                  \
            case NPU_ELTWISE_NE:                                        \
                r_ = (a)[i_] != (b)[i_];                                \
                break;                                                  \
            case NPU_ELTWISE_LT:                                        \
                r_ = (a)[i_] < (b)[i_];                                 \
                break;                                                  \
            case NPU_ELTWISE_LE:                                        \
                r_ = (a)[i_] <= (b)[i_];                                \
                break;                                                  \
            case NPU_ELTWISE_GT:                                        \
                r_ = (a)[i_] > (b)[i_];                                 \
                break;                                                  \
            default: /* NPU_ELTWISE_GE */                               \
                r_ = (a)[i_] >= (b)[i_];                                \
                break;                                                  \
            }                                                           \
            (o)[i_] = r_ ? (one) : (zero);                              \
        }                                                               \
    } while (0)

static void npu_compare_f32(uint32_t kind, float *o, const float *a,
                            const float *b, size_t n)
{
    NPU_COMPARE(kind, o, a, b, n, 1.0f, 0.0f);
}

static void npu_compare_i32(uint32_t kind, int32_t *o, const int32_t *a,
                            const int32_t *b, size_t n)
{
    NPU_COMPARE(kind, o, a, b, n, 1, 0);
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
    case NPU_ELTWISE_MIN:
        NPU_F32_BINARY(npu_v4f_min, npu_minf);
        break;
    default: /* comparisons: 1 or 0, stored as BOOL */
        npu_compare_f32(kind, o, a, b, n);
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
    case NPU_ELTWISE_DIV: /* rejected by npu_tensor_op_check() */
        memset(o, 0, n * sizeof(*o));
        break;
    default: /* comparisons: 1 or 0, stored as BOOL */
        npu_compare_i32(kind, o, a, b, n);
        break;
    }
}

void npu_unary_f32(uint32_t kind, float *o, const float *a, size_t n)
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
    case NPU_UNARY_ERF:
        for (i = 0; i < n; i++) {
            o[i] = erff(a[i]);
        }
        break;
    case NPU_UNARY_RECIPROCAL:
        for (i = 0; i < n; i++) {
            o[i] = 1.0f / a[i];
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
 * @n output elements into @dst; input i starts at @src[i] and steps by
 * @step[i] elements.
 */
static void npu_tensor_run(const NpuTensorJob *job, const uint8_t *const *src,
                           const uint64_t *step, uint8_t *dst, uint64_t n,
                           NpuTensorBlk *blk)
{
    const uint8_t *p[2] = { src[0], job->nin > 1 ? src[1] : NULL };
    bool fsrc = npu_dtype_is_float(job->in[0].dtype);
    uint32_t i;

    while (n) {
        size_t m = MIN(n, (uint64_t)NPU_TENSOR_BLK);

        if (fsrc) {
            const float *a = npu_load_f32(p[0], step[0], job->in[0].dtype,
                                          blk[0].f, m);
            /* fp32 output on a little-endian host: compute in place. */
            float *o = (!HOST_BIG_ENDIAN && job->odtype == NPU_DTYPE_FP32) ?
                       (float *)dst : blk[2].f;
            const float *r = o;

            if (job->opcode == NPU_OP_ELTWISE) {
                npu_eltwise_f32(job->kind, o, a,
                                npu_load_f32(p[1], step[1],
                                             job->in[1].dtype, blk[1].f, m),
                                m);
            } else if (job->opcode == NPU_OP_UNARY) {
                npu_unary_f32(job->kind, o, a, m);
            } else {
                r = a;              /* CONVERT: store as the output dtype */
            }
            npu_store_f32(dst, job->odtype, r, m);
        } else {
            const int32_t *a = npu_load_i32(p[0], step[0], job->in[0].dtype,
                                            blk[0].i, m);
            int32_t *o = (!HOST_BIG_ENDIAN && job->odtype == NPU_DTYPE_INT32) ?
                         (int32_t *)dst : blk[2].i;
            const int32_t *r = o;

            if (job->opcode == NPU_OP_ELTWISE) {
                npu_eltwise_i32(job->kind, o, a,
                                npu_load_i32(p[1], step[1],
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
            p[i] += m * step[i] * job->in[i].size;
        }
        dst += m * job->osize;
        n -= m;
    }
}

/*
 * A window of guest memory for a directly streamed operand: host pointer
 * @ptr for VAs [va, va + len), or NULL when that run must be copied.
 */
typedef struct NpuMapWin {
    uint64_t va, len;
    uint8_t *ptr;
    uint64_t done;          /* bytes written from ptr on (outputs) */
    bool write;
} NpuMapWin;

static void npu_win_release(NpuState *s, NpuMapWin *m)
{
    if (m->ptr) {
        npu_mem_unmap(s, m->ptr, m->len, m->write, m->done);
    }
    m->ptr = NULL;
    m->len = 0;
}

/* Point @m at @va, mapping at most @max bytes from there if it must. */
static uint32_t npu_win_at(NpuState *s, NpuWalk *w, NpuMapWin *m, uint64_t va,
                           uint64_t max)
{
    uint32_t st;

    if (va >= m->va && va - m->va < m->len) {
        return NPU_ST_OK;
    }
    npu_win_release(s, m);
    m->ptr = npu_mem_map(s, w, va, max, m->write, &m->len, &st);
    m->va = va;
    m->done = 0;
    return st;
}

/*
 * Rows [0, nrows) of a unit, computed straight from guest RAM into guest
 * RAM through npu_mem_map() windows; runs that are not mappable RAM, and
 * elements straddling two runs, go through the chunk with DMA copies.
 */
static uint32_t npu_tensor_direct(NpuCore *core, const NpuTensorJob *job,
                                  NpuWalk *w, uint64_t (*roff)[2],
                                  uint64_t row0, uint64_t nrows, uint64_t c0,
                                  uint64_t ncols, NpuTensorBlk *blk)
{
    NpuState *s = core->s;
    uint64_t len = job->shape[job->ndim - 1];
    uint64_t oend = job->out_va + ((row0 + nrows - 1) * len + c0 + ncols) *
                    job->osize;
    uint64_t step[2] = { 0, 0 }, r, pos, n, k;
    NpuMapWin win[3] = { { 0 } };
    uint8_t scal[2][4];
    const uint8_t *src[2];
    uint8_t *stage[2] = { core->chunk + NPU_TENSOR_PIECE * 4,
                          core->chunk + NPU_TENSOR_PIECE * 4 +
                          NPU_TENSOR_STAGE };
    uint32_t st = NPU_ST_OK, i;

    win[2].write = true;
    for (i = 0; i < job->nin; i++) {
        step[i] = job->in[i].stride[job->ndim - 1];
    }
    for (r = 0; r < nrows && st == NPU_ST_OK; r++) {
        uint64_t ova = job->out_va + ((row0 + r) * len + c0) * job->osize;

        for (i = 0; i < job->nin && st == NPU_ST_OK; i++) {
            const NpuTensorIn *in = &job->in[i];

            if (!step[i]) {
                st = npu_mem_read(s, w, in->va + roff[r][i] * in->size,
                                  scal[i], in->size);
            }
        }
        for (pos = 0; pos < ncols && st == NPU_ST_OK; pos += n) {
            bool direct = true;
            uint64_t va[2], o = ova + pos * job->osize;

            n = ncols - pos;
            for (i = 0; i < job->nin && st == NPU_ST_OK; i++) {
                const NpuTensorIn *in = &job->in[i];

                if (!step[i]) {
                    src[i] = scal[i];
                    continue;
                }
                va[i] = in->va + (roff[r][i] + c0 + pos) * in->size;
                st = npu_win_at(s, w, &win[i], va[i], in->end - va[i]);
                k = (win[i].va + win[i].len - va[i]) / in->size;
                n = MIN(n, k);
                direct = direct && win[i].ptr;
                src[i] = win[i].ptr ? win[i].ptr + (va[i] - win[i].va) : NULL;
            }
            if (st == NPU_ST_OK) {
                st = npu_win_at(s, w, &win[2], o, oend - o);
            }
            if (st != NPU_ST_OK) {
                break;
            }
            n = MIN(n, (win[2].va + win[2].len - o) / job->osize);
            direct = direct && win[2].ptr && n;
            if (direct) {
                npu_tensor_run(job, src, step,
                               win[2].ptr + (o - win[2].va), n, blk);
                win[2].done = MAX(win[2].done,
                                  o + n * job->osize - win[2].va);
                continue;
            }
            /* Copy through the chunk: at least one element. */
            n = MAX(MIN(n, (uint64_t)NPU_TENSOR_PIECE), 1);
            for (i = 0; i < job->nin && st == NPU_ST_OK; i++) {
                if (step[i]) {
                    st = npu_mem_read(s, w, va[i], stage[i],
                                      n * job->in[i].size);
                    src[i] = stage[i];
                }
            }
            if (st == NPU_ST_OK) {
                npu_tensor_run(job, src, step, core->chunk, n, blk);
                st = npu_mem_write(s, w, o, core->chunk, n * job->osize);
            }
        }
    }
    for (i = 0; i < 3; i++) {
        npu_win_release(s, &win[i]);
    }
    return st;
}

/*
 * Stage elements [lo, hi) of a streamed input in @stage (bytes from
 * element lo on).
 */
static uint32_t npu_tensor_stage(NpuCore *core, NpuWalk *w,
                                 const NpuTensorIn *in, uint8_t *stage,
                                 uint64_t lo, uint64_t hi)
{
    return npu_mem_read(core->s, w, in->va + lo * in->size, stage,
                        (hi - lo) * in->size);
}

/* Copy one element of @size bytes. */
#define NPU_PACK_LOOP(type) do {                                        \
        for (cb = 0; cb < ncols; cb += NPU_PACK_TILE) {                 \
            for (rb = 0; rb < nrows; rb += NPU_PACK_TILE) {             \
                for (c = cb; c < MIN(cb + NPU_PACK_TILE, ncols); c++) { \
                    for (r = rb; r < MIN(rb + NPU_PACK_TILE, nrows); r++) { \
                        ((type *)dst)[r * (ncols + NPU_PACK_PAD) + c] = \
                            ((const type *)in->data)[roff[r][i] +       \
                                                     (c0 + c) * step];  \
                    }                                                   \
                }                                                       \
            }                                                           \
        }                                                               \
    } while (0)

#define NPU_PACK_TILE 16
/*
 * Packed rows are padded by 16 elements: with a power-of-two row length,
 * the 16 rows a tile writes would otherwise share one set of the cache.
 */
#define NPU_PACK_PAD 16

/*
 * Input @i (gathered, inner stride @step) of rows [0, nrows), columns
 * [c0, c0 + ncols) into an nrows x ncols block at @dst (rows padded), in
 * 16 x 16 tiles: a transposed input is read a cache line at a time.
 */
static void npu_tensor_pack(const NpuTensorIn *in, uint64_t (*roff)[2],
                            uint32_t i, uint64_t nrows, uint64_t c0,
                            uint64_t ncols, uint64_t step, uint8_t *dst)
{
    uint64_t cb, rb, c, r;

    switch (in->size) {
    case 4:
        NPU_PACK_LOOP(uint32_t);
        break;
    case 2:
        NPU_PACK_LOOP(uint16_t);
        break;
    default:
        NPU_PACK_LOOP(uint8_t);
        break;
    }
}

/* Unit @u: compute its piece of the output into the chunk, write it. */
static uint32_t npu_tensor_unit(NpuCore *core, const NpuTensorJob *job,
                                NpuWalk *w, uint64_t u, NpuTensorBlk *blk)
{
    uint32_t outer = job->ndim - 1, i, d;
    uint64_t len = job->shape[outer];
    uint64_t row0 = u / job->nseg * job->band;
    uint64_t nrows = MIN(job->band, job->rows - row0);
    uint64_t c0 = u % job->nseg * job->seg_len;
    uint64_t ncols = MIN(len - c0, job->seg_len);
    uint64_t roff[NPU_TENSOR_BAND][2], idx[NPU_MAX_RANK] = { 0 };
    uint64_t step[2] = { 0, 0 }, lo[2] = { 0, 0 }, off[2] = { 0, 0 };
    const uint8_t *base[2] = { NULL, NULL };
    const uint8_t *src[2];
    uint8_t *obuf = core->chunk;
    uint8_t *stage[2] = { core->chunk + NPU_TENSOR_PIECE * 4,
                          core->chunk + NPU_TENSOR_PIECE * 4 +
                          NPU_TENSOR_STAGE };
    bool rowwise[2] = { false, false };
    uint64_t r = row0;
    uint32_t st;

    /* Input offsets of the unit's rows: multi-index, then odometer steps. */
    for (d = outer; d-- > 0;) {
        idx[d] = r % job->shape[d];
        r /= job->shape[d];
        for (i = 0; i < job->nin; i++) {
            off[i] += idx[d] * job->in[i].stride[d];
        }
    }
    for (r = 0; r < nrows; r++) {
        for (i = 0; i < job->nin; i++) {
            roff[r][i] = off[i];
        }
        for (d = outer; d-- > 0;) {
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

    if (!job->stream) {         /* packing areas after the output */
        stage[0] = core->chunk + NPU_TENSOR_GPIECE * 4;
        stage[1] = stage[0] + NPU_TENSOR_GPIECE * 4 + NPU_TENSOR_PACK_SLACK;
    }
    if (job->direct) {
        return npu_tensor_direct(core, job, w, roff, row0, nrows, c0, ncols,
                                 blk);
    }
    for (i = 0; i < job->nin; i++) {
        const NpuTensorIn *in = &job->in[i];
        uint64_t hi = 0;

        step[i] = in->stride[outer];
        if (!job->stream) {
            base[i] = in->data;
            continue;
        }
        /* Streamed: step is 0 or 1; stage all rows' ranges if they fit. */
        lo[i] = UINT64_MAX;
        for (r = 0; r < nrows; r++) {
            lo[i] = MIN(lo[i], roff[r][i] + c0 * step[i]);
            hi = MAX(hi, roff[r][i] + c0 * step[i] + (step[i] ? ncols : 1));
        }
        if ((hi - lo[i]) * in->size > NPU_TENSOR_STAGE) {
            rowwise[i] = true;
            continue;
        }
        st = npu_tensor_stage(core, w, in, stage[i], lo[i], hi);
        if (st != NPU_ST_OK) {
            return st;
        }
        base[i] = stage[i];
    }

    if (job->stream) {
        for (r = 0; r < nrows; r++) {
            for (i = 0; i < job->nin; i++) {
                uint64_t first = roff[r][i] + c0 * step[i];

                if (rowwise[i]) {
                    st = npu_tensor_stage(core, w, &job->in[i], stage[i],
                                          first,
                                          first + (step[i] ? ncols : 1));
                    if (st != NPU_ST_OK) {
                        return st;
                    }
                    lo[i] = first;
                    base[i] = stage[i];
                }
                src[i] = base[i] + (first - lo[i]) * job->in[i].size;
            }
            npu_tensor_run(job, src, step, obuf + r * ncols * job->osize,
                           ncols, blk);
        }
    } else {
        /*
         * Gathered: strided inputs of several rows are packed densely
         * first, tile by tile, so that transposes stay in cache.
         */
        uint64_t pstep[2];
        bool packed[2] = { false, false };

        for (i = 0; i < job->nin; i++) {
            pstep[i] = step[i];
            if (nrows > 1 && step[i] > 1) {
                npu_tensor_pack(&job->in[i], roff, i, nrows, c0, ncols,
                                step[i], stage[i]);
                packed[i] = true;
                pstep[i] = 1;
            }
        }
        for (r = 0; r < nrows; r++) {
            for (i = 0; i < job->nin; i++) {
                src[i] = packed[i] ?
                         stage[i] + r * (ncols + NPU_PACK_PAD) *
                         job->in[i].size :
                         base[i] + (roff[r][i] + c0 * step[i]) *
                         job->in[i].size;
            }
            npu_tensor_run(job, src, pstep, obuf + r * ncols * job->osize,
                           ncols, blk);
        }
    }
    return npu_mem_write(core->s, w, job->out_va +
                         (row0 * len + c0) * job->osize, obuf,
                         nrows * ncols * job->osize);
}

/* Units [begin, end) of the output. */
static uint32_t npu_tensor_tile(NpuCore *core, void *opaque, uint64_t begin,
                                uint64_t end)
{
    const NpuTensorJob *job = opaque;
    NpuWalk w = job->walk;
    NpuTensorBlk blk[3];
    uint32_t st = NPU_ST_OK;
    uint64_t u;

    for (u = begin; u < end && st == NPU_ST_OK; u++) {
        st = npu_engine_work(core, job->band * job->seg_len * job->weight);
        if (st == NPU_ST_OK) {
            st = npu_tensor_unit(core, job, &w, u, blk);
        }
    }
    return st;
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
    [NPU_OP_REQUANT] = { "requant acc", "requant scale", "requant out" },
    [NPU_OP_SELECT] = { "select cond", "select x", "select y", "select out" },
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

/*
 * May the units read their own inputs? Every input must walk its rows with
 * stride 1 or 0 (else it is gathered and read in cache-friendly bands),
 * and lie outside the output or be exactly the output (an in-place op: a
 * unit reads its piece before writing it). Any other overlap would let a
 * unit read what another has already written. Overlap is judged by VA.
 */
static bool npu_tensor_streamable(const NpuTensorJob *job,
                                  const struct npu_tensor_params *p,
                                  uint64_t numel)
{
    uint64_t oend = job->out_va + numel * job->osize;
    uint32_t i, d;

    for (i = 0; i < job->nin; i++) {
        const NpuTensorIn *in = &job->in[i];
        uint64_t end = in->va + npu_tensor_extent(&p->t[i]);
        uint64_t want = 1;

        if (in->stride[job->ndim - 1] > 1) {
            return false;
        }
        if (end <= job->out_va || in->va >= oend) {
            continue;
        }
        if (in->va != job->out_va || in->size != job->osize) {
            return false;
        }
        for (d = job->ndim; d-- > 0;) {
            if (in->stride[d] != want) {
                return false;
            }
            want *= job->shape[d];
        }
    }
    return true;
}

/* Is the op memory-bound: streamed, fp32/int, no transcendental? */
static bool npu_tensor_cheap(const NpuTensorJob *job)
{
    uint32_t i;

    if (!job->stream || job->odtype == NPU_DTYPE_FP16 ||
        job->odtype == NPU_DTYPE_BF16 ||
        (job->opcode == NPU_OP_UNARY &&
         ((job->kind >= NPU_UNARY_GELU && job->kind <= NPU_UNARY_LOG) ||
          job->kind == NPU_UNARY_ERF))) {
        return false;
    }
    for (i = 0; i < job->nin; i++) {
        if (job->in[i].dtype == NPU_DTYPE_FP16 ||
            job->in[i].dtype == NPU_DTYPE_BF16) {
            return false;
        }
    }
    return true;
}

typedef struct NpuGatherJob {
    NpuWalk walk;
    uint64_t va;
    uint8_t *buf;
} NpuGatherJob;

static uint32_t npu_gather_tile(NpuCore *core, void *opaque, uint64_t begin,
                                uint64_t end)
{
    const NpuGatherJob *job = opaque;
    NpuWalk w = job->walk;

    return npu_mem_read(core->s, &w, job->va + begin, job->buf + begin,
                        end - begin);
}

/*
 * Read the @nin inputs whole into @bufs, in operand order: each is probed
 * first, so a fault is reported at the VA a plain read would hit, then
 * read by the cores in parallel when large.
 */
static uint32_t npu_tensor_gather(NpuState *s, NpuWalk *w,
                                  const struct npu_tensor_params *p,
                                  uint32_t nin, uint8_t *const *bufs)
{
    uint32_t st = NPU_ST_OK, i;

    for (i = 0; i < nin && st == NPU_ST_OK; i++) {
        uint64_t len = npu_tensor_extent(&p->t[i]);
        NpuGatherJob job = { .walk = *w, .va = p->t[i].va, .buf = bufs[i] };

        if (len < NPU_GATHER_SPLIT || s->cores.n < 2) {
            st = npu_mem_read(s, w, p->t[i].va, bufs[i], len);
            continue;
        }
        st = npu_mem_probe(s, w, p->t[i].va, len, false);
        if (st == NPU_ST_OK) {
            job.walk = *w;
            st = npu_run_tiles(s, npu_gather_tile, &job, len,
                               DIV_ROUND_UP(len, s->cores.n * 2));
        }
    }
    return st;
}

/*
 * Free the gather scratch a stopped command left above NPU_SCRATCH_KEEP
 * (the command processor, between commands, no lock held).
 */
void npu_scratch_trim(NpuState *s)
{
    uint32_t i;

    for (i = 0; i < NPU_LEVELS; i++) {
        if (s->level[i].core.gather_size > NPU_SCRATCH_KEEP) {
            npu_scratch_free(s, &s->level[i].core);
        }
    }
}

void npu_scratch_free(NpuState *s, NpuCore *core)
{
    if (core->gather_buf) {
        qemu_vfree(core->gather_buf);
        qatomic_sub(&s->mem_used, core->gather_size);
    }
    core->gather_buf = NULL;
    core->gather_size = 0;
}

/*
 * @n buffers of @sizes bytes, 64-byte aligned, in the gather scratch of
 * the running command's core (grown when needed, charged to the memory
 * budget); false if the budget or host memory runs out.
 */
static bool npu_scratch_get(NpuState *s, uint32_t n, const uint64_t *sizes,
                            uint8_t **bufs)
{
    NpuCore *core = npu_cmd_core(s);
    uint64_t total = 0, pos = 0, used;
    uint32_t i;

    for (i = 0; i < n; i++) {
        total += ROUND_UP(sizes[i], 64);
    }
    if (total > core->gather_size) {
        npu_scratch_free(s, core);
        used = qatomic_add_fetch(&s->mem_used, total);
        if (used > s->mem_budget) {
            qatomic_sub(&s->mem_used, total);
            trace_npu_budget(total, used - total, s->mem_budget);
            npu_guest_error("npu: %" PRIu64 " bytes of"
                            " operands exceed the device's host memory"
                            " budget\n", total);
            return false;
        }
        /* Huge pages: a transpose touches a new 4 KiB page per element. */
        core->gather_buf = qemu_try_memalign(2 * MiB, total);
        if (!core->gather_buf) {
            qatomic_sub(&s->mem_used, total);
            return false;
        }
        qemu_madvise(core->gather_buf, total, QEMU_MADV_HUGEPAGE);
        core->gather_size = total;
    }
    for (i = 0; i < n; i++) {
        bufs[i] = core->gather_buf + pos;
        pos += ROUND_UP(sizes[i], 64);
    }
    return true;
}

uint32_t npu_exec_tensor(NpuState *s, NpuWalk *w, const struct npu_cmd *cmd)
{
    uint32_t opcode = cmd->opcode;
    uint32_t kind = le32_to_cpu(cmd->tensor.kind);
    uint64_t pva = le64_to_cpu(cmd->tensor.params);
    struct npu_tensor_params p;
    NpuTensorJob job = { .opcode = opcode, .kind = kind };
    const struct npu_hw_tensor *out;
    uint8_t *bufs[NPU_TENSOR_OPERANDS] = { NULL, NULL, NULL, NULL };
    uint64_t sizes[NPU_TENSOR_OPERANDS];
    uint64_t numel, len, units, piece;
    uint32_t st, i, nbuf;
    bool place;

    if (cmd->tensor.rsvd) {
        npu_guest_error("npu: tensor op reserved field set\n");
        return NPU_ST_BAD_RESERVED;
    }
    if (pva % 64) {
        npu_guest_error("npu: tensor params at 0x%" PRIx64
                        " not 64-byte aligned\n", pva);
        return NPU_ST_BAD_ARGS;
    }
    st = npu_check_range("tensor params", pva, sizeof(p));
    if (st == NPU_ST_OK) {
        st = npu_mem_read_params(s, w, pva, &p, sizeof(p));
    }
    if (st != NPU_ST_OK) {
        return st;
    }
    npu_tensor_params_to_cpu(&p);
    st = npu_tensor_op_check(opcode, kind, &p);
    if (st != NPU_ST_OK) {
        npu_guest_error("npu: tensor op %u kind %u: invalid"
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
        sizes[i] = npu_tensor_extent(&p.t[i]);
    }

    numel = npu_tensor_numel(out);
    job.odtype = out->dtype;
    job.osize = npu_dtype_size(out->dtype);
    job.out_va = out->va;
    nbuf = job.nin + 1;         /* the inputs and a host output */
    /* SELECT and a strided CONVERT output: npu_place.c, gathered. */
    place = opcode == NPU_OP_SELECT ||
            (opcode == NPU_OP_CONVERT && !npu_tensor_is_contiguous(out));
    if (opcode <= NPU_OP_CONVERT && !place) {
        for (i = 0; i < job.nin; i++) {
            job.in[i].va = p.t[i].va;
            job.in[i].end = p.t[i].va + sizes[i];
            job.in[i].dtype = p.t[i].dtype;
            job.in[i].size = npu_dtype_size(p.t[i].dtype);
        }
        npu_tensor_collapse(&job, &p);
        job.stream = npu_tensor_streamable(&job, &p, numel);
        job.direct = job.stream && !(job.out_va % job.osize);
        for (i = 0; i < job.nin; i++) {
            job.direct = job.direct && !(job.in[i].va % job.in[i].size);
        }
        nbuf = job.stream ? 0 : job.nin;    /* units compute in the chunks */
    } else {
        sizes[job.nin] = numel * job.osize;
    }
    if (nbuf && !npu_scratch_get(s, nbuf, sizes, bufs)) {
        npu_guest_error("npu: tensor op of %" PRIu64
                        " elements: out of device memory\n", numel);
        return NPU_ST_NO_MEMORY;
    }
    /*
     * Gathered: all inputs are read before any output is written, so they
     * may overlap it. Streamed: probed, so that translation errors come
     * before any write too.
     */
    if (job.stream) {
        for (i = 0; i < job.nin && st == NPU_ST_OK; i++) {
            st = npu_mem_probe(s, w, p.t[i].va, sizes[i], false);
        }
    } else {
        st = npu_tensor_gather(s, w, &p, job.nin, bufs);
    }
    if (st != NPU_ST_OK) {
        goto out;
    }
    if (opcode == NPU_OP_MATMUL || opcode == NPU_OP_LINEAR) {
        st = npu_exec_matmul(s, w, &p, opcode, kind, bufs, bufs[job.nin]);
        goto out;
    }
    if (opcode == NPU_OP_CONV2D) {
        if (p.params[NPU_CONV_P_FLAGS] & NPU_CONV_F_ACCUMULATE) {
            /* The addends: out is contiguous, read like an input. */
            st = npu_mem_read(s, w, out->va, bufs[job.nin], sizes[job.nin]);
            if (st != NPU_ST_OK) {
                goto out;
            }
        }
        st = npu_exec_conv(s, w, &p, kind, bufs, bufs[job.nin]);
        goto out;
    }
    if (opcode == NPU_OP_POOL2D) {
        st = npu_exec_pool(s, w, &p, kind, bufs, bufs[job.nin]);
        goto out;
    }
    if (opcode == NPU_OP_REQUANT) {
        st = npu_exec_requant(s, w, &p, kind, bufs, bufs[job.nin]);
        goto out;
    }
    if (place) {
        st = npu_exec_place(s, w, &p, opcode, bufs, bufs[job.nin]);
        goto out;
    }
    if (opcode >= NPU_OP_REDUCE) {
        st = npu_exec_red(s, w, &p, opcode, kind, bufs, bufs[job.nin]);
        goto out;
    }

    for (i = 0; i < job.nin; i++) {
        job.in[i].data = bufs[i];
    }
    len = job.shape[job.ndim - 1];
    job.rows = numel / len;
    piece = job.stream ? NPU_TENSOR_PIECE : NPU_TENSOR_GPIECE;
    if (len >= piece) {
        job.band = 1;
        job.seg_len = piece;
    } else {
        job.band = MIN(MIN(piece / len, (uint64_t)NPU_TENSOR_BAND), job.rows);
        job.seg_len = len;
    }
    job.nseg = DIV_ROUND_UP(len, job.seg_len);
    job.weight = opcode == NPU_OP_UNARY ? NPU_TENSOR_WORK_UNARY :
                 NPU_TENSOR_WORK;
    units = DIV_ROUND_UP(job.rows, job.band) * job.nseg;
    job.walk = *w;
    /* Large ops: about four tiles per core for load balance. */
    st = npu_run_tiles(s, npu_tensor_tile, &job, units,
                       numel < (npu_tensor_cheap(&job) ?
                                NPU_TENSOR_SPLIT_MIN_CHEAP :
                                NPU_TENSOR_SPLIT_MIN) ? units :
                       DIV_ROUND_UP(units, s->cores.n * 4));
out:
    /* A stopped command answers first: npu_scratch_trim() frees it then */
    if (npu_cmd_core(s)->gather_size > NPU_SCRATCH_KEEP &&
        !npu_engine_stopping(s)) {
        npu_scratch_free(s, npu_cmd_core(s));
    }
    return st;
}
