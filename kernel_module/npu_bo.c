// SPDX-License-Identifier: GPL-2.0
/*
 * NPU buffer objects: GEM objects mapped into the device's VA space of the
 * file that holds them.
 *
 * Four kinds share struct npu_bo:
 *   host memory    shmem pages (the GEM shmem helpers), charged to the
 *                  creator's memory cgroup, pinned and DMA-mapped for the
 *                  object's life (it is always mapped in the device MMU);
 *   device memory  a range of BAR2 (NPU_BO_DEVICE), mapped write-combined;
 *   user pointer   user pages pinned with FOLL_LONGTERM, charged to
 *                  RLIMIT_MEMLOCK;
 *   imported       a dma-buf attached to the device (PRIME).
 *
 * Each object belongs to one file's address space: a dma-buf imported by
 * another file becomes a new object of that file (also for our own
 * dma-bufs), so a device VA is always the holder's.
 *
 * mmap offsets are GEM fake offsets (at or above 4 GiB; below are the user
 * queues). Unlike drm_gem_mmap(), a mapping may start inside a BO: the
 * page offset from the object's node is the page in the BO.
 */
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/genalloc.h>
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include <drm/drm_gem.h>
#include <drm/drm_gem_shmem_helper.h>
#include <drm/drm_prime.h>
#include <drm/drm_vma_manager.h>

#include "npu_drv.h"
#include "npu_trace.h"

/*
 * User-pointer memory is shared with user space and the device without
 * cache maintenance (probe refuses a device without coherent DMA), so its
 * mapping skips the CPU syncs. That also makes two BOs over the same pages
 * (one array pinned twice) legal for the DMA API, whose debug code
 * otherwise flags overlapping mappings of a cacheline.
 */
#define NPU_BO_DMA_ATTRS DMA_ATTR_SKIP_CPU_SYNC

/* Pages a CPU fault on a host BO maps at once (from the faulting one on). */
#define NPU_BO_PREFAULT		256

static unsigned int ctx_mem_limit_mib;
module_param(ctx_mem_limit_mib, uint, 0644);
MODULE_PARM_DESC(ctx_mem_limit_mib,
		 "Most MiB of buffer objects one open file may hold (0: no limit)");

static const struct drm_gem_object_funcs npu_bo_shmem_funcs;
static const struct drm_gem_object_funcs npu_bo_private_funcs;

static struct npu_bo *to_npu_bo(struct drm_gem_object *obj)
{
	return container_of(obj, struct npu_bo, base.base);
}

/* Charge @size bytes to @ctx, or -ENOMEM past ctx_mem_limit_mib. */
static int npu_ctx_charge(struct npu_context *ctx, u64 size)
{
	u64 limit = (u64)READ_ONCE(ctx_mem_limit_mib) << 20;

	if (limit && atomic64_add_return(size, &ctx->bo_bytes) > limit) {
		atomic64_sub(size, &ctx->bo_bytes);
		return -ENOMEM;
	}
	if (!limit)
		atomic64_add(size, &ctx->bo_bytes);
	atomic64_inc(&ctx->bo_count);
	return 0;
}

static void npu_ctx_uncharge(struct npu_context *ctx, u64 size)
{
	atomic64_sub(size, &ctx->bo_bytes);
	atomic64_dec(&ctx->bo_count);
}

u64 npu_ctx_mem_limit(void)
{
	return (u64)READ_ONCE(ctx_mem_limit_mib) << 20;
}

