// SPDX-License-Identifier: GPL-2.0
/*
 * NPU hang detection and recovery. A watchdog looks at every queue each
 * NPU_WD_PERIOD: a queue whose command has been running (Q_STATUS.ACTIVE
 * with the same HEAD) without progress (the same Q_PROGRESS: a command
 * that passes control points, or is preempted, moves it) for longer than
 * hang_timeout_ms hung, and so did the driver's queue when a dependency's
 * WAIT held it (Q_STATUS.WAITING) that long. The device runs one command
 * at a time, so a hung command stops everything: the
 * watchdog resets the device, fails the hung op (NPU_ST_TIMEOUT), replays
 * the driver queue's other unfinished ops in order, and restarts. User
 * queues restart where they were (HEAD and TAIL noted before the reset);
 * one whose command hung stops (its waiters get -EIO). A file
 * whose commands hang NPU_BAN_HANGS times is banned: its SUBMITs fail with
 * -EIO. A firmware whose heartbeat stops (NPU_HB_MISSES periods) is
 * recovered the same way, its image booted again. The same periodic work
 * is the fallback for lost completion interrupts: it retires what the
 * fence write-back shows.
 */
#include <linux/kobject.h>
#include <linux/moduleparam.h>
#include <linux/slab.h>

#include "npu_coredump.h"
#include "npu_drv.h"
#include "npu_tensor.h"
#include "npu_trace.h"

#define NPU_WD_PERIOD		msecs_to_jiffies(100)
#define NPU_BAN_HANGS		3
#define NPU_FW_LOST		(-1)	/* npu_recover(): not a queue's hang */

static unsigned int hang_timeout_ms = 10000;
module_param(hang_timeout_ms, uint, 0644);
MODULE_PARM_DESC(hang_timeout_ms,
		 "A command running longer than this hung: reset the device (0: never)");

/* A KOBJ_CHANGE uevent on /sys/class/npu/npuN: NPU_RESET=1 NPU_REASON=... */
void npu_reset_uevent(struct npu_device *ndev, const char *reason)
{
	char reset_env[] = "NPU_RESET=1";
	char reason_env[32];
	char *envp[3];
	int idx;

	envp[0] = reset_env;
	envp[1] = reason_env;
	envp[2] = NULL;
	snprintf(reason_env, sizeof(reason_env), "NPU_REASON=%s", reason);
	/*
	 * On the accel device (subsystem "accel"), where udev rules match it;
	 * inside npu_dev_enter(), so that remove() cannot unregister it meanwhile.
	 */
	if (!npu_dev_enter(ndev, &idx))
		return;
	if (ndev->drm.registered)
		kobject_uevent_env(&ndev->drm.accel->kdev->kobj, KOBJ_CHANGE, envp);
	npu_dev_exit(ndev, idx);
}

/*
 * Rewrite the unfinished ops of the driver's queue (fences after
 * q->completed) at the start of the ring, the ops of the job holding
 * @hung turned into NOPs, and restart the timeline before them. Caller
 * holds submit_lock; the device is reset.
 */
static int npu_queue_replay(struct npu_queue *q, u64 hung)
{
	u64 base = q->completed, n = q->next_fence - base, i;
	u64 bad_first = 0, bad_last = 0;
	struct npu_tensor_params *params;
	struct npu_context **owners;
	struct npu_cmd *cmds;
	u64 *clients;
	struct npu_job *bad;
	int ret = -ENOMEM;

	cmds = kvmalloc_array(n ?: 1, sizeof(*cmds), GFP_KERNEL);
	params = kvmalloc_array(n ?: 1, sizeof(*params), GFP_KERNEL);
	owners = kvcalloc(n ?: 1, sizeof(*owners), GFP_KERNEL);
	clients = kvmalloc_array(n ?: 1, sizeof(*clients), GFP_KERNEL);
	if (!cmds || !params || !owners || !clients)
		goto out;
	/* Each op's parameter block is in its file's arena, at its slot. */
	spin_lock(&q->job_lock);
	for (i = 0; i < n; i++) {
		u32 slot = npu_fence_slot(q, base + 1 + i);
		struct npu_job *job = npu_queue_find_job(q, base + 1 + i);

		cmds[i] = q->ring[slot];
		clients[i] = q->owner[slot];
		owners[i] = job ? job->ctx : NULL;
		if (npu_tensor_op_operands(cmds[i].opcode) && owners[i] && owners[i]->params)
			params[i] = owners[i]->params[slot];
		else
			owners[i] = NULL;	/* not a tensor op of a file */
	}
	bad = hung ? npu_queue_find_job(q, hung) : NULL;
	if (bad) {
		bad_first = bad->first_fence;
		bad_last = bad->last_fence;
		if (!bad->err_fence) {
			bad->err_fence = hung;
			bad->err_status = NPU_ST_TIMEOUT;
		}
	}
	spin_unlock(&q->job_lock);

	npu_queue_rebase(q, base);
	for (i = 0; i < n; i++) {
		struct npu_cmd *cmd = &cmds[i];
		u64 fence = base + 1 + i;

		if (fence >= bad_first && fence <= bad_last) {
			memset(&cmd->raw, 0, sizeof(cmd->raw));
			cmd->opcode = NPU_OP_NOP;
		} else if (owners[i]) {
			cmd->tensor.params = npu_queue_put_params(q, owners[i], &params[i]);
		}
		npu_queue_push(q, cmd, clients[i]);
	}
	ret = 0;
out:
	kvfree(clients);
	kvfree(owners);
	kvfree(cmds);
	kvfree(params);
	return ret;
}

