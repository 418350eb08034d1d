/*
 * NPU PCI device model: PCI identity, BAR0 registers, doorbells, MSI-X and
 * the command processor thread. Command execution is in npu_exec.c.
 * The register map is include/npu_hw.h; docs/npu-spec.md describes it.
 *
 * Threads: MMIO runs on the vCPU thread under the BQL; descriptors are
 * fetched and executed on the device's own worker thread, which never takes
 * the BQL: all its DMA is to RAM only (npu_mmu.c), so no access it makes
 * can reach a register of any device and need the BQL. Interrupts are
 * raised from a bottom half (main loop, BQL held). A reset, an unplug or a
 * VM stop waits for the engine only at its control points (npu_cores.c),
 * which come at least every few milliseconds of work.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/units.h"
#include "qemu/log.h"
#include "qemu/main-loop.h"
#include "qemu/module.h"
#include "qemu/timer.h"
#include "qapi/error.h"
#include "hw/pci/pci.h"
#include "hw/pci/msix.h"
#include "hw/qdev-properties.h"
#include "hw/misc/trace.h"
#include "migration/vmstate.h"
#include "qemu/atomic.h"
#include "npu_dev.h"

uint64_t npu_now_ns(void)
{
    return qemu_clock_get_ns(QEMU_CLOCK_VIRTUAL);
}

/* Interrupts ---------------------------------------------------------- */

/* Level of the legacy INTx line; MSI-X is edge-signalled from the BH. */
static void npu_update_intx_locked(NpuState *s)
{
    PCIDevice *pdev = PCI_DEVICE(s);

    if (!msix_enabled(pdev)) {
        pci_set_irq(pdev, (s->irq_status & s->irq_mask) != 0);
    }
}

static void npu_irq_bh(void *opaque)
{
    NpuState *s = opaque;
    PCIDevice *pdev = PCI_DEVICE(s);
    uint64_t done[NPU_NUM_QUEUES];
    uint32_t fire;
    int q;

    qemu_mutex_lock(&s->lock);
    if (s->paused) {
        /* A stopped VM gets no interrupt: the resume reschedules us. */
        qemu_mutex_unlock(&s->lock);
        return;
    }
    fire = s->irq_fire & s->irq_mask;
    s->irq_fire &= ~fire;
    npu_update_intx_locked(s);
    for (q = 0; q < NPU_NUM_QUEUES; q++) {
        done[q] = s->q[q].done_fence;
    }
    qemu_mutex_unlock(&s->lock);

    if (!msix_enabled(pdev)) {
        /* INTx: the level was set above (trace record arg32: no vector). */
        for (q = 0; q < NPU_NUM_QUEUES; q++) {
            if (fire & NPU_IRQ_QUEUE(q)) {
                npu_trace_ev(s, NPU_TR_IRQ, q, NPU_TRACE_CORE_CP, done[q],
                             NPU_TRACE_INTX, 0);
            }
        }
        return;
    }
    if (!fire) {
        return;
    }
    if (fire & (NPU_IRQ_ERROR | NPU_IRQ_MBOX)) {
        trace_npu_irq(NPU_VEC_DEVICE);
        msix_notify(pdev, NPU_VEC_DEVICE);
    }
    for (q = 0; q < NPU_NUM_QUEUES; q++) {
        if (fire & NPU_IRQ_QUEUE(q)) {
            trace_npu_irq(NPU_VEC_QUEUE(q));
            msix_notify(pdev, NPU_VEC_QUEUE(q));
            npu_trace_ev(s, NPU_TR_IRQ, q, NPU_TRACE_CORE_CP, done[q],
                         NPU_VEC_QUEUE(q), 0);
        }
    }
}

/* Latch interrupt status bits and signal them from the bottom half. */
void npu_raise_locked(NpuState *s, uint32_t bits)
{
    s->irq_status |= bits;
    s->irq_fire |= bits;
    qemu_bh_schedule(s->irq_bh);
}

/* Signal queue @qi's completion interrupt for everything held so far. */
static void npu_queue_irq_locked(NpuState *s, int qi)
{
    NpuQueue *q = &s->q[qi];

    q->irq_held = 0;
    timer_del(s->irq_timer[qi].timer);
    if (s->inject & NPU_INJECT_DROP_IRQ) {
        s->inject &= ~NPU_INJECT_DROP_IRQ;
        trace_npu_inject(qi, NPU_INJECT_DROP_IRQ);
        return;
    }
    q->irqs++;
    npu_raise_locked(s, NPU_IRQ_QUEUE(qi));
}

/*
 * A completion that wants an interrupt. Without moderation it is signalled
 * at once. With it, it is held until irq_count are held, the queue has no
 * more work (so an isolated op is never delayed), or irq_delay_us passed
 * since the first held one (0: no timer; the count or the idle queue end
 * the wait).
 */
static void npu_queue_completed_locked(NpuState *s, int qi)
{
    NpuQueue *q = &s->q[qi];

    q->irq_held++;
    if (q->irq_count <= 1 || q->irq_held >= q->irq_count ||
        q->head == q->tail) {
        npu_queue_irq_locked(s, qi);
    } else if (q->irq_held == 1 && q->irq_delay_us) {
        timer_mod(s->irq_timer[qi].timer,
                  qemu_clock_get_ns(QEMU_CLOCK_VIRTUAL) +
                  (int64_t)q->irq_delay_us * 1000);
    }
}

/* The moderation delay passed: signal what the queue holds. */
static void npu_irq_timer_cb(void *opaque)
{
    NpuIrqTimer *t = opaque;
    NpuState *s = t->s;

    qemu_mutex_lock(&s->lock);
    if (s->q[t->qi].irq_held) {
        npu_queue_irq_locked(s, t->qi);
    }
    qemu_mutex_unlock(&s->lock);
}

static void npu_queue_error_locked(NpuState *s, int qi, uint32_t err)
{
    s->q[qi].status |= NPU_QSTAT_STOPPED;
    s->q[qi].error = err;
    s->error = err;
    trace_npu_queue_error(qi, err);
    npu_raise_locked(s, NPU_IRQ_ERROR);
}

/* Waiting for the engine ----------------------------------------------- */

typedef bool NpuEngineDone(NpuState *s, int arg);

/*
 * Wait on @cond, with the lock held, until @done(s, arg). Whoever waits
 * for the engine under the BQL (a reset, a power-state write, VM stop,
 * unplug, a queue disable: all run under it) lets the BQL go while it
 * waits and takes it back, before the device lock, when done. So nothing
 * that may need the BQL (vCPUs, iothreads, the vIOMMU reporting a fault
 * for an engine access) ever waits behind the engine, and the lock order
 * stays the BQL, then the device lock; the engine itself never takes the
 * BQL (npu_mmu.c). The device's state may change while the locks are
 * down: callers look at it again afterwards (docs/npu-spec.md 12).
 */
static void npu_wait_engine_locked(NpuState *s, const char *what,
                                   QemuCond *cond, NpuEngineDone *done,
                                   int arg)
{
    int64_t t0;
    bool bql;

    if (done(s, arg)) {
        return;
    }
    t0 = get_clock();
    bql = bql_locked();
    if (bql) {
        qemu_mutex_unlock(&s->lock);
        bql_unlock();
        qemu_mutex_lock(&s->lock);
    }
    while (!done(s, arg)) {
        qemu_cond_wait(cond, &s->lock);
    }
    if (bql) {
        qemu_mutex_unlock(&s->lock);
        bql_lock();
        qemu_mutex_lock(&s->lock);
    }
    trace_npu_engine_wait(what, (get_clock() - t0) / SCALE_US, bql);
}

static bool npu_fw_log_quiet(NpuState *s, int arg)
{
    return !s->fw_log_writing;
}

/*
 * Wait until no firmware log line is being written: after this, nothing
 * lands in the ring the guest may move or free.
 */
static void npu_fw_log_quiesce_locked(NpuState *s)
{
    npu_wait_engine_locked(s, "firmware log", &s->log_idle,
                           npu_fw_log_quiet, 0);
}

/* Soft reset ----------------------------------------------------------- */

static bool npu_cpl_quiet(NpuState *s, int qi)
{
    return !s->q[qi].cpl_writing;
}

/*
 * Wait until no completion of queue @qi is being written: after this, and
 * a generation bump, nothing of the queue's old configuration is written.
 */
static void npu_queue_quiesce_locked(NpuState *s, int qi)
{
    npu_wait_engine_locked(s, "completion write", &s->cpl_done,
                           npu_cpl_quiet, qi);
}

/* Disable queue @qi and clear its state (no command of it runs). */
void npu_queue_reset_locked(NpuState *s, int qi)
{
    uint32_t gen = s->q[qi].gen;

    npu_queue_quiesce_locked(s, qi);
    memset(&s->q[qi], 0, sizeof(s->q[qi]));
    s->q[qi].gen = gen + 1;
    timer_del(s->irq_timer[qi].timer);
}