/* Give back what the kind of @bo holds, and the object itself. */
static void npu_bo_release_backing(struct npu_bo *bo)
{
	struct drm_gem_object *obj = &bo->base.base;
	struct npu_device *ndev = bo->ndev;

	switch (bo->kind) {
	case NPU_BO_KIND_SHMEM:
		/* Unmaps the sg table, puts the pages and frees @bo. */
		drm_gem_shmem_free(&bo->base);
		return;
	case NPU_BO_KIND_LOCAL:
		gen_pool_free(ndev->mem_pool, bo->local_off + NPU_MEM_POOL_BIAS, bo->size);
		atomic64_sub(bo->size, &ndev->mem_used);
		if (bo->owner)
			atomic64_sub(bo->size, &bo->owner->local_bytes);
		break;
	case NPU_BO_KIND_USERPTR:
		dma_unmap_sgtable(&ndev->pdev->dev, &bo->user_sgt, DMA_BIDIRECTIONAL,
				  NPU_BO_DMA_ATTRS);
		sg_free_table(&bo->user_sgt);
		/* The device may have written them: mark them dirty. */
		unpin_user_pages_dirty_lock(bo->pages, bo->npages, !bo->dev_readonly);
		account_locked_vm(bo->mm, bo->npages, false);
		mmdrop(bo->mm);
		kvfree(bo->pages);
		break;
	case NPU_BO_KIND_IMPORT:
		/* Unmaps the attachment, detaches and drops the dma-buf. */
		drm_prime_gem_destroy(obj, bo->sgt);
		break;
	}
	drm_gem_object_release(obj);
	kfree(bo);
}

/*
 * The last reference is gone: unmap it from the device, wait until no user
 * queue command can still use the old translations, and free it.
 */
static void npu_bo_destroy(struct npu_bo *bo)
{
	struct npu_context *owner = bo->owner;
	struct npu_device *ndev = bo->ndev;

	trace_npu_bo_free(bo->handle, bo->size);
	if (bo->counted) {
		atomic64_dec(&ndev->bo_count);
		atomic64_sub(bo->size, &ndev->bo_bytes);
	}
	if (bo->vm)
		npu_vm_unmap(bo->vm, bo->va, bo->size);
	if (bo->charged)
		npu_ctx_uncharge(owner, bo->size);
	/* A command that never finished may still write it: never free it. */
	if (owner && npu_uqueue_sync(owner))
		dev_err(&ndev->pdev->dev, "leaking a %zu-byte buffer a hung command may write\n",
			bo->size);
	else
		npu_bo_release_backing(bo);
	if (owner)
		npu_context_put(owner);
	npu_device_put(ndev);
}

/* Frees deferred behind the owner's user queues (npu_bo_free()). */
void npu_bo_free_work(struct work_struct *work)
{
	struct npu_context *ctx = container_of(work, struct npu_context, free_work);
	struct llist_node *list = llist_del_all(&ctx->free_list);
	struct npu_bo *bo, *next;

	/* One wait for the running commands covers every BO in the batch. */
	npu_uqueue_sync(ctx);
	llist_for_each_entry_safe(bo, next, list, free_node) {
		/* The next BO's context reference keeps @ctx (and this work). */
		npu_bo_destroy(bo);
	}
}

/*
 * GEM .free. The last reference may go in the completion thread, in a WAIT
 * of another file or in munmap(): when a user queue of the owner is
 * running a command, which may still use the BO's translations, the wait
 * for it and the free run in the owner's own work instead, so no one waits
 * for another file's queues (at most NPU_UQ_QUIESCE_US). Otherwise the
 * free is done here.
 */
static void npu_bo_free(struct drm_gem_object *obj)
{
	struct npu_bo *bo = to_npu_bo(obj);
	struct npu_context *owner = bo->owner;

	if (owner && npu_uqueue_busy(owner)) {
		if (llist_add(&bo->free_node, &owner->free_list))
			queue_work(npu_wq, &owner->free_work);
		return;
	}
	npu_bo_destroy(bo);
}

/* drm_driver.gem_create_object: the shmem helper allocates an npu_bo. */
struct drm_gem_object *npu_gem_create_object(struct drm_device *drm, size_t size)
{
	struct npu_bo *bo = kzalloc(sizeof(*bo), GFP_KERNEL_ACCOUNT);

	if (!bo)
		return ERR_PTR(-ENOMEM);
	bo->base.base.funcs = &npu_bo_shmem_funcs;
	return &bo->base.base;
}

/* A new object of a kind without shmem backing; put with npu_bo_put(). */
static struct npu_bo *npu_bo_alloc_private(struct npu_device *ndev, size_t size,
					   enum npu_bo_kind kind, struct dma_resv *resv)
{
	struct npu_bo *bo = kzalloc(sizeof(*bo), GFP_KERNEL_ACCOUNT);
	struct drm_gem_object *obj;

