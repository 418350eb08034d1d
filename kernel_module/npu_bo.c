// SPDX-License-Identifier: GPL-2.0
/*
 * NPU buffer objects: host memory pages owned by a file descriptor, named
 * by a per-fd handle, DMA-mapped and mapped into the device's VA space, and
 * mmap-able at a per-handle offset.
 *
 * mmap offset of a BO = handle << NPU_BO_OFFSET_SHIFT; the low bits select a
 * page inside the BO, so part of a BO can be mapped.
 */
#include <linux/dma-mapping.h>
#include <linux/genalloc.h>
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "npu_drv.h"
#include "npu_trace.h"

/*
 * BO memory is shared with user space and the device without cache
 * maintenance (probe refuses a device without coherent DMA), so mappings
 * skip the CPU syncs. That also makes two BOs over the same pages (one
 * array pinned twice) legal for the DMA API, whose debug code otherwise
 * flags overlapping mappings of a cacheline.
 */
#define NPU_BO_DMA_ATTRS DMA_ATTR_SKIP_CPU_SYNC

#define NPU_BO_OFFSET_SHIFT	32

static unsigned int ctx_mem_limit_mib;
module_param(ctx_mem_limit_mib, uint, 0644);
MODULE_PARM_DESC(ctx_mem_limit_mib,
		 "Most MiB of buffer objects one open file may hold (0: no limit)");

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

/* The limit as shown in fdinfo: bytes, 0 for none. */
u64 npu_ctx_mem_limit(void)
{
	return (u64)READ_ONCE(ctx_mem_limit_mib) << 20;
}

static void npu_bo_free_pages(struct npu_bo *bo)
{
	unsigned long i;

	if (bo->userptr) {
		/* The device may have written them: mark them dirty. */
		unpin_user_pages_dirty_lock(bo->pages, bo->npages, !bo->dev_readonly);
		account_locked_vm(bo->mm, bo->npages, false);
		mmdrop(bo->mm);
	} else {
		for (i = 0; i < bo->npages && bo->pages[i]; i++)
			__free_page(bo->pages[i]);
	}
	kvfree(bo->pages);
}

static void npu_bo_free(struct kref *ref)
{
	struct npu_bo *bo = container_of(ref, struct npu_bo, ref);
	struct npu_device *ndev = bo->ndev;

	trace_npu_bo_free(bo->handle, bo->size);
	if (!bo->internal) {
		atomic64_dec(&ndev->bo_count);
		atomic64_sub(bo->size, &ndev->bo_bytes);
	}
	npu_vm_unmap(bo->vm, bo->va, bo->size);
	/* A user queue's command may still use the old translations. */
	if (bo->owner)
		npu_uqueue_sync(bo->owner);
	if (bo->local) {
		gen_pool_free(ndev->mem_pool, bo->local_off + NPU_MEM_POOL_BIAS, bo->size);
		atomic64_sub(bo->size, &ndev->mem_used);
		if (bo->owner)
			atomic64_sub(bo->size, &bo->owner->local_bytes);
	} else {
		dma_unmap_sgtable(&ndev->pdev->dev, &bo->sgt, DMA_BIDIRECTIONAL,
				  NPU_BO_DMA_ATTRS);
		sg_free_table(&bo->sgt);
		npu_bo_free_pages(bo);
	}
	if (bo->owner) {
		npu_ctx_uncharge(bo->owner, bo->size);
		npu_context_put(bo->owner);
	}
	kfree(bo);
	npu_device_put(ndev);
}

/*
 * Map the pages of @bo for DMA and into its address space (bo->vm). On
 * failure the mappings made here are undone; the pages stay with the caller.
 */
static int npu_bo_map_pages(struct npu_device *ndev, struct npu_bo *bo,
			    bool device_writable)
{
	struct device *dev = &ndev->pdev->dev;
	int ret;

	bo->dev_readonly = !device_writable;
	ret = sg_alloc_table_from_pages(&bo->sgt, bo->pages, bo->npages, 0,
					bo->size, GFP_KERNEL);
	if (ret)
		return ret;
	ret = dma_map_sgtable(dev, &bo->sgt, DMA_BIDIRECTIONAL, NPU_BO_DMA_ATTRS);
	if (ret)
		goto err_free_table;
	bo->va = npu_vm_map(bo->vm, &bo->sgt, bo->size, device_writable);
	if (!bo->va) {
		ret = -ENOMEM;
		goto err_unmap;
	}
	return 0;

err_unmap:
	dma_unmap_sgtable(dev, &bo->sgt, DMA_BIDIRECTIONAL, NPU_BO_DMA_ATTRS);
err_free_table:
	sg_free_table(&bo->sgt);
	return ret;
}

