// SPDX-License-Identifier: GPL-2.0
/*
 * NPU driver: PCI probe/remove and the DRM accel device (/dev/accel/accelN):
 * its file operations and ioctl table. Each open file is a context that owns
 * its buffer objects and user queues.
 */
#include <linux/dma-map-ops.h>
#include <linux/fs.h>
#include <linux/module.h>
#include <linux/poll.h>
#include <linux/slab.h>

#include <drm/drm.h>
#include <drm/drm_accel.h>
#include <drm/drm_drv.h>
#include <drm/drm_file.h>
#include <drm/drm_gem.h>
#include <drm/drm_ioctl.h>
#include <drm/drm_managed.h>
#include <drm/drm_print.h>

#include "npu_drv.h"
#define CREATE_TRACE_POINTS
#include "npu_trace.h"

/* npu_uapi.h spells out DRM's ioctl encoding: it must be DRM's. */
static_assert(NPU_DRM_IOCTL_BASE == DRM_IOCTL_BASE);
static_assert(NPU_DRM_COMMAND_BASE == DRM_COMMAND_BASE);

static int npu_drm_open(struct drm_device *drm, struct drm_file *file)
{
	struct npu_device *ndev = to_npu_device(drm);
	struct npu_context *ctx;
	int ret, idx;

	if (!npu_dev_enter(ndev, &idx))
		return -ENODEV;
	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL_ACCOUNT);
	if (!ctx) {
		ret = -ENOMEM;
		goto out_exit;
	}
	ctx->ndev = ndev;
	ret = npu_vm_create_ctx(ndev, &ctx->vm);
	if (ret) {
		kfree(ctx);
		goto out_exit;
	}
	/* The context holds the device until its last job and buffer are gone. */
	npu_device_get(ndev);
	mutex_init(&ctx->params_lock);
	kref_init(&ctx->ref);
	ctx->file = file;
	init_llist_head(&ctx->free_list);
	INIT_WORK(&ctx->free_work, npu_bo_free_work);
	spin_lock_init(&ctx->err_lock);
	INIT_LIST_HEAD(&ctx->errors);
	init_waitqueue_head(&ctx->poll_wq);
	ctx->client_id = file->client_id;
	atomic64_set(&ctx->bo_count, 0);
	atomic64_set(&ctx->bo_bytes, 0);
	file->driver_priv = ctx;
out_exit:
	npu_dev_exit(ndev, idx);
	return ret;
}

/*
 * DRM has closed the file's GEM handles already. Jobs in flight keep the
 * context and their buffers until they retire; the frees that waited for
 * the user queues are done once those are stopped.
 */
static void npu_drm_postclose(struct drm_device *drm, struct drm_file *file)
{
	struct npu_context *ctx = file->driver_priv;

	npu_uqueue_release_all(ctx);
	flush_work(&ctx->free_work);
	ctx->file = NULL;
	npu_context_put(ctx);
}

static int npu_ioctl_get_info(struct npu_context *ctx, void *data)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_info *info = data;

	*info = (struct npu_info){
		.hw_version = ndev->hw_version,
		.abi_version = ndev->abi_version,
		.driver_version = NPU_DRIVER_VERSION,
		.caps = ndev->caps,
		.num_queues = ndev->num_queues,
		.num_cores = ndev->num_cores,
		.max_submit = NPU_SUBMIT_MAX_OPS,
		.ring_entries = ndev->queue.entries,
		.max_bo_size = NPU_BO_MAX_SIZE,
		.pci_vendor = ndev->pdev->vendor,
		.pci_device = ndev->pdev->device,
		.user_queues = ndev->hw_queues - 1,
		.device_memory = ndev->mem_size,
	};
	return 0;
}

/*
 * The ioctl handlers take the context and the argument DRM copied in (and
 * copies out on success). All but WAIT run inside npu_dev_enter(): WAIT may
 * sleep for long, and removal completes its fence instead.
 */
#define NPU_IOCTL_ENTER(name)						\
static int npu_drm_ioctl_##name(struct drm_device *drm, void *data,	\
				struct drm_file *file)			\
{									\
	struct npu_device *ndev = to_npu_device(drm);			\
	int ret, idx;							\
									\
	if (!npu_dev_enter(ndev, &idx))					\
		return -ENODEV;						\
	ret = npu_ioctl_##name(file->driver_priv, data);		\
	npu_dev_exit(ndev, idx);					\
	return ret;							\
}

