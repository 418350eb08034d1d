/*
 * NPU command engine: validation and execution of one descriptor.
 * Runs on the command processor thread, which splits large commands into
 * tiles for the AI cores (npu_cores.c). Every guest-controlled length, stride
 * and address is checked with overflow-safe arithmetic before any DMA, and
 * no transfer may touch the device's own BARs.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/units.h"
#include "qemu/log.h"
#include "qemu/cutils.h"
#include "qemu/atomic.h"
#include "hw/misc/trace.h"
#include <math.h>
#include "npu_dev.h"

/*
 * Validate a device address range; returns NPU_ST_OK or the status to
 * report. The bus addresses it maps to are checked by npu_mem_*().
 */
uint32_t npu_check_range(const char *what, uint64_t addr, uint64_t len)
{
    uint64_t end;

    if (len == 0 || len > NPU_MAX_XFER) {
        npu_guest_error("npu: %s length %" PRIu64
                        " out of range\n", what, len);
        return NPU_ST_BAD_ARGS;
    }
    if (uadd64_overflow(addr, len, &end)) {
        npu_guest_error("npu: %s range 0x%" PRIx64 "+0x%"
                        PRIx64 " wraps around\n", what, addr, len);
        return NPU_ST_BAD_ADDR;
    }
    return NPU_ST_OK;
}

/* Commands above this size are split into tiles for the AI cores. */
#define NPU_TILE_BYTES (4 * MiB)

/*
 * Host memory for staging and scratch, charged to the device's budget
 * (the mem-budget property): NULL, as for an allocation failure, when the
 * bytes in flight would exceed it. The budget bounds what a guest can make
 * QEMU allocate, whatever its descriptors and page tables say.
 */
void *npu_budget_alloc(NpuState *s, uint64_t bytes, bool zero)
{
    uint64_t used = qatomic_add_fetch(&s->mem_used, bytes);
    void *p;

    if (used > s->mem_budget || used < bytes) {
        qatomic_sub(&s->mem_used, bytes);
        trace_npu_budget(bytes, used - bytes, s->mem_budget);
        npu_guest_error("npu: %" PRIu64 " bytes of host"
                        " memory exceed the device's budget (%" PRIu64
                        " of %" PRIu64 " in use)\n", bytes, used - bytes,
                        s->mem_budget);
        return NULL;
    }
    p = zero ? g_try_malloc0(bytes) : g_try_malloc(bytes);
    if (!p) {
        qatomic_sub(&s->mem_used, bytes);
    }
    return p;
}

/* Freed blocks of an aborted command at least this large wait for a reap. */
#define NPU_DEFER_FREE_MIN (1 * MiB)

/* The head of a block whose free is deferred: the block holds its node. */
typedef struct NpuDeferred {
    QSLIST_ENTRY(NpuDeferred) next;
    uint64_t bytes;
} NpuDeferred;

/*
 * Give back a npu_budget_alloc() of @bytes; @p may be NULL (failed). While
 * a reset or unplug aborts the command, or once it ran past its budget,
 * large blocks are only queued: the device answers first (the reset done,
 * the TIMEOUT completion written), npu_budget_reap() returns their memory
 * after.
 */
void npu_budget_free(NpuState *s, void *p, uint64_t bytes)
{
    NpuDeferred *d = p;

    if (!p) {
        return;
    }
    if (bytes >= NPU_DEFER_FREE_MIN && npu_engine_stopping(s)) {
        d->bytes = bytes;
        QSLIST_INSERT_HEAD_ATOMIC(&s->deferred, d, next);
        return;
    }
    g_free(p);
    qatomic_sub(&s->mem_used, bytes);
}

/* Free the blocks npu_budget_free() deferred (any thread, no lock held). */
void npu_budget_reap(NpuState *s)
{
    QSLIST_HEAD(, NpuDeferred) list;
    NpuDeferred *d;

    QSLIST_MOVE_ATOMIC(&list, &s->deferred);
    while ((d = QSLIST_FIRST(&list))) {
        uint64_t bytes = d->bytes;

        QSLIST_REMOVE_HEAD(&list, next);
        g_free(d);
        qatomic_sub(&s->mem_used, bytes);
    }
}

typedef struct NpuXferJob {
    NpuWalk walk;           /* snapshot; each tile walks with its own copy */
    uint64_t src, dst;
    const uint8_t *pattern; /* FILL: NPU_CHUNK bytes of the pattern */
} NpuXferJob;

