// SPDX-License-Identifier: GPL-2.0
/*
 * NPU device coredump (format: include/npu_coredump.h). When the watchdog
 * resets the device (npu_reset.c), it first captures what led there: the
 * registers, the queues in use, the hung command and the firmware log.
 * Once the recovery is over the dump goes to devcoredump, as
 * /sys/class/devcoredump/devcdN/data with failing_device the PCI device;
 * a recovery that failed turns it into a FATAL dump, with the registers
 * after the failed reset added. python3 -m npu.coredump decodes it.
 *
 * devcoredump keeps one dump per device until it is read and dismissed (a
 * write to its data file) or for 5 minutes; a dump taken while one is
 * pending is dropped by the core, so a burst of hangs leaves the first.
 */
#include <linux/devcoredump.h>
#include <linux/timekeeping.h>
#include <linux/vmalloc.h>

#include "npu_coredump.h"
#include "npu_drv.h"
#include "npu_tensor.h"

/*
 * The most firmware log text a dump carries: the whole ring
 * (NPU_FW_LOG_BYTES, npu_fw.c); of a bigger one, its newest bytes.
 */
#define NPU_DUMP_FW_LOG_MAX	SZ_16K

/*
 * Every register of enum npu_reg, in its order, but the write-only
 * FW_CONTROL, whose read the device logs as a guest error.
 */
static const u16 npu_dump_dev_regs[] = {
	NPU_REG_MAGIC, NPU_REG_HW_VERSION, NPU_REG_ABI_VERSION, NPU_REG_CAPS,
	NPU_REG_NUM_QUEUES, NPU_REG_NUM_CORES, NPU_REG_MAX_RING, NPU_REG_STATUS,
	NPU_REG_CONTROL, NPU_REG_IRQ_STATUS, NPU_REG_IRQ_MASK, NPU_REG_ERROR,
	NPU_REG_TIMESTAMP_LO, NPU_REG_TIMESTAMP_HI, NPU_REG_SCRATCH,
	NPU_REG_MMU_CONTROL, NPU_REG_MMU_L1_LO, NPU_REG_MMU_L1_HI,
	NPU_REG_MMU_L1_ENTRIES, NPU_REG_MMU_FAULT_LO, NPU_REG_MMU_FAULT_HI,
	NPU_REG_MMU_FAULT_INFO, NPU_REG_MMU_FAULTS, NPU_REG_MMU_FAULT_QUEUE,
	NPU_REG_MMU_CTX_LO, NPU_REG_MMU_CTX_HI, NPU_REG_MMU_CTX_COUNT,
	NPU_REG_MMU_FAULT_CTX, NPU_REG_MEM_SIZE_LO, NPU_REG_MEM_SIZE_HI,
	NPU_REG_INJECT, NPU_REG_FW_ADDR_LO, NPU_REG_FW_ADDR_HI, NPU_REG_FW_SIZE,
	NPU_REG_FW_STATUS, NPU_REG_FW_ERROR, NPU_REG_FW_VERSION,
	NPU_REG_FW_HEARTBEAT, NPU_REG_MBOX_CMD, NPU_REG_MBOX_ARG0,
	NPU_REG_MBOX_ARG1, NPU_REG_MBOX_SEQ, NPU_REG_MBOX_RESP_SEQ,
	NPU_REG_MBOX_RESP_STATUS, NPU_REG_MBOX_RESP0, NPU_REG_MBOX_RESP1,
	NPU_REG_FW_LOG_LO, NPU_REG_FW_LOG_HI, NPU_REG_FW_LOG_SIZE,
	NPU_REG_TIMING,
};

/* Every register of enum npu_qreg, in its order. */
static const u8 npu_dump_queue_regs[] = {
	NPU_Q_RING_LO, NPU_Q_RING_HI, NPU_Q_RING_SIZE, NPU_Q_CONTROL,
	NPU_Q_HEAD, NPU_Q_TAIL, NPU_Q_CPL_LO, NPU_Q_CPL_HI, NPU_Q_FENCE_LO,
	NPU_Q_FENCE_HI, NPU_Q_STATUS, NPU_Q_ERROR, NPU_Q_DONE_LO, NPU_Q_DONE_HI,
	NPU_Q_PRIORITY, NPU_Q_IRQ_COUNT, NPU_Q_IRQ_DELAY, NPU_Q_IRQS,
	NPU_Q_PROGRESS, NPU_Q_MMU_L1_LO, NPU_Q_MMU_L1_HI, NPU_Q_MMU_L1_ENTRIES,
};

