/*
 * NPU device MMU: translation of device virtual addresses through the
 * two-level table described in npu_hw.h, and the DMA helpers every command
 * uses to move bytes between guest memory and the engine.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/atomic.h"
#include "qemu/log.h"
#include "qemu/units.h"
#include "hw/pci/pci.h"
#include "qemu/rcu.h"
#include "hw/misc/trace.h"
#include "npu_dev.h"

/*
 * Every engine access to guest memory - descriptors, completions, fences,
 * page tables, the firmware image and log, trace records, tensor data - is
 * a PCI DMA transaction (through the vIOMMU, if any) to RAM the host can
 * access directly, and nothing else. The target is translated, checked and
 * referenced within one RCU section and copied while referenced, so a
 * memory map that changes meanwhile (a BAR moving, PAM or SMRAM toggled on
 * another vCPU) can neither swap in a bounce buffer nor free the RAM under
 * the copy. ROM and read-only RAM are read, never written; MMIO (any
 * device's registers, PCI configuration space through ECAM), RAM device
 * regions (VFIO BARs), ROM devices out of ROMD mode and unassigned space
 * are refused without being touched. QEMU takes the BQL for every access
 * that is not direct, so the engine thread never needs it, and a vCPU that
 * waits for the engine cannot deadlock with it (docs/npu-spec.md 13). No
 * command can reset a bus, power off a slot, ring a doorbell or unplug
 * this very device. RAM-backed BARs (another NPU's device memory) stay
 * reachable; this device's own BARs are refused by the callers.
 */
static const MemTxAttrs npu_dma_attrs = { .memory = 1 };

/*
 * Map the run of at most *plen bytes at address @addr of @as if it is RAM
 * the engine may access directly for @write; *plen is then the run's
 * length (never 0) and the region holds a reference until npu_ram_unmap().
 * Returns NULL when it is not (*plen: the length of the refused run).
 */
static void *npu_ram_map(AddressSpace *as, uint64_t addr, hwaddr *plen,
                         bool write)
{
    MemoryRegion *mr;
    hwaddr xlat;

    RCU_READ_LOCK_GUARD();
    mr = address_space_translate(as, addr, &xlat, plen, write,
                                 npu_dma_attrs);
    if (!*plen || !memory_access_is_direct(mr, write, npu_dma_attrs)) {
        *plen = MAX(*plen, 1);
        return NULL;
    }
    memory_region_ref(mr);
    return (uint8_t *)memory_region_get_ram_ptr(mr) + xlat;
}

/*
 * Drop a npu_ram_map() mapping: for a write, the first @done bytes are
 * marked dirty (migration, display) and any translated guest code in them
 * is invalidated, as QEMU's own DMA does.
 */
static void npu_ram_unmap(AddressSpace *as, void *p, hwaddr len, bool write,
                          hwaddr done)
{
    address_space_unmap(as, p, len, write, write ? done : 0);
}

static MemTxResult npu_dma_rw(NpuState *s, const char *what, uint64_t addr,
                              void *buf, uint64_t len, bool write)
{
    AddressSpace *as = pci_get_address_space(&s->parent_obj);
    uint8_t *b = buf;
    uint64_t end;

    if (uadd64_overflow(addr, len, &end)) {
        trace_npu_dma_error(what, addr, len, write, MEMTX_DECODE_ERROR);
        return MEMTX_DECODE_ERROR;
    }
    smp_mb();   /* as dma_barrier(): what the engine did before, first */
    while (len) {
        hwaddr l = len;
        void *p = npu_ram_map(as, addr, &l, write);

        if (!p) {
            npu_guest_error("npu: %s DMA %s 0x%" PRIx64
                            " refused: not RAM the device may %s\n", what,
                            write ? "to" : "from", addr,
                            write ? "write" : "read");
            trace_npu_dma_error(what, addr, len, write, MEMTX_ACCESS_ERROR);
            return MEMTX_ACCESS_ERROR;
        }
        if (write) {
            memcpy(p, b, l);
        } else {
            memcpy(b, p, l);
        }
        npu_ram_unmap(as, p, l, write, l);
        addr += l;
        b += l;
        len -= l;
    }
    return MEMTX_OK;
}

