/* SPDX-License-Identifier: GPL-2.0 */
/*
 * NPU driver tracepoints (events/npu/ in tracefs).
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM npu

#if !defined(NPU_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define NPU_TRACE_H

#include <linux/tracepoint.h>

#include "npu_hw.h"

TRACE_EVENT(npu_submit,
	    TP_PROTO(u32 queue, u64 first, u64 last),
	    TP_ARGS(queue, first, last),
	    TP_STRUCT__entry(__field(u32, queue)
			     __field(u64, first)
			     __field(u64, last)),
	    TP_fast_assign(__entry->queue = queue;
			   __entry->first = first;
			   __entry->last = last;),
	    TP_printk("queue=%u fences=%llu..%llu", __entry->queue,
		      __entry->first, __entry->last)
);

/* A WAIT ahead of a job: on a dma_fence (context, seqno) or a user queue (0, value). */
TRACE_EVENT(npu_dep,
	    TP_PROTO(u32 queue, u64 fence, u64 context, u64 seqno),
	    TP_ARGS(queue, fence, context, seqno),
	    TP_STRUCT__entry(__field(u32, queue)
			     __field(u64, fence)
			     __field(u64, context)
			     __field(u64, seqno)),
	    TP_fast_assign(__entry->queue = queue;
			   __entry->fence = fence;
			   __entry->context = context;
			   __entry->seqno = seqno;),
	    TP_printk("queue=%u fence=%llu waits for context=%llu seqno=%llu",
		      __entry->queue, __entry->fence, __entry->context, __entry->seqno)
);

/* Runtime PM: the device suspended, or resumed in @ns. */
TRACE_EVENT(npu_pm,
	    TP_PROTO(bool resumed, u64 ns),
	    TP_ARGS(resumed, ns),
	    TP_STRUCT__entry(__field(bool, resumed)
			     __field(u64, ns)),
	    TP_fast_assign(__entry->resumed = resumed;
			   __entry->ns = ns;),
	    TP_printk("%s%llu", __entry->resumed ? "resumed in ns=" : "suspended ", __entry->ns)
);

DECLARE_EVENT_CLASS(npu_queue_fence,
		    TP_PROTO(u32 queue, u64 fence),
		    TP_ARGS(queue, fence),
		    TP_STRUCT__entry(__field(u32, queue)
				     __field(u64, fence)),
		    TP_fast_assign(__entry->queue = queue;
				   __entry->fence = fence;),
		    TP_printk("queue=%u fence=%llu", __entry->queue, __entry->fence)
);

DEFINE_EVENT(npu_queue_fence, npu_complete,
	     TP_PROTO(u32 queue, u64 fence),
	     TP_ARGS(queue, fence)
);

TRACE_EVENT(npu_op_error,
	    TP_PROTO(u32 queue, u64 fence, u32 status, u16 opcode),
	    TP_ARGS(queue, fence, status, opcode),
	    TP_STRUCT__entry(__field(u32, queue)
			     __field(u64, fence)
			     __field(u32, status)
			     __field(u16, opcode)),
	    TP_fast_assign(__entry->queue = queue;
			   __entry->fence = fence;
			   __entry->status = status;
			   __entry->opcode = opcode;),
	    TP_printk("queue=%u fence=%llu status=%u opcode=%u",
		      __entry->queue, __entry->fence, __entry->status,
		      __entry->opcode)
);

TRACE_EVENT(npu_irq,
	    TP_PROTO(u32 queue),
	    TP_ARGS(queue),
	    TP_STRUCT__entry(__field(u32, queue)),
	    TP_fast_assign(__entry->queue = queue;),
	    TP_printk("queue=%u", __entry->queue)
);

TRACE_EVENT(npu_job_retire,
	    TP_PROTO(u64 first, u64 last, u32 status),
	    TP_ARGS(first, last, status),
	    TP_STRUCT__entry(__field(u64, first)
			     __field(u64, last)
			     __field(u32, status)),
	    TP_fast_assign(__entry->first = first;
			   __entry->last = last;
			   __entry->status = status;),
	    TP_printk("fences=%llu..%llu status=%u", __entry->first, __entry->last, __entry->status)
);

DEFINE_EVENT(npu_queue_fence, npu_wait_done,
	     TP_PROTO(u32 queue, u64 fence),
	     TP_ARGS(queue, fence)
);

DECLARE_EVENT_CLASS(npu_bo,
		    TP_PROTO(u32 handle, size_t size),
		    TP_ARGS(handle, size),
		    TP_STRUCT__entry(__field(u32, handle)
				     __field(size_t, size)),
		    TP_fast_assign(__entry->handle = handle;
				   __entry->size = size;),
		    TP_printk("handle=%u size=%zu", __entry->handle, __entry->size)
);

DEFINE_EVENT(npu_bo, npu_bo_create,
	     TP_PROTO(u32 handle, size_t size),
	     TP_ARGS(handle, size)
);

DEFINE_EVENT(npu_bo, npu_bo_free,
	     TP_PROTO(u32 handle, size_t size),
	     TP_ARGS(handle, size)
);

