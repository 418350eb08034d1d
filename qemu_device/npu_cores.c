/*
 * NPU AI cores: a pool of worker threads ("cores") that execute the tiles
 * of one command in parallel, and the engine's control points.
 *
 * The command processor splits a command into tiles of bounded work and
 * publishes them as a job; the cores take tiles until none is left. Between
 * two tiles (and at poll points inside long kernels) every engine thread
 * calls npu_engine_poll(), where a command stops when it is aborted (reset,
 * unplug) or over its time budget, and where the engine parks while the VM
 * is stopped. At a tile boundary a job may also be preempted: the cores
 * stop taking its tiles, the command processor runs the higher-priority
 * command as a nested job, and the preempted job then resumes where it
 * stopped, so its result is the same as if it had run alone.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/units.h"
#include "qemu/atomic.h"
#include "qemu/timer.h"
#include "qemu/memalign.h"
#include "qemu/log.h"
#include "hw/misc/trace.h"
#include "npu_dev.h"

/* Engine control ------------------------------------------------------- */

/*
 * Busy engine threads (the command processor in a command, a core in a
 * tile) may move data; parked ones may not. A VM stop waits until every
 * busy thread is parked (npu.c, npu_vm_state_change).
 */
static void npu_engine_enter(NpuState *s)
{
    qemu_mutex_lock(&s->lock);
    s->busy++;
    qemu_mutex_unlock(&s->lock);
}

static void npu_engine_leave(NpuState *s)
{
    qemu_mutex_lock(&s->lock);
    s->busy--;
    qemu_cond_broadcast(&s->parked_cond);
    qemu_mutex_unlock(&s->lock);
}

/* The calling busy thread waits for others: it moves no data meanwhile. */
static void npu_engine_idle(NpuState *s)
{
    qemu_mutex_lock(&s->lock);
    s->parked++;
    qemu_cond_broadcast(&s->parked_cond);
    qemu_mutex_unlock(&s->lock);
}

/* ... and goes on: once the VM runs (or the command is aborted). */
static void npu_engine_wake(NpuState *s)
{
    qemu_mutex_lock(&s->lock);
    while (s->paused && !qatomic_read(&s->abort)) {
        qemu_cond_wait(&s->resume, &s->lock);
    }
    s->parked--;
    qemu_mutex_unlock(&s->lock);
}

static bool npu_preempt_wanted(NpuState *s);
static void npu_cores_pause(NpuState *s);

/*
 * A control point of the running command (any engine thread, no lock):
 * NPU_ST_ABORTED after a reset or unplug request or once its queue was
 * disabled (a new generation), NPU_ST_TIMEOUT once the
 * command ran past its budget; waits here while the VM is stopped. On the
 * command processor it is also a preemption point: there no job is
 * published (the cores are idle), so a nested command can use them, and
 * it has buffers of its own (NpuLevel).
 */
uint32_t npu_engine_poll(NpuState *s)
{
    uint32_t depth;
    NpuQueue *q;

    if (npu_preempt_wanted(s)) {
        if (qemu_thread_is_self(&s->thread)) {
            npu_preempt(s);
        } else {
            npu_cores_pause(s);
        }
    }
    if (qatomic_read(&s->paused)) {
        npu_engine_idle(s);
        npu_engine_wake(s);
    }
    depth = qatomic_read(&s->depth);
    q = &s->q[qatomic_read(&s->run_queue[depth])];
    /* A reset, or its queue disabled since it started (spec 5.2) */
    if (qatomic_read(&s->abort) ||
        qatomic_read(&q->gen) != qatomic_read(&s->run_gen[depth])) {
        return NPU_ST_ABORTED;
    }
    if (qemu_clock_get_ns(QEMU_CLOCK_REALTIME) >
        qatomic_read(&s->deadline_ns)) {
        return NPU_ST_TIMEOUT;
    }
    /* The running command moves on (NPU_Q_PROGRESS of its queue) */
    qatomic_inc(&q->progress);
    return NPU_ST_OK;
}