	if (!bo)
		return ERR_PTR(-ENOMEM);
	obj = &bo->base.base;
	obj->funcs = &npu_bo_private_funcs;
	obj->resv = resv;
	drm_gem_private_object_init(&ndev->drm, obj, size);
	bo->kind = kind;
	bo->size = size;
	bo->npages = size >> PAGE_SHIFT;
	bo->ndev = ndev;
	npu_device_get(ndev);
	return bo;
}

/* Free an object from npu_bo_alloc_private() before it got any backing. */
static void npu_bo_discard(struct npu_bo *bo)
{
	struct npu_device *ndev = bo->ndev;

	drm_gem_object_release(&bo->base.base);
	kfree(bo);
	npu_device_put(ndev);
}

/*
 * shmem answers a page it cannot allocate with -ENOSPC (a full file
 * system); for a buffer object that is out of memory.
 */
static void *npu_shmem_err(void *err)
{
	return PTR_ERR(err) == -ENOSPC ? ERR_PTR(-ENOMEM) : err;
}

/* Host memory: shmem pages, DMA-mapped and pinned until the object goes. */
static struct npu_bo *npu_bo_alloc_shmem(struct npu_device *ndev, size_t size)
{
	struct drm_gem_shmem_object *shmem;
	struct sg_table *sgt;
	struct npu_bo *bo;

	shmem = drm_gem_shmem_create(&ndev->drm, size);
	if (IS_ERR(shmem))
		return npu_shmem_err(shmem);
	bo = to_npu_bo(&shmem->base);
	bo->kind = NPU_BO_KIND_SHMEM;
	bo->size = shmem->base.size;
	bo->npages = bo->size >> PAGE_SHIFT;
	bo->ndev = ndev;
	npu_device_get(ndev);
	/* Allocates the pages (charged to the caller's memory cgroup). */
	sgt = drm_gem_shmem_get_pages_sgt(shmem);
	if (IS_ERR(sgt)) {
		npu_bo_put(bo);
		return npu_shmem_err(sgt);
	}
	bo->sgt = sgt;
	bo->pages = shmem->pages;
	return bo;
}

/* Map @bo into @vm; the free undoes it. */
static int npu_bo_map_vm(struct npu_bo *bo, struct npu_vm *vm, bool device_writable)
{
	bo->dev_readonly = !device_writable;
	if (bo->kind == NPU_BO_KIND_LOCAL)
		bo->va = npu_vm_map_local(vm, bo->local_off, bo->size, device_writable);
	else
		bo->va = npu_vm_map(vm, bo->sgt, bo->size, device_writable);
	if (!bo->va)
		return -ENOMEM;
	bo->vm = vm;
	return 0;
}

/*
 * Device memory, cleared (it may hold another file's data). The range is
 * taken here and given back by the free.
 */
static struct npu_bo *npu_bo_alloc_local(struct npu_device *ndev, size_t size)
{
	unsigned long addr;
	struct npu_bo *bo;

	if (!ndev->mem_pool)
		return ERR_PTR(-EOPNOTSUPP);
	addr = gen_pool_alloc(ndev->mem_pool, size);
	if (!addr)
		return ERR_PTR(-ENOMEM);
	bo = npu_bo_alloc_private(ndev, size, NPU_BO_KIND_LOCAL, NULL);
	if (IS_ERR(bo)) {
		gen_pool_free(ndev->mem_pool, addr, size);
		return bo;
	}
	bo->local_off = addr - NPU_MEM_POOL_BIAS;
	atomic64_add(size, &ndev->mem_used);
	/* Through the BAR, which only an awake device decodes. */
	if (npu_pm_get(ndev)) {
		npu_bo_put(bo);
		return ERR_PTR(-EIO);
	}
	memset_io(ndev->mem + bo->local_off, 0, size);
	npu_pm_put(ndev);
	return bo;
}

void npu_bo_put(struct npu_bo *bo)
{
	drm_gem_object_put(&bo->base.base);
}

