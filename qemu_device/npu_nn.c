/*
 * NPU tensor ops: MATMUL and LINEAR (an sgemm per (batch, block of rows)
 * tile), CONV2D (im2col + sgemm) and POOL2D (direct loops), with the bias
 * and activation epilogue of MATMUL/LINEAR/CONV2D, their int8 forms (exact
 * int32 accumulation over K blocks of sgemm), and
 * REQUANT (int32 -> int8, exact rounding). Each tile writes its output
 * back as it finishes.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/atomic.h"
#include "qemu/units.h"
#include "qemu/log.h"
#include "hw/misc/trace.h"
#include "npu_tensor_int.h"

/* ---------------------------------------------------------------------- */
/* The fused activations of MATMUL, LINEAR and CONV2D */

/*
 * Activation @kind (not NONE) of @n fp32 values, in place. RELU6 is
 * x < 0 ? 0 : (x > 6 ? 6 : x): NaN stays NaN, as with RELU.
 */
static void npu_act_f32(uint32_t kind, float *x, uint64_t n)
{
    uint64_t i;

    if (kind == NPU_ACT_RELU6) {
        for (i = 0; i < n; i++) {
            x[i] = x[i] < 0.0f ? 0.0f : (x[i] > 6.0f ? 6.0f : x[i]);
        }
        return;
    }
    npu_unary_f32(kind == NPU_ACT_RELU ? NPU_UNARY_RELU : NPU_UNARY_GELU, x,
                  x, n);
}

/* ---------------------------------------------------------------------- */
/* MATMUL and LINEAR */

/*
 * out[b] = act(a[b] @ b[b] (+ bias)) for every batch index b of out's
 * leading r - 2 dims. The units of the tiles are (batch, block of rows of
 * M) in output order, so a tile's output is one contiguous run. Per unit,
 * op(a) and b are handed to sgemm as they are when they already are
 * fp32 matrices BLAS can address (unit stride on one side, a leading
 * dimension on the other: row-major, or a plain transpose), otherwise
 * packed into contiguous fp32 (widened from fp16/bf16). BLAS accumulates
 * in fp32 into an fp32 [rows, N] block (the output buffer itself for an
 * fp32 output on a little-endian host); bias and activation are applied
 * in fp32, and the block is rounded once to the output dtype.
 *
 * Integer (int8) ops pack a - in_zp and b as fp32 (exact: |a - in_zp| <=
 * 255, |b| <= 128) and run sgemm over blocks of at most kb terms
 * of K, kb * 128 * (128 + |in_zp|) <= 2^24: every partial sum is an
 * integer of at most 2^24 in magnitude, exact in fp32 in any summation
 * order. Each block's fp32 result is added into an int32 [rows, N]
 * accumulator (two's complement), then the int32 bias and the RELU, and
 * the store keeps the output dtype's low bits.
 *
 * On oneDNN (the dnnl property, where oneDNN takes the shape), int8 and
 * bf16 units instead run one oneDNN matmul on the operands' own strided
 * layouts: int8 as a @ b into int32 (VNNI: exact, wrapping like the blocks
 * above), less in_zp times b's column sums, subtracted here with the same
 * wrap-around; bf16 into fp32 (exact products, fp32 sums). The epilogue
 * is the same.
 */

/* Ops of fewer multiply-adds run as one tile on the command processor. */
#define NPU_MM_TILE_MIN_FLOP (1ull << 22)
/* Bound of a row block's A and C scratch, in fp32 elements (8 MiB). */
#define NPU_MM_BLOCK_ELEMS ((8 * MiB) / sizeof(float))

/* Multiply-adds of one BLAS call of MATMUL: a few milliseconds. */
#define NPU_MM_CALL_WORK (1ull << 27)
/*
 * Most multiply-adds of one oneDNN unit, which has no control point
 * inside: about 5 ms on one host core (docs/npu-spec.md 13).
 */
#define NPU_DNNL_UNIT_WORK (1ull << 28)
/* fp32 holds every integer up to this magnitude exactly. */
#define NPU_F32_EXACT_INT (1u << 24)
/* Elements a packing loop moves between two accountings of its work. */
#define NPU_PACK_STEP (1ull << 16)

/*
 * A host buffer of an op, charged to the device's memory budget
 * (npu_budget_alloc): allocated on first use, kept for the op's tiles.
 */
typedef struct NpuNnBuf {
    void *p;
    uint64_t bytes;
} NpuNnBuf;

/*
 * @buf's memory, @count elements of @size bytes, allocated on first use;
 * NULL when the size overflows, or the budget or the host runs out.
 */
static void *npu_nn_get(NpuState *s, NpuNnBuf *buf, uint64_t count,
                        uint64_t size)
{
    if (!buf->p && count <= UINT64_MAX / size) {
        buf->p = npu_budget_alloc(s, MAX(count * size, 1), false);
        buf->bytes = buf->p ? MAX(count * size, 1) : 0;
    }
    return buf->p;
}

static void npu_nn_put(NpuState *s, NpuNnBuf *buf)
{
    npu_budget_free(s, buf->p, buf->bytes);
    buf->p = NULL;
    buf->bytes = 0;
}

/*
 * dst[i] = the element at src + i * @stride of @dtype, widened to fp32,
 * less @zp, for @n elements: in steps of NPU_PACK_STEP, each accounted as
 * work of @core (four units an element: bytes moved).
 */
static uint32_t npu_pack_f32(NpuCore *core, float *dst, const uint8_t *src,
                             uint64_t stride, uint32_t dtype, uint64_t n,
                             int32_t zp)
{
    uint64_t size = npu_dtype_size(dtype), i, j, c;
    uint32_t st;

    for (i = 0; i < n; i += c) {
        const float *v;

        c = MIN(NPU_PACK_STEP, n - i);
        v = npu_load_f32(src + i * stride * size, stride, dtype, dst + i, c);
        if (v != dst + i) {
            memcpy(dst + i, v, c * sizeof(float));
        }
        for (j = 0; zp && j < c; j++) {
            dst[i + j] -= (float)zp;        /* int8 a - in_zp: exact */
        }
        st = npu_engine_work(core, c * 4);
        if (st != NPU_ST_OK) {
            return st;
        }
    }
    return NPU_ST_OK;
}

/* The same for int32 values (integer biases), not widened. */
static uint32_t npu_pack_i32(NpuCore *core, int32_t *dst, const uint8_t *src,
                             uint64_t stride, uint32_t dtype, uint64_t n)
{
    uint64_t size = npu_dtype_size(dtype), i, c;
    uint32_t st;

    for (i = 0; i < n; i += c) {
        const int32_t *v;

        c = MIN(NPU_PACK_STEP, n - i);
        v = npu_load_i32(src + i * stride * size, stride, dtype, dst + i, c);
        if (v != dst + i) {
            memcpy(dst + i, v, c * sizeof(int32_t));
        }
        st = npu_engine_work(core, c * 4);
        if (st != NPU_ST_OK) {
            return st;
        }
    }
    return NPU_ST_OK;
}

/* Most elements of op(a) or op(b) one BLAS call packs: 16 MiB of fp32. */
#define NPU_MM_CALL_PACK (1ull << 22)

/*
 * c [m, n] (ldc) = op(a) @ op(b) as BLAS calls of at most NPU_MM_CALL_WORK
 * multiply-adds (about 3 ms on one host core: the one step without a
 * control point inside), each accounted as work of @core. A call also
 * packs its blocks of a and b, which costs time of its own: each block is
 * at most NPU_MM_CALL_PACK elements. Blocks of K (summed into c, as
 * BLAS's own K blocking does) only for a K longer than that; then rows
 * and columns, the longer of the two shortened first, columns in
 * multiples of 64 where they split.
 */
