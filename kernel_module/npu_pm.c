// SPDX-License-Identifier: GPL-2.0
/*
 * NPU runtime power management. With nothing to do for
 * power/autosuspend_delay_ms, the device suspends to D3hot, where it loses
 * its state (registers, queues, firmware); resume programs it again and
 * boots the firmware, as probe does. A usage reference keeps it awake:
 *   - each queue-0 job, from SUBMIT (which resumes the device) to retire;
 *   - each user queue for its life: its ring and doorbell are hardware
 *     state a process drives without the driver, so it is not suspended
 *     under it (rather than saved and restored behind the process's back);
 *   - each CPU mapping of device memory: D3hot stops the BAR's decoding;
 *   - whoever else touches the registers (debugfs, device-memory setup).
 * The watchdog looks at an awake device only, and without delaying its
 * suspend: a suspended one runs nothing and has no firmware to lose.
 */
#include <linux/interrupt.h>
#include <linux/moduleparam.h>
#include <linux/pm_runtime.h>

#include "npu_drv.h"
#include "npu_trace.h"

static unsigned int autosuspend_ms = 2000;
module_param(autosuspend_ms, uint, 0444);
MODULE_PARM_DESC(autosuspend_ms,
		 "Initial power/autosuspend_delay_ms: idle time before the device suspends (D3hot)");

static struct device *npu_pm_dev(struct npu_device *ndev)
{
	return &ndev->pdev->dev;
}

/* Take a usage reference, resuming the device if it is suspended. */
int npu_pm_get(struct npu_device *ndev)
{
	int ret = pm_runtime_resume_and_get(npu_pm_dev(ndev));

	if (ret < 0)
		dev_err(npu_pm_dev(ndev), "resume failed: %d\n", ret);
	return ret < 0 ? ret : 0;
}

/* Take one more reference; the caller holds one already. */
void npu_pm_get_noresume(struct npu_device *ndev)
{
	pm_runtime_get_noresume(npu_pm_dev(ndev));
}

/* A reference only if the device is awake, in use or not (a register look). */
bool npu_pm_get_if_active(struct npu_device *ndev)
{
	return pm_runtime_get_if_active(npu_pm_dev(ndev)) > 0;
}

/* Drop a reference without restarting the idle delay (a look, not a use). */
void npu_pm_put_quiet(struct npu_device *ndev)
{
	pm_runtime_put_autosuspend(npu_pm_dev(ndev));
}

/* Drop a reference; the idle delay starts now. Any context. */
void npu_pm_put(struct npu_device *ndev)
{
	struct device *dev = npu_pm_dev(ndev);

	pm_runtime_mark_last_busy(dev);
	pm_runtime_put_autosuspend(dev);
}

static int npu_runtime_suspend(struct device *dev)
{
	struct npu_device *ndev = pci_get_drvdata(to_pci_dev(dev));
	u32 i;

	npu_wr(ndev, NPU_REG_IRQ_MASK, 0);
	npu_fwtrace_stop(ndev);
	npu_fw_stop(ndev);
	for (i = 0; i < NPU_MSIX_VECTORS; i++)
		synchronize_irq(pci_irq_vector(ndev->pdev, i));
	atomic_inc(&ndev->suspends);
	trace_npu_pm(false, 0);
	/* The PCI core saves the config space and moves it to D3hot. */
	return 0;
}

static int npu_runtime_resume(struct device *dev)
{
	struct npu_device *ndev = pci_get_drvdata(to_pci_dev(dev));
	ktime_t t0 = ktime_get();
	int ret;

	/* Back in D0 with its config space restored, and nothing else. */
	ret = npu_hw_restart(ndev);
	if (ret) {
		dev_err(dev, "device did not come back from D3hot: %d\n", ret);
		return ret;
	}
	ndev->resume_ns = ktime_to_ns(ktime_sub(ktime_get(), t0));
	atomic_inc(&ndev->resumes);
	trace_npu_pm(true, ndev->resume_ns);
	return 0;
}

const struct dev_pm_ops npu_pm_ops = {
	RUNTIME_PM_OPS(npu_runtime_suspend, npu_runtime_resume, NULL)
};

/*
 * End of probe: autosuspend from now on. The PCI core holds a reference
 * across probe and forbids runtime PM for a driver that does not allow it.
 */
void npu_pm_init(struct npu_device *ndev)
{
	struct device *dev = npu_pm_dev(ndev);

	pm_runtime_set_autosuspend_delay(dev, autosuspend_ms);
	pm_runtime_use_autosuspend(dev);
	pm_runtime_allow(dev);
	npu_pm_put(ndev);
}

/*
 * Start of remove: the device stays awake from here (the reference the
 * PCI core drops after remove).
 */
void npu_pm_fini(struct npu_device *ndev)
{
	struct device *dev = npu_pm_dev(ndev);

	pm_runtime_get_noresume(dev);
	pm_runtime_forbid(dev);
}