/*
 * A buffer object owned by the driver (no handle, not in the device's BO
 * counts), mapped in @vm, that the device can read but not write, with a
 * kernel mapping in @vaddr. Released with npu_bo_put() after vunmap().
 */
struct npu_bo *npu_bo_create_kernel(struct npu_device *ndev, struct npu_vm *vm,
				    size_t size, void **vaddr)
{
	struct npu_bo *bo;
	int ret;

	bo = npu_bo_alloc_shmem(ndev, PAGE_ALIGN(size));
	if (IS_ERR(bo))
		return bo;
	ret = npu_bo_map_vm(bo, vm, false);
	if (ret)
		goto err_put;
	*vaddr = vmap(bo->pages, bo->npages, VM_MAP, PAGE_KERNEL);
	if (!*vaddr) {
		ret = -ENOMEM;
		goto err_put;
	}
	return bo;

err_put:
	npu_bo_put(bo);
	return ERR_PTR(ret);
}

/* Look up @handle in the context's file and take a reference, or NULL. */
struct npu_bo *npu_bo_lookup(struct npu_context *ctx, u32 handle)
{
	struct drm_gem_object *obj = drm_gem_object_lookup(ctx->file, handle);

	return obj ? to_npu_bo(obj) : NULL;
}

/* Count @bo as @ctx's: in the device's and the file's BO counts. */
static void npu_bo_set_owner(struct npu_context *ctx, struct npu_bo *bo)
{
	struct npu_device *ndev = ctx->ndev;

	atomic64_inc(&ndev->bo_count);
	atomic64_add(bo->size, &ndev->bo_bytes);
	bo->counted = true;
	/* The BO stays charged to its creator until its last reference goes. */
	kref_get(&ctx->ref);
	bo->owner = ctx;
	if (bo->kind == NPU_BO_KIND_LOCAL)
		atomic64_add(bo->size, &ctx->local_bytes);
}

/*
 * Give @bo a handle in @ctx's file and drop the caller's reference. From
 * then on another thread may close the handle (handles are predictable):
 * the caller must not touch @bo after this returns.
 */
static int npu_bo_publish(struct npu_context *ctx, struct npu_bo *bo, u32 *handle)
{
	int ret;

	ret = drm_gem_handle_create(ctx->file, &bo->base.base, handle);
	if (!ret) {
		/* Still ours: the caller's reference holds it. */
		bo->handle = *handle;
		trace_npu_bo_create(*handle, bo->size);
	}
	npu_bo_put(bo);
	return ret;
}

int npu_ioctl_bo_create(struct npu_context *ctx, void *data)
{
	struct npu_bo_create *args = data;
	u64 size, offset, va;
	struct npu_bo *bo;
	u32 handle;
	int ret;

	if ((args->flags & ~NPU_BO_CREATE_FLAGS) || args->size == 0 ||
	    args->handle || args->mmap_offset || args->alloc_size || args->va)
		return -EINVAL;
	if (args->size > NPU_BO_MAX_SIZE)
		return -E2BIG;
	if ((args->flags & NPU_BO_DEVICE) && !ctx->ndev->mem_pool)
		return -EOPNOTSUPP;

	size = PAGE_ALIGN(args->size);
	ret = npu_ctx_charge(ctx, size);
	if (ret)
		return ret;
	if (args->flags & NPU_BO_DEVICE)
		bo = npu_bo_alloc_local(ctx->ndev, size);
	else
		bo = npu_bo_alloc_shmem(ctx->ndev, size);
	if (IS_ERR(bo)) {
		npu_ctx_uncharge(ctx, size);
		return PTR_ERR(bo);
	}
	bo->charged = true;
	npu_bo_set_owner(ctx, bo);
	ret = npu_bo_map_vm(bo, &ctx->vm, true);
	if (!ret)
		ret = drm_gem_create_mmap_offset(&bo->base.base);
	if (ret) {
		npu_bo_put(bo);
		return ret;
	}
	offset = drm_vma_node_offset_addr(&bo->base.base.vma_node);
	va = bo->va;
	ret = npu_bo_publish(ctx, bo, &handle);
	if (ret)
		return ret;
	args->handle = handle;
	args->mmap_offset = offset;
	args->alloc_size = size;
	args->va = va;
	return 0;
}