static uint32_t npu_copy_tile(NpuCore *core, void *opaque, uint64_t begin,
                              uint64_t end)
{
    NpuXferJob *job = opaque;
    NpuWalk w = job->walk;
    uint32_t st = NPU_ST_OK;

    while (begin < end && st == NPU_ST_OK) {
        uint64_t n = MIN(end - begin, (uint64_t)NPU_CHUNK);

        st = npu_mem_read(core->s, &w, job->src + begin, core->chunk, n);
        if (st == NPU_ST_OK) {
            st = npu_mem_write(core->s, &w, job->dst + begin, core->chunk, n);
        }
        begin += n;
    }
    return st;
}

static uint32_t npu_fill_tile(NpuCore *core, void *opaque, uint64_t begin,
                              uint64_t end)
{
    NpuXferJob *job = opaque;
    NpuWalk w = job->walk;
    uint32_t st = NPU_ST_OK;

    while (begin < end && st == NPU_ST_OK) {
        uint64_t n = MIN(end - begin, (uint64_t)NPU_CHUNK);

        st = npu_mem_write(core->s, &w, job->dst + begin, job->pattern, n);
        begin += n;
    }
    return st;
}

static uint32_t npu_exec_copy(NpuState *s, NpuWalk *w,
                              const struct npu_cmd *cmd)
{
    NpuXferJob job = {
        .walk = *w,
        .src = le64_to_cpu(cmd->copy.src),
        .dst = le64_to_cpu(cmd->copy.dst),
    };
    uint64_t len = le64_to_cpu(cmd->copy.len);
    uint32_t st;

    st = npu_check_range("copy source", job.src, len);
    if (st == NPU_ST_OK) {
        st = npu_check_range("copy destination", job.dst, len);
    }
    if (st != NPU_ST_OK) {
        return st;
    }
    if (job.src < job.dst + len && job.dst < job.src + len) {
        npu_guest_error("npu: copy source and destination"
                        " overlap\n");
        return NPU_ST_BAD_ARGS;
    }
    return npu_run_tiles(s, npu_copy_tile, &job, len, NPU_TILE_BYTES);
}

static uint32_t npu_exec_fill(NpuState *s, NpuWalk *w,
                              const struct npu_cmd *cmd)
{
    NpuXferJob job = {
        .walk = *w,
        .dst = le64_to_cpu(cmd->fill.dst),
        .pattern = npu_cmd_core(s)->chunk,
    };
    uint64_t len = le64_to_cpu(cmd->fill.len);
    uint32_t pattern = cmd->fill.pattern;   /* kept in guest byte order */
    uint32_t st;
    size_t i;

    if (cmd->fill.rsvd) {
        npu_guest_error("npu: fill reserved field set\n");
        return NPU_ST_BAD_RESERVED;
    }
    st = npu_check_range("fill destination", job.dst, len);
    if (st != NPU_ST_OK) {
        return st;
    }
    if (len % 4) {
        npu_guest_error("npu: fill length %" PRIu64
                        " is not a multiple of 4\n", len);
        return NPU_ST_BAD_ARGS;
    }
    /* The pattern chunk is written here, then only read by the tiles. */
    for (i = 0; i < NPU_CHUNK / 4; i++) {
        memcpy(npu_cmd_core(s)->chunk + i * 4, &pattern, 4);
    }
    return npu_run_tiles(s, npu_fill_tile, &job, len, NPU_TILE_BYTES);
}

/*
 * Bytes spanned by a row-major rows x cols fp32 matrix with row stride ld
 * (elements): ((rows - 1) * ld + cols) * 4. Dimensions are bounded by
 * NPU_MAX_DIM and strides by NPU_MAX_LD, so this cannot overflow 64 bits
 * and every stride fits BLAS's int.
 */
static uint64_t npu_matrix_bytes(uint32_t rows, uint32_t cols, uint32_t ld)
{
    return (((uint64_t)rows - 1) * ld + cols) * sizeof(float);
}

typedef struct NpuMatrix {
    const char *name;
    uint64_t addr;
    uint32_t rows, cols, ld;
    uint64_t bytes;
    float *data;
} NpuMatrix;

static uint32_t npu_matrix_check(NpuMatrix *mat)
{
    if (mat->ld < mat->cols || mat->ld > NPU_MAX_LD) {
        npu_guest_error("npu: gemm %s stride %u is outside"
                        " [%u, %u]\n", mat->name, mat->ld, mat->cols,
                        NPU_MAX_LD);
        return NPU_ST_BAD_ARGS;
    }
    mat->bytes = npu_matrix_bytes(mat->rows, mat->cols, mat->ld);
    return npu_check_range(mat->name, mat->addr, mat->bytes);
}

