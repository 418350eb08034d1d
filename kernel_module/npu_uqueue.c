// SPDX-License-Identifier: GPL-2.0
/*
 * NPU user-mode queues: a hardware queue lent to one open file. The
 * process writes descriptors into a ring mapped into its address space and
 * rings a doorbell page mapped from BAR0, with no system call per command.
 * Safety comes from the device: the queue is confined to the file's
 * address space (its own page table), so a descriptor can reach nothing
 * but the file's buffers; an address outside them faults, the device stops
 * the queue, and the file is marked faulted.
 *
 * mmap offsets below 4 GiB (BO handle 0) are queue regions:
 *   (q << 24)          the doorbell page of hardware queue q
 *   (q << 24) + 1 MiB  the queue memory: ring, completions, fence record
 */
#include <linux/capability.h>
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/ktime.h>
#include <linux/mm.h>
#include <linux/poll.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>

#include "npu_drv.h"

#define NPU_UQ_REGION_SHIFT	24
#define NPU_UQ_MEM_OFFSET	SZ_1M
#define NPU_UQ_QUIESCE_US	(10 * USEC_PER_SEC)

static u64 npu_uq_region(u32 index)
{
	return (u64)index << NPU_UQ_REGION_SHIFT;
}

static void npu_uqueue_free(struct kref *ref)
{
	struct npu_uqueue *uq = container_of(ref, struct npu_uqueue, ref);
	struct npu_device *ndev = uq->ndev;

	/* No job waits on the write-back any more: they held the queue. */
	if (uq->wb_kva)
		npu_vm_unmap(&ndev->kvm, uq->wb_kva, PAGE_SIZE);
	if (uq->mem)
		dma_free_coherent(&ndev->pdev->dev, uq->mem_size, uq->mem, uq->mem_dma);
	kfree(uq);
	npu_device_put(ndev);
}

void npu_uqueue_put(struct npu_uqueue *uq)
{
	kref_put(&uq->ref, npu_uqueue_free);
}

/* The user queue @index of @ctx (not one taken back); caller holds uq_mutex. */
static struct npu_uqueue *npu_uqueue_find(struct npu_context *ctx, u32 index)
{
	struct npu_device *ndev = ctx->ndev;

	lockdep_assert_held(&ndev->uq_mutex);
	if (index == 0 || index >= ndev->hw_queues)
		return NULL;
	if (!ndev->uq[index] || ndev->uq[index]->ctx != ctx || ndev->uq[index]->draining)
		return NULL;
	return ndev->uq[index];
}

/*
 * A reference to hardware queue @index if @ctx holds it as a user queue,
 * else NULL: what a SUBMIT dependency on a user-queue fence waits on.
 */
struct npu_uqueue *npu_uqueue_get_owned(struct npu_context *ctx, u32 index)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_uqueue *uq;

	mutex_lock(&ndev->uq_mutex);
	uq = npu_uqueue_find(ctx, index);
	if (uq)
		kref_get(&uq->ref);
	mutex_unlock(&ndev->uq_mutex);
	return uq;
}

/*
 * Whether the device may still run a command of @uq, which holds a
 * hardware queue: attached and not stopped, or draining. Caller holds
 * uq_mutex.
 */
static bool npu_uqueue_may_run(struct npu_uqueue *uq)
{
	lockdep_assert_held(&uq->ndev->uq_mutex);
	return !uq->stopped || uq->draining;
}

/*
 * Whether a user queue of @ctx is running a command (the device reports
 * it ACTIVE): a buffer freed now would have to wait for it.
 */
bool npu_uqueue_busy(struct npu_context *ctx)
{
	struct npu_device *ndev = ctx->ndev;
	bool busy = false;
	u32 i;

	if (!atomic_read(&ctx->num_uqs))
		return false;
	mutex_lock(&ndev->uq_mutex);
	for (i = 1; i < ndev->hw_queues && !busy && !npu_unplugged(ndev); i++)
		busy = ndev->uq[i] && ndev->uq[i]->ctx == ctx && npu_uqueue_may_run(ndev->uq[i]) &&
		       (npu_rd(ndev, NPU_QREG(i, NPU_Q_STATUS)) & NPU_QSTAT_ACTIVE);
	mutex_unlock(&ndev->uq_mutex);
	return busy;
}