int npu_ioctl_bo_destroy(struct npu_context *ctx, void *data)
{
	struct npu_bo_destroy *args = data;
	int ret;

	if (args->rsvd)
		return -EINVAL;
	/* Mappings and jobs in flight keep their own references. */
	ret = drm_gem_handle_delete(ctx->file, args->handle);
	/* DRM's "no such handle" is -EINVAL; ours is -ENOENT, as for SUBMIT. */
	return ret == -EINVAL ? -ENOENT : ret;
}

int npu_ioctl_bo_info(struct npu_context *ctx, void *data)
{
	struct npu_bo_info *args = data;
	struct npu_bo *bo;

	if (args->flags || args->size || args->mmap_offset || args->va)
		return -EINVAL;
	bo = npu_bo_lookup(ctx, args->handle);
	if (!bo)
		return -ENOENT;
	args->size = bo->size;
	args->va = bo->va;
	switch (bo->kind) {
	case NPU_BO_KIND_SHMEM:
		break;
	case NPU_BO_KIND_LOCAL:
		args->flags |= NPU_BO_INFO_DEVICE;
		break;
	case NPU_BO_KIND_USERPTR:
		args->flags |= NPU_BO_INFO_USERPTR;
		break;
	case NPU_BO_KIND_IMPORT:
		args->flags |= NPU_BO_INFO_IMPORTED;
		break;
	}
	if (bo->dev_readonly)
		args->flags |= NPU_BO_INFO_READONLY;
	if (bo->kind != NPU_BO_KIND_USERPTR)
		args->mmap_offset = drm_vma_node_offset_addr(&bo->base.base.vma_node);
	npu_bo_put(bo);
	return 0;
}

int npu_ioctl_bo_userptr(struct npu_context *ctx, void *data)
{
	struct npu_device *ndev = ctx->ndev;
	struct npu_bo_userptr *args = data;
	bool writable;
	struct npu_bo *bo;
	u32 handle;
	int pinned, ret;
	u64 end, va;

	if ((args->flags & ~NPU_BO_USERPTR_FLAGS) || args->handle || !args->size ||
	    !PAGE_ALIGNED(args->addr) || !PAGE_ALIGNED(args->size) ||
	    check_add_overflow(args->addr, args->size, &end))
		return -EINVAL;
	if (args->size > NPU_BO_MAX_SIZE)
		return -E2BIG;
	writable = !(args->flags & NPU_BO_USERPTR_READONLY);

	ret = npu_ctx_charge(ctx, args->size);
	if (ret)
		return ret;
	/*
	 * Long-term pinned pages count as locked memory of the process, against
	 * its RLIMIT_MEMLOCK (unless CAP_IPC_LOCK), as RDMA and VFIO pins do:
	 * until the BO's last reference goes, even after the process exits.
	 */
	ret = account_locked_vm(current->mm, args->size >> PAGE_SHIFT, true);
	if (ret)
		goto err_uncharge;
	bo = npu_bo_alloc_private(ndev, args->size, NPU_BO_KIND_USERPTR, NULL);
	if (IS_ERR(bo)) {
		ret = PTR_ERR(bo);
		goto err_unlock_vm;
	}
	bo->pages = kvcalloc(bo->npages, sizeof(*bo->pages), GFP_KERNEL_ACCOUNT);
	if (!bo->pages) {
		ret = -ENOMEM;
		goto err_discard;
	}
	pinned = pin_user_pages_fast(args->addr, bo->npages,
				     FOLL_LONGTERM | (writable ? FOLL_WRITE : 0),
				     bo->pages);
	if (pinned != bo->npages) {
		if (pinned > 0)
			unpin_user_pages(bo->pages, pinned);
		ret = pinned < 0 ? pinned : -EFAULT;
		goto err_free_array;
	}
	ret = sg_alloc_table_from_pages(&bo->user_sgt, bo->pages, bo->npages, 0,
					bo->size, GFP_KERNEL);
	if (ret)
		goto err_unpin;
	ret = dma_map_sgtable(&ndev->pdev->dev, &bo->user_sgt, DMA_BIDIRECTIONAL,
			      NPU_BO_DMA_ATTRS);
	if (ret)
		goto err_free_table;
	/* From here on the free undoes everything. */
	bo->sgt = &bo->user_sgt;
	bo->mm = current->mm;
	mmgrab(bo->mm);
	bo->charged = true;
	npu_bo_set_owner(ctx, bo);
	ret = npu_bo_map_vm(bo, &ctx->vm, writable);
	if (ret) {
		npu_bo_put(bo);
		return ret;
	}
	va = bo->va;
	ret = npu_bo_publish(ctx, bo, &handle);
	if (ret)
		return ret;
	args->handle = handle;
	args->va = va;
	return 0;

err_free_table:
	sg_free_table(&bo->user_sgt);
err_unpin:
	unpin_user_pages(bo->pages, bo->npages);
err_free_array:
	kvfree(bo->pages);
err_discard:
	npu_bo_discard(bo);
err_unlock_vm:
	account_locked_vm(current->mm, args->size >> PAGE_SHIFT, false);
err_uncharge:
	npu_ctx_uncharge(ctx, args->size);
	return ret;
}