/*
 * Multiply-adds of one GEMM tile: a block of C, whatever the shape, so that
 * every tile ends within a few milliseconds (the BLAS call itself has no
 * control point). Smaller GEMMs get at least two tiles per core, down to
 * NPU_GEMM_TILE_MIN_WORK.
 */
#define NPU_GEMM_TILE_WORK (1ull << 27)
#define NPU_GEMM_TILE_MIN_WORK (1ull << 22)

typedef struct NpuGemmJob {
    const NpuMatrix *a, *b, *c;     /* packed: ld == cols */
    uint32_t m, n, k;
    uint32_t rb, cb, ncb;           /* block rows, block cols, blocks/row */
    bool ta, tb;
} NpuGemmJob;

/* Blocks [begin, end) of C = op(A) x op(B), all operands gathered. */
static uint32_t npu_gemm_tile(NpuCore *core, void *opaque, uint64_t begin,
                              uint64_t end)
{
    const NpuGemmJob *job = opaque;
    uint64_t u;

    for (u = begin; u < end; u++) {
        uint64_t r0 = u / job->ncb * job->rb, c0 = u % job->ncb * job->cb;
        uint32_t rows = MIN(job->rb, job->m - r0);
        uint32_t cols = MIN(job->cb, job->n - c0);
        /* Row r of op(A) is row r of A, or column r of A when transposed. */
        const float *a = job->a->data + (job->ta ? r0 : r0 * job->a->cols);
        const float *b = job->b->data + (job->tb ? c0 * job->b->cols : c0);

        npu_sgemm(job->ta, job->tb, rows, cols, job->k, a, job->a->cols, b,
                  job->b->cols, job->c->data + r0 * job->n + c0, job->n);
    }
    return NPU_ST_OK;
}

/*
 * Move a matrix between guest memory (row stride ld) and its packed copy:
 * one transfer when it has no gaps, else one per row, so the host buffer
 * is sized by the elements, never by the stride, and the gaps are never
 * touched.
 */
static uint32_t npu_matrix_xfer(NpuState *s, NpuWalk *w, NpuMatrix *mat,
                                bool write)
{
    uint64_t row = (uint64_t)mat->cols * sizeof(float), r;
    uint32_t st = NPU_ST_OK;

    if (mat->ld == mat->cols) {
        return write ? npu_mem_write(s, w, mat->addr, mat->data,
                                     row * mat->rows)
                     : npu_mem_read(s, w, mat->addr, mat->data,
                                    row * mat->rows);
    }
    for (r = 0; r < mat->rows && st == NPU_ST_OK; r++) {
        uint64_t va = mat->addr + r * mat->ld * sizeof(float);
        float *p = mat->data + r * mat->cols;

        /* Rows are short: a control point every 4 MiB of them. */
        if (r && !(r % MAX(NPU_TILE_BYTES / row, 1))) {
            st = npu_engine_poll(s);
            if (st != NPU_ST_OK) {
                break;
            }
        }
        st = write ? npu_mem_write(s, w, va, p, row)
                   : npu_mem_read(s, w, va, p, row);
    }
    return st;
}

