/*
 * NPU trace ring (NPU_CAP_TRACE): the firmware's scheduler and the engines
 * log what they do - a descriptor fetched, a command started and ended on
 * the command processor or an AI core, a tile, a transfer, a completion
 * written, an interrupt, a mailbox request and its answer - with the
 * device clock, into a ring of records in host memory that the driver
 * drains (docs/npu-spec.md 4.8).
 *
 * Every engine thread logs for the command it works on: the thread's
 * NpuTraceCtx, set by npu_trace_enter() when a command or a tile of it
 * starts on the thread, names the queue, the fence and the core.
 *
 * A record takes its slot and its timestamp under the ring's lock, so the
 * ring is in time order, and is written outside it (one DMA write, to RAM
 * only: npu_dma_write()), so no lock is held across a DMA that an IOMMU
 * might make wait for the BQL. HEAD moves over the slots taken once no
 * write is in flight: a reader never sees a slot before its record. Nothing
 * logs with the device lock held.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/atomic.h"
#include "qemu/log.h"
#include "qemu/main-loop.h"
#include "npu_dev.h"
#include "hw/misc/trace.h"

/* The command this thread works on; the command processor's by default. */
static __thread NpuTraceCtx npu_trace_ctx = {
    .queue = NPU_TRACE_NO_QUEUE, .core = NPU_TRACE_CORE_CP,
};

void npu_trace_init(NpuState *s)
{
    qemu_mutex_init(&s->trace_lock);
    qemu_cond_init(&s->trace_idle);
    s->trace_mask = (1u << NPU_TR_KINDS) - 2;  /* every kind */
}

void npu_trace_fini(NpuState *s)
{
    qemu_cond_destroy(&s->trace_idle);
    qemu_mutex_destroy(&s->trace_lock);
}

/* An empty ring; writes in flight go nowhere. Caller holds trace_lock. */
static void npu_trace_empty(NpuState *s)
{
    s->trace_head = 0;
    s->trace_tail = 0;
    s->trace_reserved = 0;
    s->trace_writing = 0;
    s->trace_failed = false;
    s->trace_gen++;
}

/*
 * Wait until no record write is in flight, of any generation (trace_lock
 * held; with @dev_locked the device lock too, taken before it). Tracing is
 * off by then: after this, nothing lands in the ring the guest may now
 * free. A record write needs trace_lock only, so the wait is one record's
 * copy; a caller under the BQL lets it go all the same, as every wait for
 * the engine does (docs/npu-spec.md 12).
 */
static void npu_trace_quiesce(NpuState *s, bool dev_locked)
{
    bool bql;

    if (!s->trace_inflight) {
        return;
    }
    bql = bql_locked();
    if (bql) {
        qemu_mutex_unlock(&s->trace_lock);
        if (dev_locked) {
            qemu_mutex_unlock(&s->lock);
        }
        bql_unlock();
        qemu_mutex_lock(&s->trace_lock);
    }
    while (s->trace_inflight) {
        qemu_cond_wait(&s->trace_idle, &s->trace_lock);
    }
    if (bql) {
        qemu_mutex_unlock(&s->trace_lock);
        bql_lock();
        if (dev_locked) {
            qemu_mutex_lock(&s->lock);
        }
        qemu_mutex_lock(&s->trace_lock);
    }
}

/* A system reset or D3hot: tracing off, the ring forgotten. */
void npu_trace_reset(NpuState *s)
{
    qemu_mutex_lock(&s->trace_lock);
    qatomic_set(&s->trace_on, false);
    npu_trace_quiesce(s, false);
    s->trace_base = 0;
    s->trace_size = 0;
    s->trace_dropped = 0;
    s->trace_mask = (1u << NPU_TR_KINDS) - 2;
    npu_trace_empty(s);
    qemu_mutex_unlock(&s->trace_lock);
}

NpuTraceCtx npu_trace_current(void)
{
    return npu_trace_ctx;
}

