/*
 * NPU PCI device model: state shared by the register front end (npu.c) and
 * the command engine (npu_exec.c).
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#ifndef HW_MISC_NPU_DEV_H
#define HW_MISC_NPU_DEV_H

#include "hw/pci/pci_device.h"
#include "qemu/thread.h"
#include "system/runstate.h"
#include "npu_hw.h"

#define TYPE_NPU_PCI "npu"
OBJECT_DECLARE_SIMPLE_TYPE(NpuState, NPU_PCI)

/* Size of the bounce/pattern buffers of the command engine. */
#define NPU_CHUNK (1 * MiB)

/*
 * Nesting levels of the command processor: a running command is preempted
 * at a tile boundary only by one of a strictly higher priority.
 */
#define NPU_LEVELS (NPU_Q_PRIORITY_MAX + 1)

/*
 * Most commands one concurrent group holds (NPU_CMD_F_CONCURRENT): a group
 * is at most as large as the device has AI cores, and never larger than
 * this.
 */
#define NPU_GROUP_MAX 8

/*
 * Work (about one multiply-add, compared element or byte moved each) a
 * kernel does between two control points: of the order of a millisecond.
 */
#define NPU_POLL_QUANTUM (1ull << 22)

/* The command an engine thread works on, for the trace ring. */
typedef struct NpuTraceCtx {
    uint8_t queue;          /* NPU_TRACE_NO_QUEUE: none */
    uint8_t core;           /* NPU_TRACE_CORE_CP: the command processor */
    uint64_t fence;
} NpuTraceCtx;

/* L2 tables a walk keeps: an op's operands usually span a few L1 entries. */
#define NPU_WALK_WAYS 4

/*
 * The device's memory BAR windows [lo, hi) as the guest last programmed
 * them (hi == 0: not mapped), for the engine's self-DMA check. Updated
 * under the BQL (configuration writes, reset), read by the engine from
 * the snapshot each command takes.
 */
typedef struct NpuBars {
    uint64_t lo[PCI_NUM_REGIONS];
    uint64_t hi[PCI_NUM_REGIONS];
} NpuBars;

/*
 * What one command did, counted by every engine thread that works on it
 * (the performance counters, npu_perf.c; a confined queue's fault stop).
 */
typedef struct NpuCmdStats {
    uint32_t faults;        /* MMU faults (device lock) */
    uint32_t mac_dtype;     /* the operands of its multiply-adds */
    uint64_t macs;          /* multiply-adds (qatomic, as all below) */
    uint64_t read_bytes;    /* operand bytes read from memory */
    uint64_t write_bytes;   /* operand bytes written to memory */
    uint64_t walks;         /* pages translated */
    uint64_t walk_hits;     /* ... with their L2 table already held */
} NpuCmdStats;

/* Per-command view of the device MMU (npu_mmu.c). */
typedef struct NpuWalk {
    bool enabled;
    bool confined;          /* the queue's own address space */
    int queue;              /* whose command: recorded with a fault */
    NpuCmdStats *stats;     /* the command's counts, shared by its copies */
    uint32_t ctx;           /* the descriptor's ctx: recorded with a fault */
    uint64_t ctx_base;      /* context table snapshot */
    uint32_t ctx_count;
    uint64_t l1_base;
    uint32_t l1_entries;
    uint32_t victim;        /* the way the next L2 table replaces */
    uint32_t refills;       /* L2 tables read: a control point every 1024 */
    NpuBars bars;           /* snapshot at the command's start */
    uint64_t cached_l1[NPU_WALK_WAYS];  /* L1 index of l2[way], or UINT64_MAX */
    /*
     * Copies of those L2 tables, each read whole once: the tables cannot
     * change while a command runs (the driver unmaps only after its jobs
     * retire).
     */
    uint64_t l2[NPU_WALK_WAYS][NPU_MMU_L2_ENTRIES];
} NpuWalk;