/*
 * Is the running command being stopped (a reset or unplug, or past its
 * budget)? Then its large frees wait until the device has answered.
 */
bool npu_engine_stopping(NpuState *s)
{
    return qatomic_read(&s->abort) ||
           qemu_clock_get_ns(QEMU_CLOCK_REALTIME) >
           qatomic_read(&s->deadline_ns);
}

/*
 * Account @work units (about one multiply-add or byte each) done by a
 * kernel between its control points; polls when a quantum is complete.
 */
uint32_t npu_engine_work(NpuCore *core, uint64_t work)
{
    core->work += work;
    if (core->work < NPU_POLL_QUANTUM) {
        return NPU_ST_OK;
    }
    core->work = 0;
    return npu_engine_poll(core->s);
}

/*
 * @core's workspace of at least @size bytes (64-byte aligned), kept for
 * its next tiles and charged to the device's memory budget while kept;
 * NULL if the budget or the host has no memory for it.
 */
void *npu_core_scratch(NpuCore *core, size_t size)
{
    NpuState *s = core->s;
    uint64_t used;

    size = MAX(size, 64);           /* never NULL for an empty request */
    if (core->scratch_size < size) {
        qemu_vfree(core->scratch);
        qatomic_sub(&s->mem_used, core->scratch_size);
        core->scratch = NULL;
        core->scratch_size = 0;
        used = qatomic_add_fetch(&s->mem_used, size);
        if (used > s->mem_budget) {
            qatomic_sub(&s->mem_used, size);
            trace_npu_budget(size, used - size, s->mem_budget);
            npu_guest_error("npu: %zu bytes of kernel scratch exceed the"
                            " device's host memory budget\n", size);
            return NULL;
        }
        core->scratch = qemu_try_memalign(64, size);
        if (!core->scratch) {
            qatomic_sub(&s->mem_used, size);
            return NULL;
        }
        core->scratch_size = size;
    }
    return core->scratch;
}

/* Free what a core holds besides its thread. */
void npu_core_release(NpuCore *core)
{
    npu_scratch_free(core->s, core);
    g_free(core->chunk);
    core->chunk = NULL;
    qemu_vfree(core->scratch);
    qatomic_sub(&core->s->mem_used, core->scratch_size);
    core->scratch = NULL;
    core->scratch_size = 0;
}

/* Should the job running now give way to a higher-priority command? */
static bool npu_preempt_wanted(NpuState *s)
{
    /* Neither a group nor a modelled command (12.2) is preempted. */
    return !s->chip && qatomic_read(&s->preempt) &&
           !qatomic_read(&s->in_group) &&
           qatomic_read(&s->depth) + 1 < NPU_LEVELS;
}

/* Cores --------------------------------------------------------------- */

/*
 * A control point of an AI core saw a preemption wanted: pause the
 * innermost published job, so that no core takes another tile of it, and
 * wake the command processor, which runs the newcomer at once while the
 * tiles already running finish (npu_cores_run).
 */
static void npu_cores_pause(NpuState *s)
{
    NpuCores *c = &s->cores;

    qemu_mutex_lock(&c->lock);
    if (c->job && !c->job->paused) {
        c->job->paused = true;
        qemu_cond_broadcast(&c->done);
    }
    qemu_mutex_unlock(&c->lock);
}

/* Run tile [@begin, @end) of @job on @core, logged in the trace ring. */
static uint32_t npu_tile(NpuState *s, NpuJob *job, NpuCore *core,
                         uint64_t begin, uint64_t end)
{
    NpuTraceCtx saved = npu_trace_enter(job->owner.queue, job->owner.fence);
    uint32_t st;

    npu_trace(s, NPU_TR_TILE_START, 0, begin / job->grain);
    st = job->fn(core, job->opaque, begin, end);
    npu_trace(s, NPU_TR_TILE_END, st, begin / job->grain);
    npu_trace_leave(saved);
    return st;
}

