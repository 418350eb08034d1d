/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * NPU ioctl ABI of the DRM accel device /dev/accel/accelN (udev links it as
 * /dev/npuN). docs/uapi.md is the prose version.
 *
 * Rules: every struct is a multiple of 8 bytes with explicit padding and the
 * same layout on 32- and 64-bit x86 (tests/host/test_abi_layout.py compiles
 * it with -m32 too), user pointers are __u64, reserved fields and unknown
 * flags must be zero (else -EINVAL), and everything a file descriptor
 * creates is released when it is closed. A struct may grow at its end in a
 * later version: DRM zero-fills what an older caller did not pass and copies
 * out only what it did, and a zero new field keeps the old behaviour.
 */
#ifndef NPU_UAPI_H
#define NPU_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

/*
 * Driver ioctls are DRM_IOWR(DRM_COMMAND_BASE + DRM_NPU_*, struct) of
 * <drm/drm.h>, spelled out here so that the header needs only
 * <linux/ioctl.h> (the driver checks both values against DRM's at build
 * time).
 */
#define NPU_DRM_IOCTL_BASE	'd'	/* DRM_IOCTL_BASE */
#define NPU_DRM_COMMAND_BASE	0x40	/* DRM_COMMAND_BASE */

/* Capability bits reported by GET_INFO (same values as NPU_CAP_* in hw). */
#define NPU_INFO_CAP_COPY	(1u << 0)
#define NPU_INFO_CAP_FILL	(1u << 1)
#define NPU_INFO_CAP_GEMM_FP32	(1u << 2)
#define NPU_INFO_CAP_MSIX	(1u << 3)
#define NPU_INFO_CAP_TIMESTAMPS	(1u << 4)
#define NPU_INFO_CAP_MMU	(1u << 5)
#define NPU_INFO_CAP_TENSOR	(1u << 6)
#define NPU_INFO_CAP_REDUCE	(1u << 7)
#define NPU_INFO_CAP_MATMUL	(1u << 8)
#define NPU_INFO_CAP_CONV	(1u << 9)
#define NPU_INFO_CAP_QUANT	(1u << 10)
#define NPU_INFO_CAP_LOCAL_MEM	(1u << 11)
#define NPU_INFO_CAP_POOL_GEOMETRY (1u << 12)	/* POOL2D end pads, dilation, ceil */
#define NPU_INFO_CAP_SELECT	(1u << 13)	/* SELECT */
#define NPU_INFO_CAP_STRIDED_OUT (1u << 14)	/* CONVERT into a strided output */
#define NPU_INFO_CAP_CONV_ACCUMULATE (1u << 15)	/* CONV2D adding into its output */
#define NPU_INFO_CAP_ACT_RELU6	(1u << 16)	/* the RELU6 activation */
#define NPU_INFO_CAP_CONCURRENT	(1u << 17)	/* NPU_TENSOR_OP_F_CONCURRENT */
#define NPU_INFO_CAP_PERF	(1u << 18)	/* device performance counters */
#define NPU_INFO_CAP_TRACE	(1u << 19)	/* device trace ring (npu_fw_event tracepoint) */

struct npu_info {
	__u32 hw_version;	/* out: major << 16 | minor */
	__u32 abi_version;	/* out: descriptor ABI of the device */
	__u32 driver_version;	/* out: major << 16 | minor */
	__u32 caps;		/* out: NPU_INFO_CAP_* */
	__u32 num_queues;	/* out */
	__u32 num_cores;	/* out */
	__u32 max_submit;	/* out: max ops per SUBMIT */
	__u32 ring_entries;	/* out: ring size of each queue */
	__u64 max_bo_size;	/* out: bytes */
	__u16 pci_vendor;	/* out */
	__u16 pci_device;	/* out */
	__u32 user_queues;	/* out: hardware queues QUEUE_CREATE can lend */
	__u64 device_memory;	/* out: bytes of device memory, 0: none */
	__u32 rsvd[2];		/* out: zero */
};

#define NPU_BO_MAX_SIZE		(1ull << 30)

/*
 * BO_CREATE flags. A device-memory BO lives in the device's own memory
 * (BAR2): the device reaches it without crossing the bus, and the process
 * maps it write-combined through the BAR. Without the flag a BO is host
 * memory, scatter-gather pages mapped for DMA.
 */
#define NPU_BO_DEVICE		(1u << 0)
#define NPU_BO_CREATE_FLAGS	NPU_BO_DEVICE