typedef struct NpuQueue {
    uint64_t ring_base;
    uint64_t cpl_base;
    uint64_t fence_addr;
    uint32_t ring_size;
    uint32_t ctrl;
    uint32_t head;          /* free-running consumer index */
    uint32_t tail;          /* free-running producer index */
    uint32_t head_restore;  /* Q_HEAD written while disabled: where ... */
    bool restore;           /* ... the next enable starts, not 0 */
    uint32_t status;        /* NPU_QSTAT_STOPPED, NPU_QSTAT_ACTIVE */
    uint32_t progress;      /* NPU_Q_PROGRESS: engine threads, qatomic */
    uint32_t error;         /* NPU_ERR_* that stopped it */
    uint32_t gen;           /* bumped when the queue is (re)enabled or reset */
    uint32_t priority;      /* 0..NPU_Q_PRIORITY_MAX, higher runs first */
    uint32_t irq_count;     /* moderation: signal every irq_count-th ... */
    uint32_t irq_delay_us;  /* ... or irq_delay_us after the first held one */
    uint32_t irq_held;      /* completions waiting to be signalled */
    uint32_t irqs;          /* completion interrupts signalled */
    uint64_t mmu_l1_base;   /* the queue's own address space ... */
    uint32_t mmu_l1_entries; /* ... if non-zero */
    uint64_t done_fence;
    bool blocked;           /* its head is a WAIT not yet satisfied */
    bool waiting;           /* ... as last seen: Q_STATUS.WAITING */
    bool cpl_writing;       /* the engine writes a completion of it */
    bool wait_timed;        /* a WAIT is blocked since @wait_since ... */
    uint64_t wait_since;    /* (device clock of its first blocked look) */
    uint32_t wait_idx;      /* ... at this ring index */
} NpuQueue;

/* The interrupt-moderation timer of one queue. */
typedef struct NpuIrqTimer {
    NpuState *s;
    int qi;
    QEMUTimer *timer;
} NpuIrqTimer;

typedef struct NpuCores NpuCores;

/* One AI core: a worker thread with its own DMA bounce buffer. */
typedef struct NpuCore {
    NpuState *s;
    NpuCores *cores;
    uint32_t index;
    uint8_t *chunk;         /* NPU_CHUNK bytes, private to this core */
    uint8_t *scratch;       /* kernels' workspace (npu_core_scratch) */
    size_t scratch_size;
    /*
     * Tensor ops that gather their inputs whole do it here: grown on
     * demand, kept between ops up to NPU_SCRATCH_KEEP bytes, charged to
     * the memory budget.
     */
    uint8_t *gather_buf;
    uint64_t gather_size;
    uint64_t work;          /* since the last control point */
    uint64_t busy_ns;       /* running tiles or a member (qatomic) */
    QemuThread thread;
} NpuCore;

/* Work on units [begin, end) of a command; returns an enum npu_status. */
typedef uint32_t (*NpuTileFn)(NpuCore *core, void *opaque, uint64_t begin,
                              uint64_t end);

/* One published job: the tiles of one command (NpuCores.lock). */
typedef struct NpuJob {
    NpuTileFn fn;
    void *opaque;
    uint64_t total, grain, next;
    uint32_t running;
    uint32_t status;
    bool paused;            /* preempted: no tile is taken until resumed */
    NpuTraceCtx owner;      /* the command the tiles are of (trace ring) */
} NpuJob;

struct NpuCores {
    uint32_t n;
    NpuCore *core;
    /*
     * @lock protects @stop, @job and the job's fields: the command
     * processor publishes a job, the cores take tiles from it and report
     * the first failure. Never taken with NpuState.lock held.
     */
    QemuMutex lock;
    QemuCond work;          /* a job was published or resumed, or stop */
    QemuCond done;          /* the last running tile finished */
    bool stop;
    NpuJob *job;            /* the innermost job, NULL when idle */
    NpuJob *group;          /* the running concurrent group's members */
    NpuJob *shared[NPU_GROUP_MAX];  /* group members' tiles, for idle cores */
};

/* One command of a group: its private descriptor copy, walk and result. */
typedef struct NpuMember {
    uint32_t idx;           /* ring index */
    struct npu_cmd cmd;     /* the one copy the device looks at */
    struct npu_cpl cpl;
    NpuWalk walk;
    uint32_t inject;        /* the NPU_INJECT_* fault it takes, if any */
    NpuCmdStats stats;
    bool blocked;           /* a WAIT not yet satisfied */
} NpuMember;