static uint32_t npu_exec_gemm(NpuState *s, NpuWalk *w,
                              const struct npu_cmd *cmd)
{
    uint32_t m = le32_to_cpu(cmd->gemm.m);
    uint32_t n = le32_to_cpu(cmd->gemm.n);
    uint32_t k = le32_to_cpu(cmd->gemm.k);
    uint32_t flags = le32_to_cpu(cmd->gemm.flags);
    bool ta = flags & NPU_GEMM_TRANS_A, tb = flags & NPU_GEMM_TRANS_B;
    NpuMatrix a = {
        .name = "A", .addr = le64_to_cpu(cmd->gemm.a),
        .rows = ta ? k : m, .cols = ta ? m : k,
        .ld = le32_to_cpu(cmd->gemm.lda),
    };
    NpuMatrix b = {
        .name = "B", .addr = le64_to_cpu(cmd->gemm.b),
        .rows = tb ? n : k, .cols = tb ? k : n,
        .ld = le32_to_cpu(cmd->gemm.ldb),
    };
    NpuMatrix c = {
        .name = "C", .addr = le64_to_cpu(cmd->gemm.c),
        .rows = m, .cols = n, .ld = le32_to_cpu(cmd->gemm.ldc),
    };
    uint64_t asz, bsz, csz, side;
    NpuGemmJob job;
    uint32_t st;

    if (le32_to_cpu(cmd->gemm.dtype) != NPU_DTYPE_FP32) {
        npu_guest_error("npu: gemm dtype %u unsupported\n",
                        le32_to_cpu(cmd->gemm.dtype));
        return NPU_ST_BAD_ARGS;
    }
    if (flags & ~NPU_GEMM_F_MASK) {
        npu_guest_error("npu: gemm flags 0x%x unknown\n",
                        flags);
        return NPU_ST_BAD_FLAGS;
    }
    if (!m || !n || !k || m > NPU_MAX_DIM || n > NPU_MAX_DIM ||
        k > NPU_MAX_DIM) {
        npu_guest_error("npu: gemm shape %ux%ux%u out of"
                        " range\n", m, n, k);
        return NPU_ST_BAD_ARGS;
    }
    st = npu_matrix_check(&a);
    if (st == NPU_ST_OK) {
        st = npu_matrix_check(&b);
    }
    if (st == NPU_ST_OK) {
        st = npu_matrix_check(&c);
    }
    if (st != NPU_ST_OK) {
        return st;
    }

    asz = (uint64_t)a.rows * a.cols * sizeof(float);
    bsz = (uint64_t)b.rows * b.cols * sizeof(float);
    csz = (uint64_t)c.rows * c.cols * sizeof(float);
    a.data = npu_budget_alloc(s, asz, false);
    b.data = npu_budget_alloc(s, bsz, false);
    /* Zeroed: no stale host memory can ever reach the guest. */
    c.data = npu_budget_alloc(s, csz, true);
    if (!a.data || !b.data || !c.data) {
        npu_guest_error("npu: gemm of %" PRIu64 " bytes: out"
                        " of device memory\n", asz + bsz + csz);
        st = NPU_ST_NO_MEMORY;
        goto out;
    }
    st = npu_matrix_xfer(s, w, &a, false);
    if (st == NPU_ST_OK) {
        st = npu_matrix_xfer(s, w, &b, false);
    }
    if (st != NPU_ST_OK) {
        goto out;
    }
    /* Blocks of C of bounded work: whole rows if they are short enough. */
    side = MIN(NPU_GEMM_TILE_WORK,
               MAX((uint64_t)m * n * k / (2 * s->cores.n),
                   NPU_GEMM_TILE_MIN_WORK));
    side = MAX(side / k, 1);
    job = (NpuGemmJob) {
        .a = &a, .b = &b, .c = &c, .m = m, .n = n, .k = k, .ta = ta, .tb = tb,
    };
    /*
     * Power-of-two blocks, twice as wide as tall: BLAS kernels and caches
     * like aligned panels (odd sizes cost about 8% at 2048^3).
     */
    if ((uint64_t)n * n <= side) {
        job.cb = n;
    } else {
        job.cb = MIN(n, MAX(64, pow2floor((uint64_t)sqrt(2.0 * side))));
    }
    job.rb = MIN(m, MAX(1, side / job.cb));
    job.ncb = DIV_ROUND_UP(n, job.cb);
    st = npu_run_tiles(s, npu_gemm_tile, &job,
                       (uint64_t)DIV_ROUND_UP(m, job.rb) * job.ncb, 1);
    if (st == NPU_ST_OK) {
        w->stats->mac_dtype = NPU_DTYPE_FP32;
        qatomic_add(&w->stats->macs, (uint64_t)m * n * k);
        st = npu_matrix_xfer(s, w, &c, true);
    }
out:
    npu_budget_free(s, a.data, asz);
    npu_budget_free(s, b.data, bsz);
    npu_budget_free(s, c.data, csz);
    return st;
}

