// SPDX-License-Identifier: GPL-2.0
/*
 * NPU hardware layer: device bring-up, the command ring of each queue,
 * MSI-X interrupts, completion processing and recovery from queue errors.
 */
#include <linux/delay.h>
#include <linux/genalloc.h>
#include <linux/interrupt.h>
#include <linux/iopoll.h>
#include <linux/moduleparam.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "npu_drv.h"
#include "npu_trace.h"

#define NPU_RESET_TIMEOUT_US	(2 * USEC_PER_SEC)

int npu_hw_reset(struct npu_device *ndev)
{
	u32 st;
	int ret;

	npu_wr(ndev, NPU_REG_CONTROL, NPU_CONTROL_RESET);
	ret = readl_poll_timeout(ndev->regs + NPU_REG_STATUS, st,
				 !(st & NPU_STATUS_RESETTING), 100,
				 NPU_RESET_TIMEOUT_US);
	if (ret)
		dev_err(&ndev->pdev->dev, "soft reset timed out (status 0x%x)\n", st);
	return ret;
}

static unsigned int irq_coalesce_ops = 16;
module_param(irq_coalesce_ops, uint, 0644);
MODULE_PARM_DESC(irq_coalesce_ops,
		 "Completion interrupts of every queue: at most one per this many asked for while the queue stays busy (0, 1: one each)");
static unsigned int irq_coalesce_us = 100;
module_param(irq_coalesce_us, uint, 0644);
MODULE_PARM_DESC(irq_coalesce_us,
		 "Completion interrupts: the longest a held one waits, in us (0: until the count or an idle queue); both apply to queues set up afterwards");

/*
 * Interrupt moderation of hardware queue @i (the driver's and user queues
 * alike): completions that ask for an interrupt are held until
 * irq_coalesce_ops of them or irq_coalesce_us have passed; the device
 * signals at once when the queue goes idle, so an isolated command is
 * never delayed.
 */
void npu_queue_moderate(struct npu_device *ndev, u32 i)
{
	npu_wr(ndev, NPU_QREG(i, NPU_Q_IRQ_COUNT), min(irq_coalesce_ops, NPU_IRQ_COUNT_MAX));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_IRQ_DELAY), min(irq_coalesce_us, NPU_IRQ_DELAY_MAX));
}

/* Program the ring registers of @q and enable it; the device is disabled. */
static void npu_queue_start(struct npu_queue *q)
{
	struct npu_device *ndev = q->ndev;
	u32 i = q->index;

	npu_wr(ndev, NPU_QREG(i, NPU_Q_RING_LO), lower_32_bits(q->ring_dma));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_RING_HI), upper_32_bits(q->ring_dma));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_RING_SIZE), q->entries);
	npu_wr(ndev, NPU_QREG(i, NPU_Q_CPL_LO), lower_32_bits(q->cpl_dma));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_CPL_HI), upper_32_bits(q->cpl_dma));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_FENCE_LO), lower_32_bits(q->wb_dma));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_FENCE_HI), upper_32_bits(q->wb_dma));
	npu_queue_moderate(ndev, i);
	/* The highest priority a process may ask for without CAP_SYS_NICE. */
	npu_wr(ndev, NPU_QREG(i, NPU_Q_PRIORITY), NPU_QUEUE_PRIORITY_USER);
	/*
	 * Start at the first command not completed: 0 after a rebase (the
	 * replayed ops follow), the tail after a resume (nothing in flight).
	 */
	npu_wr(ndev, NPU_QREG(i, NPU_Q_HEAD), (u32)(READ_ONCE(q->completed) - q->fence_base));
	npu_wr(ndev, NPU_QREG(i, NPU_Q_CONTROL), NPU_QCTL_ENABLE);
}

/*
 * The device restarts a ring at index 0: restart the fence timeline of @q
 * after @base (every fence up to it retired), with an empty ring.
 */
void npu_queue_rebase(struct npu_queue *q, u64 base)
{
	q->tail = 0;
	q->fence_base = base;
	q->wb->value = base;
	q->wb->timestamp = 0;
}

