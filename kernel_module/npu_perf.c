// SPDX-License-Identifier: GPL-2.0
/*
 * NPU performance counters (NPU_CAP_PERF, docs/npu-spec.md 4.7): one
 * consistent snapshot of every queue's and AI core's counts, for sysfs
 * (busy_us, device_time_us), debugfs (perf) and npu-smi. The device counts
 * all the time and keeps its counts across soft resets and D3hot; while it
 * sleeps the last snapshot is shown rather than waking it for a look.
 */
#include <linux/pm_runtime.h>

#include "npu_drv.h"

static u64 npu_perf_rd64(struct npu_device *ndev, u32 off)
{
	u64 lo = npu_rd(ndev, NPU_PERF_BASE + off);

	return lo | (u64)npu_rd(ndev, NPU_PERF_BASE + off + 4) << 32;
}

/*
 * npu_perf_read() - the counters now, or as last seen if the device sleeps.
 * Returns -EOPNOTSUPP without NPU_CAP_PERF.
 */
int npu_perf_read(struct npu_device *ndev, struct npu_perf_snap *snap)
{
	struct npu_perf_snap *last = &ndev->perf_last;
	u32 q, c, k;

	if (!(ndev->caps & NPU_CAP_PERF))
		return -EOPNOTSUPP;
	mutex_lock(&ndev->perf_lock);
	if (npu_pm_get_if_active(ndev)) {
		npu_wr(ndev, NPU_PERF_BASE + NPU_PERF_CONTROL, NPU_PERF_SNAPSHOT);
		last->time_ns = npu_perf_rd64(ndev, NPU_PERF_TIME_LO);
		for (q = 0; q < ndev->hw_queues; q++)
			for (c = 0; c < NPU_PERF_COUNTERS; c++)
				last->q[q][c] = npu_perf_rd64(ndev, NPU_PERF_Q(q, c));
		for (k = 0; k < min_t(u32, ndev->num_cores, NPU_PERF_MAX_CORES); k++)
			last->core[k] = npu_perf_rd64(ndev, NPU_PERF_CORE(k));
		npu_pm_put_quiet(ndev);
	}
	*snap = *last;
	mutex_unlock(&ndev->perf_lock);
	return 0;
}

/* The sum over queues of the time their commands ran, ns. */
u64 npu_perf_busy_ns(const struct npu_perf_snap *snap)
{
	u64 busy = 0;
	u32 q;

	for (q = 0; q < NPU_NUM_QUEUES; q++)
		busy += snap->q[q][NPU_PERF_BUSY_NS];
	return busy;
}

void npu_perf_init(struct npu_device *ndev)
{
	mutex_init(&ndev->perf_lock);
}