/* Payload bytes each opcode uses; the rest of the descriptor must be 0. */
static const size_t npu_payload_used[NPU_OP_COUNT] = {
    [NPU_OP_NOP] = 0,
    [NPU_OP_COPY] = sizeof(((struct npu_cmd *)0)->copy),
    [NPU_OP_FILL] = sizeof(((struct npu_cmd *)0)->fill),
    [NPU_OP_GEMM] = sizeof(((struct npu_cmd *)0)->gemm),
    [NPU_OP_ELTWISE] = sizeof(((struct npu_cmd *)0)->tensor),
    [NPU_OP_UNARY] = sizeof(((struct npu_cmd *)0)->tensor),
    [NPU_OP_CONVERT] = sizeof(((struct npu_cmd *)0)->tensor),
    [NPU_OP_REDUCE] = sizeof(((struct npu_cmd *)0)->tensor),
    [NPU_OP_SOFTMAX] = sizeof(((struct npu_cmd *)0)->tensor),
    [NPU_OP_LAYERNORM] = sizeof(((struct npu_cmd *)0)->tensor),
    [NPU_OP_MATMUL] = sizeof(((struct npu_cmd *)0)->tensor),
    [NPU_OP_LINEAR] = sizeof(((struct npu_cmd *)0)->tensor),
    [NPU_OP_CONV2D] = sizeof(((struct npu_cmd *)0)->tensor),
    [NPU_OP_POOL2D] = sizeof(((struct npu_cmd *)0)->tensor),
    [NPU_OP_REQUANT] = sizeof(((struct npu_cmd *)0)->tensor),
    [NPU_OP_SIGNAL] = sizeof(((struct npu_cmd *)0)->sync),
    [NPU_OP_WAIT] = sizeof(((struct npu_cmd *)0)->sync),
    [NPU_OP_SELECT] = sizeof(((struct npu_cmd *)0)->tensor),
};

/* SIGNAL: store the 64-bit value, little endian, at an aligned VA. */
static uint32_t npu_exec_signal(NpuState *s, NpuWalk *w,
                                const struct npu_cmd *cmd)
{
    uint64_t va = le64_to_cpu(cmd->sync.va);
    uint64_t v = cpu_to_le64(le64_to_cpu(cmd->sync.value));

    if (va & 7) {
        npu_guest_error("npu: SIGNAL address 0x%" PRIx64
                        " is not 8-byte aligned\n", va);
        return NPU_ST_BAD_ARGS;
    }
    return npu_mem_write(s, w, va, &v, sizeof(v));
}

/*
 * WAIT: is the 64-bit value at the aligned VA at least sync.value? Sets
 * *ready; returns the status of the read.
 */
uint32_t npu_wait_ready(NpuState *s, NpuWalk *w, const struct npu_cmd *cmd,
                        bool *ready)
{
    uint64_t va = le64_to_cpu(cmd->sync.va);
    uint64_t v;
    uint32_t st;

    *ready = false;
    if (va & 7) {
        npu_guest_error("npu: WAIT address 0x%" PRIx64
                        " is not 8-byte aligned\n", va);
        return NPU_ST_BAD_ARGS;
    }
    st = npu_mem_read(s, w, va, &v, sizeof(v));
    *ready = st == NPU_ST_OK && le64_to_cpu(v) >= le64_to_cpu(cmd->sync.value);
    return st;
}

uint32_t npu_exec_cmd(NpuState *s, NpuWalk *w, const struct npu_cmd *cmd)
{
    if (cmd->opcode < NPU_OP_COUNT &&
        !buffer_is_zero((const uint8_t *)cmd->raw +
                        npu_payload_used[cmd->opcode],
                        sizeof(cmd->raw) - npu_payload_used[cmd->opcode])) {
        npu_guest_error("npu: opcode %u descriptor has"
                        " non-zero unused bytes\n", cmd->opcode);
        return NPU_ST_BAD_RESERVED;
    }

    switch (cmd->opcode) {
    case NPU_OP_NOP:
        return NPU_ST_OK;
    case NPU_OP_COPY:
        return npu_exec_copy(s, w, cmd);
    case NPU_OP_FILL:
        return npu_exec_fill(s, w, cmd);
    case NPU_OP_GEMM:
        return npu_exec_gemm(s, w, cmd);
    case NPU_OP_ELTWISE:
    case NPU_OP_UNARY:
    case NPU_OP_CONVERT:
    case NPU_OP_REDUCE:
    case NPU_OP_SOFTMAX:
    case NPU_OP_LAYERNORM:
    case NPU_OP_MATMUL:
    case NPU_OP_LINEAR:
    case NPU_OP_CONV2D:
    case NPU_OP_POOL2D:
    case NPU_OP_REQUANT:
    case NPU_OP_SELECT:
        return npu_exec_tensor(s, w, cmd);
    case NPU_OP_SIGNAL:
        return npu_exec_signal(s, w, cmd);
    case NPU_OP_WAIT:
        return NPU_ST_OK;   /* npu_process_one_locked() waited for it */
    default:
        npu_guest_error("npu: unknown opcode %u\n",
                        cmd->opcode);
        return NPU_ST_BAD_OPCODE;
    }
}