/* Program the device after a reset: MMU, the driver's queue, interrupts. */
void npu_hw_start(struct npu_device *ndev)
{
	npu_mmu_enable(ndev);
	npu_queue_start(&ndev->queue);
	npu_wr(ndev, NPU_REG_IRQ_STATUS, ~0u);
	npu_wr(ndev, NPU_REG_IRQ_MASK,
	       GENMASK(ndev->hw_queues - 1, 0) | NPU_IRQ_ERROR);
	npu_wr(ndev, NPU_REG_CONTROL, NPU_CONTROL_ENABLE);
	npu_fwtrace_start(ndev);
}

/*
 * Bring the device up after it lost its state (a runtime resume from
 * D3hot): reset, boot the firmware, program the MMU and the driver's queue
 * where its ring was, so the fence timeline and the completion records
 * (FENCE_INFO) go on. Nothing was in flight: every job held the device
 * awake.
 */
int npu_hw_restart(struct npu_device *ndev)
{
	struct npu_queue *q = &ndev->queue;
	int ret;

	mutex_lock(&q->submit_lock);
	ret = npu_hw_reset(ndev);
	if (!ret)
		ret = npu_fw_boot(ndev);
	if (!ret)
		npu_hw_start(ndev);
	mutex_unlock(&q->submit_lock);
	return ret;
}

u32 npu_queue_space(struct npu_queue *q)
{
	return q->entries - (u32)(q->next_fence - READ_ONCE(q->completed));
}

bool npu_fence_done(struct npu_queue *q, u64 fence)
{
	/* Pairs with the release in npu_queue_collect_done(). */
	return smp_load_acquire(&q->completed) >= fence;
}

/* Write one descriptor at the tail; caller holds submit_lock and has space. */
/*
 * Write @cmd at the tail, for the file whose drm client id is @client (0:
 * the driver), which alone may read its completion record (FENCE_INFO).
 * Caller holds submit_lock and has space.
 */
void npu_queue_push(struct npu_queue *q, const struct npu_cmd *cmd, u64 client)
{
	u32 slot = q->tail & (q->entries - 1);

	lockdep_assert_held(&q->submit_lock);
	/* Read locklessly by FENCE_INFO. */
	WRITE_ONCE(q->owner[slot], client);
	q->ring[slot] = *cmd;
	q->tail++;
	trace_npu_ring_write(q->index, cmd->fence, cmd->opcode, slot);
}

/*
 * Store the parameter block of the descriptor about to be pushed at the
 * tail in @ctx's arena (npu_ctx_params()), at the ring slot's index;
 * returns its device VA in @ctx's address space. Caller holds submit_lock
 * and has space.
 */
u64 npu_queue_put_params(struct npu_queue *q, struct npu_context *ctx,
			 const struct npu_tensor_params *p)
{
	u32 slot = q->tail & (q->entries - 1);

	ctx->params[slot] = *p;
	return ctx->params_bo->va + (u64)slot * sizeof(*p);
}

/* Make the new descriptors visible to the device, then ring the doorbell. */
void npu_queue_kick(struct npu_queue *q)
{
	npu_fwtrace_sync(q->ndev);
	dma_wmb();
	trace_npu_doorbell(q->index, q->tail);
	npu_wr(q->ndev, NPU_DOORBELL(q->index), q->tail);
}

/* Retire jobs whose last fence is done; caller holds job_lock. */
/*
 * Add the device time of @job's ops to its file's busy time (fdinfo's
 * drm-engine-compute), from their completion records: the device clock's
 * t_end - t_start of each op. Caller holds job_lock, so the slots are not
 * reused yet; a record that is not the op's own is skipped.
 */
static void npu_job_account(struct npu_queue *q, struct npu_job *job)
{
	u64 f, start, end, ns = 0;

	lockdep_assert_held(&q->job_lock);
	if (!job->ctx)
		return;
	for (f = job->first_fence; f <= job->last_fence; f++) {
		const struct npu_cpl *cpl = &q->cpl[npu_fence_slot(q, f)];

		start = READ_ONCE(cpl->t_start);
		end = READ_ONCE(cpl->t_end);
		if (READ_ONCE(cpl->fence) == f && end > start)
			ns += end - start;
	}
	atomic64_add(ns, &job->ctx->busy_ns);
}

/*
 * Move @job, whose fences are done, to @done for retirement; a failure is
 * pending for its file's WAITs until retired. Caller holds job_lock.
 */
static void npu_job_done_locked(struct npu_queue *q, struct npu_job *job,
				struct list_head *done)
{
	lockdep_assert_held(&q->job_lock);
	if (job->err_fence && job->ctx && !job->err_pending) {
		job->err_pending = true;
		atomic_inc(&job->ctx->errors_pending);
	}
	list_move_tail(&job->node, done);
}