/*
 * Run tiles of @job until none is left; called with the lock. Only the
 * innermost published job (c->job) gives way to a preemption; the tiles a
 * group member shares (c->shared) are part of a command already running.
 */
static void npu_cores_drain_locked(NpuCores *c, NpuCore *core, NpuJob *job)
{
    NpuState *s = core->s;

    while (job->next < job->total && !job->paused) {
        uint64_t begin = job->next;
        uint64_t end = MIN(job->total, begin + job->grain);
        uint32_t st;

        if (job == c->job && npu_preempt_wanted(s)) {
            job->paused = true;     /* the command processor takes over */
            break;
        }
        job->next = end;
        job->running++;
        qemu_mutex_unlock(&c->lock);
        npu_engine_enter(s);
        st = npu_engine_poll(s);
        if (st == NPU_ST_OK) {
            int64_t t0 = npu_now_ns();

            st = npu_tile(s, job, core, begin, end);
            qatomic_add(&core->busy_ns, npu_now_ns() - t0);
        }
        npu_engine_leave(s);
        qemu_mutex_lock(&c->lock);
        job->running--;
        if (st != NPU_ST_OK && job->status == NPU_ST_OK) {
            job->status = st;
            job->next = job->total; /* the command failed: skip the rest */
        }
    }
    if (!job->running) {
        qemu_cond_broadcast(&c->done);
    }
}

static bool npu_cores_have_work_locked(NpuCores *c)
{
    return c->job && c->job->next < c->job->total && !c->job->paused;
}

/* The running group's members, if one is not taken yet. */
static NpuJob *npu_cores_group_locked(NpuCores *c)
{
    return c->group && c->group->next < c->group->total ? c->group : NULL;
}

/* Tiles a group member shares with idle cores, if any are left. */
static NpuJob *npu_cores_shared_locked(NpuCores *c)
{
    uint32_t i;

    for (i = 0; i < NPU_GROUP_MAX; i++) {
        if (c->shared[i] && c->shared[i]->next < c->shared[i]->total) {
            return c->shared[i];
        }
    }
    return NULL;
}

static void *npu_core_thread(void *opaque)
{
    NpuCore *core = opaque;
    NpuCores *c = core->cores;

    npu_trace_set_core(core->index);
    qemu_mutex_lock(&c->lock);
    while (!c->stop) {
        /*
         * A group's members start first, even while the command processor
         * has tiles of its own member out; then tiles; then a member's.
         */
        NpuJob *job = npu_cores_group_locked(c) ?:
                      (npu_cores_have_work_locked(c) ? c->job :
                       npu_cores_shared_locked(c));

        if (job) {
            npu_cores_drain_locked(c, core, job);
        } else {
            qemu_cond_wait(&c->work, &c->lock);
        }
    }
    qemu_mutex_unlock(&c->lock);
    return NULL;
}

void npu_cores_init(NpuState *s, uint32_t n)
{
    NpuCores *c = &s->cores;
    uint32_t i;

    qemu_mutex_init(&c->lock);
    qemu_cond_init(&c->work);
    qemu_cond_init(&c->done);
    c->n = n;
    c->job = NULL;
    c->core = g_new0(NpuCore, n);
    for (i = 0; i < n; i++) {
        char name[24];

        c->core[i].s = s;
        c->core[i].cores = c;
        c->core[i].index = i;
        c->core[i].chunk = g_malloc(NPU_CHUNK);
        snprintf(name, sizeof(name), "npu-core%u", i);
        qemu_thread_create(&c->core[i].thread, name, npu_core_thread,
                           &c->core[i], QEMU_THREAD_JOINABLE);
    }
}