/* What the command processor keeps per nesting level (its own use only). */
typedef struct NpuLevel {
    NpuCore core;           /* the processor as a core: its bounce buffer */
    NpuMember *members;     /* the group it runs (NPU_GROUP_MAX) */
} NpuLevel;

/* Per-op efficiency classes of a chip description. */
enum { NPU_EFF_GEMM, NPU_EFF_CONV, NPU_EFF_COUNT };

/* A chip description of the timing model (npu_timing.c). */
typedef struct NpuChip {
    const char *name;
    uint32_t mac_rows, mac_cols;    /* int8 MAC cells */
    uint32_t clock_mhz;
    uint64_t sram_bytes;
    uint32_t dma_mb_per_s;          /* 10^6 bytes per second */
    uint32_t vector_bytes_per_cycle;
    uint32_t cmd_overhead_ns;
    uint32_t eff_pct[NPU_EFF_COUNT];
} NpuChip;

struct NpuState {
    PCIDevice parent_obj;

    MemoryRegion mmio;
    QEMUBH *irq_bh;
    QemuThread thread;

    /* Properties */
    uint32_t num_cores;     /* AI core threads */
    uint32_t cmd_budget_ms; /* host time a command may run, 0: no limit */
    uint64_t mem_budget;    /* host bytes of staging and scratch in flight */
    uint64_t mem_size;      /* device memory (BAR2) bytes, 0: none */
    bool boot_rom;          /* firmware running from reset (engine tests) */
    bool use_dnnl;          /* CONV2D on oneDNN where it takes the shape */
    char *timing_name;      /* "native" (NULL), or a chip description */

    /*
     * The timing model (npu_timing.c): @timing and @chip fixed at realize;
     * @timing_stolen_ns and @timing_cap_ns written by the command
     * processor only, read by any thread (qatomic, see npu_dev_clock()).
     */
    uint32_t timing;        /* enum npu_timing */
    const NpuChip *chip;    /* NULL: native */
    uint64_t timing_stolen_ns;  /* host time hidden from the clock */
    uint64_t timing_cap_ns;     /* the clock reads no later; MAX: none */

    /* Device memory: RAM behind BAR2; the engine uses it directly. */
    MemoryRegion mem;
    uint8_t *mem_ptr;