NPU_IOCTL_ENTER(get_info)
NPU_IOCTL_ENTER(bo_create)
NPU_IOCTL_ENTER(bo_destroy)
NPU_IOCTL_ENTER(bo_userptr)
NPU_IOCTL_ENTER(bo_info)
NPU_IOCTL_ENTER(fence_info)
NPU_IOCTL_ENTER(submit)
NPU_IOCTL_ENTER(queue_create)
NPU_IOCTL_ENTER(queue_destroy)

static int npu_drm_ioctl_wait(struct drm_device *drm, void *data,
			      struct drm_file *file)
{
	return npu_ioctl_wait(file->driver_priv, data);
}

#define NPU_IOCTL(ioctl, handler)					\
	[DRM_NPU_##ioctl] = {						\
		.cmd = DRM_IOCTL_NPU_##ioctl,				\
		.func = npu_drm_ioctl_##handler,			\
		.name = "NPU_" #ioctl,					\
	}

static const struct drm_ioctl_desc npu_drm_ioctls[] = {
	NPU_IOCTL(GET_INFO, get_info),
	NPU_IOCTL(BO_CREATE, bo_create),
	NPU_IOCTL(BO_DESTROY, bo_destroy),
	NPU_IOCTL(SUBMIT, submit),
	NPU_IOCTL(WAIT, wait),
	NPU_IOCTL(BO_USERPTR, bo_userptr),
	NPU_IOCTL(FENCE_INFO, fence_info),
	NPU_IOCTL(QUEUE_CREATE, queue_create),
	NPU_IOCTL(QUEUE_DESTROY, queue_destroy),
	NPU_IOCTL(BO_INFO, bo_info),
};

static struct npu_context *npu_file_ctx(struct file *file)
{
	struct drm_file *dfile = file->private_data;

	return dfile->driver_priv;
}

/*
 * mmap offsets below 4 GiB are user queue regions (docs/uapi.md), the
 * rest GEM fake offsets of buffer objects.
 */
static int npu_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct npu_context *ctx = npu_file_ctx(file);
	struct npu_device *ndev = ctx->ndev;
	int ret, idx;

	/* Shared memory with the device: a private (COW) copy means nothing. */
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	if (!npu_dev_enter(ndev, &idx))
		return -ENODEV;
	if (vma->vm_pgoff < DRM_FILE_PAGE_OFFSET_START)
		ret = npu_uqueue_mmap(ctx, vma);
	else
		ret = npu_bo_mmap(file->private_data, vma);
	npu_dev_exit(ndev, idx);
	return ret;
}

static __poll_t npu_drm_poll(struct file *file, struct poll_table_struct *wait)
{
	return npu_poll(npu_file_ctx(file), file, wait);
}

/*
 * /proc/<pid>/fdinfo/<fd>: DRM prints drm-driver, drm-client-id and
 * drm-pdev; the engine and memory keys follow
 * Documentation/gpu/drm-usage-stats.rst (engine "compute": the device time
 * of the file's retired SUBMIT ops; regions "host" and "device": the BOs
 * the file holds handles to, shared when exported or imported). The npu-
 * keys are the driver's own: npu-memory-* is what is charged to the file,
 * which keeps a BO it created until its last mapping or job is gone.
 */
static void npu_drm_show_fdinfo(struct drm_printer *p, struct drm_file *file)
{
	struct npu_context *ctx = file->driver_priv;
	u64 local = atomic64_read(&ctx->local_bytes);
	struct drm_memory_stats stats[2] = {};
	struct drm_gem_object *obj;
	int id;

	spin_lock(&file->table_lock);
	idr_for_each_entry(&file->object_idr, obj, id) {
		const struct npu_bo *bo = container_of(obj, struct npu_bo, base.base);
		struct drm_memory_stats *s = &stats[bo->kind == NPU_BO_KIND_LOCAL];

		if (drm_gem_object_is_shared_for_memory_stats(obj))
			s->shared += obj->size;
		else
			s->private += obj->size;
		/* Every kind is resident: pinned, device memory or imported. */
		s->resident += obj->size;
	}
	spin_unlock(&file->table_lock);
	drm_printf(p, "drm-engine-compute:\t%lld ns\n", atomic64_read(&ctx->busy_ns));
	drm_print_memory_stats(p, &stats[0], DRM_GEM_OBJECT_RESIDENT, "host");
	drm_print_memory_stats(p, &stats[1], DRM_GEM_OBJECT_RESIDENT, "device");
	drm_printf(p, "npu-bo-count:\t%lld\n", atomic64_read(&ctx->bo_count));
	drm_printf(p, "npu-memory-host:\t%llu KiB\n",
		   (atomic64_read(&ctx->bo_bytes) - local) >> 10);
	drm_printf(p, "npu-memory-device:\t%llu KiB\n", local >> 10);
	drm_printf(p, "npu-memory-limit:\t%llu KiB\n", npu_ctx_mem_limit() >> 10);
	drm_printf(p, "npu-ctx:\t%u\n", ctx->vm.ctx);
	drm_printf(p, "npu-faulted:\t%u\n", READ_ONCE(ctx->faulted));
}

