"""rmmod/insmod cycles with work in each: no leak of slab objects or memory.

Every cycle unloads and reloads npu.ko, then opens the device, creates,
maps and fills a BO, runs a GEMM, checks fdinfo and closes. After two
warm-up cycles (first-use allocations of the kernel: kernfs nodes, slab
pages) the live kmalloc objects and MemFree are sampled; after all cycles
they are compared.

Counting: the test session's guest boots with ``slub_debug=U`` for the
kmalloc caches (tests/conftest.py), so SLUB knows the call site of every
live object and the count is exact per call site
(/sys/kernel/debug/slab/<cache>/alloc_traces): a call site with one object
more per cycle fails, in the short run (5 cycles) as in the full one. A
call site that grows is sampled again after as many cycles more, and only
growth in both batches fails (a leak grows linearly; a pool the kernel
frees lazily does not). The message names the call stack.

Without tracking (a guest booted by hand), the fallback is /proc/slabinfo's
active objects per cache, which move by whole slabs (each CPU's current
slab counts as full): each cache may then grow by one slab per CPU plus a
quarter of the cycles, so only the full run catches a small leak.

MemFree moves by up to ~40 MiB between samples on its own (pages
on the per-CPU free lists are not counted), so it may drop by at most
48 MiB: leaking one cycle's DMA memory (ring 512 KiB, completions 128 KiB,
parameter blocks 1 MiB, page tables: ~1.7 MiB) shows over the full run's
50 cycles (~85 MiB), not over the short run's 5. The exact counters
(bo_count/bo_bytes, module refcount) are checked in every cycle.

Size: NPU_STRESS_MODULE_CYCLES (full 50, short 5).
"""

from __future__ import annotations

import os
import subprocess
import time

import numpy as np

from npu import ops

from . import stress_util as su


def _slabinfo_objsperslab() -> dict[str, int]:
    out = {}
    with open("/proc/slabinfo") as f:
        for line in f:
            if line.startswith(("slabinfo", "#")):
                continue
            p = line.split()
            out[p[0]] = int(p[4])
    return out


def _one_job() -> None:
    fd = os.open(su.DEV_PATH, os.O_RDWR)
    try:
        bo = su.Bo(fd, 64 * 1024)
        m = bo.map()
        su.wait(fd, su.submit(fd, [ops.fill(bo, 0xC0FFEE00, bo.size).pack()]))
        assert (np.frombuffer(m, np.uint32) == 0xC0FFEE00).all()
        d = 32
        a, b, c = (su.Bo(fd, d * d * 4) for _ in range(3))
        su.wait(fd, su.submit(fd, [ops.gemm(a, b, c, d, d, d).pack()]))
        info = su.fdinfo(fd)
        assert info["npu-bo-count"] == "4", info
        assert info["npu-memory-host"] == "76 KiB", info
        m.close()
    finally:
        os.close(fd)


def _cycle() -> None:
    su.rmmod()
    assert not os.path.exists("/sys/module/npu")
    su.insmod()
    assert su.read_int("/sys/module/npu/refcnt") == 0
    # No BO after load: the driver's own (parameter arenas) are per file
    # and not counted.
    count, nbytes = su.bo_counters()
    assert (count, nbytes) == (0, 0)
    _one_job()
    assert su.bo_counters() == (count, nbytes)
    assert su.read_int("/sys/module/npu/refcnt") == 0


def test_rmmod_refuses_while_a_file_is_open_and_works_after_close():
    fd = os.open(su.DEV_PATH, os.O_RDWR)
    try:
        # The open file holds the module (file operations and cdev owner).
        assert su.read_int("/sys/module/npu/refcnt") > 0
        r = subprocess.run(["rmmod", "npu"], capture_output=True, text=True)
        assert r.returncode != 0 and "in use" in r.stderr, r
        assert su.module_loaded()
    finally:
        os.close(fd)
    _cycle()


def _grown(before, after, tolerance, names=None):
    """Keys whose count grew by more than ``tolerance(key)``."""
    return {
        name: after.get(name, 0) - n0
        for name, n0 in before.items()
        if (names is None or name in names) and after.get(name, 0) - n0 > tolerance(name)
    }


def _sample(cycles, exact):
    for _ in range(cycles):
        _cycle()
    su.drop_caches()
    time.sleep(0.5)
    return su.slab_sites() if exact else su.slab_objects()


def test_rmmod_insmod_cycles_leak_nothing(record_property):
    cycles = su.size("MODULE_CYCLES")
    assert su.read_int("/sys/module/npu/refcnt") == 0, "a device file is open"
    exact = su.slab_sites() is not None
    if exact:
        # One object per cycle from one call site is a leak.
        def tolerance(name):
            return cycles - 1
    else:
        # Without tracking, each CPU may hold a slab counted as full.
        per_slab, cpus = _slabinfo_objsperslab(), os.cpu_count() or 1

        def tolerance(name):
            return per_slab.get(name, 0) * cpus + cycles // 4

    _sample(2, exact)  # warm-up
    before, free0 = _sample(0, exact), su.free_kb()
    t0 = time.monotonic()
    after = _sample(cycles, exact)
    seconds = time.monotonic() - t0
    free1 = su.free_kb()
    grew = _grown(before, after, tolerance)
    if grew:
        # A leak grows again over as many more cycles; an object that other
        # kernel work keeps for a while (a lazily freed pool) does not.
        again = _grown(after, _sample(cycles, exact), tolerance, names=grew)
        print(f"module cycles: {grew} grew, then {again} over {cycles} more cycles")
        grew = {name: (grew[name], again[name]) for name in again}
    total = sum(after.values()) - sum(before.values())
    lsmod = subprocess.run(["lsmod"], capture_output=True, text=True).stdout
    line = next(ln for ln in lsmod.splitlines() if ln.split()[:1] == ["npu"])
    record_property("module_cycles", cycles)
    record_property("module_cycle_seconds", round(seconds, 1))
    record_property("module_kmalloc_objects_delta", total)
    record_property("module_kmalloc_count", "exact" if exact else "slabinfo")
    record_property("module_memfree_delta_kib", free0 - free1)
    print(
        f"module cycles: {cycles} in {seconds:.1f} s; kmalloc objects {total:+d} "
        f"({'per call site' if exact else 'slabinfo'}), MemFree {free1 - free0:+d} kB; "
        f"lsmod: {line}"
    )
    assert line.split()[2] == "0", f"module still used: {line}"
    assert not grew, f"kmalloc objects grew over {cycles} cycles, twice: {grew}"
    assert free0 - free1 <= 48 * 1024, f"MemFree {free0} -> {free1} kB"
