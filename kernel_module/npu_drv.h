/* SPDX-License-Identifier: GPL-2.0 */
/*
 * NPU driver: shared definitions of the driver's subsystems.
 *
 *   npu_drv.c    PCI probe/remove, the DRM accel device, its ioctl table
 *   npu_hw.c     registers, queue rings, interrupts, completions, reset
 *   npu_mmu.c    address spaces: page tables, VA allocators, context table
 *   npu_uqueue.c user-mode queues: rings and doorbells mapped to processes
 *   npu_reset.c  watchdog: hang detection, device reset, replay, bans
 *   npu_fw.c     firmware load and boot, mailbox, log ring, heartbeat
 *   npu_bo.c     buffer objects and mmap
 *   npu_job.c    SUBMIT validation, fences, WAIT
 *   npu_fence.c  dma_fences of jobs, syncobj dependencies, device semaphores
 *   npu_coredump.c  device coredump of a hang or a lost device (devcoredump)
 *   npu_pm.c     runtime power management (autosuspend to D3hot)
 *   npu_perf.c   performance counter snapshots
 *   npu_fwtrace.c  the device's trace ring, drained into tracepoints
 *   npu_sysfs.c  device attributes
 *   npu_debugfs.c  debug and fault-injection files
 */
#ifndef NPU_DRV_H
#define NPU_DRV_H

#include <linux/dma-fence.h>
#include <linux/idr.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/llist.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/scatterlist.h>
#include <linux/sizes.h>
#include <linux/srcu.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>

struct seq_file;

#include <drm/drm_device.h>
#include <drm/drm_drv.h>
#include <drm/drm_file.h>
#include <drm/drm_gem_shmem_helper.h>

#include "npu_hw.h"
#include "npu_uapi.h"

#define NPU_DRIVER_NAME		"npu"
#define NPU_DRIVER_VERSION	0x00010001	/* major << 16 | minor */
#define NPU_RING_ENTRIES	4096
#define NPU_MAX_CONTEXTS	1024	/* open files per device, ctx 0 is the driver's */
/* Device memory offsets in mem_pool are biased: gen_pool cannot hand out 0. */
#define NPU_MEM_POOL_BIAS	BIT_ULL(40)