/*
 * drm_driver.gem_prime_import: attach the dma-buf to the device and wrap
 * it in a new object, also when it is one of ours, so that the importing
 * file maps it in its own address space (npu_bo_open()). The exporter
 * keeps the pages; they are not charged to the importer.
 */
struct drm_gem_object *npu_gem_prime_import(struct drm_device *drm,
					    struct dma_buf *dmabuf)
{
	struct npu_device *ndev = to_npu_device(drm);
	struct dma_buf_attachment *attach;
	struct sg_table *sgt;
	struct npu_bo *bo;
	int ret;

	if (!dmabuf->size || !PAGE_ALIGNED(dmabuf->size) ||
	    dmabuf->size > NPU_BO_MAX_SIZE)
		return ERR_PTR(-EINVAL);
	attach = dma_buf_attach(dmabuf, drm->dev);
	if (IS_ERR(attach))
		return ERR_CAST(attach);
	get_dma_buf(dmabuf);
	sgt = dma_buf_map_attachment_unlocked(attach, DMA_BIDIRECTIONAL);
	if (IS_ERR(sgt)) {
		ret = PTR_ERR(sgt);
		goto err_detach;
	}
	bo = npu_bo_alloc_private(ndev, dmabuf->size, NPU_BO_KIND_IMPORT, dmabuf->resv);
	if (IS_ERR(bo)) {
		ret = PTR_ERR(bo);
		goto err_unmap;
	}
	bo->base.base.import_attach = attach;
	bo->sgt = sgt;
	ret = drm_gem_create_mmap_offset(&bo->base.base);
	if (ret) {
		npu_bo_put(bo);
		return ERR_PTR(ret);
	}
	return &bo->base.base;

err_unmap:
	dma_buf_unmap_attachment_unlocked(attach, sgt, DMA_BIDIRECTIONAL);
err_detach:
	dma_buf_detach(dmabuf, attach);
	dma_buf_put(dmabuf);
	return ERR_PTR(ret);
}

/*
 * GEM .open, on each new handle: an imported object is mapped into the
 * address space of the file that imported it. An object has one file: the
 * one that created or imported it.
 */
static int npu_bo_open(struct drm_gem_object *obj, struct drm_file *file)
{
	struct npu_context *ctx = file->driver_priv;
	struct npu_bo *bo = to_npu_bo(obj);
	int ret;

	if (bo->vm)
		return bo->vm == &ctx->vm ? 0 : -EINVAL;
	if (bo->kind != NPU_BO_KIND_IMPORT)
		return -EINVAL;
	ret = npu_bo_map_vm(bo, &ctx->vm, true);
	if (ret)
		return ret;
	npu_bo_set_owner(ctx, bo);
	return 0;
}

/*
 * Device memory and user pointers stay with the device: no dma-buf (the
 * one is BAR memory, the other is already another process's memory).
 */