    /*
     * @lock protects every field below up to @chunk: register state, queue
     * state, the interrupt bits and the worker's stop/reset requests. It is
     * taken by the vCPU (MMIO, under the BQL), the worker and the IRQ
     * bottom half; it is never held across DMA or command execution.
     */
    QemuMutex lock;
    QemuMutex log_lock;     /* serialises firmware log writers; before lock */
    QemuCond cond;          /* wakes the worker: doorbell, enable, reset */
    QemuCond reset_done;    /* signalled when a reset request is finished */
    QemuCond cpl_done;      /* a completion write finished (cpl_writing) */
    QemuCond resume;        /* the VM runs again, or an abort */
    QemuCond parked_cond;   /* @parked or @busy went down or up */
    bool stop;
    bool reset_pending;
    bool paused;            /* the VM is stopped: the engine parks */
    uint32_t busy;          /* engine threads inside a command */
    uint32_t parked;        /* of those, parked at a control point */
    int64_t paused_at_ns;   /* host clock when the VM stopped */
    int cur_prio;           /* priority of the innermost command, -1: idle */
    uint32_t control;
    uint32_t irq_status;
    uint32_t irq_mask;
    uint32_t irq_fire;      /* status bits not yet signalled by MSI-X */
    uint32_t error;
    uint32_t scratch;
    uint32_t inject;        /* NPU_INJECT_* armed */
    bool hung;              /* an injected hang: nothing runs until reset */
    /* Firmware (npu_fw.c) */
    uint64_t fw_addr;
    uint32_t fw_size;
    uint32_t fw_state;      /* enum npu_fw_state */
    uint32_t fw_error;
    uint32_t fw_version;
    uint32_t fw_opcodes;    /* bit per opcode the firmware runs */
    uint32_t fw_queues;     /* bit per queue the firmware created */
    uint64_t fw_hb_period_ns;
    uint64_t fw_boot_ns;
    uint32_t fw_hb_frozen;  /* heartbeat at a crash */
    uint32_t fw_log_level;
    uint64_t fw_log_base;
    bool fw_log_writing;    /* a line is being written to the ring */
    QemuCond log_idle;      /* @fw_log_writing went false */
    uint32_t fw_log_size;
    uint32_t fw_log_write;
    uint64_t cmds_done;
    uint32_t mbox_cmd, mbox_arg0, mbox_arg1, mbox_seq;
    uint32_t mbox_resp_seq, mbox_resp_status, mbox_resp0, mbox_resp1;
    uint32_t ts_hi_latch;
    uint32_t mmu_control;
    uint64_t mmu_l1_base;
    uint32_t mmu_l1_entries;
    uint64_t mmu_fault_addr;
    uint32_t mmu_fault_info;
    uint32_t mmu_fault_queue;
    uint32_t mmu_fault_ctx;
    uint32_t mmu_faults;
    uint64_t mmu_ctx_base;  /* context table */
    uint32_t mmu_ctx_count;
    NpuBars bars;           /* refreshed under the BQL, see NpuBars */
    NpuQueue q[NPU_NUM_QUEUES];
    /* Moderation timers of the queues (main loop; they take the lock). */
    NpuIrqTimer irq_timer[NPU_NUM_QUEUES];
    int last_queue;         /* served last: where round-robin resumes */
    /*
     * Performance counters (npu_perf.c): the live counts of each queue,
     * the AI cores' busy_ns at the last PERF_RESET, and the snapshot the
     * registers show.
     */
    uint64_t perf_q[NPU_NUM_QUEUES][NPU_PERF_COUNTERS];
    uint64_t *perf_core_zero;
    uint64_t perf_snap_q[NPU_NUM_QUEUES][NPU_PERF_COUNTERS];
    uint64_t *perf_snap_core;
    uint64_t perf_snap_time;
    uint32_t perf_snapshots;
    /*
     * Trace ring (npu_tracering.c). @trace_lock protects the trace_*
     * fields; it is a leaf lock, never held across a DMA (records are
     * written outside it) and taken alone or under the device lock (the
     * register accessors), never the other way round. @trace_on is also
     * read without it (qatomic), so that an engine thread skips the lock
     * while tracing is off.
     */
    QemuMutex trace_lock;
    bool trace_on;
    uint64_t trace_base;
    uint32_t trace_size;
    uint32_t trace_head;    /* published: every record before it written */
    uint32_t trace_tail;
    uint32_t trace_dropped;
    uint32_t trace_mask;
    uint32_t trace_reserved;    /* slots handed out; being written past head */
    uint32_t trace_writing;     /* records being written outside the lock */
    uint32_t trace_inflight;    /* ... of any generation (quiesce) */
    QemuCond trace_idle;        /* @trace_inflight went down to 0 */
    uint32_t trace_gen;         /* a new ring or reset: late writes are void */
    bool trace_failed;          /* a write of this batch failed */

    /*
     * Engine control, read by every engine thread without a lock: @abort
     * (a reset or unplug stops the running command), @preempt (a queue of
     * a higher priority than @cur_prio became runnable), @deadline_ns (host
     * clock, QEMU_CLOCK_REALTIME, at which the innermost command exceeds
     * its budget; INT64_MAX: none). Written with qatomic_set().
     */
    bool abort;
    bool preempt;
    bool in_group;          /* a concurrent group runs: no preemption */
    int64_t deadline_ns;
    uint64_t mem_used;      /* bytes of the budget in use (qatomic) */
    /*
     * Large staging blocks of aborted commands, freed by the command
     * processor once the device answers again (munmap costs ~5 ms per
     * 64 MiB); still charged to the budget. Lock-free (QSLIST atomics).
     */
    QSLIST_HEAD(, NpuDeferred) deferred;

    /* Command-processor private: its nesting level and their buffers. */
    uint32_t depth;         /* written by it only; qatomic for the cores */
    /* The queue whose command runs at each level (qatomic, as depth) */
    uint32_t run_queue[NPU_LEVELS];
    /* ... and that queue's generation when it started (qatomic) */
    uint32_t run_gen[NPU_LEVELS];
    NpuLevel level[NPU_LEVELS];
    NpuCores cores;
    VMChangeStateEntry *vmstate_entry;
};

