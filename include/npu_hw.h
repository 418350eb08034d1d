/* SPDX-License-Identifier: MIT */
/*
 * NPU hardware contract: PCI identity, BAR0 register map, command
 * descriptors and completion records shared by the QEMU device model
 * (qemu_device/) and the Linux driver (kernel_module/).
 *
 * All registers are 32 bits wide and little endian; all memory structures
 * are little endian. docs/npu-spec.md is the prose version of this file.
 */
#ifndef NPU_HW_H
#define NPU_HW_H

#include <linux/types.h>

/* PCI identity: QEMU's experimental vendor ID, class "processing accelerator". */
#define NPU_PCI_VENDOR_ID	0x1234
#define NPU_PCI_DEVICE_ID	0x4e50
#define NPU_PCI_REVISION	0x01
#define NPU_PCI_CLASS		0x1200

/* BARs */
#define NPU_BAR_REGS		0	/* MMIO registers + doorbell pages */
#define NPU_BAR_MEM		2	/* device memory: 64-bit, prefetchable */
#define NPU_BAR_MSIX		4	/* MSI-X table and PBA */
#define NPU_BAR0_SIZE		0x100000

#define NPU_MAGIC		0x4e505530	/* "NPU0" */
#define NPU_HW_VERSION		0x00010000	/* major << 16 | minor */
#define NPU_ABI_VERSION		1		/* descriptor/completion format */

/*
 * Hardware queues. Each has its registers, a doorbell page, an MSI-X vector
 * and a priority; the command processor runs one command at a time, from
 * the highest-priority queue with work, round-robin among equal priorities.
 */
#define NPU_NUM_QUEUES		8
#define NPU_MAX_QUEUES		16
#define NPU_RING_MAX_ENTRIES	65536
#define NPU_Q_PRIORITY_MAX	3

/* MSI-X vectors: 0 for device events, 1 + q for queue q completions. */
#define NPU_MSIX_VECTORS	(1 + NPU_NUM_QUEUES)
#define NPU_VEC_DEVICE		0
#define NPU_VEC_QUEUE(q)	(1 + (q))

/* Device-global registers (BAR0) */
enum npu_reg {
	NPU_REG_MAGIC		= 0x000,	/* RO: NPU_MAGIC */
	NPU_REG_HW_VERSION	= 0x004,	/* RO */
	NPU_REG_ABI_VERSION	= 0x008,	/* RO */
	NPU_REG_CAPS		= 0x00c,	/* RO: NPU_CAP_* */
	NPU_REG_NUM_QUEUES	= 0x010,	/* RO */
	NPU_REG_NUM_CORES	= 0x014,	/* RO */
	NPU_REG_MAX_RING	= 0x018,	/* RO: max ring entries */
	NPU_REG_STATUS		= 0x020,	/* RO: NPU_STATUS_* */
	NPU_REG_CONTROL		= 0x024,	/* RW: NPU_CONTROL_* */
	NPU_REG_IRQ_STATUS	= 0x028,	/* RW1C: NPU_IRQ_* */
	NPU_REG_IRQ_MASK	= 0x02c,	/* RW: 1 = enabled */
	NPU_REG_ERROR		= 0x030,	/* RO: last device error (NPU_ERR_*) */
	NPU_REG_TIMESTAMP_LO	= 0x038,	/* RO: device clock, ns */
	NPU_REG_TIMESTAMP_HI	= 0x03c,	/* RO: latched by a TIMESTAMP_LO read */
	NPU_REG_SCRATCH		= 0x040,	/* RW: no side effects */
	/* Device MMU; configuration writable only while CONTROL.ENABLE = 0. */
	NPU_REG_MMU_CONTROL	= 0x050,	/* RW: NPU_MMU_ENABLE */
	NPU_REG_MMU_L1_LO	= 0x054,	/* RW: L1 table DMA address, 4 KiB aligned */
	NPU_REG_MMU_L1_HI	= 0x058,
	NPU_REG_MMU_L1_ENTRIES	= 0x05c,	/* RW: 1..NPU_MMU_MAX_L1 */
	NPU_REG_MMU_FAULT_LO	= 0x060,	/* RO: last faulting device address */
	NPU_REG_MMU_FAULT_HI	= 0x064,
	NPU_REG_MMU_FAULT_INFO	= 0x068,	/* RO: NPU_FAULT_* of the last fault */
	NPU_REG_MMU_FAULTS	= 0x06c,	/* RO: faults since reset */
	NPU_REG_MMU_FAULT_QUEUE	= 0x070,	/* RO: queue of the last fault */
	/* Context table: the address spaces descriptors select by npu_cmd.ctx */
	NPU_REG_MMU_CTX_LO	= 0x074,	/* RW: table DMA address, 4 KiB aligned */
	NPU_REG_MMU_CTX_HI	= 0x078,
	NPU_REG_MMU_CTX_COUNT	= 0x07c,	/* RW: entries, 0..NPU_MMU_MAX_CTX */
	NPU_REG_MMU_FAULT_CTX	= 0x080,	/* RO: npu_cmd.ctx of the last fault */
	NPU_REG_MEM_SIZE_LO	= 0x084,	/* RO: device memory bytes (BAR2), 0: none */
	NPU_REG_MEM_SIZE_HI	= 0x088,
	NPU_REG_INJECT		= 0x090,	/* RW: NPU_INJECT_* armed, self-clearing */
	/* Firmware (npu_fw.h describes the image) */
	NPU_REG_FW_ADDR_LO	= 0x0a0,	/* RW: image DMA address */
	NPU_REG_FW_ADDR_HI	= 0x0a4,
	NPU_REG_FW_SIZE		= 0x0a8,	/* RW: image bytes, up to NPU_FW_MAX_SIZE */
	NPU_REG_FW_CONTROL	= 0x0ac,	/* WO: NPU_FW_BOOT */
	NPU_REG_FW_STATUS	= 0x0b0,	/* RO: enum npu_fw_state */
	NPU_REG_FW_ERROR	= 0x0b4,	/* RO: enum npu_fw_error of a failed boot */
	NPU_REG_FW_VERSION	= 0x0b8,	/* RO: major << 16 | minor of the running image */
	NPU_REG_FW_HEARTBEAT	= 0x0bc,	/* RO: counts while the firmware runs */
	/* Mailbox: one request at a time; writing MBOX_SEQ sends it */
	NPU_REG_MBOX_CMD	= 0x0c0,	/* RW: enum npu_mbox_cmd */
	NPU_REG_MBOX_ARG0	= 0x0c4,	/* RW */
	NPU_REG_MBOX_ARG1	= 0x0c8,	/* RW */
	NPU_REG_MBOX_SEQ	= 0x0cc,	/* RW: request sequence number */
	NPU_REG_MBOX_RESP_SEQ	= 0x0d0,	/* RO: sequence number answered last */
	NPU_REG_MBOX_RESP_STATUS = 0x0d4,	/* RO: enum npu_mbox_status */
	NPU_REG_MBOX_RESP0	= 0x0d8,	/* RO */
	NPU_REG_MBOX_RESP1	= 0x0dc,	/* RO */
	/* Firmware log ring in host memory (struct npu_fw_log + text) */
	NPU_REG_FW_LOG_LO	= 0x0e0,	/* RW: DMA address, 8-byte aligned, 0: none */
	NPU_REG_FW_LOG_HI	= 0x0e4,
	NPU_REG_FW_LOG_SIZE	= 0x0e8,	/* RW: text bytes, power of two, 256..1 MiB */
	NPU_REG_TIMING		= 0x0f0,	/* RO: enum npu_timing of the device */
};

