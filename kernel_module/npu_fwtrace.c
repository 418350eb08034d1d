// SPDX-License-Identifier: GPL-2.0
/*
 * The device's trace ring (NPU_CAP_TRACE, docs/npu-spec.md 4.8): the
 * firmware's scheduler and the engines log events (a descriptor fetched,
 * a command or tile started and ended on a core, a transfer, a completion
 * written, an interrupt, a mailbox request and answer) with the device
 * clock into a ring in host memory. The driver turns tracing on while the
 * npu_fw_event tracepoint is enabled (looked at on every doorbell and
 * every watchdog period), drains the ring every watchdog period, when a
 * completion interrupt finds it half full, on a read of debugfs fwtrace
 * and before the device sleeps, and emits each record as an npu_fw_event
 * tracepoint, followed by an npu_clock_sync with the device clock of that
 * moment, so that a reader can put device time on the trace clock.
 */
#include <linux/dma-mapping.h>
#include <linux/seq_file.h>

#include "npu_drv.h"
#include "npu_trace.h"

#define NPU_FWTRACE_RECORDS	16384	/* 512 KiB */

static u32 npu_fwtrace_rd(struct npu_device *ndev, u32 reg)
{
	return npu_rd(ndev, NPU_TRACE_BASE + reg);
}

static void npu_fwtrace_wr(struct npu_device *ndev, u32 reg, u32 val)
{
	npu_wr(ndev, NPU_TRACE_BASE + reg, val);
}

static bool npu_fwtrace_supported(struct npu_device *ndev)
{
	return ndev->caps & NPU_CAP_TRACE && ndev->fwtrace;
}

static void npu_fwtrace_work(struct work_struct *work)
{
	npu_fwtrace_drain(container_of(work, struct npu_device, fwtrace_work));
}

int npu_fwtrace_init(struct npu_device *ndev)
{
	mutex_init(&ndev->fwtrace_lock);
	INIT_WORK(&ndev->fwtrace_work, npu_fwtrace_work);
	if (!(ndev->caps & NPU_CAP_TRACE))
		return 0;
	/*
	 * Freed with the queue rings when the last reference goes
	 * (npu_fwtrace_free()), not at unbind: a device that would not stop
	 * tracing keeps it.
	 */
	ndev->fwtrace = dma_alloc_coherent(&ndev->pdev->dev,
					   NPU_FWTRACE_RECORDS * sizeof(*ndev->fwtrace),
					   &ndev->fwtrace_dma, GFP_KERNEL);
	return ndev->fwtrace ? 0 : -ENOMEM;
}

/*
 * Probe: turn off tracing a previous driver (or kernel) left on, before
 * anything the device logs could reach memory that is no longer its ring.
 */
void npu_fwtrace_quiesce(struct npu_device *ndev)
{
	if (ndev->caps & NPU_CAP_TRACE)
		npu_fwtrace_wr(ndev, NPU_TRACE_CONTROL, 0);
}

void npu_fwtrace_free(struct npu_device *ndev)
{
	if (!ndev->fwtrace)
		return;
	if (ndev->fwtrace_stuck) {
		dev_warn(&ndev->pdev->dev, "tracing would not stop; leaking its ring\n");
		return;
	}
	dma_free_coherent(&ndev->pdev->dev, NPU_FWTRACE_RECORDS * sizeof(*ndev->fwtrace),
			  ndev->fwtrace, ndev->fwtrace_dma);
	ndev->fwtrace = NULL;
}

static void npu_fwtrace_drain_locked(struct npu_device *ndev);

/*
 * Program the ring after a reset, a resume or at probe: tracing off and
 * the ring empty (what a soft reset kept is emitted first);
 * npu_fwtrace_sync() turns it on. The device is awake and no doorbell
 * runs meanwhile: probe, or the caller holds submit_lock.
 */
void npu_fwtrace_start(struct npu_device *ndev)
{
	if (!npu_fwtrace_supported(ndev))
		return;
	mutex_lock(&ndev->fwtrace_lock);
	if (ndev->fwtrace_on &&
	    npu_fwtrace_rd(ndev, NPU_TRACE_CONTROL) & NPU_TRACE_ENABLE)
		npu_fwtrace_drain_locked(ndev);
	npu_fwtrace_wr(ndev, NPU_TRACE_CONTROL, 0);
	npu_fwtrace_wr(ndev, NPU_TRACE_RING_LO, lower_32_bits(ndev->fwtrace_dma));
	npu_fwtrace_wr(ndev, NPU_TRACE_RING_HI, upper_32_bits(ndev->fwtrace_dma));
	npu_fwtrace_wr(ndev, NPU_TRACE_RING_SIZE, NPU_FWTRACE_RECORDS);
	ndev->fwtrace_tail = 0;
	WRITE_ONCE(ndev->fwtrace_on, false);
	mutex_unlock(&ndev->fwtrace_lock);
	npu_fwtrace_sync(ndev);
}

/*
 * A completion interrupt: once the ring is half full, drain it from a work
 * item of normal priority (the waiters the interrupt thread woke run
 * first); below that the watchdog period or a reader's debugfs look
 * drains it, so that a traced run pays one register read per interrupt,
 * not a drain.
 */
void npu_fwtrace_kick(struct npu_device *ndev)
{
	u32 held;

	if (!npu_fwtrace_supported(ndev) || !READ_ONCE(ndev->fwtrace_on))
		return;
	held = npu_fwtrace_rd(ndev, NPU_TRACE_HEAD) - READ_ONCE(ndev->fwtrace_tail);
	if (held >= NPU_FWTRACE_RECORDS / 2)
		queue_work(system_wq, &ndev->fwtrace_work);
}