/* The owner of the hung command of queue @qi and fence @hung, or NULL. */
static struct npu_context *npu_hang_owner(struct npu_device *ndev, u32 qi, u64 hung)
{
	struct npu_job *job;

	if (qi)
		return npu_uqueue_owner(ndev, qi);
	spin_lock(&ndev->queue.job_lock);
	job = npu_queue_find_job(&ndev->queue, hung);
	spin_unlock(&ndev->queue.job_lock);
	return job ? job->ctx : NULL;
}

/*
 * Reset the device and bring it back: queue @qi hung (its command ran
 * since @since), or with @qi = NPU_FW_LOST the firmware stopped. The
 * firmware is booted again if the reset left it off.
 */
static void npu_recover(struct npu_device *ndev, int qi, unsigned long since)
{
	struct npu_queue *q = &ndev->queue;
	struct npu_context *owner = NULL;
	struct npu_dump_header *dump = NULL;
	bool fw = qi == NPU_FW_LOST;
	LIST_HEAD(done);
	ktime_t t0;
	u64 hung;

	mutex_lock(&q->submit_lock);
	/* Retiring may free buffers, which takes uq_mutex: do it first. */
	npu_queue_process(q);
	mutex_lock(&ndev->uq_mutex);
	if (npu_unplugged(ndev))
		goto out;
	hung = q->completed + 1;
	if (fw) {
		dev_err(&ndev->pdev->dev, "firmware heartbeat lost (status %u); resetting\n",
			npu_rd(ndev, NPU_REG_FW_STATUS));
	} else {
		owner = npu_hang_owner(ndev, qi, hung);
		atomic_inc(&ndev->hangs);
		ndev->hang_detect_ns = jiffies_to_nsecs(jiffies - since);
		dev_err(&ndev->pdev->dev,
			"queue %d: command hung for %u ms (client %llu); resetting\n",
			qi, jiffies_to_msecs(jiffies - since), owner ? owner->client_id : 0);
	}
	if (owner && ++owner->hangs >= NPU_BAN_HANGS)
		WRITE_ONCE(owner->banned, true);

	/* What led here, before the reset changes it; devcoredump gets it at the end. */
	dump = npu_coredump_capture(ndev, fw ? NPU_DUMP_FW_LOST : NPU_DUMP_HANG, qi, hung,
				    owner ? owner->client_id : 0);
	npu_uqueue_suspend_all(ndev, fw ? 0 : qi);
	t0 = ktime_get();
	if (npu_hw_reset(ndev) ||
	    (npu_rd(ndev, NPU_REG_FW_STATUS) != NPU_FW_RUNNING && npu_fw_boot(ndev))) {
		/*
		 * The device is gone for good: fail everything and never
		 * restart. It did not stop, so it may still write the buffers
		 * of the jobs in flight and walk their files' page tables:
		 * those are never freed.
		 */
		WRITE_ONCE(ndev->wedged, true);
		npu_coredump_fatal(ndev, dump);
		npu_queue_abort_all(q, NPU_ST_ABORTED, &done);
		npu_jobs_keep_memory(&done);
		npu_uqueue_stop_all(ndev, 0);
		goto out;
	}
	/*
	 * The device is stopped: what it completed up to the reset (also
	 * after the look above, e.g. before a lost firmware stopped it) is
	 * final now and retires; only the rest is replayed, so no op runs
	 * twice. Later completion interrupts find nothing new until the
	 * restart below.
	 */
	npu_queue_collect_done(q, &done);
	npu_uqueue_reset_done(ndev);
	/* Only a hang of the driver's queue has a guilty op there. */
	if (npu_queue_replay(q, qi > 0 || fw ? 0 : hung)) {
		npu_queue_abort_all(q, NPU_ST_ABORTED, &done);
		npu_queue_rebase(q, q->next_fence);
	}
	npu_hw_start(ndev);
	npu_queue_kick(q);
	npu_uqueue_resume_all(ndev);
	npu_fw_heartbeat_reset(ndev);
	ndev->reset_recovery_ns = ktime_to_ns(ktime_sub(ktime_get(), t0));
	atomic_inc(&ndev->recoveries);
	npu_reset_uevent(ndev, fw ? "firmware" : "hang");
out:
	mutex_unlock(&ndev->uq_mutex);
	npu_queue_retire(q, &done);
	mutex_unlock(&q->submit_lock);
	npu_coredump_submit(ndev, dump);
}