static struct dma_buf *npu_bo_no_export(struct drm_gem_object *obj, int flags)
{
	return ERR_PTR(-EOPNOTSUPP);
}

static vm_fault_t npu_bo_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct drm_gem_object *obj = vma->vm_private_data;
	struct npu_bo *bo = to_npu_bo(obj);
	unsigned long addr = vmf->address & PAGE_MASK;
	pgoff_t page = vmf->pgoff - drm_vma_node_start(&obj->vma_node);
	vm_fault_t ret = VM_FAULT_SIGBUS;
	pgoff_t end;
	int idx;

	/* After an unplug the mappings were zapped; they stay gone. */
	if (!drm_dev_enter(obj->dev, &idx))
		return VM_FAULT_SIGBUS;
	if (page >= bo->npages)
		goto out;
	ret = vmf_insert_pfn(vma, addr, page_to_pfn(bo->pages[page]));
	/* The following pages too: a BO is usually read or written through. */
	end = min_t(pgoff_t, bo->npages, page + NPU_BO_PREFAULT);
	for (page++, addr += PAGE_SIZE; page < end && addr < vma->vm_end;
	     page++, addr += PAGE_SIZE) {
		if (vmf_insert_pfn(vma, addr, page_to_pfn(bo->pages[page])) &
		    VM_FAULT_ERROR)
			break;
	}
out:
	drm_dev_exit(idx);
	return ret;
}

static const struct vm_operations_struct npu_bo_vm_ops = {
	.fault = npu_bo_fault,
	.open = drm_gem_vm_open,
	.close = drm_gem_vm_close,
};

/*
 * A CPU mapping of device memory reaches the BAR, which the device does
 * not decode in D3hot: each mapping keeps the device awake (npu_pm.c).
 */
static void npu_bo_local_vm_open(struct vm_area_struct *vma)
{
	struct npu_bo *bo = to_npu_bo(vma->vm_private_data);

	npu_pm_get_noresume(bo->ndev);
	drm_gem_vm_open(vma);
}

static void npu_bo_local_vm_close(struct vm_area_struct *vma)
{
	struct npu_bo *bo = to_npu_bo(vma->vm_private_data);
	struct npu_device *ndev = bo->ndev;

	drm_gem_vm_close(vma);
	npu_pm_put(ndev);
}

/*
 * Device memory through the BAR, inserted on first touch (and the pages
 * after it): an unplug's zap (drm_dev_unplug()) comes after the SRCU
 * section this runs in, so it reaches every PTE made here. Inserting at
 * mmap time, before the vma is linked into the address_space, would let
 * that zap run in between and miss the mapping.
 */
static vm_fault_t npu_bo_local_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct drm_gem_object *obj = vma->vm_private_data;
	struct npu_bo *bo = to_npu_bo(obj);
	pgoff_t page = vmf->pgoff - drm_vma_node_start(&obj->vma_node);
	pgoff_t npages = bo->size >> PAGE_SHIFT;
	unsigned long addr = vmf->address & PAGE_MASK;
	unsigned long base;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	pgoff_t end;
	int idx;

	if (!drm_dev_enter(obj->dev, &idx))
		return VM_FAULT_SIGBUS;
	if (page >= npages)
		goto out;
	base = (bo->ndev->mem_phys + bo->local_off) >> PAGE_SHIFT;
	ret = vmf_insert_pfn(vma, addr, base + page);
	end = min_t(pgoff_t, npages, page + NPU_BO_PREFAULT);
	for (page++, addr += PAGE_SIZE; page < end && addr < vma->vm_end;
	     page++, addr += PAGE_SIZE) {
		if (vmf_insert_pfn(vma, addr, base + page) & VM_FAULT_ERROR)
			break;
	}
out:
	drm_dev_exit(idx);
	return ret;
}

static const struct vm_operations_struct npu_bo_local_vm_ops = {
	.fault = npu_bo_local_fault,
	.open = npu_bo_local_vm_open,
	.close = npu_bo_local_vm_close,
};

