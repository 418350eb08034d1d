#!/usr/bin/env bash
# Build QEMU's libFuzzer binary (qemu-fuzz-x86_64) with the NPU device
# spliced in, for coverage-guided fuzzing of the device (docs/fuzzing.md).
#
#   build-qemu-fuzz.sh          build $NPU_CACHE/bin/qemu-fuzz-x86_64
#   build-qemu-fuzz.sh replay   also qemu-system-x86_64 of the same tree
#                               ($NPU_CACHE/bin/qemu-system-x86_64-fuzz: ASan,
#                               UBSan, -accel qtest only), to replay the
#                               fuzzer's qtest reproducers on the very device
#                               it fuzzed (run_fuzz.py --replay --qemu ...)
#   build-qemu-fuzz.sh key      print the cache key of that build
#
# Like build-qemu.sh, from Debian 13's QEMU 10.0 source with qemu_device/
# spliced into hw/misc/npu, but in a tree of its own,
# $NPU_CACHE/qemu-fuzz/<key>, where <key> hashes the Debian source version,
# this script and the list of device files. Configured with clang-14,
# --enable-fuzzing (libFuzzer), AddressSanitizer and UBSan; only what the
# fuzz target needs is built: no TCG (the fuzzer runs -accel qtest) and no
# default devices (the q35 machine and the npu only).
#
# The tree is patched for a device that does DMA from its own threads: the
# generic fuzzer's DMA callback takes a lock and writes its fills directly
# (the qtest protocol is not thread safe), QEMU_FUZZ_SETTLE_US gives the
# device time after each command, and SIGALRM is unblocked in the main
# thread so that libFuzzer's -timeout reports a deadlocked main loop. The
# patch also registers the "npu" generic-fuzz configuration
# (--fuzz-target=generic-fuzz-npu).
#
# The patch also adds the liveness oracle (docs/fuzzing.md): the system
# reset that ends each input, and each operation of it, must complete
# within QEMU_FUZZ_RESET_LIMIT_MS (50 ms for the npu, less the time its
# threads waited for a CPU; a watchdog thread aborts the main thread when
# it does not, so a hang is a crash finding), and no engine thread (named
# npu-*) may ask for the BQL (a hook in bql_lock(), system/cpus.c, aborts).
#
# The device sources are synced into the tree on every run (ninja rebuilds
# what changed). NPU_FUZZ_DEVICE_REV=<git rev> takes qemu_device/ and
# include/ from that commit instead of the working tree (to fuzz the landed
# device while the working tree is being edited); NPU_FUZZ_DEVICE_DIR=<dir>
# takes them from <dir>/qemu_device and <dir>/include (a scratch copy, e.g.
# a deliberately broken device to check the oracle). In the tree's copy,
# the device's direct RAM mapping (npu_ram_map() in npu_mmu.c) calls the
# generic fuzzer's DMA hook, as QEMU's address_space_map() does: without
# it no DMA pattern would reach the engine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/common.sh
. "$here/common.sh"

print_key=0 targets=(qemu-fuzz-x86_64)
case "${1:-}" in
key) print_key=1 ;;
replay) targets+=(qemu-system-x86_64) ;;
"") ;;
*) die "usage: build-qemu-fuzz.sh [replay|key]" ;;
esac
rev=${NPU_FUZZ_DEVICE_REV:-}
devdir=${NPU_FUZZ_DEVICE_DIR:-$NPU_ROOT}
[ -z "$rev" ] || [ -z "${NPU_FUZZ_DEVICE_DIR:-}" ] || die "NPU_FUZZ_DEVICE_REV or NPU_FUZZ_DEVICE_DIR, not both"
[ -d "$devdir/qemu_device" ] || die "no $devdir/qemu_device"

# The device's file names, from the working tree or from $rev.
device_files() {
	if [ -n "$rev" ]; then
		git -C "$NPU_ROOT" ls-tree --name-only "$rev" qemu_device/ | sed 's,^qemu_device/,,'
	else
		find "$devdir/qemu_device" -maxdepth 1 -type f -printf '%f\n'
	fi | LC_ALL=C sort
}
# Only the set of C files shapes meson.build; their contents do not.
dev_files=$(device_files | grep '\.c$' | tr '\n' ' ')
[ -n "$dev_files" ] || die "no device sources (qemu_device/${rev:+ at $rev})"
src_suite_version() {
	# No match is no error: on a fresh machine the suite has no deb-src yet.
	apt-cache showsrc qemu 2>/dev/null | awk '/^Version:/ {print $2}' | grep -E '\+deb13|^1:10\.0\.' | sort -V | tail -n1 || true
}
src_version=$(src_suite_version)
[ -n "$src_version" ] || { add_suite_src "$GUEST_SUITE"; src_version=$(src_suite_version); }
[ -n "$src_version" ] || die "apt-cache showsrc qemu found no $GUEST_SUITE source package"

key=$( { echo "$src_version"; echo "$dev_files"; cat "$here/build-qemu-fuzz.sh"; } | sha256sum | cut -c1-16)
[ $print_key = 1 ] && { echo "qemu-fuzz $key"; exit 0; }
top="$NPU_CACHE/qemu-fuzz/$key"
src="$top/src"
bld="$src/build"
out="$NPU_CACHE/bin/qemu-fuzz-x86_64"

# clang and its libFuzzer runtime (Debian 12: clang-14, libclang-rt-14-dev);
# clang's omp.h (libomp-14-dev: GCC's does not parse with clang) for the
# device's oneDNN code, which still links GCC's libgomp.
need=()
for p in clang-14 libclang-rt-14-dev libomp-14-dev; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	log "QEMU fuzz: installing ${need[*]}"
	apt-get update -qq -o DPkg::Lock::Timeout=600
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 \
		--no-install-recommends "${need[@]}" >/dev/null
