// SPDX-License-Identifier: GPL-2.0
/*
 * NPU device MMU: address spaces (struct npu_vm) with their two-level page
 * tables (npu_hw.h) and device virtual address allocators, and the
 * device's context table that names them.
 *
 * The driver's own address space is the device-wide table (context 0);
 * every open file gets its own, in the context table entry of its ctx id.
 * A buffer object is mapped only in the address space of the file that
 * created it, so a command of one file reaches nothing of another's: a
 * device address that is not its own faults. Descriptors carry VAs.
 */
#include <linux/dma-mapping.h>
#include <linux/genalloc.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>

#include "npu_drv.h"

/* VA 0 .. 2 MiB stays unmapped so that a zero address always faults. */
#define NPU_VA_BUFFERS		SZ_2M
#define NPU_VA_END		((u64)NPU_MMU_MAX_L1 << NPU_MMU_L1_SHIFT)

static struct device *npu_vm_dev(struct npu_vm *vm)
{
	return &vm->ndev->pdev->dev;
}

/*
 * An empty address space. Not device-managed: buffer objects can outlive
 * the driver binding (open files after an unbind) and unmap themselves on
 * release, so the tables live until npu_vm_fini().
 */
int npu_vm_init(struct npu_device *ndev, struct npu_vm *vm, u32 ctx)
{
	BUILD_BUG_ON(PAGE_SIZE != NPU_PAGE_SIZE);
	vm->ndev = ndev;
	vm->ctx = ctx;
	/* A file's tables are charged to its memory cgroup; the driver's are not. */
	vm->gfp = ctx ? GFP_KERNEL_ACCOUNT : GFP_KERNEL;
	mutex_init(&vm->lock);
	vm->l2 = kvcalloc(NPU_MMU_MAX_L1, sizeof(*vm->l2), vm->gfp);
	if (!vm->l2)
		return -ENOMEM;
	vm->l1 = dma_alloc_coherent(npu_vm_dev(vm), NPU_MMU_MAX_L1 * sizeof(u64),
				    &vm->l1_dma, vm->gfp);
	if (!vm->l1)
		return -ENOMEM;
	vm->va_pool = gen_pool_create(PAGE_SHIFT, -1);
	if (!vm->va_pool)
		return -ENOMEM;
	return gen_pool_add(vm->va_pool, NPU_VA_BUFFERS, NPU_VA_END - NPU_VA_BUFFERS, -1);
}

/* Free the tables of @vm (also after a failed init); nothing is mapped. */
void npu_vm_fini(struct npu_vm *vm)
{
	struct device *dev = npu_vm_dev(vm);
	u32 i;

	for (i = 0; vm->l2 && i < NPU_MMU_MAX_L1; i++)
		if (vm->l2[i])
			dma_free_coherent(dev, NPU_MMU_L2_ENTRIES * sizeof(u64), vm->l2[i],
					  le64_to_cpu(vm->l1[i]) & NPU_PTE_ADDR_MASK);
	kvfree(vm->l2);
	vm->l2 = NULL;
	if (vm->l1)
		dma_free_coherent(dev, NPU_MMU_MAX_L1 * sizeof(u64), vm->l1, vm->l1_dma);
	vm->l1 = NULL;
	if (vm->va_pool)
		gen_pool_destroy(vm->va_pool);
	vm->va_pool = NULL;
}

/* The driver's address space and the (empty) context table. */
int npu_mmu_init(struct npu_device *ndev)
{
	ndev->ctx_table = dma_alloc_coherent(&ndev->pdev->dev,
					     NPU_MAX_CONTEXTS * sizeof(*ndev->ctx_table),
					     &ndev->ctx_table_dma, GFP_KERNEL);
	if (!ndev->ctx_table)
		return -ENOMEM;
	return npu_vm_init(ndev, &ndev->kvm, 0);
}

/* Free the tables; every buffer object and context is gone by now. */
void npu_mmu_fini(struct npu_device *ndev)
{
	if (ndev->kvm.ndev)
		npu_vm_fini(&ndev->kvm);
	if (ndev->ctx_table)
		dma_free_coherent(&ndev->pdev->dev,
				  NPU_MAX_CONTEXTS * sizeof(*ndev->ctx_table),
				  ndev->ctx_table, ndev->ctx_table_dma);
	ida_destroy(&ndev->ctx_ida);
}