NpuTraceCtx npu_trace_enter(uint8_t queue, uint64_t fence)
{
    NpuTraceCtx saved = npu_trace_ctx;

    npu_trace_ctx.queue = queue;
    npu_trace_ctx.fence = fence;
    return saved;
}

void npu_trace_leave(NpuTraceCtx saved)
{
    npu_trace_ctx = saved;
}

/* This thread is AI core @core (its thread's start). */
void npu_trace_set_core(uint8_t core)
{
    npu_trace_ctx.core = core;
}

void npu_trace_ev(NpuState *s, uint32_t kind, uint8_t queue, uint8_t core,
                  uint64_t fence, uint32_t arg32, uint64_t arg)
{
    struct npu_trace_rec rec;
    uint64_t addr;
    uint32_t gen;
    bool ok;

    if (!qatomic_read(&s->trace_on)) {
        return;
    }
    if (s->chip && kind >= NPU_TR_TILE_START && kind <= NPU_TR_DMA_END) {
        return;     /* the timing model has no time for parts of a command */
    }
    qemu_mutex_lock(&s->trace_lock);
    if (!s->trace_on || !(s->trace_mask & (1u << kind))) {
        qemu_mutex_unlock(&s->trace_lock);
        return;
    }
    if (s->trace_reserved - s->trace_tail >= s->trace_size) {
        s->trace_dropped++;
        qemu_mutex_unlock(&s->trace_lock);
        return;
    }
    addr = s->trace_base + (uint64_t)(s->trace_reserved & (s->trace_size - 1)) *
           sizeof(rec);
    s->trace_reserved++;
    s->trace_writing++;
    s->trace_inflight++;
    gen = s->trace_gen;
    rec.ts = cpu_to_le64(npu_dev_clock(s));
    qemu_mutex_unlock(&s->trace_lock);

    rec.kind = cpu_to_le16(kind);
    rec.queue = queue;
    rec.core = core;
    rec.arg32 = cpu_to_le32(arg32);
    rec.fence = cpu_to_le64(fence);
    rec.arg = cpu_to_le64(arg);
    ok = npu_dma_write(s, "trace", addr, &rec, sizeof(rec)) == MEMTX_OK;

    qemu_mutex_lock(&s->trace_lock);
    if (!--s->trace_inflight) {
        qemu_cond_broadcast(&s->trace_idle);
    }
    if (gen == s->trace_gen) {
        s->trace_failed |= !ok;
        if (!--s->trace_writing) {
            if (s->trace_failed) {
                /* The batch is not published: its slots may hold anything. */
                npu_guest_error("npu: trace ring write failed;"
                                " tracing off\n");
                trace_npu_trace_bad_ring(s->trace_base, s->trace_size);
                s->trace_dropped += s->trace_reserved - s->trace_head;
                s->trace_reserved = s->trace_head;
                s->trace_failed = false;
                qatomic_set(&s->trace_on, false);
            } else {
                s->trace_head = s->trace_reserved;
            }
        }
    }
    qemu_mutex_unlock(&s->trace_lock);
}

/* An event of the command this thread works on. */
void npu_trace(NpuState *s, uint32_t kind, uint32_t arg32, uint64_t arg)
{
    npu_trace_ev(s, kind, npu_trace_ctx.queue, npu_trace_ctx.core,
                 npu_trace_ctx.fence, arg32, arg);
}

uint32_t npu_trace_read_locked(NpuState *s, hwaddr off)
{
    uint32_t val = 0;

    qemu_mutex_lock(&s->trace_lock);
    switch (off) {
    case NPU_TRACE_CONTROL:
        val = s->trace_on ? NPU_TRACE_ENABLE : 0;
        break;
    case NPU_TRACE_RING_LO:
        val = (uint32_t)s->trace_base;
        break;
    case NPU_TRACE_RING_HI:
        val = s->trace_base >> 32;
        break;
    case NPU_TRACE_RING_SIZE:
        val = s->trace_size;
        break;
    case NPU_TRACE_HEAD:
        val = s->trace_head;
        break;
    case NPU_TRACE_TAIL:
        val = s->trace_tail;
        break;
    case NPU_TRACE_DROPPED:
        val = s->trace_dropped;
        break;
    case NPU_TRACE_MASK:
        val = s->trace_mask;
        break;
    default:
        npu_guest_error("npu: read of unknown register 0x%"
                        HWADDR_PRIx "\n", NPU_TRACE_BASE + off);
        break;
    }
    qemu_mutex_unlock(&s->trace_lock);
    return val;
}