fi
[ -x "$NPU_VENV/bin/python3" ] || die "no venv at $NPU_VENV (make deps)"

# The device sources, the shared contract headers and the trace events,
# staged in $top/device (from the working tree or from $rev).
stage_device_sources() {
	local st="$top/device" f
	rm -rf "$st"
	mkdir -p "$st/qemu_device" "$st/include"
	if [ -n "$rev" ]; then
		for f in $(device_files); do
			git -C "$NPU_ROOT" show "$rev:qemu_device/$f" >"$st/qemu_device/$f"
		done
		for f in $(git -C "$NPU_ROOT" ls-tree --name-only "$rev" include/ | grep '\.h$'); do
			git -C "$NPU_ROOT" show "$rev:$f" >"$st/$f"
		done
	else
		cp "$devdir"/qemu_device/* "$st/qemu_device/"
		cp "$devdir"/include/*.h "$st/include/"
	fi
	hook_dma_reads "$st/qemu_device/npu_mmu.c"
}

# The generic fuzzer fills guest RAM from a hook, fuzz_dma_read_cb(), that
# QEMU calls where it reads RAM for a device: flatview_read_continue() and
# address_space_map(). The engine maps RAM itself (address_space_translate()
# and memory_access_is_direct() in npu_ram_map(), docs/npu-spec.md 13),
# past both: call the hook there, for a read, as address_space_map() does.
hook_dma_reads() {
	local f=$1
	grep -q 'npu_ram_map' "$f" || return 0 # a device of before npu_ram_map()
	perl -0pi -e 's/(\nstatic void \*npu_ram_map\(.*?\n    memory_region_ref\(mr\);\n)/$1    if (!write) {\n        fuzz_dma_read_cb(addr, *plen, mr); \/\* generic-fuzz: fill it \*\/\n    }\n/s' "$f"
	grep -q 'fuzz_dma_read_cb' "$f" ||
		die "npu_mmu.c: no 'memory_region_ref(mr);' in npu_ram_map() to hook the fuzzer's DMA fills to"
}

# Copy them into the tree when they changed (ninja then rebuilds just those).
sync_device_sources() {
	local st="$top/device" f
	stage_device_sources
	for f in "$st"/qemu_device/*.[ch] "$st"/include/*.h; do
		cmp -s "$f" "$src/hw/misc/npu/$(basename "$f")" || cp "$f" "$src/hw/misc/npu/"
	done
	cat "$src/hw/misc/trace-events.orig" "$st/qemu_device/trace-events" >"$top/trace-events.new"
	if cmp -s "$top/trace-events.new" "$src/hw/misc/trace-events"; then
		rm "$top/trace-events.new"
	else
		mv "$top/trace-events.new" "$src/hw/misc/trace-events"
	fi
}

# The generic fuzzer, made safe for DMA from device threads, and the npu
# configuration (against tests/qtest/fuzz/ of QEMU 10.0).
generic_fuzz_patch() {
	cat <<'PATCH'
--- a/tests/qtest/fuzz/generic_fuzz.c
+++ b/tests/qtest/fuzz/generic_fuzz.c
@@ -28,6 +28,10 @@
 #include "hw/boards.h"
 #include "generic_fuzz_configs.h"
 #include "hw/mem/sparse-mem.h"
+#include "qemu/atomic.h"
+#include "qemu/main-loop.h"
+#include "qemu/thread.h"
+#include <sys/prctl.h>
 
 static void pci_enum(gpointer pcidev, gpointer bus);
 
@@ -86,6 +90,27 @@
 static QTestState *qts_global; /* Need a global for the DMA callback */
 
 /*
+ * Devices with threads of their own (the npu's command processor and AI
+ * cores) do DMA outside the main loop, so the DMA callback may run on any
+ * thread. dma_lock guards the DMA regions and patterns (the bookkeeping
+ * only: it is never held across a memory access, which may take the BQL);
+ * the fills are written directly, not through the qtest protocol, which
+ * is not thread safe, and logged in qtest syntax with QTEST_LOG.
+ * dma_reads counts the DMA reads of RAM, so that settle() sees whether a
+ * device is still busy.
+ */
+static QemuRecMutex dma_lock;
+static unsigned dma_reads;
+/*
+ * QEMU_FUZZ_SETTLE_US: after each write-like command (and before the reset
+ * that ends an input), let the device's threads work: wait this long, and
+ * again while another thread of the process runs or the device keeps
+ * reading guest memory, up to QEMU_FUZZ_SETTLE_MAX_US (default 20 ms) in
+ * all. 0: upstream behaviour.
+ */
+static unsigned settle_us, settle_max_us;
+
+/*
  * List of memory regions that are children of QOM objects specified by the
  * user for fuzzing.
  */
@@ -175,19 +200,22 @@
     return l;
 }
 
+/* A fill the DMA callback decided on, written once dma_lock is dropped. */
+typedef struct {
+    size_t addr;
+    size_t len;
+    uint8_t *buf;
+} dma_fill;
+
 /*
  * Call-back for functions that perform DMA reads from guest memory. Confirm
  * that the region has not already been populated since the last loop in
  * generic_fuzz(), avoiding potential race-conditions, which we don't have
- * a good way for reproducing right now.
+ * a good way for reproducing right now. Decides the fills (dma_lock held).
  */