/*
 * Timing mode (the device's "timing" property): NATIVE, commands take the
 * host's compute time; otherwise the time the named chip description's
 * roofline gives (docs/npu-spec.md 12.2), on the device clock.
 */
enum npu_timing {
	NPU_TIMING_NATIVE	= 0,
	NPU_TIMING_EDGE		= 1,
	NPU_TIMING_DATACENTER	= 2,
	NPU_TIMING_COUNT,
};

/*
 * Firmware. Until an image boots (FW_STATUS = RUNNING) the device runs no
 * command. The driver writes the image's DMA address and size and
 * NPU_FW_BOOT; the device reads the image once, validates it (npu_fw.h)
 * and runs it, or reports FAILED with FW_ERROR. NPU_FW_STOP turns the
 * firmware off (the driver does it when it lets go). A soft reset keeps a
 * running firmware; a crashed one (or a PCI reset) leaves FW_STATUS OFF
 * until the driver boots an image again. The firmware's heartbeat
 * counter advances every heartbeat period of device time while it runs.
 */
#define NPU_FW_BOOT		(1u << 0)
#define NPU_FW_STOP		(1u << 1)	/* stop a running (or crashed) firmware */
#define NPU_FW_MAX_SIZE		(1u << 20)

enum npu_fw_state {
	NPU_FW_OFF		= 0,
	NPU_FW_RUNNING		= 1,
	NPU_FW_FAILED		= 2,	/* the last boot failed: FW_ERROR says why */
	NPU_FW_CRASHED		= 3,	/* stopped: no heartbeat, no work, no mailbox */
};

enum npu_fw_error {
	NPU_FWERR_NONE		= 0,
	NPU_FWERR_DMA		= 1,	/* the image could not be read */
	NPU_FWERR_SIZE		= 2,	/* size 0, above the maximum or not the header's */
	NPU_FWERR_MAGIC		= 3,
	NPU_FWERR_ABI		= 4,	/* built for another descriptor ABI */
	NPU_FWERR_CHECKSUM	= 5,	/* header or payload CRC-32 mismatch */
	NPU_FWERR_FORMAT	= 6,	/* malformed or unknown mandatory section */
};

/*
 * Mailbox commands. The firmware answers each request (MBOX_RESP_SEQ =
 * MBOX_SEQ, status, two result words) and raises NPU_IRQ_MBOX; a crashed
 * or absent firmware does not answer.
 *   PING            resp0 = arg0 + 1, resp1 = heartbeat
 *   QUERY           resp0 = commands completed (low 32 bits), resp1 = log level
 *   SET_LOG_LEVEL   arg0 = 0 (errors) .. 3 (debug)
 *   RESET_QUEUE     arg0 = queue: disable it and clear its state and error;
 *                   BUSY while a command of it runs
 *   CREATE_QUEUE    arg0 = queue, arg1 = priority: enter the queue in the
 *                   firmware's scheduler (it runs only queues it created;
 *                   a boot creates queue 0, a ROM firmware all of them)
 *   DESTROY_QUEUE   arg0 = queue: take it out and reset it; BUSY while a
 *                   command of it runs
 * A soft reset leaves a running firmware with queue 0 created only.
 */
enum npu_mbox_cmd {
	NPU_MBOX_PING		= 1,
	NPU_MBOX_QUERY		= 2,
	NPU_MBOX_SET_LOG_LEVEL	= 3,
	NPU_MBOX_RESET_QUEUE	= 4,
	NPU_MBOX_CREATE_QUEUE	= 5,
	NPU_MBOX_DESTROY_QUEUE	= 6,
};

enum npu_mbox_status {
	NPU_MBOX_OK		= 0,
	NPU_MBOX_UNKNOWN	= 1,	/* no such command */
	NPU_MBOX_BAD_ARG	= 2,
	NPU_MBOX_BUSY		= 3,
};

/* Head of the firmware log ring: text follows, written round the ring. */
struct npu_fw_log {
	__u32 write;		/* free-running byte count written */
	__u32 size;		/* ring bytes (copy of FW_LOG_SIZE) */
};

/*
 * Fault injection (NPU_REG_INJECT): write 1 to arm a fault for the next
 * command the device starts (or the next completion interrupt); the bit
 * clears when the fault fires.
 *   HANG       the command never completes: the command processor stops
 *              (the queue stays ACTIVE) until a soft or PCI reset.
 *   HW_ERROR   the command completes with NPU_ST_HW_ERROR without running
 *              (an uncorrectable memory error).
 *   DROP_IRQ   the next completion interrupt is not signalled (the status
 *              and the fence write-back still are).
 *   DMA_FAULT  the command completes with NPU_ST_DMA_ERROR without running.
 *   FW_CRASH   fires on the write: the firmware stops (FW_STATUS CRASHED,
 *              heartbeat frozen, mailbox silent, no commands run).
 */