MemTxResult npu_dma_read(NpuState *s, const char *what, uint64_t addr,
                         void *buf, uint64_t len)
{
    return npu_dma_rw(s, what, addr, buf, len, false);
}

MemTxResult npu_dma_write(NpuState *s, const char *what, uint64_t addr,
                          const void *buf, uint64_t len)
{
    return npu_dma_rw(s, what, addr, (void *)buf, len, true);
}

/*
 * Take a new snapshot of the memory BARs (BQL held: a configuration write
 * or a reset, the only times they move).
 */
void npu_bars_update(NpuState *s)
{
    PCIDevice *pdev = &s->parent_obj;
    NpuBars b = { };
    int i;

    for (i = 0; i < PCI_NUM_REGIONS; i++) {
        pcibus_t base = pci_get_bar_addr(pdev, i);
        pcibus_t size = pdev->io_regions[i].size;

        if (size && base != PCI_BAR_UNMAPPED &&
            !(pdev->io_regions[i].type & PCI_BASE_ADDRESS_SPACE_IO)) {
            b.lo[i] = base;
            b.hi[i] = base + size;
        }
    }
    qemu_mutex_lock(&s->lock);
    s->bars = b;
    qemu_mutex_unlock(&s->lock);
}

/* Does [addr, addr + len) overlap a BAR of this device? */
bool npu_hits_own_bar(const NpuBars *bars, uint64_t addr, uint64_t len)
{
    int i;

    for (i = 0; i < PCI_NUM_REGIONS; i++) {
        if (bars->hi[i] && addr < bars->hi[i] && bars->lo[i] < addr + len) {
            return true;
        }
    }
    return false;
}

/* Is [addr, addr + len) a non-empty range that does not wrap? */
static bool npu_range_sane(uint64_t addr, uint64_t len)
{
    uint64_t end;

    return len && !uadd64_overflow(addr, len, &end);
}

/*
 * Is [addr, addr + len) RAM the engine may access for @write as the memory
 * map stands now? Checked when the guest programs a ring or a log, and
 * again on every access (npu_dma_rw()), since the map may change between.
 * Behind a vIOMMU a bus address means nothing until it is used (and
 * translating it now could report a fault the guest never caused), so
 * there only the use checks.
 */
static bool npu_ram_range_ok(NpuState *s, uint64_t addr, uint64_t len,
                             bool write)
{
    AddressSpace *as = pci_device_iommu_address_space(&s->parent_obj);

    if (as != &address_space_memory) {
        return true;
    }
    while (len) {
        hwaddr l = len;
        void *p = npu_ram_map(as, addr, &l, write);

        if (!p) {
            return false;
        }
        npu_ram_unmap(as, p, l, false, 0);
        addr += l;
        len -= l;
    }
    return true;
}

/*
 * May the device DMA to [addr, addr + len) (@write: into it)? Not if the
 * range wraps, overlaps one of its own BARs (BAR2 is RAM, so the RAM rule
 * alone would let it through) or is not RAM the engine may access so.
 * Called with the lock.
 */
bool npu_dma_range_ok_locked(NpuState *s, uint64_t addr, uint64_t len,
                             bool write)
{
    return npu_range_sane(addr, len) &&
           !npu_hits_own_bar(&s->bars, addr, len) &&
           npu_ram_range_ok(s, addr, len, write);
}

/* The same check against a command's snapshot, outside the lock. */
static bool npu_walk_range_ok(const NpuWalk *w, uint64_t addr, uint64_t len)
{
    return npu_range_sane(addr, len) && !npu_hits_own_bar(&w->bars, addr, len);
}

/*
 * Snapshot the MMU configuration for one command of queue @qi (called with
 * the lock): the queue's own address space if it has one, else the
 * device-wide one.
 */