/* An ioctl of an npu file: its number, and at exit what it returned. */
TRACE_EVENT(npu_ioctl_enter,
	    TP_PROTO(u32 nr),
	    TP_ARGS(nr),
	    TP_STRUCT__entry(__field(u32, nr)),
	    TP_fast_assign(__entry->nr = nr;),
	    TP_printk("nr=0x%02x", __entry->nr)
);

TRACE_EVENT(npu_ioctl_exit,
	    TP_PROTO(u32 nr, long ret),
	    TP_ARGS(nr, ret),
	    TP_STRUCT__entry(__field(u32, nr)
			     __field(long, ret)),
	    TP_fast_assign(__entry->nr = nr;
			   __entry->ret = ret;),
	    TP_printk("nr=0x%02x ret=%ld", __entry->nr, __entry->ret)
);

/* A descriptor written into the driver's ring. */
TRACE_EVENT(npu_ring_write,
	    TP_PROTO(u32 queue, u64 fence, u16 opcode, u32 slot),
	    TP_ARGS(queue, fence, opcode, slot),
	    TP_STRUCT__entry(__field(u32, queue)
			     __field(u64, fence)
			     __field(u16, opcode)
			     __field(u32, slot)),
	    TP_fast_assign(__entry->queue = queue;
			   __entry->fence = fence;
			   __entry->opcode = opcode;
			   __entry->slot = slot;),
	    TP_printk("queue=%u fence=%llu opcode=%u slot=%u", __entry->queue,
		      __entry->fence, __entry->opcode, __entry->slot)
);

TRACE_EVENT(npu_doorbell,
	    TP_PROTO(u32 queue, u32 tail),
	    TP_ARGS(queue, tail),
	    TP_STRUCT__entry(__field(u32, queue)
			     __field(u32, tail)),
	    TP_fast_assign(__entry->queue = queue;
			   __entry->tail = tail;),
	    TP_printk("queue=%u tail=%u", __entry->queue, __entry->tail)
);

TRACE_DEFINE_ENUM(NPU_TR_FETCH);
TRACE_DEFINE_ENUM(NPU_TR_DISPATCH);
TRACE_DEFINE_ENUM(NPU_TR_CMD_START);
TRACE_DEFINE_ENUM(NPU_TR_CMD_END);
TRACE_DEFINE_ENUM(NPU_TR_TILE_START);
TRACE_DEFINE_ENUM(NPU_TR_TILE_END);
TRACE_DEFINE_ENUM(NPU_TR_DMA_START);
TRACE_DEFINE_ENUM(NPU_TR_DMA_END);
TRACE_DEFINE_ENUM(NPU_TR_CPL_WRITE);
TRACE_DEFINE_ENUM(NPU_TR_IRQ);
TRACE_DEFINE_ENUM(NPU_TR_MBOX_REQ);
TRACE_DEFINE_ENUM(NPU_TR_MBOX_REPLY);

/*
 * A record of the device's trace ring (npu_fwtrace.c), with its device
 * clock time; enabling this event turns the device's tracing on.
 */
TRACE_EVENT(npu_fw_event,
	    TP_PROTO(const struct npu_trace_rec *rec),
	    TP_ARGS(rec),
	    TP_STRUCT__entry(__field(u64, dev_ns)
			     __field(u16, kind)
			     __field(u8, queue)
			     __field(u8, core)
			     __field(u32, arg32)
			     __field(u64, fence)
			     __field(u64, arg)),
	    TP_fast_assign(__entry->dev_ns = le64_to_cpu(rec->ts);
			   __entry->kind = le16_to_cpu(rec->kind);
			   __entry->queue = rec->queue;
			   __entry->core = rec->core;
			   __entry->arg32 = le32_to_cpu(rec->arg32);
			   __entry->fence = le64_to_cpu(rec->fence);
			   __entry->arg = le64_to_cpu(rec->arg);),
	    TP_printk("dev_ns=%llu kind=%s queue=%u core=%u fence=%llu arg32=%u arg=%llu",
		      __entry->dev_ns,
		      __print_symbolic(__entry->kind,
				       { NPU_TR_FETCH, "fetch" },
				       { NPU_TR_DISPATCH, "dispatch" },
				       { NPU_TR_CMD_START, "cmd_start" },
				       { NPU_TR_CMD_END, "cmd_end" },
				       { NPU_TR_TILE_START, "tile_start" },
				       { NPU_TR_TILE_END, "tile_end" },
				       { NPU_TR_DMA_START, "dma_start" },
				       { NPU_TR_DMA_END, "dma_end" },
				       { NPU_TR_CPL_WRITE, "cpl_write" },
				       { NPU_TR_IRQ, "irq" },
				       { NPU_TR_MBOX_REQ, "mbox_req" },
				       { NPU_TR_MBOX_REPLY, "mbox_reply" }),
		      __entry->queue, __entry->core, __entry->fence,
		      __entry->arg32, __entry->arg)
);

/* The device clock now: this event's timestamp is the same instant. */
TRACE_EVENT(npu_clock_sync,
	    TP_PROTO(u64 dev_ns),
	    TP_ARGS(dev_ns),
	    TP_STRUCT__entry(__field(u64, dev_ns)),
	    TP_fast_assign(__entry->dev_ns = dev_ns;),
	    TP_printk("dev_ns=%llu", __entry->dev_ns)
);

#endif /* NPU_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE npu_trace
#include <trace/define_trace.h>
