#!/usr/bin/env bash
# Build QEMU (x86_64-softmmu) from Debian 13's source package (10.0.x), with
# the NPU device from qemu_device/ spliced into hw/misc.
#
#   build-qemu.sh          the release build ($NPU_CACHE/bin/qemu-system-x86_64)
#   build-qemu.sh asan     the same QEMU with AddressSanitizer and UBSan
#                          ($NPU_CACHE/bin/qemu-system-x86_64-asan), which
#                          the qtest suite runs against
#   build-qemu.sh VARIANT key   print the cache key of that build
#
# The spliced source tree is cached in $NPU_CACHE/qemu/<key>, where <key>
# hashes what the configure step depends on (this script, the Debian source
# version, the list of device files); each variant has its own build
# directory in it. The device sources themselves are synced into the tree on
# every run and rebuilt incrementally by ninja, so editing a device file
# costs seconds, not a reconfigure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/common.sh
. "$here/common.sh"

variant=${1:-release}
print_key=0
[ "${2:-}" = key ] && print_key=1
case "$variant" in
release) suffix="" extra=(--extra-cflags="-g -O2") ;;
asan) suffix="-asan" extra=(--enable-asan --enable-ubsan --extra-cflags="-g -O1 -fno-omit-frame-pointer") ;;
*) die "unknown QEMU variant '$variant' (release or asan)" ;;
esac

dev_dir="$NPU_ROOT/qemu_device"
inc_dir="$NPU_ROOT/include"
# Only the set of C files shapes meson.build; their contents do not.
dev_files=$(find "$dev_dir" -maxdepth 1 -name '*.c' -printf '%f\n' | LC_ALL=C sort | tr '\n' ' ')
src_suite_version() {
	# No match is no error: on a fresh machine the suite has no deb-src yet.
	apt-cache showsrc qemu 2>/dev/null | awk '/^Version:/ {print $2}' | grep -E '\+deb13|^1:10\.0\.' | sort -V | tail -n1 || true
}
src_version=$(src_suite_version)
[ -n "$src_version" ] || { add_suite_src "$GUEST_SUITE"; src_version=$(src_suite_version); }
[ -n "$src_version" ] || die "apt-cache showsrc qemu found no $GUEST_SUITE source package"

# The host's release, compiler and the development packages the device
# builds against (oneDNN 2.x on Debian 12, 3.x on Debian 13: the device
# builds with either): a build is reused only where it would be made the
# same way.
host_facts() {
	(. /etc/os-release && echo "$ID $VERSION_ID")
	gcc -dumpfullversion 2>/dev/null || echo "no gcc"
	# shellcheck disable=SC2016 # dpkg-query's format, not the shell's
	dpkg-query -W -f='${Package} ${Version}\n' libdnnl-dev libglib2.0-dev libpixman-1-dev \
		libfdt-dev 2>/dev/null || true
}
key=$( { echo "$src_version"; echo "$dev_files"; host_facts; cat "$here/build-qemu.sh"; } |
	sha256sum | cut -c1-16)
[ $print_key = 1 ] && { echo "qemu-$variant $key"; exit 0; }
top="$NPU_CACHE/qemu/$key"
src="$top/src"
bld="$src/build$suffix"
out="$NPU_CACHE/bin/qemu-system-x86_64$suffix"

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

exec 8>"$NPU_CACHE/qemu-src.lock"
flock 8
if [ ! -f "$top/.spliced" ]; then
	log "QEMU: Debian source qemu=$src_version into $top"
	rm -rf "$top"
	mkdir -p "$top"
	cp -a "$(fetch_source qemu "$src_version")" "$src"

	log "QEMU: splicing the npu device into hw/misc"
	mkdir -p "$src/hw/misc/npu"
	cat >>"$src/hw/misc/Kconfig" <<'EOF'

config NPU_PCI
    bool
    default y if PCI_DEVICES
    depends on PCI && MSI_NONBROKEN
EOF
	# oneDNN (Debian's libdnnl, OpenMP runtime) is the device's only math
	# library: its sgemm, convolutions and matmuls. The device's cores are
	# its parallelism, so each core sets its own OpenMP team to one thread
	# and every call runs on the calling core alone.
	cat >>"$src/hw/misc/meson.build" <<'EOF'

npu_dnnl = declare_dependency(link_args: ['-ldnnl', '-lgomp'])
EOF
	{
		printf "system_ss.add(when: 'CONFIG_NPU_PCI', if_true: [npu_dnnl, files(\n"
		for f in $dev_files; do printf "  'npu/%s',\n" "$f"; done
		printf ")])\n"
	} >>"$src/hw/misc/meson.build"
	cp "$src/hw/misc/trace-events" "$src/hw/misc/trace-events.orig"
	touch "$top/.spliced"
fi
sync_device_sources
flock -u 8

if [ ! -f "$bld/.configured" ]; then
	log "QEMU ($variant): configuring (x86_64-softmmu, minimal features)"
	rm -rf "$bld"
	mkdir -p "$bld"
	# The +ds tarball carries neither meson wheels nor firmware blobs: meson
	# comes from the project's venv, the BIOS from Debian's seabios.
	(cd "$bld" && ../configure \
		--target-list=x86_64-softmmu \
		--without-default-features \
		--python="$NPU_VENV/bin/python3" \
		--enable-tcg --enable-kvm --enable-virtfs --enable-attr \
		--enable-cap-ng --enable-fdt=system --enable-trace-backends=log \
		--disable-docs --disable-werror --disable-install-blobs \
		--cc="ccache gcc" --cxx="ccache g++" \
		"${extra[@]}") >"$bld.configure.log" 2>&1 ||
		{ tail -n 40 "$bld.configure.log"; die "QEMU configure failed (see $bld.configure.log)"; }
	touch "$bld/.configured"
fi

log "QEMU ($variant): building (first build takes ~6 min; later ones seconds)"
export CCACHE_DIR="$NPU_CACHE/ccache"
if ! ninja -C "$bld" qemu-system-x86_64 >"$bld.build.log" 2>&1; then
	grep -E 'error|warning' "$bld.build.log" | head -n 40 >&2 || true
	tail -n 20 "$bld.build.log" >&2
	die "QEMU build failed (see $bld.build.log)"
fi
grep -E 'hw/misc/npu/.*warning' "$bld.build.log" >&2 || true
mkdir -p "$(dirname "$out")"
ln -sf "$bld/qemu-system-x86_64" "$out"
ln -sfn "$key" "$NPU_CACHE/qemu/current"
log "QEMU ($variant) ready: $out"
