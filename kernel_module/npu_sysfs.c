// SPDX-License-Identifier: GPL-2.0
/*
 * NPU sysfs attributes (read only), in the group "npu" of the PCI device:
 * /sys/bus/pci/devices/<address>/npu/, also reached as
 * /sys/class/accel/accelN/device/npu/.
 */
#include <linux/device.h>
#include <linux/slab.h>
#include <linux/sysfs.h>

#include "npu_drv.h"

#define NPU_ATTR(name, fmt, ...)					\
static ssize_t name##_show(struct device *dev,				\
			   struct device_attribute *attr, char *buf)	\
{									\
	struct npu_device *ndev __maybe_unused = dev_get_drvdata(dev);	\
									\
	return sysfs_emit(buf, fmt "\n", __VA_ARGS__);		\
}									\
static DEVICE_ATTR_RO(name)

NPU_ATTR(hw_version, "%u.%u", ndev->hw_version >> 16, ndev->hw_version & 0xffff);
NPU_ATTR(abi_version, "%u", ndev->abi_version);
NPU_ATTR(driver_version, "%u.%u", NPU_DRIVER_VERSION >> 16, NPU_DRIVER_VERSION & 0xffff);
NPU_ATTR(caps, "0x%08x", ndev->caps);
NPU_ATTR(num_queues, "%u", ndev->num_queues);
NPU_ATTR(num_cores, "%u", ndev->num_cores);
NPU_ATTR(ring_entries, "%u", ndev->queue.entries);
NPU_ATTR(irq_count, "%d", atomic_read(&ndev->irq_count));
NPU_ATTR(recoveries, "%d", atomic_read(&ndev->recoveries));
NPU_ATTR(hangs, "%d", atomic_read(&ndev->hangs));
NPU_ATTR(fw_version, "%u.%u", ndev->fw_version >> 16, ndev->fw_version & 0xffff);
NPU_ATTR(last_hang_detect_ms, "%llu", READ_ONCE(ndev->hang_detect_ns) / NSEC_PER_MSEC);
NPU_ATTR(last_reset_recovery_us, "%llu", READ_ONCE(ndev->reset_recovery_ns) / NSEC_PER_USEC);
NPU_ATTR(op_errors, "%d", atomic_read(&ndev->op_errors));
NPU_ATTR(bo_count, "%lld", atomic64_read(&ndev->bo_count));
NPU_ATTR(bo_bytes, "%lld", atomic64_read(&ndev->bo_bytes));
NPU_ATTR(mem_device_total, "%llu", ndev->mem_size);
NPU_ATTR(mem_device_used, "%lld", atomic64_read(&ndev->mem_used));
NPU_ATTR(runtime_suspends, "%d", atomic_read(&ndev->suspends));
NPU_ATTR(runtime_resumes, "%d", atomic_read(&ndev->resumes));
NPU_ATTR(last_resume_us, "%llu", READ_ONCE(ndev->resume_ns) / NSEC_PER_USEC);

/*
 * busy_us: the time the device's commands ran, summed over its queues;
 * device_time_us: the device clock at the same snapshot. Two readings a
 * while apart give the utilisation (npu-smi).
 */
static ssize_t npu_perf_attr_show(struct device *dev, char *buf, bool busy)
{
	struct npu_device *ndev = dev_get_drvdata(dev);
	struct npu_perf_snap *snap;
	ssize_t ret;

	snap = kmalloc(sizeof(*snap), GFP_KERNEL);
	if (!snap)
		return -ENOMEM;
	ret = npu_perf_read(ndev, snap);
	if (!ret)
		ret = sysfs_emit(buf, "%llu\n", (busy ? npu_perf_busy_ns(snap) :
						  snap->time_ns) / NSEC_PER_USEC);
	kfree(snap);
	return ret;
}

static ssize_t busy_us_show(struct device *dev, struct device_attribute *attr,
			    char *buf)
{
	return npu_perf_attr_show(dev, buf, true);
}
static DEVICE_ATTR_RO(busy_us);

static ssize_t device_time_us_show(struct device *dev,
				   struct device_attribute *attr, char *buf)
{
	return npu_perf_attr_show(dev, buf, false);
}
static DEVICE_ATTR_RO(device_time_us);

static const char * const npu_timing_names[] = {
	[NPU_TIMING_NATIVE] = "native",
	[NPU_TIMING_EDGE] = "edge",
	[NPU_TIMING_DATACENTER] = "datacenter",
};

/* timing: the chip timing model the device runs (docs/npu-spec.md 12.2). */
static ssize_t timing_show(struct device *dev, struct device_attribute *attr,
			   char *buf)
{
	struct npu_device *ndev = dev_get_drvdata(dev);

	if (ndev->timing >= ARRAY_SIZE(npu_timing_names))
		return sysfs_emit(buf, "unknown(%u)\n", ndev->timing);
	return sysfs_emit(buf, "%s\n", npu_timing_names[ndev->timing]);
}
static DEVICE_ATTR_RO(timing);

static ssize_t fences_show(struct device *dev, struct device_attribute *attr,
			   char *buf)
{
	struct npu_device *ndev = dev_get_drvdata(dev);

	return sysfs_emit(buf, "%llu %llu\n", READ_ONCE(ndev->queue.next_fence),
			  READ_ONCE(ndev->queue.completed));
}
static DEVICE_ATTR_RO(fences);

static struct attribute *npu_attrs[] = {
	&dev_attr_hw_version.attr,
	&dev_attr_abi_version.attr,
	&dev_attr_driver_version.attr,
	&dev_attr_caps.attr,
	&dev_attr_num_queues.attr,
	&dev_attr_num_cores.attr,
	&dev_attr_ring_entries.attr,
	&dev_attr_irq_count.attr,
	&dev_attr_recoveries.attr,
	&dev_attr_hangs.attr,
	&dev_attr_fw_version.attr,
	&dev_attr_last_hang_detect_ms.attr,
	&dev_attr_last_reset_recovery_us.attr,
	&dev_attr_op_errors.attr,
	&dev_attr_bo_count.attr,
	&dev_attr_bo_bytes.attr,
	&dev_attr_mem_device_total.attr,
	&dev_attr_mem_device_used.attr,
	&dev_attr_fences.attr,
	&dev_attr_runtime_suspends.attr,
	&dev_attr_runtime_resumes.attr,
	&dev_attr_last_resume_us.attr,
	&dev_attr_busy_us.attr,
	&dev_attr_device_time_us.attr,
	&dev_attr_timing.attr,
	NULL,
};

static const struct attribute_group npu_attr_group = {
	.name = "npu",
	.attrs = npu_attrs,
};

const struct attribute_group *npu_attr_groups[] = {
	&npu_attr_group,
	NULL,
};