/*
 * GEM .mmap, from npu_bo_mmap() or the mmap of an exported dma-buf: in
 * both, vm_pgoff is the object's fake offset plus the first page mapped.
 */
static int npu_bo_mmap_obj(struct drm_gem_object *obj, struct vm_area_struct *vma)
{
	struct npu_bo *bo = to_npu_bo(obj);
	u64 start = (u64)(vma->vm_pgoff - drm_vma_node_start(&obj->vma_node)) << PAGE_SHIFT;
	u64 len = vma->vm_end - vma->vm_start;
	int ret;

	if (!(vma->vm_flags & VM_SHARED) || bo->kind == NPU_BO_KIND_USERPTR ||
	    start >= bo->size || len > bo->size - start)
		return -EINVAL;
	vm_flags_set(vma, VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP);
	if (bo->kind != NPU_BO_KIND_LOCAL) {
		vma->vm_page_prot = vm_get_page_prot(vma->vm_flags);
		return 0;	/* npu_bo_fault() maps the pages */
	}
	/* Device memory through the BAR, the device awake; by fault. */
	ret = npu_pm_get(bo->ndev);
	if (ret)
		return ret;
	vm_flags_set(vma, VM_IO);
	vma->vm_page_prot = pgprot_writecombine(vm_get_page_prot(vma->vm_flags));
	vma->vm_ops = &npu_bo_local_vm_ops;	/* its close drops the reference */
	return 0;
}

/*
 * mmap of a BO at or above 4 GiB: the GEM node holding the whole range,
 * which this file must hold a handle to (else -EINVAL, as for an offset
 * that names no BO: other files' objects are not told apart). Inside
 * npu_dev_enter().
 */
int npu_bo_mmap(struct drm_file *file, struct vm_area_struct *vma)
{
	struct drm_vma_offset_manager *mgr = file->minor->dev->vma_offset_manager;
	struct drm_vma_offset_node *node;
	struct drm_gem_object *obj = NULL;
	int ret;

	drm_vma_offset_lock_lookup(mgr);
	node = drm_vma_offset_lookup_locked(mgr, vma->vm_pgoff, vma_pages(vma));
	if (node) {
		obj = container_of(node, struct drm_gem_object, vma_node);
		/* A node of an object being freed: its refcount is 0. */
		if (!kref_get_unless_zero(&obj->refcount))
			obj = NULL;
	}
	drm_vma_offset_unlock_lookup(mgr);
	if (!obj)
		return -EINVAL;
	if (!drm_vma_node_is_allowed(node, file)) {
		ret = -EINVAL;
		goto err_put;
	}
	if (obj->import_attach) {
		/* The exporter maps it; the vma moves to the dma-buf's file. */
		ret = dma_buf_mmap(obj->import_attach->dmabuf, vma,
				   vma->vm_pgoff - drm_vma_node_start(node));
		goto err_put;
	}
	vma->vm_private_data = obj;
	vma->vm_ops = &npu_bo_vm_ops;
	ret = npu_bo_mmap_obj(obj, vma);
	if (ret)
		goto err_put;
	return 0;	/* the vma holds the reference (drm_gem_vm_close()) */

err_put:
	drm_gem_object_put(obj);
	return ret;
}

static const struct drm_gem_object_funcs npu_bo_shmem_funcs = {
	.free = npu_bo_free,
	.open = npu_bo_open,
	.print_info = drm_gem_shmem_object_print_info,
	.pin = drm_gem_shmem_object_pin,
	.unpin = drm_gem_shmem_object_unpin,
	.get_sg_table = drm_gem_shmem_object_get_sg_table,
	.vmap = drm_gem_shmem_object_vmap,
	.vunmap = drm_gem_shmem_object_vunmap,
	.mmap = npu_bo_mmap_obj,
	.vm_ops = &npu_bo_vm_ops,
};

static const struct drm_gem_object_funcs npu_bo_private_funcs = {
	.free = npu_bo_free,
	.open = npu_bo_open,
	.export = npu_bo_no_export,
	.mmap = npu_bo_mmap_obj,
	.vm_ops = &npu_bo_vm_ops,
};