static const char * const npu_dump_reasons[] = {
	[NPU_DUMP_HANG] = "hang",
	[NPU_DUMP_FW_LOST] = "firmware lost",
	[NPU_DUMP_FATAL] = "device lost",
};

static u32 npu_dump_num_regs(struct npu_device *ndev)
{
	return ARRAY_SIZE(npu_dump_dev_regs) +
	       ndev->hw_queues * ARRAY_SIZE(npu_dump_queue_regs);
}

/*
 * The largest dump of @ndev: the header, two register sections (before
 * the reset, and after it for a FATAL dump), one section per queue, the
 * hung command and the firmware log.
 */
static size_t npu_dump_max_size(struct npu_device *ndev)
{
	const size_t sec = sizeof(struct npu_dump_section);

	return sizeof(struct npu_dump_header) +
	       2 * (sec + sizeof(struct npu_dump_regs) +
		    npu_dump_num_regs(ndev) * sizeof(struct npu_dump_reg)) +
	       ndev->hw_queues * (sec + sizeof(struct npu_dump_queue)) +
	       sec + sizeof(struct npu_dump_cmd) +
	       sec + sizeof(struct npu_dump_fw_log) + NPU_DUMP_FW_LOG_MAX;
}

/*
 * Room for a section of up to @len payload bytes at the end of @h: where
 * its payload goes (zeroed), or NULL if it does not fit (a bug).
 */
static void *npu_dump_reserve(struct npu_device *ndev, struct npu_dump_header *h,
			      size_t len)
{
	size_t end = h->size + sizeof(struct npu_dump_section) + round_up(len, 8);

	if (WARN_ON_ONCE(end > npu_dump_max_size(ndev)))
		return NULL;
	return (void *)h + h->size + sizeof(struct npu_dump_section);
}

/* Close the section reserved last: @type, @len payload bytes written. */
static void npu_dump_commit(struct npu_dump_header *h, u32 type, size_t len)
{
	struct npu_dump_section *s = (void *)h + h->size;

	s->type = type;
	s->size = round_up(len, 8);
	h->size += sizeof(*s) + s->size;
	h->num_sections++;
}

/* The registers now (@when: NPU_DUMP_BEFORE_RESET or _AFTER_RESET). */
static void npu_dump_add_regs(struct npu_device *ndev, struct npu_dump_header *h, u32 when)
{
	u32 n = npu_dump_num_regs(ndev), i, q, k = 0;
	size_t len = sizeof(struct npu_dump_regs) + n * sizeof(struct npu_dump_reg);
	struct npu_dump_regs *regs;
	struct npu_dump_reg *r;

	regs = npu_dump_reserve(ndev, h, len);
	if (!regs)
		return;
	r = (struct npu_dump_reg *)(regs + 1);
	for (i = 0; i < ARRAY_SIZE(npu_dump_dev_regs); i++, k++) {
		r[k].offset = npu_dump_dev_regs[i];
		r[k].value = npu_rd(ndev, r[k].offset);
	}
	for (q = 0; q < ndev->hw_queues; q++) {
		for (i = 0; i < ARRAY_SIZE(npu_dump_queue_regs); i++, k++) {
			r[k].offset = NPU_QREG(q, npu_dump_queue_regs[i]);
			r[k].value = npu_rd(ndev, r[k].offset);
		}
	}
	regs->count = n;
	regs->when = when;
	npu_dump_commit(h, NPU_DUMP_SEC_REGS, len);
}

static u64 npu_dump_rd64(struct npu_device *ndev, u32 lo)
{
	return npu_rd(ndev, lo) | (u64)npu_rd(ndev, lo + 4) << 32;
}