/* Point the device at the tables; the device must be disabled. */
void npu_mmu_enable(struct npu_device *ndev)
{
	npu_wr(ndev, NPU_REG_MMU_L1_LO, lower_32_bits(ndev->kvm.l1_dma));
	npu_wr(ndev, NPU_REG_MMU_L1_HI, upper_32_bits(ndev->kvm.l1_dma));
	npu_wr(ndev, NPU_REG_MMU_L1_ENTRIES, NPU_MMU_MAX_L1);
	npu_wr(ndev, NPU_REG_MMU_CTX_LO, lower_32_bits(ndev->ctx_table_dma));
	npu_wr(ndev, NPU_REG_MMU_CTX_HI, upper_32_bits(ndev->ctx_table_dma));
	npu_wr(ndev, NPU_REG_MMU_CTX_COUNT, NPU_MAX_CONTEXTS);
	npu_wr(ndev, NPU_REG_MMU_CONTROL, NPU_MMU_ENABLE);
}

/*
 * A context's own address space: a free ctx id, the tables, and the
 * context table entry that lets the device use it. -EBUSY when every ctx
 * id is taken.
 */
int npu_vm_create_ctx(struct npu_device *ndev, struct npu_vm *vm)
{
	struct npu_mmu_ctx_entry *e;
	int id, ret;

	id = ida_alloc_range(&ndev->ctx_ida, 1, NPU_MAX_CONTEXTS - 1, GFP_KERNEL);
	if (id < 0)
		return id == -ENOSPC ? -EBUSY : id;
	ret = npu_vm_init(ndev, vm, id);
	if (ret) {
		npu_vm_fini(vm);
		ida_free(&ndev->ctx_ida, id);
		return ret;
	}
	/* The table is little endian; npu_hw.h declares it with __u64. */
	e = &ndev->ctx_table[id];
	e->l1_entries = (__force u32)cpu_to_le32(NPU_MMU_MAX_L1);
	e->rsvd = 0;
	/* The device reads the entry at command start: publish l1 last. */
	dma_wmb();
	WRITE_ONCE(e->l1, (__force u64)cpu_to_le64(vm->l1_dma | NPU_PTE_VALID));
	return 0;
}

/* Withdraw a context's address space; no command of it is in flight. */
void npu_vm_destroy_ctx(struct npu_vm *vm)
{
	struct npu_device *ndev = vm->ndev;

	WRITE_ONCE(ndev->ctx_table[vm->ctx].l1, 0);
	npu_vm_fini(vm);
	ida_free(&ndev->ctx_ida, vm->ctx);
}

/* The L2 table covering @va, allocated on first use; caller holds lock. */
static __le64 *npu_vm_l2(struct npu_vm *vm, u64 va)
{
	u32 l1i = va >> NPU_MMU_L1_SHIFT;
	dma_addr_t dma;

	if (!vm->l2[l1i]) {
		vm->l2[l1i] = dma_alloc_coherent(npu_vm_dev(vm),
						 NPU_MMU_L2_ENTRIES * sizeof(u64),
						 &dma, vm->gfp);
		if (!vm->l2[l1i])
			return NULL;
		WRITE_ONCE(vm->l1[l1i], cpu_to_le64(dma | NPU_PTE_VALID));
	}
	return vm->l2[l1i];
}

static void npu_vm_clear(struct npu_vm *vm, u64 va, u64 size)
{
	u64 end = va + size;

	for (; va < end; va += NPU_PAGE_SIZE) {
		__le64 *l2 = vm->l2[va >> NPU_MMU_L1_SHIFT];

		if (l2)
			WRITE_ONCE(l2[(va >> NPU_PAGE_SHIFT) & (NPU_MMU_L2_ENTRIES - 1)], 0);
	}
}

/*
 * Map the DMA pages of @sgt at [va, va + size), writable by the device or
 * not. On failure (no memory for page tables) nothing stays mapped.
 */
