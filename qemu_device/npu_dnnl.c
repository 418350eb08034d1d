/*
 * NPU kernels on oneDNN (libdnnl): float CONV2D, and int8 and bf16
 * MATMUL/LINEAR units (npu_dnnl_mm_*: one matmul on the operands' own
 * strided layouts, no reorders; int8 only on hosts with VNNI).
 *
 * A CONV2D tile is one image's convolution over a block of output channels
 * (or, grouped, a block of whole groups). Its oneDNN form is built once
 * per shape and kept in a small cache: the convolution primitive with the
 * layouts oneDNN prefers on this host CPU (blocked, e.g. nChw16c), and the
 * reorders between those and the device's plain layouts (the input's own
 * strides, OIHW weights, a contiguous NCHW fp32 result). A tile then runs
 * the reorders and the convolution on the calling core's thread alone
 * (oneDNN's OpenMP team is one thread there): the device's cores are its
 * parallelism. The fallback path's sgemm (npu_sgemm) is oneDNN's too.
 *
 * The arithmetic is fp32 products accumulated in fp32 (the accumulation
 * order is that of oneDNN's convolution kernel), plus the bias; the
 * caller applies the activation and the rounding to the output dtype, so
 * both paths share those. A shape oneDNN declines (or whose scratch would
 * exceed NPU_DNNL_SCRATCH_MAX) is remembered as declined, and the caller
 * runs im2col + BLAS instead.
 *
 * It builds against oneDNN 2 (Debian 12) and 3 (Debian 13): the few calls
 * whose form differs between them are behind the npu_dnnl_md_* and
 * npu_dnnl_*_pd helpers below, which make the same primitives either way.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/units.h"
#include "qemu/thread.h"
#include "qemu/memalign.h"
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include "npu_tensor_int.h"
#include "hw/misc/trace.h"

/* Cached shapes; the cache is emptied when it is full. */
#define NPU_DNNL_CACHE_MAX 512
/* Scratch of one tile (reordered input, weights, result, oneDNN's own). */
#define NPU_DNNL_SCRATCH_MAX (64 * MiB)
#define NPU_DNNL_ALIGN 64

/* A cache key: the op and its shape (the other shape all zero). */
typedef struct NpuDnnlKey {
    uint64_t op;                /* NPU_DNNL_CONV or NPU_DNNL_MM */
    NpuDnnlConvShape conv;
    NpuDnnlMmShape mm;
} NpuDnnlKey;

enum { NPU_DNNL_CONV, NPU_DNNL_MM };

/*
 * A memory descriptor, owned by whoever holds the NpuDnnlMd: in oneDNN 2 a
 * plain struct, copied by value; in oneDNN 3 a handle that must be
 * destroyed (npu_dnnl_md_free()). All zero on either: none (nothing to
 * free). The API takes either as an NpuDnnlMdRef: npu_dnnl_md().
 */
#if DNNL_VERSION_MAJOR >= 3
typedef dnnl_memory_desc_t NpuDnnlMd;
typedef const_dnnl_memory_desc_t NpuDnnlMdRef;

static NpuDnnlMdRef npu_dnnl_md(const NpuDnnlMd *md)
{
    return *md;
}
#else
typedef dnnl_memory_desc_t NpuDnnlMd;
typedef const dnnl_memory_desc_t *NpuDnnlMdRef;

static NpuDnnlMdRef npu_dnnl_md(const NpuDnnlMd *md)
{
    return md;
}
#endif

/*
 * A cached primitive: a convolution with its reorders, or a matmul on the
 * operands' own layouts (user[0..2]: a, b, c; no reorders).
 */
struct NpuDnnlPrim {
    NpuDnnlKey key;
    int refs;                   /* npu_dnnl.lock */
    bool declined;
    dnnl_primitive_t prim;
    dnnl_primitive_t reorder[3];    /* src, weights, dst; NULL: same layout */
    NpuDnnlMd user[4];              /* src, weights, dst, bias */
    NpuDnnlMd inner[3];             /* the convolution's src, weights, dst */
    NpuDnnlMd scratch_md;
    size_t off[4];                  /* in the scratch: src, weights, dst, own */
    size_t scratch;
};

enum { NPU_DNNL_SRC, NPU_DNNL_WT, NPU_DNNL_DST, NPU_DNNL_BIAS };

