/*
 * NPU tensor ops: REDUCE, SOFTMAX and LAYERNORM.
 *
 * They share the validation, the gather of the inputs and the element
 * conversions with the other tensor ops (npu_tensor.c), but compute per
 * slice in double (tiles of slices) and write the whole output once at
 * the end.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/bswap.h"
#include <math.h>
#include "npu_tensor_int.h"

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

static inline int32_t npu_ld_i(const uint8_t *p, uint32_t dtype, uint64_t i)
{
    if (dtype == NPU_DTYPE_INT8) {
        return (int8_t)p[i];
    }
    return (int32_t)ldl_le_p(p + i * 4);
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

/* Elements of a slice between two accountings of its work. */
#define NPU_RED_STEP 4096

/* Units of work of an element with exp() or a division, against a load. */
#define NPU_RED_EXP 8

/*
 * After element @n of a slice: every NPU_RED_STEP elements their work
 * (@weight loads each, a load being 4 units: its bytes) is accounted, a
 * control point once a quantum is done (one slice can be 2^28 elements:
 * far more than one quantum).
 */
static inline uint32_t npu_red_step(NpuCore *core, uint64_t n,
                                    uint32_t weight)
{
    return (n + 1) % NPU_RED_STEP ? NPU_ST_OK :
           npu_engine_work(core, (uint64_t)NPU_RED_STEP * weight * 4);
}

/* REDUCE of one slice into output element base[1]. */
static uint32_t npu_reduce_slice(NpuCore *core, const NpuRedJob *job,
                                 const uint64_t *base)
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
    uint64_t n = 0;
    uint32_t status;

    for (row = 0; row < rows; row++) {
        npu_red_row(r, row, base, off);
        for (k = 0; k < len; k++, n++) {
            uint64_t i = off[0] + k * st;

            status = npu_red_step(core, n, 1);
            if (status != NPU_ST_OK) {
                return status;
            }

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
    return NPU_ST_OK;
}

/* (LOG)SOFTMAX of one line: max, sum of exponentials, then the output. */
static uint32_t npu_softmax_slice(NpuCore *core, const NpuRedJob *job,
                                  const uint64_t *base)
{
    uint64_t len = job->count, k, n = 0;
    uint64_t si = job->red.stride[0][0], so = job->red.stride[1][0];
    const uint8_t *in = job->src[0];
    float m = npu_ld_f(in, job->dtype, base[0]);
    double sum = 0.0, lse;
    uint32_t status;

    for (k = 1; k < len; k++, n++) {
        status = npu_red_step(core, n, 1);
        if (status != NPU_ST_OK) {
            return status;
        }
        m = npu_maxf(m, npu_ld_f(in, job->dtype, base[0] + k * si));
    }
    for (k = 0; k < len; k++, n++) {
        status = npu_red_step(core, n, NPU_RED_EXP);
        if (status != NPU_ST_OK) {
            return status;
        }
        sum += exp((double)npu_ld_f(in, job->dtype, base[0] + k * si) - m);
    }
    lse = log(sum);
    for (k = 0; k < len; k++, n++) {
        double x = (double)npu_ld_f(in, job->dtype, base[0] + k * si) - m;

        status = npu_red_step(core, n, NPU_RED_EXP);
        if (status != NPU_ST_OK) {
            return status;
        }
        npu_store_d(job->out, job->dtype, base[1] + k * so,
                    job->kind == NPU_SOFTMAX_LOG ? x - lse : exp(x) / sum);
    }
    return NPU_ST_OK;
}

/* LAYERNORM of one row: mean, biased variance, then the output. */
static uint32_t npu_layernorm_slice(NpuCore *core, const NpuRedJob *job,
                                    const uint64_t *base)
{
    const NpuDims *r = &job->red;
    uint32_t dt = job->dtype, last = r->nd - 1, pass, status;
    uint64_t len = r->shape[last], rows = job->count / len, row, k, n = 0;
    uint64_t off[NPU_RED_T];
    double mean = 0.0, var = 0.0, rstd = 0.0;

    for (pass = 0; pass < 3; pass++) {
        for (row = 0; row < rows; row++) {
            npu_red_row(r, row, base, off);
            for (k = 0; k < len; k++, n++) {
                double x = npu_ld_f(job->src[0], dt,
                                    off[0] + k * r->stride[0][last]);

                status = npu_red_step(core, n, pass == 2 ? 4 : 1);
                if (status != NPU_ST_OK) {
                    return status;
                }

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
    return NPU_ST_OK;
}

/* Slices [begin, end) into the host output buffer. */
static uint32_t npu_red_tile(NpuCore *core, void *opaque, uint64_t begin,
                             uint64_t end)
{
    const NpuRedJob *job = opaque;
    const NpuDims *kd = &job->keep;
    uint64_t u, base[NPU_RED_T];
    uint32_t t, d, st;

    for (u = begin; u < end; u++) {
        uint64_t rest = u;

        /* The slice's elements are accounted inside it (npu_red_step). */
        st = npu_engine_work(core, 1);
        if (st != NPU_ST_OK) {
            return st;
        }

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
            st = npu_reduce_slice(core, job, base);
            break;
        case NPU_OP_SOFTMAX:
            st = npu_softmax_slice(core, job, base);
            break;
        default: /* NPU_OP_LAYERNORM */
            st = npu_layernorm_slice(core, job, base);
            break;
        }
        if (st != NPU_ST_OK) {
            return st;
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
uint32_t npu_exec_red(NpuState *s, NpuWalk *w,
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