#define NPU_INJECT_HANG		(1u << 0)
#define NPU_INJECT_HW_ERROR	(1u << 1)
#define NPU_INJECT_DROP_IRQ	(1u << 2)
#define NPU_INJECT_DMA_FAULT	(1u << 3)
#define NPU_INJECT_FW_CRASH	(1u << 4)	/* the firmware crashes at once */
#define NPU_INJECT_MASK		0x1fu

#define NPU_CAP_COPY		(1u << 0)
#define NPU_CAP_FILL		(1u << 1)
#define NPU_CAP_GEMM_FP32	(1u << 2)
#define NPU_CAP_MSIX		(1u << 3)
#define NPU_CAP_TIMESTAMPS	(1u << 4)
#define NPU_CAP_MMU		(1u << 5)
#define NPU_CAP_TENSOR		(1u << 6)	/* ELTWISE, UNARY, CONVERT */
#define NPU_CAP_REDUCE		(1u << 7)	/* REDUCE, SOFTMAX, LAYERNORM */
#define NPU_CAP_MATMUL		(1u << 8)	/* MATMUL, LINEAR */
#define NPU_CAP_CONV		(1u << 9)	/* CONV2D, POOL2D */
#define NPU_CAP_QUANT		(1u << 10)	/* int8 MATMUL/LINEAR/CONV2D, REQUANT */
#define NPU_CAP_LOCAL_MEM	(1u << 11)	/* device memory in BAR2 */
#define NPU_CAP_POOL_GEOMETRY	(1u << 12)	/* POOL2D end pads, dilation, ceil */
#define NPU_CAP_SELECT		(1u << 13)	/* SELECT */
#define NPU_CAP_STRIDED_OUT	(1u << 14)	/* CONVERT into a strided output */
#define NPU_CAP_CONV_ACCUMULATE	(1u << 15)	/* CONV2D adding into its output */
#define NPU_CAP_ACT_RELU6	(1u << 16)	/* NPU_ACT_RELU6 */
#define NPU_CAP_CONCURRENT	(1u << 17)	/* NPU_CMD_F_CONCURRENT */
#define NPU_CAP_PERF		(1u << 18)	/* performance counters (NPU_PERF_*) */
#define NPU_CAP_TRACE		(1u << 19)	/* trace ring (NPU_TRACE_*) */

#define NPU_STATUS_READY	(1u << 0)	/* out of reset, registers usable */
#define NPU_STATUS_ENABLED	(1u << 1)	/* CONTROL.ENABLE is in effect */
#define NPU_STATUS_RESETTING	(1u << 2)	/* soft reset still draining */
#define NPU_STATUS_ERROR	(1u << 3)	/* a queue stopped on an error */

#define NPU_CONTROL_ENABLE	(1u << 0)
#define NPU_CONTROL_RESET	(1u << 1)	/* write 1: soft reset, self-clearing */

/*
 * Device MMU. With NPU_MMU_ENABLE set, every buffer address in a descriptor
 * is a device virtual address (VA), translated by a two-level table:
 *   L1[va >> 21] -> L2 table (one 4 KiB page of 512 PTEs)
 *   L2[(va >> 12) & 511] -> 4 KiB page
 * The VA space is NPU_MMU_L1_ENTRIES * 2 MiB. Entries are little-endian
 * __u64: bus address of the next level / page in bits 63..12, flags below.
 * A PTE with NPU_PTE_LOCAL holds an offset into the device memory
 * (BAR2) instead of a bus address: the device reaches it directly, not
 * over the bus; an offset at or past the memory's end faults
 * (NPU_FAULT_LOCAL).
 * Ring, completion and fence addresses are always bus addresses.
 * With the MMU disabled, descriptor addresses are bus addresses.
 */
#define NPU_MMU_ENABLE		(1u << 0)
#define NPU_PAGE_SHIFT		12
#define NPU_PAGE_SIZE		(1u << NPU_PAGE_SHIFT)
#define NPU_MMU_L1_SHIFT	21
#define NPU_MMU_L2_ENTRIES	512
#define NPU_MMU_MAX_L1		4096		/* 8 GiB of VA */
#define NPU_PTE_VALID		(1ull << 0)
#define NPU_PTE_WRITE		(1ull << 1)
#define NPU_PTE_LOCAL		(1ull << 2)	/* the page is in device memory */
#define NPU_PTE_ADDR_MASK	(~0xfffull)

#define NPU_FAULT_WRITE		(1u << 0)	/* the access was a write */
#define NPU_FAULT_L1		(1u << 1)	/* no L1 entry (else no PTE) */
#define NPU_FAULT_PERM		(1u << 2)	/* write to a read-only page */
#define NPU_FAULT_RANGE		(1u << 3)	/* VA beyond the L1 table */
#define NPU_FAULT_CTX		(1u << 4)	/* npu_cmd.ctx names no address space */
#define NPU_FAULT_LOCAL		(1u << 5)	/* local PTE beyond the device memory */

/*
 * Context table (NPU_REG_MMU_CTX_*, writable while CONTROL.ENABLE = 0):
 * entry c is the address space of descriptors with npu_cmd.ctx = c on a
 * queue without an address space of its own. The device reads the entry
 * when such a command starts, so the driver may fill and clear entries
 * while the device runs (not those of commands in flight). Entry 0 is
 * never read: ctx 0 selects the device-wide table.
 */
#define NPU_MMU_MAX_CTX		4096

struct npu_mmu_ctx_entry {
	__u64 l1;		/* L1 table bus address | NPU_PTE_VALID */
	__u32 l1_entries;	/* 1..NPU_MMU_MAX_L1 */
	__u32 rsvd;		/* zero */
};

#define NPU_IRQ_QUEUE(q)	(1u << (q))	/* queue q completed a command */
#define NPU_IRQ_MBOX		(1u << 30)	/* the firmware answered the mailbox */
#define NPU_IRQ_ERROR		(1u << 31)	/* a queue stopped: see NPU_REG_ERROR */

/* Per-queue register block: NPU_QREG_BASE + q * NPU_QREG_STRIDE + reg */
#define NPU_QREG_BASE		0x1000
#define NPU_QREG_STRIDE		0x100
#define NPU_QREG(q, reg)	(NPU_QREG_BASE + (q) * NPU_QREG_STRIDE + (reg))

