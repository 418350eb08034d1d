// SPDX-License-Identifier: GPL-2.0
/*
 * NPU jobs: SUBMIT validates every op against the caller's buffer objects,
 * translates it into device descriptors and queues it; WAIT sleeps on a
 * fence value and reports the device errors of the caller's ops.
 */
#include <linux/overflow.h>
#include <linux/poll.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>

#include "npu_drv.h"
#include "npu_tensor.h"
#include "npu_trace.h"

#define NPU_SUBMIT_SPACE_TIMEOUT	(10 * HZ)
#define NPU_WAIT_SPIN_NS		(20 * NSEC_PER_USEC)
#define NPU_MAX_PENDING_ERRORS		1024

static void npu_context_free(struct kref *ref)
{
	struct npu_context *ctx = container_of(ref, struct npu_context, ref);
	struct npu_error *err, *tmp;

	list_for_each_entry_safe(err, tmp, &ctx->errors, node)
		kfree(err);
	if (ctx->params_bo) {
		vunmap(ctx->params);
		npu_bo_put(ctx->params_bo);
	}
	npu_vm_destroy_ctx(&ctx->vm);
	npu_device_put(ctx->ndev);
	kfree(ctx);
}

void npu_context_put(struct npu_context *ctx)
{
	kref_put(&ctx->ref, npu_context_free);
}

/* Record a failed op for the next WAIT that covers it. */
static void npu_context_add_error(struct npu_context *ctx, u64 fence, u32 status)
{
	struct npu_error *err = kmalloc(sizeof(*err), GFP_KERNEL);

	spin_lock(&ctx->err_lock);
	if (err && ctx->num_errors < NPU_MAX_PENDING_ERRORS) {
		err->fence = fence;
		err->status = status;
		list_add_tail(&err->node, &ctx->errors);
		ctx->num_errors++;
		err = NULL;
	}
	spin_unlock(&ctx->err_lock);
	kfree(err);
}

/* Called once the job's last fence is done (or aborted), in process context. */
void npu_job_retire(struct npu_job *job)
{
	u32 i;

	trace_npu_job_retire(job->first_fence, job->last_fence, job->err_status);
	if (job->err_fence && job->ctx)
		npu_context_add_error(job->ctx, job->err_fence, job->err_status);
	if (job->err_pending)
		atomic_dec(&job->ctx->errors_pending);	/* npu_queue_retire() wakes */
	/* A device address outside the context's space: it is faulted. */
	if (job->ctx && job->err_status == NPU_ST_MMU_FAULT)
		WRITE_ONCE(job->ctx->faulted, true);
	npu_job_signal(job);
	if (job->pm)
		npu_pm_put(job->pm);
	/* Leaked on purpose: the device may still write them (a failed reset). */
	if (job->keep_memory) {
		kvfree(job);
		return;
	}
	for (i = 0; i < job->num_bos; i++)
		npu_bo_put(job->bos[i]);
	if (job->ctx)
		npu_context_put(job->ctx);
	kvfree(job);
}

/*
 * Resolve a buffer reference into @job; return its device VA in @va. The
 * device writes the buffer if @write: a read-only BO gets -EACCES.
 */
static int npu_resolve_buf(struct npu_context *ctx, struct npu_job *job,
			   const struct npu_buf_ref *ref, bool write, u64 *va)
{
	struct npu_bo *bo;
	u64 end;

	if (ref->rsvd || ref->size == 0)
		return -EINVAL;
	bo = npu_bo_lookup(ctx, ref->handle);
	if (!bo)
		return -ENOENT;
	job->bos[job->num_bos++] = bo;
	if (write && bo->dev_readonly)
		return -EACCES;
	if (check_add_overflow(ref->offset, ref->size, &end) || end > bo->size)
		return -ERANGE;
	*va = bo->va + ref->offset;
	return 0;
}

static bool npu_mem_is_zero(const void *p, size_t len)
{
	return !memchr_inv(p, 0, len);
}

/* Bytes spanned by a rows x cols fp32 row-major matrix with stride ld. */
static u64 npu_matrix_bytes(u32 rows, u32 cols, u32 ld)
{
	return ((u64)(rows - 1) * ld + cols) * sizeof(u32);
}