/*
 * A soft reset: the engine, the queues, the MMU and interrupt state. A
 * running firmware keeps running (and its log); a crashed one is gone.
 */
static void npu_reset_state_locked(NpuState *s)
{
    int qi;

    for (qi = 0; qi < NPU_NUM_QUEUES; qi++) {
        npu_queue_reset_locked(s, qi);
    }
    if (s->fw_state != NPU_FW_RUNNING) {
        s->fw_state = NPU_FW_OFF;
        s->fw_version = 0;
        s->fw_opcodes = 0;
        s->fw_queues = 0;
    } else if (!s->boot_rom || s->fw_version) {
        s->fw_queues = 1;   /* the firmware's scheduler starts afresh */
    }
    s->last_queue = 0;
    s->control = 0;
    s->irq_status = 0;
    s->irq_mask = 0;
    s->irq_fire = 0;
    s->error = NPU_ERR_NONE;
    s->scratch = 0;
    s->inject = 0;
    s->hung = false;
    s->ts_hi_latch = 0;
    s->mmu_control = 0;
    s->mmu_l1_base = 0;
    s->mmu_l1_entries = 0;
    s->mmu_fault_addr = 0;
    s->mmu_fault_info = 0;
    s->mmu_fault_queue = 0;
    s->mmu_fault_ctx = 0;
    s->mmu_faults = 0;
    s->mmu_ctx_base = 0;
    s->mmu_ctx_count = 0;
}

static bool npu_reset_done(NpuState *s, int arg)
{
    return !s->reset_pending || s->stop;    /* no worker resets after stop */
}

/*
 * Ask the worker to reset the device. The running command is aborted at
 * its next control point (never in the middle of a DMA transfer), so the
 * reset is done within one poll quantum. With @wait, block until it is.
 */
static void npu_request_reset(NpuState *s, bool wait)
{
    qemu_mutex_lock(&s->lock);
    trace_npu_reset(wait);
    s->reset_pending = true;
    qatomic_set(&s->abort, true);   /* the running command stops at once */
    qemu_cond_broadcast(&s->cond);
    qemu_cond_broadcast(&s->resume);
    if (wait) {
        npu_wait_engine_locked(s, "reset", &s->reset_done, npu_reset_done, 0);
    }
    qemu_mutex_unlock(&s->lock);
}

/* Command processor ---------------------------------------------------- */

static bool npu_queue_runnable_locked(NpuState *s, NpuQueue *q)
{
    return (s->control & NPU_CONTROL_ENABLE) && (q->ctrl & NPU_QCTL_ENABLE) &&
           !(q->status & (NPU_QSTAT_STOPPED | NPU_QSTAT_ACTIVE)) &&
           q->head != q->tail &&
           !q->blocked && s->fw_state == NPU_FW_RUNNING &&
           (s->fw_queues & (1u << (q - s->q)));
}

/*
 * Validate and run one fetched descriptor (any engine thread, no lock):
 * fills in @m->cpl, or sets @m->blocked for a WAIT that must look again.
 */
static void npu_member_exec(NpuState *s, int qi, NpuMember *m)
{
    struct npu_cmd *cmd = &m->cmd;
    uint32_t inject = m->inject;
    NpuTraceCtx saved = npu_trace_enter(qi, cmd->fence);
    bool modelled = s->chip && cmd->opcode != NPU_OP_WAIT;
    uint64_t t_start = npu_dev_clock(s), end_arg = 0;
    uint32_t status;

    memset(&m->cpl, 0, sizeof(m->cpl));
    m->cpl.t_start = cpu_to_le64(t_start);
    if (modelled) {
        npu_timing_start(s, t_start);
    }
    trace_npu_cmd_start(qi, m->idx, cmd->opcode, cmd->fence);
    npu_trace(s, NPU_TR_CMD_START, cmd->opcode, 0);
    if (inject && ((cmd->flags & ~NPU_CMD_F_MASK) || cmd->rsvd0)) {
        /* A malformed descriptor is not a command: keep the fault armed. */
        qemu_mutex_lock(&s->lock);
        s->inject |= inject;
        qemu_mutex_unlock(&s->lock);
        inject = 0;
    }
    if (cmd->flags & ~NPU_CMD_F_MASK) {
        npu_guest_error("npu: unknown descriptor flags 0x%x\n",
                        cmd->flags);
        status = NPU_ST_BAD_FLAGS;
    } else if (cmd->rsvd0) {
        npu_guest_error("npu: descriptor reserved field set\n");
        status = NPU_ST_BAD_RESERVED;
    } else if (cmd->opcode < 32 && !(s->fw_opcodes & (1u << cmd->opcode))) {
        npu_guest_error("npu: opcode %u is not in the"
                        " firmware\n", cmd->opcode);
        status = NPU_ST_BAD_OPCODE;
    } else if (inject) {
        trace_npu_inject(qi, inject);
        status = inject & NPU_INJECT_HW_ERROR ? NPU_ST_HW_ERROR
                                              : NPU_ST_DMA_ERROR;
    } else {
        status = npu_walk_select(s, &m->walk, cmd->ctx);
        if (status == NPU_ST_OK) {
            status = npu_exec_cmd(s, &m->walk, cmd);
        }
        if (status == NPU_ST_OK && cmd->opcode == NPU_OP_WAIT) {
            bool ready;

            status = npu_wait_ready(s, &m->walk, cmd, &ready);
            if (status == NPU_ST_OK && !ready) {
                m->blocked = true;      /* the head stays; look again */
                npu_trace_leave(saved);
                return;
            }
        }
    }
    if (modelled) {
        end_arg = npu_timing_finish(s, m, t_start);
    } else {
        m->cpl.t_end = cpu_to_le64(npu_dev_clock(s));
    }
    m->cpl.fence = cpu_to_le64(cmd->fence);
    m->cpl.status = cpu_to_le32(status);
    m->cpl.opcode = cpu_to_le16(cmd->opcode);
    trace_npu_cmd_done(qi, cmd->fence, status,
                       le64_to_cpu(m->cpl.t_end) - le64_to_cpu(m->cpl.t_start));
    npu_trace(s, NPU_TR_CMD_END, status, end_arg);
    npu_trace_leave(saved);
    if (status == NPU_ST_TIMEOUT) {
        npu_guest_error("npu: queue %d fence %" PRIu64 " ran"
                        " past its budget of %u ms\n", qi, (uint64_t)cmd->fence,
                        s->cmd_budget_ms);
        trace_npu_cmd_timeout(qi, cmd->fence, s->cmd_budget_ms);
    }
}

/* A member of a concurrent group, on the AI core that runs it. */
typedef struct NpuGroup {
    NpuState *s;
    int qi;
    NpuMember *m;
} NpuGroup;

static uint32_t npu_group_tile(NpuCore *core, void *opaque, uint64_t begin,
                               uint64_t end)
{
    NpuGroup *g = opaque;
    uint64_t i;

    for (i = begin; i < end; i++) {
        if (core->index != UINT32_MAX) {
            npu_trace_ev(g->s, NPU_TR_DISPATCH, g->qi, core->index,
                         g->m[i].cmd.fence, g->m[i].cmd.opcode, i);
        }
        npu_member_exec(g->s, g->qi, &g->m[i]);
    }
    return NPU_ST_OK;
}

/* Fetch descriptor @idx of queue @qi into @m; false if the DMA failed. */
static bool npu_fetch(NpuState *s, int qi, uint64_t ring, uint32_t ring_size,
                      uint32_t idx, NpuMember *m, const NpuWalk *walk)
{
    uint32_t slot = idx & (ring_size - 1);
    struct npu_cmd *cmd = &m->cmd;

    /* The descriptor is copied once; only the local copy is looked at. */
    if (npu_dma_read(s, "descriptor", ring + (uint64_t)slot * sizeof(*cmd),
                     cmd, sizeof(*cmd)) != MEMTX_OK) {
        return false;
    }
    cmd->opcode = le16_to_cpu(cmd->opcode);
    cmd->flags = le16_to_cpu(cmd->flags);
    cmd->ctx = le16_to_cpu(cmd->ctx);
    cmd->fence = le64_to_cpu(cmd->fence);
    m->idx = idx;
    m->inject = 0;
    memset(&m->stats, 0, sizeof(m->stats));
    m->blocked = false;
    if (walk != &m->walk) {
        m->walk = *walk;
    }
    m->walk.stats = &m->stats;
    return true;
}

