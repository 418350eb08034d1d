/*
 * NPU tensor ops: ELTWISE, UNARY, CONVERT, REDUCE, SOFTMAX, LAYERNORM,
 * MATMUL, LINEAR, CONV2D, POOL2D and REQUANT.
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
 * cblas_sgemm, each exact in fp32); REQUANT rounds int32 * fp32 exactly.
 *
 * This file holds the common part (parameter block, validation, gather of
 * the inputs, dispatch) and ELTWISE, UNARY and CONVERT. The other ops are
 * computed in npu_reduce.c (REDUCE, SOFTMAX, LAYERNORM: per slice in
 * double) and npu_nn.c (MATMUL, LINEAR, CONV2D, POOL2D: cblas_sgemm with
 * fp32 accumulation, and direct loops); the conversions of runs of
 * elements are in npu_dtype.c.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/log.h"
#include "qemu/bswap.h"
#include <math.h>
#include "npu_tensor_int.h"

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
    if (opcode == NPU_OP_REQUANT) {
        st = npu_exec_requant(s, w, &p, kind, bufs, job.out);
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