/*
 * Back @bo with zeroed pages, map them for DMA and into the device's VA
 * space. On failure everything done here is undone.
 */
static int npu_bo_alloc_backing(struct npu_device *ndev, struct npu_bo *bo,
				bool device_writable)
{
	unsigned long i;
	int ret;

	/*
	 * Charged to the memory cgroup of the caller (__GFP_ACCOUNT), as the
	 * page cache of a file it wrote would be: a container cannot pin host
	 * memory outside its limit through the device.
	 */
	bo->pages = kvcalloc(bo->npages, sizeof(*bo->pages), GFP_KERNEL_ACCOUNT);
	if (!bo->pages)
		return -ENOMEM;
	for (i = 0; i < bo->npages; i++) {
		bo->pages[i] = alloc_page(GFP_HIGHUSER | __GFP_ZERO | __GFP_NOWARN |
					  __GFP_ACCOUNT);
		if (!bo->pages[i]) {
			npu_bo_free_pages(bo);
			return -ENOMEM;
		}
	}
	ret = npu_bo_map_pages(ndev, bo, device_writable);
	if (ret)
		npu_bo_free_pages(bo);
	return ret;
}

/*
 * Back @bo with device memory, cleared (it may hold another file's data),
 * and map it into bo->vm. On failure everything done here is undone.
 */
static int npu_bo_alloc_local(struct npu_device *ndev, struct npu_bo *bo)
{
	unsigned long addr;

	if (!ndev->mem_pool)
		return -EOPNOTSUPP;
	addr = gen_pool_alloc(ndev->mem_pool, bo->size);
	if (!addr)
		return -ENOMEM;
	bo->local = true;
	bo->local_off = addr - NPU_MEM_POOL_BIAS;
	memset_io(ndev->mem + bo->local_off, 0, bo->size);
	bo->va = npu_vm_map_local(bo->vm, bo->local_off, bo->size, true);
	if (!bo->va) {
		gen_pool_free(ndev->mem_pool, addr, bo->size);
		return -ENOMEM;
	}
	atomic64_add(bo->size, &ndev->mem_used);
	return 0;
}

void npu_bo_put(struct npu_bo *bo)
{
	kref_put(&bo->ref, npu_bo_free);
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

	bo = kzalloc(sizeof(*bo), GFP_KERNEL);
	if (!bo)
		return ERR_PTR(-ENOMEM);
	kref_init(&bo->ref);
	bo->size = PAGE_ALIGN(size);
	bo->npages = bo->size >> PAGE_SHIFT;
	bo->vm = vm;
	bo->internal = true;
	ret = npu_bo_alloc_backing(ndev, bo, false);
	if (ret) {
		kfree(bo);
		return ERR_PTR(ret);
	}
	bo->ndev = ndev;
	npu_device_get(ndev);
	*vaddr = vmap(bo->pages, bo->npages, VM_MAP, PAGE_KERNEL);
	if (!*vaddr) {
		npu_bo_put(bo);
		return ERR_PTR(-ENOMEM);
	}
	return bo;
}

/* Look up @handle and take a reference, or NULL. */
struct npu_bo *npu_bo_lookup(struct npu_context *ctx, u32 handle)
{
	struct npu_bo *bo;

	xa_lock(&ctx->bos);
	bo = xa_load(&ctx->bos, handle);
	if (bo)
		kref_get(&bo->ref);
	xa_unlock(&ctx->bos);
	return bo;
}

/*
 * Hand a backed, charged BO to @ctx: count it, take the device and context
 * references and give it a handle. The handle is reserved first and the BO
 * stored in it last: from then on another thread may destroy it (handles
 * are predictable), so the caller must not touch @bo after a success. On
 * failure the BO is put, which undoes everything.
 */