static int npu_check_matrix(u32 rows, u32 cols, u32 ld, u64 ref_size)
{
	if (ld < cols || ld > NPU_MAX_LD)
		return -EINVAL;
	if (npu_matrix_bytes(rows, cols, ld) > ref_size)
		return -EINVAL;
	return 0;
}

static int npu_build_gemm(const struct npu_op *op, const u64 *va,
			  struct npu_cmd *cmd)
{
	u32 m = op->params[0], n = op->params[1], k = op->params[2];
	u32 lda = op->params[3], ldb = op->params[4], ldc = op->params[5];
	u32 dtype = op->params[6], flags = op->params[7];
	bool ta = flags & NPU_GEMM_TRANS_A, tb = flags & NPU_GEMM_TRANS_B;
	int ret;

	if (dtype != NPU_DTYPE_FP32 || (flags & ~NPU_GEMM_F_MASK))
		return -EINVAL;
	if (!m || !n || !k || m > NPU_MAX_DIM || n > NPU_MAX_DIM || k > NPU_MAX_DIM)
		return -EINVAL;
	ret = npu_check_matrix(ta ? k : m, ta ? m : k, lda, op->bufs[0].size);
	if (!ret)
		ret = npu_check_matrix(tb ? n : k, tb ? k : n, ldb, op->bufs[1].size);
	if (!ret)
		ret = npu_check_matrix(m, n, ldc, op->bufs[2].size);
	if (ret)
		return ret;

	cmd->gemm.a = va[0];
	cmd->gemm.b = va[1];
	cmd->gemm.c = va[2];
	cmd->gemm.m = m;
	cmd->gemm.n = n;
	cmd->gemm.k = k;
	cmd->gemm.lda = lda;
	cmd->gemm.ldb = ldb;
	cmd->gemm.ldc = ldc;
	cmd->gemm.dtype = dtype;
	cmd->gemm.flags = flags;
	return 0;
}

static const u32 npu_op_num_bufs[NPU_OP_COUNT] = {
	[NPU_OP_NOP] = 0,
	[NPU_OP_COPY] = 2,
	[NPU_OP_FILL] = 1,
	[NPU_OP_GEMM] = 3,
};

static const u32 npu_op_num_params[NPU_OP_COUNT] = {
	[NPU_OP_NOP] = 0,
	[NPU_OP_COPY] = 0,
	[NPU_OP_FILL] = 1,
	[NPU_OP_GEMM] = 8,
};

/* The buffer each v1 opcode writes (NOP writes none). */
static const s8 npu_op_out_buf[NPU_OP_COUNT] = {
	[NPU_OP_NOP] = -1,
	[NPU_OP_COPY] = 1,
	[NPU_OP_FILL] = 0,
	[NPU_OP_GEMM] = 2,
};

/* Validate one user op and translate it into a device descriptor. */
static int npu_build_cmd(struct npu_context *ctx, struct npu_job *job,
			 const struct npu_op *op, struct npu_cmd *cmd)
{
	u64 va[NPU_OP_MAX_BUFS] = {};
	u32 i, nparams;
	int ret;

	if (op->opcode >= NPU_OP_COUNT || op->flags || op->rsvd)
		return -EINVAL;
	if (op->num_bufs != npu_op_num_bufs[op->opcode])
		return -EINVAL;
	nparams = npu_op_num_params[op->opcode];
	if (!npu_mem_is_zero(&op->bufs[op->num_bufs],
			     (NPU_OP_MAX_BUFS - op->num_bufs) * sizeof(op->bufs[0])) ||
	    !npu_mem_is_zero(&op->params[nparams],
			     (NPU_OP_MAX_PARAMS - nparams) * sizeof(op->params[0])))
		return -EINVAL;
	for (i = 0; i < op->num_bufs; i++) {
		ret = npu_resolve_buf(ctx, job, &op->bufs[i],
				      i == npu_op_out_buf[op->opcode], &va[i]);
		if (ret)
			return ret;
	}

	memset(cmd, 0, sizeof(*cmd));
	cmd->opcode = op->opcode;
	switch (op->opcode) {
	case NPU_OP_NOP:
		return 0;
	case NPU_OP_COPY:
		if (op->bufs[0].size != op->bufs[1].size)
			return -EINVAL;
		/* Overlapping ranges can only come from one BO. */
		if (op->bufs[0].handle == op->bufs[1].handle &&
		    op->bufs[0].offset < op->bufs[1].offset + op->bufs[1].size &&
		    op->bufs[1].offset < op->bufs[0].offset + op->bufs[0].size)
			return -EINVAL;
		cmd->copy.src = va[0];
		cmd->copy.dst = va[1];
		cmd->copy.len = op->bufs[0].size;
		return 0;
	case NPU_OP_FILL:
		if (op->bufs[0].size % 4)
			return -EINVAL;
		cmd->fill.dst = va[0];
		cmd->fill.len = op->bufs[0].size;
		cmd->fill.pattern = op->params[0];
		return 0;
	case NPU_OP_GEMM:
		return npu_build_gemm(op, va, cmd);
	}
	return -EINVAL;
}