int npu_vm_map_at(struct npu_vm *vm, u64 va, struct sg_table *sgt, u64 size,
		  bool device_writable)
{
	struct sg_dma_page_iter iter;
	u64 cur = va;

	mutex_lock(&vm->lock);
	for_each_sgtable_dma_page(sgt, &iter, 0) {
		dma_addr_t page = sg_page_iter_dma_address(&iter);
		__le64 *l2;

		if (cur >= va + size)
			break;
		l2 = npu_vm_l2(vm, cur);
		if (!l2) {
			npu_vm_clear(vm, va, cur - va);
			mutex_unlock(&vm->lock);
			return -ENOMEM;
		}
		WRITE_ONCE(l2[(cur >> NPU_PAGE_SHIFT) & (NPU_MMU_L2_ENTRIES - 1)],
			   cpu_to_le64(page | NPU_PTE_VALID |
				       (device_writable ? NPU_PTE_WRITE : 0)));
		cur += NPU_PAGE_SIZE;
	}
	mutex_unlock(&vm->lock);
	return 0;
}

/* Map [addr, addr + size) of one contiguous range at a new VA; 0 on failure. */
static u64 npu_vm_map_contig(struct npu_vm *vm, u64 addr, u64 size, u64 flags)
{
	u64 va = gen_pool_alloc(vm->va_pool, size);
	u64 done;

	if (!va)
		return 0;
	mutex_lock(&vm->lock);
	for (done = 0; done < size; done += NPU_PAGE_SIZE) {
		__le64 *l2 = npu_vm_l2(vm, va + done);

		if (!l2) {
			npu_vm_clear(vm, va, done);
			mutex_unlock(&vm->lock);
			gen_pool_free(vm->va_pool, va, size);
			return 0;
		}
		WRITE_ONCE(l2[((va + done) >> NPU_PAGE_SHIFT) & (NPU_MMU_L2_ENTRIES - 1)],
			   cpu_to_le64((addr + done) | NPU_PTE_VALID | flags));
	}
	mutex_unlock(&vm->lock);
	return va;
}

/*
 * Map [offset, offset + size) of device memory at a new VA range; returns
 * the VA, or 0 when the VA space or memory for page tables is exhausted.
 */
u64 npu_vm_map_local(struct npu_vm *vm, u64 offset, u64 size, bool device_writable)
{
	return npu_vm_map_contig(vm, offset, size,
				 NPU_PTE_LOCAL | (device_writable ? NPU_PTE_WRITE : 0));
}

/* Map a DMA-contiguous range (coherent memory) at a new VA range, or 0. */
u64 npu_vm_map_dma(struct npu_vm *vm, dma_addr_t addr, u64 size, bool device_writable)
{
	return npu_vm_map_contig(vm, addr, size, device_writable ? NPU_PTE_WRITE : 0);
}

/*
 * Map @sgt at a new VA range of @size bytes; returns the VA, or 0 when the
 * VA space or memory for page tables is exhausted.
 */
u64 npu_vm_map(struct npu_vm *vm, struct sg_table *sgt, u64 size,
	       bool device_writable)
{
	u64 va = gen_pool_alloc(vm->va_pool, size);

	if (!va)
		return 0;
	if (npu_vm_map_at(vm, va, sgt, size, device_writable)) {
		gen_pool_free(vm->va_pool, va, size);
		return 0;
	}
	return va;
}

/* Clear the PTEs of [va, va + size) without giving the range back. */
void npu_vm_unmap_range(struct npu_vm *vm, u64 va, u64 size)
{
	mutex_lock(&vm->lock);
	npu_vm_clear(vm, va, size);
	mutex_unlock(&vm->lock);
}

/*
 * Unmap a range from npu_vm_map(). Only called once no queued command uses
 * the range (jobs hold their buffers), and the device caches no
 * translation across commands, so nothing needs invalidating.
 */
void npu_vm_unmap(struct npu_vm *vm, u64 va, u64 size)
{
	npu_vm_unmap_range(vm, va, size);
	gen_pool_free(vm->va_pool, va, size);
}
