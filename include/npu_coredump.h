/* SPDX-License-Identifier: MIT */
/*
 * NPU device coredump: the binary format of the dump the driver hands to
 * devcoredump (/sys/class/devcoredump/devcdN/data, failing_device the NPU's
 * PCI device) when its watchdog resets the device: a command hung, the
 * firmware stopped, or a recovery failed and the device is gone for good.
 * It is the contract between kernel_module/npu_coredump.c, which writes
 * it, and runtime_py/npu/coredump.py (python3 -m npu.coredump), which
 * decodes it; docs/reliability.md describes when a dump is written.
 *
 * A dump is a struct npu_dump_header followed by header.num_sections
 * sections, each a struct npu_dump_section and its payload. Every
 * structure is a multiple of 8 bytes and naturally aligned, so each
 * section starts 8-aligned. All fields are little endian, like the device
 * structures a dump carries (struct npu_cmd); the driver, which fills both
 * in CPU order, runs on little-endian hosts only. Reserved fields are
 * zero. A decoder skips section types it does not know; a new field goes
 * into a reserved one or at the end of a payload, with a new version.
 */
#ifndef NPU_COREDUMP_H
#define NPU_COREDUMP_H

#include <linux/types.h>

#include "npu_hw.h"

#define NPU_DUMP_MAGIC		0x4455504e	/* "NPUD" at offset 0 */
#define NPU_DUMP_VERSION	1
#define NPU_DUMP_NO_QUEUE	0xffffffffu	/* npu_dump_header.queue: none */

/* Why the dump was written (npu_dump_header.reason and .cause). */
enum npu_dump_reason {
	NPU_DUMP_HANG		= 1,	/* a queue's command ran past hang_timeout_ms */
	NPU_DUMP_FW_LOST	= 2,	/* the firmware heartbeat stopped */
	NPU_DUMP_FATAL		= 3,	/* the recovery failed: the device is gone */
};

struct npu_dump_header {
	__u32 magic;		/* NPU_DUMP_MAGIC */
	__u32 version;		/* NPU_DUMP_VERSION */
	__u32 size;		/* bytes of the whole dump, this header included */
	__u32 num_sections;
	__u32 reason;		/* enum npu_dump_reason */
	/*
	 * What started the recovery: NPU_DUMP_HANG or NPU_DUMP_FW_LOST; the
	 * same as reason but for a FATAL dump.
	 */
	__u32 cause;
	__u32 queue;		/* the hardware queue that hung, or NPU_DUMP_NO_QUEUE */
	__u32 rsvd0;
	__u64 fence;		/* the hung command's fence on its queue, 0: none */
	__u64 client;		/* drm client id of the file it belongs to, 0: none */
	__u64 timestamp_ns;	/* CLOCK_MONOTONIC when the state was captured */
	__u32 hw_version;	/* NPU_REG_HW_VERSION */
	__u32 fw_version;	/* the firmware booted last: major << 16 | minor */
	__u32 driver_version;	/* the driver's: major << 16 | minor */
	__u32 rsvd1;
};

enum npu_dump_section_type {
	NPU_DUMP_SEC_REGS	= 1,	/* struct npu_dump_regs + npu_dump_reg[count] */
	NPU_DUMP_SEC_QUEUE	= 2,	/* struct npu_dump_queue: one per queue in use */
	NPU_DUMP_SEC_CMD	= 3,	/* struct npu_dump_cmd: the hung command */
	NPU_DUMP_SEC_FW_LOG	= 4,	/* struct npu_dump_fw_log + text */
};

struct npu_dump_section {
	__u32 type;		/* enum npu_dump_section_type */
	__u32 size;		/* payload bytes that follow, a multiple of 8 */
};

/*
 * NPU_DUMP_SEC_REGS: every device register of enum npu_reg but the
 * write-only NPU_REG_FW_CONTROL, then every NPU_Q_* register of each
 * hardware queue the driver uses (NPU_QREG(q, reg)), as read at one
 * moment. A dump has the registers read before the reset; a FATAL one
 * also those read after it failed.
 */
#define NPU_DUMP_BEFORE_RESET	0
#define NPU_DUMP_AFTER_RESET	1

struct npu_dump_regs {
	__u32 count;		/* struct npu_dump_reg that follow */
	__u32 when;		/* NPU_DUMP_BEFORE_RESET or NPU_DUMP_AFTER_RESET */
};

struct npu_dump_reg {
	__u32 offset;		/* in BAR0 */
	__u32 value;
};

/*
 * NPU_DUMP_SEC_QUEUE: a hardware queue in use before the reset: queue 0
 * (the driver's) and each queue lent to a file as a user queue.
 */
#define NPU_DUMP_Q_USER		(1u << 0)	/* a user queue */
#define NPU_DUMP_Q_STOPPED	(1u << 1)	/* the driver saw it stopped */
#define NPU_DUMP_Q_HUNG		(1u << 2)	/* its command hung (this or an earlier reset) */

struct npu_dump_queue {
	__u32 index;		/* hardware queue */
	__u32 flags;		/* NPU_DUMP_Q_* */
	__u32 head;		/* NPU_Q_HEAD: the command running or next */
	__u32 tail;		/* NPU_Q_TAIL */
	__u32 status;		/* NPU_Q_STATUS: NPU_QSTAT_* */
	__u32 error;		/* NPU_Q_ERROR: enum npu_dev_error */
	__u64 done;		/* NPU_Q_DONE: the last fence the device completed */
	__u64 next_fence;	/* queue 0: the last fence the driver handed out */
	/*
	 * Queue 0: the last fence the driver retired; a user queue: its
	 * fence write-back.
	 */
	__u64 completed;
	__u64 client;		/* a user queue: drm client id of its file */
	__u32 entries;		/* ring entries */
	__u32 rsvd;
};

/*
 * NPU_DUMP_SEC_CMD: the hung command as it is in its ring; for a tensor
 * op of queue 0, its parameter block from the owning file's arena.
 */
#define NPU_DUMP_CMD_PARAMS	(1u << 0)	/* params holds the op's block */

struct npu_dump_cmd {
	__u32 queue;		/* hardware queue */
	__u32 slot;		/* its ring index */
	__u32 flags;		/* NPU_DUMP_CMD_* */
	__u32 rsvd;
	struct npu_cmd cmd;
	struct npu_tensor_params params;	/* zero without NPU_DUMP_CMD_PARAMS */
};

/*
 * NPU_DUMP_SEC_FW_LOG: the newest bytes of the firmware log ring, oldest
 * first; length bytes of text follow, then zeros up to a multiple of 8.
 */
struct npu_dump_fw_log {
	__u32 length;		/* text bytes */
	__u32 written;		/* bytes the firmware wrote since its boot (mod 2^32) */
};

#endif /* NPU_COREDUMP_H */