static uint32_t npu_sgemm_polled(NpuCore *core, bool ta, bool tb, uint64_t m,
                                 uint64_t n, uint64_t k, const float *a,
                                 uint64_t lda, const float *b, uint64_t ldb,
                                 float *c, uint64_t ldc)
{
    uint64_t kc = MIN(MAX(k, 1), NPU_MM_CALL_PACK);
    uint64_t mr = MIN(m, MAX(NPU_MM_CALL_PACK / kc, 1));
    uint64_t nc = MIN(n, MAX(NPU_MM_CALL_PACK / kc, 1));
    uint64_t i, j, p;
    uint32_t st;

    if (mr * nc * kc > NPU_MM_CALL_WORK && mr >= nc) {
        mr = MAX(NPU_MM_CALL_WORK / (nc * kc), 1);
    }
    if (mr * nc * kc > NPU_MM_CALL_WORK) {
        nc = MAX(NPU_MM_CALL_WORK / (mr * kc), 1);
    }
    if (mr * nc * kc > NPU_MM_CALL_WORK) {
        mr = MAX(NPU_MM_CALL_WORK / (nc * kc), 1);
    }
    if (nc < n && nc >= 64) {
        nc = ROUND_DOWN(nc, 64);    /* aligned panels, as GEMM's */
    }
    for (i = 0; i < m; i += mr) {
        uint64_t rows = MIN(mr, m - i);

        for (j = 0; j < n; j += nc) {
            uint64_t cols = MIN(nc, n - j);

            for (p = 0; p < MAX(k, 1); p += kc) {
                uint64_t kn = MIN(kc, k - p);
                const float *ap = a + (ta ? p * lda + i : i * lda + p);
                const float *bp = b + (tb ? j * ldb + p : p * ldb + j);

                if (p) {
                    npu_sgemm_acc(ta, tb, rows, cols, kn, ap, lda, bp, ldb,
                                  c + i * ldc + j, ldc);
                } else {
                    npu_sgemm(ta, tb, rows, cols, kn, ap, lda, bp, ldb,
                              c + i * ldc + j, ldc);
                }
                st = npu_engine_work(core, MAX(rows * cols * kn, 1));
                if (st != NPU_ST_OK) {
                    return st;
                }
            }
        }
    }
    return NPU_ST_OK;
}

/* Terms of K per exact fp32 block of int8 products, input zero point @zp. */
static uint64_t npu_int8_kblock(int32_t zp)
{
    return NPU_F32_EXACT_INT / (128u * (128u + (uint32_t)(zp < 0 ? -zp : zp)));
}

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
    const int32_t *ibias;   /* N values (integer LINEAR), else NULL */
    bool quant;             /* int8 operands, int32 accumulation */
    int32_t zp;             /* input zero point (integer ops) */
    uint64_t kb;            /* K terms per exact fp32 block (integer ops) */
    const float *bpacked;   /* b packed once for every tile, or NULL */
    int bld;                /* its leading dimension */
    bool btrans;            /* and whether it is transposed */
    uint32_t kind;          /* enum npu_act_kind */
    uint32_t nb;            /* batch dims */
    uint64_t bshape[NPU_MAX_RANK - 2];
    uint64_t m, n, k;
    uint64_t mb, nblk;      /* rows per unit, units per batch index */
    uint8_t *out;           /* host output buffer, contiguous */
    uint64_t out_va;
    uint32_t odtype, osize;
    bool direct_out;        /* BLAS writes fp32 results into @out */
    bool acc;               /* NPU_CONV_F_ACCUMULATE: @out holds the addends */
    NpuDnnlPrim *dmm[2];    /* oneDNN: units of mb rows, the last block */
} NpuMmJob;

/* First output element of unit @u. */
static uint64_t npu_mm_unit_start(const NpuMmJob *job, uint64_t u)
{
    uint64_t row = MIN((u % job->nblk) * job->mb, job->m);

    return ((u / job->nblk) * job->m + row) * job->n;
}

/*
 * The rows x cols matrix of @op at element offset @off as BLAS takes it,
 * in *@out: in place when it is fp32 with a usable layout, else packed
 * into @scratch (allocated on first use from the budget of @core's
 * device, @cap elements) less @zp. Packing follows the operand's smaller
 * stride, so that its reads are sequential, and gives a transposed matrix
 * when the columns are the far apart ones; its work is accounted as it
 * goes (npu_pack_f32). NO_MEMORY when the scratch cannot be had.
 */
static uint32_t npu_mm_view(NpuCore *core, const NpuMmOp *op, uint64_t off,
                            uint64_t rows, uint64_t cols, NpuNnBuf *scratch,
                            uint64_t cap, int32_t zp, const float **out,
                            int *ld, bool *trans)
{
    const uint8_t *src = op->data + off * op->size;
    uint64_t rs = rows > 1 ? op->rs : 0, cs = cols > 1 ? op->cs : 0;
    uint64_t outer, inner, os, is, r;
    float *buf;
    uint32_t st;

    if (!HOST_BIG_ENDIAN && op->dtype == NPU_DTYPE_FP32 && !zp) {
        if ((cols == 1 || cs == 1) && (rows == 1 || rs >= cols)) {
            *ld = rows == 1 ? cols : rs;
            *trans = false;
            *out = (const float *)src;
            return NPU_ST_OK;
        }
        if ((rows == 1 || rs == 1) && (cols == 1 || cs >= rows)) {
            *ld = cols == 1 ? rows : cs;
            *trans = true;
            *out = (const float *)src;
            return NPU_ST_OK;
        }
    }
    buf = npu_nn_get(core->s, scratch, cap, sizeof(float));
    if (!buf) {
        return NPU_ST_NO_MEMORY;
    }
    /* Transposed: column c at buf[c * rows]; else row r at buf[r * cols]. */
    *trans = cs > rs;
    outer = *trans ? cols : rows;
    inner = *trans ? rows : cols;
    os = *trans ? cs : rs;
    is = *trans ? rs : cs;
    for (r = 0; r < outer; r++) {
        st = npu_pack_f32(core, buf + r * inner, src + r * os * op->size, is,
                          op->dtype, inner, zp);
        if (st != NPU_ST_OK) {
            return st;
        }
    }
    *ld = inner;
    *out = buf;
    return NPU_ST_OK;
}

/* acc[i] (+)= c[i], the exact integer sums of one K block; int32 wraps. */
static void npu_acc_block(int32_t *acc, const float *c, uint64_t n, bool first)
{
    uint64_t i;

    for (i = 0; i < n; i++) {
        uint32_t v = (uint32_t)(int32_t)c[i];

        acc[i] = first ? v : (uint32_t)acc[i] + v;
    }
}

/*
 * The integer product of a tile unit: c (fp32 scratch) = each K block of
 * op(a) @ op(b), summed into acc (int32, rows x n) with wrap-around; the
 * blocks and their sums are work of @core.
 */
static uint32_t npu_mm_int_product(NpuCore *core, const NpuMmJob *job,
                                   const float *ap, int lda, bool ta,
                                   const float *bp, int ldb, bool tb,
                                   uint64_t rows, float *c, int32_t *acc)
{
    uint64_t n = job->n, k0, kc;
    uint32_t st = NPU_ST_OK;

    for (k0 = 0; k0 < job->k && st == NPU_ST_OK; k0 += kc) {
        kc = MIN(job->kb, job->k - k0);
        st = npu_sgemm_polled(core, ta, tb, rows, n, kc,
                              ta ? ap + k0 * lda : ap + k0, lda,
                              tb ? bp + k0 : bp + k0 * ldb, ldb, c, n);
        if (st == NPU_ST_OK) {
            npu_acc_block(acc, c, rows * n, !k0);
            st = npu_engine_work(core, rows * n);
        }
    }
    return st;
}

/* Integer epilogue: int32 bias (wrapping), RELU, store as the out dtype. */
static void npu_mm_int_store(const NpuMmJob *job, int32_t *acc, uint64_t rows,
                             uint8_t *dst)
{
    uint64_t n = job->n, r, j;

    if (job->ibias) {
        for (r = 0; r < rows; r++) {
            for (j = 0; j < n; j++) {
                acc[r * n + j] = (uint32_t)acc[r * n + j] +
                                 (uint32_t)job->ibias[j];
            }
        }
    }
    if (job->kind == NPU_ACT_RELU) {
        for (j = 0; j < rows * n; j++) {
            acc[j] = MAX(acc[j], 0);
        }
    }
    npu_store_i32(dst, job->odtype, acc, rows * n);
}

/*
 * sum[j] = the sum over K of the int8 b at @off, column j (int32 wraps),
 * in runs of NPU_PACK_STEP accounted as work of @core.
 */
static uint32_t npu_mm_colsum(NpuCore *core, const NpuMmOp *b, uint64_t off,
                              uint64_t k, uint64_t n, int32_t *sum)
{
    const int8_t *v = (const int8_t *)b->data + off;
    uint64_t i, j, j0;
    uint32_t st;

    memset(sum, 0, n * sizeof(*sum));
    for (i = 0; i < k; i++) {
        for (j0 = 0; j0 < n; j0 += NPU_PACK_STEP) {
            for (j = j0; j < MIN(n, j0 + NPU_PACK_STEP); j++) {
                sum[j] = (uint32_t)sum[j] + (uint32_t)v[i * b->rs + j * b->cs];
            }
            st = npu_engine_work(core, MIN(n - j0, NPU_PACK_STEP));
            if (st != NPU_ST_OK) {
                return st;
            }
        }
    }
    return NPU_ST_OK;
}

/*
 * acc = a @ b, less zp times b's column sums: (a - zp) @ b, exactly, with
 * the wrap-around of int32 (two's complement, modulo 2^32).
 */
