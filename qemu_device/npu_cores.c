/*
 * NPU AI cores: a pool of worker threads ("cores") that execute the tiles
 * of one command in parallel. The command processor splits a large command
 * into independent tiles, hands them to the cores and waits until all are
 * done, so commands still complete in queue order.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/units.h"
#include "npu_dev.h"

/* Run tiles of the current job until none is left; called with the lock. */
static void npu_cores_drain_locked(NpuCores *c, NpuCore *core)
{
    while (c->next < c->total) {
        uint64_t begin = c->next;
        uint64_t end = MIN(c->total, begin + c->grain);
        uint32_t st;

        c->next = end;
        c->running++;
        qemu_mutex_unlock(&c->lock);
        st = c->fn(core, c->opaque, begin, end);
        qemu_mutex_lock(&c->lock);
        c->running--;
        if (st != NPU_ST_OK && c->status == NPU_ST_OK) {
            c->status = st;
            c->next = c->total;     /* the command failed: skip the rest */
        }
    }
    if (!c->running) {
        qemu_cond_broadcast(&c->done);
    }
}

static void *npu_core_thread(void *opaque)
{
    NpuCore *core = opaque;
    NpuCores *c = core->cores;

    qemu_mutex_lock(&c->lock);
    while (!c->stop) {
        if (c->next < c->total) {
            npu_cores_drain_locked(c, core);
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
        g_free(c->core[i].chunk);
    }
    g_free(c->core);
    npu_scratch_free(s);
    qemu_cond_destroy(&c->done);
    qemu_cond_destroy(&c->work);
    qemu_mutex_destroy(&c->lock);
}

/*
 * Run fn over [0, total) in tiles of @grain units on the cores and wait for
 * all of them. Returns NPU_ST_OK or the first failing tile's status. Only
 * the command processor calls this, one command at a time.
 */
uint32_t npu_cores_run(NpuState *s, NpuTileFn fn, void *opaque,
                       uint64_t total, uint64_t grain)
{
    NpuCores *c = &s->cores;
    uint32_t st;

    qemu_mutex_lock(&c->lock);
    c->fn = fn;
    c->opaque = opaque;
    c->grain = MAX(grain, 1);
    c->next = 0;
    c->total = total;
    c->status = NPU_ST_OK;
    c->running = 0;
    qemu_cond_broadcast(&c->work);
    while (c->next < c->total || c->running) {
        qemu_cond_wait(&c->done, &c->lock);
    }
    st = c->status;
    c->total = 0;
    c->next = 0;
    qemu_mutex_unlock(&c->lock);
    return st;
}