/*
 * Validate one tensor op and translate it into a descriptor plus the
 * parameter block the device will read (@hw). The rules are the device's
 * own (npu_tensor.h); on top, every operand must lie inside its BO.
 */
static int npu_build_tensor_cmd(struct npu_context *ctx, struct npu_job *job,
				const struct npu_tensor_op *op, struct npu_cmd *cmd,
				struct npu_tensor_params *hw)
{
	u32 n = npu_tensor_op_operands(op->opcode);
	struct npu_bo *bos[NPU_TENSOR_OPERANDS] = {};
	u32 i;

	if (!n || (op->flags & ~NPU_TENSOR_OP_F_MASK) || op->rsvd)
		return -EINVAL;
	if (!npu_tensor_op_supported(op->opcode, ctx->ndev->caps))
		return -EOPNOTSUPP;
	if ((op->flags & NPU_TENSOR_OP_F_CONCURRENT) &&
	    !(ctx->ndev->caps & NPU_CAP_CONCURRENT))
		return -EOPNOTSUPP;
	memset(hw, 0, sizeof(*hw));
	/* The validator below rejects params the opcode does not use. */
	BUILD_BUG_ON(sizeof(op->params) > sizeof(hw->params));
	memcpy(hw->params, op->params, sizeof(op->params));
	for (i = 0; i < NPU_TENSOR_OPERANDS; i++) {
		const struct npu_tensor_ref *ref = &op->t[i];

		if (i >= n) {
			if (!npu_mem_is_zero(ref, sizeof(*ref)))
				return -EINVAL;
			continue;
		}
		if (ref->rsvd || ref->rsvd2)
			return -EINVAL;
		bos[i] = npu_bo_lookup(ctx, ref->handle);
		if (!bos[i])
			return -ENOENT;
		job->bos[job->num_bos++] = bos[i];
		if (i == n - 1 && bos[i]->dev_readonly)	/* the output */
			return -EACCES;
		hw->t[i].dtype = ref->dtype;
		hw->t[i].ndim = ref->ndim;
		memcpy(hw->t[i].shape, ref->shape, sizeof(ref->shape));
		memcpy(hw->t[i].strides, ref->strides, sizeof(ref->strides));
	}
	if (npu_tensor_op_features(op->opcode, op->kind, hw->params, &hw->t[n - 1]) &
	    ~ctx->ndev->caps)
		return -EOPNOTSUPP;
	if (npu_tensor_op_check(op->opcode, op->kind, hw) != NPU_ST_OK)
		return -EINVAL;
	for (i = 0; i < n; i++) {
		u64 end;

		if (check_add_overflow(op->t[i].offset, npu_tensor_extent(&hw->t[i]), &end) ||
		    end > bos[i]->size)
			return -ERANGE;
		hw->t[i].va = bos[i]->va + op->t[i].offset;
	}
	memset(cmd, 0, sizeof(*cmd));
	cmd->opcode = op->opcode;
	if (op->flags & NPU_TENSOR_OP_F_CONCURRENT)
		cmd->flags = NPU_CMD_F_CONCURRENT;
	cmd->tensor.kind = op->kind;
	return 0;
}

/* Validate and translate op @i of a SUBMIT of either op format. */
static int npu_build_op(struct npu_context *ctx, struct npu_job *job,
			const void *ops, u32 op_size, u32 i, struct npu_cmd *cmd,
			struct npu_tensor_params *hw)
{
	if (op_size == sizeof(struct npu_tensor_op))
		return npu_build_tensor_cmd(ctx, job, (const struct npu_tensor_op *)ops + i,
					    cmd, &hw[i]);
	return npu_build_cmd(ctx, job, (const struct npu_op *)ops + i, cmd);
}