static void npu_mm_sub_zp(int32_t *acc, const int32_t *sum, int32_t zp,
                          uint64_t rows, uint64_t n)
{
    uint64_t r, j;

    for (r = 0; r < rows; r++) {
        for (j = 0; j < n; j++) {
            acc[r * n + j] = (uint32_t)acc[r * n + j] -
                             (uint32_t)zp * (uint32_t)sum[j];
        }
    }
}

/* Float epilogue: fp32 bias, activation, one rounding to the out dtype. */
static void npu_mm_f32_store(const NpuMmJob *job, float *c, uint64_t rows,
                             uint8_t *dst)
{
    uint64_t n = job->n, r, j;

    if (job->bias) {
        for (r = 0; r < rows; r++) {
            for (j = 0; j < n; j++) {
                c[r * n + j] += job->bias[j];
            }
        }
    }
    if (job->kind != NPU_ACT_NONE) {
        npu_act_f32(job->kind, c, rows * n);
    }
    npu_store_f32(dst, job->odtype, c, rows * n);
}

/* Units [begin, end) of the output, then their write-back. */
static uint32_t npu_mm_tile(NpuCore *core, void *opaque, uint64_t begin,
                            uint64_t end)
{
    const NpuMmJob *job = opaque;
    NpuState *s = core->s;
    NpuWalk w = job->walk;
    NpuNnBuf apack = {}, bpack = {}, ctile = {}, itile = {}, csum = {};
    const float *bp = NULL;
    uint64_t first = npu_mm_unit_start(job, begin);
    uint64_t last = npu_mm_unit_start(job, end);
    uint64_t n = job->n, k = job->k, bcur = UINT64_MAX, u;
    uint32_t st = NPU_ST_OK, d;
    int ldb = 0;
    bool tb = false;

    for (u = begin; u < end && st == NPU_ST_OK; u++) {
        uint64_t bi = u / job->nblk, m0 = (u % job->nblk) * job->mb;
        uint64_t rows = MIN(job->mb, job->m - m0), rest = bi;
        uint64_t aoff = 0, boff = 0, o = (bi * job->m + m0) * n;
        uint8_t *dst = job->out + o * job->osize;
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
        if (job->dmm[0]) {
            NpuDnnlPrim *prim = job->dmm[rows != job->mb];
            const uint8_t *a = job->a.data + (aoff + m0 * job->a.rs) *
                               job->a.size;
            const uint8_t *b = job->b.data + boff * job->b.size;
            void *res = job->quant ?
                        npu_nn_get(s, &itile, job->mb * n, sizeof(int32_t)) :
                        npu_nn_get(s, &ctile, job->mb * n, sizeof(float));

            if (!res || (job->quant && job->zp &&
                         !npu_nn_get(s, &csum, n, sizeof(int32_t))) ||
                !npu_dnnl_mm_run(prim, core, a, b, res)) {
                st = NPU_ST_NO_MEMORY;
                break;
            }
            /* One oneDNN call of at most NPU_DNNL_UNIT_WORK: its work. */
            st = npu_engine_work(core, rows * n * k);
            if (st == NPU_ST_OK && job->quant && job->zp) {
                if (boff != bcur) {     /* b changes only with the batch */
                    st = npu_mm_colsum(core, &job->b, boff, k, n, csum.p);
                    bcur = st == NPU_ST_OK ? boff : UINT64_MAX;
                }
                npu_mm_sub_zp(itile.p, csum.p, job->zp, rows, n);
            }
            if (st != NPU_ST_OK) {
                break;
            }
            if (job->quant) {
                npu_mm_int_store(job, itile.p, rows, dst);
            } else {
                npu_mm_f32_store(job, ctile.p, rows, dst);
            }
            continue;
        }
        if (job->bpacked) {
            bp = job->bpacked;
            ldb = job->bld;
            tb = job->btrans;
        } else if (boff != bcur) {  /* b changes only with the batch */
            st = npu_mm_view(core, &job->b, boff, k, n, &bpack, k * n, 0, &bp,
                             &ldb, &tb);
            bcur = st == NPU_ST_OK ? boff : UINT64_MAX;
        }
        if (st == NPU_ST_OK) {
            st = npu_mm_view(core, &job->a, aoff + m0 * job->a.rs, rows, k,
                             &apack, job->mb * k, job->zp, &ap, &lda, &ta);
        }
        if (st != NPU_ST_OK) {
            break;
        }
        if (job->quant) {
            if (!npu_nn_get(s, &ctile, job->mb * n, sizeof(float)) ||
                !npu_nn_get(s, &itile, job->mb * n, sizeof(int32_t))) {
                st = NPU_ST_NO_MEMORY;
                break;
            }
            st = npu_mm_int_product(core, job, ap, lda, ta, bp, ldb, tb, rows,
                                    ctile.p, itile.p);
            if (st == NPU_ST_OK) {
                npu_mm_int_store(job, itile.p, rows, dst);
            }
            continue;
        }
        c = job->direct_out ? (float *)job->out + o :
            npu_nn_get(s, &ctile, job->mb * n, sizeof(float));
        if (!c) {
            st = NPU_ST_NO_MEMORY;
            break;
        }
        st = npu_sgemm_polled(core, ta, tb, rows, n, k, ap, lda, bp, ldb, c,
                              n);
        if (st == NPU_ST_OK) {
            npu_mm_f32_store(job, c, rows, dst);
        }
    }
    npu_nn_put(s, &apack);
    npu_nn_put(s, &bpack);
    npu_nn_put(s, &ctile);
    npu_nn_put(s, &itile);
    npu_nn_put(s, &csum);
    if (st == NPU_ST_NO_MEMORY) {
        npu_guest_error("npu: matmul %" PRIu64 "x%" PRIu64
                        "x%" PRIu64 ": out of device memory\n", job->m, k, n);
    }
    if (st != NPU_ST_OK) {
        return st;
    }
    return npu_mem_write(s, &w, job->out_va + first * job->osize,
                         job->out + first * job->osize,
                         (last - first) * job->osize);
}

/*
 * Plan @job for oneDNN (int8 or bf16 operands): row blocks of at most
 * NPU_DNNL_UNIT_WORK multiply-adds, and the (at most two) unit shapes,
 * which oneDNN must take. False: the BLAS path.
 */