void npu_walk_init_locked(NpuState *s, NpuWalk *w, int qi)
{
    const NpuQueue *q = &s->q[qi];

    w->queue = qi;
    w->stats = NULL;        /* the command processor points it */
    w->ctx = 0;
    w->ctx_base = s->mmu_ctx_base;
    w->ctx_count = s->mmu_ctx_count;
    w->confined = q->mmu_l1_entries != 0;
    if (w->confined) {
        w->enabled = true;
        w->l1_base = q->mmu_l1_base;
        w->l1_entries = q->mmu_l1_entries;
    } else {
        w->enabled = s->mmu_control & NPU_MMU_ENABLE;
        w->l1_base = s->mmu_l1_base;
        w->l1_entries = s->mmu_l1_entries;
    }
    w->victim = 0;
    w->refills = 0;
    w->bars = s->bars;
    memset(w->cached_l1, 0xff, sizeof(w->cached_l1));
}

/*
 * Record a fault. Tiles walk with copies of the command's NpuWalk, so
 * nothing is noted in @w itself: the count @w->faults points to is the
 * command's own (NpuMember.faults), shared by all its copies.
 */
static uint32_t npu_fault(NpuState *s, const NpuWalk *w, uint64_t va,
                          uint32_t info)
{
    npu_guest_error("npu: MMU fault at VA 0x%" PRIx64
                    " (info 0x%x, queue %d, ctx %u)\n", va, info, w->queue,
                    w->ctx);
    trace_npu_mmu_fault(w->queue, w->ctx, va, info);
    qemu_mutex_lock(&s->lock);
    s->mmu_fault_addr = va;
    s->mmu_fault_info = info;
    s->mmu_fault_queue = w->queue;
    s->mmu_fault_ctx = w->ctx;
    s->mmu_faults++;
    w->stats->faults++;
    qemu_mutex_unlock(&s->lock);
    return NPU_ST_MMU_FAULT;
}

/*
 * Switch the walk to the address space a descriptor names (outside the
 * lock, before the command runs). ctx 0 keeps the queue's space; a
 * confined queue may name no other, and any other ctx must be a valid
 * context table entry. Returns NPU_ST_OK or the fault.
 */
uint32_t npu_walk_select(NpuState *s, NpuWalk *w, uint32_t ctx)
{
    struct npu_mmu_ctx_entry e;
    uint64_t addr;

    w->ctx = ctx;
    if (!ctx) {
        return NPU_ST_OK;
    }
    if (w->confined || ctx >= w->ctx_count) {
        return npu_fault(s, w, 0, NPU_FAULT_CTX);
    }
    addr = w->ctx_base + (uint64_t)ctx * sizeof(e);
    if (!npu_walk_range_ok(w, addr, sizeof(e)) ||
        npu_dma_read(s, "context entry", addr, &e, sizeof(e)) != MEMTX_OK) {
        npu_guest_error("npu: context table read failed\n");
        return NPU_ST_DMA_ERROR;
    }
    e.l1 = le64_to_cpu(e.l1);
    e.l1_entries = le32_to_cpu(e.l1_entries);
    if (!(e.l1 & NPU_PTE_VALID) || !e.l1_entries ||
        e.l1_entries > NPU_MMU_MAX_L1 || e.rsvd) {
        return npu_fault(s, w, 0, NPU_FAULT_CTX);
    }
    w->enabled = true;
    w->l1_base = e.l1 & NPU_PTE_ADDR_MASK;
    w->l1_entries = e.l1_entries;
    return NPU_ST_OK;
}

/* L2 tables (4 KiB each) a walk reads between two control points. */
#define NPU_WALK_POLL_REFILLS 1024

/*
 * Translate the page holding @va; on success *pa is the bus address, or
 * with *local the offset in device memory. Every NPU_WALK_POLL_REFILLS
 * table reads it is a control point (the command's status on a stop).
 */