/* npu_exec.c: validate and run one descriptor; returns an enum npu_status. */
uint32_t npu_exec_cmd(NpuState *s, NpuWalk *w, const struct npu_cmd *cmd);
/* npu_exec.c: may a WAIT descriptor complete? (*ready) */
uint32_t npu_wait_ready(NpuState *s, NpuWalk *w, const struct npu_cmd *cmd,
                        bool *ready);
/* NPU_ST_OK, or the status for a bad device address range (logged). */
uint32_t npu_check_range(const char *what, uint64_t addr, uint64_t len);
/* npu_cores.c: run @fn over [0, total) in tiles of @grain units. */
uint32_t npu_run_tiles(NpuState *s, NpuTileFn fn, void *job, uint64_t total,
                       uint64_t grain);
/* npu_cores.c: run @fn(0..n-1) each alone on one AI core, concurrently. */
void npu_run_members(NpuState *s, NpuTileFn fn, void *opaque, uint32_t n);
/* npu_cores.c: the core whose buffers the running command uses inline. */
NpuCore *npu_cmd_core(NpuState *s);
/* npu_cores.c: control points (any engine thread, no lock held). */
uint32_t npu_engine_poll(NpuState *s);
bool npu_engine_stopping(NpuState *s);
uint32_t npu_engine_work(NpuCore *core, uint64_t work);
void *npu_core_scratch(NpuCore *core, size_t size);
void npu_dnnl_init(void);

/*
 * A guest error: logged with LOG_GUEST_ERROR (-d guest_errors) and traced
 * (trace event npu_guest_error), formatted only when one of them is on.
 */