/* Take the jobs done up to fence @last off the queue; caller holds job_lock. */
static void npu_queue_collect(struct npu_queue *q, struct list_head *done, u64 last)
{
	struct npu_job *job, *tmp;

	list_for_each_entry_safe(job, tmp, &q->jobs, node) {
		if (job->last_fence > last)
			break;
		npu_job_account(q, job);
		npu_job_done_locked(q, job, done);
	}
}

static void npu_retire_list(struct list_head *done)
{
	struct npu_job *job, *tmp;

	list_for_each_entry_safe(job, tmp, done, node) {
		list_del(&job->node);
		npu_job_retire(job);
	}
}

/* Find the job holding @fence; caller holds job_lock. */
struct npu_job *npu_queue_find_job(struct npu_queue *q, u64 fence)
{
	struct npu_job *job;

	list_for_each_entry(job, &q->jobs, node)
		if (fence >= job->first_fence && fence <= job->last_fence)
			return job;
	return NULL;
}

/*
 * Read completion records up to the device's fence write-back; move the
 * finished jobs to @done, for the caller to retire once it holds no lock a
 * buffer's release takes (npu_queue_retire()).
 */
void npu_queue_collect_done(struct npu_queue *q, struct list_head *done)
{
	struct npu_device *ndev = q->ndev;
	u64 hw_fence, f;

	spin_lock(&q->job_lock);
	hw_fence = READ_ONCE(q->wb->value);
	/* Only fences we handed out can complete. */
	if (hw_fence > READ_ONCE(q->next_fence) || hw_fence < q->fence_base) {
		dev_warn_ratelimited(&ndev->pdev->dev,
				     "queue %u: device reports fence %llu beyond %llu\n",
				     q->index, hw_fence, q->next_fence);
		hw_fence = q->completed;
	}
	dma_rmb();
	for (f = q->completed + 1; f <= hw_fence; f++) {
		const struct npu_cpl *cpl = &q->cpl[npu_fence_slot(q, f)];
		u32 status = READ_ONCE(cpl->status);
		struct npu_job *job;

		if (status == NPU_ST_OK)
			continue;
		atomic_inc(&ndev->op_errors);
		trace_npu_op_error(q->index, f, status, READ_ONCE(cpl->opcode));
		job = npu_queue_find_job(q, f);
		if (job && !job->err_fence) {
			job->err_fence = f;
			job->err_status = status;
		}
	}
	hw_fence = max(hw_fence, q->completed);
	npu_queue_collect(q, done, hw_fence);
	if (hw_fence > q->completed) {
		/*
		 * Published once the failed jobs are pending: a WAIT that sees
		 * its fence done also sees them (npu_ioctl_wait()).
		 */
		smp_store_release(&q->completed, hw_fence);
		trace_npu_complete(q->index, hw_fence);
	}
	spin_unlock(&q->job_lock);
}

/*
 * Read completion records up to the device's fence write-back and retire
 * finished jobs. Called by the queue's IRQ thread and by waiters.
 */
void npu_queue_process(struct npu_queue *q)
{
	LIST_HEAD(done);

	npu_queue_collect_done(q, &done);
	npu_retire_list(&done);
	wake_up_all(&q->wq);
}

/*
 * Complete every job in flight with @status; used when the hardware state
 * is lost (reset, removal). Caller holds submit_lock and the device must not
 * be executing this queue any more. The jobs move to @done: the caller
 * retires them with npu_queue_retire() once it holds no lock a buffer's
 * release takes (uq_mutex).
 */
void npu_queue_abort_all(struct npu_queue *q, u32 status, struct list_head *done)
{
	struct npu_job *job, *tmp;

	spin_lock(&q->job_lock);
	list_for_each_entry(job, &q->jobs, node) {
		if (!job->err_fence && job->last_fence > q->completed) {
			job->err_fence = max(job->first_fence, q->completed + 1);
			job->err_status = status;
		}
	}
	list_for_each_entry_safe(job, tmp, &q->jobs, node)
		npu_job_done_locked(q, job, done);
	smp_store_release(&q->completed, q->next_fence);	/* after, as above */
	spin_unlock(&q->job_lock);
}

