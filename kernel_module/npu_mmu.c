// SPDX-License-Identifier: GPL-2.0
/*
 * NPU device MMU: the driver owns the device's two-level page table
 * (npu_hw.h) and a device virtual address allocator. Every buffer object
 * is mapped at its own VA range; descriptors carry VAs, so the device can
 * reach nothing but mapped buffers.
 */
#include <linux/dma-mapping.h>
#include <linux/genalloc.h>
#include <linux/scatterlist.h>

#include "npu_drv.h"

/* VA 0 .. 2 MiB stays unmapped so that a zero address always faults. */
#define NPU_VA_BASE		BIT_ULL(NPU_MMU_L1_SHIFT)
#define NPU_VA_END		((u64)NPU_MMU_MAX_L1 << NPU_MMU_L1_SHIFT)

/*
 * The tables are not device-managed: buffer objects can outlive the driver
 * binding (open files after an unbind) and unmap themselves on release, so
 * the tables live until the last reference to the device (npu_mmu_fini()).
 */
int npu_mmu_init(struct npu_device *ndev)
{
	struct device *dev = &ndev->pdev->dev;
	struct npu_mmu *mmu = &ndev->mmu;

	BUILD_BUG_ON(PAGE_SIZE != NPU_PAGE_SIZE);
	mutex_init(&mmu->lock);
	mmu->l1 = dma_alloc_coherent(dev, NPU_MMU_MAX_L1 * sizeof(u64),
				     &mmu->l1_dma, GFP_KERNEL);
	if (!mmu->l1)
		return -ENOMEM;
	mmu->va_pool = gen_pool_create(PAGE_SHIFT, -1);
	if (!mmu->va_pool)
		return -ENOMEM;
	return gen_pool_add(mmu->va_pool, NPU_VA_BASE, NPU_VA_END - NPU_VA_BASE, -1);
}

/* Free the tables; every buffer object is gone by now. */
void npu_mmu_fini(struct npu_device *ndev)
{
	struct device *dev = &ndev->pdev->dev;
	struct npu_mmu *mmu = &ndev->mmu;
	u32 i;

	for (i = 0; i < NPU_MMU_MAX_L1; i++)
		if (mmu->l2[i])
			dma_free_coherent(dev, NPU_MMU_L2_ENTRIES * sizeof(u64),
					  mmu->l2[i], le64_to_cpu(mmu->l1[i]) & NPU_PTE_ADDR_MASK);
	if (mmu->l1)
		dma_free_coherent(dev, NPU_MMU_MAX_L1 * sizeof(u64), mmu->l1, mmu->l1_dma);
	if (mmu->va_pool)
		gen_pool_destroy(mmu->va_pool);
}

/* Point the device at the page table; the device must be disabled. */
void npu_mmu_enable(struct npu_device *ndev)
{
	struct npu_mmu *mmu = &ndev->mmu;

	npu_wr(ndev, NPU_REG_MMU_L1_LO, lower_32_bits(mmu->l1_dma));
	npu_wr(ndev, NPU_REG_MMU_L1_HI, upper_32_bits(mmu->l1_dma));
	npu_wr(ndev, NPU_REG_MMU_L1_ENTRIES, NPU_MMU_MAX_L1);
	npu_wr(ndev, NPU_REG_MMU_CONTROL, NPU_MMU_ENABLE);
}

/* The L2 table covering @va, allocated on first use; caller holds lock. */
static __le64 *npu_mmu_l2(struct npu_mmu *mmu, struct device *dev, u64 va)
{
	u32 l1i = va >> NPU_MMU_L1_SHIFT;
	dma_addr_t dma;

	if (!mmu->l2[l1i]) {
		mmu->l2[l1i] = dma_alloc_coherent(dev, NPU_MMU_L2_ENTRIES * sizeof(u64),
						  &dma, GFP_KERNEL);
		if (!mmu->l2[l1i])
			return NULL;
		WRITE_ONCE(mmu->l1[l1i], cpu_to_le64(dma | NPU_PTE_VALID));
	}
	return mmu->l2[l1i];
}

static void npu_mmu_clear(struct npu_mmu *mmu, u64 va, u64 size)
{
	u64 end = va + size;

	for (; va < end; va += NPU_PAGE_SIZE) {
		__le64 *l2 = mmu->l2[va >> NPU_MMU_L1_SHIFT];

		if (l2)
			WRITE_ONCE(l2[(va >> NPU_PAGE_SHIFT) & (NPU_MMU_L2_ENTRIES - 1)], 0);
	}
}

/*
 * Map the DMA pages of @sgt at a new VA range of @size bytes, writable by
 * the device or not; returns the VA, or 0 when the VA space or memory for
 * page tables is exhausted.
 */
u64 npu_mmu_map(struct npu_device *ndev, struct sg_table *sgt, u64 size,
		bool device_writable)
{
	struct npu_mmu *mmu = &ndev->mmu;
	struct sg_dma_page_iter iter;
	u64 va, cur;

	va = gen_pool_alloc(mmu->va_pool, size);
	if (!va)
		return 0;
	cur = va;
	mutex_lock(&mmu->lock);
	for_each_sgtable_dma_page(sgt, &iter, 0) {
		dma_addr_t page = sg_page_iter_dma_address(&iter);
		__le64 *l2 = npu_mmu_l2(mmu, &ndev->pdev->dev, cur);

		if (!l2) {
			npu_mmu_clear(mmu, va, cur - va);
			mutex_unlock(&mmu->lock);
			gen_pool_free(mmu->va_pool, va, size);
			return 0;
		}
		WRITE_ONCE(l2[(cur >> NPU_PAGE_SHIFT) & (NPU_MMU_L2_ENTRIES - 1)],
			   cpu_to_le64(page | NPU_PTE_VALID |
				       (device_writable ? NPU_PTE_WRITE : 0)));
		cur += NPU_PAGE_SIZE;
	}
	mutex_unlock(&mmu->lock);
	return va;
}

/*
 * Unmap a range. Only called once no queued command uses the range (jobs
 * hold their buffers), and the device caches no translation across
 * commands, so nothing needs invalidating.
 */
void npu_mmu_unmap(struct npu_device *ndev, u64 va, u64 size)
{
	struct npu_mmu *mmu = &ndev->mmu;

	mutex_lock(&mmu->lock);
	npu_mmu_clear(mmu, va, size);
	mutex_unlock(&mmu->lock);
	gen_pool_free(mmu->va_pool, va, size);
}
