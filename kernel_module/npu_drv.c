// SPDX-License-Identifier: GPL-2.0
/*
 * NPU driver: PCI probe/remove, the /dev/npuN character device and its file
 * operations. Each open file is a context that owns its buffer objects.
 */
#include <linux/dma-map-ops.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/module.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "npu_drv.h"
#define CREATE_TRACE_POINTS
#include "npu_trace.h"

static dev_t npu_devt;
static struct class *npu_class;

/* npu_devices_lock protects npu_devices (minor -> device) and open lookups. */
static DEFINE_MUTEX(npu_devices_lock);
static DEFINE_IDR(npu_devices);

/* Client ids for fdinfo: unique per open file while the module is loaded. */
static atomic_t npu_next_client_id = ATOMIC_INIT(0);

static void npu_device_free(struct kref *ref)
{
	struct npu_device *ndev = container_of(ref, struct npu_device, ref);

	npu_hw_free(ndev);
	npu_mmu_fini(ndev);
	pci_dev_put(ndev->pdev);
	cleanup_srcu_struct(&ndev->unplug_srcu);
	kfree(ndev);
}

void npu_device_put(struct npu_device *ndev)
{
	kref_put(&ndev->ref, npu_device_free);
}

static int npu_open(struct inode *inode, struct file *file)
{
	struct npu_device *ndev;
	struct npu_context *ctx;
	int ret;

	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL);
	if (!ctx)
		return -ENOMEM;

	mutex_lock(&npu_devices_lock);
	ndev = idr_find(&npu_devices, iminor(inode));
	if (ndev)
		kref_get(&ndev->ref);
	mutex_unlock(&npu_devices_lock);
	if (!ndev) {
		kfree(ctx);
		return -ENODEV;
	}

	ctx->ndev = ndev;
	ret = npu_vm_create_ctx(ndev, &ctx->vm);
	if (ret) {
		npu_device_put(ndev);
		kfree(ctx);
		return ret;
	}
	ctx->mapping = file->f_mapping;
	mutex_init(&ctx->params_lock);
	kref_init(&ctx->ref);
	xa_init_flags(&ctx->bos, XA_FLAGS_ALLOC1);
	spin_lock_init(&ctx->err_lock);
	INIT_LIST_HEAD(&ctx->errors);
	ctx->client_id = atomic_inc_return(&npu_next_client_id);
	atomic64_set(&ctx->bo_count, 0);
	atomic64_set(&ctx->bo_bytes, 0);
	file->private_data = ctx;
	return 0;
}

static int npu_release(struct inode *inode, struct file *file)
{
	struct npu_context *ctx = file->private_data;

	/* Jobs in flight keep the context and their buffers until they retire. */
	npu_uqueue_release_all(ctx);
	npu_bo_release_all(ctx);
	npu_context_put(ctx);
	return 0;
}

static int npu_ioctl_get_info(struct npu_context *ctx, void __user *arg)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_info info = {
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

	return copy_to_user(arg, &info, sizeof(info)) ? -EFAULT : 0;
}

static long npu_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct npu_context *ctx = file->private_data;
	struct npu_device *ndev = ctx->ndev;
	void __user *uarg = (void __user *)arg;
	long ret;
	int idx;

	/* WAIT sleeps outside npu_dev_enter(); removal completes its fence. */
	if (cmd == NPU_IOCTL_WAIT)
		return npu_ioctl_wait(ctx, uarg);

	if (!npu_dev_enter(ndev, &idx))
		return -ENODEV;
	switch (cmd) {
	case NPU_IOCTL_GET_INFO:
		ret = npu_ioctl_get_info(ctx, uarg);
		break;
	case NPU_IOCTL_BO_CREATE:
		ret = npu_ioctl_bo_create(ctx, uarg);
		break;
	case NPU_IOCTL_BO_DESTROY:
		ret = npu_ioctl_bo_destroy(ctx, uarg);
		break;
	case NPU_IOCTL_BO_USERPTR:
		ret = npu_ioctl_bo_userptr(ctx, uarg);
		break;
	case NPU_IOCTL_FENCE_INFO:
		ret = npu_ioctl_fence_info(ctx, uarg);
		break;
	case NPU_IOCTL_SUBMIT:
		ret = npu_ioctl_submit(ctx, uarg);
		break;
	case NPU_IOCTL_QUEUE_CREATE:
		ret = npu_ioctl_queue_create(ctx, uarg);
		break;
	case NPU_IOCTL_QUEUE_DESTROY:
		ret = npu_ioctl_queue_destroy(ctx, uarg);
		break;
	default:
		ret = -ENOTTY;
		break;
	}
	npu_dev_exit(ndev, idx);
	return ret;
}

