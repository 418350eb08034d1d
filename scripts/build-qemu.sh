#!/usr/bin/env bash
# Build QEMU (x86_64-softmmu) from Debian's source package for the host's
# release, with the NPU device from qemu_device/ spliced into hw/misc.
#
# The configured tree is cached in $NPU_CACHE/qemu/<key>, where <key> hashes
# what the configure step depends on (this script, the Debian source version,
# the list of device files). The device sources themselves are synced into
# the tree on every run and rebuilt incrementally by ninja, so editing a
# device file costs seconds, not a reconfigure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/common.sh
. "$here/common.sh"

dev_dir="$NPU_ROOT/qemu_device"
inc_dir="$NPU_ROOT/include"
# Only the set of C files shapes meson.build; their contents do not.
dev_files=$(find "$dev_dir" -maxdepth 1 -name '*.c' -printf '%f\n' | LC_ALL=C sort | tr '\n' ' ')
src_version=$(apt-cache showsrc qemu 2>/dev/null | awk '/^Version:/ {print $2}' | sort -V | tail -n1)
[ -n "$src_version" ] || { add_deb_src; apt-get update -qq; src_version=$(apt-cache showsrc qemu | awk '/^Version:/ {print $2}' | sort -V | tail -n1); }
[ -n "$src_version" ] || die "apt-cache showsrc qemu found no source package"

key=$( { echo "$src_version"; echo "$dev_files"; cat "$here/build-qemu.sh"; } | sha256sum | cut -c1-16)
top="$NPU_CACHE/qemu/$key"
src="$top/src"
bld="$src/build"
out="$NPU_CACHE/bin/qemu-system-x86_64"

# Copy the device sources, the shared contract headers and trace events into
# the tree when they changed (ninja then rebuilds just those).
sync_device_sources() {
	local f
	for f in "$dev_dir"/*.[ch] "$inc_dir"/*.h; do
		cmp -s "$f" "$src/hw/misc/npu/$(basename "$f")" || cp "$f" "$src/hw/misc/npu/"
	done
	cat "$src/hw/misc/trace-events.orig" "$dev_dir/trace-events" >"$top/trace-events.new"
	if cmp -s "$top/trace-events.new" "$src/hw/misc/trace-events"; then
		rm "$top/trace-events.new"
	else
		mv "$top/trace-events.new" "$src/hw/misc/trace-events"
	fi
}

if [ ! -f "$top/.configured" ]; then
	log "QEMU: fetching Debian source qemu=$src_version into $top"
	rm -rf "$top"
	mkdir -p "$top/dl"
	(cd "$top/dl" && apt-get source -qq "qemu=$src_version" >/dev/null)
	mv "$top/dl"/qemu-*/ "$src"
	rm -rf "$top/dl"

	log "QEMU: splicing the npu device into hw/misc"
	mkdir -p "$src/hw/misc/npu"
	cat >>"$src/hw/misc/Kconfig" <<'EOF'

config NPU_PCI
    bool
    default y if PCI_DEVICES
    depends on PCI && MSI_NONBROKEN
EOF
	cat >>"$src/hw/misc/meson.build" <<'EOF'

npu_blas = dependency('openblas', required: true)
EOF
	{
		printf "softmmu_ss.add(when: 'CONFIG_NPU_PCI', if_true: [npu_blas, files(\n"
		for f in $dev_files; do printf "  'npu/%s',\n" "$f"; done
		printf ")])\n"
	} >>"$src/hw/misc/meson.build"
	cp "$src/hw/misc/trace-events" "$src/hw/misc/trace-events.orig"
	sync_device_sources

	log "QEMU: configuring (x86_64-softmmu, minimal features)"
	mkdir -p "$bld"
	(cd "$bld" && ../configure \
		--target-list=x86_64-softmmu \
		--without-default-features \
		--enable-tcg --enable-kvm --enable-virtfs --enable-attr \
		--enable-cap-ng --enable-fdt=system --enable-trace-backends=log \
		--disable-docs --disable-werror \
		--cc="ccache gcc" --cxx="ccache g++" \
		--extra-cflags="-g -O2") >"$top/configure.log" 2>&1 ||
		{ tail -n 40 "$top/configure.log"; die "QEMU configure failed (see $top/configure.log)"; }
	touch "$top/.configured"
fi

sync_device_sources

log "QEMU: building (first build takes ~10 min; later ones seconds)"
export CCACHE_DIR="$NPU_CACHE/ccache"
if ! ninja -C "$bld" qemu-system-x86_64 >"$top/build.log" 2>&1; then
	grep -E 'error|warning' "$top/build.log" | head -n 40 >&2 || true
	tail -n 20 "$top/build.log" >&2
	die "QEMU build failed (see $top/build.log)"
fi
grep -E 'hw/misc/npu/.*warning' "$top/build.log" >&2 || true
mkdir -p "$(dirname "$out")"
ln -sf "$bld/qemu-system-x86_64" "$out"
ln -sfn "$top" "$NPU_CACHE/qemu/current"
log "QEMU ready: $out"