/* May @cmd run at the same time as the commands before it? */
static bool npu_joins_group(NpuState *s, const struct npu_cmd *cmd)
{
    /* The timing model runs one command at a time (12.2). */
    return !s->chip && (cmd->flags & NPU_CMD_F_CONCURRENT) &&
           cmd->opcode != NPU_OP_WAIT && cmd->opcode != NPU_OP_SIGNAL;
}

/*
 * Complete group member @m (steps 6 to 9 of section 6.3); called and
 * returns with the lock. False when the queue is not to go on: a reset,
 * the queue disabled or re-enabled, or stopped by an error.
 */
static bool npu_retire_locked(NpuState *s, int qi, uint32_t gen,
                              uint64_t cpl_base, uint64_t fence_addr,
                              NpuMember *m)
{
    NpuQueue *q = &s->q[qi];
    uint32_t slot = m->idx & (q->ring_size - 1);
    uint32_t status = le32_to_cpu(m->cpl.status);
    struct npu_fence_wb wb;
    int i;

    if (s->reset_pending || q->gen != gen) {
        /*
         * Reset, or disabled and maybe re-pointed meanwhile: the rings the
         * command came from may be gone, so nothing of it is written.
         */
        return false;
    }
    if (m->walk.confined && m->stats.faults) {
        /*
         * Any fault counts, even one hidden behind another tile's status.
         * The queue stops before the completion is written, so whoever
         * sees the fence can see the stop; Q_DONE names the command.
         */
        q->done_fence = m->cmd.fence;
        npu_queue_error_locked(s, qi, NPU_ERR_MMU_FAULT);
    }
    q->cpl_writing = true;      /* the queue's rings stay while we write */
    qemu_mutex_unlock(&s->lock);

    wb.value = m->cpl.fence;
    wb.timestamp = m->cpl.t_end;
    if (npu_dma_write(s, "completion",
                      cpl_base + (uint64_t)slot * sizeof(m->cpl),
                      &m->cpl, sizeof(m->cpl)) != MEMTX_OK ||
        (fence_addr &&
         npu_dma_write(s, "fence", fence_addr, &wb, sizeof(wb)) !=
         MEMTX_OK)) {
        npu_guest_error("npu: queue %d completion write"
                        " failed\n", qi);
        qemu_mutex_lock(&s->lock);
        q->cpl_writing = false;
        qemu_cond_broadcast(&s->cpl_done);
        if (!s->reset_pending && q->gen == gen) {
            npu_queue_error_locked(s, qi, NPU_ERR_CPL_WRITE);
        }
        return false;
    }

    npu_trace_ev(s, NPU_TR_CPL_WRITE, qi, NPU_TRACE_CORE_CP, m->cmd.fence,
                 status, slot);
    qemu_mutex_lock(&s->lock);
    q->cpl_writing = false;
    qemu_cond_broadcast(&s->cpl_done);
    if (s->reset_pending || q->gen != gen) {
        return false;   /* reset or re-enabled meanwhile: the state is gone */
    }
    q->head = m->idx + 1;
    q->waiting = false;
    q->done_fence = m->cmd.fence;
    s->cmds_done++;
    npu_perf_retire_locked(s, qi, m);
    /* A completion may be what a blocked WAIT waits for. */
    for (i = 0; i < NPU_NUM_QUEUES; i++) {
        s->q[i].blocked = false;
    }
    if (status != NPU_ST_OK) {
        npu_queue_irq_locked(s, qi);    /* errors are never held back */
    } else if (m->cmd.flags & NPU_CMD_F_IRQ) {
        npu_queue_completed_locked(s, qi);
    } else if (q->irq_held && q->head == q->tail) {
        npu_queue_irq_locked(s, qi);    /* idle: nothing left to wait for */
    }
    return !(q->status & NPU_QSTAT_STOPPED);
}

/*
 * Run the descriptor at the queue's head, with the commands after it that
 * may run concurrently (a group, NPU_CMD_F_CONCURRENT); called and returns
 * with the lock.
 */
static void npu_process_one_locked(NpuState *s, int qi)
{
    NpuQueue *q = &s->q[qi];
    NpuMember *m = s->level[s->depth].members;
    uint32_t idx = q->head;
    uint32_t gen = q->gen;
    uint32_t ring_size = q->ring_size;
    uint64_t ring = q->ring_base, cpl_base = q->cpl_base;
    uint64_t fence_addr = q->fence_addr;
    uint32_t inject, n, max, k;

    if (q->tail - q->head > q->ring_size) {
        npu_guest_error("npu: queue %d tail %u overruns head %u"
                        " (ring of %u)\n", qi, q->tail, q->head, q->ring_size);
        npu_queue_error_locked(s, qi, NPU_ERR_RING_OVERRUN);
        return;
    }
    q->status |= NPU_QSTAT_ACTIVE;
    qatomic_set(&s->run_queue[s->depth], qi);
    qatomic_set(&s->run_gen[s->depth], gen);
    if (!q->wait_timed || q->wait_idx != idx) {
        /* A blocked WAIT looked at again is not progress: it is stuck. */
        qatomic_inc(&q->progress);
    }
    if (s->inject & NPU_INJECT_HANG) {
        /* The command processor stops here, ACTIVE, until a reset. */
        s->inject &= ~NPU_INJECT_HANG;
        s->hung = true;
        trace_npu_inject(qi, NPU_INJECT_HANG);
        return;
    }
    /* One injected fault per command; HW_ERROR first. */
    inject = s->inject & NPU_INJECT_HW_ERROR ?:
             s->inject & NPU_INJECT_DMA_FAULT;
    s->inject &= ~inject;
    npu_walk_init_locked(s, &m[0].walk, qi);
    /* A group takes the descriptors already published, one per AI core. */
    max = MIN(q->tail - q->head, MIN(s->cores.n, NPU_GROUP_MAX));
    qatomic_set(&s->deadline_ns, s->cmd_budget_ms ?
                qemu_clock_get_ns(QEMU_CLOCK_REALTIME) +
                s->cmd_budget_ms * (int64_t)SCALE_MS : INT64_MAX);
    qemu_mutex_unlock(&s->lock);

    if (!npu_fetch(s, qi, ring, ring_size, idx, &m[0], &m[0].walk)) {
        npu_guest_error("npu: queue %d descriptor fetch at"
                        " 0x%" PRIx64 " failed\n", qi, ring);
        qemu_mutex_lock(&s->lock);
        q->status &= ~NPU_QSTAT_ACTIVE;
        if (!s->reset_pending && q->gen == gen) {
            npu_queue_error_locked(s, qi, NPU_ERR_RING_FETCH);
        }
        return;
    }
    m[0].inject = inject;
    n = 1;
    if (m[0].cmd.opcode != NPU_OP_WAIT && m[0].cmd.opcode != NPU_OP_SIGNAL) {
        /*
         * A descriptor read ahead that does not join is read again when it
         * reaches the head; only that copy is used for it.
         */
        while (n < max &&
               npu_fetch(s, qi, ring, ring_size, idx + n, &m[n], &m[0].walk) &&
               npu_joins_group(s, &m[n].cmd)) {
            n++;
        }
    }
    /* Logged once taken: a read-ahead that did not join is not. */
    for (k = 0; k < n; k++) {
        npu_trace_ev(s, NPU_TR_FETCH, qi, NPU_TRACE_CORE_CP, m[k].cmd.fence,
                     m[k].cmd.opcode, m[k].idx);
    }
    if (n == 1) {
        npu_member_exec(s, qi, &m[0]);
    } else {
        NpuGroup group = { .s = s, .qi = qi, .m = m };

        trace_npu_cmd_group(qi, idx, n);
        npu_run_members(s, npu_group_tile, &group, n);
    }

    qemu_mutex_lock(&s->lock);
    if (m[0].blocked) {
        /* A WAIT (always alone) not satisfied yet: the head stays. */
        if (!s->reset_pending && q->gen == gen) {
            q->blocked = true;
            q->waiting = true;
            if (!q->wait_timed || q->wait_idx != idx) {
                q->wait_timed = true;
                q->wait_since = le64_to_cpu(m[0].cpl.t_start);
                q->wait_idx = idx;
            }
        }
    } else {
        for (k = 0; k < n; k++) {
            if (!npu_retire_locked(s, qi, gen, cpl_base, fence_addr, &m[k])) {
                break;
            }
        }
    }
    q->status &= ~NPU_QSTAT_ACTIVE;
}

/*
 * The scheduler: the runnable queue of the highest priority above @above;
 * among equal priorities the first after the one served last
 * (round-robin). -1 if none.
 */
static int npu_pick_queue_locked(NpuState *s, int above)
{
    int best = -1, i;

    for (i = 1; i <= NPU_NUM_QUEUES; i++) {
        int qi = (s->last_queue + i) % NPU_NUM_QUEUES;

        if (npu_queue_runnable_locked(s, &s->q[qi]) &&
            (int)s->q[qi].priority > above &&
            (best < 0 || s->q[qi].priority > s->q[best].priority)) {
            best = qi;
        }
    }
    return best;
}