/* Queue 0 and each user queue: the device's view and the driver's. */
static void npu_dump_add_queues(struct npu_device *ndev, struct npu_dump_header *h)
{
	struct npu_queue *q = &ndev->queue;
	struct npu_dump_queue *dq;
	u32 i;

	for (i = 0; i < ndev->hw_queues; i++) {
		struct npu_uqueue *uq = i ? ndev->uq[i] : NULL;

		if (i && !uq)
			continue;
		dq = npu_dump_reserve(ndev, h, sizeof(*dq));
		if (!dq)
			return;
		dq->index = i;
		dq->head = npu_rd(ndev, NPU_QREG(i, NPU_Q_HEAD));
		dq->tail = npu_rd(ndev, NPU_QREG(i, NPU_Q_TAIL));
		dq->status = npu_rd(ndev, NPU_QREG(i, NPU_Q_STATUS));
		dq->error = npu_rd(ndev, NPU_QREG(i, NPU_Q_ERROR));
		dq->done = npu_dump_rd64(ndev, NPU_QREG(i, NPU_Q_DONE_LO));
		if (uq) {
			dq->flags = NPU_DUMP_Q_USER |
				    (uq->stopped ? NPU_DUMP_Q_STOPPED : 0) |
				    (uq->hung ? NPU_DUMP_Q_HUNG : 0);
			dq->completed = READ_ONCE(uq->wb->value);
			dq->client = uq->ctx ? uq->ctx->client_id : 0;
			dq->entries = uq->entries;
		} else {
			dq->next_fence = q->next_fence;
			spin_lock(&q->job_lock);
			dq->completed = q->completed;
			spin_unlock(&q->job_lock);
			dq->entries = q->entries;
		}
		npu_dump_commit(h, NPU_DUMP_SEC_QUEUE, sizeof(*dq));
	}
}

/*
 * The command of queue 0 with @fence, in flight: its ring slot and, for a
 * tensor op of a file, its parameter block (at the same slot of the file's
 * arena). Returns false if @fence is not in the ring.
 */
static bool npu_dump_queue0_cmd(struct npu_device *ndev, u64 fence, struct npu_dump_cmd *dc)
{
	struct npu_queue *q = &ndev->queue;
	struct npu_job *job;
	bool found = false;

	spin_lock(&q->job_lock);
	if (fence > q->completed && fence <= q->next_fence) {
		found = true;
		dc->slot = npu_fence_slot(q, fence);
		dc->cmd = q->ring[dc->slot];
		job = npu_queue_find_job(q, fence);
		if (job && job->ctx && job->ctx->params &&
		    npu_tensor_op_operands(dc->cmd.opcode)) {
			dc->params = job->ctx->params[dc->slot];
			dc->flags |= NPU_DUMP_CMD_PARAMS;
		}
	}
	spin_unlock(&q->job_lock);
	return found;
}

/*
 * The hung command of queue @qi: of queue 0 the one with @fence, of a user
 * queue the one at its HEAD (whose fence goes into the header).
 */
static void npu_dump_add_cmd(struct npu_device *ndev, struct npu_dump_header *h, u32 qi,
			     u64 fence)
{
	struct npu_uqueue *uq = qi ? ndev->uq[qi] : NULL;
	struct npu_dump_cmd *dc;

	if (qi && !uq)
		return;
	dc = npu_dump_reserve(ndev, h, sizeof(*dc));
	if (!dc)
		return;
	dc->queue = qi;
	if (uq) {
		/* The process may rewrite its ring: this is what it holds now. */
		dc->slot = npu_rd(ndev, NPU_QREG(qi, NPU_Q_HEAD)) & (uq->entries - 1);
		memcpy(&dc->cmd, (struct npu_cmd *)uq->mem + dc->slot, sizeof(dc->cmd));
		h->fence = dc->cmd.fence;
	} else if (!npu_dump_queue0_cmd(ndev, fence, dc)) {
		memset(dc, 0, sizeof(*dc));
		return;
	}
	npu_dump_commit(h, NPU_DUMP_SEC_CMD, sizeof(*dc));
}