static int npu_bo_publish(struct npu_context *ctx, struct npu_bo *bo, u32 *handle)
{
	struct npu_device *ndev = ctx->ndev;
	int ret;

	bo->ndev = ndev;
	npu_device_get(ndev);
	atomic64_inc(&ndev->bo_count);
	atomic64_add(bo->size, &ndev->bo_bytes);
	/* The BO stays charged to its creator until its last reference goes. */
	kref_get(&ctx->ref);
	bo->owner = ctx;
	/* A reserved entry reads as NULL: BO_DESTROY and lookups miss it. */
	ret = xa_alloc(&ctx->bos, handle, NULL, XA_LIMIT(1, INT_MAX), GFP_KERNEL);
	if (ret) {
		npu_bo_put(bo);
		return ret;
	}
	bo->handle = *handle;
	trace_npu_bo_create(*handle, bo->size);
	/* Cannot fail: the entry exists, so no memory is needed. */
	xa_store(&ctx->bos, *handle, bo, GFP_KERNEL);
	return 0;
}

int npu_ioctl_bo_create(struct npu_context *ctx, void *data)
{
	struct npu_bo_create *args = data;
	struct npu_bo *bo;
	u64 alloc_size, va;
	u32 handle;
	int ret;

	if ((args->flags & ~NPU_BO_CREATE_FLAGS) || args->size == 0 ||
	    args->handle || args->mmap_offset || args->alloc_size || args->va)
		return -EINVAL;
	if (args->size > NPU_BO_MAX_SIZE)
		return -E2BIG;
	if ((args->flags & NPU_BO_DEVICE) && !ctx->ndev->mem_pool)
		return -EOPNOTSUPP;

	bo = kzalloc(sizeof(*bo), GFP_KERNEL);
	if (!bo)
		return -ENOMEM;
	kref_init(&bo->ref);
	bo->size = PAGE_ALIGN(args->size);
	bo->npages = bo->size >> PAGE_SHIFT;
	bo->vm = &ctx->vm;
	ret = npu_ctx_charge(ctx, bo->size);
	if (ret) {
		kfree(bo);
		return ret;
	}
	if (args->flags & NPU_BO_DEVICE)
		ret = npu_bo_alloc_local(ctx->ndev, bo);
	else
		ret = npu_bo_alloc_backing(ctx->ndev, bo, true);
	if (ret) {
		npu_ctx_uncharge(ctx, bo->size);
		kfree(bo);
		return ret;
	}
	if (bo->local)
		atomic64_add(bo->size, &ctx->local_bytes);
	alloc_size = bo->size;
	va = bo->va;
	ret = npu_bo_publish(ctx, bo, &handle);
	if (ret)
		return ret;
	args->handle = handle;
	args->mmap_offset = (u64)handle << NPU_BO_OFFSET_SHIFT;
	args->alloc_size = alloc_size;
	args->va = va;
	return 0;
}

int npu_ioctl_bo_destroy(struct npu_context *ctx, void *data)
{
	struct npu_bo_destroy *args = data;
	struct npu_bo *bo;

	if (args->rsvd)
		return -EINVAL;
	/* Only a published BO: a handle still being created stays reserved. */
	xa_lock(&ctx->bos);
	bo = xa_load(&ctx->bos, args->handle);
	if (bo)
		__xa_erase(&ctx->bos, args->handle);
	xa_unlock(&ctx->bos);
	if (!bo)
		return -ENOENT;
	/* Mappings and jobs in flight keep their own references. */
	npu_bo_put(bo);
	return 0;
}