/*
 * Called after the PTEs of a buffer of @ctx were cleared and before its
 * pages are freed: a command of the context's user queues that started
 * earlier may hold the old translations (the device reads page tables
 * once per command), so wait until each has moved on (HEAD moved, ACTIVE
 * cleared, or the queue stopped or was taken back). uq_mutex is held only
 * to look, while it keeps the device bound, never across the wait: a long
 * command must not hold up other files' queue calls, nor the watchdog's
 * reset, which also ends the wait. Returns -ETIMEDOUT if a command still
 * runs after NPU_UQ_QUIESCE_US: the caller must then not free the memory.
 */
int npu_uqueue_sync(struct npu_context *ctx)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_uqueue *uqs[NPU_NUM_QUEUES] = {};
	u32 heads[NPU_NUM_QUEUES] = {};
	ktime_t deadline;
	bool busy;
	u32 i;

	/* Most files have no user queue: no lock on their BO frees. */
	if (!atomic_read(&ctx->num_uqs))
		return 0;
	mutex_lock(&ndev->uq_mutex);
	/* After an unbind the device was reset: nothing runs. */
	for (i = 1; i < ndev->hw_queues && !npu_unplugged(ndev); i++) {
		if (ndev->uq[i] && ndev->uq[i]->ctx == ctx && npu_uqueue_may_run(ndev->uq[i])) {
			uqs[i] = ndev->uq[i];
			heads[i] = npu_rd(ndev, NPU_QREG(i, NPU_Q_HEAD));
		}
	}
	mutex_unlock(&ndev->uq_mutex);

	deadline = ktime_add_us(ktime_get(), NPU_UQ_QUIESCE_US);
	for (;;) {
		busy = false;
		mutex_lock(&ndev->uq_mutex);
		for (i = 1; i < ndev->hw_queues && !npu_unplugged(ndev); i++) {
			if (!uqs[i])
				continue;
			/* Taken back (its command stopped), or stopped. */
			if (ndev->uq[i] != uqs[i] || !npu_uqueue_may_run(uqs[i]) ||
			    !(npu_rd(ndev, NPU_QREG(i, NPU_Q_STATUS)) & NPU_QSTAT_ACTIVE) ||
			    npu_rd(ndev, NPU_QREG(i, NPU_Q_HEAD)) != heads[i])
				uqs[i] = NULL;
			else
				busy = true;
		}
		mutex_unlock(&ndev->uq_mutex);
		if (!busy)
			return 0;
		if (ktime_after(ktime_get(), deadline)) {
			dev_err(&ndev->pdev->dev, "user queue command did not finish\n");
			return -ETIMEDOUT;
		}
		usleep_range(20, 100);
	}
}

/*
 * Zap the process's doorbell mapping of @uq; caller holds uq_mutex. Every
 * file of the device shares the DRM device's address_space, and queue
 * regions are per hardware queue, so this reaches only @uq's doorbell.
 */
static void npu_uqueue_zap(struct npu_uqueue *uq)
{
	lockdep_assert_held(&uq->ndev->uq_mutex);
	unmap_mapping_range(uq->ndev->drm.anon_inode->i_mapping,
			    npu_uq_region(uq->index), NPU_UQ_MEM_OFFSET, 1);
}

/*
 * Wake @uq's waiters and its file's pollers (a completion, a stop). Caller
 * holds uq_mutex, which keeps uq->ctx alive while the queue is attached.
 */
static void npu_uqueue_wake(struct npu_uqueue *uq)
{
	lockdep_assert_held(&uq->ndev->uq_mutex);
	wake_up_all(&uq->wq);
	if (uq->ctx)
		wake_up_all(&uq->ctx->poll_wq);
}

/* The firmware takes queue @i out of its scheduler (errors only logged). */
static void npu_uqueue_forget(struct npu_device *ndev, u32 i)
{
	u32 resp[2];
	int ret;

	ret = npu_mbox_call(ndev, NPU_MBOX_DESTROY_QUEUE, i, 0, resp);
	if (ret)
		dev_warn(&ndev->pdev->dev, "firmware did not destroy queue %u: %d\n", i, ret);
}

/* What a draining queue held, dropped outside uq_mutex (a context put frees BOs). */
static void npu_uqueue_release_work(struct work_struct *work)
{
	struct npu_uqueue *uq = container_of(work, struct npu_uqueue, release_work);
	struct npu_context *ctx = uq->drain_ctx;
	struct npu_device *ndev = uq->ndev;

	uq->drain_ctx = NULL;
	npu_context_put(ctx);
	/* The queue kept the device awake (npu_pm.c); its registers are done. */
	npu_pm_put(ndev);
	npu_uqueue_put(uq);
}