static struct {
    /*
     * @lock protects @cache and every entry's @refs: tiles of several
     * devices' commands look shapes up concurrently. Never held while a
     * primitive runs.
     */
    QemuMutex lock;
    GHashTable *cache;          /* NpuDnnlKey -> NpuDnnlPrim */
    dnnl_engine_t engine;
    bool broken;                /* no CPU engine: every shape is declined */
} npu_dnnl;

static guint npu_dnnl_shape_hash(gconstpointer key)
{
    const uint64_t *v = key;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;

    for (i = 0; i < sizeof(NpuDnnlKey) / sizeof(uint64_t); i++) {
        h = (h ^ v[i]) * 0x100000001b3ull;
    }
    return (guint)(h ^ (h >> 32));
}

static gboolean npu_dnnl_shape_equal(gconstpointer a, gconstpointer b)
{
    return !memcmp(a, b, sizeof(NpuDnnlKey));
}

/*
 * A descriptor of @dims in the layout @tag (npu_dnnl_md_tag) or @strides
 * (npu_dnnl_md_strides) into @md; false on error.
 */
static bool npu_dnnl_md_tag(NpuDnnlMd *md, int ndims, const dnnl_dims_t dims,
                            dnnl_data_type_t dt, dnnl_format_tag_t tag)
{
#if DNNL_VERSION_MAJOR >= 3
    return dnnl_memory_desc_create_with_tag(md, ndims, dims, dt, tag) ==
           dnnl_success;
#else
    return dnnl_memory_desc_init_by_tag(md, ndims, dims, dt, tag) ==
           dnnl_success;
#endif
}

static bool npu_dnnl_md_strides(NpuDnnlMd *md, int ndims,
                                const dnnl_dims_t dims, dnnl_data_type_t dt,
                                const dnnl_dims_t strides)
{
#if DNNL_VERSION_MAJOR >= 3
    return dnnl_memory_desc_create_with_strides(md, ndims, dims, dt,
                                                strides) == dnnl_success;
#else
    return dnnl_memory_desc_init_by_strides(md, ndims, dims, dt, strides) ==
           dnnl_success;
#endif
}

/* A copy of @from (NULL: a failed query) into @md; false on error. */
static bool npu_dnnl_md_copy(NpuDnnlMd *md, NpuDnnlMdRef from)
{
    if (!from) {
        return false;
    }
#if DNNL_VERSION_MAJOR >= 3
    return dnnl_memory_desc_clone(md, from) == dnnl_success;
#else
    *md = *from;
    return true;
#endif
}

/* A copy of @pd's descriptor @what into @md; false on error. */
static bool npu_dnnl_md_query(NpuDnnlMd *md, const_dnnl_primitive_desc_t pd,
                              dnnl_query_t what)
{
    return npu_dnnl_md_copy(md, dnnl_primitive_desc_query_md(pd, what, 0));
}

/* Free @md's descriptor, if any: it then holds none. */
static void npu_dnnl_md_free(NpuDnnlMd *md)
{
#if DNNL_VERSION_MAJOR >= 3
    if (*md) {
        dnnl_memory_desc_destroy(*md);
        *md = NULL;
    }
#else
    memset(md, 0, sizeof(*md));
#endif
}

static void npu_dnnl_prim_free(NpuDnnlPrim *c)
{
    int i;

    if (c->prim) {
        dnnl_primitive_destroy(c->prim);
    }
    for (i = 0; i < 3; i++) {
        if (c->reorder[i]) {
            dnnl_primitive_destroy(c->reorder[i]);
        }
        npu_dnnl_md_free(&c->inner[i]);
    }
    for (i = 0; i < 4; i++) {
        npu_dnnl_md_free(&c->user[i]);
    }
    npu_dnnl_md_free(&c->scratch_md);
    g_free(c);
}

/* Drop a reference; @lock held. */
static void npu_dnnl_unref_locked(NpuDnnlPrim *c)
{
    if (--c->refs == 0) {
        npu_dnnl_prim_free(c);
    }
}

static void npu_dnnl_cache_value_free(gpointer p)
{
    npu_dnnl_unref_locked(p);
}

/*
 * The shared primitive cache, made by the first device realized (BQL
 * held), not when the type is registered: listing devices allocates
 * nothing.
 */
void npu_dnnl_init(void)
{
    static bool done;

    if (done) {
        return;
    }
    done = true;
    qemu_mutex_init(&npu_dnnl.lock);
    npu_dnnl.cache = g_hash_table_new_full(npu_dnnl_shape_hash,
                                           npu_dnnl_shape_equal, NULL,
                                           npu_dnnl_cache_value_free);
}