static uint32_t npu_translate(NpuState *s, NpuWalk *w, uint64_t va,
                              bool write, uint64_t *pa, bool *local)
{
    uint64_t l1i = va >> NPU_MMU_L1_SHIFT;
    uint64_t l2i = (va >> NPU_PAGE_SHIFT) & (NPU_MMU_L2_ENTRIES - 1);
    uint32_t wbit = write ? NPU_FAULT_WRITE : 0;
    uint64_t pte, l2;
    uint32_t way;

    *local = false;
    if (!w->enabled) {
        *pa = va;
        return NPU_ST_OK;
    }
    if (l1i >= w->l1_entries) {
        return npu_fault(s, w, va, wbit | NPU_FAULT_RANGE);
    }
    for (way = 0; way < NPU_WALK_WAYS && w->cached_l1[way] != l1i; way++) {
        continue;
    }
    qatomic_inc(&w->stats->walks);
    if (way < NPU_WALK_WAYS) {
        qatomic_inc(&w->stats->walk_hits);
    } else {
        uint64_t l1e;

        if (!npu_walk_range_ok(w, w->l1_base + l1i * 8, 8) ||
            npu_dma_read(s, "MMU L1", w->l1_base + l1i * 8, &l1e,
                         sizeof(l1e)) != MEMTX_OK) {
            npu_guest_error("npu: MMU L1 read failed\n");
            return NPU_ST_DMA_ERROR;
        }
        l1e = le64_to_cpu(l1e);
        if (!(l1e & NPU_PTE_VALID)) {
            return npu_fault(s, w, va, wbit | NPU_FAULT_L1);
        }
        l2 = l1e & NPU_PTE_ADDR_MASK;
        way = w->victim;
        w->victim = (way + 1) % NPU_WALK_WAYS;
        w->cached_l1[way] = UINT64_MAX;
        if (!npu_walk_range_ok(w, l2, sizeof(w->l2[way])) ||
            npu_dma_read(s, "MMU L2", l2, w->l2[way], sizeof(w->l2[way])) !=
            MEMTX_OK) {
            npu_guest_error("npu: MMU L2 read failed\n");
            return NPU_ST_DMA_ERROR;
        }
        w->cached_l1[way] = l1i;
        /*
         * An access pattern can miss on every element (page tables that
         * alias one L2 table, strides of 2 MiB): the reads are work.
         */
        if (!(++w->refills % NPU_WALK_POLL_REFILLS)) {
            uint32_t st = npu_engine_poll(s);

            if (st != NPU_ST_OK) {
                return st;
            }
        }
    }
    pte = le64_to_cpu(w->l2[way][l2i]);
    if (!(pte & NPU_PTE_VALID)) {
        return npu_fault(s, w, va, wbit);
    }
    if (write && !(pte & NPU_PTE_WRITE)) {
        return npu_fault(s, w, va, wbit | NPU_FAULT_PERM);
    }
    *pa = (pte & NPU_PTE_ADDR_MASK) | (va & (NPU_PAGE_SIZE - 1));
    if (pte & NPU_PTE_LOCAL) {
        if ((pte & NPU_PTE_ADDR_MASK) >= s->mem_size) {
            return npu_fault(s, w, va, wbit | NPU_FAULT_LOCAL);
        }
        *local = true;
    }
    return NPU_ST_OK;
}

/*
 * Translate as much of [va, va + len) as is contiguous in bus address space,
 * or in device memory (*local); returns the run length in *run.
 */
static uint32_t npu_translate_run(NpuState *s, NpuWalk *w, uint64_t va,
                                  uint64_t len, bool write, uint64_t *pa,
                                  bool *local, uint64_t *run)
{
    uint64_t n, next_pa;
    bool next_local;
    uint32_t st;

    st = npu_translate(s, w, va, write, pa, local);
    if (st != NPU_ST_OK) {
        return st;
    }
    if (!w->enabled) {
        *run = len;
        return NPU_ST_OK;
    }
    n = MIN(len, NPU_PAGE_SIZE - (va & (NPU_PAGE_SIZE - 1)));
    while (n < len) {
        st = npu_translate(s, w, va + n, write, &next_pa, &next_local);
        if (st != NPU_ST_OK) {
            return st;
        }
        if (next_pa != *pa + n || next_local != *local ||
            (*local && next_pa >= s->mem_size)) {
            break;
        }
        n += MIN(len - n, (uint64_t)NPU_PAGE_SIZE);
    }
    *run = n;
    return NPU_ST_OK;
}