/*
 * The device runs no command of draining @uq any more (it stopped, or
 * @reset: a device reset stopped everything and cleared the queue's
 * registers): give the hardware queue back and let the context go.
 * Caller holds uq_mutex.
 */
static void npu_uqueue_drained(struct npu_uqueue *uq, bool reset)
{
	struct npu_device *ndev = uq->ndev;
	u32 i = uq->index;

	lockdep_assert_held(&ndev->uq_mutex);
	if (!reset && !npu_unplugged(ndev)) {
		npu_wr(ndev, NPU_QREG(i, NPU_Q_MMU_L1_ENTRIES), 0);
		npu_uqueue_forget(ndev, i);
	}
	ndev->uq[i] = NULL;
	atomic_dec(&uq->ctx->num_uqs);
	uq->draining = false;
	npu_uqueue_wake(uq);
	uq->drain_ctx = uq->ctx;
	uq->ctx = NULL;
	/* The table's reference goes with the rest, after uq_mutex. */
	queue_work(npu_wq, &uq->release_work);
}

/*
 * Take @uq back from its file (QUEUE_DESTROY, close): disable the
 * hardware queue, which stops its command at the next control point, or a
 * preempted one once the command in front of it ends (spec 5.2); zap the
 * doorbell; wake the waiters (-EIO). The queue is draining from here on:
 * out of the file's reach but still holding the hardware queue and the
 * file's context, so nothing of the file's is freed under a command that
 * has not stopped yet. The queue memory stays while the process maps it.
 * Caller holds uq_mutex; npu_uqueue_drain() follows, without it.
 */
static void npu_uqueue_detach(struct npu_uqueue *uq)
{
	struct npu_device *ndev = uq->ndev;

	lockdep_assert_held(&ndev->uq_mutex);
	kref_get(&uq->ctx->ref);	/* dropped by npu_uqueue_release_work() */
	uq->stopped = true;
	uq->draining = true;
	/* After an unbind the registers are gone, and the device was reset. */
	if (!npu_unplugged(ndev))
		npu_wr(ndev, NPU_QREG(uq->index, NPU_Q_CONTROL), 0);
	npu_uqueue_zap(uq);
	npu_uqueue_wake(uq);
	if (npu_unplugged(ndev))
		npu_uqueue_drained(uq, true);
}

/*
 * Wait, without uq_mutex (every file's poll, WAIT and the watchdog go on),
 * until detached @uq has drained. A command that does not stop within
 * NPU_UQ_QUIESCE_US is stuck: the queue stays draining, its file's memory
 * pinned, until the reset the watchdog does for it (npu_uqueue_reset_done()).
 */
static void npu_uqueue_drain(struct npu_uqueue *uq)
{
	struct npu_device *ndev = uq->ndev;
	ktime_t deadline = ktime_add_us(ktime_get(), NPU_UQ_QUIESCE_US);
	bool draining;

	for (;;) {
		mutex_lock(&ndev->uq_mutex);
		draining = uq->draining;
		if (draining && (npu_unplugged(ndev) ||
				 !(npu_rd(ndev, NPU_QREG(uq->index, NPU_Q_STATUS)) &
				   NPU_QSTAT_ACTIVE))) {
			npu_uqueue_drained(uq, npu_unplugged(ndev));
			draining = false;
		}
		mutex_unlock(&ndev->uq_mutex);
		if (!draining)
			return;
		if (ktime_after(ktime_get(), deadline)) {
			dev_err(&ndev->pdev->dev,
				"queue %u: command did not stop; its file's memory stays until a reset\n",
				uq->index);
			return;
		}
		usleep_range(20, 100);
	}
}

/*
 * The device was reset (and stopped): every draining queue has drained.
 * Caller holds uq_mutex.
 */
void npu_uqueue_reset_done(struct npu_device *ndev)
{
	u32 i;

	lockdep_assert_held(&ndev->uq_mutex);
	for (i = 1; i < ndev->hw_queues; i++)
		if (ndev->uq[i] && ndev->uq[i]->draining)
			npu_uqueue_drained(ndev->uq[i], true);
}

/*
 * Program hardware queue @uq->index for @uq, have the firmware create it
 * (mailbox CREATE_QUEUE: its scheduler runs only queues it created) and
 * enable it at ring index @head. Caller holds uq_mutex.
 */