/* Is the ring as programmed one tracing may start on? */
static bool npu_trace_ring_ok(NpuState *s)
{
    uint64_t bytes = (uint64_t)s->trace_size * sizeof(struct npu_trace_rec);

    if (s->trace_size < NPU_TRACE_MIN_RECORDS ||
        s->trace_size > NPU_TRACE_MAX_RECORDS ||
        (s->trace_size & (s->trace_size - 1))) {
        npu_guest_error("npu: trace ring of %u records\n",
                        s->trace_size);
        trace_npu_trace_bad_ring(s->trace_base, s->trace_size);
        return false;
    }
    if (s->trace_base % 32 ||
        !npu_dma_range_ok_locked(s, s->trace_base, bytes, true)) {
        npu_guest_error("npu: trace ring at 0x%" PRIx64
                        " is misaligned or not in RAM\n", s->trace_base);
        trace_npu_trace_bad_ring(s->trace_base, s->trace_size);
        return false;
    }
    return true;
}

void npu_trace_write_locked(NpuState *s, hwaddr off, uint32_t val)
{
    qemu_mutex_lock(&s->trace_lock);
    switch (off) {
    case NPU_TRACE_CONTROL:
        if (val & ~NPU_TRACE_ENABLE) {
            npu_guest_error("npu: unknown trace control bits"
                            " 0x%x\n", val);
            trace_npu_trace_bad_write(off, val);
            break;
        }
        if ((val & NPU_TRACE_ENABLE) && !s->trace_on &&
            !npu_trace_ring_ok(s)) {
            break;
        }
        qatomic_set(&s->trace_on, !!(val & NPU_TRACE_ENABLE));
        if (!s->trace_on) {
            npu_trace_quiesce(s, true);
        }
        trace_npu_trace_control(s->trace_on, s->trace_head, s->trace_tail);
        break;
    case NPU_TRACE_RING_LO:
    case NPU_TRACE_RING_HI:
    case NPU_TRACE_RING_SIZE:
        if (s->trace_on) {
            npu_guest_error("npu: trace ring moved while"
                            " tracing\n");
            trace_npu_trace_bad_write(off, val);
            break;
        }
        if (off == NPU_TRACE_RING_LO) {
            s->trace_base = deposit64(s->trace_base, 0, 32, val);
        } else if (off == NPU_TRACE_RING_HI) {
            s->trace_base = deposit64(s->trace_base, 32, 32, val);
        } else {
            s->trace_size = val;
        }
        npu_trace_empty(s);     /* a new ring starts empty */
        break;
    case NPU_TRACE_TAIL:
        if (val - s->trace_tail > s->trace_head - s->trace_tail) {
            npu_guest_error("npu: trace tail %u outside"
                            " [%u, %u]\n", val, s->trace_tail, s->trace_head);
            trace_npu_trace_bad_write(off, val);
            break;
        }
        s->trace_tail = val;
        break;
    case NPU_TRACE_MASK:
        s->trace_mask = val & ((1u << NPU_TR_KINDS) - 2);
        break;
    default:
        npu_guest_error("npu: write of 0x%x to read-only or"
                        " unknown register 0x%" HWADDR_PRIx "\n", val,
                        NPU_TRACE_BASE + off);
        trace_npu_trace_bad_write(off, val);
        break;
    }
    qemu_mutex_unlock(&s->trace_lock);
}