-void fuzz_dma_read_cb(size_t addr, size_t len, MemoryRegion *mr)
+static void fuzz_dma_plan_locked(size_t addr, size_t len, MemoryRegion *mr,
+                                 GArray *fills)
 {
-    /* Are we in the generic-fuzzer or are we using another fuzz-target? */
-    if (!qts_global) {
-        return;
-    }
-
     /*
      * Return immediately if:
      * - We have no DMA patterns defined
@@ -207,21 +235,19 @@
      * populate the non-overlapping parts.
      */
     address_range region;
-    bool double_fetch = false;
     for (int i = 0;
          i < dma_regions->len && (avoid_double_fetches || qtest_log_enabled);
          ++i) {
         region = g_array_index(dma_regions, address_range, i);
         if (ranges_overlap(addr, len, region.addr, region.size)) {
-            double_fetch = true;
             if (addr < region.addr
                 && avoid_double_fetches) {
-                fuzz_dma_read_cb(addr, region.addr - addr, mr);
+                fuzz_dma_plan_locked(addr, region.addr - addr, mr, fills);
             }
             if (addr + len > region.addr + region.size
                 && avoid_double_fetches) {
-                fuzz_dma_read_cb(region.addr + region.size,
-                        addr + len - (region.addr + region.size), mr);
+                fuzz_dma_plan_locked(region.addr + region.size,
+                        addr + len - (region.addr + region.size), mr, fills);
             }
             return;
         }
@@ -233,10 +259,20 @@
     address_range ar = {addr, len};
     g_array_append_val(dma_regions, ar);
     pattern p = g_array_index(dma_patterns, pattern, dma_pattern_index);
-    void *buf_base = pattern_alloc(p, ar.size);
-    void *buf = buf_base;
+    dma_fill f = {addr, len, pattern_alloc(p, len)};
+    g_array_append_val(fills, f);
+    dma_bytes_written += len;
+
+    /* Increment the index of the pattern for the next DMA access */
+    dma_pattern_index = (dma_pattern_index + 1) % dma_patterns->len;
+}
+
+/* Write one fill into guest memory (no lock held: MMIO takes the BQL). */
+static void fuzz_dma_fill(size_t addr, size_t len, const uint8_t *buf)
+{
     hwaddr l, addr1;
     MemoryRegion *mr1;
+
     while (len > 0) {
         l = len;
         mr1 = address_space_translate(first_cpu->as,
@@ -258,29 +294,46 @@
             /* ROM/RAM case */
             if (qtest_log_enabled) {
                 /*
-                * With QTEST_LOG, use a normal, slow QTest memwrite. Prefix the log
-                * that will be written by qtest.c with a DMA tag, so we can reorder
-                * the resulting QTest trace so the DMA fills precede the last PIO/MMIO
-                * command.
-                */
-                fprintf(stderr, "[DMA] ");
-                if (double_fetch) {
-                    fprintf(stderr, "[DOUBLE-FETCH] ");
+                 * With QTEST_LOG, log the fill as the qtest command that
+                 * reproduces it, tagged DMA, so that the trace can be
+                 * reordered: the DMA fills precede the last PIO/MMIO
+                 * command. One fprintf per line: other threads log too.
+                 */
+                GString *hex = g_string_sized_new(2 * l + 1);
+                for (hwaddr i = 0; i < l; i++) {
+                    g_string_append_printf(hex, "%02x", buf[i]);
                 }
-                fflush(stderr);
+                fprintf(stderr, "[DMA] [R +0.000000] write 0x%zx 0x%"
+                        HWADDR_PRIx " 0x%s\n", addr, l, hex->str);
+                g_string_free(hex, true);
             }
-            qtest_memwrite(qts_global, addr, buf, l);
-            dma_bytes_written += l;
+            address_space_write(first_cpu->as, addr, MEMTXATTRS_UNSPECIFIED,
+                                buf, l);
         }
         len -= l;
         buf += l;
         addr += l;
+    }
+}
 
+void fuzz_dma_read_cb(size_t addr, size_t len, MemoryRegion *mr)
+{
+    /* Are we in the generic-fuzzer or are we using another fuzz-target? */
+    if (!qatomic_read(&qts_global)) {
+        return;
     }
-    g_free(buf_base);
+    qatomic_inc(&dma_reads);
 
-    /* Increment the index of the pattern for the next DMA access */
-    dma_pattern_index = (dma_pattern_index + 1) % dma_patterns->len;
+    GArray *fills = g_array_new(false, false, sizeof(dma_fill));
+    qemu_rec_mutex_lock(&dma_lock);
+    fuzz_dma_plan_locked(addr, len, mr, fills);
+    qemu_rec_mutex_unlock(&dma_lock);
+    for (int i = 0; i < fills->len; i++) {
+        dma_fill *f = &g_array_index(fills, dma_fill, i);
+        fuzz_dma_fill(f->addr, f->len, f->buf);
+        g_free(f->buf);
+    }
+    g_array_free(fills, true);
 }
 
 /*
@@ -571,15 +624,442 @@
     memcpy(&a, data, sizeof(a));
     pattern p = {a.index, a.stride, len - sizeof(a), data + sizeof(a)};
     p.index = a.index % p.len;
+    qemu_rec_mutex_lock(&dma_lock);
     g_array_append_val(dma_patterns, p);
+    qemu_rec_mutex_unlock(&dma_lock);
     return;
 }
 
 static void op_clear_dma_patterns(QTestState *s,
                                   const unsigned char *data, size_t len)
 {
+    qemu_rec_mutex_lock(&dma_lock);
     g_array_set_size(dma_patterns, 0);
     dma_pattern_index = 0;
+    qemu_rec_mutex_unlock(&dma_lock);
+}
+
+/* Does a thread other than this one run or wait for a CPU (state R)? */
+static bool other_threads_running(void)
+{
+    GDir *dir = g_dir_open("/proc/self/task", 0, NULL);
+    int self = qemu_get_thread_id();
+    const char *name;
+    bool running = false;
+
+    while (dir && !running && (name = g_dir_read_name(dir))) {
+        char path[64], buf[512], *p;
+        ssize_t n;
+        int fd;
+
+        if (atoi(name) == self) {
+            continue;
+        }
+        snprintf(path, sizeof(path), "/proc/self/task/%s/stat", name);
+        fd = open(path, O_RDONLY);
+        if (fd < 0) {
+            continue;
+        }
+        n = read(fd, buf, sizeof(buf) - 1);
+        close(fd);
+        if (n <= 0) {
+            continue;
+        }
+        buf[n] = 0;
+        p = strrchr(buf, ')');
+        running = p && p[1] == ' ' && p[2] == 'R';
+    }
+    if (dir) {
+        g_dir_close(dir);
+    }
+    return running;
+}
+
+/*
+ * Let the device's threads act on what was just done: release the BQL
+ * (they may need it; bottom halves and timers run) for settle_us, and
+ * again while they run or read guest memory, up to settle_max_us.
+ */
+static void settle(QTestState *s)
+{
+    unsigned waited = 0, seen;
+    bool locked, busy;
+
+    if (!settle_us) {
+        return;
+    }
+    do {
+        seen = qatomic_read(&dma_reads);
+        locked = bql_locked();
+        if (locked) {
+            bql_unlock();
+        }
+        g_usleep(settle_us);
+        if (locked) {
+            bql_lock();
+        }
+        flush_events(s);
+        waited += settle_us;
+        busy = qatomic_read(&dma_reads) != seen || other_threads_running();
+    } while (busy && waited < settle_max_us);
+}
+
+/*
+ * Liveness oracle (NPU stack, issue 35), for devices that run engine
+ * threads of their own:
+ *
+ * - The system reset that ends every input (qemu_system_reset(), what
+ *   "outb 0xcf9 0x6" does; a device's reset hold phase may wait for its
+ *   engine) must complete within QEMU_FUZZ_RESET_LIMIT_MS ms, and so must
+ *   every operation of the input (an MMIO or configuration write that
+ *   waits for the engine: a D3hot, a queue disable). A watchdog thread
+ *   checks the one in progress every few ms and, past the limit, prints
+ *   the threads and sends SIGABRT to the main thread: a slow reset or a
+ *   deadlock is a crash finding, with the main thread's stack at that
+ *   moment and the input as its reproducer, not a libFuzzer -timeout. One
+ *   that returns late without the watchdog noticing aborts too. Unset or
+ *   0: off (the npu configuration sets 50).
+ *   The time counted is host time (CLOCK_MONOTONIC) less the time the main
+ *   thread and the engine threads spent runnable, waiting for a CPU,
+ *   meanwhile (their run delay, /proc/self/task/<tid>/schedstat): on a
+ *   shared machine the same reset takes 2 to 150 ms of host time
+ *   otherwise. A thread that waits for a lock or the engine is not
+ *   runnable: a deadlock counts in full. QEMU_FUZZ_RESET_RAW=1: host time.
+ * - No engine thread may wait for the BQL: a hook at the top of
+ *   bql_lock() (system/cpus.c, patched) aborts on the calling thread when
+ *   its name starts with QEMU_FUZZ_ENGINE_THREADS ("npu-" for the npu
+ *   configuration, which names threads with -name debug-threads=on:
+ *   npu-cp, npu-core0..). Any request counts, since the BQL is held by
+ *   the main loop most of the time and a request then waits; the crash
+ *   report is the engine thread's own stack, at the request. Unset or
+ *   empty: off.
+ *
+ * At exit the fuzzer prints a line of reset statistics ("liveness: ...").
+ */
+extern void (*bql_lock_fuzz_hook)(const char *file, int line);
+
+#define NS_PER_MS 1000000LL
+static unsigned reset_limit_ms;
+static bool reset_raw;
+static char *engine_prefix;
+static pthread_t liveness_main;
+static bool liveness_fired; /* one finding per input: the first */
+/* What the main thread does now (wd_lock): since wd_start, 0: nothing */
+static QemuMutex wd_lock;
+static const char *wd_what;
+static int64_t wd_start, wd_wait0;
+static uint64_t resets, resets_over[3], resets_excused;
+static int64_t reset_max_ns, reset_sum_ns, reset_max_raw_ns;
+static const unsigned reset_marks_ms[3] = {5, 10, 25};
+/* The threads a reset waits for: the main one and the engine's. */
+static GArray *reset_tids;
+
+static int64_t mono_ns(void)
+{
+    struct timespec ts;
+
+    clock_gettime(CLOCK_MONOTONIC, &ts);
+    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
+}
+
+/* A thread's run delay: ns runnable but not running (its schedstat). */
+static int64_t thread_run_delay_ns(int tid)
+{
+    char path[64], buf[96];
+    unsigned long long run, wait;
+    ssize_t n;
+    int fd;
+
+    snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", tid);
+    fd = open(path, O_RDONLY);
+    if (fd < 0) {
+        return 0;
+    }
+    n = read(fd, buf, sizeof(buf) - 1);
+    close(fd);
+    if (n <= 0) {
+        return 0;
+    }
+    buf[n] = 0;
+    return sscanf(buf, "%llu %llu", &run, &wait) == 2 ? wait : 0;
+}
+
+/* The run delay of the main and engine threads (0: the kernel does not tell) */
+static int64_t run_delay_ns(void)
+{
+    int64_t sum = 0;
+
+    for (int i = 0; reset_tids && i < reset_tids->len; i++) {
+        sum += thread_run_delay_ns(g_array_index(reset_tids, int, i));
+    }
+    return sum;
+}
+
+/* The time of what started at @t0 (run delay @wait0) by @now, as counted. */
+static int64_t busy_ns(int64_t t0, int64_t wait0, int64_t now)
+{
+    if (reset_raw) {
+        return now - t0;
+    }
+    return MAX(now - t0 - MAX(run_delay_ns() - wait0, 0), 0);
+}
+
+static bool is_engine_name(const char *name)
+{
+    return engine_prefix && *engine_prefix &&
+           g_str_has_prefix(name, engine_prefix);
+}
+
+/* Is the calling thread one of the device's engine threads? (cached) */
+static bool this_is_engine_thread(void)
+{
+    static __thread int engine = -1;
+
+    if (engine < 0) {
+        char name[17] = "";
+
+        prctl(PR_GET_NAME, name);
+        engine = is_engine_name(name);
+    }
+    return engine;
+}
+
+static void engine_bql_hook(const char *file, int line)
+{
+    char name[17] = "";
+
+    if (!this_is_engine_thread()) {
+        return;
+    }
+    prctl(PR_GET_NAME, name);
+    qatomic_set(&liveness_fired, true);
+    fprintf(stderr, "==%d== ERROR: liveness: engine thread %s asks for the "
+            "BQL at %s:%d: an engine thread may never wait for it\n",
+            getpid(), name, file, line);
+    abort();
+}
+
+/*
+ * Every thread of the process: with @print its name, state (R, S, D, ...),
+ * the kernel function it sleeps in and its run delay so far. The engine
+ * threads are counted in @engines, their ids appended to @tids.
+ */
+static void liveness_threads(bool print, unsigned *engines, GArray *tids)
+{
+    GDir *dir = g_dir_open("/proc/self/task", 0, NULL);
+    const char *tid;
+
+    *engines = 0;
+    while (dir && (tid = g_dir_read_name(dir))) {
+        g_autofree char *path = g_strdup_printf("/proc/self/task/%s/stat", tid);
+        g_autofree char *wpath = g_strdup_printf("/proc/self/task/%s/wchan",
+                                                 tid);
+        g_autofree char *stat = NULL, *wchan = NULL;
+        char *open_p, *close_p;
+        int t = atoi(tid);
+
+        if (!g_file_get_contents(path, &stat, NULL, NULL)) {
+            continue;
+        }
+        open_p = strchr(stat, '(');
+        close_p = strrchr(stat, ')');
+        if (!open_p || !close_p || close_p < open_p) {
+            continue;
+        }
+        *close_p = 0;
+        if (is_engine_name(open_p + 1)) {
+            ++*engines;
+            if (tids) {
+                g_array_append_val(tids, t);
+            }
+        }
+        if (print) {
+            g_file_get_contents(wpath, &wchan, NULL, NULL);
+            fprintf(stderr, "liveness:   thread %s %-16s %c in %s, run "
+                    "delay %.1f ms\n", tid, open_p + 1,
+                    close_p[1] == ' ' ? close_p[2] : '?',
+                    wchan && *wchan ? wchan : "?",
+                    (double)thread_run_delay_ns(t) / NS_PER_MS);
+        }
+    }
+    if (dir) {
+        g_dir_close(dir);
+    }
+}
+
+static void *liveness_watchdog(void *opaque)
+{
+    const int64_t limit = reset_limit_ms * NS_PER_MS;
+
+    for (;;) {
+        int64_t now, busy, nap = 5 * NS_PER_MS;
+        unsigned engines;
+
+        qemu_mutex_lock(&wd_lock);
+        now = mono_ns();
+        if (wd_start && now - wd_start >= limit &&
+            !qatomic_read(&liveness_fired)) {
+            busy = busy_ns(wd_start, wd_wait0, now);
+            if (busy >= limit) {
+                qatomic_set(&liveness_fired, true);
+                fprintf(stderr, "==%d== ERROR: liveness: %s did not complete "
+                        "within %u ms (a hang or a slow reset: %.1f ms of "
+                        "host time, %.1f ms of it runnable threads waiting "
+                        "for a CPU); aborting the main thread there\n",
+                        getpid(), wd_what, reset_limit_ms,
+                        (double)(now - wd_start) / NS_PER_MS,
+                        (double)(now - wd_start - busy) / NS_PER_MS);
+                liveness_threads(true, &engines, NULL);
+                fflush(stderr);
+                pthread_kill(liveness_main, SIGABRT);
+                qemu_mutex_unlock(&wd_lock);
+                /* Should the main thread not go down, go down here. */
+                g_usleep(5 * G_USEC_PER_SEC);
+                abort();
+            }
+            nap = MIN(nap, limit - busy); /* its threads waited for a CPU */
+        } else if (wd_start) {
+            nap = MIN(nap, wd_start + limit - now);
+        }
+        qemu_mutex_unlock(&wd_lock);
+        g_usleep(MAX(nap / 1000, 100));
+    }
+    return NULL;
+}
+
+/* The main thread starts @what (a string constant); *@t0, *@wait0 for it. */
+static void liveness_begin(const char *what, int64_t *t0, int64_t *wait0)
+{
+    if (!reset_limit_ms) {
+        return;
+    }
+    *wait0 = reset_raw ? 0 : run_delay_ns();
+    *t0 = mono_ns();
+    qemu_mutex_lock(&wd_lock);
+    wd_what = what;
+    wd_wait0 = *wait0;
+    wd_start = *t0;
+    qemu_mutex_unlock(&wd_lock);
+}
+
+/* ... and is done with it: abort if it took too long. Its time (ns). */
+static int64_t liveness_end(const char *what, int64_t t0, int64_t wait0,
+                            int64_t *raw)
+{
+    int64_t now, dt;
+
+    if (!reset_limit_ms) {
+        return 0;
+    }
+    now = mono_ns();
+    qemu_mutex_lock(&wd_lock);
+    wd_start = 0;
+    qemu_mutex_unlock(&wd_lock);
+    *raw = now - t0;
+    /* The run delay is read only when it may matter. */
+    dt = *raw > 5 * NS_PER_MS ? busy_ns(t0, wait0, now) : *raw;
+    if (dt > reset_limit_ms * NS_PER_MS && !qatomic_read(&liveness_fired)) {
+        qatomic_set(&liveness_fired, true);
+        fprintf(stderr, "==%d== ERROR: liveness: %s took %.1f ms, over the "
+                "limit of %u ms (%.1f ms of host time)\n", getpid(), what,
+                (double)dt / NS_PER_MS, reset_limit_ms,
+                (double)*raw / NS_PER_MS);
+        abort();
+    }
+    return dt;
+}
+
+static void liveness_stats(void)
+{
+    if (!resets) {
+        return;
+    }
+    fprintf(stderr, "liveness: %" PRIu64 " resets, mean %.2f ms, max %.2f "
+            "ms, over 5/10/25 ms: %" PRIu64 "/%" PRIu64 "/%" PRIu64
+            ", limit %u ms (%s); host time max %.2f ms, %" PRIu64 " over "
+            "the limit but for waiting for a CPU\n", resets,
+            (double)reset_sum_ns / resets / NS_PER_MS,
+            (double)reset_max_ns / NS_PER_MS, resets_over[0], resets_over[1],
+            resets_over[2], reset_limit_ms,
+            reset_raw ? "host time" : "less run delay",
+            (double)reset_max_raw_ns / NS_PER_MS, resets_excused);
+}
+
+static void liveness_init(void)
+{
+    const char *limit = getenv("QEMU_FUZZ_RESET_LIMIT_MS");
+    const char *engines = getenv("QEMU_FUZZ_ENGINE_THREADS");
+    int self = getpid();
+    pthread_t wd;
+    sigset_t abrt;
+    unsigned n;
+
+    reset_limit_ms = limit ? atoi(limit) : 0;
+    reset_raw = getenv("QEMU_FUZZ_RESET_RAW") &&
+                atoi(getenv("QEMU_FUZZ_RESET_RAW"));
+    engine_prefix = engines && *engines ? g_strdup(engines) : NULL;
+    liveness_main = pthread_self();
+    sigemptyset(&abrt);
+    sigaddset(&abrt, SIGABRT);
+    pthread_sigmask(SIG_UNBLOCK, &abrt, NULL);
+    qemu_mutex_init(&wd_lock);
+    reset_tids = g_array_new(false, false, sizeof(int));
+    g_array_append_val(reset_tids, self); /* the main thread: it resets */
+    liveness_threads(false, &n, reset_tids);
+    if (engine_prefix) {
+        printf("liveness: %u engine threads (%s*) may not take the BQL\n", n,
+               engine_prefix);
+        if (!n) {
+            printf("liveness: WARNING: no thread is named %s*: without "
+                   "-name debug-threads=on the BQL check sees none\n",
+                   engine_prefix);
+        }
+        qatomic_set(&bql_lock_fuzz_hook, engine_bql_hook);
+    }
+    if (reset_limit_ms) {
+        pthread_create(&wd, NULL, liveness_watchdog, NULL);
+        pthread_setname_np(wd, "fuzz-watchdog");
+        pthread_detach(wd);
+        atexit(liveness_stats);
+        printf("liveness: the reset after an input and every operation must "
+               "complete within %u ms\n", reset_limit_ms);
+    }
+}
+
+/* An operation of the input, timed and watched. */
+static void liveness_op(void (*op)(QTestState *, const unsigned char *,
+                                   size_t),
+                        const char *name, QTestState *s,
+                        const unsigned char *data, size_t len)
+{
+    int64_t t0 = 0, wait0 = 0, raw;
+
+    liveness_begin(name, &t0, &wait0);
+    op(s, data, len);
+    liveness_end(name, t0, wait0, &raw);
+}
+
+/* The reset that ends an input, timed and watched. */
+static void liveness_reset(QTestState *s)
+{
+    static const char what[] = "the system reset that ends the input";
+    int64_t t0 = 0, wait0 = 0, raw = 0, dt;
+
+    liveness_begin(what, &t0, &wait0);
+    fuzz_reset(s);
+    dt = liveness_end(what, t0, wait0, &raw);
+    if (!reset_limit_ms) {
+        return;
+    }
+    reset_max_raw_ns = MAX(reset_max_raw_ns, raw);
+    resets_excused += raw > reset_limit_ms * NS_PER_MS &&
+                      dt <= reset_limit_ms * NS_PER_MS;
+    resets++;
+    reset_sum_ns += dt;
+    reset_max_ns = MAX(reset_max_ns, dt);
+    for (int i = 0; i < ARRAY_SIZE(reset_marks_ms); i++) {
+        resets_over[i] += dt > reset_marks_ms[i] * NS_PER_MS;
+    }
 }
 
 static void op_clock_step(QTestState *s, const unsigned char *data, size_t len)
@@ -643,6 +1123,14 @@
         [OP_CLEAR_DMA_PATTERNS] = op_clear_dma_patterns,
         [OP_CLOCK_STEP]         = op_clock_step,
     };
+    static const char *const op_names[] = {
+        [OP_IN] = "op in", [OP_OUT] = "op out", [OP_READ] = "op read",
+        [OP_WRITE] = "op write", [OP_PCI_READ] = "op pci read",
+        [OP_PCI_WRITE] = "op pci write", [OP_DISABLE_PCI] = "op disable pci",
+        [OP_ADD_DMA_PATTERN] = "op add dma pattern",
+        [OP_CLEAR_DMA_PATTERNS] = "op clear dma patterns",
+        [OP_CLOCK_STEP] = "op clock step",
+    };
     const unsigned char *cmd = Data;
     const unsigned char *nextcmd;
     size_t cmd_len;
@@ -650,7 +1138,9 @@
 
     op_clear_dma_patterns(s, NULL, 0);
     pci_disabled = false;
+    qemu_rec_mutex_lock(&dma_lock);
     dma_bytes_written = 0;
+    qemu_rec_mutex_unlock(&dma_lock);
 
     QPCIBus *pcibus = qpci_new_pc(s, NULL);
     g_ptr_array_foreach(fuzzable_pci_devices, pci_enum, pcibus);
@@ -664,17 +1154,29 @@
         if (cmd_len > 0) {
             /* Interpret the first byte of the command as an opcode */
             op = *cmd % (sizeof(ops) / sizeof((ops)[0]));
-            ops[op](s, cmd + 1, cmd_len - 1);
+            liveness_op(ops[op], op_names[op], s, cmd + 1, cmd_len - 1);
 
             /* Run the main loop */
             flush_events(s);
+            if (op == OP_OUT || op == OP_WRITE || op == OP_PCI_WRITE ||
+                op == OP_CLOCK_STEP) {
+                settle(s);
+            }
         }
         /* Advance to the next command */
         cmd = nextcmd ? nextcmd + sizeof(SEPARATOR) - 1 : nextcmd;
         Size = Size - (cmd_len + sizeof(SEPARATOR) - 1);
+        qemu_rec_mutex_lock(&dma_lock);
         g_array_set_size(dma_regions, 0);
+        qemu_rec_mutex_unlock(&dma_lock);
     }