enum npu_qreg {
	NPU_Q_RING_LO		= 0x00,	/* RW: ring DMA address, 64-byte aligned */
	NPU_Q_RING_HI		= 0x04,
	NPU_Q_RING_SIZE		= 0x08,	/* RW: entries, power of two */
	NPU_Q_CONTROL		= 0x0c,	/* RW: NPU_QCTL_* */
	/* Written while disabled: where the next enable starts head and tail */
	NPU_Q_HEAD		= 0x10,	/* free-running consumer index */
	NPU_Q_TAIL		= 0x14,	/* RW: free-running producer index; doorbell */
	NPU_Q_CPL_LO		= 0x18,	/* RW: completion ring DMA address */
	NPU_Q_CPL_HI		= 0x1c,
	NPU_Q_FENCE_LO		= 0x20,	/* RW: fence write-back address, 0 = none */
	NPU_Q_FENCE_HI		= 0x24,
	NPU_Q_STATUS		= 0x28,	/* RO: NPU_QSTAT_* */
	NPU_Q_ERROR		= 0x2c,	/* RO: NPU_ERR_* that stopped the queue */
	NPU_Q_DONE_LO		= 0x30,	/* RO: last completed fence value */
	NPU_Q_DONE_HI		= 0x34,
	NPU_Q_PRIORITY		= 0x38,	/* RW: 0..NPU_Q_PRIORITY_MAX, higher first */
	/* Interrupt moderation of the queue's completion interrupt */
	NPU_Q_IRQ_COUNT		= 0x40,	/* RW: signal every Nth (0, 1: each) */
	NPU_Q_IRQ_DELAY		= 0x44,	/* RW: or after this many us (0: none) */
	NPU_Q_IRQS		= 0x48,	/* RO: completion interrupts signalled */
	/*
	 * RO, free-running (a reset keeps it): moves while the queue's
	 * command is not stuck: +1 when a command of the queue starts, at
	 * every control point it passes, and for every command that runs
	 * while it is preempted. A watchdog that sees HEAD and Q_PROGRESS
	 * unchanged for its timeout, with the queue ACTIVE, saw a hang.
	 */
	NPU_Q_PROGRESS		= 0x4c,
	/*
	 * The queue's own address space: with Q_MMU_L1_ENTRIES != 0 its
	 * commands translate through this L1 table instead of the device-wide
	 * one (writable only while the queue is disabled). Such a queue is
	 * confined: a descriptor with npu_cmd.ctx != 0 faults (NPU_FAULT_CTX),
	 * and after a command that faulted the queue stops with
	 * NPU_ERR_MMU_FAULT.
	 */
	NPU_Q_MMU_L1_LO		= 0x50,	/* RW: L1 table DMA address, 4 KiB aligned */
	NPU_Q_MMU_L1_HI		= 0x54,
	NPU_Q_MMU_L1_ENTRIES	= 0x58,	/* RW: 0 (device-wide MMU), 1..NPU_MMU_MAX_L1 */
};

#define NPU_IRQ_COUNT_MAX	65536
#define NPU_IRQ_DELAY_MAX	1000000	/* us */

#define NPU_QCTL_ENABLE		(1u << 0)

#define NPU_QSTAT_IDLE		(1u << 0)	/* head == tail */
#define NPU_QSTAT_STOPPED	(1u << 1)	/* stopped on an error (Q_ERROR) */
#define NPU_QSTAT_ACTIVE	(1u << 2)	/* a command of the queue is running */
#define NPU_QSTAT_WAITING	(1u << 3)	/* its head is a WAIT not satisfied yet */

/*
 * Doorbell pages: writing a new TAIL value to offset 0 of page q is the same
 * as writing NPU_Q_TAIL of queue q. One page per queue so that a page can be
 * mapped into one process.
 */
#define NPU_DOORBELL_BASE	0x10000
#define NPU_DOORBELL_STRIDE	0x1000
#define NPU_DOORBELL(q)		(NPU_DOORBELL_BASE + (q) * NPU_DOORBELL_STRIDE)

/*
 * Performance counters (NPU_CAP_PERF), a block at NPU_PERF_BASE. The
 * device counts all the time; a write of NPU_PERF_SNAPSHOT to
 * NPU_PERF_CONTROL copies every count into the registers of the block at
 * once (one consistent set, with the device clock of that moment), and
 * NPU_PERF_RESET starts every count again from 0. Counts are 64-bit
 * LO/HI pairs: per queue at NPU_PERF_Q(q, counter), per AI core at
 * NPU_PERF_CORE(k).
 */
#define NPU_PERF_BASE		0x20000
#define NPU_PERF_SIZE		0x1000

enum npu_perf_reg {
	NPU_PERF_CONTROL	= 0x000,	/* WO: NPU_PERF_SNAPSHOT, NPU_PERF_RESET */
	NPU_PERF_TIME_LO	= 0x008,	/* RO: device clock at the snapshot, ns */
	NPU_PERF_TIME_HI	= 0x00c,
	NPU_PERF_SNAPSHOTS	= 0x010,	/* RO: snapshots taken since reset */
};

#define NPU_PERF_SNAPSHOT	(1u << 0)
#define NPU_PERF_RESET		(1u << 1)

/* Per queue: NPU_PERF_Q_BASE + q * NPU_PERF_Q_STRIDE + counter * 8 */
#define NPU_PERF_Q_BASE		0x100
#define NPU_PERF_Q_STRIDE	0x40
#define NPU_PERF_Q(q, c)	(NPU_PERF_Q_BASE + (q) * NPU_PERF_Q_STRIDE + (c) * 8)

enum npu_perf_counter {
	NPU_PERF_CMDS		= 0,	/* commands completed */
	NPU_PERF_BUSY_NS	= 1,	/* their t_end - t_start, summed */
	NPU_PERF_MACS		= 2,	/* multiply-adds of GEMM, MATMUL, LINEAR, CONV2D */
	NPU_PERF_READ_BYTES	= 3,	/* operand bytes the engine read */
	NPU_PERF_WRITE_BYTES	= 4,	/* operand bytes the engine wrote */
	NPU_PERF_WALKS		= 5,	/* pages the MMU translated */
	NPU_PERF_WALK_HITS	= 6,	/* ... with their L2 table already held */
	NPU_PERF_WAIT_NS	= 7,	/* a completed WAIT's time blocked */
	NPU_PERF_COUNTERS,
};

