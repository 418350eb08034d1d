// SPDX-License-Identifier: GPL-2.0
/*
 * NPU fences. Every SUBMIT job has a dma_fence on queue 0's timeline (its
 * seqno is the job's last fence value), signalled when the driver retires
 * the job, with an error if an op failed; SUBMIT can put it into a DRM
 * syncobj, binary or at a timeline point, and DRM's syncobj ioctls wait
 * for it, export it as a sync_file (poll()able) and pass it on.
 *
 * A SUBMIT's dependencies are waited for by the device, not by the CPU:
 * each one not met yet becomes a WAIT descriptor ahead of the job's ops,
 *   - on the user queue's fence write-back, for a user-queue fence value
 *     (the write-back page is mapped read-only in the driver's space);
 *   - on a semaphore word of the driver's, which a callback of the fence
 *     writes when it signals, for any other dma_fence.
 * A fence of queue 0 itself needs no WAIT: the queue runs in order. The
 * device looks at a waiting WAIT after each completion and every 1 ms; the
 * watchdog fails a job whose WAIT is not met within the hang timeout.
 */
#include <linux/dma-fence-chain.h>
#include <linux/dma-mapping.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include <drm/drm_syncobj.h>

#include "npu_drv.h"
#include "npu_trace.h"

/* One semaphore per ring slot: a dependency's WAIT holds a slot too. */
#define NPU_SEM_SLOTS	NPU_RING_ENTRIES
#define NPU_SEM_BYTES	(NPU_SEM_SLOTS * sizeof(u64))

static const char *npu_fence_driver_name(struct dma_fence *fence)
{
	return NPU_DRIVER_NAME;
}

static const char *npu_fence_timeline_name(struct dma_fence *fence)
{
	return "queue0";
}

static const struct dma_fence_ops npu_fence_ops = {
	.get_driver_name = npu_fence_driver_name,
	.get_timeline_name = npu_fence_timeline_name,
};

int npu_fence_init(struct npu_device *ndev)
{
	ndev->fence_context = dma_fence_context_alloc(1);
	ndev->sem = dma_alloc_coherent(&ndev->pdev->dev, NPU_SEM_BYTES, &ndev->sem_dma,
				       GFP_KERNEL);
	if (!ndev->sem)
		return -ENOMEM;
	/* The device only reads them: a WAIT's address in ctx 0's space. */
	ndev->sem_va = npu_vm_map_dma(&ndev->kvm, ndev->sem_dma, NPU_SEM_BYTES, false);
	return ndev->sem_va ? 0 : -ENOMEM;
}

/* The device is gone; so are the jobs, which held the slots. */
void npu_fence_fini(struct npu_device *ndev)
{
	if (ndev->sem_va)
		npu_vm_unmap(&ndev->kvm, ndev->sem_va, NPU_SEM_BYTES);
	if (ndev->sem)
		dma_free_coherent(&ndev->pdev->dev, NPU_SEM_BYTES, ndev->sem, ndev->sem_dma);
	ida_destroy(&ndev->sem_ida);
}

static int npu_status_errno(u32 status)
{
	switch (status) {
	case NPU_ST_TIMEOUT:
		return -ETIME;
	case NPU_ST_ABORTED:
		return -ECANCELED;
	case NPU_ST_MMU_FAULT:
		return -EFAULT;
	default:
		return -EIO;
	}
}

/* Runs in any context, with the fence's lock held. */
static void npu_dep_signalled(struct dma_fence *fence, struct dma_fence_cb *cb)
{
	struct npu_dep *dep = container_of(cb, struct npu_dep, cb);

	WRITE_ONCE(dep->ndev->sem[dep->sem], dep->value);
}

static void npu_job_put_deps(struct npu_job *job)
{
	u32 i;

	for (i = 0; i < job->num_deps; i++) {
		struct npu_dep *dep = &job->deps[i];

		if (dep->fence) {
			/* Waits for a callback running now; the WAIT is over anyway. */
			dma_fence_remove_callback(dep->fence, &dep->cb);
			dma_fence_put(dep->fence);
		}
		if (dep->sem >= 0)
			ida_free(&dep->ndev->sem_ida, dep->sem);
		if (dep->uq)
			npu_uqueue_put(dep->uq);
	}
	kfree(job->deps);
	job->deps = NULL;
	job->num_deps = 0;
}

/* A dependency on @fence of the device's: a semaphore for its WAIT. */
static int npu_dep_fence(struct npu_device *ndev, struct npu_dep *dep,
			 struct dma_fence *fence)
{
	int sem = ida_alloc_max(&ndev->sem_ida, NPU_SEM_SLOTS - 1, GFP_KERNEL);

	if (sem < 0)
		return sem == -ENOSPC ? -EBUSY : sem;
	dep->fence = fence;
	dep->sem = sem;
	dep->va = ndev->sem_va + sem * sizeof(u64);
	return 0;
}

/*
 * Look up the dependencies of a SUBMIT into @job, keeping those the device
 * must wait for (with a reference each). Nothing is queued yet: on an error
 * the caller's npu_job_signal() puts what was taken.
 */