static bool npu_mm_dnnl_plan(NpuState *s, NpuMmJob *job,
                             const struct npu_hw_tensor *ta,
                             const struct npu_hw_tensor *tb)
{
    uint32_t ra = ta->ndim, rb = tb->ndim;
    NpuDnnlMmShape sh = {
        .dtype = job->a.dtype, .k = job->k, .n = job->n,
        .as = { job->a.rs, job->a.cs }, .bs = { job->b.rs, job->b.cs },
    };

    if (!s->use_dnnl || HOST_BIG_ENDIAN || job->a.dtype != job->b.dtype ||
        (job->a.dtype != NPU_DTYPE_INT8 && job->a.dtype != NPU_DTYPE_BF16) ||
        job->n * job->k > NPU_DNNL_UNIT_WORK) {
        return false;
    }
    /* A broadcast row or column (stride 0) is not a oneDNN layout. */
    if ((ta->shape[ra - 2] > 1 && !ta->strides[ra - 2]) ||
        (ta->shape[ra - 1] > 1 && !ta->strides[ra - 1]) ||
        (tb->shape[rb - 2] > 1 && !tb->strides[rb - 2]) ||
        (tb->shape[rb - 1] > 1 && !tb->strides[rb - 1])) {
        return false;
    }
    job->mb = MIN(job->mb, NPU_DNNL_UNIT_WORK / (job->n * job->k));
    sh.m = job->mb;
    job->dmm[0] = npu_dnnl_mm_get(&sh);
    job->dmm[1] = NULL;
    if (job->dmm[0] && job->m % job->mb) {
        sh.m = job->m % job->mb;
        job->dmm[1] = npu_dnnl_mm_get(&sh);
        if (!job->dmm[1]) {
            npu_dnnl_put(job->dmm[0]);
            job->dmm[0] = NULL;
        }
    }
    return job->dmm[0] != NULL;
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
uint32_t npu_exec_matmul(NpuState *s, NpuWalk *w,
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
        .quant = p->t[0].dtype == NPU_DTYPE_INT8,
        .zp = (int32_t)p->params[NPU_MM_P_IN_ZP],
    };
    NpuCore *cp = npu_cmd_core(s);
    NpuNnBuf bias = {}, bpack = {};
    uint64_t batch = 1, flop, units, grain;
    uint64_t bstride = job.n > 1 ? p->t[2].strides[r - 1] : 0;
    bool bshared, dnnl;

    npu_mm_op_init(&job.a, &p->t[0], bufs[0]);
    npu_mm_op_init(&job.b, &p->t[1], bufs[1]);
    for (d = 0; d < job.nb; d++) {
        job.bshape[d] = o->shape[d];
        batch *= o->shape[d];
    }
    job.kb = npu_int8_kblock(job.zp);
    /* Row blocks bounded in size; large ops: at least two per core. */
    job.mb = MIN(job.m, MAX(NPU_MM_BLOCK_ELEMS /
                            (job.k + (job.quant ? 2 : 1) * job.n), 1));
    flop = batch * job.m * job.n * job.k;
    if (flop >= NPU_MM_TILE_MIN_FLOP && cores > 1 &&
        batch * DIV_ROUND_UP(job.m, job.mb) < cores * 2) {
        job.mb = DIV_ROUND_UP(job.m, DIV_ROUND_UP(cores * 2, batch));
    }
    dnnl = npu_mm_dnnl_plan(s, &job, &p->t[0], &p->t[1]);
    /* An int8 b without batch dims is widened once, not once per tile. */
    bshared = job.quant && !dnnl;
    for (d = 0; d < job.nb; d++) {
        bshared = bshared && !job.b.bstride[d];
    }
    if (bshared) {
        st = npu_mm_view(cp, &job.b, 0, job.k, job.n, &bpack, job.k * job.n,
                         0, &job.bpacked, &job.bld, &job.btrans);
        if (st != NPU_ST_OK) {
            goto out;
        }
    }
    if (opcode == NPU_OP_LINEAR) {
        /* int32 or fp32 values, four bytes either way */
        if (!npu_nn_get(s, &bias, job.n, sizeof(float))) {
            st = NPU_ST_NO_MEMORY;
            goto out;
        }
        if (job.quant) {
            st = npu_pack_i32(cp, bias.p, bufs[2], bstride, p->t[2].dtype,
                              job.n);
            job.ibias = bias.p;
        } else {
            st = npu_pack_f32(cp, bias.p, bufs[2], bstride, p->t[2].dtype,
                              job.n, 0);
            job.bias = bias.p;
        }
        if (st != NPU_ST_OK) {
            goto out;
        }
    }

    job.nblk = DIV_ROUND_UP(job.m, job.mb);
    units = batch * job.nblk;
    grain = flop < NPU_MM_TILE_MIN_FLOP ? units :
            DIV_ROUND_UP(units, cores * 2);
    st = npu_run_tiles(s, npu_mm_tile, &job, units, grain);
    if (st == NPU_ST_OK) {
        w->stats->mac_dtype = job.a.dtype;
        qatomic_add(&w->stats->macs, flop);
    }
out:
    if (st == NPU_ST_NO_MEMORY) {
        npu_guest_error("npu: matmul: out of device memory\n");
    }
    npu_dnnl_put(job.dmm[0]);
    npu_dnnl_put(job.dmm[1]);
    npu_nn_put(s, &bias);
    npu_nn_put(s, &bpack);
    return st;
}

/* ---------------------------------------------------------------------- */
/* CONV2D and POOL2D */

/*
 * CONV2D is im2col + sgemm. The units of the tiles are (image,
 * group, block of output positions) in that order; the positions are the
 * flattened OH x OW plane, so a block is a run of whole or partial output
 * rows. Per unit, the columns matrix [C/g * KH * KW, positions] is filled
 * from the input (widened to fp32, zeros for the padding), multiplied by
 * the group's packed fp32 weights [O/g, C/g * KH * KW] with fp32
 * accumulation, the bias is added, the activation applied, and the result
 * rounded once to the output dtype. A block's columns and result together
 * hold at most NPU_MM_BLOCK_ELEMS fp32 values (at least one position).
 * Each unit writes back its O/g runs of the output (one per channel).
 *
 * Integer (int8) CONV2D fills the columns with in - in_zp (padding stays
 * 0, i.e. reads in_zp) and multiplies in K blocks summed exactly into
 * int32, as integer MATMUL does; then the int32 bias, RELU and the store
 * as the output dtype.
 */
typedef struct NpuConvJob {
    NpuWalk walk;           /* snapshot; each tile walks with its own copy */
    const uint8_t *in;      /* host copy of the input's extent */
    uint32_t dtype, size, kind;     /* dtype, size: of the input and weights */
    uint32_t odtype;
    uint64_t is[4];         /* input strides, elements; 0 for size-1 dims */
    uint64_t c, h, w, o, kh, kw, oh, ow, ohw;
    uint64_t sh, sw, ph, pw, dh, dw;
    uint64_t g, cg, og, kk; /* groups, C / g, O / g, C / g * KH * KW */
    const float *wt;        /* weights as fp32 [O, kk] */
    const float *bias;      /* O values */
    const int32_t *ibias;   /* O values (integer ops) */
    bool quant;             /* int8 operands, int32 accumulation */
    int32_t zp;             /* input zero point (integer ops) */
    uint64_t kb;            /* K terms per exact fp32 block (integer ops) */
    uint64_t pb, nblk;      /* positions per unit, units per (image, group) */
    uint8_t *out;           /* host output buffer, contiguous */
    uint64_t out_va;
    uint32_t osize;
    bool direct_out;        /* BLAS writes fp32 results into @out */
    bool acc;               /* NPU_CONV_F_ACCUMULATE: @out holds the addends */
    /* oneDNN path: the blocks of an image, their shapes (full, last) */
    const void *dwt;        /* weights in the input's dtype, [O, kk] */
    uint64_t ob, nob;       /* output channels per block, blocks */
    NpuDnnlPrim *dconv[2];
} NpuConvJob;

/* Ops of fewer multiply-adds run as one tile. */
#define NPU_CONV_TILE_MIN_FLOP (1ull << 22)
/*
 * Pools of fewer taps run as one tile: a tap (a compare or a double add)
 * costs a few nanoseconds, a multiply-add a fraction of one, so pools go
 * to the AI cores at a much smaller size (ResNet's stem max pool: 1.8 M).
 */
#define NPU_POOL_TILE_MIN_TAPS (1ull << 18)

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
            if (job->zp) {
                for (iw = lo; iw < hi; iw++) {
                    d[iw - ow0] -= (float)job->zp;
                }
            }
        }
        memset(d + hi - ow0, 0, (ow1 - hi) * sizeof(float));
        p += ow1 - ow0;
    }
}

/*
 * NPU_CONV_F_ACCUMULATE: add to the @n results at @dst the values the
 * output held before the op (@old, @n of the output dtype), before the
 * activation. @tmp has room for @n fp32 values.
 */
static void npu_conv_add_old(const NpuConvJob *job, float *dst,
                             const uint8_t *old, float *tmp, uint64_t n)
{
    const float *v = npu_load_f32(old, 1, job->odtype, tmp, n);
    uint64_t i;

    for (i = 0; i < n; i++) {
        dst[i] += v[i];
    }
}

/*
 * Integer unit of group @grp over @n positions: acc [O/g, n] = the K
 * blocks of weights @ columns (fp32 scratch @c) summed in int32, plus the
 * bias, then RELU.
 */
static uint32_t npu_conv_int_unit(NpuCore *core, const NpuConvJob *job,
                                  uint64_t grp, uint64_t n, const float *col,
                                  float *c, int32_t *acc)
{
    const float *wt = job->wt + grp * job->og * job->kk;
    uint64_t k0, kc, oc, i;
    uint32_t st = NPU_ST_OK;

    for (k0 = 0; k0 < job->kk && st == NPU_ST_OK; k0 += kc) {
        kc = MIN(job->kb, job->kk - k0);
        st = npu_sgemm_polled(core, false, false, job->og, n, kc, wt + k0,
                              job->kk, col + k0 * n, n, c, n);
        if (st == NPU_ST_OK) {
            npu_acc_block(acc, c, job->og * n, !k0);
            st = npu_engine_work(core, job->og * n);
        }
    }
    for (oc = 0; oc < job->og && st == NPU_ST_OK; oc++) {
        uint32_t b = job->ibias[grp * job->og + oc];
        int32_t *row = acc + oc * n;

        for (i = 0; i < n; i++) {
            row[i] = (uint32_t)row[i] + b;
            if (job->kind == NPU_ACT_RELU && row[i] < 0) {
                row[i] = 0;
            }
        }
    }
    return st;
}

