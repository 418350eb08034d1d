#!/usr/bin/env bash
# Build the debug kernel of the guest (NPU_KERNEL=debug) from Debian 13's
# `linux` source package: x86_64_defconfig + guest/kernel/npu.config +
# guest/kernel/debug.config (KASAN, KFENCE, UBSAN, lockdep, kmemleak,
# DMA-API debug, fault injection), everything built in, no initramfs.
#
# Built in the guest image's trixie root tree (gcc-14, the compiler of the
# distribution kernel) and cached in $NPU_CACHE/kernel-debug/<key>, keyed by
# the source version, the two fragments and this script. The build tree is
# kept: npu.ko is built against it.
#
#   build-kernel.sh            build (or reuse) the debug kernel
#   build-kernel.sh check      merge the fragments onto a scratch tree and
#                              print every requested symbol olddefconfig
#                              changed (used by tests/host/test_kernel_config.py)
#   build-kernel.sh key        print the cache key
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/common.sh
. "$here/common.sh"

frag="$NPU_ROOT/guest/kernel"

ver=$(linux_source_version)
key=$(
	{
		echo "$ver"
		hash_files "$here/build-kernel.sh" "$frag/npu.config" "$frag/debug.config"
	} | sha256sum | cut -c1-16
)
[ "${1:-}" = key ] && { echo "kernel-debug $key"; exit 0; }
tree=$(fetch_source linux "$ver")
ctree="/cache/${tree#"$NPU_CACHE"/}"

# merge_config OUT FRAGMENT...: x86_64_defconfig plus the fragments, in OUT
# (a path inside the chroot).
merge_config() {
	local out=$1
	shift
	# shellcheck disable=SC2016 # expanded by the inner shell
	guest_chroot sh -c '
		set -e
		src=$1 out=$2; shift 2
		cd "$src"
		make -s O="$out" x86_64_defconfig
		scripts/kconfig/merge_config.sh -m -O "$out" "$out/.config" "$@" >/dev/null
		make -s O="$out" olddefconfig
	' sh "$ctree" "$out" "$@"
}

# The requested symbols that did not survive: "SYMBOL wanted got" lines.
config_lost() {
	local config=$1
	shift
	python3 - "$config" "$@" <<'EOF'
import re, sys
have = {}
for line in open(sys.argv[1]):
    m = re.match(r"(CONFIG_\w+)=(.*)", line)
    if m:
        have[m[1]] = m[2]
    m = re.match(r"# (CONFIG_\w+) is not set", line)
    if m:
        have[m[1]] = "n"
want = {}
for frag in sys.argv[2:]:
    for line in open(frag):
        m = re.match(r"(CONFIG_\w+)=(.*)", line.strip())
        if m:
            want[m[1]] = m[2]
for sym, val in want.items():
    if have.get(sym, "n") != val:
        print(sym, val, have.get(sym, "n"))
EOF
}

if [ "${1:-}" = check ]; then
	scratch=$(mktemp -d "$NPU_CACHE/kconfig-check.XXXXXX")
	trap 'rm -rf "$scratch"' EXIT
	cs="/cache/${scratch#"$NPU_CACHE"/}"
	echo "source linux $ver"
	merge_config "$cs/base" /src/guest/kernel/npu.config
	config_lost "$scratch/base/.config" "$frag/npu.config" | sed 's/^/base: /'
	merge_config "$cs/debug" /src/guest/kernel/npu.config /src/guest/kernel/debug.config
	config_lost "$scratch/debug/.config" "$frag/npu.config" "$frag/debug.config" | sed 's/^/debug: /'
	exit 0
fi

top="$NPU_CACHE/kernel-debug/$key"
ctop="/cache/kernel-debug/$key"
if [ ! -f "$top/.done" ]; then
	rm -rf "$top"
	mkdir -p "$top"
	# Start from the newest earlier build of the same source, if any: kbuild
	# tracks which objects each config symbol reaches, so a changed
	# fragment rebuilds those only (minutes instead of ~20).
	prev=$(newest_build_of "$NPU_CACHE/kernel-debug" "$ver")
	if [ -n "$prev" ] && [ -d "$(dirname "$prev")/build" ]; then
		log "debug kernel: starting from the build in $(dirname "$prev")"
		cp -a "$(dirname "$prev")/build" "$top/build"
	fi
	log "debug kernel: configuring linux $ver (x86_64_defconfig + guest/kernel/*.config)"
	merge_config "$ctop/build" /src/guest/kernel/npu.config /src/guest/kernel/debug.config
	lost=$(config_lost "$top/build/.config" "$frag/npu.config" "$frag/debug.config")
	[ -z "$lost" ] || die "olddefconfig dropped requested symbols (wanted, got):"$'\n'"$lost"
	log "debug kernel: building (about 20 min on 2 cores; log: $top/build.log)"
	guest_chroot make -C "$ctree" O="$ctop/build" -j"$(nproc)" bzImage modules \
		>"$top/build.log" 2>&1 ||
		{ tail -n 30 "$top/build.log"; die "debug kernel build failed (see $top/build.log)"; }
	cp "$top/build/arch/x86/boot/bzImage" "$top/vmlinuz"
	cat "$top/build/include/config/kernel.release" >"$top/kver"
	echo "$ver" >"$top/source-version"
	touch "$top/.done"
fi
ln -sfn "$key" "$NPU_CACHE/kernel-debug/current"
log "debug kernel ready: $top (kernel $(cat "$top/kver"))"