/*
 * DRM_ACCEL_FOPS but for poll (the file's own completions) and mmap (the
 * driver's offsets); spelled out, since overriding the macro's entries in
 * one initializer is what W=1's -Woverride-init reports.
 */
/* drm_ioctl(), between the npu_ioctl_enter and npu_ioctl_exit tracepoints. */
static long npu_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	long ret;

	trace_npu_ioctl_enter(_IOC_NR(cmd));
	ret = drm_ioctl(filp, cmd, arg);
	trace_npu_ioctl_exit(_IOC_NR(cmd), ret);
	return ret;
}

#ifdef CONFIG_COMPAT
/* The same for a 32-bit process (every npu ioctl struct has one layout). */
static long npu_compat_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	long ret;

	trace_npu_ioctl_enter(_IOC_NR(cmd));
	ret = drm_compat_ioctl(filp, cmd, arg);
	trace_npu_ioctl_exit(_IOC_NR(cmd), ret);
	return ret;
}
#endif

static const struct file_operations npu_fops = {
	.owner = THIS_MODULE,
	.open = accel_open,
	.release = drm_release,
	.unlocked_ioctl = npu_ioctl,
#ifdef CONFIG_COMPAT
	.compat_ioctl = npu_compat_ioctl,
#endif
	.poll = npu_drm_poll,
	.read = drm_read,
	.llseek = noop_llseek,
	.mmap = npu_mmap,
	.show_fdinfo = drm_show_fdinfo,
	.fop_flags = FOP_UNSIGNED_OFFSET,
};

static const struct drm_driver npu_drm_driver = {
	.driver_features = DRIVER_COMPUTE_ACCEL | DRIVER_GEM | DRIVER_SYNCOBJ |
			   DRIVER_SYNCOBJ_TIMELINE,
	.open = npu_drm_open,
	.gem_create_object = npu_gem_create_object,
	.gem_prime_import = npu_gem_prime_import,
	.postclose = npu_drm_postclose,
	.show_fdinfo = npu_drm_show_fdinfo,
	.ioctls = npu_drm_ioctls,
	.num_ioctls = ARRAY_SIZE(npu_drm_ioctls),
	.fops = &npu_fops,
	.name = NPU_DRIVER_NAME,
	.desc = "Emulated NPU",
	.major = NPU_DRIVER_VERSION >> 16,
	.minor = NPU_DRIVER_VERSION & 0xffff,
};

/* The last reference to the DRM device is gone: free what probe made. */
static void npu_device_release(struct drm_device *drm, void *arg)
{
	struct npu_device *ndev = to_npu_device(drm);

	npu_hw_free(ndev);
	npu_fence_fini(ndev);
	npu_mmu_fini(ndev);
}

