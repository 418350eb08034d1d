/*
 * NPU chip timing model (the "timing" property, docs/npu-spec.md 12.2).
 *
 * In a timing mode each command still computes natively, bit for bit as
 * without the model, but it takes the time a chip description says it
 * would: a roofline of its multiply-adds on the chip's MAC array against
 * its bytes over the chip's DMA bandwidth, plus a fixed dispatch cost.
 * The device completes the command at that time on QEMU's virtual clock:
 * when the host was faster, the command processor waits; when the host
 * was slower (or the wait overslept), the difference is taken out of the
 * device clock (stolen), so that timestamps, counters and traces show
 * modelled time and back-to-back commands follow each other on it.
 *
 * The device clock never runs backwards: while a command computes, the
 * clock stands at the command's start (the host's time then is not chip
 * time); while it waits for its modelled end, the clock runs up to that
 * end and no further. A modelled command is not preempted (npu_cores.c),
 * so there is one such command at a time, on the command processor.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include <math.h>
#include "qemu/atomic.h"
#include "qemu/timer.h"
#include "qemu/units.h"
#include "qapi/error.h"
#include "npu_dev.h"
#include "hw/misc/trace.h"

/*
 * The chip descriptions. MAC rates are per cycle for int8; bf16 and fp16
 * run at half that rate, fp32 at a quarter (one MAC cell does four int8,
 * two 16-bit or one fp32 multiply-add per cycle).
 */
static const NpuChip npu_chips[] = {
    [NPU_TIMING_EDGE] = {
        .name = "edge",
        .mac_rows = 32, .mac_cols = 32, .clock_mhz = 1000,
        .sram_bytes = 2 * MiB, .dma_mb_per_s = 8000,
        .vector_bytes_per_cycle = 64, .cmd_overhead_ns = 2000,
        .eff_pct = { [NPU_EFF_GEMM] = 85, [NPU_EFF_CONV] = 75 },
    },
    [NPU_TIMING_DATACENTER] = {
        .name = "datacenter",
        .mac_rows = 128, .mac_cols = 128, .clock_mhz = 1500,
        .sram_bytes = 64 * MiB, .dma_mb_per_s = 1000000,
        .vector_bytes_per_cycle = 512, .cmd_overhead_ns = 1000,
        .eff_pct = { [NPU_EFF_GEMM] = 90, [NPU_EFF_CONV] = 70 },
    },
};

bool npu_timing_select(NpuState *s, Error **errp)
{
    uint32_t i;

    s->timing = NPU_TIMING_NATIVE;
    s->chip = NULL;
    s->timing_cap_ns = UINT64_MAX;
    if (!s->timing_name || !strcmp(s->timing_name, "native")) {
        return true;
    }
    for (i = 0; i < ARRAY_SIZE(npu_chips); i++) {
        if (npu_chips[i].name && !strcmp(s->timing_name, npu_chips[i].name)) {
            s->timing = i;
            s->chip = &npu_chips[i];
            return true;
        }
    }
    error_setg(errp, "npu: timing must be native, edge or datacenter");
    return false;
}

/*
 * The device clock: QEMU's virtual clock less the time stolen, and no
 * later than the cap (above). The command processor writes the stolen time
 * before it moves the cap; a reader that saw the stolen time change under
 * it reads again, so it never pairs a new cap with an old stolen time.
 */
uint64_t npu_dev_clock(NpuState *s)
{
    uint64_t stolen, cap, now;

    if (!s->chip) {
        return npu_now_ns();
    }
    do {
        stolen = qatomic_load_acquire(&s->timing_stolen_ns);
        cap = qatomic_load_acquire(&s->timing_cap_ns);
        now = npu_now_ns() - stolen;
    } while (qatomic_load_acquire(&s->timing_stolen_ns) != stolen);
    return MIN(now, cap);
}

/* The clock without the cap (the command processor's own view). */
static uint64_t npu_raw_clock(NpuState *s)
{
    return npu_now_ns() - qatomic_read(&s->timing_stolen_ns);
}