/*
 * The file's tensor-op parameter arena (one block per ring slot of queue
 * 0), mapped read-only in its address space only, so that no other file's
 * commands can read its parameter blocks. Created on first use.
 */
static int npu_ctx_params(struct npu_context *ctx)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_bo *bo;
	int ret = 0;

	/* Pairs with the release below: the arena is set up before it shows. */
	if (smp_load_acquire(&ctx->params_bo))
		return 0;
	mutex_lock(&ctx->params_lock);
	if (!ctx->params_bo) {
		bo = npu_bo_create_kernel(ndev, &ctx->vm,
					  ndev->queue.entries * sizeof(*ctx->params),
					  (void **)&ctx->params);
		if (IS_ERR(bo))
			ret = PTR_ERR(bo);
		else
			/* Publish after ctx->params: the lockless check above. */
			smp_store_release(&ctx->params_bo, bo);
	}
	mutex_unlock(&ctx->params_lock);
	return ret;
}

/* Wait, with submit_lock dropped, until @n ring slots are free. */
static int npu_wait_space(struct npu_queue *q, u32 n)
{
	long ret;

	while (npu_queue_space(q) < n) {
		mutex_unlock(&q->submit_lock);
		ret = wait_event_interruptible_timeout(q->wq, npu_queue_space(q) >= n,
						       NPU_SUBMIT_SPACE_TIMEOUT);
		mutex_lock(&q->submit_lock);
		/* Nothing is queued yet: a restarted SUBMIT starts afresh. */
		if (ret < 0)
			return ret;
		if (ret == 0)
			return -EBUSY;
	}
	return 0;
}

int npu_ioctl_submit(struct npu_context *ctx, void *data)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_queue *q = &ndev->queue;
	struct npu_tensor_params *hw = NULL;
	struct npu_submit *args = data;
	struct npu_out_sync out = {};
	struct dma_fence *done;
	struct npu_cmd *cmds;
	struct npu_job *job;
	u64 first, last;
	u32 i, n, slots;
	bool tensor;
	void *ops;
	int ret;

	tensor = args->op_size == sizeof(struct npu_tensor_op);
	n = args->num_ops;
	if (args->flags || (!tensor && args->op_size != sizeof(struct npu_op)) ||
	    n == 0 || n > NPU_SUBMIT_MAX_OPS || args->queue >= ndev->num_queues ||
	    args->num_in_syncs > NPU_SUBMIT_MAX_SYNCS)
		return -EINVAL;
	if (tensor && !(ndev->caps & NPU_CAP_TENSOR))
		return -EOPNOTSUPP;
	if (tensor) {
		ret = npu_ctx_params(ctx);
		if (ret)
			return ret;
	}
	if (READ_ONCE(ctx->faulted))
		return -EBADFD;
	if (READ_ONCE(ctx->banned) || READ_ONCE(ndev->wedged))
		return -EIO;

	ops = vmemdup_user(u64_to_user_ptr(args->ops_ptr), array_size(n, args->op_size));
	if (IS_ERR(ops))
		return PTR_ERR(ops);
	cmds = kvmalloc_array(n, sizeof(*cmds), GFP_KERNEL);
	if (tensor)
		hw = kvmalloc_array(n, sizeof(*hw), GFP_KERNEL);
	job = kvzalloc(struct_size(job, bos, n * NPU_TENSOR_OPERANDS), GFP_KERNEL);
	if (!cmds || !job || (tensor && !hw)) {
		ret = -ENOMEM;
		goto out_free;
	}
	job->ctx = ctx;
	for (i = 0; i < n; i++) {
		ret = npu_build_op(ctx, job, ops, args->op_size, i, &cmds[i], hw);
		if (ret) {
			npu_dbg(ndev, "submit: op %u rejected: %d\n", i, ret);
			goto out_put_job;
		}
	}
	ret = npu_job_get_deps(ctx, job, args);
	if (ret)
		goto out_put_job;
	ret = npu_out_sync_get(ctx, args, &out);
	if (ret)
		goto out_put_job;
	/* The device stays awake until the job retires. */
	ret = npu_pm_get(ndev);
	if (ret)
		goto out_put_job;
	job->pm = ndev;

	/* Each dependency still to be met takes a slot: a WAIT before the ops. */
	slots = job->num_deps + n;
	mutex_lock(&q->submit_lock);
	ret = npu_wait_space(q, slots);
	if (ret)
		goto out_unlock;
	job->first_fence = q->next_fence + 1;
	job->last_fence = job->first_fence + slots - 1;
	ret = npu_job_create_fence(job);
	if (ret)
		goto out_unlock;
	npu_job_push_deps(q, job);
	for (i = 0; i < n; i++) {
		u32 slot = job->num_deps + i;

		cmds[i].fence = job->first_fence + slot;
		cmds[i].ctx = ctx->vm.ctx;
		/* Concurrency stays inside the job: its first op waits. */
		if (i == 0)
			cmds[i].flags &= ~NPU_CMD_F_CONCURRENT;
		if (i == n - 1)
			cmds[i].flags |= NPU_CMD_F_IRQ;
		/* The slot is free, so is its parameter block. */
		if (tensor)
			cmds[i].tensor.params = npu_queue_put_params(q, ctx, &hw[i]);
		npu_queue_push(q, &cmds[i], ctx->client_id);
	}
	WRITE_ONCE(ctx->last_fence, job->last_fence);
	kref_get(&ctx->ref);
	/*
	 * The job may retire, and be freed by the IRQ thread on another CPU,
	 * as soon as it is listed: keep its fence and fence numbers, and touch
	 * the job no more after the list lock is dropped.
	 */
	done = dma_fence_get(job->done);
	first = job->first_fence;
	last = job->last_fence;
	npu_job_arm_deps(job);
	job->submit_ns = ktime_get_ns();
	spin_lock(&q->job_lock);
	list_add_tail(&job->node, &q->jobs);
	WRITE_ONCE(q->next_fence, last);
	spin_unlock(&q->job_lock);
	trace_npu_submit(q->index, first, last);
	npu_queue_kick(q);
	args->fence = last;
	mutex_unlock(&q->submit_lock);

	npu_out_sync_signal(&out, done);
	dma_fence_put(done);
	kvfree(hw);
	kvfree(cmds);
	kvfree(ops);
	/* The job is queued: should DRM's copy-out fault, it runs anyway. */
	return 0;