/* Retire the jobs of npu_queue_abort_all() and wake the waiters. */
/*
 * The device did not stop: the jobs on @done are failed, their fences
 * signalled, but their buffers and contexts are kept for good.
 */
void npu_jobs_keep_memory(struct list_head *done)
{
	struct npu_job *job;

	list_for_each_entry(job, done, node)
		job->keep_memory = true;
}

void npu_queue_retire(struct npu_queue *q, struct list_head *done)
{
	npu_retire_list(done);
	wake_up_all(&q->wq);
}

static irqreturn_t npu_irq_hard(int irq, void *arg)
{
	return IRQ_WAKE_THREAD;
}

static irqreturn_t npu_queue_irq_thread(int irq, void *arg)
{
	struct npu_queue *q = arg;

	atomic_inc(&q->ndev->irq_count);
	npu_wr(q->ndev, NPU_REG_IRQ_STATUS, NPU_IRQ_QUEUE(q->index));
	trace_npu_irq(q->index);
	npu_queue_process(q);
	npu_fwtrace_kick(q->ndev);
	return IRQ_HANDLED;
}

static irqreturn_t npu_uq_irq_thread(int irq, void *arg)
{
	struct npu_uq_vec *vec = arg;

	atomic_inc(&vec->ndev->irq_count);
	npu_wr(vec->ndev, NPU_REG_IRQ_STATUS, NPU_IRQ_QUEUE(vec->index));
	trace_npu_irq(vec->index);
	npu_uqueue_irq(vec->ndev, vec->index);
	npu_fwtrace_kick(vec->ndev);
	return IRQ_HANDLED;
}

/*
 * A queue stopped on an error. A user queue stays stopped and its owner
 * learns of it (npu_uqueue_check_stopped()). The driver's queue stopped on
 * a ring error (the driver wrote something the device could not use):
 * reset the device, fail what was in flight, start again.
 */
static irqreturn_t npu_dev_irq_thread(int irq, void *arg)
{
	struct npu_device *ndev = arg;
	struct npu_queue *q = &ndev->queue;
	u32 status = npu_rd(ndev, NPU_REG_IRQ_STATUS);
	LIST_HEAD(done);
	u32 err = npu_rd(ndev, NPU_REG_ERROR);

	atomic_inc(&ndev->irq_count);
	if (!(status & NPU_IRQ_ERROR))
		return IRQ_HANDLED;
	npu_wr(ndev, NPU_REG_IRQ_STATUS, NPU_IRQ_ERROR);
	npu_uqueue_check_stopped(ndev);
	if (!(npu_rd(ndev, NPU_QREG(0, NPU_Q_STATUS)) & NPU_QSTAT_STOPPED))
		return IRQ_HANDLED;
	dev_err(&ndev->pdev->dev, "device error %u; resetting\n", err);
	mutex_lock(&q->submit_lock);
	/* Removal stopped the device under submit_lock: do not restart it. */
	if (npu_unplugged(ndev)) {
		mutex_unlock(&q->submit_lock);
		return IRQ_HANDLED;
	}
	npu_queue_process(q);
	mutex_lock(&ndev->uq_mutex);
	if (!npu_hw_reset(ndev)) {
		npu_queue_abort_all(q, NPU_ST_ABORTED, &done);
		npu_queue_rebase(q, q->next_fence);
		npu_uqueue_reset_done(ndev);
		npu_uqueue_stop_all(ndev, 0);
		npu_hw_start(ndev);
		atomic_inc(&ndev->recoveries);
		npu_reset_uevent(ndev, "error");
	}
	mutex_unlock(&ndev->uq_mutex);
	npu_queue_retire(q, &done);
	mutex_unlock(&q->submit_lock);
	return IRQ_HANDLED;
}