int npu_job_get_deps(struct npu_context *ctx, struct npu_job *job,
		     const struct npu_submit *args)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_sync syncs[NPU_SUBMIT_MAX_SYNCS];
	u32 n = args->num_in_syncs, i;
	int ret;

	if (!n)
		return 0;
	if (copy_from_user(syncs, u64_to_user_ptr(args->in_syncs), n * sizeof(*syncs)))
		return -EFAULT;
	job->deps = kcalloc(n, sizeof(*job->deps), GFP_KERNEL);
	if (!job->deps)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		const struct npu_sync *s = &syncs[i];
		struct npu_dep *dep = &job->deps[job->num_deps];
		struct dma_fence *fence;
		struct npu_uqueue *uq;

		if (s->flags & ~NPU_SYNC_FLAGS)
			return -EINVAL;
		INIT_LIST_HEAD(&dep->cb.node);
		dep->ndev = ndev;
		dep->sem = -1;
		if (s->flags & NPU_SYNC_USER_QUEUE) {
			uq = npu_uqueue_get_owned(ctx, s->handle);
			if (!uq)
				return -ENOENT;
			if (READ_ONCE(uq->wb->value) >= s->point) {
				npu_uqueue_put(uq);
				continue;
			}
			dep->uq = uq;
			dep->va = uq->wb_kva + offsetof(struct npu_fence_wb, value);
			dep->value = s->point;
			job->num_deps++;
			continue;
		}
		ret = drm_syncobj_find_fence(ctx->file, s->handle, s->point, 0, &fence);
		if (ret)
			return ret;
		/* Queue 0 runs in order: its own fences are met by then. */
		if (fence->context == ndev->fence_context || dma_fence_is_signaled(fence)) {
			dma_fence_put(fence);
			continue;
		}
		ret = npu_dep_fence(ndev, dep, fence);
		if (ret) {
			dma_fence_put(fence);
			return ret;
		}
		job->num_deps++;
	}
	return 0;
}

/*
 * Queue a WAIT for each dependency, taking fences from job->first_fence on.
 * Caller holds submit_lock and made room for them.
 */
void npu_job_push_deps(struct npu_queue *q, struct npu_job *job)
{
	u32 i;

	lockdep_assert_held(&q->submit_lock);
	for (i = 0; i < job->num_deps; i++) {
		struct npu_dep *dep = &job->deps[i];
		struct npu_cmd cmd = {
			.opcode = NPU_OP_WAIT,
			.fence = job->first_fence + i,
			.ctx = 0,	/* the driver's space: semaphores, write-backs */
		};

		/* Fences only grow: a slot's earlier value never meets this. */
		if (dep->fence)
			dep->value = cmd.fence;
		cmd.sync.va = dep->va;
		cmd.sync.value = dep->value;
		npu_queue_push(q, &cmd, job->ctx->client_id);
		trace_npu_dep(q->index, cmd.fence, dep->fence ? dep->fence->context : 0,
			      dep->fence ? dep->fence->seqno : dep->value);
	}
}

/* Once the WAITs are queued: each fence's callback releases its WAIT. */
void npu_job_arm_deps(struct npu_job *job)
{
	u32 i;

	for (i = 0; i < job->num_deps; i++) {
		struct npu_dep *dep = &job->deps[i];

		if (dep->fence &&
		    dma_fence_add_callback(dep->fence, &dep->cb, npu_dep_signalled))
			WRITE_ONCE(dep->ndev->sem[dep->sem], dep->value);
	}
}

/* The job's dma_fence, at its last fence value; before it is queued. */
int npu_job_create_fence(struct npu_job *job)
{
	struct npu_fence *f = kzalloc(sizeof(*f), GFP_KERNEL);

	if (!f)
		return -ENOMEM;
	spin_lock_init(&f->lock);
	dma_fence_init(&f->base, &npu_fence_ops, &f->lock,
		       job->ctx->ndev->fence_context, job->last_fence);
	job->done = &f->base;
	return 0;
}

/*
 * The job is over (retired or given up before it was queued): signal its
 * fence, with the errno of its failed op if one failed, and drop its
 * dependencies. Retirement runs in fence order, as dma_fence requires of
 * one context.
 */
void npu_job_signal(struct npu_job *job)
{
	if (job->done) {
		if (job->err_fence)
			dma_fence_set_error(job->done, npu_status_errno(job->err_status));
		dma_fence_signal(job->done);
		dma_fence_put(job->done);
		job->done = NULL;
	}
	npu_job_put_deps(job);
}

/*
 * The out syncobj of a SUBMIT, looked up (and a timeline link allocated)
 * before anything is queued, so that only the lookup can fail.
 */
int npu_out_sync_get(struct npu_context *ctx, const struct npu_submit *args,
		     struct npu_out_sync *out)
{
	memset(out, 0, sizeof(*out));
	if (!args->out_syncobj)
		return args->out_point ? -EINVAL : 0;
	out->syncobj = drm_syncobj_find(ctx->file, args->out_syncobj);
	if (!out->syncobj)
		return -ENOENT;
	out->point = args->out_point;
	if (out->point) {
		out->chain = dma_fence_chain_alloc();
		if (!out->chain) {
			npu_out_sync_put(out);
			return -ENOMEM;
		}
	}
	return 0;
}

/* Give the out syncobj @fence (a reference of the caller's, kept). */
void npu_out_sync_signal(struct npu_out_sync *out, struct dma_fence *fence)
{
	if (!out->syncobj)
		return;
	if (out->chain)
		drm_syncobj_add_point(out->syncobj, out->chain, fence, out->point);
	else
		drm_syncobj_replace_fence(out->syncobj, fence);
	out->chain = NULL;	/* the syncobj owns it now */
	npu_out_sync_put(out);
}

void npu_out_sync_put(struct npu_out_sync *out)
{
	dma_fence_chain_free(out->chain);
	if (out->syncobj)
		drm_syncobj_put(out->syncobj);
	memset(out, 0, sizeof(*out));
}