int npu_ioctl_bo_userptr(struct npu_context *ctx, void *data)
{
	struct npu_bo_userptr *args = data;
	bool writable;
	struct npu_bo *bo;
	u64 end, va;
	u32 handle;
	int pinned, ret;

	if ((args->flags & ~NPU_BO_USERPTR_FLAGS) || args->handle || !args->size ||
	    !PAGE_ALIGNED(args->addr) || !PAGE_ALIGNED(args->size) ||
	    check_add_overflow(args->addr, args->size, &end))
		return -EINVAL;
	if (args->size > NPU_BO_MAX_SIZE)
		return -E2BIG;
	writable = !(args->flags & NPU_BO_USERPTR_READONLY);

	bo = kzalloc(sizeof(*bo), GFP_KERNEL);
	if (!bo)
		return -ENOMEM;
	kref_init(&bo->ref);
	bo->size = args->size;
	bo->npages = bo->size >> PAGE_SHIFT;
	bo->userptr = true;
	bo->dev_readonly = !writable;
	bo->vm = &ctx->vm;
	ret = npu_ctx_charge(ctx, bo->size);
	if (ret)
		goto err_free_bo;
	/*
	 * Long-term pinned pages count as locked memory of the process, against
	 * its RLIMIT_MEMLOCK (unless CAP_IPC_LOCK), as RDMA and VFIO pins do:
	 * until the BO's last reference goes, even after the process exits.
	 */
	ret = account_locked_vm(current->mm, bo->npages, true);
	if (ret)
		goto err_uncharge;
	bo->mm = current->mm;
	mmgrab(bo->mm);
	bo->pages = kvcalloc(bo->npages, sizeof(*bo->pages), GFP_KERNEL_ACCOUNT);
	if (!bo->pages) {
		ret = -ENOMEM;
		goto err_unlock_vm;
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
	ret = npu_bo_map_pages(ctx->ndev, bo, writable);
	if (ret)
		goto err_unpin;
	va = bo->va;
	ret = npu_bo_publish(ctx, bo, &handle);
	if (ret)
		return ret;
	args->handle = handle;
	args->va = va;
	return 0;

err_unpin:
	unpin_user_pages(bo->pages, bo->npages);
err_free_array:
	kvfree(bo->pages);
err_unlock_vm:
	account_locked_vm(bo->mm, bo->npages, false);
	mmdrop(bo->mm);
err_uncharge:
	npu_ctx_uncharge(ctx, bo->size);
err_free_bo:
	kfree(bo);
	return ret;
}

void npu_bo_release_all(struct npu_context *ctx)
{
	struct npu_bo *bo;
	unsigned long handle;

	xa_for_each(&ctx->bos, handle, bo) {
		xa_erase(&ctx->bos, handle);
		npu_bo_put(bo);
	}
	xa_destroy(&ctx->bos);
}

static void npu_bo_vm_open(struct vm_area_struct *vma)
{
	struct npu_bo *bo = vma->vm_private_data;

	kref_get(&bo->ref);
}

static void npu_bo_vm_close(struct vm_area_struct *vma)
{
	npu_bo_put(vma->vm_private_data);
}

static const struct vm_operations_struct npu_bo_vm_ops = {
	.open = npu_bo_vm_open,
	.close = npu_bo_vm_close,
};

int npu_bo_mmap(struct npu_context *ctx, struct vm_area_struct *vma)
{
	u64 offset = (u64)vma->vm_pgoff << PAGE_SHIFT;
	u32 handle = offset >> NPU_BO_OFFSET_SHIFT;
	u64 start = offset & (BIT_ULL(NPU_BO_OFFSET_SHIFT) - 1);
	u64 len = vma->vm_end - vma->vm_start;
	unsigned long pgoff;
	struct npu_bo *bo;
	int ret;

	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	if (handle == NPU_MMAP_QUEUE_HANDLE)
		return npu_uqueue_mmap(ctx, vma);
	bo = npu_bo_lookup(ctx, handle);
	if (!bo)
		return -EINVAL;
	if (bo->userptr || start >= bo->size || len > bo->size - start) {
		ret = -EINVAL;
		goto err_put;
	}
	vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP);
	if (bo->local) {
		/* Device memory: write-combined through the BAR. */
		vm_flags_set(vma, VM_IO);
		vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);
		phys_addr_t phys = ctx->ndev->mem_phys + bo->local_off + start;

		ret = io_remap_pfn_range(vma, vma->vm_start, phys >> PAGE_SHIFT,
					 len, vma->vm_page_prot);
	} else {
		/*
		 * vm_map_pages() takes vm_pgoff as the page index into the BO;
		 * put the vma's own offset back after it, so that the vma stays
		 * at its place in the device's address_space and a zap of
		 * another range (a user queue's doorbell) cannot reach it.
		 */
		pgoff = vma->vm_pgoff;
		vma->vm_pgoff = start >> PAGE_SHIFT;
		ret = vm_map_pages(vma, bo->pages, bo->npages);
		vma->vm_pgoff = pgoff;
	}
	if (ret)
		goto err_put;
	vma->vm_private_data = bo;
	vma->vm_ops = &npu_bo_vm_ops;
	return 0;

err_put:
	npu_bo_put(bo);
	return ret;
}