static int npu_queue_init(struct npu_device *ndev, struct npu_queue *q, u32 index)
{
	struct device *dev = &ndev->pdev->dev;
	int ret;

	q->ndev = ndev;
	q->index = index;
	q->entries = NPU_RING_ENTRIES;
	mutex_init(&q->submit_lock);
	spin_lock_init(&q->job_lock);
	INIT_LIST_HEAD(&q->jobs);
	init_waitqueue_head(&q->wq);

	/*
	 * Not device-managed: a WAIT on a file opened before an unbind reads
	 * the fence write-back (and may process completions) without the
	 * unplug lock, so this memory lives as long as the npu_device
	 * (npu_hw_free()), not just as long as the driver binding.
	 */
	q->ring = dma_alloc_coherent(dev, q->entries * sizeof(*q->ring),
				     &q->ring_dma, GFP_KERNEL);
	q->cpl = dma_alloc_coherent(dev, q->entries * sizeof(*q->cpl),
				    &q->cpl_dma, GFP_KERNEL);
	q->wb = dma_alloc_coherent(dev, sizeof(*q->wb), &q->wb_dma, GFP_KERNEL);
	q->owner = kvcalloc(q->entries, sizeof(*q->owner), GFP_KERNEL);
	if (!q->ring || !q->cpl || !q->wb || !q->owner)
		return -ENOMEM;

	q->irq = pci_irq_vector(ndev->pdev, NPU_VEC_QUEUE(index));
	ret = devm_request_threaded_irq(dev, q->irq, npu_irq_hard,
					npu_queue_irq_thread, IRQF_ONESHOT,
					"npu-queue", q);
	if (ret)
		dev_err(dev, "queue %u: cannot request IRQ %d: %d\n", index, q->irq, ret);
	return ret;
}

/*
 * Device memory: map BAR2 (to clear what a BO gets) and manage it with an
 * allocator that lives as long as the npu_device (buffer objects in it can
 * outlive the binding). A BAR the platform did not assign leaves the
 * device without device memory, not without a driver.
 */
static int npu_mem_init(struct npu_device *ndev)
{
	struct pci_dev *pdev = ndev->pdev;
	u64 size;
	int ret;

	if (!(ndev->caps & NPU_CAP_LOCAL_MEM))
		return 0;
	size = npu_rd(ndev, NPU_REG_MEM_SIZE_LO) |
	       (u64)npu_rd(ndev, NPU_REG_MEM_SIZE_HI) << 32;
	if (!size || pci_resource_len(pdev, NPU_BAR_MEM) < size ||
	    size >= NPU_MEM_POOL_BIAS) {
		dev_warn(&pdev->dev, "device memory BAR unusable; host memory only\n");
		ndev->caps &= ~NPU_CAP_LOCAL_MEM;
		return 0;
	}
	ret = pcim_iomap_regions(pdev, BIT(NPU_BAR_MEM), NPU_DRIVER_NAME);
	if (ret)
		return ret;
	ndev->mem = pcim_iomap_table(pdev)[NPU_BAR_MEM];
	ndev->mem_phys = pci_resource_start(pdev, NPU_BAR_MEM);
	ndev->mem_pool = gen_pool_create(PAGE_SHIFT, -1);
	if (!ndev->mem_pool)
		return -ENOMEM;
	ret = gen_pool_add(ndev->mem_pool, NPU_MEM_POOL_BIAS, size, -1);
	if (ret)
		return ret;
	ndev->mem_size = size;
	return 0;
}