/*
 * The device's sgemm: oneDNN's, which is thread-safe (each call has its own
 * scratch), run on the calling thread alone like every oneDNN call here.
 * It replaced Debian's serial OpenBLAS, whose buffer allocator has no lock
 * (docs/decisions.md). Should oneDNN fail (it allocates its packing buffers
 * per call), a plain loop computes the same products, so the op never
 * fails for it; the trace names the failure. @beta is 0 (c = product) or
 * 1 (c += product: the next block of K of a split call).
 */
static void npu_sgemm_beta(bool ta, bool tb, uint64_t m, uint64_t n,
                           uint64_t k, const float *a, uint64_t lda,
                           const float *b, uint64_t ldb, float beta, float *c,
                           uint64_t ldc)
{
    dnnl_status_t st;

    if (!m || !n) {
        return;
    }
    omp_set_num_threads(1);
    st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda,
                    b, ldb, beta, c, ldc);
    if (st == dnnl_success) {
        return;
    }
    trace_npu_dnnl_error("sgemm", st);
    for (uint64_t i = 0; i < m; i++) {
        for (uint64_t j = 0; j < n; j++) {
            float acc = 0.0f;

            for (uint64_t p = 0; p < k; p++) {
                acc += (ta ? a[p * lda + i] : a[i * lda + p]) *
                       (tb ? b[j * ldb + p] : b[p * ldb + j]);
            }
            c[i * ldc + j] = beta ? c[i * ldc + j] + acc : acc;
        }
    }
}

void npu_sgemm(bool ta, bool tb, uint64_t m, uint64_t n, uint64_t k,
               const float *a, uint64_t lda, const float *b, uint64_t ldb,
               float *c, uint64_t ldc)
{
    npu_sgemm_beta(ta, tb, m, n, k, a, lda, b, ldb, 0.0f, c, ldc);
}

void npu_sgemm_acc(bool ta, bool tb, uint64_t m, uint64_t n, uint64_t k,
                   const float *a, uint64_t lda, const float *b, uint64_t ldb,
                   float *c, uint64_t ldc)
{
    npu_sgemm_beta(ta, tb, m, n, k, a, lda, b, ldb, 1.0f, c, ldc);
}

/*
 * A primitive made from @pd (which is destroyed), or NULL; also NULL when
 * oneDNN chose its reference implementation ("ref:..."): naive loops, far
 * slower than the BLAS path that then runs instead.
 */
static dnnl_primitive_t npu_dnnl_make(dnnl_primitive_desc_t pd)
{
    dnnl_primitive_t p = NULL;
    const char *impl = NULL;

    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) ||
        !impl || g_str_has_prefix(impl, "ref") ||
        dnnl_primitive_create(&p, pd) != dnnl_success) {
        p = NULL;
    }
    dnnl_primitive_desc_destroy(pd);
    return p;
}

/* A user-scratchpad attribute, or NULL. */
static dnnl_primitive_attr_t npu_dnnl_attr(void)
{
    dnnl_primitive_attr_t attr;

    if (dnnl_primitive_attr_create(&attr) != dnnl_success) {
        return NULL;
    }
    if (dnnl_primitive_attr_set_scratchpad_mode(attr,
                                                dnnl_scratchpad_mode_user) !=
        dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        return NULL;
    }
    return attr;
}

/* The inference convolution on these descriptors, with @attr, into @pd. */
static dnnl_status_t npu_dnnl_conv_pd(dnnl_primitive_desc_t *pd,
                                      NpuDnnlMdRef src, NpuDnnlMdRef wt,
                                      NpuDnnlMdRef bias, NpuDnnlMdRef dst,
                                      const dnnl_dims_t strides,
                                      const dnnl_dims_t dil,
                                      const dnnl_dims_t pad_l,
                                      const dnnl_dims_t pad_r,
                                      const_dnnl_primitive_attr_t attr)
{
#if DNNL_VERSION_MAJOR >= 3
    return dnnl_convolution_forward_primitive_desc_create(
        pd, npu_dnnl.engine, dnnl_forward_inference, dnnl_convolution_direct,
        src, wt, bias, dst, strides, dil, pad_l, pad_r, attr);
#else
    dnnl_convolution_desc_t cd;
    dnnl_status_t st;

    st = dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference,
                                                    dnnl_convolution_direct,
                                                    src, wt, bias, dst,
                                                    strides, dil, pad_l,
                                                    pad_r);
    if (st != dnnl_success) {
        return st;
    }
    return dnnl_primitive_desc_create(pd, &cd, attr, npu_dnnl.engine, NULL);