static int npu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct device *dev = &pdev->dev;
	struct npu_device *ndev;
	int ret;

	ndev = devm_drm_dev_alloc(dev, &npu_drm_driver, struct npu_device, drm);
	if (IS_ERR(ndev))
		return PTR_ERR(ndev);
	/* Before any failure can reach npu_device_release(), which destroys it. */
	ida_init(&ndev->ctx_ida);
	ida_init(&ndev->sem_ida);
	ndev->pdev = pdev;
	/* Frees what npu_hw_init() made, also when it failed half way. */
	ret = drmm_add_action_or_reset(&ndev->drm, npu_device_release, NULL);
	if (ret)
		return ret;

	ret = pcim_enable_device(pdev);
	if (ret)
		return ret;
	ret = pcim_iomap_regions(pdev, BIT(NPU_BAR_REGS), NPU_DRIVER_NAME);
	if (ret)
		return ret;
	ndev->regs = pcim_iomap_table(pdev)[NPU_BAR_REGS];
	ret = dma_set_mask_and_coherent(dev, DMA_BIT_MASK(64));
	if (ret)
		return ret;
	/*
	 * The device MMU maps a buffer page by page, so a scatterlist segment
	 * may be as long as the mapping layer makes it (the PCI default, 64
	 * KiB, is a limit this device does not have).
	 */
	dma_set_max_seg_size(dev, UINT_MAX);
	/* Buffers are shared with user space and the device without syncs. */
	if (!dev_is_dma_coherent(dev)) {
		dev_err(dev, "needs cache-coherent DMA\n");
		return -ENODEV;
	}
	pci_set_master(pdev);
	pci_set_drvdata(pdev, ndev);

	ret = npu_hw_init(ndev);
	if (ret)
		return ret;
	ret = drm_dev_register(&ndev->drm, 0);
	if (ret)
		goto err_hw_fini;
	ndev->minor = ndev->drm.accel->index;
	npu_debugfs_init(ndev);
	npu_pm_init(ndev);
	dev_info(dev, "NPU %u.%u, ABI %u, %u queues, %u cores, %llu MiB device memory: /dev/accel/accel%d\n",
		 ndev->hw_version >> 16, ndev->hw_version & 0xffff, ndev->abi_version,
		 ndev->hw_queues, ndev->num_cores, ndev->mem_size >> 20, ndev->minor);
	return 0;

err_hw_fini:
	npu_hw_fini(ndev);
	return ret;
}

/*
 * Unbind: unplug the DRM device first (no ioctl, mmap or debugfs call is
 * inside npu_dev_enter() after it, and every CPU mapping of the device's
 * files is zapped), then stop the hardware: the watchdog and the IRQ
 * threads are gone before remove() returns. Open files keep the structure
 * until they are closed; their calls fail with -ENODEV.
 */
static void npu_remove(struct pci_dev *pdev)
{
	struct npu_device *ndev = pci_get_drvdata(pdev);

	npu_pm_fini(ndev);
	drm_dev_unplug(&ndev->drm);
	npu_debugfs_fini(ndev);
	npu_hw_fini(ndev);
}

static const struct pci_device_id npu_pci_ids[] = {
	{ PCI_DEVICE(NPU_PCI_VENDOR_ID, NPU_PCI_DEVICE_ID) },
	{ }
};
MODULE_DEVICE_TABLE(pci, npu_pci_ids);

/*
 * Reboot or kexec: the device stops running commands and logging, so that
 * no DMA reaches memory the next kernel owns. An asleep device does
 * neither.
 */
static void npu_shutdown(struct pci_dev *pdev)
{
	struct npu_device *ndev = pci_get_drvdata(pdev);

	if (!ndev || !npu_pm_get_if_active(ndev))
		return;
	npu_wr(ndev, NPU_REG_IRQ_MASK, 0);
	npu_fwtrace_stop(ndev);
	npu_wr(ndev, NPU_REG_CONTROL, 0);
	npu_pm_put_quiet(ndev);
}

static struct pci_driver npu_pci_driver = {
	.name = NPU_DRIVER_NAME,
	.id_table = npu_pci_ids,
	.probe = npu_probe,
	.remove = npu_remove,
	.shutdown = npu_shutdown,
	.dev_groups = npu_attr_groups,
	.driver.pm = pm_ptr(&npu_pm_ops),
};

struct workqueue_struct *npu_wq;

static int __init npu_init(void)
{
	int ret;

	npu_wq = alloc_workqueue(NPU_DRIVER_NAME, WQ_UNBOUND, 0);
	if (!npu_wq)
		return -ENOMEM;
	npu_debugfs_module_init();
	ret = pci_register_driver(&npu_pci_driver);
	if (ret) {
		npu_debugfs_module_exit();
		destroy_workqueue(npu_wq);
	}
	return ret;
}

static void __exit npu_exit(void)
{
	pci_unregister_driver(&npu_pci_driver);
	npu_debugfs_module_exit();
	/* Drains the deferred frees of files closed just before. */
	destroy_workqueue(npu_wq);
}

module_init(npu_init);
module_exit(npu_exit);

MODULE_DESCRIPTION("Driver for the emulated NPU PCI device");
MODULE_AUTHOR("NPU stack team");
MODULE_LICENSE("GPL");
MODULE_IMPORT_NS(DMA_BUF);
