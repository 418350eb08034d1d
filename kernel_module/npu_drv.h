/* SPDX-License-Identifier: GPL-2.0 */
/*
 * NPU driver: shared definitions of the driver's subsystems.
 *
 *   npu_drv.c    PCI probe/remove, char device, file operations
 *   npu_hw.c     registers, queue rings, interrupts, completions, reset
 *   npu_mmu.c    device page tables and the device VA allocator
 *   npu_bo.c     buffer objects and mmap
 *   npu_job.c    SUBMIT validation, fences, WAIT
 *   npu_sysfs.c  device attributes
 *   npu_debugfs.c  debug and fault-injection files
 */
#ifndef NPU_DRV_H
#define NPU_DRV_H

#include <linux/cdev.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/scatterlist.h>
#include <linux/rwsem.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/xarray.h>

#include "npu_hw.h"
#include "npu_uapi.h"

#define NPU_DRIVER_NAME		"npu"
#define NPU_DRIVER_VERSION	0x00010000	/* major << 16 | minor */
#define NPU_MAX_DEVICES		16
#define NPU_RING_ENTRIES	4096

#define npu_dbg(ndev, fmt, ...) \
	dev_dbg(&(ndev)->pdev->dev, fmt, ##__VA_ARGS__)

struct npu_device;

/* A failed op, kept until a WAIT covering its fence reports it. */
struct npu_error {
	struct list_head node;
	u64 fence;
	u32 status;
};

struct npu_context {
	struct npu_device *ndev;
	struct kref ref;		/* the file, plus one per job in flight */
	struct xarray bos;		/* handle -> struct npu_bo; has its own lock */
	spinlock_t err_lock;		/* protects errors and num_errors */
	struct list_head errors;	/* struct npu_error, by fence */
	u32 num_errors;
	u32 client_id;			/* unique per open, for fdinfo */
	atomic64_t bo_count;		/* live BOs this context created */
	atomic64_t bo_bytes;		/* their backing bytes (charged to the limit) */
};

struct npu_bo {
	struct kref ref;		/* the handle, each mapping, each job */
	struct npu_device *ndev;
	size_t size;
	unsigned long npages;
	struct page **pages;
	struct sg_table sgt;		/* DMA-mapped pages */
	u64 va;				/* device virtual address */
	u32 handle;
	struct npu_context *owner;	/* charged context (holds a ref); NULL: kernel BO */
	bool userptr;			/* pages pinned from user memory */
	bool dev_readonly;		/* the device may not write it */
};

struct npu_mmu {
	__le64 *l1;			/* NPU_MMU_MAX_L1 entries */
	dma_addr_t l1_dma;
	struct gen_pool *va_pool;	/* free device VA ranges; own lock */
	struct mutex lock;		/* protects l1 and l2 contents */
	__le64 *l2[NPU_MMU_MAX_L1];	/* allocated on first use, kept */
};

struct npu_job {
	struct list_head node;		/* in npu_queue.jobs */
	struct npu_context *ctx;	/* NULL for driver-internal jobs */
	u64 first_fence;
	u64 last_fence;
	u64 err_fence;			/* first failed op, 0 if none */
	u32 err_status;
	u32 num_bos;
	struct npu_bo *bos[];
};

struct npu_queue {
	struct npu_device *ndev;
	u32 index;
	u32 entries;
	int irq;

	struct npu_cmd *ring;
	dma_addr_t ring_dma;
	struct npu_cpl *cpl;
	dma_addr_t cpl_dma;
	struct npu_fence_wb *wb;
	dma_addr_t wb_dma;
	/* Parameter blocks of tensor ops, one per ring slot, device read-only. */
	struct npu_bo *params_bo;
	struct npu_tensor_params *params;

	/*
	 * submit_lock serialises writers of the ring: it protects tail,
	 * next_fence and the ring contents, and is held across a recovery.
	 */
	struct mutex submit_lock;
	u32 tail;
	u64 next_fence;			/* last fence handed out */
	u64 fence_base;			/* last fence before the ring (re)started */

	/* job_lock protects jobs and completed; taken from the IRQ thread. */
	spinlock_t job_lock;
	struct list_head jobs;		/* in flight, ascending fences */
	u64 completed;			/* last retired fence */

	wait_queue_head_t wq;		/* completions and ring space */
};

struct npu_device {
	struct pci_dev *pdev;
	void __iomem *regs;
	struct kref ref;		/* probe, plus one per open file */
	int minor;
	struct cdev *cdev;
	struct device *chardev;

	/* unplug_sem: ioctls hold it for read; remove() for write. */
	struct rw_semaphore unplug_sem;
	bool unplugged;

	u32 hw_version;
	u32 abi_version;
	u32 caps;
	u32 num_queues;
	u32 num_cores;

	struct dentry *debugfs;
	atomic_t irq_count;
	atomic_t recoveries;
	atomic_t op_errors;		/* ops completed with a non-OK status */
	atomic64_t bo_count;		/* live buffer objects */
	atomic64_t bo_bytes;		/* bytes of their backing pages */
	struct npu_mmu mmu;
	struct npu_queue queue;
};

/* Ring slot of @fence: fences are consecutive from fence_base + 1 at slot 0. */
static inline u32 npu_fence_slot(struct npu_queue *q, u64 fence)
{
	return (fence - q->fence_base - 1) & (q->entries - 1);
}

static inline u32 npu_rd(struct npu_device *ndev, u32 reg)
{
	return readl(ndev->regs + reg);
}

static inline void npu_wr(struct npu_device *ndev, u32 reg, u32 val)
{
	writel(val, ndev->regs + reg);
}

/* npu_drv.c */
void npu_device_put(struct npu_device *ndev);

/* npu_hw.c */
int npu_hw_init(struct npu_device *ndev);
void npu_hw_fini(struct npu_device *ndev);
void npu_hw_free(struct npu_device *ndev);
void npu_queue_push(struct npu_queue *q, const struct npu_cmd *cmd);
void npu_queue_kick(struct npu_queue *q);
u64 npu_queue_put_params(struct npu_queue *q, const struct npu_tensor_params *p);
u32 npu_queue_space(struct npu_queue *q);
bool npu_fence_done(struct npu_queue *q, u64 fence);
void npu_queue_abort_all(struct npu_queue *q, u32 status);
void npu_queue_process(struct npu_queue *q);

/* npu_mmu.c */
int npu_mmu_init(struct npu_device *ndev);
void npu_mmu_fini(struct npu_device *ndev);
void npu_mmu_enable(struct npu_device *ndev);
u64 npu_mmu_map(struct npu_device *ndev, struct sg_table *sgt, u64 size,
		bool device_writable);
void npu_mmu_unmap(struct npu_device *ndev, u64 va, u64 size);

/* npu_bo.c */
int npu_ioctl_bo_create(struct npu_context *ctx, void __user *arg);
int npu_ioctl_bo_destroy(struct npu_context *ctx, void __user *arg);
int npu_ioctl_bo_userptr(struct npu_context *ctx, void __user *arg);
struct npu_bo *npu_bo_lookup(struct npu_context *ctx, u32 handle);
void npu_bo_put(struct npu_bo *bo);
struct npu_bo *npu_bo_create_kernel(struct npu_device *ndev, size_t size,
				    void **vaddr);
void npu_bo_release_all(struct npu_context *ctx);
int npu_bo_mmap(struct npu_context *ctx, struct vm_area_struct *vma);
u64 npu_ctx_mem_limit(void);

/* npu_job.c */
int npu_ioctl_submit(struct npu_context *ctx, void __user *arg);
int npu_ioctl_wait(struct npu_context *ctx, void __user *arg);
int npu_ioctl_fence_info(struct npu_context *ctx, void __user *arg);
void npu_job_retire(struct npu_job *job);
void npu_context_put(struct npu_context *ctx);

/* npu_debugfs.c */
void npu_debugfs_init(struct npu_device *ndev);
void npu_debugfs_fini(struct npu_device *ndev);
void npu_debugfs_module_init(void);
void npu_debugfs_module_exit(void);

/* npu_sysfs.c */
extern const struct attribute_group *npu_attr_groups[];

#endif /* NPU_DRV_H */