#endif
}

/* The matmul @src @ @wt into @dst (no bias), with @attr, into @pd. */
static dnnl_status_t npu_dnnl_mm_pd(dnnl_primitive_desc_t *pd,
                                    NpuDnnlMdRef src, NpuDnnlMdRef wt,
                                    NpuDnnlMdRef dst,
                                    const_dnnl_primitive_attr_t attr)
{
#if DNNL_VERSION_MAJOR >= 3
    return dnnl_matmul_primitive_desc_create(pd, npu_dnnl.engine, src, wt,
                                             NULL, dst, attr);
#else
    dnnl_matmul_desc_t md;
    dnnl_status_t st;

    st = dnnl_matmul_desc_init(&md, src, wt, NULL, dst);
    if (st != dnnl_success) {
        return st;
    }
    return dnnl_primitive_desc_create(pd, &md, attr, npu_dnnl.engine, NULL);
#endif
}

/*
 * The reorder from @from to @to, if the layouts differ; false on failure.
 * Its scratchpad must be empty (no reorder between these layouts needs one).
 */
static bool npu_dnnl_reorder(dnnl_primitive_t *out, NpuDnnlMdRef from,
                             NpuDnnlMdRef to)
{
    dnnl_primitive_attr_t attr;
    dnnl_primitive_desc_t pd;
    NpuDnnlMdRef sp;
    dnnl_status_t st;

    *out = NULL;
    if (dnnl_memory_desc_equal(from, to)) {
        return true;
    }
    attr = npu_dnnl_attr();
    if (!attr) {
        return false;
    }
    st = dnnl_reorder_primitive_desc_create(&pd, from, npu_dnnl.engine, to,
                                            npu_dnnl.engine, attr);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) {
        return false;
    }
    sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (sp && dnnl_memory_desc_get_size(sp)) {
        dnnl_primitive_desc_destroy(pd);
        return false;
    }
    *out = npu_dnnl_make(pd);
    return *out != NULL;
}

/* Lay out @c's scratch: reordered operands, then the primitive's own. */
static bool npu_dnnl_scratch_plan(NpuDnnlPrim *c)
{
    size_t sz[4], total = 0;
    int i;

    for (i = 0; i < 3; i++) {
        sz[i] = c->reorder[i] ?
                dnnl_memory_desc_get_size(npu_dnnl_md(&c->inner[i])) : 0;
    }
    sz[3] = dnnl_memory_desc_get_size(npu_dnnl_md(&c->scratch_md));
    for (i = 0; i < 4; i++) {
        c->off[i] = total;
        total += ROUND_UP(sz[i], NPU_DNNL_ALIGN);
    }
    c->scratch = total;
    return total <= NPU_DNNL_SCRATCH_MAX;
}