static int npu_uqueue_start(struct npu_uqueue *uq, u32 priority, u32 head)
{
	u32 resp[2];
	int ret;

	struct npu_device *ndev = uq->ndev;
	u32 i = uq->index;
	dma_addr_t cpl = uq->mem_dma + (u64)uq->entries * sizeof(struct npu_cmd);
	dma_addr_t wb = uq->mem_dma + ((u8 *)uq->wb - (u8 *)uq->mem);

	npu_wr(ndev, NPU_QREG(i, NPU_Q_CONTROL), 0);
	npu_wr(ndev, NPU_QREG(i, NPU_Q_RING_LO), lower_32_bits(uq->mem_dma));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_RING_HI), upper_32_bits(uq->mem_dma));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_RING_SIZE), uq->entries);
	npu_wr(ndev, NPU_QREG(i, NPU_Q_CPL_LO), lower_32_bits(cpl));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_CPL_HI), upper_32_bits(cpl));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_FENCE_LO), lower_32_bits(wb));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_FENCE_HI), upper_32_bits(wb));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_MMU_L1_LO), lower_32_bits(uq->ctx->vm.l1_dma));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_MMU_L1_HI), upper_32_bits(uq->ctx->vm.l1_dma));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_MMU_L1_ENTRIES), NPU_MMU_MAX_L1);
	npu_wr(ndev, NPU_QREG(i, NPU_Q_PRIORITY), priority);
	/* Descriptors asking for an interrupt (NPU_CMD_F_IRQ) share them. */
	npu_queue_moderate(ndev, i);
	npu_wr(ndev, NPU_QREG(i, NPU_Q_HEAD), head);
	ret = npu_mbox_call(ndev, NPU_MBOX_CREATE_QUEUE, i, priority, resp);
	if (ret) {
		dev_err(&ndev->pdev->dev, "firmware did not create queue %u: %d\n", i, ret);
		return ret;
	}
	npu_wr(ndev, NPU_QREG(i, NPU_Q_CONTROL), NPU_QCTL_ENABLE);
	return 0;
}

static int npu_uqueue_alloc_mem(struct npu_uqueue *uq)
{
	size_t ring = (size_t)uq->entries * sizeof(struct npu_cmd);
	size_t cpl = (size_t)uq->entries * sizeof(struct npu_cpl);

	uq->mem_size = PAGE_ALIGN(ring + cpl) + PAGE_SIZE;
	uq->mem = dma_alloc_coherent(&uq->ndev->pdev->dev, uq->mem_size,
				     &uq->mem_dma, GFP_KERNEL);
	if (!uq->mem)
		return -ENOMEM;
	uq->wb = uq->mem + PAGE_ALIGN(ring + cpl);
	/* Queue-0 jobs that depend on this queue's fences WAIT on it. */
	uq->wb_kva = npu_vm_map_dma(&uq->ndev->kvm, uq->mem_dma + PAGE_ALIGN(ring + cpl),
				    PAGE_SIZE, false);
	return uq->wb_kva ? 0 : -ENOMEM;
}