/*
 * The device is about to sleep (runtime suspend) or be let go (remove):
 * emit what it logged and turn tracing off; after remove's unplug nothing
 * turns it on again.
 */
void npu_fwtrace_stop(struct npu_device *ndev)
{
	if (!npu_fwtrace_supported(ndev))
		return;
	mutex_lock(&ndev->fwtrace_lock);
	if (ndev->fwtrace_on)
		npu_fwtrace_drain_locked(ndev);
	npu_fwtrace_wr(ndev, NPU_TRACE_CONTROL, 0);
	WRITE_ONCE(ndev->fwtrace_on, false);
	mutex_unlock(&ndev->fwtrace_lock);
}

/*
 * Remove (or a failed probe): tracing off for good, checked, and the drain
 * work finished and disabled, so that an interrupt thread still running
 * cannot queue it again.
 */
void npu_fwtrace_fini(struct npu_device *ndev)
{
	if (!npu_fwtrace_supported(ndev))
		return;
	disable_work_sync(&ndev->fwtrace_work);
	npu_fwtrace_stop(ndev);
	ndev->fwtrace_stuck = npu_fwtrace_rd(ndev, NPU_TRACE_CONTROL) & NPU_TRACE_ENABLE;
}

/* Emit the records the device wrote since the last drain. */
static void npu_fwtrace_drain_locked(struct npu_device *ndev)
{
	u32 head, n = 0;
	u64 now;

	lockdep_assert_held(&ndev->fwtrace_lock);
	head = npu_fwtrace_rd(ndev, NPU_TRACE_HEAD);
	if (head - ndev->fwtrace_tail > NPU_FWTRACE_RECORDS) {
		dev_warn_ratelimited(&ndev->pdev->dev,
				     "trace ring head %u beyond tail %u; skipped\n",
				     head, ndev->fwtrace_tail);
		ndev->fwtrace_tail = head;
	}
	dma_rmb();	/* the records before HEAD are written */
	while (ndev->fwtrace_tail != head) {
		/* One copy: the device could reuse the slot after TAIL moves. */
		struct npu_trace_rec rec =
			ndev->fwtrace[ndev->fwtrace_tail & (NPU_FWTRACE_RECORDS - 1)];

		trace_npu_fw_event(&rec);
		ndev->fwtrace_tail++;
		n++;
	}
	if (!n)
		return;
	npu_fwtrace_wr(ndev, NPU_TRACE_TAIL, ndev->fwtrace_tail);
	now = npu_rd(ndev, NPU_REG_TIMESTAMP_LO);
	now |= (u64)npu_rd(ndev, NPU_REG_TIMESTAMP_HI) << 32;
	trace_npu_clock_sync(now);
}

/*
 * Turn device tracing on or off to follow the npu_fw_event tracepoint;
 * nothing while the device sleeps (it has no ring then: the next doorbell
 * or watchdog period after the resume looks again).
 */
void npu_fwtrace_sync(struct npu_device *ndev)
{
	bool want = trace_npu_fw_event_enabled();

	if (!npu_fwtrace_supported(ndev) || want == READ_ONCE(ndev->fwtrace_on) ||
	    npu_unplugged(ndev))
		return;
	if (!npu_pm_get_if_active(ndev))
		return;
	mutex_lock(&ndev->fwtrace_lock);
	if (want != ndev->fwtrace_on) {
		if (!want)
			npu_fwtrace_drain_locked(ndev);
		npu_fwtrace_wr(ndev, NPU_TRACE_CONTROL, want ? NPU_TRACE_ENABLE : 0);
		WRITE_ONCE(ndev->fwtrace_on, want);
	}
	mutex_unlock(&ndev->fwtrace_lock);
	npu_pm_put_quiet(ndev);
}

/* Emit what the ring holds, if tracing is on and the device awake. */
void npu_fwtrace_drain(struct npu_device *ndev)
{
	npu_fwtrace_sync(ndev);
	if (!READ_ONCE(ndev->fwtrace_on) || !npu_pm_get_if_active(ndev))
		return;
	mutex_lock(&ndev->fwtrace_lock);
	if (ndev->fwtrace_on)
		npu_fwtrace_drain_locked(ndev);
	mutex_unlock(&ndev->fwtrace_lock);
	npu_pm_put_quiet(ndev);
}

/* For debugfs: whether tracing is on, and the device's indices. */
void npu_fwtrace_show(struct npu_device *ndev, struct seq_file *m)
{
	if (!npu_fwtrace_supported(ndev)) {
		seq_puts(m, "unsupported\n");
		return;
	}
	mutex_lock(&ndev->fwtrace_lock);
	if (npu_pm_get_if_active(ndev)) {
		if (ndev->fwtrace_on)
			npu_fwtrace_drain_locked(ndev);
		seq_printf(m, "on=%d records=%u head=%u tail=%u dropped=%u\n",
			   ndev->fwtrace_on, NPU_FWTRACE_RECORDS,
			   npu_fwtrace_rd(ndev, NPU_TRACE_HEAD), ndev->fwtrace_tail,
			   npu_fwtrace_rd(ndev, NPU_TRACE_DROPPED));
		npu_pm_put_quiet(ndev);
	} else {
		seq_printf(m, "on=0 records=%u suspended\n", NPU_FWTRACE_RECORDS);
	}
	mutex_unlock(&ndev->fwtrace_lock);
}