/*
 * Something may have become runnable: wake the worker, and ask a running
 * command of a lower priority to give way at its next tile boundary.
 */
static void npu_kick_locked(NpuState *s)
{
    qemu_cond_broadcast(&s->cond);
    if (s->cur_prio >= 0 && npu_pick_queue_locked(s, s->cur_prio) >= 0) {
        qatomic_set(&s->preempt, true);
    }
}

/*
 * Run, one level deeper, every runnable command of a priority above the
 * running one (the command processor, at a tile boundary of the running
 * command, no lock held). The preempted command's budget does not run
 * meanwhile; it resumes with what it had left.
 */
void npu_preempt(NpuState *s)
{
    int64_t left = qatomic_read(&s->deadline_ns);
    int prio, qi;

    if (left != INT64_MAX) {
        left -= qemu_clock_get_ns(QEMU_CLOCK_REALTIME);
    }
    qemu_mutex_lock(&s->lock);
    qatomic_set(&s->preempt, false);
    prio = s->cur_prio;
    /*
     * A preempted command whose queue was disabled meanwhile is dropped:
     * it resumes only to stop at once (npu_engine_poll()), so nothing more
     * is nested above it.
     */
    while (!s->stop && !s->reset_pending && !s->paused && !s->hung &&
           s->depth + 1 < NPU_LEVELS &&
           s->q[s->run_queue[s->depth]].gen == s->run_gen[s->depth] &&
           (qi = npu_pick_queue_locked(s, prio)) >= 0) {
        trace_npu_preempt(qi, s->q[qi].priority, prio, s->depth + 1);
        /* Preempted, not stuck: the watchdog's Q_PROGRESS moves. */
        qatomic_inc(&s->q[s->run_queue[s->depth]].progress);
        qatomic_set(&s->depth, s->depth + 1);
        s->cur_prio = s->q[qi].priority;
        npu_process_one_locked(s, qi);
        s->cur_prio = prio;
        qatomic_set(&s->depth, s->depth - 1);
    }
    qatomic_set(&s->deadline_ns, left == INT64_MAX ? INT64_MAX :
                qemu_clock_get_ns(QEMU_CLOCK_REALTIME) + left);
    qemu_mutex_unlock(&s->lock);
}

static bool npu_any_blocked_locked(NpuState *s)
{
    int qi;

    for (qi = 0; qi < NPU_NUM_QUEUES; qi++) {
        if (s->q[qi].blocked) {
            return true;
        }
    }
    return false;
}

static void *npu_worker(void *opaque)
{
    NpuState *s = opaque;
    int qi;

    qemu_mutex_lock(&s->lock);
    while (!s->stop) {
        if (s->reset_pending) {
            npu_reset_state_locked(s);
            s->reset_pending = false;
            qatomic_set(&s->abort, false);
            qemu_bh_schedule(s->irq_bh);    /* lowers INTx */
            qemu_cond_broadcast(&s->reset_done);
            /* The device answers again; now the aborted command's memory. */
            qemu_mutex_unlock(&s->lock);
            npu_budget_reap(s);
            npu_scratch_trim(s);
            qemu_mutex_lock(&s->lock);
            continue;
        }
        if (s->paused || s->hung) {
            /* Until the VM runs again, or a reset. */
            qemu_cond_wait(&s->cond, &s->lock);
            continue;
        }
        /* One command at a time, so a higher priority wins at each one. */
        qi = npu_pick_queue_locked(s, -1);
        if (qi < 0 && npu_any_blocked_locked(s)) {
            /* A WAIT may be satisfied by the CPU: look again in 1 ms. */
            qemu_cond_timedwait(&s->cond, &s->lock, 1);
            for (qi = 0; qi < NPU_NUM_QUEUES; qi++) {
                s->q[qi].blocked = false;
            }
            continue;
        }
        if (qi < 0) {
            qemu_cond_wait(&s->cond, &s->lock);
            continue;
        }
        s->last_queue = qi;
        s->cur_prio = s->q[qi].priority;
        s->busy++;
        npu_process_one_locked(s, qi);
        s->busy--;
        qemu_cond_broadcast(&s->parked_cond);
        s->cur_prio = -1;
        qatomic_set(&s->preempt, false);
        qatomic_set(&s->deadline_ns, INT64_MAX);
        /*
         * A timed-out command's large blocks, now that it answered; an
         * aborted one's wait until the reset has answered (above).
         */
        if (!s->reset_pending) {
            qemu_mutex_unlock(&s->lock);
            npu_budget_reap(s);
            npu_scratch_trim(s);
            qemu_mutex_lock(&s->lock);
        }
    }
    qemu_mutex_unlock(&s->lock);
    return NULL;
}

/* Registers ------------------------------------------------------------ */

static uint32_t npu_status_locked(NpuState *s)
{
    uint32_t st = NPU_STATUS_READY;
    int qi;

    if (s->control & NPU_CONTROL_ENABLE) {
        st |= NPU_STATUS_ENABLED;
    }
    if (s->reset_pending) {
        st |= NPU_STATUS_RESETTING;
    }
    for (qi = 0; qi < NPU_NUM_QUEUES; qi++) {
        if (s->q[qi].status & NPU_QSTAT_STOPPED) {
            st |= NPU_STATUS_ERROR;
        }
    }
    return st;
}

static uint64_t npu_qreg_read_locked(NpuState *s, NpuQueue *q, hwaddr reg)
{
    switch (reg) {
    case NPU_Q_RING_LO:
        return (uint32_t)q->ring_base;
    case NPU_Q_RING_HI:
        return q->ring_base >> 32;
    case NPU_Q_RING_SIZE:
        return q->ring_size;
    case NPU_Q_CONTROL:
        return q->ctrl;
    case NPU_Q_HEAD:
        return q->head;
    case NPU_Q_TAIL:
        return q->tail;
    case NPU_Q_CPL_LO:
        return (uint32_t)q->cpl_base;
    case NPU_Q_CPL_HI:
        return q->cpl_base >> 32;
    case NPU_Q_FENCE_LO:
        return (uint32_t)q->fence_addr;
    case NPU_Q_FENCE_HI:
        return q->fence_addr >> 32;
    case NPU_Q_STATUS:
        /* A WAIT being looked at again is ACTIVE, not WAITING, meanwhile. */
        return q->status | (q->head == q->tail ? NPU_QSTAT_IDLE : 0) |
               (q->waiting && !(q->status & NPU_QSTAT_ACTIVE) ?
                NPU_QSTAT_WAITING : 0);
    case NPU_Q_ERROR:
        return q->error;
    case NPU_Q_DONE_LO:
        return (uint32_t)q->done_fence;
    case NPU_Q_DONE_HI:
        return q->done_fence >> 32;
    case NPU_Q_PRIORITY:
        return q->priority;
    case NPU_Q_IRQ_COUNT:
        return q->irq_count;
    case NPU_Q_IRQ_DELAY:
        return q->irq_delay_us;
    case NPU_Q_IRQS:
        return q->irqs;
    case NPU_Q_PROGRESS:
        return qatomic_read(&q->progress);
    case NPU_Q_MMU_L1_LO:
        return (uint32_t)q->mmu_l1_base;
    case NPU_Q_MMU_L1_HI:
        return q->mmu_l1_base >> 32;
    case NPU_Q_MMU_L1_ENTRIES:
        return q->mmu_l1_entries;
    default:
        npu_guest_error("npu: read of unknown queue register"
                        " 0x%" HWADDR_PRIx "\n", reg);
        return 0;
    }
}