struct npu_bo_create {
	__u64 size;		/* in: bytes, 1..max_bo_size; rounded up to pages */
	__u32 flags;		/* in: NPU_BO_* */
	__u32 handle;		/* out: nonzero, per file descriptor */
	__u64 mmap_offset;	/* out: offset to pass to mmap() */
	__u64 alloc_size;	/* out: size after rounding */
	__u64 va;		/* out: device address in this file's address space */
};

struct npu_bo_destroy {
	__u32 handle;		/* in */
	__u32 rsvd;		/* must be zero */
};

/*
 * BO_USERPTR: make existing user memory a buffer object without a copy.
 * The pages are pinned until the BO's last reference goes; the BO cannot
 * be mmap()ed (the memory is already mapped where it came from).
 */
#define NPU_BO_USERPTR_READONLY	(1u << 0)	/* the device only reads it */
#define NPU_BO_USERPTR_FLAGS	NPU_BO_USERPTR_READONLY

struct npu_bo_userptr {
	__u64 addr;		/* in: page-aligned user address */
	__u64 size;		/* in: bytes, a page multiple, 1..max_bo_size */
	__u32 flags;		/* in: NPU_BO_USERPTR_* */
	__u32 handle;		/* out: nonzero, per file descriptor */
	__u64 va;		/* out: device address in this file's address space */
};

/*
 * BO_INFO: what this file knows of one of its handles, for a BO it did not
 * create itself (a dma-buf imported with DRM_IOCTL_PRIME_FD_TO_HANDLE).
 */
#define NPU_BO_INFO_DEVICE	(1u << 0)	/* device memory (NPU_BO_DEVICE) */
#define NPU_BO_INFO_USERPTR	(1u << 1)	/* from BO_USERPTR: no mmap */
#define NPU_BO_INFO_IMPORTED	(1u << 2)	/* an imported dma-buf */
#define NPU_BO_INFO_READONLY	(1u << 3)	/* the device only reads it */

struct npu_bo_info {
	__u32 handle;		/* in */
	__u32 flags;		/* in: zero; out: NPU_BO_INFO_* */
	__u64 size;		/* in: zero; out: bytes */
	__u64 mmap_offset;	/* in: zero; out: offset to pass to mmap(), 0 for userptr */
	__u64 va;		/* in: zero; out: device address in this file's space */
};

/*
 * QUEUE_CREATE: lend a hardware queue to this file (a user-mode queue).
 * The process writes struct npu_cmd descriptors (npu_hw.h) into the ring,
 * with device addresses of its own buffers (npu_bo_create.va) and ctx 0,
 * and rings the doorbell by storing the new free-running tail index at
 * offset 0 of the doorbell page. The device writes one struct npu_cpl per
 * slot and the last completed fence to the fence record. The queue's
 * commands can reach nothing but this file's buffers: any other address
 * faults, and then the queue stops and the file is marked faulted (its
 * SUBMITs and WAITs fail with -EBADFD). WAIT takes the queue's index.
 *
 * mmap offsets: the doorbell page at doorbell_offset (one page, write
 * only), the queue memory at mem_offset (mem_size bytes): the ring at 0,
 * the completion records at cpl_offset, the fence record at fence_offset.
 */
#define NPU_QUEUE_MIN_ENTRIES	16
#define NPU_QUEUE_MAX_ENTRIES	4096
#define NPU_QUEUE_PRIORITY_USER	1	/* above needs CAP_SYS_NICE */

struct npu_queue_create {
	__u32 entries;		/* in: ring entries, a power of two */
	__u32 priority;		/* in: 0..3, higher runs first */
	__u32 flags;		/* in: must be zero */
	__u32 queue;		/* out: queue index */
	__u64 mem_offset;	/* out: mmap offset of the queue memory */
	__u64 mem_size;		/* out: bytes */
	__u64 cpl_offset;	/* out: completion records, in the queue memory */
	__u64 fence_offset;	/* out: struct npu_fence_wb, in the queue memory */
	__u64 doorbell_offset;	/* out: mmap offset of the doorbell page */
};

struct npu_queue_destroy {
	__u32 queue;		/* in: from QUEUE_CREATE */
	__u32 rsvd;		/* must be zero */
};

/*
 * FENCE_INFO: when the device ran the op of a completed fence, from its
 * completion record. Records are kept for the last ring_entries fences of
 * the queue (until a device reset restarts the ring).
 */
struct npu_fence_info {
	__u64 fence;		/* in: a completed fence of the queue */
	__u32 queue;		/* in */
	__u32 status;		/* out: the op's device status (NPU_ST_*) */
	__u64 t_start;		/* out: device clock (ns) when the op started */
	__u64 t_end;		/* out: device clock (ns) when it completed */
};