/*
 * Translate the next run of [va, va + len) and check a bus address run
 * against our BARs.
 */
static uint32_t npu_map_run(NpuState *s, NpuWalk *w, uint64_t va,
                            uint64_t len, bool write, uint64_t *pa,
                            bool *local, uint64_t *run)
{
    uint32_t st = npu_translate_run(s, w, va, len, write, pa, local, run);

    if (st == NPU_ST_OK && *local) {
        *run = MIN(*run, s->mem_size - *pa);
    } else if (st == NPU_ST_OK && npu_hits_own_bar(&w->bars, *pa, *run)) {
        npu_guest_error("npu: DMA to 0x%" PRIx64
                        " targets the device's own BAR\n", *pa);
        st = NPU_ST_BAD_ADDR;
    }
    return st;
}

/* Bytes a transfer moves between two control points. */
#define NPU_XFER_QUANTUM (4 * MiB)

/*
 * Check [va, va + len) as npu_mem_rw() would, without moving data: the
 * same MMU faults (at the same VA) and own-BAR hits, in the same order.
 * A streamed op probes its inputs first, so that these errors surface
 * before anything is written, as if the inputs had been read whole.
 */
uint32_t npu_mem_probe(NpuState *s, NpuWalk *w, uint64_t va, uint64_t len,
                       bool write)
{
    bool first = true;

    while (len) {
        uint64_t pa, run;
        bool local;
        uint32_t st;

        /* 4 GiB of pages take a while to walk: as a transfer polls */
        st = first ? NPU_ST_OK : npu_engine_poll(s);
        first = false;
        if (st == NPU_ST_OK) {
            st = npu_map_run(s, w, va, MIN(len, NPU_XFER_QUANTUM), write, &pa,
                             &local, &run);
        }
        if (st != NPU_ST_OK) {
            return st;
        }
        va += run;
        len -= run;
    }
    return NPU_ST_OK;
}

/* Operand bytes a command moved (the performance counters). */
static void npu_count_bytes(NpuWalk *w, uint64_t n, bool write)
{
    qatomic_add(write ? &w->stats->write_bytes : &w->stats->read_bytes, n);
}

/*
 * Move @len bytes between device VA @va and @buf, in either direction, in
 * pieces of at most NPU_XFER_QUANTUM with a control point between two.
 * @operand: the bytes are a command's operands, which the performance
 * counters count (not a parameter block: docs/npu-spec.md 4.7).
 */
static uint32_t npu_mem_rw_run(NpuState *s, NpuWalk *w, uint64_t va,
                               void *buf, uint64_t len, bool write,
                               bool operand)
{
    uint8_t *p = buf;
    bool first = true;

    while (len) {
        uint64_t pa, run;
        bool local;
        uint32_t st;
        MemTxResult r;

        if (!first) {
            st = npu_engine_poll(s);
            if (st != NPU_ST_OK) {
                return st;
            }
        }
        first = false;
        st = npu_map_run(s, w, va, MIN(len, NPU_XFER_QUANTUM), write, &pa,
                         &local, &run);
        if (st != NPU_ST_OK) {
            return st;
        }
        if (local) {
            if (write) {
                memcpy(s->mem_ptr + pa, p, run);
            } else {
                memcpy(p, s->mem_ptr + pa, run);
            }
            if (operand) {
                npu_count_bytes(w, run, write);
            }
            va += run;
            p += run;
            len -= run;
            continue;
        }
        r = write ? npu_dma_write(s, "tensor", pa, p, run)
                  : npu_dma_read(s, "tensor", pa, p, run);
        if (r != MEMTX_OK) {
            npu_guest_error("npu: DMA %s at 0x%" PRIx64
                            " failed\n", write ? "write" : "read", pa);
            return NPU_ST_DMA_ERROR;
        }
        if (operand) {
            npu_count_bytes(w, run, write);
        }
        va += run;
        p += run;
        len -= run;
    }
    return NPU_ST_OK;
}