void npu_cores_fini(NpuState *s)
{
    NpuCores *c = &s->cores;
    uint32_t i;

    qemu_mutex_lock(&c->lock);
    c->stop = true;
    qemu_cond_broadcast(&c->work);
    qemu_mutex_unlock(&c->lock);
    for (i = 0; i < c->n; i++) {
        qemu_thread_join(&c->core[i].thread);
        npu_core_release(&c->core[i]);
    }
    g_free(c->core);
    qemu_cond_destroy(&c->done);
    qemu_cond_destroy(&c->work);
    qemu_mutex_destroy(&c->lock);
}

/*
 * Run @fn over [0, total) in tiles of @grain units on the cores and wait for
 * all of them, running preempting commands in between. Returns NPU_ST_OK or
 * the first failing tile's status. Only the command processor calls this;
 * a nested call (a preempting command's job) saves and restores the job it
 * interrupts.
 */
static uint32_t npu_cores_run(NpuState *s, NpuTileFn fn, void *opaque,
                              uint64_t total, uint64_t grain)
{
    NpuCores *c = &s->cores;
    NpuJob job = {
        .fn = fn, .opaque = opaque, .total = total, .grain = grain,
        .status = NPU_ST_OK, .owner = npu_trace_current(),
    };
    NpuJob *outer;

    npu_engine_idle(s);     /* the cores move the data */
    qemu_mutex_lock(&c->lock);
    outer = c->job;
    c->job = &job;
    qemu_cond_broadcast(&c->work);
    for (;;) {
        while (!job.paused && (job.next < job.total || job.running)) {
            qemu_cond_wait(&c->done, &c->lock);
        }
        if (!job.paused) {
            break;
        }
        /*
         * Preempted at a tile boundary or a core's control point: run the
         * newcomer now (its own level's buffers; the tiles still running
         * finish meanwhile and take no others), then resume.
         */
        qemu_mutex_unlock(&c->lock);
        npu_engine_wake(s);
        npu_preempt(s);
        npu_engine_idle(s);
        qemu_mutex_lock(&c->lock);
        c->job = &job;
        job.paused = false;
        qemu_cond_broadcast(&c->work);
    }
    c->job = outer;
    qemu_mutex_unlock(&c->lock);
    npu_engine_wake(s);
    return job.status;
}

/*
 * The AI core running a member of a concurrent group on this thread, if
 * any: that command runs alone on it, its tiles inline.
 */
static __thread NpuCore *npu_member_core;

NpuCore *npu_cmd_core(NpuState *s)
{
    return npu_member_core ?: &s->level[s->depth].core;
}

typedef struct NpuMembersJob {
    NpuTileFn fn;
    void *opaque;
} NpuMembersJob;

static uint32_t npu_member_tile(NpuCore *core, void *opaque, uint64_t begin,
                                uint64_t end)
{
    NpuMembersJob *job = opaque;

    npu_member_core = core;
    job->fn(core, job->opaque, begin, end);
    npu_member_core = NULL;
    return NPU_ST_OK;   /* each member keeps its own status */
}

/*
 * A group member's tiled job, on the core that runs the member (already a
 * busy engine thread): its tiles run here and on the cores that have no
 * member to run; it returns once all are done, with the first failing
 * tile's status.
 */