static uint32_t npu_conv_tile(NpuCore *core, void *opaque, uint64_t begin,
                              uint64_t end)
{
    const NpuConvJob *job = opaque;
    NpuState *s = core->s;
    NpuWalk w = job->walk;
    NpuNnBuf colb = {}, cb = {}, ib = {}, ob = {};
    float *col = npu_nn_get(s, &colb, job->kk * job->pb, sizeof(float));
    float *cbuf = job->direct_out && !job->quant ? NULL :
                  npu_nn_get(s, &cb, job->og * job->pb, sizeof(float));
    int32_t *ibuf = job->quant ?
                    npu_nn_get(s, &ib, job->og * job->pb, sizeof(int32_t)) :
                    NULL;
    float *obuf = job->acc ? npu_nn_get(s, &ob, job->pb, sizeof(float)) : NULL;
    uint32_t st = NPU_ST_OK;
    uint64_t u, k, oc;

    if (!col || !(job->direct_out || cbuf) || (job->quant && !ibuf) ||
        (job->acc && !obuf)) {
        npu_guest_error("npu: conv2d: out of device memory\n");
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

        /* The columns: a row of them is at most NPU_MM_BLOCK_ELEMS. */
        for (k = 0; k < job->kk && st == NPU_ST_OK; k++) {
            npu_conv_im2col_row(job, img, grp, k, p0, n, col + k * n);
            st = npu_engine_work(core, n * 4);
        }
        if (st != NPU_ST_OK) {
            break;
        }
        if (job->quant) {
            st = npu_conv_int_unit(core, job, grp, n, col, cbuf, ibuf);
            for (oc = 0; oc < job->og && st == NPU_ST_OK; oc++) {
                uint64_t off = first + oc * job->ohw;

                npu_store_i32(job->out + off * job->osize, job->odtype,
                              ibuf + oc * n, n);
                st = npu_mem_write(s, &w, job->out_va + off * job->osize,
                                   job->out + off * job->osize,
                                   n * job->osize);
                if (st == NPU_ST_OK) {  /* O/g runs: the epilogue is work */
                    st = npu_engine_work(core, n * 8);
                }
            }
            continue;
        }
        if (job->direct_out) {
            c = (float *)job->out + first;
            ldc = job->ohw;
        } else {
            c = cbuf;
            ldc = n;
        }
        st = npu_sgemm_polled(core, false, false, job->og, n, job->kk,
                              job->wt + grp * job->og * job->kk, job->kk, col,
                              n, c, ldc);
        for (oc = 0; oc < job->og && st == NPU_ST_OK; oc++) {
            float *row = c + oc * ldc, b = job->bias[grp * job->og + oc];
            uint64_t off = first + oc * job->ohw, i;

            for (i = 0; i < n; i++) {
                row[i] += b;
            }
            if (job->acc) {
                npu_conv_add_old(job, row, job->out + off * job->osize, obuf,
                                 n);
            }
            if (job->kind != NPU_ACT_NONE) {
                npu_act_f32(job->kind, row, n);
            }
            npu_store_f32(job->out + off * job->osize, job->odtype, row, n);
            st = npu_mem_write(s, &w, job->out_va + off * job->osize,
                               job->out + off * job->osize, n * job->osize);
            if (st == NPU_ST_OK) {      /* O/g runs: the epilogue is work */
                st = npu_engine_work(core, n * 8);
            }
        }
    }
out:
    npu_nn_put(s, &colb);
    npu_nn_put(s, &cb);
    npu_nn_put(s, &ib);
    npu_nn_put(s, &ob);
    return st;
}

/*
 * The oneDNN path: unit u is image u / nob, output channels [b * ob,
 * b * ob + ob) of it for b = u % nob (whole groups when g > 1; the last
 * block may be smaller). One convolution per unit, then the activation,
 * the rounding to the output dtype and one write of the block's channels,
 * which are contiguous in the NCHW output.
 */
static uint32_t npu_conv_dnnl_tile(NpuCore *core, void *opaque, uint64_t begin,
                                   uint64_t end)
{
    const NpuConvJob *job = opaque;
    NpuState *s = core->s;
    NpuWalk w = job->walk;
    NpuNnBuf tb = {}, ob = {};
    float *obuf = NULL;
    uint32_t st = NPU_ST_OK;
    uint64_t u;

    if (job->acc) {
        obuf = npu_nn_get(s, &ob, job->ob * job->ohw, sizeof(float));
        if (!obuf) {
            npu_guest_error("npu: conv2d: out of device memory\n");
            return NPU_ST_NO_MEMORY;
        }
    }
    for (u = begin; u < end && st == NPU_ST_OK; u++) {
        uint64_t img = u / job->nob, b = u % job->nob, oc0 = b * job->ob;
        uint64_t os = MIN(job->ob, job->o - oc0), n = os * job->ohw;
        uint64_t first = (img * job->o + oc0) * job->ohw;
        uint64_t ci0 = job->g > 1 ? oc0 / job->og * job->cg : 0;
        const uint8_t *in = job->in +
            (img * job->is[0] + ci0 * job->is[1]) * job->size;
        float *dst = (float *)job->out + first;

        st = npu_engine_work(core, n * job->kk);
        if (st != NPU_ST_OK) {
            break;
        }
        if (!job->direct_out) {
            dst = npu_nn_get(s, &tb, job->ob * job->ohw, sizeof(float));
        }
        if (!dst || !npu_dnnl_conv_run(job->dconv[os != job->ob], core, in,
                                       (const uint8_t *)job->dwt +
                                       oc0 * job->kk * job->size,
                                       job->bias + oc0, dst)) {
            npu_guest_error("npu: conv2d: out of device memory\n");
            st = NPU_ST_NO_MEMORY;
            break;
        }
        if (job->acc) {
            npu_conv_add_old(job, dst, job->out + first * job->osize, obuf,
                             n);
        }
        if (job->kind != NPU_ACT_NONE) {
            npu_act_f32(job->kind, dst, n);
        }
        if (!job->direct_out) {
            npu_store_f32(job->out + first * job->osize, job->odtype, dst, n);
        }
        st = npu_mem_write(s, &w, job->out_va + first * job->osize,
                           job->out + first * job->osize, n * job->osize);
    }
    npu_nn_put(s, &tb);
    npu_nn_put(s, &ob);
    return st;
}

/* Output positions (N x OH x OW) below which a 1x1 CONV2D stays on BLAS. */
#define NPU_DNNL_MIN_1X1_POSITIONS 256

/*
 * Plan @job for oneDNN: blocks of output channels per image (multiples
 * of 16 or 8, or whole groups), at least two units per core for a large
 * op, each of at most NPU_DNNL_UNIT_WORK multiply-adds; and the (at most two)
 * shapes, which oneDNN must take. False: run im2col + BLAS.
 */
static bool npu_conv_dnnl_plan(NpuState *s, NpuConvJob *job,
                               const struct npu_hw_tensor *in,
                               const struct npu_hw_tensor *wt,
                               const uint8_t *wbuf, uint64_t batch)
{
    uint32_t cores = MAX(s->cores.n, 1);
    uint64_t unit = job->ohw * job->kk;     /* multiply-adds per channel */
    /* Blocks of 16 channels, or of 8 (AVX2's width) when 16 are too big */
    uint64_t step = job->g > 1 ? job->og :
                    16 * unit <= NPU_DNNL_UNIT_WORK ? 16 : 8;
    uint64_t blocks = DIV_ROUND_UP(job->o, step), want, nb, d, dense = 1;
    /* Input rows (columns) the windows reach: oneDNN needs no others. */
    uint64_t span_h = (job->oh - 1) * job->sh + (job->kh - 1) * job->dh + 1;
    uint64_t span_w = (job->ow - 1) * job->sw + (job->kw - 1) * job->dw + 1;
    NpuDnnlConvShape sh = {
        .dtype = in->dtype,
        .h = span_h > job->ph ? MIN(job->h, span_h - job->ph) : 0,
        .w = span_w > job->pw ? MIN(job->w, span_w - job->pw) : 0,
        .oh = job->oh, .ow = job->ow, .kh = job->kh, .kw = job->kw,
        .sh = job->sh, .sw = job->sw, .ph = job->ph, .pw = job->pw,
        .dh = job->dh, .dw = job->dw,
    };

    if (!s->use_dnnl || job->quant || HOST_BIG_ENDIAN || !sh.h || !sh.w) {
        return false;
    }
    /*
     * A 1x1 convolution over few positions is a GEMM that BLAS runs on the
     * weights in place; oneDNN would first reorder them (about 100
     * multiply-adds' time per weight), which costs more than it saves.
     */
    if (job->kh == 1 && job->kw == 1 && job->g == 1 &&
        batch * job->ohw < NPU_DNNL_MIN_1X1_POSITIONS) {
        return false;
    }
    if (in->dtype == NPU_DTYPE_FP32) {
        job->dwt = job->wt;             /* fp32 [O, kk], packed if need be */
    } else if (in->dtype == NPU_DTYPE_BF16 && wt->dtype == NPU_DTYPE_BF16 &&
               npu_tensor_is_contiguous(wt)) {
        job->dwt = wbuf;
    } else {
        return false;
    }
    /* Strides for oneDNN: those of size-1 dims made dense; no broadcast. */
    for (d = 4; d-- > 0;) {
        if (in->shape[d] > 1 && !in->strides[d]) {
            return false;
        }
        sh.is[d] = job->is[d] ? job->is[d] : dense;
        dense = MAX(dense, sh.is[d] * in->shape[d]);
    }
    want = batch * job->o * unit >= NPU_CONV_TILE_MIN_FLOP ?
           DIV_ROUND_UP(cores * 2, batch) : 1;
    nb = MIN(MAX(want, DIV_ROUND_UP(job->o * unit, NPU_DNNL_UNIT_WORK)),
             blocks);
    job->ob = MIN(DIV_ROUND_UP(blocks, nb) * step, job->o);
    if (job->ob * unit > NPU_DNNL_UNIT_WORK) {
        return false;   /* BLAS splits the positions of a channel */
    }
    job->nob = DIV_ROUND_UP(job->o, job->ob);
    sh.o = job->ob;
    sh.g = job->g > 1 ? job->ob / job->og : 1;
    sh.c = sh.g * job->cg;
    job->dconv[0] = npu_dnnl_conv_get(&sh);
    job->dconv[1] = NULL;
    if (job->dconv[0] && job->o % job->ob) {
        sh.o = job->o % job->ob;
        sh.g = job->g > 1 ? sh.o / job->og : 1;
        sh.c = sh.g * job->cg;
        job->dconv[1] = npu_dnnl_conv_get(&sh);
        if (!job->dconv[1]) {
            npu_dnnl_put(job->dconv[0]);
            job->dconv[0] = NULL;
        }
    }
    return job->dconv[0] != NULL;
}