/* The oneDNN form of a convolution; false when oneDNN declines it. */
static bool npu_dnnl_build_conv(NpuDnnlPrim *c)
{
    const NpuDnnlConvShape *k = &c->key.conv;
    int64_t og = k->o / k->g, cg = k->c / k->g;
    dnnl_dims_t src = { 1, k->c, k->h, k->w };
    dnnl_dims_t sst = { k->is[0], k->is[1], k->is[2], k->is[3] };
    dnnl_dims_t dst = { 1, k->o, k->oh, k->ow };
    dnnl_dims_t wt4 = { k->o, k->c, k->kh, k->kw };
    dnnl_dims_t wt5 = { k->g, og, cg, k->kh, k->kw };
    dnnl_dims_t bias = { k->o };
    dnnl_dims_t strides = { k->sh, k->sw };
    dnnl_dims_t dil = { k->dh - 1, k->dw - 1 };
    dnnl_dims_t pad_l = { k->ph, k->pw };
    dnnl_dims_t pad_r = {
        (int64_t)((k->oh - 1) * k->sh + (k->kh - 1) * k->dh + 1) -
        (int64_t)(k->h + k->ph),
        (int64_t)((k->ow - 1) * k->sw + (k->kw - 1) * k->dw + 1) -
        (int64_t)(k->w + k->pw),
    };
    dnnl_data_type_t dt = k->dtype == NPU_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
    NpuDnnlMd any[3] = {};      /* the convolution's: layouts left to it */
    dnnl_primitive_attr_t attr;
    dnnl_primitive_desc_t pd;
    dnnl_status_t st;
    bool ok = false;
    int i;

    if (pad_r[0] < 0 || pad_r[1] < 0) {
        return false;       /* trailing input rows unused: not expressible */
    }
    if (!npu_dnnl_md_strides(&c->user[NPU_DNNL_SRC], 4, src, dt, sst) ||
        !npu_dnnl_md_tag(&c->user[NPU_DNNL_DST], 4, dst, dnnl_f32,
                         dnnl_nchw) ||
        !npu_dnnl_md_tag(&c->user[NPU_DNNL_BIAS], 1, bias, dnnl_f32,
                         dnnl_x) ||
        !(k->g == 1 ?
          npu_dnnl_md_tag(&c->user[NPU_DNNL_WT], 4, wt4, dt, dnnl_oihw) :
          npu_dnnl_md_tag(&c->user[NPU_DNNL_WT], 5, wt5, dt, dnnl_goihw)) ||
        !npu_dnnl_md_tag(&any[0], 4, src, dt, dnnl_format_tag_any) ||
        !npu_dnnl_md_tag(&any[2], 4, dst, dnnl_f32, dnnl_format_tag_any) ||
        !(k->g == 1 ?
          npu_dnnl_md_tag(&any[1], 4, wt4, dt, dnnl_format_tag_any) :
          npu_dnnl_md_tag(&any[1], 5, wt5, dt, dnnl_format_tag_any))) {
        goto out;
    }
    attr = npu_dnnl_attr();
    if (!attr) {
        goto out;
    }
    st = npu_dnnl_conv_pd(&pd, npu_dnnl_md(&any[0]), npu_dnnl_md(&any[1]),
                          npu_dnnl_md(&c->user[NPU_DNNL_BIAS]),
                          npu_dnnl_md(&any[2]), strides, dil, pad_l, pad_r,
                          attr);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) {
        goto out;
    }
    if (!npu_dnnl_md_query(&c->inner[0], pd, dnnl_query_src_md) ||
        !npu_dnnl_md_query(&c->inner[1], pd, dnnl_query_weights_md) ||
        !npu_dnnl_md_query(&c->inner[2], pd, dnnl_query_dst_md) ||
        !npu_dnnl_md_query(&c->scratch_md, pd, dnnl_query_scratchpad_md)) {
        dnnl_primitive_desc_destroy(pd);
        goto out;
    }
    c->prim = npu_dnnl_make(pd);
    ok = c->prim &&
         npu_dnnl_reorder(&c->reorder[0], npu_dnnl_md(&c->user[NPU_DNNL_SRC]),
                          npu_dnnl_md(&c->inner[0])) &&
         npu_dnnl_reorder(&c->reorder[1], npu_dnnl_md(&c->user[NPU_DNNL_WT]),
                          npu_dnnl_md(&c->inner[1])) &&
         npu_dnnl_reorder(&c->reorder[2], npu_dnnl_md(&c->inner[2]),
                          npu_dnnl_md(&c->user[NPU_DNNL_DST])) &&
         npu_dnnl_scratch_plan(c);
out:
    for (i = 0; i < 3; i++) {
        npu_dnnl_md_free(&any[i]);
    }
    return ok;
}

/* A 2-D descriptor of @rows x @cols with strides @rs, @cs (0: dense). */
static bool npu_dnnl_matrix(NpuDnnlMd *md, uint64_t rows, uint64_t cols,
                            uint64_t rs, uint64_t cs, dnnl_data_type_t dt)
{
    dnnl_dims_t dims = { rows, cols };
    dnnl_dims_t strides = { rs ? rs : cols * (cs ? cs : 1), cs ? cs : 1 };

    return npu_dnnl_md_strides(md, 2, dims, dt, strides);
}

/*
 * Does the host have VNNI (AVX512-VNNI or AVX-VNNI)? Without it oneDNN's
 * int8 kernels multiply with vpmaddubsw, whose int16 pair sums saturate:
 * not exact for s8 x s8.
 */
static bool npu_dnnl_has_vnni(void)
{
    unsigned isa = dnnl_get_effective_cpu_isa();
    unsigned vnni512 = dnnl_cpu_isa_avx512_core_vnni &
                       ~dnnl_cpu_isa_avx512_core;
    unsigned vnni256 = dnnl_cpu_isa_avx2_vnni & ~dnnl_cpu_isa_avx2;

    return isa & (vnni512 | vnni256);
}