int npu_hw_init(struct npu_device *ndev)
{
	struct pci_dev *pdev = ndev->pdev;
	struct device *dev = &pdev->dev;
	u32 magic, i;
	int ret;

	npu_watchdog_init(ndev);
	magic = npu_rd(ndev, NPU_REG_MAGIC);
	if (magic != NPU_MAGIC) {
		dev_err(dev, "bad magic 0x%08x (expected 0x%08x)\n", magic, NPU_MAGIC);
		return -ENODEV;
	}
	ndev->hw_version = npu_rd(ndev, NPU_REG_HW_VERSION);
	ndev->abi_version = npu_rd(ndev, NPU_REG_ABI_VERSION);
	ndev->caps = npu_rd(ndev, NPU_REG_CAPS);
	ndev->num_queues = npu_rd(ndev, NPU_REG_NUM_QUEUES);
	ndev->num_cores = npu_rd(ndev, NPU_REG_NUM_CORES);
	ndev->timing = npu_rd(ndev, NPU_REG_TIMING);
	npu_fwtrace_quiesce(ndev);
	if (ndev->abi_version != NPU_ABI_VERSION) {
		dev_err(dev, "device ABI %u, driver speaks %u\n",
			ndev->abi_version, NPU_ABI_VERSION);
		return -ENODEV;
	}
	if (ndev->num_queues < 1 || npu_rd(ndev, NPU_REG_MAX_RING) < NPU_RING_ENTRIES) {
		dev_err(dev, "device offers no usable queue\n");
		return -ENODEV;
	}
	/* SUBMIT feeds queue 0; the others are lent as user queues. */
	ndev->hw_queues = min(ndev->num_queues, (u32)NPU_NUM_QUEUES);
	ndev->num_queues = 1;
	mutex_init(&ndev->uq_mutex);

	ret = npu_hw_reset(ndev);
	if (ret)
		return ret;
	ret = npu_fw_init(ndev);
	if (ret)
		return ret;
	ret = npu_mem_init(ndev);
	if (ret)
		return ret;
	ret = npu_mmu_init(ndev);
	if (ret)
		return ret;
	ret = npu_fence_init(ndev);
	if (ret)
		return ret;
	npu_perf_init(ndev);
	ret = npu_fwtrace_init(ndev);
	if (ret)
		return ret;

	/* pcim_enable_device() makes the vectors managed. */
	ret = pci_alloc_irq_vectors(pdev, NPU_MSIX_VECTORS, NPU_MSIX_VECTORS,
				    PCI_IRQ_MSIX);
	if (ret < 0) {
		dev_err(dev, "MSI-X unavailable: %d\n", ret);
		return ret;
	}
	ret = devm_request_threaded_irq(dev, pci_irq_vector(pdev, NPU_VEC_DEVICE),
					npu_irq_hard, npu_dev_irq_thread,
					IRQF_ONESHOT, "npu-dev", ndev);
	if (ret)
		return ret;
	for (i = 1; i < ndev->hw_queues; i++) {
		ndev->uq_vec[i].ndev = ndev;
		ndev->uq_vec[i].index = i;
		ret = devm_request_threaded_irq(dev, pci_irq_vector(pdev, NPU_VEC_QUEUE(i)),
						npu_irq_hard, npu_uq_irq_thread,
						IRQF_ONESHOT, "npu-uqueue",
						&ndev->uq_vec[i]);
		if (ret)
			return ret;
	}
	ret = npu_queue_init(ndev, &ndev->queue, 0);
	if (ret)
		return ret;

	npu_queue_rebase(&ndev->queue, ndev->queue.next_fence);
	npu_hw_start(ndev);
	npu_watchdog_start(ndev);
	return 0;
}

/*
 * Stop the device and fail everything in flight. The IRQs and vectors are
 * managed and go after this; the ring memory stays until npu_hw_free().
 */
void npu_hw_fini(struct npu_device *ndev)
{
	struct npu_queue *q = &ndev->queue;
	LIST_HEAD(done);

	npu_watchdog_stop(ndev);
	mutex_lock(&q->submit_lock);
	mutex_lock(&ndev->uq_mutex);
	npu_wr(ndev, NPU_REG_IRQ_MASK, 0);
	npu_fwtrace_fini(ndev);
	/*
	 * A device that does not stop may still DMA into the buffers of the
	 * jobs in flight: then keep them (and their memory) forever.
	 */
	if (npu_hw_reset(ndev)) {
		dev_err(&ndev->pdev->dev, "device did not stop; leaking in-flight jobs\n");
		npu_queue_abort_all(q, NPU_ST_ABORTED, &done);
		npu_jobs_keep_memory(&done);
	} else {
		npu_queue_abort_all(q, NPU_ST_ABORTED, &done);
		npu_uqueue_reset_done(ndev);
	}
	npu_uqueue_stop_all(ndev, 0);
	npu_fw_stop(ndev);
	mutex_unlock(&ndev->uq_mutex);
	npu_queue_retire(q, &done);
	mutex_unlock(&q->submit_lock);
}

/* Free the ring memory of the queue; the last reference to @ndev is gone. */
void npu_hw_free(struct npu_device *ndev)
{
	struct npu_queue *q = &ndev->queue;
	struct device *dev = &ndev->pdev->dev;

	if (ndev->mem_pool)
		gen_pool_destroy(ndev->mem_pool);

	if (q->ring)
		dma_free_coherent(dev, q->entries * sizeof(*q->ring), q->ring, q->ring_dma);
	if (q->cpl)
		dma_free_coherent(dev, q->entries * sizeof(*q->cpl), q->cpl, q->cpl_dma);
	if (q->wb)
		dma_free_coherent(dev, sizeof(*q->wb), q->wb, q->wb_dma);
	kvfree(q->owner);
	npu_fwtrace_free(ndev);
}
