#!/usr/bin/env bash
# Build npu.ko for a guest kernel, in the guest image's trixie root tree
# (the kernel's own compiler and headers).
#
#   build-module.sh [distro|debug] [KBUILD ARGS...]
#
# distro: against the Debian kernel's linux-headers; debug: against the
# debug kernel's build tree (scripts/build-kernel.sh). The sources are
# copied to build/module/<kernel release>/ (kbuild builds in the source
# directory, and one copy per kernel keeps both builds incremental), so
# the guest loads /mnt/npu/build/module/$(uname -r)/npu.ko.
#
# For the debug kernel (CONFIG_GCOV_KERNEL) the module is built with
# GCOV_PROFILE=y: the debug pass of make test reads its line coverage
# (scripts/npu_coverage.py).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/common.sh
. "$here/common.sh"

kind=${1:-distro}
shift || true
case "$kind" in
distro)
	kver=$(cat "$NPU_CACHE/guest/current/kver")
	kdir="/lib/modules/$kver/build"
	;;
debug)
	[ -f "$NPU_CACHE/kernel-debug/current/kver" ] || die "no debug kernel (make kernel-debug)"
	kver=$(cat "$NPU_CACHE/kernel-debug/current/kver")
	kdir="/cache/kernel-debug/$(readlink "$NPU_CACHE/kernel-debug/current")/build"
	set -- GCOV_PROFILE=y "$@"
	;;
*) die "unknown kernel '$kind' (distro or debug)" ;;
esac

out="$NPU_ROOT/build/module/$kver"
mkdir -p "$out" "$NPU_ROOT/build/module/include"
# One build at a time: both kernels' builds share build/module/include.
exec 9>"$NPU_ROOT/build/module/.lock"
flock 9
# Copy what changed only (kbuild rebuilds by mtime).
sync_into() {
	local dst=$1 f
	shift
	for f in "$@"; do
		cmp -s "$f" "$dst/$(basename "$f")" || cp "$f" "$dst/"
	done
}
sync_into "$out" "$NPU_ROOT"/kernel_module/*.[ch] "$NPU_ROOT/kernel_module/Kbuild"
sync_into "$NPU_ROOT/build/module/include" "$NPU_ROOT"/include/*.h
guest_chroot make -s -C "$kdir" M="/src/build/module/$kver" "$@" modules