/*
 * A checked CONV2D whose inputs are in @bufs; with NPU_CONV_F_ACCUMULATE,
 * @out holds the output's values from before the op.
 */
uint32_t npu_exec_conv(NpuState *s, NpuWalk *w,
                       const struct npu_tensor_params *p,
                       uint32_t kind, uint8_t *const *bufs,
                       uint8_t *out)
{
    const struct npu_hw_tensor *in = &p->t[0], *wt = &p->t[1];
    const struct npu_hw_tensor *bt = &p->t[2], *o = &p->t[3];
    const uint32_t *q = p->params;
    uint32_t cores = MAX(s->cores.n, 1), d, st = NPU_ST_OK;
    NpuConvJob job = {
        .walk = *w, .in = bufs[0], .dtype = in->dtype,
        .size = npu_dtype_size(in->dtype), .odtype = o->dtype, .kind = kind,
        .c = in->shape[1], .h = in->shape[2], .w = in->shape[3],
        .o = o->shape[1], .kh = wt->shape[2], .kw = wt->shape[3],
        .oh = o->shape[2], .ow = o->shape[3],
        .sh = q[NPU_CONV_P_STRIDE_H], .sw = q[NPU_CONV_P_STRIDE_W],
        .ph = q[NPU_CONV_P_PAD_H], .pw = q[NPU_CONV_P_PAD_W],
        .dh = q[NPU_CONV_P_DIL_H], .dw = q[NPU_CONV_P_DIL_W],
        .g = q[NPU_CONV_P_GROUPS],
        .out = out, .out_va = o->va, .osize = npu_dtype_size(o->dtype),
        .acc = q[NPU_CONV_P_FLAGS] & NPU_CONV_F_ACCUMULATE,
        .quant = in->dtype == NPU_DTYPE_INT8,
        .zp = (int32_t)q[NPU_CONV_P_IN_ZP],
    };
    uint64_t batch = in->shape[0], flop, units, grain, r, i, j;
    uint64_t bstride = job.o > 1 ? bt->strides[1] : 0;
    NpuCore *cp = npu_cmd_core(s);
    NpuNnBuf wpack = {}, bias = {}, ibias = {};

    /* Accumulating: the results go through fp32 scratch, then @out. */
    job.direct_out = !HOST_BIG_ENDIAN && o->dtype == NPU_DTYPE_FP32 &&
                     !job.acc;
    for (d = 0; d < 4; d++) {
        job.is[d] = in->shape[d] > 1 ? in->strides[d] : 0;
    }
    job.ohw = job.oh * job.ow;
    job.cg = job.c / job.g;
    job.og = job.o / job.g;
    job.kk = job.cg * job.kh * job.kw;

    if (!npu_nn_get(s, &bias, job.o, sizeof(float)) ||
        (job.quant && !npu_nn_get(s, &ibias, job.o, sizeof(int32_t)))) {
        st = NPU_ST_NO_MEMORY;
        goto out;
    }
    if (!HOST_BIG_ENDIAN && wt->dtype == NPU_DTYPE_FP32 &&
        npu_tensor_is_contiguous(wt)) {
        job.wt = (const float *)bufs[1];
    } else if (npu_nn_get(s, &wpack, job.o, job.kk * sizeof(float))) {
        /* Rows of KW taps: [O, C / g, KH] rows into [O, kk]. */
        job.wt = wpack.p;
        for (r = 0; r < job.o * job.cg * job.kh && st == NPU_ST_OK; r++) {
            uint64_t oc = r / (job.cg * job.kh), ci = r / job.kh % job.cg;
            uint64_t ki = r % job.kh;

            i = (job.o > 1 ? oc * wt->strides[0] : 0) +
                (job.cg > 1 ? ci * wt->strides[1] : 0) +
                (job.kh > 1 ? ki * wt->strides[2] : 0);
            st = npu_pack_f32(cp, (float *)wpack.p + r * job.kw,
                              bufs[1] + i * job.size,
                              job.kw > 1 ? wt->strides[3] : 0, wt->dtype,
                              job.kw, 0);
        }
    } else {
        st = NPU_ST_NO_MEMORY;
    }
    if (st == NPU_ST_OK && job.quant) {
        st = npu_pack_i32(cp, ibias.p, bufs[2], bstride, bt->dtype, job.o);
        job.ibias = ibias.p;
        job.kb = npu_int8_kblock(job.zp);
    } else if (st == NPU_ST_OK) {
        st = npu_pack_f32(cp, bias.p, bufs[2], bstride, bt->dtype, job.o, 0);
    }
    if (st != NPU_ST_OK) {
        goto out;
    }
    job.bias = bias.p;

    if (npu_conv_dnnl_plan(s, &job, in, wt, bufs[1], batch)) {
        units = batch * job.nob;
        flop = units * job.ob * job.ohw * job.kk;
        grain = flop < NPU_CONV_TILE_MIN_FLOP ? units :
                DIV_ROUND_UP(units, cores * 2);
        st = npu_run_tiles(s, npu_conv_dnnl_tile, &job, units, grain);
        npu_dnnl_put(job.dconv[0]);
        npu_dnnl_put(job.dconv[1]);
        goto done;
    }

    /* Position blocks bounded in size; large ops: two units per core. */
    job.pb = MIN(job.ohw, MAX(NPU_MM_BLOCK_ELEMS /
                              (job.kk + (job.quant ? 2 : 1) * job.og), 1));
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
done:
    if (st == NPU_ST_OK) {
        w->stats->mac_dtype = job.dtype;
        qatomic_add(&w->stats->macs, batch * job.o * job.ohw * job.kk);
    }
out:
    if (st == NPU_ST_NO_MEMORY) {
        npu_guest_error("npu: conv2d: out of device memory\n");
    }
    npu_nn_put(s, &wpack);
    npu_nn_put(s, &bias);
    npu_nn_put(s, &ibias);
    return st;
}

/*
 * POOL2D: direct loops over the in-bounds taps of each window, in tiles
 * of whole (image, channel) planes, whose output is one contiguous run.
 * MAX propagates NaN like np.max (-inf for a window with no in-bounds
 * tap); AVG sums in double and divides by the count npu_hw.h defines.
 * Either is rounded once to the output dtype.
 */
typedef struct NpuPoolAxis {
    uint64_t n, k, stride, pb, pe, dil;
} NpuPoolAxis;

typedef struct NpuPoolJob {
    NpuWalk walk;
    const uint8_t *in;
    uint32_t dtype, kind;
    uint64_t is[4];
    uint64_t c, oh, ow;
    NpuPoolAxis ax[2];
    bool count_pad;
    uint8_t *out;
    uint64_t out_va;
    uint32_t osize;
} NpuPoolJob;

/* Taps of a window: in-bounds ones are [lo, hi), @padded inside the pads. */
typedef struct NpuPoolTaps {
    uint64_t lo, hi, padded, first;
} NpuPoolTaps;

