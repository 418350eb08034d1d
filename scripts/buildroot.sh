#!/usr/bin/env bash
# Build the Buildroot guest image (make buildroot BUILDROOT_DIR=...): the
# br2-external tree buildroot_config/ with a Buildroot 2025.02.x checkout,
# output in $NPU_CACHE/buildroot (images/bzImage, images/rootfs.ext4).
#
# Buildroot downloads all its sources (toolchain, kernel, packages) from
# their upstream sites: this needs a machine that reaches them, or their
# archives already in BR2_DL_DIR (see buildroot_config/board/npu/readme.txt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/common.sh
. "$here/common.sh"

series=2025.02
defconfig=npu_qemu_x86_64_defconfig
external="$NPU_ROOT/buildroot_config"
out="$NPU_CACHE/buildroot"

[ -n "${BUILDROOT_DIR:-}" ] ||
	die "BUILDROOT_DIR is not set: make buildroot BUILDROOT_DIR=<a Buildroot $series.x checkout>"
[ -d "$BUILDROOT_DIR" ] || die "BUILDROOT_DIR=$BUILDROOT_DIR is not a directory"
br=$(cd "$BUILDROOT_DIR" && pwd)
if [ ! -f "$br/Makefile" ] || [ ! -f "$br/package/Config.in" ]; then
	die "BUILDROOT_DIR=$br is not a Buildroot tree (it needs Makefile and package/Config.in)"
fi

# Buildroot's Makefile names its release: "export BR2_VERSION := 2025.02.1".
version=$(sed -nE 's/^(export[[:space:]]+)?BR2_VERSION[[:space:]]*:?=[[:space:]]*([^[:space:]]*).*/\2/p' \
	"$br/Makefile" | head -n1)
if [[ ! "$version" =~ ^2025\.02(\.[0-9]+)?(-git)?$ ]]; then
	log "warning: $br is Buildroot ${version:-of unknown version}; buildroot_config/ is pinned to $series.x (LTS)"
fi

# Buildroot's top-level make runs its own parallel build and must not
# inherit the caller's make flags (jobs, command-line variables).
br_make() {
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
		make -C "$br" BR2_EXTERNAL="$external" O="$out" "$@"
}

mkdir -p "$out"
log "buildroot: $defconfig with Buildroot ${version:-?} ($br), output in $out"
br_make "$defconfig"
log "buildroot: building (the first build compiles a toolchain, the kernel and Python: hours)"
br_make all
for f in bzImage rootfs.ext4; do
	[ -e "$out/images/$f" ] || die "the Buildroot build made no $out/images/$f"
done
log "buildroot image ready: $out/images/bzImage, $out/images/rootfs.ext4"