/* Per AI core k: busy ns (running tiles or a group member), LO/HI */
#define NPU_PERF_CORE_BASE	0x400
#define NPU_PERF_CORE(k)	(NPU_PERF_CORE_BASE + (k) * 8)

/*
 * Trace ring (NPU_CAP_TRACE), a block at NPU_TRACE_BASE. While
 * NPU_TRACE_ENABLE is set, the firmware's scheduler and the engines log
 * what they do (enum npu_trace_kind, those whose bit is set in
 * NPU_TRACE_MASK) as struct npu_trace_rec records, with the device clock,
 * into a ring in host memory: record HEAD mod RING_SIZE is written next,
 * HEAD counts the records written (free running), the driver writes TAIL
 * as it consumes them. A record that finds the ring full (HEAD - TAIL =
 * RING_SIZE) is dropped and counted in DROPPED. The ring's address and
 * size may change only while tracing is off. A soft reset keeps the ring
 * and its indices; a system reset or D3hot turns tracing off and clears
 * them.
 */
#define NPU_TRACE_BASE		0x21000
#define NPU_TRACE_SIZE		0x1000

enum npu_trace_reg {
	NPU_TRACE_CONTROL	= 0x000,	/* RW: NPU_TRACE_ENABLE */
	NPU_TRACE_RING_LO	= 0x004,	/* RW: ring DMA address, 32-byte aligned */
	NPU_TRACE_RING_HI	= 0x008,
	NPU_TRACE_RING_SIZE	= 0x00c,	/* RW: records, power of two */
	NPU_TRACE_HEAD		= 0x010,	/* RO: records written */
	NPU_TRACE_TAIL		= 0x014,	/* RW: records the driver consumed */
	NPU_TRACE_DROPPED	= 0x018,	/* RO: records lost to a full ring */
	NPU_TRACE_MASK		= 0x01c,	/* RW: 1 << kind: kinds logged */
};

#define NPU_TRACE_ENABLE	(1u << 0)
#define NPU_TRACE_MIN_RECORDS	16
#define NPU_TRACE_MAX_RECORDS	65536

/* What a trace record says happened; queue, core and fence name where. */
enum npu_trace_kind {
	NPU_TR_FETCH		= 1,	/* descriptor fetched; arg32 = opcode */
	NPU_TR_DISPATCH		= 2,	/* a group member sent to AI core @core */
	NPU_TR_CMD_START	= 3,	/* a command started on @core */
	NPU_TR_CMD_END		= 4,	/* ... ended; arg32 = enum npu_status, arg =
					 * a timing model's roofline: compute ns
					 * (bits 31..0), memory ns (63..32); else 0
					 */
	NPU_TR_TILE_START	= 5,	/* a tile started on @core; arg = tile */
	NPU_TR_TILE_END		= 6,	/* ... ended; arg32 = enum npu_status */
	NPU_TR_DMA_START	= 7,	/* a transfer; arg32 = 1 write, 0 read; arg = bytes */
	NPU_TR_DMA_END		= 8,
	NPU_TR_CPL_WRITE	= 9,	/* completion record and fence written */
	NPU_TR_IRQ		= 10,	/* interrupt signalled: arg32 = MSI-X vector,
					 * or NPU_TRACE_INTX
					 */
	NPU_TR_MBOX_REQ		= 11,	/* mailbox request; arg32 = cmd, arg = seq */
	NPU_TR_MBOX_REPLY	= 12,	/* ... answered; arg32 = status, arg = seq */
	NPU_TR_KINDS,
};

#define NPU_TRACE_CORE_CP	0xff	/* @core: the command processor */
#define NPU_TRACE_NO_QUEUE	0xff	/* @queue: not a queue's (mailbox) */
#define NPU_TRACE_INTX		0xffffffffu	/* IRQ's arg32: INTx, no vector */

/* One trace record, 32 bytes, little-endian. */
struct npu_trace_rec {
	__le64 ts;		/* device clock, ns */
	__le16 kind;		/* enum npu_trace_kind */
	__u8 queue;
	__u8 core;
	__le32 arg32;
	__le64 fence;		/* the command's fence (0: none) */
	__le64 arg;
};

/* Opcodes */
enum npu_opcode {
	NPU_OP_NOP	= 0,
	NPU_OP_COPY	= 1,
	NPU_OP_FILL	= 2,
	NPU_OP_GEMM	= 3,
	NPU_OP_ELTWISE	= 4,	/* out = a <kind> b; size-1 dims broadcast, same rank */
	NPU_OP_UNARY	= 5,	/* out = kind(in) */
	NPU_OP_CONVERT	= 6,	/* out = in, any strides, any dtypes */
	NPU_OP_REDUCE	= 7,	/* out = kind over params[0]'s axes of in */
	NPU_OP_SOFTMAX	= 8,	/* out = (log-)softmax of in along params[0] */
	NPU_OP_LAYERNORM = 9,	/* out = norm(in) * gamma + beta */
	NPU_OP_MATMUL	= 10,	/* out = act(a @ b), batched */
	NPU_OP_LINEAR	= 11,	/* out = act(a @ b + bias), batched */
	NPU_OP_CONV2D	= 12,	/* out = act(conv2d(in, weight) + bias), NCHW */
	NPU_OP_POOL2D	= 13,	/* out = max/avg pool of in, NCHW */
	NPU_OP_REQUANT	= 14,	/* int8 out = clamp(rne(acc * scale) + zp) */
	NPU_OP_SIGNAL	= 15,	/* store sync.value (u64) at sync.va */
	NPU_OP_WAIT	= 16,	/* hold the queue until the u64 at sync.va >= sync.value */
	NPU_OP_SELECT	= 17,	/* out = cond ? x : y, per element */
	NPU_OP_COUNT,
};