static uint32_t npu_cores_share(NpuState *s, NpuCore *core, NpuTileFn fn,
                                void *opaque, uint64_t total, uint64_t grain)
{
    NpuCores *c = &s->cores;
    NpuJob job = {
        .fn = fn, .opaque = opaque, .total = total, .grain = grain,
        .status = NPU_ST_OK, .owner = npu_trace_current(),
    };
    uint32_t slot;

    qemu_mutex_lock(&c->lock);
    for (slot = 0; c->shared[slot]; slot++) {
        assert(slot + 1 < NPU_GROUP_MAX);   /* one per member at most */
    }
    c->shared[slot] = &job;
    qemu_cond_broadcast(&c->work);
    while (job.next < job.total) {
        uint64_t begin = job.next;
        uint64_t end = MIN(job.total, begin + job.grain);
        uint32_t st;

        job.next = end;
        job.running++;
        qemu_mutex_unlock(&c->lock);
        st = npu_engine_poll(s);
        if (st == NPU_ST_OK) {
            st = npu_tile(s, &job, core, begin, end);
        }
        qemu_mutex_lock(&c->lock);
        job.running--;
        if (st != NPU_ST_OK && job.status == NPU_ST_OK) {
            job.status = st;
            job.next = job.total;
        }
    }
    c->shared[slot] = NULL;
    if (job.running) {
        /*
         * Helpers still run tiles: wait, parked for a VM stop meanwhile;
         * the wait is not busy time of this core.
         */
        int64_t t0 = npu_now_ns();

        qemu_mutex_unlock(&c->lock);
        npu_engine_idle(s);
        qemu_mutex_lock(&c->lock);
        while (job.running) {
            qemu_cond_wait(&c->done, &c->lock);
        }
        qemu_mutex_unlock(&c->lock);
        npu_engine_wake(s);
        qatomic_sub(&core->busy_ns, npu_now_ns() - t0);
        return job.status;
    }
    qemu_mutex_unlock(&c->lock);
    return job.status;
}

/*
 * Run the @n commands of a concurrent group at once (the command
 * processor only, not a core): the first on the command processor, as a
 * command alone runs (its large jobs on the cores), each other one whole
 * on an AI core; a core left without a member helps with the tiles of the
 * others (npu_cores_share). @fn records each member's status itself: one
 * failing member does not stop the others. A group is not preempted: a
 * higher priority waits for the whole group.
 */
void npu_run_members(NpuState *s, NpuTileFn fn, void *opaque, uint32_t n)
{
    NpuCores *c = &s->cores;
    NpuMembersJob mj = { .fn = fn, .opaque = opaque };
    NpuJob job = {
        .fn = npu_member_tile, .opaque = &mj, .total = n, .grain = 1,
        .next = 1, .status = NPU_ST_OK,    /* member 0 is ours */
    };

    assert(n > 1 && n <= s->cores.n && !npu_member_core);
    qatomic_set(&s->in_group, true);
    qemu_mutex_lock(&c->lock);
    assert(!c->group);      /* no preemption during a group: never nested */
    c->group = &job;
    qemu_cond_broadcast(&c->work);
    qemu_mutex_unlock(&c->lock);

    fn(&s->level[s->depth].core, opaque, 0, 1);

    npu_engine_idle(s);     /* the cores move the data */
    qemu_mutex_lock(&c->lock);
    while (job.next < job.total || job.running) {
        qemu_cond_wait(&c->done, &c->lock);
    }
    c->group = NULL;
    qemu_mutex_unlock(&c->lock);
    npu_engine_wake(s);
    qatomic_set(&s->in_group, false);
}

/*
 * Run a tiled job: on the cores, or inline on the command processor (one
 * core, or a job of a single tile) or on the core a group member runs on.
 * Either way every tile boundary is a control point, and on the command
 * processor a preemption point.
 */
uint32_t npu_run_tiles(NpuState *s, NpuTileFn fn, void *job, uint64_t total,
                       uint64_t grain)
{
    NpuCore *cp = npu_cmd_core(s);
    uint64_t begin;
    uint32_t st;

    grain = MAX(grain, 1);
    if (total > grain && s->cores.n > 1 && npu_member_core) {
        return npu_cores_share(s, npu_member_core, fn, job, total, grain);
    }
    if (total > grain && s->cores.n > 1) {
        return npu_cores_run(s, fn, job, total, grain);
    }
    for (begin = 0; begin < total; begin += grain) {
        st = npu_engine_poll(s);
        if (st == NPU_ST_OK) {
            npu_trace(s, NPU_TR_TILE_START, 0, begin / grain);
            st = fn(cp, job, begin, MIN(total, begin + grain));
            npu_trace(s, NPU_TR_TILE_END, st, begin / grain);
        }
        if (st != NPU_ST_OK) {
            return st;
        }
    }
    return NPU_ST_OK;
}
