/*
 * NPU tensor ops that place elements rather than compute them: SELECT
 * (out = cond ? x : y) and CONVERT into a strided output view.
 *
 * Both take their inputs gathered whole (npu_tensor.c) and work in tiles
 * of output rows (the innermost dimension). SELECT copies the chosen
 * element's bytes, so every dtype and every bit pattern (NaN payloads,
 * signed zeros) passes unchanged. A strided CONVERT converts a row as the
 * streamed CONVERT does (npu_load_*, npu_store_*) and writes only the
 * row's elements: a run per row when the innermost stride is 1, else
 * element by element into the row's mapped span (or one DMA write each
 * where it is not RAM); the bytes between elements are never touched.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/bswap.h"
#include "npu_tensor_int.h"

/* Elements converted per block on the stack. */
#define NPU_PLACE_BLK 256

typedef struct NpuPlaceJob {
    NpuWalk walk;
    uint32_t opcode, nin, ndim;
    uint64_t shape[NPU_MAX_RANK];
    uint64_t stride[3][NPU_MAX_RANK];   /* inputs, elements; 0 broadcasts */
    uint64_t ostride[NPU_MAX_RANK];     /* output, elements */
    const uint8_t *src[3];              /* gathered inputs */
    uint32_t idtype, isize, odtype, osize;
    uint8_t *out;                       /* host rows, contiguous */
    uint64_t out_va;
    bool contiguous;                    /* out is row-major and dense */
} NpuPlaceJob;

/* A row of SELECT into @dst: cond, x, y start at elements @off. */
static void npu_select_row(const NpuPlaceJob *job, const uint64_t *off,
                           uint8_t *dst, uint64_t len)
{
    uint32_t last = job->ndim - 1, sz = job->osize;
    const uint64_t *cs = job->stride[0], *xs = job->stride[1];
    const uint64_t *ys = job->stride[2];
    uint64_t j;

    for (j = 0; j < len; j++) {
        bool c = job->src[0][off[0] + j * cs[last]] != 0;
        const uint8_t *e = c ? job->src[1] + (off[1] + j * xs[last]) * sz :
                               job->src[2] + (off[2] + j * ys[last]) * sz;

        memcpy(dst + j * sz, e, sz);
    }
}

/* Row of CONVERT into @dst: the input starts at element @off. */
static void npu_convert_row(const NpuPlaceJob *job, uint64_t off,
                            uint8_t *dst, uint64_t len)
{
    uint64_t step = job->stride[0][job->ndim - 1];
    const uint8_t *src = job->src[0] + off * job->isize;
    union {
        float f[NPU_PLACE_BLK];
        int32_t i[NPU_PLACE_BLK];
    } tmp;

    while (len) {
        size_t m = MIN(len, (uint64_t)NPU_PLACE_BLK);

        if (npu_dtype_is_float(job->idtype)) {
            npu_store_f32(dst, job->odtype,
                          npu_load_f32(src, step, job->idtype, tmp.f, m), m);
        } else {
            npu_store_i32(dst, job->odtype,
                          npu_load_i32(src, step, job->idtype, tmp.i, m), m);
        }
        src += m * step * job->isize;
        dst += m * job->osize;
        len -= m;
    }
}

/*
 * Write @row to its place, element @ooff on, in a strided output: one
 * write for a dense row; else the row's span mapped once when it is RAM
 * in one run, the elements stored into it; else one write per element.
 */
static uint32_t npu_place_row(NpuState *s, NpuWalk *w, const NpuPlaceJob *job,
                              uint64_t ooff, const uint8_t *row, uint64_t len)
{
    uint64_t step = job->ostride[job->ndim - 1], j, span, plen;
    uint64_t va = job->out_va + ooff * job->osize;
    uint32_t sz = job->osize, st = NPU_ST_OK;
    uint8_t *p;

    if (step == 1 || len == 1) {
        return npu_mem_write(s, w, va, row, len * sz);
    }
    span = ((len - 1) * step + 1) * sz;
    p = npu_mem_map(s, w, va, span, true, &plen, &st);
    if (p && plen >= span) {
        for (j = 0; j < len; j++) {
            memcpy(p + j * step * sz, row + j * sz, sz);
        }
        npu_mem_unmap(s, p, plen, true, span);
        return NPU_ST_OK;
    }
    if (p) {
        npu_mem_unmap(s, p, plen, true, 0);
    }
    for (j = 0; j < len && st == NPU_ST_OK; j++) {
        st = npu_mem_write(s, w, va + j * step * sz, row + j * sz, sz);
    }
    return st;
}