/* The oneDNN form of a matmul; false when oneDNN declines it. */
static bool npu_dnnl_build_mm(NpuDnnlPrim *c)
{
    const NpuDnnlMmShape *k = &c->key.mm;
    bool quant = k->dtype == NPU_DTYPE_INT8;
    dnnl_data_type_t dt = quant ? dnnl_s8 : dnnl_bf16;
    dnnl_primitive_attr_t attr;
    dnnl_primitive_desc_t pd;
    dnnl_status_t st;

    if ((quant && !npu_dnnl_has_vnni()) ||
        !npu_dnnl_matrix(&c->user[0], k->m, k->k, k->as[0], k->as[1], dt) ||
        !npu_dnnl_matrix(&c->user[1], k->k, k->n, k->bs[0], k->bs[1], dt) ||
        !npu_dnnl_matrix(&c->user[2], k->m, k->n, 0, 0,
                         quant ? dnnl_s32 : dnnl_f32)) {
        return false;
    }
    attr = npu_dnnl_attr();
    if (!attr) {
        return false;
    }
    st = npu_dnnl_mm_pd(&pd, npu_dnnl_md(&c->user[0]),
                        npu_dnnl_md(&c->user[1]), npu_dnnl_md(&c->user[2]),
                        attr);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) {
        return false;
    }
    /* No reorders: the operands' layouts. */
    if (!npu_dnnl_md_query(&c->scratch_md, pd, dnnl_query_scratchpad_md) ||
        !npu_dnnl_md_copy(&c->inner[0], npu_dnnl_md(&c->user[0])) ||
        !npu_dnnl_md_copy(&c->inner[1], npu_dnnl_md(&c->user[1])) ||
        !npu_dnnl_md_copy(&c->inner[2], npu_dnnl_md(&c->user[2]))) {
        dnnl_primitive_desc_destroy(pd);
        return false;
    }
    c->prim = npu_dnnl_make(pd);
    return c->prim && npu_dnnl_scratch_plan(c);
}

/* The cached primitive of @key (a reference), or NULL: declined. */
static NpuDnnlPrim *npu_dnnl_get(const NpuDnnlKey *key)
{
    NpuDnnlPrim *c;

    qemu_mutex_lock(&npu_dnnl.lock);
    c = g_hash_table_lookup(npu_dnnl.cache, key);
    if (!c) {
        if (!npu_dnnl.engine && !npu_dnnl.broken &&
            dnnl_engine_create(&npu_dnnl.engine, dnnl_cpu, 0) != dnnl_success) {
            npu_dnnl.broken = true;
        }
        c = g_new0(NpuDnnlPrim, 1);
        c->key = *key;
        c->refs = 1;                    /* the cache's */
        omp_set_num_threads(1);         /* the blocking is for one thread */
        c->declined = npu_dnnl.broken ||
                      !(key->op == NPU_DNNL_CONV ? npu_dnnl_build_conv(c) :
                        npu_dnnl_build_mm(c));
        if (key->op == NPU_DNNL_CONV) {
            trace_npu_dnnl_conv_build(key->conv.c, key->conv.h, key->conv.w,
                                      key->conv.o, key->conv.kh, key->conv.kw,
                                      key->conv.g, c->declined, c->scratch);
        } else {
            trace_npu_dnnl_mm_build(key->mm.dtype, key->mm.m, key->mm.k,
                                    key->mm.n, c->declined, c->scratch);
        }
        if (g_hash_table_size(npu_dnnl.cache) >= NPU_DNNL_CACHE_MAX) {
            g_hash_table_remove_all(npu_dnnl.cache);
        }
        g_hash_table_insert(npu_dnnl.cache, &c->key, c);
    }
    if (c->declined) {
        c = NULL;
    } else {
        c->refs++;
    }
    qemu_mutex_unlock(&npu_dnnl.lock);
    return c;
}

NpuDnnlPrim *npu_dnnl_conv_get(const NpuDnnlConvShape *shape)
{
    NpuDnnlKey key = { .op = NPU_DNNL_CONV, .conv = *shape };

    return npu_dnnl_get(&key);
}