int npu_ioctl_queue_create(struct npu_context *ctx, void *data)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_queue_create *args = data;
	struct npu_uqueue *uq;
	u64 mem_size, fence_offset;
	u32 i;
	int ret;

	if (args->flags || args->queue || args->mem_offset || args->mem_size ||
	    args->cpl_offset || args->fence_offset || args->doorbell_offset ||
	    !is_power_of_2(args->entries) || args->entries < NPU_QUEUE_MIN_ENTRIES ||
	    args->entries > NPU_QUEUE_MAX_ENTRIES || args->priority > NPU_Q_PRIORITY_MAX)
		return -EINVAL;
	if (args->priority > NPU_QUEUE_PRIORITY_USER && !capable(CAP_SYS_NICE))
		return -EACCES;
	if (READ_ONCE(ctx->faulted))
		return -EBADFD;
	if (READ_ONCE(ctx->banned) || READ_ONCE(ndev->wedged))
		return -EIO;

	uq = kzalloc(sizeof(*uq), GFP_KERNEL);
	if (!uq)
		return -ENOMEM;
	kref_init(&uq->ref);
	init_waitqueue_head(&uq->wq);
	INIT_WORK(&uq->release_work, npu_uqueue_release_work);
	uq->ndev = ndev;
	npu_device_get(ndev);
	uq->entries = args->entries;
	ret = npu_uqueue_alloc_mem(uq);
	if (ret)
		goto err_put;
	/* Awake while the queue is lent: the process drives the hardware. */
	ret = npu_pm_get(ndev);
	if (ret)
		goto err_put;

	mutex_lock(&ndev->uq_mutex);
	for (i = 1; i < ndev->hw_queues && ndev->uq[i]; i++)
		;
	if (i >= ndev->hw_queues) {
		mutex_unlock(&ndev->uq_mutex);
		ret = -EBUSY;
		goto err_pm_put;
	}
	uq->index = i;
	uq->ctx = ctx;
	uq->priority = args->priority;
	ret = npu_uqueue_start(uq, args->priority, 0);
	if (ret) {
		/* Leave nothing of the file's in the disabled queue's registers. */
		npu_wr(ndev, NPU_QREG(i, NPU_Q_MMU_L1_ENTRIES), 0);
		mutex_unlock(&ndev->uq_mutex);
		ret = -EIO;
		goto err_pm_put;
	}
	mem_size = uq->mem_size;
	fence_offset = (u8 *)uq->wb - (u8 *)uq->mem;
	ndev->uq[i] = uq;
	atomic_inc(&ctx->num_uqs);
	mutex_unlock(&ndev->uq_mutex);

	/*
	 * Published: another thread's QUEUE_DESTROY may free @uq from here on,
	 * so the results come from what this thread computed, not from @uq.
	 * DRM copies them out; should that fault, the queue stays the file's.
	 */
	args->queue = i;
	args->doorbell_offset = npu_uq_region(i);
	args->mem_offset = npu_uq_region(i) + NPU_UQ_MEM_OFFSET;
	args->mem_size = mem_size;
	args->cpl_offset = (u64)args->entries * sizeof(struct npu_cmd);
	args->fence_offset = fence_offset;
	return 0;

err_pm_put:
	npu_pm_put(ndev);
err_put:
	npu_uqueue_put(uq);
	return ret;
}

int npu_ioctl_queue_destroy(struct npu_context *ctx, void *data)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_queue_destroy *args = data;
	struct npu_uqueue *uq;

	if (args->rsvd)
		return -EINVAL;
	mutex_lock(&ndev->uq_mutex);
	uq = npu_uqueue_find(ctx, args->queue);
	if (uq) {
		kref_get(&uq->ref);
		npu_uqueue_detach(uq);
	}
	mutex_unlock(&ndev->uq_mutex);
	if (!uq)
		return -ENOENT;
	npu_uqueue_drain(uq);
	npu_uqueue_put(uq);
	return 0;
}

/* The file is closing: take its queues back. */
void npu_uqueue_release_all(struct npu_context *ctx)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_uqueue *uqs[NPU_NUM_QUEUES] = {};
	u32 i;

	mutex_lock(&ndev->uq_mutex);
	for (i = 1; i < ndev->hw_queues; i++) {
		uqs[i] = npu_uqueue_find(ctx, i);
		if (uqs[i]) {
			kref_get(&uqs[i]->ref);
			npu_uqueue_detach(uqs[i]);
		}
	}
	mutex_unlock(&ndev->uq_mutex);
	for (i = 1; i < NPU_NUM_QUEUES; i++) {
		if (uqs[i]) {
			npu_uqueue_drain(uqs[i]);
			npu_uqueue_put(uqs[i]);
		}
	}
}

/*
 * The device is going away or was reset: every user queue stops (its
 * state in the device is gone); waiters get -EIO, with NPU_ST_TIMEOUT on
 * queue @hung (0: none) whose command hung. Caller holds uq_mutex.
 */
void npu_uqueue_stop_all(struct npu_device *ndev, u32 hung)
{
	u32 i;

	for (i = 1; i < ndev->hw_queues; i++) {
		struct npu_uqueue *uq = ndev->uq[i];

		if (!uq)
			continue;
		if (!uq->stopped) {
			uq->stopped = true;
			uq->error = NPU_ERR_NONE;
			uq->hung = i == hung;
		}
		npu_uqueue_zap(uq);
		npu_uqueue_wake(uq);
	}
}

/*
 * The device stopped @uq: record why, and for an MMU fault the faulting
 * command's fence (Q_DONE), and mark the owning file faulted. Caller holds
 * uq_mutex; the queue is attached and the device bound.
 */