/*
 * Elements of a row placed between two control points: a run of a dense
 * output (about a millisecond), or far fewer stored one by one (each a
 * walk and a mapping of its own).
 */
#define NPU_PLACE_SEG (1ull << 16)
#define NPU_PLACE_SEG_STRIDED (1ull << 12)

static uint32_t npu_place_tile(NpuCore *core, void *opaque, uint64_t begin,
                               uint64_t end)
{
    const NpuPlaceJob *job = opaque;
    NpuWalk w = job->walk;
    uint32_t last = job->ndim - 1, st = NPU_ST_OK, i, d;
    uint64_t len = job->shape[last], u, j0;
    uint64_t seg = job->contiguous ? NPU_PLACE_SEG : NPU_PLACE_SEG_STRIDED;

    for (u = begin; u < end && st == NPU_ST_OK; u++) {
        uint64_t off[3] = { 0, 0, 0 }, ooff = 0, rest = u;
        uint8_t *dst = job->out + u * len * job->osize;

        for (d = last; d-- > 0;) {
            uint64_t k = rest % job->shape[d];

            rest /= job->shape[d];
            for (i = 0; i < job->nin; i++) {
                off[i] += k * job->stride[i][d];
            }
            ooff += k * job->ostride[d];
        }
        /* A row may be the whole operand (2^28 elements): in segments. */
        for (j0 = 0; j0 < len && st == NPU_ST_OK; j0 += seg) {
            uint64_t m = MIN(seg, len - j0), so[3];
            uint8_t *sd = dst + j0 * job->osize;

            /* An element is a gather of up to three: 16 units */
            st = job->contiguous ? npu_engine_work(core, m * 16) :
                                   npu_engine_poll(core->s);
            if (st != NPU_ST_OK) {
                break;
            }
            for (i = 0; i < job->nin; i++) {
                so[i] = off[i] + j0 * job->stride[i][last];
            }
            if (job->opcode == NPU_OP_SELECT) {
                npu_select_row(job, so, sd, m);
            } else {
                npu_convert_row(job, so[0], sd, m);
            }
            if (!job->contiguous) {
                st = npu_place_row(core->s, &w, job,
                                   ooff + j0 * job->ostride[last], sd, m);
            }
        }
    }
    if (st != NPU_ST_OK || !job->contiguous) {
        return st;
    }
    return npu_mem_write(core->s, &w, job->out_va + begin * len * job->osize,
                         job->out + begin * len * job->osize,
                         (end - begin) * len * job->osize);
}

uint32_t npu_exec_place(NpuState *s, NpuWalk *w,
                        const struct npu_tensor_params *p, uint32_t opcode,
                        uint8_t *const *bufs, uint8_t *out)
{
    uint32_t nin = npu_tensor_op_operands(opcode) - 1, i, d;
    const struct npu_hw_tensor *o = &p->t[nin];
    NpuPlaceJob job = {
        .walk = *w, .opcode = opcode, .nin = nin, .ndim = o->ndim,
        .idtype = p->t[nin - 1].dtype,
        .isize = npu_dtype_size(p->t[nin - 1].dtype),
        .odtype = o->dtype, .osize = npu_dtype_size(o->dtype),
        .out = out, .out_va = o->va,
        .contiguous = npu_tensor_is_contiguous(o),
    };
    uint64_t numel = npu_tensor_numel(o), units, grain;
    uint32_t st;

    for (i = 0; i < nin; i++) {
        job.src[i] = bufs[i];
    }
    for (d = 0; d < o->ndim; d++) {
        job.shape[d] = o->shape[d];
        job.ostride[d] = o->strides[d];
        for (i = 0; i < nin; i++) {
            job.stride[i][d] = p->t[i].shape[d] > 1 ? p->t[i].strides[d] : 0;
        }
    }
    if (!job.contiguous) {
        /* Translation faults before any element is written. */
        st = npu_mem_probe(s, w, o->va, npu_tensor_extent(o), true);
        if (st != NPU_ST_OK) {
            return st;
        }
    }
    units = numel / job.shape[o->ndim - 1];
    grain = numel < NPU_TENSOR_TILE_MIN ? units :
            DIV_ROUND_UP(units, MAX(s->cores.n, 1) * 2);
    return npu_run_tiles(s, npu_place_tile, &job, units, grain);
}