static void npu_watchdog(struct work_struct *work)
{
	struct npu_device *ndev = container_of(to_delayed_work(work), struct npu_device,
					       watchdog);
	unsigned long timeout = msecs_to_jiffies(READ_ONCE(hang_timeout_ms));
	struct npu_queue *q = &ndev->queue;
	u32 i;

	/* Paused through debugfs: the state stays as it is for a look. */
	if (READ_ONCE(ndev->wd_paused))
		goto again;
	/* A lost completion interrupt: the write-back shows what it missed. */
	if (READ_ONCE(q->wb->value) > READ_ONCE(q->completed))
		npu_queue_process(q);
	npu_uqueue_irq(ndev, 0);

	/*
	 * A suspended device runs nothing and has no firmware to lose
	 * (npu_pm.c); an awake one is watched, idle or not, without
	 * delaying its suspend.
	 */
	if (!npu_pm_get_if_active(ndev)) {
		memset(ndev->wd_since, 0, sizeof(ndev->wd_since));
		goto again;
	}
	npu_fwtrace_drain(ndev);
	if (npu_fw_heartbeat_lost(ndev)) {
		npu_recover(ndev, NPU_FW_LOST, jiffies);
		memset(ndev->wd_since, 0, sizeof(ndev->wd_since));
		goto put;
	}

	for (i = 0; timeout && i < ndev->hw_queues; i++) {
		u32 st = npu_rd(ndev, NPU_QREG(i, NPU_Q_STATUS));
		u32 head = npu_rd(ndev, NPU_QREG(i, NPU_Q_HEAD));
		/* Moves while its command runs or is preempted: not a hang. */
		u32 prog = npu_rd(ndev, NPU_QREG(i, NPU_Q_PROGRESS));
		/*
		 * A WAIT of the driver's queue is a SUBMIT's dependency: not met
		 * within the timeout, it hangs the queue all files share. A user
		 * queue may wait as long as its owner likes.
		 */
		bool busy = st & (NPU_QSTAT_ACTIVE | (i ? 0 : NPU_QSTAT_WAITING));

		if (!busy || head != ndev->wd_head[i] || prog != ndev->wd_progress[i] ||
		    !ndev->wd_since[i]) {
			ndev->wd_head[i] = head;
			ndev->wd_progress[i] = prog;
			ndev->wd_since[i] = busy ? jiffies : 0;
			continue;
		}
		if (time_after(jiffies, ndev->wd_since[i] + timeout)) {
			npu_recover(ndev, i, ndev->wd_since[i]);
			memset(ndev->wd_since, 0, sizeof(ndev->wd_since));
			break;
		}
	}
put:
	npu_pm_put_quiet(ndev);
again:
	schedule_delayed_work(&ndev->watchdog, NPU_WD_PERIOD);
}

void npu_watchdog_init(struct npu_device *ndev)
{
	INIT_DELAYED_WORK(&ndev->watchdog, npu_watchdog);
}

void npu_watchdog_start(struct npu_device *ndev)
{
	schedule_delayed_work(&ndev->watchdog, NPU_WD_PERIOD);
}

void npu_watchdog_stop(struct npu_device *ndev)
{
	cancel_delayed_work_sync(&ndev->watchdog);
}
