// SPDX-License-Identifier: GPL-2.0
/*
 * NPU debugfs: /sys/kernel/debug/npu/npuN/
 *
 *   inject_cmd  write an opcode number: queue one raw descriptor with that
 *               opcode and an empty payload, bypassing SUBMIT validation, to
 *               exercise the device's own rejection path.
 *   inject      write "hang", "hw_error", "drop_irq", "dma_fault" or
 *               "fw_crash": arm the device's fault injection
 *               (NPU_REG_INJECT) for its next command or completion
 *               interrupt (fw_crash: at once); read: what is armed.
 *   fw_log      the firmware's log ring, oldest line first.
 *   fw_status   firmware state, version, heartbeat, and a mailbox QUERY.
 *   fw_log_level  write 0..3: the firmware's log level (mailbox).
 *   perf        one snapshot of the performance counters: time_ns, then a
 *               line per queue and per AI core.
 *   queues      each enabled queue as the device and the driver see it
 *               (HEAD, TAIL, status, fences, pending jobs), then the
 *               firmware's state: what npu-smi diag reads.
 *   watchdog    write 0 to pause the watchdog (hang and heartbeat checks,
 *               the lost-interrupt fallback), 1 to resume; read: 1 = on.
 *   fwtrace     the device trace ring: on, size, HEAD, TAIL, dropped.
 */
#include <linux/debugfs.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "npu_drv.h"
#include "npu_trace.h"

static struct dentry *npu_debugfs_root;

/* Queue one descriptor as a job owned by no context. */
static int npu_inject_cmd(struct npu_device *ndev, u16 opcode)
{
	struct npu_queue *q = &ndev->queue;
	struct npu_cmd cmd = { .opcode = opcode, .flags = NPU_CMD_F_IRQ };
	struct npu_job *job;

	job = kvzalloc(sizeof(*job), GFP_KERNEL);
	if (!job)
		return -ENOMEM;
	if (npu_pm_get(ndev)) {
		kvfree(job);
		return -EIO;
	}
	job->pm = ndev;
	mutex_lock(&q->submit_lock);
	if (npu_queue_space(q) < 1) {
		mutex_unlock(&q->submit_lock);
		npu_pm_put(ndev);
		kvfree(job);
		return -EBUSY;
	}
	job->first_fence = q->next_fence + 1;
	job->last_fence = job->first_fence;
	cmd.fence = job->first_fence;
	npu_queue_push(q, &cmd, 0);
	job->submit_ns = ktime_get_ns();
	spin_lock(&q->job_lock);
	list_add_tail(&job->node, &q->jobs);
	WRITE_ONCE(q->next_fence, job->last_fence);
	spin_unlock(&q->job_lock);
	trace_npu_submit(q->index, job->first_fence, job->last_fence);
	npu_queue_kick(q);
	mutex_unlock(&q->submit_lock);
	return 0;
}

static ssize_t npu_inject_cmd_write(struct file *file, const char __user *ubuf,
				    size_t len, loff_t *ppos)
{
	struct npu_device *ndev = file->private_data;
	u16 opcode;
	int ret, idx;

	ret = kstrtou16_from_user(ubuf, len, 0, &opcode);
	if (ret)
		return ret;
	if (!npu_dev_enter(ndev, &idx))
		return -ENODEV;
	ret = npu_inject_cmd(ndev, opcode);
	npu_dev_exit(ndev, idx);
	return ret ? ret : len;
}

static const struct file_operations npu_inject_cmd_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = npu_inject_cmd_write,
	.llseek = noop_llseek,
};

static const char * const npu_inject_names[] = {
	"hang", "hw_error", "drop_irq", "dma_fault", "fw_crash",
};

static ssize_t npu_inject_write(struct file *file, const char __user *ubuf,
				size_t len, loff_t *ppos)
{
	struct npu_device *ndev = file->private_data;
	char buf[16];
	int i, idx, ret;

	if (len >= sizeof(buf))
		return -EINVAL;
	if (copy_from_user(buf, ubuf, len))
		return -EFAULT;
	buf[len] = 0;
	i = sysfs_match_string(npu_inject_names, buf);
	if (i < 0)
		return i;
	if (!npu_dev_enter(ndev, &idx))
		return -ENODEV;
	ret = npu_pm_get(ndev);
	if (!ret) {
		npu_wr(ndev, NPU_REG_INJECT, BIT(i));
		npu_pm_put(ndev);
	}
	npu_dev_exit(ndev, idx);
	return ret ?: len;
}

static ssize_t npu_inject_read(struct file *file, char __user *ubuf, size_t len,
			       loff_t *ppos)
{
	struct npu_device *ndev = file->private_data;
	char buf[16];
	u32 armed = 0;
	int n, idx;

	/* A suspended device has nothing armed: D3hot cleared it. */
	if (npu_dev_enter(ndev, &idx)) {
		if (npu_pm_get_if_active(ndev)) {
			armed = npu_rd(ndev, NPU_REG_INJECT);
			npu_pm_put(ndev);
		}
		npu_dev_exit(ndev, idx);
	}
	n = scnprintf(buf, sizeof(buf), "0x%x\n", armed);
	return simple_read_from_buffer(ubuf, len, ppos, buf, n);
}