/* A byte range of a buffer object. */
struct npu_buf_ref {
	__u32 handle;
	__u32 rsvd;		/* must be zero */
	__u64 offset;		/* bytes from the start of the BO */
	__u64 size;		/* bytes */
};

#define NPU_OP_MAX_BUFS		3
#define NPU_OP_MAX_PARAMS	8

/*
 * One operation of a SUBMIT. Buffers and params per opcode (docs/uapi.md):
 *   NOP:  none
 *   COPY: bufs[0] = src, bufs[1] = dst, equal sizes
 *   FILL: bufs[0] = dst (size multiple of 4), params[0] = 32-bit pattern
 *   GEMM: bufs[0..2] = A, B, C; params = m, n, k, lda, ldb, ldc, dtype, flags
 */
struct npu_op {
	__u16 opcode;		/* NPU_OP_* from npu_hw.h */
	__u16 flags;		/* must be zero */
	__u32 num_bufs;		/* buffers used by this op */
	struct npu_buf_ref bufs[NPU_OP_MAX_BUFS];
	__u32 params[NPU_OP_MAX_PARAMS];
	__u64 rsvd;		/* must be zero */
};

/*
 * A tensor operand of a tensor op: a strided view into a buffer object.
 * Dimensions at and above ndim must be zero; strides are in elements and 0
 * repeats an element (broadcasting). The furthest element must lie inside
 * the BO: offset + extent <= BO size, where extent =
 * (sum((shape[d] - 1) * strides[d]) + 1) * dtype size.
 */
struct npu_tensor_ref {
	__u32 handle;
	__u32 dtype;		/* enum npu_dtype */
	__u64 offset;		/* bytes from the start of the BO to element 0 */
	__u32 ndim;		/* 1..NPU_MAX_RANK */
	__u32 rsvd;		/* must be zero */
	__u32 shape[4];
	__u32 strides[4];
	__u64 rsvd2;		/* must be zero */
};

/*
 * A tensor op (ELTWISE to REQUANT, and SELECT): SUBMIT
 * takes an array of these when op_size == sizeof(struct npu_tensor_op).
 * Operands in the order of npu_hw.h (inputs, then the output); params as
 * npu_hw.h gives them per opcode; unused operands and params zero.
 */
/*
 * NPU_TENSOR_OP_F_CONCURRENT (needs NPU_INFO_CAP_CONCURRENT, else
 * -EOPNOTSUPP): the op does not depend on the ops before it in the same
 * SUBMIT back to the last op without the flag (it neither reads nor writes
 * what they write, nor writes what they read), so the device may run them
 * at the same time on different AI cores. Completion stays in order. A
 * job's first op never runs concurrently with an earlier job: the driver
 * clears the flag there.
 */
#define NPU_TENSOR_OP_F_CONCURRENT	(1u << 0)
#define NPU_TENSOR_OP_F_MASK		NPU_TENSOR_OP_F_CONCURRENT

struct npu_tensor_op {
	__u16 opcode;		/* NPU_OP_ELTWISE .. NPU_OP_REQUANT, NPU_OP_SELECT */
	__u16 flags;		/* NPU_TENSOR_OP_F_* */
	__u32 kind;		/* enum npu_*_kind of the opcode; 0 if it has none */
	struct npu_tensor_ref t[4];
	__u32 params[12];	/* per opcode (npu_hw.h); unused ones zero */
	__u64 rsvd;		/* must be zero */
};

#define NPU_SUBMIT_MAX_OPS	256

/*
 * A dependency of a SUBMIT: the job starts on the device only once it is
 * met. Without flags, a point of a DRM syncobj of this file (a timeline
 * point, or with point 0 the fence of a binary syncobj; it must have a
 * fence, else -EINVAL). With NPU_SYNC_USER_QUEUE, a fence value of one of
 * this file's user queues (handle: the queue index from QUEUE_CREATE), so
 * that SUBMIT work can follow user-queue work without a CPU round trip.
 */
#define NPU_SYNC_USER_QUEUE	(1u << 0)
#define NPU_SYNC_FLAGS		NPU_SYNC_USER_QUEUE

struct npu_sync {
	__u32 handle;		/* a syncobj handle, or a user queue index */
	__u32 flags;		/* NPU_SYNC_* */
	__u64 point;		/* timeline point or user-queue fence value */
};

#define NPU_SUBMIT_MAX_SYNCS	16