static void npu_uqueue_note_stop(struct npu_uqueue *uq)
{
	struct npu_device *ndev = uq->ndev;
	u32 i = uq->index;

	uq->error = npu_rd(ndev, NPU_QREG(i, NPU_Q_ERROR));
	uq->fault_fence = npu_rd(ndev, NPU_QREG(i, NPU_Q_DONE_LO)) |
			  (u64)npu_rd(ndev, NPU_QREG(i, NPU_Q_DONE_HI)) << 32;
	uq->stopped = true;
	if (uq->error == NPU_ERR_MMU_FAULT)
		WRITE_ONCE(uq->ctx->faulted, true);
	dev_warn_ratelimited(&ndev->pdev->dev,
			     "user queue %u (client %llu) stopped: error %u\n",
			     i, uq->ctx->client_id, uq->error);
	npu_uqueue_wake(uq);
}

/*
 * A device reset is coming (hang, lost firmware): note where each running
 * user queue is, so that npu_uqueue_resume_all() restarts it there. The
 * device runs one command at a time, so no other queue has a command half
 * done; queue @hung (0: none), whose command hung, stops instead (its
 * waiters get NPU_ST_TIMEOUT). Caller holds uq_mutex; the device is bound.
 */
void npu_uqueue_suspend_all(struct npu_device *ndev, u32 hung)
{
	u32 i;

	for (i = 1; i < ndev->hw_queues; i++) {
		struct npu_uqueue *uq = ndev->uq[i];

		if (!uq || uq->stopped)
			continue;
		if (i == hung) {
			uq->stopped = true;
			uq->error = NPU_ERR_NONE;
			uq->hung = true;
			npu_uqueue_zap(uq);
			npu_uqueue_wake(uq);
			continue;
		}
		uq->resume_head = npu_rd(ndev, NPU_QREG(i, NPU_Q_HEAD));
		uq->resume_tail = npu_rd(ndev, NPU_QREG(i, NPU_Q_TAIL));
		uq->resume = true;
	}
}

/*
 * After the reset and npu_hw_start(): program the suspended queues again
 * and ring them where they were; their processes notice nothing but the
 * delay. Caller holds uq_mutex.
 */
void npu_uqueue_resume_all(struct npu_device *ndev)
{
	u32 i;

	for (i = 1; i < ndev->hw_queues; i++) {
		struct npu_uqueue *uq = ndev->uq[i];

		if (!uq || !uq->resume)
			continue;
		uq->resume = false;
		if (uq->stopped)
			continue;
		if (npu_uqueue_start(uq, uq->priority, uq->resume_head)) {
			uq->stopped = true;
			uq->error = NPU_ERR_NONE;
			npu_uqueue_zap(uq);
			npu_uqueue_wake(uq);
			continue;
		}
		npu_wr(ndev, NPU_DOORBELL(i), uq->resume_tail);
	}
}

/*
 * The device raised an error: find the user queues it stopped. A stop on
 * an MMU fault marks the owning file faulted.
 */
void npu_uqueue_check_stopped(struct npu_device *ndev)
{
	u32 i;

	mutex_lock(&ndev->uq_mutex);
	for (i = 1; i < ndev->hw_queues && !npu_unplugged(ndev); i++) {
		struct npu_uqueue *uq = ndev->uq[i];

		if (!uq || uq->stopped ||
		    !(npu_rd(ndev, NPU_QREG(i, NPU_Q_STATUS)) & NPU_QSTAT_STOPPED))
			continue;
		npu_uqueue_note_stop(uq);
	}
	mutex_unlock(&ndev->uq_mutex);
}

/* The file user queue @index is lent to, or NULL; caller holds uq_mutex. */
struct npu_context *npu_uqueue_owner(struct npu_device *ndev, u32 index)
{
	return ndev->uq[index] ? ndev->uq[index]->ctx : NULL;
}

/* Completion interrupt of hardware queue @index (0: every user queue). */
void npu_uqueue_irq(struct npu_device *ndev, u32 index)
{
	u32 i;

	mutex_lock(&ndev->uq_mutex);
	for (i = index ?: 1; i < (index ? index + 1 : ndev->hw_queues); i++)
		if (ndev->uq[i])
			npu_uqueue_wake(ndev->uq[i]);
	mutex_unlock(&ndev->uq_mutex);
}