out_unlock:
	mutex_unlock(&q->submit_lock);
out_put_job:
	npu_out_sync_put(&out);
	npu_job_signal(job);
	if (job->pm)
		npu_pm_put(job->pm);
	for (i = 0; i < job->num_bos; i++)
		npu_bo_put(job->bos[i]);
out_free:
	kvfree(job);
	kvfree(hw);
	kvfree(cmds);
	kvfree(ops);
	return ret;
}

/*
 * Time left until the CLOCK_MONOTONIC time @deadline_ns; 0 when it has
 * passed (the caller polls). The waits sleep on an hrtimer for it, not on
 * jiffies: a jiffies timeout may end up to a tick before the deadline, and
 * a WAIT must never report ETIMEDOUT while its deadline is still ahead.
 */
ktime_t npu_deadline_left(s64 deadline_ns)
{
	s64 left;

	if (deadline_ns == S64_MAX)
		return KTIME_MAX;
	left = deadline_ns - ktime_get_ns();
	return left > 0 ? ns_to_ktime(left) : 0;
}

/* Take the oldest pending error at or below @fence, if any. */
static bool npu_context_take_error(struct npu_context *ctx, u64 fence,
				   struct npu_wait *args)
{
	struct npu_error *err, *found = NULL;

	spin_lock(&ctx->err_lock);
	list_for_each_entry(err, &ctx->errors, node) {
		if (err->fence <= fence && (!found || err->fence < found->fence))
			found = err;
	}
	if (found) {
		list_del(&found->node);
		ctx->num_errors--;
	}
	spin_unlock(&ctx->err_lock);
	if (!found)
		return false;
	args->status = found->status;
	args->error_fence = found->fence;
	kfree(found);
	return true;
}

/*
 * Spin briefly on the device's fence write-back before sleeping; when it
 * shows the fence, retire the completions here instead of waiting for the
 * interrupt thread.
 */