static int npu_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct npu_context *ctx = file->private_data;
	struct npu_device *ndev = ctx->ndev;
	int ret, idx;

	if (!npu_dev_enter(ndev, &idx))
		return -ENODEV;
	ret = npu_bo_mmap(ctx, vma);
	npu_dev_exit(ndev, idx);
	return ret;
}

/*
 * /proc/<pid>/fdinfo/<fd>: the context's memory, in the style of the DRM
 * fdinfo keys (docs/uapi.md). Buffers stay charged to the file that created
 * them until their last mapping or job is gone.
 */
static void npu_show_fdinfo(struct seq_file *m, struct file *file)
{
	struct npu_context *ctx = file->private_data;
	u64 limit = npu_ctx_mem_limit();

	seq_printf(m, "npu-driver:\t%s\n", KBUILD_MODNAME);
	seq_printf(m, "npu-pdev:\t%s\n", pci_name(ctx->ndev->pdev));
	seq_printf(m, "npu-client-id:\t%u\n", ctx->client_id);
	seq_printf(m, "npu-bo-count:\t%lld\n", atomic64_read(&ctx->bo_count));
	seq_printf(m, "npu-memory-host:\t%lld KiB\n",
		   (atomic64_read(&ctx->bo_bytes) - atomic64_read(&ctx->local_bytes)) >> 10);
	seq_printf(m, "npu-memory-device:\t%lld KiB\n",
		   atomic64_read(&ctx->local_bytes) >> 10);
	seq_printf(m, "npu-memory-limit:\t%llu KiB\n", limit >> 10);
	seq_printf(m, "npu-ctx:\t%u\n", ctx->vm.ctx);
	seq_printf(m, "npu-faulted:\t%u\n", READ_ONCE(ctx->faulted));
}

static const struct file_operations npu_fops = {
	.show_fdinfo = npu_show_fdinfo,
	.owner = THIS_MODULE,
	.open = npu_open,
	.release = npu_release,
	.unlocked_ioctl = npu_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = npu_mmap,
	.poll = npu_poll,
	.llseek = noop_llseek,
};

static int npu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct device *dev = &pdev->dev;
	struct npu_device *ndev;
	dev_t devt;
	int ret;

	ndev = kzalloc(sizeof(*ndev), GFP_KERNEL);
	if (!ndev)
		return -ENOMEM;
	ret = init_srcu_struct(&ndev->unplug_srcu);
	if (ret) {
		kfree(ndev);
		return ret;
	}
	kref_init(&ndev->ref);
	/* Before any failure can reach npu_device_free(), which destroys it. */
	ida_init(&ndev->ctx_ida);
	ndev->pdev = pci_dev_get(pdev);

	ret = pcim_enable_device(pdev);
	if (ret)
		goto err_put_ndev;
	ret = pcim_iomap_regions(pdev, BIT(NPU_BAR_REGS), NPU_DRIVER_NAME);
	if (ret)
		goto err_put_ndev;
	ndev->regs = pcim_iomap_table(pdev)[NPU_BAR_REGS];
	ret = dma_set_mask_and_coherent(dev, DMA_BIT_MASK(64));
	if (ret)
		goto err_put_ndev;
	/*
	 * The device MMU maps a buffer page by page, so a scatterlist segment
	 * may be as long as the mapping layer makes it (the PCI default, 64
	 * KiB, is a limit this device does not have).
	 */
	dma_set_max_seg_size(dev, UINT_MAX);
	/* Buffers are shared with user space and the device without syncs. */
	if (!dev_is_dma_coherent(dev)) {
		dev_err(dev, "needs cache-coherent DMA\n");
		ret = -ENODEV;
		goto err_put_ndev;
	}
	pci_set_master(pdev);

	ret = npu_hw_init(ndev);
	if (ret)
		goto err_put_ndev;

	mutex_lock(&npu_devices_lock);
	ret = idr_alloc(&npu_devices, ndev, 0, NPU_MAX_DEVICES, GFP_KERNEL);
	mutex_unlock(&npu_devices_lock);
	if (ret < 0)
		goto err_hw_fini;
	ndev->minor = ret;
	devt = MKDEV(MAJOR(npu_devt), ndev->minor);

	ndev->cdev = cdev_alloc();
	if (!ndev->cdev) {
		ret = -ENOMEM;
		goto err_remove_minor;
	}
	ndev->cdev->owner = THIS_MODULE;
	ndev->cdev->ops = &npu_fops;
	ret = cdev_add(ndev->cdev, devt, 1);
	if (ret)
		goto err_put_cdev;

	ndev->chardev = device_create_with_groups(npu_class, dev, devt, ndev,
						  npu_attr_groups, "npu%d",
						  ndev->minor);
	if (IS_ERR(ndev->chardev)) {
		ret = PTR_ERR(ndev->chardev);
		goto err_del_cdev;
	}
	pci_set_drvdata(pdev, ndev);
	npu_debugfs_init(ndev);
	dev_info(dev, "NPU %u.%u, ABI %u, %u queues, %u cores, %llu MiB device memory: /dev/npu%d\n",
		 ndev->hw_version >> 16, ndev->hw_version & 0xffff, ndev->abi_version,
		 ndev->hw_queues, ndev->num_cores, ndev->mem_size >> 20, ndev->minor);
	return 0;