static bool npu_uqueue_done(struct npu_uqueue *uq, u64 fence)
{
	return READ_ONCE(uq->wb->value) >= fence || READ_ONCE(uq->stopped);
}

/*
 * The device stops a faulting queue just before it writes the command's
 * completion: give it a moment, so that whoever learns of the fault from
 * WAIT also finds the completion record (bounded: the device may be gone).
 */
static void npu_uqueue_await_record(struct npu_uqueue *uq, u64 fence)
{
	int i;

	for (i = 0; i < 1000 && READ_ONCE(uq->wb->value) < fence; i++)
		usleep_range(10, 20);
}

/*
 * Did @uq stop on an MMU fault at @fence or before? The device stops a
 * confined queue before it writes the faulting command's completion, so
 * a fence record that reached @fence may be that command's: the queue's
 * registers tell, before the error interrupt has been handled.
 */
static bool npu_uqueue_faulted_at(struct npu_uqueue *uq, u64 fence)
{
	struct npu_device *ndev = uq->ndev;
	bool faulted = false;

	if (READ_ONCE(uq->wb->value) > fence)
		return false;	/* completed before anything stopped it */
	mutex_lock(&ndev->uq_mutex);
	if (!uq->stopped && ndev->uq[uq->index] == uq && !npu_unplugged(ndev) &&
	    (npu_rd(ndev, NPU_QREG(uq->index, NPU_Q_STATUS)) & NPU_QSTAT_STOPPED))
		npu_uqueue_note_stop(uq);
	faulted = uq->stopped && uq->error == NPU_ERR_MMU_FAULT &&
		  fence >= uq->fault_fence;
	mutex_unlock(&ndev->uq_mutex);
	if (faulted)
		npu_uqueue_await_record(uq, uq->fault_fence);
	return faulted;
}

/*
 * WAIT on a user queue: until its fence record reaches @args->fence. A
 * queue the device stopped gives -EBADFD after an MMU fault (the file is
 * faulted), else -EIO (NPU_ST_ABORTED in status); error_fence is the last
 * fence it completed.
 */
int npu_uqueue_wait(struct npu_context *ctx, struct npu_wait *args)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_uqueue *uq;
	ktime_t timeout;
	int ret;

	if (args->queue >= ndev->hw_queues)
		return -EINVAL;
	mutex_lock(&ndev->uq_mutex);
	uq = npu_uqueue_find(ctx, args->queue);
	if (uq)
		kref_get(&uq->ref);
	mutex_unlock(&ndev->uq_mutex);
	if (!uq)
		return -ENOENT;

	ret = 0;
	if (!npu_uqueue_done(uq, args->fence)) {
		timeout = npu_deadline_left(args->deadline_ns);
		if (!timeout)
			ret = -ETIMEDOUT;
		else
			ret = wait_event_interruptible_hrtimeout(uq->wq,
								 npu_uqueue_done(uq, args->fence),
								 timeout);
		/* -ERESTARTSYS: the deadline is absolute, so a restart is exact. */
		if (ret == -ETIME)
			ret = -ETIMEDOUT;
	}
	if (!ret && npu_uqueue_faulted_at(uq, args->fence)) {
		/* The fence is the command that faulted (or after it). */
		args->error_fence = uq->fault_fence;
		args->status = NPU_ST_MMU_FAULT;
		ret = -EBADFD;
	} else if (!ret && READ_ONCE(uq->wb->value) < args->fence) {
		/* Stopped before the fence. */
		args->error_fence = READ_ONCE(uq->wb->value);
		if (uq->error == NPU_ERR_MMU_FAULT) {
			npu_uqueue_await_record(uq, uq->fault_fence);
			args->error_fence = uq->fault_fence;
			args->status = NPU_ST_MMU_FAULT;
			ret = -EBADFD;
		} else {
			args->status = uq->hung ? NPU_ST_TIMEOUT : NPU_ST_ABORTED;
			ret = -EIO;
		}
	}
	npu_uqueue_put(uq);
	return ret;
}

static void npu_uqueue_vm_open(struct vm_area_struct *vma)
{
	struct npu_uqueue *uq = vma->vm_private_data;

	kref_get(&uq->ref);
}

static void npu_uqueue_vm_close(struct vm_area_struct *vma)
{
	npu_uqueue_put(vma->vm_private_data);
}

static const struct vm_operations_struct npu_uqueue_vm_ops = {
	.open = npu_uqueue_vm_open,
	.close = npu_uqueue_vm_close,
};