/*
 * CONVERT: t[0] = in, t[1] = out, one shape, any dtypes (conversions as
 * docs/npu-spec.md gives them). The output is row-major and dense (as
 * every other op's), or, with NPU_CAP_STRIDED_OUT,
 * any strided view in which no two elements share an address (a
 * non-overlapping view: sorted by stride, each dimension of size > 1
 * steps past the extent of the smaller ones). A strided output writes
 * only its elements; the bytes between them keep their values.
 *
 * SELECT (NPU_CAP_SELECT): t[0] = cond BOOL, t[1] = x, t[2] = y,
 * t[3] = out (contiguous); x, y and out share one dtype (any), and cond,
 * x and y broadcast to out (size-1 dims, same rank). out = cond ? x : y
 * elementwise, copying the chosen element's bits (NaN payloads and
 * signed zeros kept); a nonzero cond byte is true. kind and params 0.
 */

/*
 * CONV2D: t[0] = in [N, C, H, W], t[1] = weight [O, C / groups, KH, KW],
 * t[2] = bias [1, O, 1, 1], t[3] = out [N, O, OH, OW]; one float dtype,
 * fp32 accumulation; kind = enum npu_act_kind. params: stride_h, stride_w,
 * pad_h, pad_w, dilation_h, dilation_w, groups (strides, dilations and
 * groups >= 1, pads <= NPU_MAX_PAD; groups divide C and O), with
 * OH = (H + 2 * pad_h - dilation_h * (KH - 1) - 1) / stride_h + 1 >= 1,
 * and OW likewise. Padding reads zeros. params[8] = flags: with
 * NPU_CONV_F_ACCUMULATE (float only, needs NPU_CAP_CONV_ACCUMULATE) the
 * values out holds before the op are added too, before the activation:
 * out = act(conv2d(in, weight) + bias + out), a fused residual add.
 */
#define NPU_CONV_P_STRIDE_H	0
#define NPU_CONV_P_STRIDE_W	1
#define NPU_CONV_P_PAD_H	2
#define NPU_CONV_P_PAD_W	3
#define NPU_CONV_P_DIL_H	4
#define NPU_CONV_P_DIL_W	5
#define NPU_CONV_P_GROUPS	6
#define NPU_CONV_P_IN_ZP	7	/* int8 only: input zero point */
#define NPU_CONV_P_FLAGS	8
#define NPU_CONV_F_ACCUMULATE	(1u << 0)	/* out += the result, before act */
#define NPU_CONV_F_MASK		0x1u
#define NPU_MAX_PAD		65535

/*
 * Integer MATMUL, LINEAR and CONV2D (NPU_CAP_QUANT): a and b (in and
 * weight) INT8, bias INT32, out INT32 or INT8. The products of
 * (a - in_zp) and b are summed exactly in int32 (two's complement, wraps
 * past 32 bits); the bias is added in int32, RELU clamps at 0, and an
 * INT8 output keeps the low 8 bits (numpy's wrap-around). GELU is
 * rejected. in_zp (NPU_MM_P_IN_ZP, NPU_CONV_P_IN_ZP) is a signed value
 * in -128..127 stored as a 32-bit two's complement word; it must be 0
 * for float operands. CONV2D padding reads in_zp (0 after subtraction).
 */
#define NPU_MM_P_IN_ZP		0
#define NPU_ZP_MIN		(-128)
#define NPU_ZP_MAX		127

/*
 * REQUANT: t[0] = acc INT32, t[1] = scale FP32, t[2] = out INT8; acc and
 * out have one shape, scale broadcasts to it (size-1 dims: per-tensor
 * when all are 1, per-channel along the one that is not). params[0] =
 * out_zp (-128..127, two's complement word); kind = NPU_ACT_NONE or
 * NPU_ACT_RELU. out = clamp(rne(acc * scale) + out_zp, lo, 127) where
 * rne rounds the exact product to the nearest integer, ties to even, and
 * lo = -128, or out_zp with RELU. Every scale element the op reads must
 * be a finite fp32 above zero, else the device completes the op with
 * NPU_ST_BAD_QUANT before writing anything.
 */
#define NPU_REQUANT_P_OUT_ZP	0

/*
 * POOL2D: t[0] = in [N, C, H, W], t[1] = out [N, C, OH, OW]; one float
 * dtype. params: kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,
 * flags, then (with NPU_POOL_F_GEOMETRY only, else zero) pad_h_end,
 * pad_w_end, dil_h, dil_w. Kernels, strides and dilations are >= 1.
 * Without NPU_POOL_F_GEOMETRY the end pads equal the begin pads and the
 * dilations are 1. A window of k taps spaced dil apart spans
 * ke = (k - 1) * dil + 1 elements; every pad is below its ke.
 * Along one axis of n elements padded by pb before and pe after, the
 * output size is floor((n + pb + pe - ke) / stride) + 1 (n + pb + pe >= ke).
 * With NPU_POOL_F_CEIL (needs NPU_POOL_F_GEOMETRY) it is rounded up
 * instead, less one if the last window would then start at or past
 * n + pb (inside the end padding or beyond it), as in PyTorch and
 * onnxruntime. Window o reads the taps at o * stride - pb + i * dil,
 * 0 <= i < k. MAX takes the largest in-bounds tap (-inf if none). AVG
 * divides the sum of the in-bounds taps by the number of taps inside the
 * padded extent [-pb, n + pe) with NPU_POOL_F_COUNT_PAD (the kernel area
 * unless a ceil-mode window runs past the end padding), else by the number
 * of in-bounds taps (0 if there are none). NPU_POOL_F_GEOMETRY and
 * NPU_POOL_F_CEIL need NPU_CAP_POOL_GEOMETRY.
 */
enum npu_pool_kind {
	NPU_POOL_MAX		= 0,
	NPU_POOL_AVG		= 1,
	NPU_POOL_COUNT,
};

#define NPU_POOL_P_KH		0
#define NPU_POOL_P_KW		1
#define NPU_POOL_P_STRIDE_H	2
#define NPU_POOL_P_STRIDE_W	3
#define NPU_POOL_P_PAD_H	4
#define NPU_POOL_P_PAD_W	5
#define NPU_POOL_P_FLAGS	6
#define NPU_POOL_P_PAD_H_END	7
#define NPU_POOL_P_PAD_W_END	8
#define NPU_POOL_P_DIL_H	9
#define NPU_POOL_P_DIL_W	10
#define NPU_POOL_F_COUNT_PAD	(1u << 0)
#define NPU_POOL_F_GEOMETRY	(1u << 1)	/* params 7..10 are in use */
#define NPU_POOL_F_CEIL		(1u << 2)	/* ceil-mode output size */
#define NPU_POOL_F_MASK		0x7u