static bool npu_wait_spin(struct npu_queue *q, u64 fence)
{
	ktime_t end = ktime_add_ns(ktime_get(), NPU_WAIT_SPIN_NS);

	do {
		if (npu_fence_done(q, fence))
			return true;
		if (READ_ONCE(q->wb->value) >= fence) {
			npu_queue_process(q);
			return npu_fence_done(q, fence);
		}
		cpu_relax();
	} while (ktime_before(ktime_get(), end));
	return npu_fence_done(q, fence);
}

int npu_ioctl_wait(struct npu_context *ctx, void *data)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_queue *q = &ndev->queue;
	struct npu_wait *args = data;
	ktime_t timeout;
	int ret;

	if (args->flags || args->rsvd)
		return -EINVAL;
	args->status = NPU_ST_OK;
	args->error_fence = 0;
	if (args->queue != 0)
		return npu_uqueue_wait(ctx, args);
	if (args->fence > READ_ONCE(q->next_fence))
		return -EINVAL;

	if (!npu_wait_spin(q, args->fence)) {
		timeout = npu_deadline_left(args->deadline_ns);
		if (!timeout)
			return -ETIMEDOUT;
		ret = wait_event_interruptible_hrtimeout(q->wq,
							 npu_fence_done(q, args->fence),
							 timeout);
		/* -ERESTARTSYS: the deadline is absolute, so a restart is exact. */
		if (ret == -ETIME)
			return -ETIMEDOUT;
		if (ret)
			return ret;
	}
	trace_npu_wait_done(q->index, args->fence);
	/*
	 * The fence is done, but another CPU may still be retiring a failed
	 * job of this file (recording its error): wait for that, a short
	 * section with no lock held that wakes q->wq when done.
	 */
	wait_event(q->wq, !atomic_read(&ctx->errors_pending));

	/* DRM copies the struct out on errors too: -EIO reports its status. */
	if (npu_context_take_error(ctx, args->fence, args))
		return -EIO;
	return READ_ONCE(ctx->faulted) ? -EBADFD : 0;
}

/*
 * FENCE_INFO: the completion record of a completed fence. The record is
 * read twice around the copy: a slot reused meanwhile (the ring wrapped)
 * gives -ENOENT instead of a torn record.
 */
int npu_ioctl_fence_info(struct npu_context *ctx, void *data)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_queue *q = &ndev->queue;
	struct npu_fence_info *args = data;
	const struct npu_cpl *rec;
	struct npu_cpl cpl;
	u32 slot;

	if (args->queue >= ndev->num_queues || !args->fence ||
	    args->fence > READ_ONCE(q->next_fence))
		return -EINVAL;
	if (READ_ONCE(q->wb->value) < args->fence)
		return -EBUSY;
	slot = npu_fence_slot(q, args->fence);
	/* Another file's op: as unknown to this file as a record long gone. */
	if (READ_ONCE(q->owner[slot]) != ctx->client_id)
		return -ENOENT;
	rec = &q->cpl[slot];
	/* The device writes records in host byte order (x86, as npu_hw.c). */
	if (READ_ONCE(rec->fence) != args->fence)
		return -ENOENT;
	memcpy(&cpl, rec, sizeof(cpl));
	/* Order the copy before the second look at the slot's fence. */
	smp_rmb();
	if (cpl.fence != args->fence || READ_ONCE(rec->fence) != args->fence)
		return -ENOENT;
	args->status = cpl.status;
	args->t_start = cpl.t_start;
	args->t_end = cpl.t_end;
	return 0;
}

/*
 * poll(): EPOLLIN once every op the file submitted (SUBMIT) has completed
 * and its user queues are idle; EPOLLERR when the file is faulted or
 * banned. Completions wake the pollers.
 */
__poll_t npu_poll(struct npu_context *ctx, struct file *file,
		  struct poll_table_struct *wait)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_queue *q = &ndev->queue;
	__poll_t mask = 0;

	/* Both wait queues live as long as the file (not its user queues). */
	poll_wait(file, &q->wq, wait);
	poll_wait(file, &ctx->poll_wq, wait);
	if (READ_ONCE(ctx->faulted) || READ_ONCE(ctx->banned))
		mask |= EPOLLERR;
	if (npu_fence_done(q, READ_ONCE(ctx->last_fence)) && npu_uqueue_idle(ctx))
		mask |= EPOLLIN | EPOLLRDNORM;
	return mask;
}