NpuDnnlPrim *npu_dnnl_mm_get(const NpuDnnlMmShape *shape)
{
    NpuDnnlKey key = { .op = NPU_DNNL_MM, .mm = *shape };

    return npu_dnnl_get(&key);
}

void npu_dnnl_put(NpuDnnlPrim *c)
{
    if (c) {
        qemu_mutex_lock(&npu_dnnl.lock);
        npu_dnnl_unref_locked(c);
        qemu_mutex_unlock(&npu_dnnl.lock);
    }
}

/* Run @p on (@n pairs of) @args; false on failure. */
static bool npu_dnnl_exec(dnnl_primitive_t p, dnnl_stream_t stream, int n,
                          const dnnl_exec_arg_t *args)
{
    dnnl_status_t st = dnnl_primitive_execute(p, stream, n, args);

    if (st != dnnl_success) {
        trace_npu_dnnl_error("execute", st);
    }
    return st == dnnl_success;
}

/*
 * Run @c on the user buffers @user (src, weights, dst and, for a
 * convolution, bias) on the calling thread, reordering through @core's
 * scratch where @c's layouts differ from the user's.
 */
static bool npu_dnnl_run(NpuDnnlPrim *c, NpuCore *core, const void **user)
{
    int nuser = c->key.op == NPU_DNNL_CONV ? 4 : 3;
    dnnl_memory_t m[4] = { NULL }, inner[3] = { NULL }, sp = NULL;
    dnnl_stream_t stream = NULL;
    uint8_t *scratch = npu_core_scratch(core, c->scratch);
    bool ok = false;
    int i;

    if (!scratch) {
        return false;
    }
    omp_set_num_threads(1);
    if (dnnl_stream_create(&stream, npu_dnnl.engine,
                           dnnl_stream_default_flags)) {
        return false;
    }
    for (i = 0; i < nuser; i++) {
        if (dnnl_memory_create(&m[i], npu_dnnl_md(&c->user[i]),
                               npu_dnnl.engine, (void *)user[i])) {
            goto out;
        }
    }
    for (i = 0; i < 3; i++) {
        if (dnnl_memory_create(&inner[i], npu_dnnl_md(&c->inner[i]),
                               npu_dnnl.engine,
                               c->reorder[i] ? scratch + c->off[i] :
                               (void *)user[i])) {
            goto out;
        }
    }
    if (dnnl_memory_create(&sp, npu_dnnl_md(&c->scratch_md), npu_dnnl.engine,
                           scratch + c->off[3])) {
        goto out;
    }
    for (i = 0; i < 2; i++) {
        dnnl_exec_arg_t args[] = {
            { DNNL_ARG_FROM, m[i] }, { DNNL_ARG_TO, inner[i] },
        };

        if (c->reorder[i] && !npu_dnnl_exec(c->reorder[i], stream, 2, args)) {
            goto out;
        }
    }
    {
        dnnl_exec_arg_t args[] = {
            { DNNL_ARG_SRC, inner[0] }, { DNNL_ARG_WEIGHTS, inner[1] },
            { DNNL_ARG_DST, inner[2] }, { DNNL_ARG_SCRATCHPAD, sp },
            { DNNL_ARG_BIAS, m[NPU_DNNL_BIAS] },
        };
        dnnl_exec_arg_t back[] = {
            { DNNL_ARG_FROM, inner[2] }, { DNNL_ARG_TO, m[NPU_DNNL_DST] },
        };

        ok = npu_dnnl_exec(c->prim, stream, nuser + 1, args) &&
             (!c->reorder[2] ||
              npu_dnnl_exec(c->reorder[2], stream, 2, back)) &&
             dnnl_stream_wait(stream) == dnnl_success;
    }
out:
    for (i = 0; i < 4; i++) {
        dnnl_memory_destroy(m[i]);
    }
    for (i = 0; i < 3; i++) {
        dnnl_memory_destroy(inner[i]);
    }
    dnnl_memory_destroy(sp);
    dnnl_stream_destroy(stream);
    return ok;
}

bool npu_dnnl_conv_run(NpuDnnlPrim *c, NpuCore *core, const void *in,
                       const void *wt, const float *bias, float *out)
{
    const void *user[4] = { in, wt, out, bias };

    return npu_dnnl_run(c, core, user);
}

bool npu_dnnl_mm_run(NpuDnnlPrim *c, NpuCore *core, const void *a,
                     const void *b, void *out)
{
    const void *user[3] = { a, b, out };

    return npu_dnnl_run(c, core, user);
}