static uint64_t npu_mmio_read(void *opaque, hwaddr addr, unsigned size)
{
    NpuState *s = opaque;
    uint64_t val = 0;
    uint64_t now;

    qemu_mutex_lock(&s->lock);
    switch (addr) {
    case NPU_REG_MAGIC:
        val = NPU_MAGIC;
        break;
    case NPU_REG_HW_VERSION:
        val = NPU_HW_VERSION;
        break;
    case NPU_REG_ABI_VERSION:
        val = NPU_ABI_VERSION;
        break;
    case NPU_REG_CAPS:
        val = NPU_CAP_COPY | NPU_CAP_FILL | NPU_CAP_GEMM_FP32 | NPU_CAP_MSIX |
              NPU_CAP_TIMESTAMPS | NPU_CAP_MMU | NPU_CAP_TENSOR |
              NPU_CAP_REDUCE | NPU_CAP_MATMUL | NPU_CAP_CONV |
              NPU_CAP_QUANT | NPU_CAP_POOL_GEOMETRY | NPU_CAP_SELECT |
              NPU_CAP_STRIDED_OUT | NPU_CAP_CONV_ACCUMULATE |
              NPU_CAP_ACT_RELU6 | NPU_CAP_CONCURRENT | NPU_CAP_PERF |
              NPU_CAP_TRACE |
              (s->mem_size ? NPU_CAP_LOCAL_MEM : 0);
        break;
    case NPU_REG_NUM_QUEUES:
        val = NPU_NUM_QUEUES;
        break;
    case NPU_REG_NUM_CORES:
        val = s->num_cores;
        break;
    case NPU_REG_MAX_RING:
        val = NPU_RING_MAX_ENTRIES;
        break;
    case NPU_REG_STATUS:
        val = npu_status_locked(s);
        break;
    case NPU_REG_CONTROL:
        val = s->control;
        break;
    case NPU_REG_IRQ_STATUS:
        val = s->irq_status;
        break;
    case NPU_REG_IRQ_MASK:
        val = s->irq_mask;
        break;
    case NPU_REG_ERROR:
        val = s->error;
        break;
    case NPU_REG_TIMESTAMP_LO:
        now = npu_dev_clock(s);
        s->ts_hi_latch = now >> 32;
        val = (uint32_t)now;
        break;
    case NPU_REG_TIMESTAMP_HI:
        val = s->ts_hi_latch;
        break;
    case NPU_REG_SCRATCH:
        val = s->scratch;
        break;
    case NPU_REG_MMU_CONTROL:
        val = s->mmu_control;
        break;
    case NPU_REG_MMU_L1_LO:
        val = (uint32_t)s->mmu_l1_base;
        break;
    case NPU_REG_MMU_L1_HI:
        val = s->mmu_l1_base >> 32;
        break;
    case NPU_REG_MMU_L1_ENTRIES:
        val = s->mmu_l1_entries;
        break;
    case NPU_REG_MMU_FAULT_LO:
        val = (uint32_t)s->mmu_fault_addr;
        break;
    case NPU_REG_MMU_FAULT_HI:
        val = s->mmu_fault_addr >> 32;
        break;
    case NPU_REG_MMU_FAULT_INFO:
        val = s->mmu_fault_info;
        break;
    case NPU_REG_MMU_FAULTS:
        val = s->mmu_faults;
        break;
    case NPU_REG_MMU_FAULT_QUEUE:
        val = s->mmu_fault_queue;
        break;
    case NPU_REG_MMU_FAULT_CTX:
        val = s->mmu_fault_ctx;
        break;
    case NPU_REG_INJECT:
        val = s->inject;
        break;
    case NPU_REG_FW_ADDR_LO:
        val = (uint32_t)s->fw_addr;
        break;
    case NPU_REG_FW_ADDR_HI:
        val = s->fw_addr >> 32;
        break;
    case NPU_REG_FW_SIZE:
        val = s->fw_size;
        break;
    case NPU_REG_FW_STATUS:
        val = s->fw_state;
        break;
    case NPU_REG_FW_ERROR:
        val = s->fw_error;
        break;
    case NPU_REG_FW_VERSION:
        val = s->fw_version;
        break;
    case NPU_REG_FW_HEARTBEAT:
        val = npu_fw_heartbeat_locked(s);
        break;
    case NPU_REG_MBOX_CMD:
        val = s->mbox_cmd;
        break;
    case NPU_REG_MBOX_ARG0:
        val = s->mbox_arg0;
        break;
    case NPU_REG_MBOX_ARG1:
        val = s->mbox_arg1;
        break;
    case NPU_REG_MBOX_SEQ:
        val = s->mbox_seq;
        break;
    case NPU_REG_MBOX_RESP_SEQ:
        val = s->mbox_resp_seq;
        break;
    case NPU_REG_MBOX_RESP_STATUS:
        val = s->mbox_resp_status;
        break;
    case NPU_REG_MBOX_RESP0:
        val = s->mbox_resp0;
        break;
    case NPU_REG_MBOX_RESP1:
        val = s->mbox_resp1;
        break;
    case NPU_REG_FW_LOG_LO:
        val = (uint32_t)s->fw_log_base;
        break;
    case NPU_REG_FW_LOG_HI:
        val = s->fw_log_base >> 32;
        break;
    case NPU_REG_FW_LOG_SIZE:
        val = s->fw_log_size;
        break;
    case NPU_REG_TIMING:
        val = s->timing;
        break;
    case NPU_REG_MEM_SIZE_LO:
        val = (uint32_t)s->mem_size;
        break;
    case NPU_REG_MEM_SIZE_HI:
        val = s->mem_size >> 32;
        break;
    case NPU_REG_MMU_CTX_LO:
        val = (uint32_t)s->mmu_ctx_base;
        break;
    case NPU_REG_MMU_CTX_HI:
        val = s->mmu_ctx_base >> 32;
        break;
    case NPU_REG_MMU_CTX_COUNT:
        val = s->mmu_ctx_count;
        break;
    default:
        if (addr >= NPU_QREG_BASE &&
            addr < NPU_QREG_BASE + NPU_NUM_QUEUES * NPU_QREG_STRIDE) {
            hwaddr off = addr - NPU_QREG_BASE;

            val = npu_qreg_read_locked(s, &s->q[off / NPU_QREG_STRIDE],
                                       off % NPU_QREG_STRIDE);
        } else if (addr >= NPU_PERF_BASE &&
                   addr < NPU_PERF_BASE + NPU_PERF_SIZE) {
            val = npu_perf_read_locked(s, addr - NPU_PERF_BASE);
        } else if (addr >= NPU_TRACE_BASE &&
                   addr < NPU_TRACE_BASE + NPU_TRACE_SIZE) {
            val = npu_trace_read_locked(s, addr - NPU_TRACE_BASE);
        } else {
            npu_guest_error("npu: read of unknown register"
                            " 0x%" HWADDR_PRIx "\n", addr);
        }
        break;
    }
    qemu_mutex_unlock(&s->lock);
    trace_npu_mmio_read(addr, size, val);
    return val;
}

static bool npu_ring_config_ok(NpuState *s, NpuQueue *q)
{
    uint32_t n = q->ring_size;

    if (n < 2 || n > NPU_RING_MAX_ENTRIES || !is_power_of_2(n) ||
        !q->ring_base || (q->ring_base & 63) ||
        !q->cpl_base || (q->cpl_base & 31) || (q->fence_addr & 15)) {
        return false;
    }
    /*
     * Rings and write-back never wrap, never hit the device's BARs and are
     * RAM: the completion ring and the fence writable RAM.
     */
    return npu_dma_range_ok_locked(s, q->ring_base,
                                   (uint64_t)n * sizeof(struct npu_cmd),
                                   false) &&
           npu_dma_range_ok_locked(s, q->cpl_base,
                                   (uint64_t)n * sizeof(struct npu_cpl),
                                   true) &&
           (!q->fence_addr ||
            npu_dma_range_ok_locked(s, q->fence_addr,
                                    sizeof(struct npu_fence_wb), true));
}

static void npu_doorbell_locked(NpuState *s, int qi, uint32_t tail)
{
    NpuQueue *q = &s->q[qi];

    trace_npu_doorbell(qi, tail);
    q->tail = tail;
    npu_kick_locked(s);
}