/*
 * MATMUL: t[0] = a, t[1] = b, t[2] = out. LINEAR: t[0] = a, t[1] = b,
 * t[2] = bias, t[3] = out. One float dtype for all (fp32 accumulation).
 * a, b and out have one rank r >= 2: a is [..., M, K], b [..., K, N], out
 * [..., M, N]; the r - 2 batch dims of a and b are out's or 1 (broadcast).
 * Any strides (a transposed operand is a strided view). bias has rank r,
 * N in the last dim and 1 elsewhere. kind = activation applied last.
 */
enum npu_act_kind {
	NPU_ACT_NONE		= 0,
	NPU_ACT_RELU		= 1,
	NPU_ACT_GELU		= 2,	/* exact, erf form */
	NPU_ACT_RELU6		= 3,	/* min(max(x, 0), 6); NPU_CAP_ACT_RELU6 */
	NPU_ACT_COUNT,
};

/*
 * REDUCE: t[0] = in, t[1] = out. params[0] = bit mask of the reduced axes
 * (nonzero, below 1 << ndim); out has in's rank and dtype, with 1 in the
 * reduced dims and in's size elsewhere (keepdims form). MEAN takes float
 * dtypes only; SUM of ints wraps like numpy.
 */
enum npu_reduce_kind {
	NPU_REDUCE_SUM		= 0,
	NPU_REDUCE_MEAN		= 1,
	NPU_REDUCE_MAX		= 2,
	NPU_REDUCE_MIN		= 3,
	NPU_REDUCE_COUNT,
};

/*
 * SOFTMAX: t[0] = in, t[1] = out, same shape, one float dtype.
 * params[0] = axis (below ndim).
 */
enum npu_softmax_kind {
	NPU_SOFTMAX_SOFTMAX	= 0,
	NPU_SOFTMAX_LOG		= 1,
	NPU_SOFTMAX_COUNT,
};

/*
 * LAYERNORM (kind 0): t[0] = in, t[1] = gamma, t[2] = beta, t[3] = out,
 * one float dtype. params[0] = number of trailing axes normalised together
 * (1..ndim); params[1] = epsilon as fp32 bits (finite, > 0). out has in's
 * shape; gamma and beta have in's rank, in's size in the normalised axes
 * and 1 in the others.
 */

/* ELTWISE kinds */
enum npu_eltwise_kind {
	NPU_ELTWISE_ADD		= 0,
	NPU_ELTWISE_SUB		= 1,
	NPU_ELTWISE_MUL		= 2,
	NPU_ELTWISE_DIV		= 3,	/* float dtypes only */
	NPU_ELTWISE_MAX		= 4,
	NPU_ELTWISE_MIN		= 5,
	/* Comparisons: out is NPU_DTYPE_BOOL, 1 where the relation holds, else 0 */
	NPU_ELTWISE_EQ		= 6,
	NPU_ELTWISE_NE		= 7,	/* NaN != x holds, as in IEEE 754 */
	NPU_ELTWISE_LT		= 8,
	NPU_ELTWISE_LE		= 9,
	NPU_ELTWISE_GT		= 10,
	NPU_ELTWISE_GE		= 11,
	NPU_ELTWISE_COUNT,
};

/* UNARY kinds; all but RELU, ABS and NEG take float dtypes only */
enum npu_unary_kind {
	NPU_UNARY_RELU		= 0,
	NPU_UNARY_GELU		= 1,	/* exact: x * (1 + erf(x / sqrt(2))) / 2 */
	NPU_UNARY_SIGMOID	= 2,
	NPU_UNARY_TANH		= 3,
	NPU_UNARY_EXP		= 4,
	NPU_UNARY_LOG		= 5,
	NPU_UNARY_SQRT		= 6,
	NPU_UNARY_ABS		= 7,
	NPU_UNARY_NEG		= 8,
	NPU_UNARY_ERF		= 9,
	NPU_UNARY_RECIPROCAL	= 10,	/* 1 / x, one IEEE division */
	NPU_UNARY_COUNT,
};

/* Descriptor flags */
#define NPU_CMD_F_IRQ		(1u << 0)	/* interrupt when this command completes */
/*
 * NPU_CAP_CONCURRENT: this command does not depend on the commands before
 * it in the ring back to the last one without the flag, so the device may
 * run them at the same time on different AI cores. They still complete
 * (completion record, fence, Q_HEAD, interrupt) in ring order.
 */
#define NPU_CMD_F_CONCURRENT	(1u << 1)
#define NPU_CMD_F_MASK		(NPU_CMD_F_IRQ | NPU_CMD_F_CONCURRENT)

/* GEMM flags (npu_cmd.gemm.flags) */
#define NPU_GEMM_TRANS_A	(1u << 0)
#define NPU_GEMM_TRANS_B	(1u << 1)
#define NPU_GEMM_F_MASK		(NPU_GEMM_TRANS_A | NPU_GEMM_TRANS_B)

/*
 * Element types. GEMM takes FP32 only; tensor ops take all of them but
 * BOOL, which only the ELTWISE comparisons (any operand) and CONVERT (either
 * side: nonzero is 1, and 1 converts to 1) take.
 */
enum npu_dtype {
	NPU_DTYPE_FP32	= 0,
	NPU_DTYPE_FP16	= 1,	/* IEEE 754 binary16 */
	NPU_DTYPE_BF16	= 2,	/* bfloat16: the top half of an fp32 */
	NPU_DTYPE_INT8	= 3,
	NPU_DTYPE_INT32	= 4,
	NPU_DTYPE_BOOL	= 5,	/* one byte, 0 or 1 */
	NPU_DTYPE_COUNT,
};

/*
 * Tensor operand of a tensor op (ELTWISE and up), as the device reads it from the
 * op's parameter block. Dimensions at and above ndim are zero. Strides are
 * in elements; a stride of 0 repeats the element along that dimension.
 */
#define NPU_MAX_RANK		4
#define NPU_TENSOR_OPERANDS	4
#define NPU_TENSOR_PARAMS	16
#define NPU_MAX_STRIDE		0x7fffffffu
#define NPU_MAX_ELEMS		(1u << 28)	/* elements per operand */