/*
 * The doorbell page, inserted on first touch and only while the queue is
 * still lent to the mapping's file: the check and the insert are under
 * uq_mutex, which every zap of it holds (npu_uqueue_zap()), so a PTE is
 * either zapped or never made. Inserting at mmap time instead, before the
 * vma is linked into the address_space, would let a zap run in between
 * and miss it. Inside drm_dev_enter(): an unplug's zap comes after.
 */
static vm_fault_t npu_uqueue_bell_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct npu_uqueue *uq = vma->vm_private_data;
	struct npu_device *ndev = uq->ndev;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	phys_addr_t bell;
	int idx;

	if (!npu_dev_enter(ndev, &idx))
		return VM_FAULT_SIGBUS;
	mutex_lock(&ndev->uq_mutex);
	if (ndev->uq[uq->index] == uq && !uq->stopped) {
		bell = pci_resource_start(ndev->pdev, NPU_BAR_REGS) + NPU_DOORBELL(uq->index);
		ret = vmf_insert_pfn(vma, vma->vm_start, bell >> PAGE_SHIFT);
	}
	mutex_unlock(&ndev->uq_mutex);
	npu_dev_exit(ndev, idx);
	return ret;
}

static const struct vm_operations_struct npu_uqueue_bell_vm_ops = {
	.fault = npu_uqueue_bell_fault,
	.open = npu_uqueue_vm_open,
	.close = npu_uqueue_vm_close,
};

/* mmap of a queue region (offset below 4 GiB), inside npu_dev_enter(). */
int npu_uqueue_mmap(struct npu_context *ctx, struct vm_area_struct *vma)
{
	struct npu_device *ndev = ctx->ndev;
	u64 offset = (u64)vma->vm_pgoff << PAGE_SHIFT;
	u64 len = vma->vm_end - vma->vm_start;
	u32 index = offset >> NPU_UQ_REGION_SHIFT;
	u64 within = offset & (BIT_ULL(NPU_UQ_REGION_SHIFT) - 1);
	struct npu_uqueue *uq;
	unsigned long pgoff;
	int ret = -EINVAL;

	mutex_lock(&ndev->uq_mutex);
	uq = npu_uqueue_find(ctx, index);
	if (!uq)
		goto out;
	if (within == 0) {
		/* The doorbell: one uncached page of BAR0, no execute, by fault. */
		if (len != PAGE_SIZE || (vma->vm_flags & VM_EXEC))
			goto out;
		vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP);
		vm_flags_clear(vma, VM_MAYEXEC);
		vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
		kref_get(&uq->ref);
		vma->vm_private_data = uq;
		vma->vm_ops = &npu_uqueue_bell_vm_ops;
		ret = 0;
		goto out;
	}
	if (within != NPU_UQ_MEM_OFFSET || len > uq->mem_size)
		goto out;
	vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP);
	/*
	 * dma_mmap_coherent() takes vm_pgoff as the page offset into the
	 * memory. Put the vma's own offset back after it: the vma must stay at
	 * its place in the device's address_space, or unmap_mapping_range()
	 * of another range (another queue's doorbell) would reach it.
	 */
	pgoff = vma->vm_pgoff;
	vma->vm_pgoff = 0;
	ret = dma_mmap_coherent(&ndev->pdev->dev, vma, uq->mem, uq->mem_dma,
				uq->mem_size);
	vma->vm_pgoff = pgoff;
	if (ret)
		goto out;
	kref_get(&uq->ref);
	vma->vm_private_data = uq;
	vma->vm_ops = &npu_uqueue_vm_ops;
out:
	mutex_unlock(&ndev->uq_mutex);
	return ret;
}

/* Have the user queues of @ctx nothing left to run (or stopped)? */
bool npu_uqueue_idle(struct npu_context *ctx)
{
	struct npu_device *ndev = ctx->ndev;
	bool idle = true;
	u32 i;

	mutex_lock(&ndev->uq_mutex);
	for (i = 1; i < ndev->hw_queues && !npu_unplugged(ndev); i++) {
		struct npu_uqueue *uq = ndev->uq[i];

		if (uq && uq->ctx == ctx && !uq->stopped &&
		    !(npu_rd(ndev, NPU_QREG(i, NPU_Q_STATUS)) & NPU_QSTAT_IDLE))
			idle = false;
	}
	mutex_unlock(&ndev->uq_mutex);
	return idle;
}