/* npu_mem_rw_run(), logged as one transfer in the trace ring. */
static uint32_t npu_mem_rw(NpuState *s, NpuWalk *w, uint64_t va, void *buf,
                           uint64_t len, bool write)
{
    uint32_t st;

    npu_trace(s, NPU_TR_DMA_START, write, len);
    st = npu_mem_rw_run(s, w, va, buf, len, write, true);
    npu_trace(s, NPU_TR_DMA_END, write, len);
    return st;
}

uint32_t npu_mem_read(NpuState *s, NpuWalk *w, uint64_t va, void *buf,
                      uint64_t len)
{
    return npu_mem_rw(s, w, va, buf, len, false);
}

uint32_t npu_mem_read_params(NpuState *s, NpuWalk *w, uint64_t va, void *buf,
                             uint64_t len)
{
    return npu_mem_rw_run(s, w, va, buf, len, false, false);
}

uint32_t npu_mem_write(NpuState *s, NpuWalk *w, uint64_t va, const void *buf,
                       uint64_t len)
{
    return npu_mem_rw(s, w, va, (void *)buf, len, true);
}

/*
 * Direct access for streamed tensor ops: map the run of [va, va + len)
 * that starts at @va (contiguous in bus address space, at most @len bytes,
 * translated as npu_mem_rw() does) and return a host pointer to it, its
 * length in *plen. Returns NULL with NPU_ST_OK in *st
 * when the run is not RAM the device may access in place (MMIO, ROM for a
 * write, bus mastering off, its own BARs): *plen is then the length the
 * caller should move with npu_mem_read()/npu_mem_write(), which refuse it
 * with the status a copy gets (NPU_ST_DMA_ERROR, or NPU_ST_BAD_ADDR for
 * the device's own BARs).
 */
void *npu_mem_map(NpuState *s, NpuWalk *w, uint64_t va, uint64_t len,
                  bool write, uint64_t *plen, uint32_t *st)
{
    uint64_t pa, run;
    bool local;
    hwaddr l;
    void *p;

    *plen = 0;
    *st = npu_translate_run(s, w, va, len, write, &pa, &local, &run);
    if (*st != NPU_ST_OK) {
        return NULL;
    }
    if (local) {
        *plen = MIN(run, s->mem_size - pa);
        npu_count_bytes(w, *plen, write);
        return s->mem_ptr + pa;
    }
    /*
     * BAR2 is RAM, so a bus run reaching one of our BARs would map it;
     * leave such a run to the copy, which refuses it (NPU_ST_BAD_ADDR).
     * Device memory is reachable through local PTEs only.
     */
    if (npu_hits_own_bar(&w->bars, pa, run)) {
        *plen = run;
        return NULL;
    }
    l = run;
    p = npu_ram_map(pci_get_address_space(&s->parent_obj), pa, &l, write);
    *plen = MIN(l, run);
    if (p) {
        npu_count_bytes(w, *plen, write);
    }
    return p;
}

/* Release a npu_mem_map() mapping; @done bytes from its start were written. */
void npu_mem_unmap(NpuState *s, void *p, uint64_t len, bool write,
                   uint64_t done)
{
    uint8_t *b = p;

    if (s->mem_ptr && b >= s->mem_ptr && b < s->mem_ptr + s->mem_size) {
        return;     /* device memory: nothing was mapped */
    }
    npu_ram_unmap(pci_get_address_space(&s->parent_obj), p, len, write,
                  done);
}
