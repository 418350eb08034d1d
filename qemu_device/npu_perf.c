/*
 * NPU performance counters (NPU_CAP_PERF): what each queue's commands did
 * (commands, busy time, multiply-adds, bytes moved, MMU walks, time in
 * WAIT) and how long each AI core worked, counted all the time and shown
 * as one consistent snapshot taken on request (docs/npu-spec.md 4.7).
 *
 * The queue counts grow when a command completes (the command processor,
 * under the device lock), from the NpuCmdStats every engine thread that
 * worked on the command added to. The cores' busy time is each core's own
 * count; a reset remembers where it stood, so no thread's count is ever
 * written by another.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/atomic.h"
#include "qemu/log.h"
#include "npu_dev.h"
#include "hw/misc/trace.h"

void npu_perf_init(NpuState *s)
{
    s->perf_core_zero = g_new0(uint64_t, s->num_cores);
    s->perf_snap_core = g_new0(uint64_t, s->num_cores);
}

void npu_perf_fini(NpuState *s)
{
    g_free(s->perf_core_zero);
    g_free(s->perf_snap_core);
}

/* Every count from 0 again (PERF_RESET, or a device reset). */
void npu_perf_reset_locked(NpuState *s)
{
    uint32_t k;

    memset(s->perf_q, 0, sizeof(s->perf_q));
    for (k = 0; k < s->num_cores; k++) {
        s->perf_core_zero[k] = qatomic_read(&s->cores.core[k].busy_ns);
    }
}

/* Count one command of queue @qi that completed (its record was written). */
void npu_perf_retire_locked(NpuState *s, int qi, const NpuMember *m)
{
    uint64_t *c = s->perf_q[qi];
    NpuQueue *q = &s->q[qi];

    c[NPU_PERF_CMDS]++;
    c[NPU_PERF_BUSY_NS] += le64_to_cpu(m->cpl.t_end) -
                           le64_to_cpu(m->cpl.t_start);
    c[NPU_PERF_MACS] += qatomic_read(&m->stats.macs);
    c[NPU_PERF_READ_BYTES] += qatomic_read(&m->stats.read_bytes);
    c[NPU_PERF_WRITE_BYTES] += qatomic_read(&m->stats.write_bytes);
    c[NPU_PERF_WALKS] += qatomic_read(&m->stats.walks);
    c[NPU_PERF_WALK_HITS] += qatomic_read(&m->stats.walk_hits);
    if (m->cmd.opcode == NPU_OP_WAIT && q->wait_timed &&
        q->wait_idx == m->idx) {
        c[NPU_PERF_WAIT_NS] += le64_to_cpu(m->cpl.t_end) - q->wait_since;
    }
    q->wait_timed = false;
}

static void npu_perf_snapshot_locked(NpuState *s)
{
    uint32_t k;

    memcpy(s->perf_snap_q, s->perf_q, sizeof(s->perf_q));
    for (k = 0; k < s->num_cores; k++) {
        s->perf_snap_core[k] = qatomic_read(&s->cores.core[k].busy_ns) -
                               s->perf_core_zero[k];
    }
    s->perf_snap_time = npu_dev_clock(s);
    s->perf_snapshots++;
    trace_npu_perf_snapshot(s->perf_snap_time);
}

/* A 64-bit snapshot value's half at @off (LO at an 8-byte boundary). */
static uint32_t npu_perf_half(uint64_t v, hwaddr off)
{
    return off & 4 ? v >> 32 : (uint32_t)v;
}

uint32_t npu_perf_read_locked(NpuState *s, hwaddr off)
{
    hwaddr q_end = NPU_PERF_Q(NPU_NUM_QUEUES, 0);
    hwaddr core_end = NPU_PERF_CORE(s->num_cores);

    switch (off) {
    case NPU_PERF_TIME_LO:
    case NPU_PERF_TIME_HI:
        return npu_perf_half(s->perf_snap_time, off);
    case NPU_PERF_SNAPSHOTS:
        return s->perf_snapshots;
    }
    if (off >= NPU_PERF_Q_BASE && off < q_end) {
        hwaddr rel = off - NPU_PERF_Q_BASE;

        return npu_perf_half(s->perf_snap_q[rel / NPU_PERF_Q_STRIDE]
                                           [rel % NPU_PERF_Q_STRIDE / 8], off);
    }
    if (off >= NPU_PERF_CORE_BASE && off < core_end) {
        return npu_perf_half(s->perf_snap_core[(off - NPU_PERF_CORE_BASE) / 8],
                             off);
    }
    npu_guest_error("npu: read of unknown register 0x%"
                    HWADDR_PRIx "\n", NPU_PERF_BASE + off);
    return 0;
}

void npu_perf_write_locked(NpuState *s, hwaddr off, uint32_t val)
{
    if (off != NPU_PERF_CONTROL ||
        (val & ~(NPU_PERF_SNAPSHOT | NPU_PERF_RESET))) {
        npu_guest_error("npu: write of 0x%x to read-only or"
                        " unknown register 0x%" HWADDR_PRIx "\n", val,
                        NPU_PERF_BASE + off);
        return;
    }
    /* Both bits: the snapshot has the counts up to the reset. */
    if (val & NPU_PERF_SNAPSHOT) {
        npu_perf_snapshot_locked(s);
    }
    if (val & NPU_PERF_RESET) {
        npu_perf_reset_locked(s);
    }
}