struct npu_hw_tensor {
	__u64 va;		/* device VA of element [0, ..., 0] */
	__u32 dtype;		/* enum npu_dtype */
	__u32 ndim;		/* 1..NPU_MAX_RANK */
	__u32 shape[NPU_MAX_RANK];	/* 1..2^31-1 each */
	__u32 strides[NPU_MAX_RANK];	/* 0..NPU_MAX_STRIDE */
};

/*
 * Parameter block of a tensor op: 256 bytes at a 64-byte aligned device VA,
 * read once when the op starts. Operands a tensor op does not use, and the
 * params it does not use (all of them for ELTWISE/UNARY/CONVERT), must be
 * zero.
 *   ELTWISE: t[0] = a, t[1] = b, t[2] = out
 *   UNARY, CONVERT, REDUCE, SOFTMAX: t[0] = in, t[1] = out
 *   LAYERNORM: t[0] = in, t[1] = gamma, t[2] = beta, t[3] = out
 *   MATMUL: t[0] = a, t[1] = b, t[2] = out
 *   LINEAR: t[0] = a, t[1] = b, t[2] = bias, t[3] = out
 *   CONV2D: t[0] = in, t[1] = weight, t[2] = bias, t[3] = out
 *   POOL2D: t[0] = in, t[1] = out
 *   REQUANT: t[0] = acc, t[1] = scale, t[2] = out
 */
struct npu_tensor_params {
	struct npu_hw_tensor t[NPU_TENSOR_OPERANDS];
	__u32 params[NPU_TENSOR_PARAMS];
};

/* Upper bounds the device enforces on one command. */
#define NPU_MAX_XFER		(1ull << 32)	/* bytes per COPY/FILL */
#define NPU_MAX_DIM		65536		/* GEMM m, n, k */
#define NPU_MAX_LD		(1u << 24)	/* GEMM row strides, elements */

/*
 * Command descriptor: 128 bytes in the ring. Buffer addresses are device
 * virtual addresses (see the device MMU above). Every reserved field and
 * every payload byte an opcode does not use must be zero.
 */
struct npu_cmd {
	__u16 opcode;		/* enum npu_opcode */
	__u16 flags;		/* NPU_CMD_F_* */
	__u16 ctx;		/* address space: context table entry, 0: the queue's */
	__u16 rsvd0;
	__u64 fence;		/* timeline value written back on completion */
	union {
		struct {
			__u64 src;
			__u64 dst;
			__u64 len;	/* bytes, 1..NPU_MAX_XFER; no overlap */
		} copy;
		struct {
			__u64 dst;
			__u64 len;	/* bytes, 4..NPU_MAX_XFER, multiple of 4 */
			__u32 pattern;	/* 32-bit pattern, little endian */
			__u32 rsvd;
		} fill;
		struct {
			/* C[m][n] = op(A)[m][k] x op(B)[k][n], row major */
			__u64 a;
			__u64 b;
			__u64 c;
			__u32 m, n, k;
			__u32 lda, ldb, ldc;	/* row strides, elements */
			__u32 dtype;		/* enum npu_dtype */
			__u32 flags;		/* NPU_GEMM_* */
		} gemm;
		struct {
			/*
			 * SIGNAL and WAIT: va is 8-byte aligned. A WAIT whose
			 * value is not there yet leaves the queue's head on
			 * it; the device runs other queues meanwhile and
			 * looks again after each completion and every 1 ms.
			 */
			__u64 va;
			__u64 value;
		} sync;
		struct {
			__u64 params;	/* VA of struct npu_tensor_params */
			__u32 kind;	/* the opcode's enum npu_*_kind, or 0 */
			__u32 rsvd;
		} tensor;
		__u64 raw[14];
	};
};

/* Completion record: 32 bytes, one per ring slot (same index). */
struct npu_cpl {
	__u64 fence;
	__u32 status;		/* enum npu_status */
	__u16 opcode;
	__u16 rsvd;
	__u64 t_start;		/* device clock, ns */
	__u64 t_end;
};

/* Fence write-back: the device writes this after every completion. */
struct npu_fence_wb {
	__u64 value;		/* last completed fence */
	__u64 timestamp;	/* device clock at completion, ns */
};

/* Completion status codes */
enum npu_status {
	NPU_ST_OK		= 0,
	NPU_ST_BAD_OPCODE	= 1,	/* opcode unknown */
	NPU_ST_BAD_FLAGS	= 2,	/* unknown flag bits */
	NPU_ST_BAD_RESERVED	= 3,	/* a reserved field is not zero */
	NPU_ST_BAD_ARGS		= 4,	/* shape, length, stride or dtype invalid */
	NPU_ST_BAD_ADDR		= 5,	/* range overflows or hits the device's BARs */
	NPU_ST_DMA_ERROR	= 6,	/* a DMA transfer failed */
	NPU_ST_ABORTED		= 7,	/* dropped by a reset */
	NPU_ST_NO_MEMORY	= 8,	/* device-side allocation failed */
	NPU_ST_MMU_FAULT	= 9,	/* a translation missed or was not writable */
	NPU_ST_BAD_QUANT	= 10,	/* zero point outside int8, scale not finite > 0 */
	NPU_ST_HW_ERROR		= 11,	/* uncorrectable device error (ECC) */
	/*
	 * Past the cmd-budget-ms property, stopped at a control point; the
	 * driver also reports it for a command its recovery reset dropped.
	 */
	NPU_ST_TIMEOUT		= 12,
	NPU_ST_COUNT,
};

/* Device errors in NPU_REG_ERROR (queue-level, stop the queue). */
enum npu_dev_error {
	NPU_ERR_NONE		= 0,
	NPU_ERR_RING_OVERRUN	= 1,	/* tail - head > ring size */
	NPU_ERR_RING_FETCH	= 2,	/* descriptor fetch DMA failed */
	NPU_ERR_CPL_WRITE	= 3,	/* completion write DMA failed */
	NPU_ERR_BAD_RING	= 4,	/* ring registers invalid at enable */
	NPU_ERR_MMU_FAULT	= 5,	/* a confined queue's command faulted */
};

#endif /* NPU_HW_H */