static NpuPoolTaps npu_pool_taps(const NpuPoolAxis *a, uint64_t o)
{
    uint64_t start = o * a->stride;     /* in padded coordinates */
    uint64_t end = a->pb + a->n, edge = end + a->pe;
    NpuPoolTaps t = { .lo = 0, .hi = 0 };

    if (start < a->pb) {
        t.lo = DIV_ROUND_UP(a->pb - start, a->dil);
    }
    if (start < end) {
        t.hi = MIN(a->k, DIV_ROUND_UP(end - start, a->dil));
    }
    t.hi = MAX(t.hi, t.lo);
    t.padded = start < edge ? MIN(a->k, DIV_ROUND_UP(edge - start, a->dil)) : 0;
    t.first = start + t.lo * a->dil - a->pb;   /* input index of tap lo */
    return t;
}

/*
 * Widest input row of the row kernel, which widens a row and loops over
 * its outputs between control points: about a millisecond of work.
 */
#define NPU_POOL_ROW_MAX (1ull << 18)

/*
 * An ordinary window (k <= n, pads below k) of axis @a: its taps and the
 * per-tap loops of the row kernel stay within the input.
 */
static bool npu_pool_axis_plain(const NpuPoolAxis *a)
{
    return a->k <= a->n && a->pb < a->k && a->pe < a->k && a->dil <= a->n;
}

/*
 * Output columns [lo, hi) whose tap @j of the W axis is in bounds; the
 * window of column ow reads input column ow * stride + j * dil - pb.
 */
static void npu_pool_cols(const NpuPoolAxis *a, uint64_t ow, uint64_t j,
                          uint64_t *lo, uint64_t *hi)
{
    uint64_t off = j * a->dil;

    *lo = off >= a->pb ? 0 : DIV_ROUND_UP(a->pb - off, a->stride);
    *hi = off > a->pb + a->n - 1 ? 0 : (a->pb + a->n - 1 - off) / a->stride + 1;
    *hi = MIN(*hi, ow);
    *lo = MIN(*lo, *hi);
}

/*
 * The row kernel of ordinary windows: per output row, each in-bounds input
 * row of its windows is widened to fp32 once (no copy for fp32), then each
 * tap column updates a whole run of outputs. Every output sees its taps in
 * the same order as npu_pool_tile's loops, so the results are identical.
 */
static uint32_t npu_pool_rows_tile(NpuCore *core, void *opaque,
                                   uint64_t begin, uint64_t end)
{
    const NpuPoolJob *job = opaque;
    const NpuPoolAxis *ah = &job->ax[0], *aw = &job->ax[1];
    NpuWalk w = job->walk;
    uint64_t ohw = job->oh * job->ow, u, oh, ow, i, j, lo, hi;
    NpuNnBuf tb = {}, mb = {}, ab = {};
    float *tmp = npu_nn_get(core->s, &tb, aw->n, sizeof(float));
    float *m = npu_nn_get(core->s, &mb, job->ow, sizeof(float));
    double *acc = npu_nn_get(core->s, &ab, job->ow, sizeof(double));
    uint32_t st = NPU_ST_OK;

    if (!tmp || !m || !acc) {
        npu_guest_error("npu: pool2d: out of device memory\n");
        st = NPU_ST_NO_MEMORY;
        goto out;
    }
    for (u = begin; u < end && st == NPU_ST_OK; u++) {
        uint64_t base = (u / job->c) * job->is[0] + (u % job->c) * job->is[1];

        for (oh = 0; oh < job->oh; oh++) {
            NpuPoolTaps th = npu_pool_taps(ah, oh);
            uint64_t o = u * ohw + oh * job->ow;

            for (ow = 0; ow < job->ow; ow++) {
                m[ow] = -INFINITY;
                acc[ow] = 0.0;
            }
            for (i = th.lo; i < th.hi && st == NPU_ST_OK; i++) {
                uint64_t ih = oh * ah->stride + i * ah->dil - ah->pb;
                uint64_t at = (base + ih * job->is[2]) *
                              npu_dtype_size(job->dtype);
                const float *r = npu_load_f32(job->in + at, job->is[3],
                                              job->dtype, tmp, aw->n);

                /* Widening the row, then each tap column: accounted */
                st = npu_engine_work(core, aw->n + 1);
                for (j = 0; j < aw->k && st == NPU_ST_OK; j++) {
                    uint64_t off = j * aw->dil, sw = aw->stride, pb = aw->pb;

                    /* Column ow reads r[ow * sw + off - pb]: in [lo, hi) */
                    npu_pool_cols(aw, job->ow, j, &lo, &hi);
                    if (job->kind == NPU_POOL_MAX) {
                        for (ow = lo; ow < hi; ow++) {
                            m[ow] = npu_maxf(m[ow], r[ow * sw + off - pb]);
                        }
                    } else {
                        for (ow = lo; ow < hi; ow++) {
                            acc[ow] += r[ow * sw + off - pb];
                        }
                    }
                    st = npu_engine_work(core, hi - lo + 1);
                }
            }
            if (st != NPU_ST_OK) {
                break;
            }
            for (ow = 0; ow < job->ow; ow++, o++) {
                NpuPoolTaps tw;
                double div;

                if (job->kind == NPU_POOL_MAX) {
                    npu_store_d(job->out, job->dtype, o, m[ow]);
                    continue;
                }
                tw = npu_pool_taps(aw, ow);
                div = job->count_pad ? (double)th.padded * tw.padded :
                      (double)(th.hi - th.lo) * (tw.hi - tw.lo);
                npu_store_d(job->out, job->dtype, o,
                            div ? acc[ow] / div : 0.0);
            }
        }
    }
    if (st == NPU_ST_OK) {
        st = npu_mem_write(core->s, &w,
                           job->out_va + begin * ohw * job->osize,
                           job->out + begin * ohw * job->osize,
                           (end - begin) * ohw * job->osize);
    }
out:
    npu_nn_put(core->s, &tb);
    npu_nn_put(core->s, &mb);
    npu_nn_put(core->s, &ab);
    return st;
}

static uint32_t npu_pool_tile(NpuCore *core, void *opaque, uint64_t begin,
                              uint64_t end)
{
    const NpuPoolJob *job = opaque;
    NpuWalk w = job->walk;
    uint64_t ohw = job->oh * job->ow, u, oh, ow, i, j, j0;
    uint64_t dh = job->ax[0].dil * job->is[2], dw = job->ax[1].dil * job->is[3];

    for (u = begin; u < end; u++) {
        const uint8_t *plane = job->in;
        uint64_t base = (u / job->c) * job->is[0] + (u % job->c) * job->is[1];
        uint64_t o = u * ohw;

        for (oh = 0; oh < job->oh; oh++) {
            NpuPoolTaps th = npu_pool_taps(&job->ax[0], oh);

            for (ow = 0; ow < job->ow; ow++, o++) {
                NpuPoolTaps tw = npu_pool_taps(&job->ax[1], ow);
                uint64_t row = base + th.first * job->is[2] +
                               tw.first * job->is[3];
                uint64_t taps = (th.hi - th.lo) * (tw.hi - tw.lo);
                double sum = 0.0, div;
                float m = -INFINITY;
                uint32_t st;

                /*
                 * A window may be huge: each output, and each run of
                 * NPU_PACK_STEP taps of a window row, is accounted.
                 */
                st = npu_engine_work(core, 1);
                if (st != NPU_ST_OK) {
                    return st;
                }
                if (job->kind == NPU_POOL_MAX && taps) {
                    m = npu_ld_f(plane, job->dtype, row);
                }
                for (i = 0; i < th.hi - th.lo; i++) {
                    for (j0 = 0; j0 < tw.hi - tw.lo; j0 += NPU_PACK_STEP) {
                        uint64_t je = MIN(tw.hi - tw.lo, j0 + NPU_PACK_STEP);

                        for (j = j0; j < je; j++) {
                            float v = npu_ld_f(plane, job->dtype,
                                               row + i * dh + j * dw);

                            if (job->kind == NPU_POOL_MAX) {
                                m = npu_maxf(m, v);
                            } else {
                                sum += v;
                            }
                        }
                        st = npu_engine_work(core, je - j0);
                        if (st != NPU_ST_OK) {
                            return st;
                        }
                    }
                }
                if (job->kind == NPU_POOL_MAX) {
                    npu_store_d(job->out, job->dtype, o, m);
                    continue;
                }
                div = job->count_pad ? (double)th.padded * tw.padded :
                      (double)taps;
                npu_store_d(job->out, job->dtype, o, div ? sum / div : 0.0);
            }
        }
    }
    return npu_mem_write(core->s, &w, job->out_va + begin * ohw * job->osize,
                         job->out + begin * ohw * job->osize,
                         (end - begin) * ohw * job->osize);
}