#define npu_guest_error(fmt, ...)                                          \
    do {                                                                   \
        if (qemu_loglevel_mask(LOG_GUEST_ERROR) ||                         \
            trace_event_get_state_backends(TRACE_NPU_GUEST_ERROR)) {      \
            g_autofree char *npu_msg_ = g_strdup_printf(fmt, ##__VA_ARGS__); \
                                                                           \
            qemu_log_mask(LOG_GUEST_ERROR, "%s", npu_msg_);                \
            trace_npu_guest_error(g_strchomp(npu_msg_));                   \
        }                                                                  \
    } while (0)
/* npu_dnnl.c: c [m, n] = op(a) @ op(b), row major, fp32 (any thread). */
void npu_sgemm(bool ta, bool tb, uint64_t m, uint64_t n, uint64_t k,
               const float *a, uint64_t lda, const float *b, uint64_t ldb,
               float *c, uint64_t ldc);
/* The same, c += op(a) @ op(b). */
void npu_sgemm_acc(bool ta, bool tb, uint64_t m, uint64_t n, uint64_t k,
                   const float *a, uint64_t lda, const float *b, uint64_t ldb,
                   float *c, uint64_t ldc);
void npu_core_release(NpuCore *core);
/* npu_exec.c: host memory under the device's budget (any thread). */
void *npu_budget_alloc(NpuState *s, uint64_t bytes, bool zero);
void npu_budget_free(NpuState *s, void *p, uint64_t bytes);
void npu_budget_reap(NpuState *s);

/* npu_tensor.c: the tensor ops, ELTWISE .. REQUANT and SELECT. */
uint32_t npu_exec_tensor(NpuState *s, NpuWalk *w, const struct npu_cmd *cmd);

/* npu_tensor.c: free a core's gather scratch (it runs no command). */
void npu_scratch_free(NpuState *s, NpuCore *core);
void npu_scratch_trim(NpuState *s);

/* npu.c */
void npu_preempt(NpuState *s);
void npu_raise_locked(NpuState *s, uint32_t bits);
void npu_queue_reset_locked(NpuState *s, int qi);

/* npu_fw.c */
void npu_fw_log(NpuState *s, uint32_t level, const char *fmt, ...)
    G_GNUC_PRINTF(3, 4);
bool npu_fw_log_config_ok(NpuState *s);
void npu_fw_start_rom_locked(NpuState *s);
void npu_fw_boot(NpuState *s);
uint32_t npu_fw_heartbeat_locked(NpuState *s);
void npu_fw_crash_locked(NpuState *s);
void npu_fw_mbox(NpuState *s);

/* npu_cores.c */
void npu_cores_init(NpuState *s, uint32_t n);
void npu_cores_fini(NpuState *s);

/*
 * npu_tracering.c: the trace ring. The register accessors take the device
 * lock's place in the caller's hands (called with it); npu_trace() may be
 * called from any thread, with or without the device lock. The command an
 * event belongs to is the calling thread's (npu_trace_enter()).
 */
void npu_trace_init(NpuState *s);
void npu_trace_fini(NpuState *s);
void npu_trace_reset(NpuState *s);
uint32_t npu_trace_read_locked(NpuState *s, hwaddr off);
void npu_trace_write_locked(NpuState *s, hwaddr off, uint32_t val);
void npu_trace_ev(NpuState *s, uint32_t kind, uint8_t queue, uint8_t core,
                  uint64_t fence, uint32_t arg32, uint64_t arg);
void npu_trace(NpuState *s, uint32_t kind, uint32_t arg32, uint64_t arg);
NpuTraceCtx npu_trace_current(void);
NpuTraceCtx npu_trace_enter(uint8_t queue, uint64_t fence);
void npu_trace_leave(NpuTraceCtx saved);
void npu_trace_set_core(uint8_t core);

/* npu_timing.c: the chip timing model */
bool npu_timing_select(NpuState *s, Error **errp);
uint64_t npu_dev_clock(NpuState *s);
uint64_t npu_timing_model(const NpuChip *c, uint16_t opcode,
                          const NpuCmdStats *st, uint64_t *compute_ns,
                          uint64_t *mem_ns);
void npu_timing_start(NpuState *s, uint64_t t_start);
uint64_t npu_timing_finish(NpuState *s, NpuMember *m, uint64_t t_start);

/* npu_perf.c: performance counters (device lock held) */
void npu_perf_init(NpuState *s);
void npu_perf_fini(NpuState *s);
void npu_perf_reset_locked(NpuState *s);
void npu_perf_retire_locked(NpuState *s, int qi, const NpuMember *m);
uint32_t npu_perf_read_locked(NpuState *s, hwaddr off);
void npu_perf_write_locked(NpuState *s, hwaddr off, uint32_t val);

/* npu_mmu.c */
void npu_walk_init_locked(NpuState *s, NpuWalk *w, int qi);
uint32_t npu_walk_select(NpuState *s, NpuWalk *w, uint32_t ctx);
void npu_bars_update(NpuState *s);
bool npu_hits_own_bar(const NpuBars *bars, uint64_t addr, uint64_t len);
bool npu_dma_range_ok_locked(NpuState *s, uint64_t addr, uint64_t len,
                             bool write);
MemTxResult npu_dma_read(NpuState *s, const char *what, uint64_t addr,
                         void *buf, uint64_t len);
MemTxResult npu_dma_write(NpuState *s, const char *what, uint64_t addr,
                          const void *buf, uint64_t len);
uint32_t npu_mem_read(NpuState *s, NpuWalk *w, uint64_t va, void *buf,
                      uint64_t len);
/*
 * A command's parameter block, read as npu_mem_read() reads operands but
 * neither counted in the performance counters nor logged as a transfer.
 */
uint32_t npu_mem_read_params(NpuState *s, NpuWalk *w, uint64_t va, void *buf,
                             uint64_t len);
uint32_t npu_mem_write(NpuState *s, NpuWalk *w, uint64_t va, const void *buf,
                       uint64_t len);
uint32_t npu_mem_probe(NpuState *s, NpuWalk *w, uint64_t va, uint64_t len,
                       bool write);
void *npu_mem_map(NpuState *s, NpuWalk *w, uint64_t va, uint64_t len,
                  bool write, uint64_t *plen, uint32_t *st);
void npu_mem_unmap(NpuState *s, void *p, uint64_t len, bool write,
                   uint64_t done);

/* Device clock in ns, usable from any thread. */
uint64_t npu_now_ns(void);

#endif