static void npu_qreg_write_locked(NpuState *s, int qi, hwaddr reg,
                                  uint32_t val)
{
    NpuQueue *q = &s->q[qi];
    bool enabled = q->ctrl & NPU_QCTL_ENABLE;

    switch (reg) {
    case NPU_Q_RING_LO:
    case NPU_Q_RING_HI:
    case NPU_Q_RING_SIZE:
    case NPU_Q_CPL_LO:
    case NPU_Q_CPL_HI:
    case NPU_Q_FENCE_LO:
    case NPU_Q_FENCE_HI:
    case NPU_Q_MMU_L1_LO:
    case NPU_Q_MMU_L1_HI:
    case NPU_Q_MMU_L1_ENTRIES:
        if (enabled) {
            npu_guest_error("npu: queue %d register 0x%"
                            HWADDR_PRIx " written while enabled\n", qi, reg);
            return;
        }
        break;
    default:
        break;
    }

    switch (reg) {
    case NPU_Q_RING_LO:
        q->ring_base = deposit64(q->ring_base, 0, 32, val);
        break;
    case NPU_Q_RING_HI:
        q->ring_base = deposit64(q->ring_base, 32, 32, val);
        break;
    case NPU_Q_RING_SIZE:
        q->ring_size = val;
        break;
    case NPU_Q_CPL_LO:
        q->cpl_base = deposit64(q->cpl_base, 0, 32, val);
        break;
    case NPU_Q_CPL_HI:
        q->cpl_base = deposit64(q->cpl_base, 32, 32, val);
        break;
    case NPU_Q_FENCE_LO:
        q->fence_addr = deposit64(q->fence_addr, 0, 32, val);
        break;
    case NPU_Q_FENCE_HI:
        q->fence_addr = deposit64(q->fence_addr, 32, 32, val);
        break;
    case NPU_Q_MMU_L1_LO:
        if (val & (NPU_PAGE_SIZE - 1)) {
            npu_guest_error("npu: queue %d MMU L1 table 0x%x"
                            " is not page aligned\n", qi, val);
        }
        q->mmu_l1_base = deposit64(q->mmu_l1_base, 0, 32,
                                   val & ~(NPU_PAGE_SIZE - 1));
        break;
    case NPU_Q_MMU_L1_HI:
        q->mmu_l1_base = deposit64(q->mmu_l1_base, 32, 32, val);
        break;
    case NPU_Q_MMU_L1_ENTRIES:
        if (val > NPU_MMU_MAX_L1) {
            npu_guest_error("npu: queue %d MMU L1 size %u"
                            " clamped to %u\n", qi, val, NPU_MMU_MAX_L1);
        }
        q->mmu_l1_entries = MIN(val, NPU_MMU_MAX_L1);
        break;
    case NPU_Q_CONTROL:
        if (val & ~NPU_QCTL_ENABLE) {
            npu_guest_error("npu: queue %d control 0x%x has"
                            " unknown bits\n", qi, val);
        }
        if ((val & NPU_QCTL_ENABLE) && !enabled) {
            if (!npu_ring_config_ok(s, q)) {
                npu_guest_error("npu: queue %d enabled with an"
                                " invalid ring configuration\n", qi);
                npu_queue_error_locked(s, qi, NPU_ERR_BAD_RING);
                return;
            }
            q->head = q->tail = q->restore ? q->head_restore : 0;
            q->restore = false;
            q->status &= NPU_QSTAT_ACTIVE;  /* an old command may still run */
            q->waiting = false;
            q->wait_timed = false;
            q->error = NPU_ERR_NONE;
            q->done_fence = 0;
        }
        if ((val & NPU_QCTL_ENABLE) != enabled) {
            npu_queue_quiesce_locked(s, qi);
            q->gen++;
        }
        q->ctrl = val & NPU_QCTL_ENABLE;
        npu_kick_locked(s);
        break;
    case NPU_Q_TAIL:
        npu_doorbell_locked(s, qi, val);
        break;
    case NPU_Q_HEAD:
        /* Where the next enable starts the ring (a driver's restart). */
        if (enabled) {
            npu_guest_error("npu: queue %d head written while"
                            " enabled\n", qi);
            break;
        }
        q->head_restore = val;
        q->restore = true;
        break;
    case NPU_Q_PRIORITY:
        if (val > NPU_Q_PRIORITY_MAX) {
            npu_guest_error("npu: queue %d priority %u is above"
                            " %u; ignored\n", qi, val, NPU_Q_PRIORITY_MAX);
            break;
        }
        q->priority = val;      /* takes effect at the next command */
        npu_kick_locked(s);
        break;
    case NPU_Q_IRQ_COUNT:
    case NPU_Q_IRQ_DELAY:
        if (val > (reg == NPU_Q_IRQ_COUNT ? NPU_IRQ_COUNT_MAX :
                   NPU_IRQ_DELAY_MAX)) {
            npu_guest_error("npu: queue %d moderation register"
                            " 0x%" HWADDR_PRIx " value %u too large; ignored\n",
                            qi, reg, val);
            break;
        }
        if (reg == NPU_Q_IRQ_COUNT) {
            q->irq_count = val;
        } else {
            q->irq_delay_us = val;
        }
        if (q->irq_held) {      /* do not strand what is held */
            npu_queue_irq_locked(s, qi);
        }
        break;
    default:
        npu_guest_error("npu: write to read-only or unknown"
                        " queue register 0x%" HWADDR_PRIx "\n", reg);
        break;
    }
}

static void npu_mmu_write_locked(NpuState *s, hwaddr addr, uint32_t val)
{
    if (s->control & NPU_CONTROL_ENABLE) {
        npu_guest_error("npu: MMU register 0x%" HWADDR_PRIx
                        " written while the device is enabled\n", addr);
        return;
    }
    switch (addr) {
    case NPU_REG_MMU_CONTROL:
        if (val & ~NPU_MMU_ENABLE) {
            npu_guest_error("npu: MMU control 0x%x has"
                            " unknown bits\n", val);
        }
        s->mmu_control = val & NPU_MMU_ENABLE;
        break;
    case NPU_REG_MMU_L1_LO:
        if (val & (NPU_PAGE_SIZE - 1)) {
            npu_guest_error("npu: MMU L1 table 0x%x is not"
                            " page aligned\n", val);
        }
        s->mmu_l1_base = deposit64(s->mmu_l1_base, 0, 32,
                                   val & ~(NPU_PAGE_SIZE - 1));
        break;
    case NPU_REG_MMU_L1_HI:
        s->mmu_l1_base = deposit64(s->mmu_l1_base, 32, 32, val);
        break;
    case NPU_REG_MMU_L1_ENTRIES:
        if (val > NPU_MMU_MAX_L1) {
            npu_guest_error("npu: MMU L1 size %u clamped to"
                            " %u\n", val, NPU_MMU_MAX_L1);
        }
        s->mmu_l1_entries = MIN(val, NPU_MMU_MAX_L1);
        break;
    case NPU_REG_MMU_CTX_LO:
        if (val & (NPU_PAGE_SIZE - 1)) {
            npu_guest_error("npu: context table 0x%x is not"
                            " page aligned\n", val);
        }
        s->mmu_ctx_base = deposit64(s->mmu_ctx_base, 0, 32,
                                    val & ~(NPU_PAGE_SIZE - 1));
        break;
    case NPU_REG_MMU_CTX_HI:
        s->mmu_ctx_base = deposit64(s->mmu_ctx_base, 32, 32, val);
        break;
    case NPU_REG_MMU_CTX_COUNT:
        if (val > NPU_MMU_MAX_CTX) {
            npu_guest_error("npu: context table size %u"
                            " clamped to %u\n", val, NPU_MMU_MAX_CTX);
        }
        s->mmu_ctx_count = MIN(val, NPU_MMU_MAX_CTX);
        break;
    }
}