static const struct file_operations npu_inject_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.read = npu_inject_read,
	.write = npu_inject_write,
	.llseek = noop_llseek,
};

static int npu_fw_log_show(struct seq_file *m, void *unused)
{
	struct npu_device *ndev = m->private;
	char *buf = kvmalloc(SZ_16K, GFP_KERNEL);
	size_t n;

	if (!buf)
		return -ENOMEM;
	n = npu_fw_log_read(ndev, buf, SZ_16K);
	seq_write(m, buf, n);
	kvfree(buf);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(npu_fw_log);

static int npu_fw_status_show(struct seq_file *m, void *unused)
{
	struct npu_device *ndev = m->private;
	u32 resp[2] = {};
	int ret, idx;

	if (!npu_dev_enter(ndev, &idx))
		return -ENODEV;
	ret = npu_pm_get(ndev);
	if (ret) {
		npu_dev_exit(ndev, idx);
		return ret;
	}
	seq_printf(m, "state: %u\nversion: %u.%u\nheartbeat: %u\n",
		   npu_rd(ndev, NPU_REG_FW_STATUS), ndev->fw_version >> 16,
		   ndev->fw_version & 0xffff, npu_rd(ndev, NPU_REG_FW_HEARTBEAT));
	ret = npu_mbox_call(ndev, NPU_MBOX_QUERY, 0, 0, resp);
	if (!ret)
		seq_printf(m, "commands: %u\nlog_level: %u\n", resp[0], resp[1]);
	else
		seq_printf(m, "mailbox: %d\n", ret);
	npu_pm_put(ndev);
	npu_dev_exit(ndev, idx);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(npu_fw_status);

static ssize_t npu_fw_log_level_write(struct file *file, const char __user *ubuf,
				      size_t len, loff_t *ppos)
{
	struct npu_device *ndev = file->private_data;
	u32 level, resp[2];
	int ret, idx;

	ret = kstrtou32_from_user(ubuf, len, 0, &level);
	if (ret)
		return ret;
	if (!npu_dev_enter(ndev, &idx))
		return -ENODEV;
	ret = npu_pm_get(ndev);
	if (!ret) {
		ret = npu_mbox_call(ndev, NPU_MBOX_SET_LOG_LEVEL, level, 0, resp);
		npu_pm_put(ndev);
	}
	npu_dev_exit(ndev, idx);
	return ret ? ret : len;
}

static const struct file_operations npu_fw_log_level_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = npu_fw_log_level_write,
	.llseek = noop_llseek,
};

static int npu_perf_show(struct seq_file *m, void *unused)
{
	struct npu_device *ndev = m->private;
	struct npu_perf_snap *snap;
	u32 q, k;
	int ret;

	snap = kmalloc(sizeof(*snap), GFP_KERNEL);
	if (!snap)
		return -ENOMEM;
	ret = npu_perf_read(ndev, snap);
	if (ret)
		goto out;
	seq_printf(m, "time_ns=%llu\n", snap->time_ns);
	for (q = 0; q < ndev->hw_queues; q++)
		seq_printf(m, "queue=%u cmds=%llu busy_ns=%llu macs=%llu read_bytes=%llu write_bytes=%llu walks=%llu walk_hits=%llu wait_ns=%llu\n",
			   q, snap->q[q][NPU_PERF_CMDS], snap->q[q][NPU_PERF_BUSY_NS],
			   snap->q[q][NPU_PERF_MACS], snap->q[q][NPU_PERF_READ_BYTES],
			   snap->q[q][NPU_PERF_WRITE_BYTES], snap->q[q][NPU_PERF_WALKS],
			   snap->q[q][NPU_PERF_WALK_HITS], snap->q[q][NPU_PERF_WAIT_NS]);
	for (k = 0; k < min_t(u32, ndev->num_cores, NPU_PERF_MAX_CORES); k++)
		seq_printf(m, "core=%u busy_ns=%llu\n", k, snap->core[k]);
out:
	kfree(snap);
	return ret;
}
DEFINE_SHOW_ATTRIBUTE(npu_perf);

static const char * const npu_fw_state_names[] = {
	[NPU_FW_OFF] = "off", [NPU_FW_RUNNING] = "running",
	[NPU_FW_FAILED] = "failed", [NPU_FW_CRASHED] = "crashed",
};

/* The device's view of hardware queue @i: HEAD, TAIL, status, error, done. */
static void npu_queue_regs_show(struct seq_file *m, struct npu_device *ndev, u32 i)
{
	u64 done = npu_rd(ndev, NPU_QREG(i, NPU_Q_DONE_LO));

	done |= (u64)npu_rd(ndev, NPU_QREG(i, NPU_Q_DONE_HI)) << 32;
	seq_printf(m, " head=%u tail=%u status=0x%x error=%u done=%llu",
		   npu_rd(ndev, NPU_QREG(i, NPU_Q_HEAD)),
		   npu_rd(ndev, NPU_QREG(i, NPU_Q_TAIL)),
		   npu_rd(ndev, NPU_QREG(i, NPU_Q_STATUS)),
		   npu_rd(ndev, NPU_QREG(i, NPU_Q_ERROR)), done);
}

static void npu_driver_queue_show(struct seq_file *m, struct npu_device *ndev)
{
	struct npu_queue *q = &ndev->queue;
	struct npu_job *job;
	u64 oldest = 0, now = ktime_get_ns();
	u32 pending = 0;

	spin_lock(&q->job_lock);
	list_for_each_entry(job, &q->jobs, node) {
		if (!pending++)
			oldest = job->submit_ns;
	}
	spin_unlock(&q->job_lock);
	seq_puts(m, "queue=0 kind=kernel");
	npu_queue_regs_show(m, ndev, 0);
	seq_printf(m, " fence_mem=%llu submitted=%llu retired=%llu pending_jobs=%u oldest_ms=%llu\n",
		   READ_ONCE(q->wb->value), READ_ONCE(q->next_fence),
		   READ_ONCE(q->completed), pending,
		   pending ? (now - oldest) / NSEC_PER_MSEC : 0);
}

static int npu_queues_show(struct seq_file *m, void *unused)
{
	struct npu_device *ndev = m->private;
	u32 i, st;
	int idx;

	if (!npu_dev_enter(ndev, &idx))
		return -ENODEV;
	/* Every job and user queue holds the device awake: asleep, all is idle. */
	if (!npu_pm_get_if_active(ndev)) {
		seq_puts(m, "suspended\n");
		npu_dev_exit(ndev, idx);
		return 0;
	}
	npu_driver_queue_show(m, ndev);
	mutex_lock(&ndev->uq_mutex);
	for (i = 1; i < ndev->hw_queues; i++) {
		struct npu_uqueue *uq = ndev->uq[i];

		if (!uq)
			continue;
		seq_printf(m, "queue=%u kind=user", i);
		npu_queue_regs_show(m, ndev, i);
		seq_printf(m, " fence_mem=%llu submitted=- retired=- pending_jobs=0 oldest_ms=0\n",
			   READ_ONCE(uq->wb->value));
	}
	mutex_unlock(&ndev->uq_mutex);
	st = npu_rd(ndev, NPU_REG_FW_STATUS);
	seq_printf(m, "fw state=%s heartbeat=%u\n",
		   st < ARRAY_SIZE(npu_fw_state_names) ? npu_fw_state_names[st] : "unknown",
		   npu_rd(ndev, NPU_REG_FW_HEARTBEAT));
	npu_pm_put_quiet(ndev);
	npu_dev_exit(ndev, idx);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(npu_queues);

static int npu_watchdog_get(void *data, u64 *val)
{
	struct npu_device *ndev = data;

	*val = !READ_ONCE(ndev->wd_paused);
	return 0;
}

static int npu_watchdog_set(void *data, u64 val)
{
	struct npu_device *ndev = data;

	if (val > 1)
		return -EINVAL;
	WRITE_ONCE(ndev->wd_paused, !val);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(npu_watchdog_fops, npu_watchdog_get, npu_watchdog_set, "%llu\n");

static int npu_fwtrace_status_show(struct seq_file *m, void *unused)
{
	npu_fwtrace_show(m->private, m);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(npu_fwtrace_status);

void npu_debugfs_init(struct npu_device *ndev)
{
	char name[16];

	snprintf(name, sizeof(name), "npu%d", ndev->minor);
	ndev->debugfs = debugfs_create_dir(name, npu_debugfs_root);
	debugfs_create_file("inject_cmd", 0200, ndev->debugfs, ndev,
			    &npu_inject_cmd_fops);
	debugfs_create_file("inject", 0600, ndev->debugfs, ndev, &npu_inject_fops);
	debugfs_create_file("fw_log", 0400, ndev->debugfs, ndev, &npu_fw_log_fops);
	debugfs_create_file("fw_status", 0400, ndev->debugfs, ndev, &npu_fw_status_fops);
	debugfs_create_file("fw_log_level", 0200, ndev->debugfs, ndev,
			    &npu_fw_log_level_fops);
	debugfs_create_file("perf", 0400, ndev->debugfs, ndev, &npu_perf_fops);
	debugfs_create_file("queues", 0400, ndev->debugfs, ndev, &npu_queues_fops);
	debugfs_create_file_unsafe("watchdog", 0600, ndev->debugfs, ndev,
				   &npu_watchdog_fops);
	debugfs_create_file("fwtrace", 0400, ndev->debugfs, ndev,
			    &npu_fwtrace_status_fops);
}

void npu_debugfs_fini(struct npu_device *ndev)
{
	debugfs_remove_recursive(ndev->debugfs);
}

void npu_debugfs_module_init(void)
{
	npu_debugfs_root = debugfs_create_dir(NPU_DRIVER_NAME, NULL);
}

void npu_debugfs_module_exit(void)
{
	debugfs_remove_recursive(npu_debugfs_root);
}