-    fuzz_reset(s);
+    /*
+     * The patterns point into this input, which is gone after we return:
+     * DMA that a device thread does from now on sees none.
+     */
+    settle(s);
+    op_clear_dma_patterns(s, NULL, 0);
+    liveness_reset(s);
 }
 
 static void usage(void)
@@ -783,7 +1285,24 @@
     if (getenv("QEMU_AVOID_DOUBLE_FETCH")) {
         avoid_double_fetches = 1;
     }
-    qts_global = s;
+    if (getenv("QEMU_FUZZ_SETTLE_US")) {
+        settle_us = atoi(getenv("QEMU_FUZZ_SETTLE_US"));
+    }
+    settle_max_us = 20000;
+    if (getenv("QEMU_FUZZ_SETTLE_MAX_US")) {
+        settle_max_us = atoi(getenv("QEMU_FUZZ_SETTLE_MAX_US"));
+    }
+    qemu_rec_mutex_init(&dma_lock);
+
+    /*
+     * QEMU's main loop blocks SIGALRM (it takes signals from a signalfd),
+     * and SIGALRM is how libFuzzer's -timeout fires: unblock it, so that
+     * an input that hangs the main thread (a deadlock) is reported.
+     */
+    sigset_t alrm;
+    sigemptyset(&alrm);
+    sigaddset(&alrm, SIGALRM);
+    pthread_sigmask(SIG_UNBLOCK, &alrm, NULL);
 
     /*
      * Create a special device that we can use to back DMA buffers at very
@@ -825,6 +1344,9 @@
         printf("No fuzzable memory regions found...\n");
         exit(1);
     }
+    liveness_init();
+    /* Last: from now on the DMA callback may run, on any thread. */
+    qatomic_set(&qts_global, s);
 }
 
 /*
--- a/tests/qtest/fuzz/generic_fuzz_configs.h
+++ b/tests/qtest/fuzz/generic_fuzz_configs.h
@@ -29,8 +29,32 @@
     "writeout=immediate,fmode=0600,dmode=0700", tmpdir);
 }
 
+/*
+ * The NPU (hw/misc/npu, spliced in by the NPU stack's build-qemu-fuzz.sh),
+ * its firmware in ROM so that descriptors run from reset. 64 MiB of device
+ * memory: libqos maps the BARs below 4 GiB, where a 512 MiB BAR2 does not
+ * fit. Its command processor runs on a thread of its own: give it time
+ * after each command. The liveness oracle (generic_fuzz.c): the reset
+ * that ends an input completes within 50 ms, and no thread named npu-*
+ * (the engine; debug-threads=on names them) asks for the BQL.
+ */
+static inline gchar *generic_fuzzer_npu_args(void)
+{
+    g_setenv("QEMU_FUZZ_SETTLE_US", "50", false);
+    g_setenv("QEMU_FUZZ_RESET_LIMIT_MS", "50", false);
+    g_setenv("QEMU_FUZZ_ENGINE_THREADS", "npu-", false);
+    return g_strdup("-machine q35 -nodefaults -name npu-fuzz,debug-threads=on "
+                    "-L /usr/share/qemu "
+                    "-L /usr/share/seabios -device npu,boot-rom=on,mem-size=64M");
+}
+
 const generic_fuzz_config predefined_configs[] = {
     {
+        .name = "npu",
+        .argfunc = generic_fuzzer_npu_args,
+        .objects = "npu",
+    },
+    {
         .name = "virtio-net-pci-slirp",
         .args = "-M q35 -nodefaults "
         "-device virtio-net,netdev=net0 -netdev user,id=net0",
--- a/system/cpus.c
+++ b/system/cpus.c
@@ -546,12 +546,24 @@
 }
 
 /*
+ * The NPU stack's fuzzer (tests/qtest/fuzz/generic_fuzz.c, patched by
+ * scripts/build-qemu-fuzz.sh) watches who asks for the BQL: when set,
+ * called first in every bql_lock(), on the calling thread.
+ */
+void (*bql_lock_fuzz_hook)(const char *file, int line);
+
+/*
  * The BQL is taken from so many places that it is worth profiling the
  * callers directly, instead of funneling them all through a single function.
  */
 void bql_lock_impl(const char *file, int line)
 {
     QemuMutexLockFunc bql_lock_fn = qatomic_read(&bql_mutex_lock_func);
+    void (*hook)(const char *, int) = qatomic_read(&bql_lock_fuzz_hook);
+
+    if (hook) {
+        hook(file, line);
+    }
 
     g_assert(!bql_locked());
     bql_lock_fn(&bql, file, line);
PATCH
}

exec 8>"$NPU_CACHE/qemu-fuzz.lock"
flock 8
if [ ! -f "$top/.spliced" ]; then
	log "QEMU fuzz: Debian source qemu=$src_version into $top"
	rm -rf "$top"
	mkdir -p "$top"
	# The shared source tree: under the lock build-qemu.sh takes for it.
	exec 7>"$NPU_CACHE/qemu-src.lock"
	flock 7
	cp -a "$(fetch_source qemu "$src_version")" "$src"
	flock -u 7

	log "QEMU fuzz: splicing the npu device into hw/misc, patching the generic fuzzer"
	mkdir -p "$src/hw/misc/npu"
	cat >>"$src/hw/misc/Kconfig" <<'EOF'

config NPU_PCI
    bool
    default y if PCI_DEVICES
    depends on PCI && MSI_NONBROKEN
EOF
	cat >>"$src/hw/misc/meson.build" <<'EOF'

npu_dnnl = declare_dependency(link_args: ['-ldnnl', '-lgomp'])
EOF
	{
		printf "system_ss.add(when: 'CONFIG_NPU_PCI', if_true: [npu_dnnl, files(\n"
		for f in $dev_files; do printf "  'npu/%s',\n" "$f"; done
		printf ")])\n"
	} >>"$src/hw/misc/meson.build"
	cp "$src/hw/misc/trace-events" "$src/hw/misc/trace-events.orig"
	# Without default devices nothing selects PCI_DEVICES: name the board
	# and the npu in a device configuration of their own.
	printf 'CONFIG_Q35=y\nCONFIG_NPU_PCI=y\n' >"$src/configs/devices/x86_64-softmmu/npu-fuzz.mak"
	generic_fuzz_patch | patch -s -p1 -d "$src" || die "patching the generic fuzzer failed"
	touch "$top/.spliced"
fi
sync_device_sources

if [ ! -f "$bld/.configured" ]; then
	log "QEMU fuzz: configuring (clang-14, libFuzzer, ASan + UBSan, q35 + npu)"
	rm -rf "$bld"
	mkdir -p "$bld"
	(cd "$bld" && ../configure \
		--target-list=x86_64-softmmu \
		--without-default-features \
		--without-default-devices --with-devices-x86_64=npu-fuzz \
		--python="$NPU_VENV/bin/python3" \
		--enable-fuzzing --enable-asan --enable-ubsan \
		--enable-kvm --disable-tcg --enable-trace-backends=log \
		--disable-docs --disable-werror --disable-install-blobs \
		--cc="ccache clang-14" --cxx="ccache clang++-14" --host-cc=clang-14 \
		--extra-cflags="-g -O1 -fno-omit-frame-pointer") >"$bld.configure.log" 2>&1 ||
		{ tail -n 40 "$bld.configure.log"; die "QEMU fuzz configure failed (see $bld.configure.log)"; }
	touch "$bld/.configured"
fi

log "QEMU fuzz: building qemu-fuzz-x86_64 (first build ~7 min on 2 cores, a rebuild with a warm ccache ~1 min)"
# Paths relative to the tree, so that a tree of another key (an edit of
# this script) hits the cache.
export CCACHE_DIR="$NPU_CACHE/ccache" CCACHE_BASEDIR="$src" CCACHE_NOHASHDIR=1
if ! nice -n 10 ninja -C "$bld" -j "${NPU_FUZZ_JOBS:-2}" "${targets[@]}" >"$bld.build.log" 2>&1; then
	grep -E 'error|warning' "$bld.build.log" | head -n 40 >&2 || true
	tail -n 20 "$bld.build.log" >&2
	die "QEMU fuzz build failed (see $bld.build.log)"
fi
grep -E 'hw/misc/npu/.*warning' "$bld.build.log" >&2 || true
mkdir -p "$(dirname "$out")"
ln -sf "$bld/qemu-fuzz-x86_64" "$out"
if [ ${#targets[@]} -gt 1 ]; then
	ln -sf "$bld/qemu-system-x86_64" "$NPU_CACHE/bin/qemu-system-x86_64-fuzz"
fi
ln -sfn "$key" "$NPU_CACHE/qemu-fuzz/current"
log "QEMU fuzz ready: $out"