static void npu_mmio_write(void *opaque, hwaddr addr, uint64_t val,
                           unsigned size)
{
    NpuState *s = opaque;
    bool reset = false, boot = false, mbox = false;

    trace_npu_mmio_write(addr, size, val);
    qemu_mutex_lock(&s->lock);
    if (s->reset_pending) {
        npu_guest_error("npu: write to 0x%" HWADDR_PRIx
                        " during reset ignored\n", addr);
        qemu_mutex_unlock(&s->lock);
        return;
    }
    switch (addr) {
    case NPU_REG_CONTROL:
        if (val & ~(uint64_t)(NPU_CONTROL_ENABLE | NPU_CONTROL_RESET)) {
            npu_guest_error("npu: control 0x%" PRIx64
                            " has unknown bits\n", val);
        }
        if (val & NPU_CONTROL_RESET) {
            reset = true;
            break;
        }
        s->control = val & NPU_CONTROL_ENABLE;
        npu_kick_locked(s);
        break;
    case NPU_REG_IRQ_STATUS:
        s->irq_status &= ~val;
        s->irq_fire &= ~val;
        npu_update_intx_locked(s);
        break;
    case NPU_REG_IRQ_MASK:
        /* Unmasking a pending bit signals it now. */
        s->irq_fire |= s->irq_status & val & ~s->irq_mask;
        s->irq_mask = val;
        npu_update_intx_locked(s);
        if (s->irq_fire) {
            qemu_bh_schedule(s->irq_bh);
        }
        break;
    case NPU_REG_SCRATCH:
        s->scratch = val;
        break;
    case NPU_REG_INJECT:
        if (val & ~NPU_INJECT_MASK) {
            npu_guest_error("npu: inject 0x%x has unknown"
                            " bits\n", (uint32_t)val);
        }
        s->inject |= val & NPU_INJECT_MASK & ~NPU_INJECT_FW_CRASH;
        if (val & NPU_INJECT_FW_CRASH) {
            npu_fw_crash_locked(s);
        }
        break;
    case NPU_REG_FW_ADDR_LO:
    case NPU_REG_FW_ADDR_HI:
    case NPU_REG_FW_SIZE:
        if (s->fw_state == NPU_FW_RUNNING) {
            npu_guest_error("npu: firmware register 0x%"
                            HWADDR_PRIx " written while it runs\n", addr);
        } else if (addr == NPU_REG_FW_SIZE) {
            s->fw_size = val;
        } else {
            int shift = addr == NPU_REG_FW_ADDR_LO ? 0 : 32;

            s->fw_addr = deposit64(s->fw_addr, shift, 32, val);
        }
        break;
    case NPU_REG_FW_CONTROL:
        if (val & ~(uint64_t)(NPU_FW_BOOT | NPU_FW_STOP)) {
            npu_guest_error("npu: firmware control 0x%x has"
                            " unknown bits\n", (uint32_t)val);
        }
        if (val & NPU_FW_STOP) {
            s->fw_state = NPU_FW_OFF;
            s->fw_version = 0;
            s->fw_opcodes = 0;
            s->fw_queues = 0;
        } else if ((val & NPU_FW_BOOT) && s->fw_state == NPU_FW_RUNNING) {
            npu_guest_error("npu: firmware already runs\n");
        } else {
            boot = val & NPU_FW_BOOT;
        }
        break;
    case NPU_REG_MBOX_CMD:
        s->mbox_cmd = val;
        break;
    case NPU_REG_MBOX_ARG0:
        s->mbox_arg0 = val;
        break;
    case NPU_REG_MBOX_ARG1:
        s->mbox_arg1 = val;
        break;
    case NPU_REG_MBOX_SEQ:
        s->mbox_seq = val;
        mbox = true;
        break;
    case NPU_REG_FW_LOG_LO:
    case NPU_REG_FW_LOG_HI:
    case NPU_REG_FW_LOG_SIZE:
        npu_fw_log_quiesce_locked(s);
        if (addr == NPU_REG_FW_LOG_SIZE) {
            s->fw_log_size = val;
        } else {
            s->fw_log_base = deposit64(s->fw_log_base,
                                       addr == NPU_REG_FW_LOG_LO ? 0 : 32, 32,
                                       val);
        }
        s->fw_log_write = 0;
        break;
    case NPU_REG_MMU_CONTROL:
    case NPU_REG_MMU_L1_LO:
    case NPU_REG_MMU_L1_HI:
    case NPU_REG_MMU_L1_ENTRIES:
    case NPU_REG_MMU_CTX_LO:
    case NPU_REG_MMU_CTX_HI:
    case NPU_REG_MMU_CTX_COUNT:
        npu_mmu_write_locked(s, addr, val);
        break;
    default:
        if (addr >= NPU_QREG_BASE &&
            addr < NPU_QREG_BASE + NPU_NUM_QUEUES * NPU_QREG_STRIDE) {
            hwaddr off = addr - NPU_QREG_BASE;

            npu_qreg_write_locked(s, off / NPU_QREG_STRIDE,
                                  off % NPU_QREG_STRIDE, val);
        } else if (addr >= NPU_DOORBELL_BASE &&
                   addr < NPU_DOORBELL(NPU_NUM_QUEUES) &&
                   (addr - NPU_DOORBELL_BASE) % NPU_DOORBELL_STRIDE == 0) {
            npu_doorbell_locked(s, (addr - NPU_DOORBELL_BASE) /
                                NPU_DOORBELL_STRIDE, val);
        } else if (addr >= NPU_PERF_BASE &&
                   addr < NPU_PERF_BASE + NPU_PERF_SIZE) {
            npu_perf_write_locked(s, addr - NPU_PERF_BASE, val);
        } else if (addr >= NPU_TRACE_BASE &&
                   addr < NPU_TRACE_BASE + NPU_TRACE_SIZE) {
            npu_trace_write_locked(s, addr - NPU_TRACE_BASE, val);
        } else {
            npu_guest_error("npu: write to read-only or"
                            " unknown register 0x%" HWADDR_PRIx "\n", addr);
        }
        break;
    }
    qemu_mutex_unlock(&s->lock);

    if (reset) {
        npu_request_reset(s, false);
    }
    if (boot) {
        npu_fw_boot(s);
    }
    if (mbox) {
        npu_fw_mbox(s);
    }
}

static const MemoryRegionOps npu_mmio_ops = {
    .read = npu_mmio_read,
    .write = npu_mmio_write,
    .endianness = DEVICE_LITTLE_ENDIAN,
    .valid = {
        .min_access_size = 4,
        .max_access_size = 8,
    },
    .impl = {
        .min_access_size = 4,
        .max_access_size = 4,
    },
};

/* Device lifecycle ----------------------------------------------------- */

/* Firmware and mailbox state of a powered-up device (PCI reset). */
static void npu_fw_power_on_locked(NpuState *s)
{
    npu_fw_log_quiesce_locked(s);
    s->fw_addr = 0;
    s->fw_size = 0;
    s->fw_state = NPU_FW_OFF;
    s->fw_error = NPU_FWERR_NONE;
    s->fw_version = 0;
    s->fw_opcodes = 0;
    s->fw_queues = 0;
    s->fw_log_base = 0;
    s->fw_log_size = 0;
    s->fw_log_write = 0;
    s->mbox_cmd = s->mbox_arg0 = s->mbox_arg1 = s->mbox_seq = 0;
    s->mbox_resp_seq = s->mbox_resp_status = 0;
    s->mbox_resp0 = s->mbox_resp1 = 0;
    if (s->boot_rom) {
        npu_fw_start_rom_locked(s);
    }
}

static void npu_vm_state_change(void *opaque, bool running, RunState state);

static void npu_realize(PCIDevice *pdev, Error **errp)
{
    NpuState *s = NPU_PCI(pdev);
    int i;

    if (s->num_cores < 1 || s->num_cores > 64) {
        error_setg(errp, "npu: cores must be between 1 and 64");
        return;
    }
    if (s->mem_budget < 16 * MiB) {
        error_setg(errp, "npu: mem-budget must be at least 16 MiB");
        return;
    }
    npu_dnnl_init();
    if (s->mem_size && (!is_power_of_2(s->mem_size) || s->mem_size < MiB ||
                        s->mem_size > 64 * GiB)) {
        error_setg(errp, "npu: mem-size must be 0 or a power of two from"
                   " 1 MiB to 64 GiB");
        return;
    }
    if (!npu_timing_select(s, errp)) {
        return;
    }
    pci_config_set_interrupt_pin(pdev->config, 1);

    memory_region_init_io(&s->mmio, OBJECT(s), &npu_mmio_ops, s, "npu-mmio",
                          NPU_BAR0_SIZE);
    pci_register_bar(pdev, NPU_BAR_REGS, PCI_BASE_ADDRESS_SPACE_MEMORY,
                     &s->mmio);
    if (s->mem_size) {
        Error *err = NULL;

        memory_region_init_ram(&s->mem, OBJECT(s), "npu-mem", s->mem_size,
                               &err);
        if (err) {
            error_propagate(errp, err);
            return;
        }
        s->mem_ptr = memory_region_get_ram_ptr(&s->mem);
        pci_register_bar(pdev, NPU_BAR_MEM, PCI_BASE_ADDRESS_SPACE_MEMORY |
                         PCI_BASE_ADDRESS_MEM_TYPE_64 |
                         PCI_BASE_ADDRESS_MEM_PREFETCH, &s->mem);
    }
    if (msix_init_exclusive_bar(pdev, NPU_MSIX_VECTORS, NPU_BAR_MSIX, errp)) {
        return;
    }
    /*
     * PCI power management: D0 and D3hot. Leaving D0 loses the device's
     * state (No_Soft_Reset clear): the driver boots the firmware again.
     */
    if (pci_pm_init(pdev, 0, errp) < 0) {
        return;
    }
    pci_set_word(pdev->config + pdev->pm_cap + PCI_PM_PMC, PCI_PM_CAP_VER_1_2);
    pci_set_word(pdev->wmask + pdev->pm_cap + PCI_PM_CTRL,
                 PCI_PM_CTRL_STATE_MASK);
    for (i = 0; i < NPU_MSIX_VECTORS; i++) {
        msix_vector_use(pdev, i);
    }

    for (i = 0; i < NPU_LEVELS; i++) {
        s->level[i].core = (NpuCore) {
            .s = s, .chunk = g_malloc(NPU_CHUNK), .index = UINT32_MAX,
        };
        s->level[i].members = g_new0(NpuMember, NPU_GROUP_MAX);
    }
    npu_cores_init(s, s->num_cores);
    npu_perf_init(s);
    npu_trace_init(s);
    qemu_mutex_init(&s->lock);
    qemu_mutex_init(&s->log_lock);
    qemu_cond_init(&s->log_idle);
    qemu_cond_init(&s->cond);
    qemu_cond_init(&s->reset_done);
    qemu_cond_init(&s->cpl_done);
    qemu_cond_init(&s->resume);
    qemu_cond_init(&s->parked_cond);
    s->cur_prio = -1;
    s->deadline_ns = INT64_MAX;
    s->paused = !runstate_is_running();
    s->vmstate_entry = qemu_add_vm_change_state_handler(npu_vm_state_change,
                                                        s);
    npu_bars_update(s);
    s->irq_bh = qemu_bh_new_guarded(npu_irq_bh, s,
                                    &DEVICE(pdev)->mem_reentrancy_guard);
    for (i = 0; i < NPU_NUM_QUEUES; i++) {
        s->irq_timer[i] = (NpuIrqTimer) { .s = s, .qi = i };
        s->irq_timer[i].timer = timer_new_ns(QEMU_CLOCK_VIRTUAL,
                                             npu_irq_timer_cb,
                                             &s->irq_timer[i]);
    }
    s->stop = false;
    npu_fw_power_on_locked(s);
    npu_reset_state_locked(s);
    qemu_thread_create(&s->thread, "npu-cp", npu_worker, s,
                       QEMU_THREAD_JOINABLE);
}