/* A checked POOL2D whose input is in @bufs[0]. */
uint32_t npu_exec_pool(NpuState *s, NpuWalk *w,
                       const struct npu_tensor_params *p,
                       uint32_t kind, uint8_t *const *bufs,
                       uint8_t *out)
{
    const struct npu_hw_tensor *in = &p->t[0], *o = &p->t[1];
    const uint32_t *q = p->params;
    uint32_t cores = MAX(s->cores.n, 1), d;
    bool geo = q[NPU_POOL_P_FLAGS] & NPU_POOL_F_GEOMETRY;
    NpuPoolJob job = {
        .walk = *w, .in = bufs[0], .dtype = o->dtype, .kind = kind,
        .c = in->shape[1], .oh = o->shape[2], .ow = o->shape[3],
        .ax = {
            { .n = in->shape[2], .k = q[NPU_POOL_P_KH],
              .stride = q[NPU_POOL_P_STRIDE_H], .pb = q[NPU_POOL_P_PAD_H],
              .pe = q[geo ? NPU_POOL_P_PAD_H_END : NPU_POOL_P_PAD_H],
              .dil = geo ? q[NPU_POOL_P_DIL_H] : 1 },
            { .n = in->shape[3], .k = q[NPU_POOL_P_KW],
              .stride = q[NPU_POOL_P_STRIDE_W], .pb = q[NPU_POOL_P_PAD_W],
              .pe = q[geo ? NPU_POOL_P_PAD_W_END : NPU_POOL_P_PAD_W],
              .dil = geo ? q[NPU_POOL_P_DIL_W] : 1 },
        },
        .count_pad = q[NPU_POOL_P_FLAGS] & NPU_POOL_F_COUNT_PAD,
        .out = out, .out_va = o->va, .osize = npu_dtype_size(o->dtype),
    };
    uint64_t units = in->shape[0] * job.c, taps, grain;

    for (d = 0; d < 4; d++) {
        job.is[d] = in->shape[d] > 1 ? in->strides[d] : 0;
    }
    taps = units * job.oh * job.ow * MIN(job.ax[0].k, job.ax[0].n) *
           MIN(job.ax[1].k, job.ax[1].n);
    grain = taps < NPU_POOL_TILE_MIN_TAPS ? units :
            DIV_ROUND_UP(units, cores * 2);
    return npu_run_tiles(s, npu_pool_axis_plain(&job.ax[0]) &&
                         npu_pool_axis_plain(&job.ax[1]) &&
                         job.ax[1].n <= NPU_POOL_ROW_MAX ?
                         npu_pool_rows_tile : npu_pool_tile,
                         &job, units, grain);
}

/* ---------------------------------------------------------------------- */
/* REQUANT */

/*
 * out = clamp(rne(acc * scale) + zp, lo, 127) with the product exact: a
 * finite fp32 scale is m * 2^e with an integer m < 2^24, so acc * m is
 * an exact int64 (below 2^55 in magnitude) and the scaling by 2^e is a
 * shift that rounds to nearest, ties to even. The units of the tiles are
 * whole rows of the output's last dim; every scale element the op reads
 * is checked before anything is written.
 */
typedef struct NpuRqJob {
    NpuWalk walk;
    const uint8_t *acc, *scale;     /* host copies of the inputs' extents */
    uint32_t ndim;
    uint64_t shape[NPU_MAX_RANK];
    uint64_t as[NPU_MAX_RANK], ss[NPU_MAX_RANK];   /* strides; 0: broadcast */
    int32_t zp, lo;
    uint8_t *out;
    uint64_t out_va;
} NpuRqJob;

/* One element; @sbits is a finite fp32 above zero. */
static int8_t npu_requant1(int32_t acc, uint32_t sbits, int32_t zp, int32_t lo)
{
    uint32_t e = (sbits >> 23) & 0xff;
    int64_t m = (sbits & 0x7fffff) | (e ? 0x800000 : 0);
    int32_t sh = e ? (int32_t)e - 150 : -149;       /* scale = m * 2^sh */
    int64_t prod = acc * m, q, rem, half;

    if (sh >= 0) {
        /*
         * |prod| >= 1 times 2^9 saturates whatever the zero point; a zero
         * product stays zero (and must not be shifted by up to 104 bits).
         */
        if (!prod) {
            q = 0;
        } else if (sh > 8) {
            q = prod < 0 ? -1024 : 1024;
        } else {
            q = prod * (1ll << sh);
        }
    } else if (sh < -62) {
        q = 0;                      /* |prod| < 2^55: below half of 2^-sh */
    } else {
        q = prod >> -sh;            /* floor (arithmetic shift) */
        rem = prod - q * (1ll << -sh);
        half = 1ll << (-sh - 1);
        if (rem > half || (rem == half && (q & 1))) {
            q++;
        }
    }
    q += zp;
    return q < lo ? lo : q > INT8_MAX ? INT8_MAX : q;
}

static uint32_t npu_rq_tile(NpuCore *core, void *opaque, uint64_t begin,
                            uint64_t end)
{
    const NpuRqJob *job = opaque;
    NpuWalk w = job->walk;
    uint32_t last = job->ndim - 1, d;
    uint64_t len = job->shape[last], u, j;

    for (u = begin; u < end; u++) {
        uint64_t rest = u, ao = 0, so = 0, j0;
        uint8_t *dst = job->out + u * len;

        for (d = last; d-- > 0;) {
            uint64_t i = rest % job->shape[d];

            rest /= job->shape[d];
            ao += i * job->as[d];
            so += i * job->ss[d];
        }
        /* A row may be the whole operand: accounted in runs. */
        for (j0 = 0; j0 < len; j0 += NPU_PACK_STEP) {
            uint64_t je = MIN(len, j0 + NPU_PACK_STEP);
            /* an element: two loads, a multiply, a shift: 16 units */
            uint32_t st = npu_engine_work(core, (je - j0) * 16);

            if (st != NPU_ST_OK) {
                return st;
            }
            for (j = j0; j < je; j++) {
                int32_t acc = ldl_le_p(job->acc +
                                       (ao + j * job->as[last]) * 4);
                uint32_t sb = ldl_le_p(job->scale +
                                       (so + j * job->ss[last]) * 4);

                dst[j] = npu_requant1(acc, sb, job->zp, job->lo);
            }
        }
    }
    return npu_mem_write(core->s, &w, job->out_va + begin * len,
                         job->out + begin * len, (end - begin) * len);
}

/* A checked REQUANT whose inputs are in @bufs. */
uint32_t npu_exec_requant(NpuState *s, NpuWalk *w,
                          const struct npu_tensor_params *p, uint32_t kind,
                          uint8_t *const *bufs, uint8_t *out)
{
    const struct npu_hw_tensor *sc = &p->t[1], *o = &p->t[2];
    int32_t zp = (int32_t)p->params[NPU_REQUANT_P_OUT_ZP];
    NpuRqJob job = {
        .walk = *w, .acc = bufs[0], .scale = bufs[1], .ndim = o->ndim,
        .zp = zp, .lo = kind == NPU_ACT_RELU ? zp : INT8_MIN,
        .out = out, .out_va = o->va,
    };
    uint64_t numel = npu_tensor_numel(o), units, grain, i, rest, off;
    NpuCore *cp = npu_cmd_core(s);
    uint32_t d, st;

    /*
     * Every scale element first (2^28 at most), each a multi-index walk of
     * about 10 ns: a control point every NPU_PACK_STEP of them.
     */
    for (i = 0; i < npu_tensor_numel(sc); i++) {
        if (!(i % NPU_PACK_STEP)) {
            st = npu_engine_work(cp, NPU_POLL_QUANTUM);
            if (st != NPU_ST_OK) {
                return st;
            }
        }
        for (d = sc->ndim, rest = i, off = 0; d-- > 0;) {
            off += rest % sc->shape[d] * sc->strides[d];
            rest /= sc->shape[d];
        }
        if (!npu_f32_bits_positive_finite(ldl_le_p(bufs[1] + off * 4))) {
            npu_guest_error("npu: requant: scale element %"
                            PRIu64 " is not a finite fp32 above zero\n", i);
            return NPU_ST_BAD_QUANT;
        }
    }
    for (d = 0; d < o->ndim; d++) {
        job.shape[d] = o->shape[d];
        job.as[d] = o->shape[d] > 1 ? p->t[0].strides[d] : 0;
        job.ss[d] = sc->shape[d] > 1 ? sc->strides[d] : 0;
    }
    units = numel / job.shape[o->ndim - 1];
    grain = numel < NPU_TENSOR_TILE_MIN ? units :
            DIV_ROUND_UP(units, MAX(s->cores.n, 1) * 2);
    return npu_run_tiles(s, npu_rq_tile, &job, units, grain);
}