err_del_cdev:
	cdev_del(ndev->cdev);
	goto err_remove_minor;
err_put_cdev:
	kobject_put(&ndev->cdev->kobj);
err_remove_minor:
	mutex_lock(&npu_devices_lock);
	idr_remove(&npu_devices, ndev->minor);
	mutex_unlock(&npu_devices_lock);
err_hw_fini:
	npu_hw_fini(ndev);
err_put_ndev:
	npu_device_put(ndev);
	return ret;
}

static void npu_remove(struct pci_dev *pdev)
{
	struct npu_device *ndev = pci_get_drvdata(pdev);

	/* No new opens, then no ioctl or mmap past this point. */
	mutex_lock(&npu_devices_lock);
	idr_remove(&npu_devices, ndev->minor);
	mutex_unlock(&npu_devices_lock);
	WRITE_ONCE(ndev->unplugged, true);
	synchronize_srcu(&ndev->unplug_srcu);

	npu_debugfs_fini(ndev);
	device_destroy(npu_class, MKDEV(MAJOR(npu_devt), ndev->minor));
	cdev_del(ndev->cdev);
	npu_hw_fini(ndev);
	/* Open files and buffers keep ndev until they are closed. */
	npu_device_put(ndev);
}

static const struct pci_device_id npu_pci_ids[] = {
	{ PCI_DEVICE(NPU_PCI_VENDOR_ID, NPU_PCI_DEVICE_ID) },
	{ }
};
MODULE_DEVICE_TABLE(pci, npu_pci_ids);

static struct pci_driver npu_pci_driver = {
	.name = NPU_DRIVER_NAME,
	.id_table = npu_pci_ids,
	.probe = npu_probe,
	.remove = npu_remove,
};

static int __init npu_init(void)
{
	int ret;

	ret = alloc_chrdev_region(&npu_devt, 0, NPU_MAX_DEVICES, NPU_DRIVER_NAME);
	if (ret)
		return ret;
	npu_class = class_create(NPU_DRIVER_NAME);
	if (IS_ERR(npu_class)) {
		ret = PTR_ERR(npu_class);
		goto err_unregister_region;
	}
	npu_debugfs_module_init();
	ret = pci_register_driver(&npu_pci_driver);
	if (ret)
		goto err_remove_debugfs;
	return 0;

err_remove_debugfs:
	npu_debugfs_module_exit();
	class_destroy(npu_class);
err_unregister_region:
	unregister_chrdev_region(npu_devt, NPU_MAX_DEVICES);
	return ret;
}

static void __exit npu_exit(void)
{
	pci_unregister_driver(&npu_pci_driver);
	npu_debugfs_module_exit();
	class_destroy(npu_class);
	unregister_chrdev_region(npu_devt, NPU_MAX_DEVICES);
	idr_destroy(&npu_devices);
}

module_init(npu_init);
module_exit(npu_exit);

MODULE_DESCRIPTION("Driver for the emulated NPU PCI device");
MODULE_AUTHOR("NPU stack team");
MODULE_LICENSE("GPL");