/*
 * Each op of a SUBMIT takes the next value of the queue's 64-bit fence
 * timeline (consecutive values); @fence returns the value of the last op.
 * Every dependency the device must wait for takes a value too, before the
 * ops. When the job is done its dma_fence signals (with an error if an op
 * failed), and @out_syncobj, if set, gets that fence: at @out_point of a
 * timeline syncobj, or as a binary syncobj's fence with @out_point 0.
 */
struct npu_submit {
	__u64 ops_ptr;		/* in: user pointer to the ops */
	__u32 num_ops;		/* in: 1..NPU_SUBMIT_MAX_OPS */
	__u32 queue;		/* in: queue index */
	__u32 flags;		/* in: must be zero */
	__u32 op_size;		/* in: sizeof(struct npu_op) or sizeof(struct npu_tensor_op) */
	__u64 fence;		/* out: fence value of the last op */
	__u64 in_syncs;		/* in: user pointer to struct npu_sync[num_in_syncs] */
	__u32 num_in_syncs;	/* in: 0..NPU_SUBMIT_MAX_SYNCS */
	__u32 out_syncobj;	/* in: syncobj handle to signal, 0: none */
	__u64 out_point;	/* in: its timeline point, 0: binary */
};

/*
 * The deadline is absolute (CLOCK_MONOTONIC, as DRM's syncobj waits), so a
 * WAIT interrupted by a signal is restarted with the same argument (or
 * fails with EINTR where the handler has no SA_RESTART). A deadline not in
 * the future polls. On -EIO, status and error_fence are still copied out.
 */
struct npu_wait {
	__u64 fence;		/* in: value to wait for */
	__s64 deadline_ns;	/* in: CLOCK_MONOTONIC time to give up at */
	__u32 queue;		/* in */
	__u32 flags;		/* in: must be zero */
	__u32 status;		/* out: device status of the failed op, if any */
	__u32 rsvd;		/* must be zero */
	__u64 error_fence;	/* out: fence of the failed op (-EIO) */
};

#define DRM_NPU_GET_INFO	0x00
#define DRM_NPU_BO_CREATE	0x01
#define DRM_NPU_BO_DESTROY	0x02
#define DRM_NPU_SUBMIT		0x03
#define DRM_NPU_WAIT		0x04
#define DRM_NPU_BO_USERPTR	0x05
#define DRM_NPU_FENCE_INFO	0x06
#define DRM_NPU_QUEUE_CREATE	0x07
#define DRM_NPU_QUEUE_DESTROY	0x08
#define DRM_NPU_BO_INFO		0x09

#define NPU_DRM_IOR(nr, type)	_IOR(NPU_DRM_IOCTL_BASE, NPU_DRM_COMMAND_BASE + (nr), type)
#define NPU_DRM_IOW(nr, type)	_IOW(NPU_DRM_IOCTL_BASE, NPU_DRM_COMMAND_BASE + (nr), type)
#define NPU_DRM_IOWR(nr, type)	_IOWR(NPU_DRM_IOCTL_BASE, NPU_DRM_COMMAND_BASE + (nr), type)

#define DRM_IOCTL_NPU_GET_INFO		NPU_DRM_IOR(DRM_NPU_GET_INFO, struct npu_info)
#define DRM_IOCTL_NPU_BO_CREATE		NPU_DRM_IOWR(DRM_NPU_BO_CREATE, struct npu_bo_create)
#define DRM_IOCTL_NPU_BO_DESTROY	NPU_DRM_IOW(DRM_NPU_BO_DESTROY, struct npu_bo_destroy)
#define DRM_IOCTL_NPU_SUBMIT		NPU_DRM_IOWR(DRM_NPU_SUBMIT, struct npu_submit)
#define DRM_IOCTL_NPU_WAIT		NPU_DRM_IOWR(DRM_NPU_WAIT, struct npu_wait)
#define DRM_IOCTL_NPU_BO_USERPTR	NPU_DRM_IOWR(DRM_NPU_BO_USERPTR, struct npu_bo_userptr)
#define DRM_IOCTL_NPU_FENCE_INFO	NPU_DRM_IOWR(DRM_NPU_FENCE_INFO, struct npu_fence_info)
#define DRM_IOCTL_NPU_QUEUE_CREATE	NPU_DRM_IOWR(DRM_NPU_QUEUE_CREATE, struct npu_queue_create)
#define DRM_IOCTL_NPU_QUEUE_DESTROY	NPU_DRM_IOW(DRM_NPU_QUEUE_DESTROY, struct npu_queue_destroy)
#define DRM_IOCTL_NPU_BO_INFO		NPU_DRM_IOWR(DRM_NPU_BO_INFO, struct npu_bo_info)

#endif /* NPU_UAPI_H */
