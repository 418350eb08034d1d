/* SPDX-License-Identifier: GPL-2.0 */
/*
 * NPU driver tracepoints (events/npu/ in tracefs).
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM npu

#if !defined(NPU_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define NPU_TRACE_H

#include <linux/tracepoint.h>

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

#endif /* NPU_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE npu_trace
#include <trace/define_trace.h>