static void npu_exit(PCIDevice *pdev)
{
    NpuState *s = NPU_PCI(pdev);
    bool bql;
    int i;

    /* The running command stops at its next control point: never long. */
    qemu_mutex_lock(&s->lock);
    s->stop = true;
    qatomic_set(&s->abort, true);
    qemu_cond_broadcast(&s->cond);
    qemu_cond_broadcast(&s->resume);
    qemu_mutex_unlock(&s->lock);
    /* The engine stops without the BQL; others may need it meanwhile. */
    bql = bql_locked();
    if (bql) {
        bql_unlock();
    }
    qemu_thread_join(&s->thread);
    npu_cores_fini(s);
    if (bql) {
        bql_lock();
    }
    npu_perf_fini(s);
    npu_trace_fini(s);
    npu_budget_reap(s);
    qemu_del_vm_change_state_handler(s->vmstate_entry);

    qemu_bh_delete(s->irq_bh);
    for (i = 0; i < NPU_NUM_QUEUES; i++) {
        timer_free(s->irq_timer[i].timer);
    }
    qemu_cond_destroy(&s->parked_cond);
    qemu_cond_destroy(&s->resume);
    qemu_cond_destroy(&s->cpl_done);
    qemu_cond_destroy(&s->reset_done);
    qemu_cond_destroy(&s->cond);
    qemu_mutex_destroy(&s->lock);
    qemu_mutex_destroy(&s->log_lock);
    qemu_cond_destroy(&s->log_idle);
    for (i = 0; i < NPU_LEVELS; i++) {
        npu_core_release(&s->level[i].core);
        g_free(s->level[i].members);
    }
    msix_uninit_exclusive_bar(pdev);
}

/*
 * Resettable phases of a PCI or system reset. Enter: the running command
 * is told to stop (nothing else may happen in this phase). Hold: wait for
 * the engine to drop it, which takes at most one control point's work,
 * since the engine never needs the BQL we hold; then power-on state.
 */
static void npu_reset_enter(Object *obj, ResetType type)
{
    npu_request_reset(NPU_PCI(obj), false);
}

static void npu_reset_hold(Object *obj, ResetType type)
{
    NpuState *s = NPU_PCI(obj);

    npu_request_reset(s, true);
    qemu_mutex_lock(&s->lock);
    npu_fw_power_on_locked(s);
    npu_perf_reset_locked(s);
    qemu_mutex_unlock(&s->lock);
    npu_trace_reset(s);
}

/*
 * Exit: every hold phase is done, the PCI core's (which clears COMMAND and
 * unmaps the BARs, after its devices') included, so the snapshot of the
 * BARs is the reset one.
 */
static void npu_reset_exit(Object *obj, ResetType type)
{
    npu_bars_update(NPU_PCI(obj));
}

static uint16_t npu_pm_state(PCIDevice *pdev)
{
    return pci_get_word(pdev->config + pdev->pm_cap + PCI_PM_CTRL) &
           PCI_PM_CTRL_STATE_MASK;
}

/*
 * PCI configuration writes (BQL): the BARs may have moved, and the power
 * state may have changed. QEMU's PCI core unmaps the BARs outside D0; a
 * move into D3hot powers the device down: the running command is dropped
 * and every register, queue and the firmware go back to their power-on
 * state (device memory keeps its contents, as a self-refreshing DRAM).
 */
static void npu_config_write(PCIDevice *pdev, uint32_t addr, uint32_t val,
                             int len)
{
    NpuState *s = NPU_PCI(pdev);
    uint16_t old = npu_pm_state(pdev), new;

    pci_default_write_config(pdev, addr, val, len);
    new = npu_pm_state(pdev);
    if (new != old) {
        trace_npu_power(old, new);
        if (new == PCI_PM_CTRL_STATE_MASK) {
            npu_request_reset(s, true);
            qemu_mutex_lock(&s->lock);
            npu_fw_power_on_locked(s);
            qemu_mutex_unlock(&s->lock);
            npu_trace_reset(s);
        }
    }
    npu_bars_update(s);
}

/*
 * Every busy engine thread parked or gone. An aborted command's threads
 * (a reset pending) do not park; they leave, so the wait ends as soon and
 * the engine writes nothing into a stopped VM meanwhile.
 */
static bool npu_engine_parked(NpuState *s, int arg)
{
    return s->parked >= s->busy;
}

/*
 * The VM stops or runs again (BQL). A stopped VM gets no DMA and no
 * interrupt from the device: the engine parks at its next control point
 * and this waits until it has, with the BQL released; interrupts
 * wait in irq_fire. The time stopped is not charged to a command's budget.
 */
static void npu_vm_state_change(void *opaque, bool running, RunState state)
{
    NpuState *s = opaque;
    int64_t now = qemu_clock_get_ns(QEMU_CLOCK_REALTIME);

    qemu_mutex_lock(&s->lock);
    if (!running) {
        qatomic_set(&s->paused, true);
        s->paused_at_ns = now;
        npu_wait_engine_locked(s, "VM stop", &s->parked_cond,
                               npu_engine_parked, 0);
        trace_npu_vm_state(running, s->busy);
    } else if (s->paused) {
        int64_t d = qatomic_read(&s->deadline_ns);

        if (d != INT64_MAX) {
            qatomic_set(&s->deadline_ns, d + (now - s->paused_at_ns));
        }
        qatomic_set(&s->paused, false);
        qemu_cond_broadcast(&s->resume);
        qemu_cond_broadcast(&s->cond);
        if (s->irq_fire) {
            qemu_bh_schedule(s->irq_bh);
        }
        trace_npu_vm_state(running, s->busy);
    }
    qemu_mutex_unlock(&s->lock);
}

/*
 * The device's state is not migratable: a command may be in flight in
 * host threads and device memory is written through host pointers. QEMU
 * refuses to migrate or snapshot a VM with it, naming the device.
 */
static const VMStateDescription npu_vmstate = {
    .name = TYPE_NPU_PCI,
    .unmigratable = 1,
};

static const Property npu_properties[] = {
    DEFINE_PROP_UINT32("cores", NpuState, num_cores, 2),
    DEFINE_PROP_SIZE("mem-size", NpuState, mem_size, 512 * MiB),
    DEFINE_PROP_BOOL("boot-rom", NpuState, boot_rom, false),
    DEFINE_PROP_UINT32("cmd-budget-ms", NpuState, cmd_budget_ms, 2000),
    DEFINE_PROP_SIZE("mem-budget", NpuState, mem_budget, 1 * GiB),
    DEFINE_PROP_BOOL("dnnl", NpuState, use_dnnl, true),
    DEFINE_PROP_STRING("timing", NpuState, timing_name),
};

static void npu_class_init(ObjectClass *klass, void *data)
{
    DeviceClass *dc = DEVICE_CLASS(klass);
    ResettableClass *rc = RESETTABLE_CLASS(klass);
    PCIDeviceClass *k = PCI_DEVICE_CLASS(klass);

    k->realize = npu_realize;
    k->exit = npu_exit;
    k->config_write = npu_config_write;
    k->vendor_id = NPU_PCI_VENDOR_ID;
    k->device_id = NPU_PCI_DEVICE_ID;
    k->revision = NPU_PCI_REVISION;
    k->class_id = NPU_PCI_CLASS;
    dc->desc = "Emulated NPU (neural processing unit)";
    rc->phases.enter = npu_reset_enter;
    rc->phases.hold = npu_reset_hold;
    rc->phases.exit = npu_reset_exit;
    dc->vmsd = &npu_vmstate;
    device_class_set_props(dc, npu_properties);
    set_bit(DEVICE_CATEGORY_MISC, dc->categories);
}

static const TypeInfo npu_types[] = {
    {
        .name = TYPE_NPU_PCI,
        .parent = TYPE_PCI_DEVICE,
        .instance_size = sizeof(NpuState),
        .class_init = npu_class_init,
        .interfaces = (InterfaceInfo[]) {
            { INTERFACE_CONVENTIONAL_PCI_DEVICE },
            { },
        },
    },
};

DEFINE_TYPES(npu_types)