/* Hide @ns of host time from the device clock (the command processor). */
static void npu_timing_steal(NpuState *s, uint64_t ns)
{
    qatomic_store_release(&s->timing_stolen_ns,
                          qatomic_read(&s->timing_stolen_ns) + ns);
}

/* A modelled command starts computing at @t_start: the clock stands. */
void npu_timing_start(NpuState *s, uint64_t t_start)
{
    qatomic_store_release(&s->timing_cap_ns, t_start);
}

/* Multiply-adds per cycle of the MAC array for operands of @dtype. */
static uint64_t npu_chip_macs_per_cycle(const NpuChip *c, uint32_t dtype)
{
    uint64_t cells = (uint64_t)c->mac_rows * c->mac_cols;

    switch (dtype) {
    case NPU_DTYPE_INT8:
        return cells;
    case NPU_DTYPE_BF16:
    case NPU_DTYPE_FP16:
        return cells / 2;
    default:
        return cells / 4;
    }
}

/*
 * The modelled duration of a command that did @st's work (its
 * multiply-adds of @st->mac_dtype operands, its bytes), in ns, with the
 * compute and memory times of its roofline in *compute_ns and *mem_ns.
 */
uint64_t npu_timing_model(const NpuChip *c, uint16_t opcode,
                          const NpuCmdStats *st, uint64_t *compute_ns,
                          uint64_t *mem_ns)
{
    uint64_t bytes = qatomic_read(&st->read_bytes) +
                     qatomic_read(&st->write_bytes);
    uint64_t macs = qatomic_read(&st->macs);
    uint64_t traffic = bytes + (bytes > c->sram_bytes ?
                                bytes - c->sram_bytes : 0);
    double ghz = c->clock_mhz / 1000.0;

    if (macs) {
        uint32_t eff = opcode == NPU_OP_CONV2D ? c->eff_pct[NPU_EFF_CONV]
                                               : c->eff_pct[NPU_EFF_GEMM];
        double rate = npu_chip_macs_per_cycle(c, st->mac_dtype) * ghz *
                      eff / 100.0;

        *compute_ns = (uint64_t)ceil(macs / rate);
    } else {
        *compute_ns = (uint64_t)ceil(bytes / (c->vector_bytes_per_cycle *
                                              ghz));
    }
    /* MB/s = 10^6 bytes per 10^9 ns */
    *mem_ns = (uint64_t)ceil(traffic * 1000.0 / c->dma_mb_per_s);
    return c->cmd_overhead_ns + MAX(*compute_ns, *mem_ns);
}

/*
 * Finish command @m, which started at device time @t_start and did its
 * work: give it its modelled duration, waiting or stealing time as needed,
 * and fill in t_end. Returns the trace ring's CMD_END argument: compute ns
 * in bits 31..0, memory ns in bits 63..32 (each saturated).
 */
uint64_t npu_timing_finish(NpuState *s, NpuMember *m, uint64_t t_start)
{
    uint64_t compute_ns, mem_ns, dur, target, now;

    dur = npu_timing_model(s->chip, m->cmd.opcode, &m->stats, &compute_ns,
                           &mem_ns);
    target = t_start + dur;
    now = npu_raw_clock(s);
    if (now > target) {
        /* The host took longer than the chip would: hide the difference. */
        npu_timing_steal(s, now - target);
    }
    /* The clock runs again, up to the command's end. */
    qatomic_store_release(&s->timing_cap_ns, target);
    while ((now = npu_raw_clock(s)) < target) {
        /* A reset or unplug does not wait; the host budget does not apply. */
        if (npu_engine_poll(s) == NPU_ST_ABORTED) {
            break;
        }
        g_usleep(MIN((target - now) / 1000 + 1, 1000));
    }
    if (now > target) {
        npu_timing_steal(s, now - target);     /* the wait overslept */
        now = target;
    }
    qatomic_store_release(&s->timing_cap_ns, UINT64_MAX);
    /* An aborted command ends now; its completion is not written anyway. */
    m->cpl.t_end = cpu_to_le64(now);
    trace_npu_timing(m->cmd.fence, dur, compute_ns, mem_ns);
    return MIN(compute_ns, UINT32_MAX) | MIN(mem_ns, UINT32_MAX) << 32;
}