static void npu_dump_add_fw_log(struct npu_device *ndev, struct npu_dump_header *h)
{
	struct npu_dump_fw_log *log;
	size_t n;

	if (!ndev->fw_log)
		return;
	log = npu_dump_reserve(ndev, h, sizeof(*log) + NPU_DUMP_FW_LOG_MAX);
	if (!log)
		return;
	n = npu_fw_log_read(ndev, (char *)(log + 1), NPU_DUMP_FW_LOG_MAX);
	log->length = n;
	log->written = READ_ONCE(ndev->fw_log->write);
	npu_dump_commit(h, NPU_DUMP_SEC_FW_LOG, sizeof(*log) + n);
}

/**
 * npu_coredump_capture() - capture the device's state before a reset
 * @ndev: the device
 * @reason: NPU_DUMP_HANG or NPU_DUMP_FW_LOST
 * @qi: the queue that hung, or negative for none
 * @fence: queue 0's hung fence (a user queue's comes from its ring)
 * @client: drm client id of the file the hung command belongs to, or 0
 *
 * Called by the watchdog, holding submit_lock and uq_mutex, with the
 * device bound. Returns the dump for npu_coredump_submit(), or NULL if
 * there is no memory for one (the recovery goes on without it).
 */
struct npu_dump_header *npu_coredump_capture(struct npu_device *ndev, u32 reason, int qi,
					     u64 fence, u64 client)
{
	struct npu_dump_header *h;

	lockdep_assert_held(&ndev->queue.submit_lock);
	lockdep_assert_held(&ndev->uq_mutex);
	/* Zeroed: reserved fields and padding; devcoredump frees it with vfree(). */
	h = __vmalloc(npu_dump_max_size(ndev), GFP_KERNEL | __GFP_ZERO | __GFP_NOWARN);
	if (!h)
		return NULL;
	h->magic = NPU_DUMP_MAGIC;
	h->version = NPU_DUMP_VERSION;
	h->size = sizeof(*h);
	h->reason = reason;
	h->cause = reason;
	h->queue = qi < 0 ? NPU_DUMP_NO_QUEUE : qi;
	h->fence = qi == 0 ? fence : 0;
	h->client = client;
	h->timestamp_ns = ktime_get_ns();
	h->hw_version = ndev->hw_version;
	h->fw_version = ndev->fw_version;
	h->driver_version = NPU_DRIVER_VERSION;

	/* The registers first: the rest reads some of them again. */
	npu_dump_add_regs(ndev, h, NPU_DUMP_BEFORE_RESET);
	npu_dump_add_queues(ndev, h);
	if (qi >= 0 && (u32)qi < ndev->hw_queues)
		npu_dump_add_cmd(ndev, h, qi, fence);
	npu_dump_add_fw_log(ndev, h);
	return h;
}

/**
 * npu_coredump_fatal() - the recovery of @dump failed: the device is gone
 * @ndev: the device
 * @dump: from npu_coredump_capture(), or NULL
 *
 * The dump becomes a FATAL one and gets the registers as the failed reset
 * or firmware boot left them. Caller holds the locks of the capture.
 */
void npu_coredump_fatal(struct npu_device *ndev, struct npu_dump_header *dump)
{
	if (!dump)
		return;
	dump->reason = NPU_DUMP_FATAL;
	npu_dump_add_regs(ndev, dump, NPU_DUMP_AFTER_RESET);
}

/**
 * npu_coredump_submit() - hand @dump to devcoredump, which owns it from here
 * @ndev: the device
 * @dump: from npu_coredump_capture(), or NULL
 *
 * Called without the driver's locks. devcoredump drops the dump if one of
 * the device is still pending, and frees it with vfree() when it goes.
 */
void npu_coredump_submit(struct npu_device *ndev, struct npu_dump_header *dump)
{
	struct device *dev = &ndev->pdev->dev;

	if (!dump)
		return;
	dev_info(dev, "%s: device coredump of %u bytes for /sys/class/devcoredump\n",
		 npu_dump_reasons[dump->reason], dump->size);
	dev_coredumpv(dev, dump, dump->size, GFP_KERNEL);
}