#define npu_dbg(ndev, fmt, ...) \
	dev_dbg(&(ndev)->pdev->dev, fmt, ##__VA_ARGS__)

struct dma_buf;
struct npu_dump_header;
struct drm_syncobj;
struct dma_fence_chain;
struct npu_device;
struct npu_uqueue;

/* A device address space: page tables and a VA allocator (npu_mmu.c). */
struct npu_vm {
	struct npu_device *ndev;
	u32 ctx;			/* context table entry, 0: device-wide */
	__le64 *l1;			/* NPU_MMU_MAX_L1 entries */
	dma_addr_t l1_dma;
	struct gen_pool *va_pool;	/* free VA ranges; own lock */
	struct mutex lock;		/* protects l1 and l2 contents */
	__le64 **l2;			/* NPU_MMU_MAX_L1, allocated on first use, kept */
	gfp_t gfp;			/* for its tables: accounted for a file's */
};

/* A failed op, kept until a WAIT covering its fence reports it. */
struct npu_error {
	struct list_head node;
	u64 fence;
	u32 status;
};

struct npu_context {
	struct npu_device *ndev;
	struct kref ref;		/* the file, plus one per job in flight */
	/* The open file (its GEM handles); only ioctls, while it is open, use it. */
	struct drm_file *file;
	spinlock_t err_lock;		/* protects errors and num_errors */
	struct list_head errors;	/* struct npu_error, by fence */
	u32 num_errors;
	u64 client_id;			/* drm_file.client_id: fdinfo, logs, ring owners */
	atomic64_t bo_count;		/* live BOs this context created */
	atomic64_t bo_bytes;		/* their backing bytes (charged to the limit) */
	atomic64_t local_bytes;		/* of which in device memory */
	atomic64_t busy_ns;		/* device time of its retired queue-0 ops */
	struct npu_vm vm;		/* where its buffers are mapped */
	bool faulted;			/* a command of it faulted: submits fail */
	u64 last_fence;			/* of its last SUBMIT on queue 0 (poll) */
	u32 hangs;			/* its commands that hung (watchdog) */
	bool banned;			/* hung too often: submits fail with -EIO */
	/*
	 * Failed jobs of it taken off the queue (their fences done) whose
	 * error is not in @errors yet: a WAIT that sees the fence done waits
	 * for it, so another CPU's retirement cannot hide the error.
	 */
	atomic_t errors_pending;
	atomic_t num_uqs;		/* user queues it holds (npu_device.uq[]) */
	/*
	 * poll() waits here for its user queues: their completions and stops
	 * wake it (npu_uqueue_wake()). It lives as long as the file, unlike a
	 * user queue, which QUEUE_DESTROY may free while the file is polled.
	 */
	wait_queue_head_t poll_wq;
	/* Its BOs whose free waits for its user queues (npu_bo_free_work()). */
	struct llist_head free_list;
	struct work_struct free_work;
	/*
	 * The parameter blocks of its tensor ops on queue 0, one per ring
	 * slot, device read-only, in its own address space only; created by
	 * its first tensor SUBMIT under params_lock.
	 */
	struct mutex params_lock;
	struct npu_bo *params_bo;
	struct npu_tensor_params *params;
};

enum npu_bo_kind {
	NPU_BO_KIND_SHMEM,		/* host memory: shmem pages */
	NPU_BO_KIND_LOCAL,		/* device memory (BAR2) at local_off */
	NPU_BO_KIND_USERPTR,		/* user pages pinned long-term */
	NPU_BO_KIND_IMPORT,		/* a dma-buf attached to the device */
};

/*
 * A buffer object (npu_bo.c): a GEM object, whose reference count counts
 * its handle, each CPU mapping, each job and each dma-buf export.
 */
struct npu_bo {
	struct drm_gem_shmem_object base;	/* first: the shmem helper frees it */
	struct npu_device *ndev;	/* holds a reference */
	enum npu_bo_kind kind;
	size_t size;
	unsigned long npages;
	struct page **pages;		/* shmem's or the pinned user pages */
	struct sg_table *sgt;		/* DMA-mapped for the device */
	struct sg_table user_sgt;	/* userptr: what sgt points to */
	u64 va;				/* device virtual address in vm */
	struct npu_vm *vm;		/* the holder's address space, or the driver's */
	u32 handle;			/* in the holder's file (traces) */
	struct npu_context *owner;	/* holder (holds a ref); NULL: kernel BO */
	bool counted;			/* in the device's and owner's BO counts */
	bool charged;			/* its size is charged to the owner's limit */
	struct mm_struct *mm;		/* userptr: whose locked_vm the pins count in */
	u64 local_off;
	bool dev_readonly;		/* the device may not write it */
	struct llist_node free_node;	/* in owner->free_list: free deferred */
};

/*
 * A user-mode queue (npu_uqueue.c): a hardware queue lent to one context,
 * confined to its address space, whose ring, completion records and fence
 * write-back are mapped into the process along with its doorbell page.
 */
struct npu_uqueue {
	struct kref ref;		/* npu_device.uq[], each mapping */
	struct npu_device *ndev;	/* holds a reference */
	struct npu_context *ctx;	/* owner while in npu_device.uq[], then NULL */
	u32 index;			/* hardware queue */
	u32 entries;
	size_t mem_size;		/* ring + completions + fence page */
	void *mem;			/* coherent DMA memory */
	dma_addr_t mem_dma;
	struct npu_fence_wb *wb;	/* inside mem */
	bool stopped;			/* the device stopped it (error, reset), or taken back */
	/*
	 * Taken back from its file, while the device may still run its
	 * command: it keeps the hardware queue, @ctx and @ctx's memory until
	 * the command stops or a reset stops the device (npu_uqueue_drain()).
	 */
	bool draining;
	struct npu_context *drain_ctx;		/* @ctx, for release_work */
	struct work_struct release_work;	/* drops what draining held */
	bool hung;			/* its command hung: the device was reset */
	u32 priority;
	bool resume;			/* restart at resume_head/_tail after a reset */
	u32 resume_head, resume_tail;
	u32 error;			/* NPU_ERR_* it stopped with */
	u64 wb_kva;			/* its fence write-back in the driver's space */
	u64 fault_fence;		/* its command that faulted (NPU_ERR_MMU_FAULT) */
	wait_queue_head_t wq;		/* fence write-backs and stops */
};

/*
 * A dependency of a job that the device waits for with a WAIT descriptor
 * (npu_fence.c): a user queue's fence write-back, or a semaphore word that
 * a callback of @fence writes when it signals.
 */
struct npu_dep {
	struct dma_fence_cb cb;
	struct dma_fence *fence;	/* holds a reference; NULL for a user queue */
	struct npu_uqueue *uq;		/* holds a reference; NULL for a fence */
	struct npu_device *ndev;
	int sem;			/* semaphore slot, -1 for none */
	u64 va;				/* what the WAIT reads ... */
	u64 value;			/* ... and waits to be at least this */
};

/* A job's dma_fence: its own lock, since it may outlive the device. */
struct npu_fence {
	struct dma_fence base;
	spinlock_t lock;		/* dma_fence lock: protects base's callbacks and flags */
};

struct npu_job {
	struct list_head node;		/* in npu_queue.jobs */
	struct npu_context *ctx;	/* NULL for driver-internal jobs */
	u64 first_fence;
	u64 last_fence;
	u64 err_fence;			/* first failed op, 0 if none */
	u64 submit_ns;			/* ktime_get_ns() when it was queued */
	u32 err_status;
	bool err_pending;		/* counted in ctx->errors_pending until retired */
	bool keep_memory;		/* the device may still write its BOs: leak them */
	struct npu_device *pm;		/* holds a runtime PM reference on it */
	struct dma_fence *done;		/* signalled at retire; NULL for internal jobs */
	u32 num_deps;
	struct npu_dep *deps;		/* what the device waits for first */
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

	/*
	 * submit_lock serialises writers of the ring: it protects tail,
	 * next_fence and the ring contents, and is held across a recovery.
	 */
	struct mutex submit_lock;
	u32 tail;
	u64 *owner;			/* per ring slot: client_id of its file, 0: the driver's */
	u64 next_fence;			/* last fence handed out */
	u64 fence_base;			/* last fence before the ring (re)started */

	/* job_lock protects jobs and completed; taken from the IRQ thread. */
	spinlock_t job_lock;
	struct list_head jobs;		/* in flight, ascending fences */
	u64 completed;			/* last retired fence */

	wait_queue_head_t wq;		/* completions and ring space */
};

/* One snapshot of the performance counters (npu_perf.c). */
#define NPU_PERF_MAX_CORES	64
struct npu_perf_snap {
	u64 time_ns;			/* device clock at the snapshot */
	u64 q[NPU_NUM_QUEUES][NPU_PERF_COUNTERS];
	u64 core[NPU_PERF_MAX_CORES];	/* busy ns per AI core */
};

/*
 * The device. Its drm_device is reference counted: open files, buffer
 * objects and user queues hold references (npu_device_get()), so the
 * structure outlives remove() until the last of them is gone. Hardware
 * access from a file runs between drm_dev_enter() and drm_dev_exit();
 * remove() unplugs the DRM device (drm_dev_unplug(): no new entries, waits
 * for those inside, zaps every CPU mapping) before it stops the hardware.
 */

struct npu_device {
	struct drm_device drm;
	struct pci_dev *pdev;
	void __iomem *regs;
	int minor;			/* the accel minor: /dev/accel/accelN */

	u32 hw_version;
	u32 abi_version;
	u32 caps;
	u32 num_queues;
	u32 num_cores;
	u32 timing;			/* enum npu_timing: the device's chip timing model */

	struct dentry *debugfs;
	atomic_t irq_count;
	atomic_t recoveries;		/* device resets that recovered */
	atomic_t hangs;			/* hung commands the watchdog found */
	/* Watchdog (npu_reset.c): last HEAD and since when, per queue. */
	struct delayed_work watchdog;
	u32 wd_head[NPU_NUM_QUEUES];
	u32 wd_progress[NPU_NUM_QUEUES];	/* NPU_Q_PROGRESS at wd_since */
	unsigned long wd_since[NPU_NUM_QUEUES];
	u64 hang_detect_ns;		/* the last hang: from start to detection */
	/* Firmware (npu_fw.c): the image kept to boot again, the log ring. */
	void *fw_image;
	dma_addr_t fw_image_dma;
	size_t fw_image_size;
	struct npu_fw_log *fw_log;	/* + NPU_FW_LOG_BYTES of text */
	dma_addr_t fw_log_dma;
	u32 fw_version;
	u32 fw_hb_us;			/* the image's heartbeat period */
	u32 hb_last;			/* heartbeat seen last by the watchdog */
	unsigned long hb_since;		/* jiffies when it last changed */
	struct mutex mbox_lock;		/* one mailbox request at a time; mbox_seq */
	u32 mbox_seq;
	u64 reset_recovery_ns;		/* the last recovery: reset to restart */
	bool wedged;			/* a reset failed: the device takes no more work */
	/* Runtime PM (npu_pm.c): how often, and the last resume's time. */
	atomic_t suspends;
	atomic_t resumes;
	u64 resume_ns;
	atomic_t op_errors;		/* ops completed with a non-OK status */
	atomic64_t bo_count;		/* live buffer objects */
	atomic64_t bo_bytes;		/* bytes of their backing pages */
	/* Device memory (BAR2): size, CPU mapping, allocator (own lock). */
	u64 mem_size;
	phys_addr_t mem_phys;
	void __iomem *mem;
	struct gen_pool *mem_pool;
	atomic64_t mem_used;
	struct npu_vm kvm;		/* the driver's address space (ctx 0) */
	struct npu_mmu_ctx_entry *ctx_table;	/* NPU_MAX_CONTEXTS, coherent */
	dma_addr_t ctx_table_dma;
	struct ida ctx_ida;		/* ctx ids of open files */
	struct npu_queue queue;
	/*
	 * uq_mutex protects uq[] (hardware queue -> user queue), the
	 * registers of queues 1.. and the stopped/error fields of user queues.
	 * Releasing a buffer object takes it (npu_uqueue_sync()): never
	 * retire jobs or put buffers while holding it.
	 */
	struct mutex uq_mutex;
	struct npu_uqueue *uq[NPU_NUM_QUEUES];
	/* Jobs' dma_fences (npu_fence.c): their context is queue 0's timeline. */
	u64 fence_context;
	/*
	 * Device semaphores: words the device's WAITs read (in the driver's
	 * address space at sem_va) and dma_fence callbacks write; a slot is
	 * held by the job whose dependency it is, until it retires.
	 */
	u64 *sem;
	dma_addr_t sem_dma;
	u64 sem_va;
	struct ida sem_ida;
	struct npu_uq_vec {		/* IRQ cookie of queue index's vector */
		struct npu_device *ndev;
		u32 index;
	} uq_vec[NPU_NUM_QUEUES];
	u32 hw_queues;			/* queues in use: 0 (driver's) and 1.. (users') */
	/*
	 * perf_lock serialises snapshots of the performance counters
	 * (npu_perf.c) and protects perf_last, the latest one.
	 */
	struct mutex perf_lock;
	struct npu_perf_snap perf_last;
	/*
	 * The device's trace ring (npu_fwtrace.c). fwtrace_lock protects
	 * fwtrace_on (also read locklessly, to skip the lock while off), the
	 * ring's consumer index fwtrace_tail and the TRACE_* registers.
	 */
	struct mutex fwtrace_lock;
	struct npu_trace_rec *fwtrace;	/* coherent, NPU_FWTRACE_RECORDS */
	dma_addr_t fwtrace_dma;
	bool fwtrace_on;
	bool fwtrace_stuck;		/* would not turn off: the ring is never freed */
	u32 fwtrace_tail;
	struct work_struct fwtrace_work;	/* drains a half-full ring */
	bool wd_paused;			/* debugfs watchdog = 0: the watchdog looks at nothing */
};

static inline struct npu_device *to_npu_device(struct drm_device *drm)
{
	return container_of(drm, struct npu_device, drm);
}

/*
 * npu_dev_enter() - start using the device from a file: drm_dev_enter().
 * Returns false once remove() has started: the caller fails with -ENODEV.
 * Otherwise remove() waits until the matching npu_dev_exit(@idx).
 */
static inline bool npu_dev_enter(struct npu_device *ndev, int *idx)
{
	return drm_dev_enter(&ndev->drm, idx);
}

static inline void npu_dev_exit(struct npu_device *ndev, int idx)
{
	drm_dev_exit(idx);
}

/* Has remove() started? Then the registers must not be touched. */
static inline bool npu_unplugged(struct npu_device *ndev)
{
	return drm_dev_is_unplugged(&ndev->drm);
}

static inline void npu_device_get(struct npu_device *ndev)
{
	drm_dev_get(&ndev->drm);
}

static inline void npu_device_put(struct npu_device *ndev)
{
	drm_dev_put(&ndev->drm);
}

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

/* npu_hw.c */
int npu_hw_init(struct npu_device *ndev);
int npu_hw_reset(struct npu_device *ndev);
void npu_hw_start(struct npu_device *ndev);
int npu_hw_restart(struct npu_device *ndev);
void npu_queue_rebase(struct npu_queue *q, u64 base);
void npu_queue_moderate(struct npu_device *ndev, u32 i);
struct npu_job *npu_queue_find_job(struct npu_queue *q, u64 fence);
void npu_hw_fini(struct npu_device *ndev);
void npu_hw_free(struct npu_device *ndev);
void npu_queue_push(struct npu_queue *q, const struct npu_cmd *cmd, u64 client);
void npu_queue_kick(struct npu_queue *q);
u64 npu_queue_put_params(struct npu_queue *q, struct npu_context *ctx,
			 const struct npu_tensor_params *p);
u32 npu_queue_space(struct npu_queue *q);
bool npu_fence_done(struct npu_queue *q, u64 fence);
void npu_queue_abort_all(struct npu_queue *q, u32 status, struct list_head *done);
void npu_queue_retire(struct npu_queue *q, struct list_head *done);
void npu_jobs_keep_memory(struct list_head *done);
void npu_queue_collect_done(struct npu_queue *q, struct list_head *done);
void npu_queue_process(struct npu_queue *q);

/* npu_mmu.c */
int npu_mmu_init(struct npu_device *ndev);
void npu_mmu_fini(struct npu_device *ndev);
void npu_mmu_enable(struct npu_device *ndev);
int npu_vm_init(struct npu_device *ndev, struct npu_vm *vm, u32 ctx);
void npu_vm_fini(struct npu_vm *vm);
int npu_vm_create_ctx(struct npu_device *ndev, struct npu_vm *vm);
void npu_vm_destroy_ctx(struct npu_vm *vm);
int npu_vm_map_at(struct npu_vm *vm, u64 va, struct sg_table *sgt, u64 size,
		  bool device_writable);
u64 npu_vm_map_local(struct npu_vm *vm, u64 offset, u64 size, bool device_writable);
u64 npu_vm_map_dma(struct npu_vm *vm, dma_addr_t addr, u64 size, bool device_writable);
u64 npu_vm_map(struct npu_vm *vm, struct sg_table *sgt, u64 size,
	       bool device_writable);
void npu_vm_unmap_range(struct npu_vm *vm, u64 va, u64 size);
void npu_vm_unmap(struct npu_vm *vm, u64 va, u64 size);

/* npu_uqueue.c */
int npu_ioctl_queue_create(struct npu_context *ctx, void *data);
int npu_ioctl_queue_destroy(struct npu_context *ctx, void *data);
int npu_uqueue_wait(struct npu_context *ctx, struct npu_wait *args);
int npu_uqueue_mmap(struct npu_context *ctx, struct vm_area_struct *vma);
void npu_uqueue_release_all(struct npu_context *ctx);
int npu_uqueue_sync(struct npu_context *ctx);
bool npu_uqueue_busy(struct npu_context *ctx);
void npu_uqueue_irq(struct npu_device *ndev, u32 index);
void npu_uqueue_check_stopped(struct npu_device *ndev);
void npu_uqueue_stop_all(struct npu_device *ndev, u32 hung);
void npu_uqueue_suspend_all(struct npu_device *ndev, u32 hung);
void npu_uqueue_resume_all(struct npu_device *ndev);
void npu_uqueue_reset_done(struct npu_device *ndev);
struct npu_context *npu_uqueue_owner(struct npu_device *ndev, u32 index);
bool npu_uqueue_idle(struct npu_context *ctx);
struct npu_uqueue *npu_uqueue_get_owned(struct npu_context *ctx, u32 index);
void npu_uqueue_put(struct npu_uqueue *uq);

/* npu_fw.c */
#define NPU_HB_MISSES		5	/* heartbeat periods missed: firmware lost */
int npu_fw_init(struct npu_device *ndev);
int npu_fw_boot(struct npu_device *ndev);
void npu_fw_stop(struct npu_device *ndev);
int npu_mbox_call(struct npu_device *ndev, u32 cmd, u32 arg0, u32 arg1, u32 *resp);
bool npu_fw_heartbeat_lost(struct npu_device *ndev);
void npu_fw_heartbeat_reset(struct npu_device *ndev);
size_t npu_fw_log_read(struct npu_device *ndev, char *buf, size_t len);

/* npu_reset.c */
void npu_watchdog_init(struct npu_device *ndev);
void npu_watchdog_start(struct npu_device *ndev);
void npu_watchdog_stop(struct npu_device *ndev);
void npu_reset_uevent(struct npu_device *ndev, const char *reason);

/* npu_coredump.c */
struct npu_dump_header *npu_coredump_capture(struct npu_device *ndev, u32 reason, int qi,
					     u64 fence, u64 client);
void npu_coredump_fatal(struct npu_device *ndev, struct npu_dump_header *dump);
void npu_coredump_submit(struct npu_device *ndev, struct npu_dump_header *dump);

/* npu_bo.c */
int npu_ioctl_bo_create(struct npu_context *ctx, void *data);
int npu_ioctl_bo_destroy(struct npu_context *ctx, void *data);
int npu_ioctl_bo_userptr(struct npu_context *ctx, void *data);
int npu_ioctl_bo_info(struct npu_context *ctx, void *data);
struct npu_bo *npu_bo_lookup(struct npu_context *ctx, u32 handle);
void npu_bo_put(struct npu_bo *bo);
struct npu_bo *npu_bo_create_kernel(struct npu_device *ndev, struct npu_vm *vm,
				    size_t size, void **vaddr);
int npu_bo_mmap(struct drm_file *file, struct vm_area_struct *vma);
void npu_bo_free_work(struct work_struct *work);
struct drm_gem_object *npu_gem_create_object(struct drm_device *drm, size_t size);
struct drm_gem_object *npu_gem_prime_import(struct drm_device *drm,
					    struct dma_buf *dmabuf);
u64 npu_ctx_mem_limit(void);

/* npu_job.c */
int npu_ioctl_submit(struct npu_context *ctx, void *data);
int npu_ioctl_wait(struct npu_context *ctx, void *data);
int npu_ioctl_fence_info(struct npu_context *ctx, void *data);
__poll_t npu_poll(struct npu_context *ctx, struct file *file,
		  struct poll_table_struct *wait);
ktime_t npu_deadline_left(s64 deadline_ns);
void npu_job_retire(struct npu_job *job);
void npu_context_put(struct npu_context *ctx);

/* npu_fence.c */
int npu_fence_init(struct npu_device *ndev);
void npu_fence_fini(struct npu_device *ndev);
int npu_job_get_deps(struct npu_context *ctx, struct npu_job *job,
		     const struct npu_submit *args);
void npu_job_push_deps(struct npu_queue *q, struct npu_job *job);
void npu_job_arm_deps(struct npu_job *job);
int npu_job_create_fence(struct npu_job *job);
void npu_job_signal(struct npu_job *job);

/* A SUBMIT's out syncobj: what it gets once the job is queued. */
struct npu_out_sync {
	struct drm_syncobj *syncobj;	/* holds a reference */
	struct dma_fence_chain *chain;	/* a timeline's next link, or NULL */
	u64 point;
};

int npu_out_sync_get(struct npu_context *ctx, const struct npu_submit *args,
		     struct npu_out_sync *out);
void npu_out_sync_signal(struct npu_out_sync *out, struct dma_fence *fence);
void npu_out_sync_put(struct npu_out_sync *out);

/* npu_pm.c */
extern const struct dev_pm_ops npu_pm_ops;
int npu_pm_get(struct npu_device *ndev);
void npu_pm_get_noresume(struct npu_device *ndev);
bool npu_pm_get_if_active(struct npu_device *ndev);
void npu_pm_put(struct npu_device *ndev);
void npu_pm_put_quiet(struct npu_device *ndev);
void npu_pm_init(struct npu_device *ndev);
void npu_pm_fini(struct npu_device *ndev);

/* npu_debugfs.c */
void npu_debugfs_init(struct npu_device *ndev);
void npu_debugfs_fini(struct npu_device *ndev);
void npu_debugfs_module_init(void);
void npu_debugfs_module_exit(void);

/* npu_perf.c */
void npu_perf_init(struct npu_device *ndev);
int npu_perf_read(struct npu_device *ndev, struct npu_perf_snap *snap);
u64 npu_perf_busy_ns(const struct npu_perf_snap *snap);

/* npu_fwtrace.c */
int npu_fwtrace_init(struct npu_device *ndev);
void npu_fwtrace_start(struct npu_device *ndev);
void npu_fwtrace_stop(struct npu_device *ndev);
void npu_fwtrace_fini(struct npu_device *ndev);
void npu_fwtrace_quiesce(struct npu_device *ndev);
void npu_fwtrace_free(struct npu_device *ndev);
void npu_fwtrace_kick(struct npu_device *ndev);
void npu_fwtrace_sync(struct npu_device *ndev);
void npu_fwtrace_drain(struct npu_device *ndev);
void npu_fwtrace_show(struct npu_device *ndev, struct seq_file *m);

/* npu_sysfs.c */
extern const struct attribute_group *npu_attr_groups[];

/* npu_drv.c: the module's workqueue (deferred BO frees), drained at unload */
extern struct workqueue_struct *npu_wq;

#endif /* NPU_DRV_H */
