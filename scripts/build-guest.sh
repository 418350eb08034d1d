#!/usr/bin/env bash
# Build the Debian 13 (trixie) guest: kernel + initramfs + ext4 root image.
#
# Cached in $NPU_CACHE/guest/<key>, keyed by this script and the guest recipe
# (guest/packages.txt, guest/requirements.txt, guest/npu-init). The root tree
# is kept beside the image: it is also the trixie toolchain (gcc-14, the
# guest kernel's exact headers) that builds npu.ko and the debug kernel in a
# chroot (scripts/common.sh: guest_chroot), since the bookworm host's gcc 12
# cannot build for a kernel made with gcc 14.
#
#   build-guest.sh        build (or reuse) the image
#   build-guest.sh key    print its cache key
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/common.sh
. "$here/common.sh"

g="$NPU_ROOT/guest"
key=$(hash_files "$here/build-guest.sh" "$g/packages.txt" "$g/requirements.txt" "$g/npu-init")
[ "${1:-}" = key ] && { echo "guest $key"; exit 0; }
top="$NPU_CACHE/guest/$key"
current="$NPU_CACHE/guest/current"

if [ ! -f "$top/.done" ]; then
	rm -rf "$top"
	mkdir -p "$top"
	root="$top/rootfs"
	pkgs=$(grep -v '^#' "$g/packages.txt" | xargs | tr ' ' ',')
	mirror=$(debian_mirror)
	log "guest: debootstrap $GUEST_SUITE from $mirror (about 4 min)"
	# trixie is not in bookworm's debootstrap scripts; it bootstraps as sid does.
	debootstrap --variant=minbase --include="$pkgs" \
		--keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
		"$GUEST_SUITE" "$root" "$mirror" /usr/share/debootstrap/scripts/sid \
		>"$top/debootstrap.log" 2>&1 ||
		{ tail -n 30 "$top/debootstrap.log"; die "debootstrap failed (see $top/debootstrap.log)"; }

	log "guest: installing pip-only packages into the image"
	pyver=$(find "$root/usr/lib" -maxdepth 1 -name 'python3.*' -printf '%f\n' |
		grep -E '^python3\.[0-9]+$' | sort -V | tail -n1)
	"$NPU_VENV/bin/pip" install -q --no-compile --no-deps --target "$root/usr/local/lib/$pyver/dist-packages" \
		-r "$g/requirements.txt"

	log "guest: configuring the image"
	install -m 0755 "$g/npu-init" "$root/sbin/npu-init"
	echo npu-guest >"$root/etc/hostname"
	chroot "$root" groupadd -f -r npu
	chroot "$root" passwd -d root >/dev/null
	# numpy's BLAS is OpenBLAS, not the reference BLAS.
	chroot "$root" update-alternatives --quiet --set libblas.so.3-x86_64-linux-gnu \
		/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
	mkdir -p "$root/mnt/npu" "$root/src" "$root/cache"
	# Keep boot fast: no module load list, no fstab work.
	: >"$root/etc/fstab"
	rm -rf "$root/var/cache/apt/archives"/*.deb "$root/usr/share/doc" "$root/usr/share/man"

	kver=$(find "$root/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n1)
	cp "$root/boot/vmlinuz-$kver" "$top/vmlinuz"
	cp "$root/boot/initrd.img-$kver" "$top/initrd.img"
	echo "$kver" >"$top/kver"
	# The Debian versions of what the benchmarks compare against.
	# shellcheck disable=SC2016 # dpkg-query's format, not the shell's
	chroot "$root" dpkg-query -W -f='${Package} ${Version}\n' \
		"linux-image-$kver" python3-numpy python3-onnx python3-onnxruntime \
		python3-torch libopenblas0-pthread python3 >"$top/versions"
	# Resolved inside the guest root: the link's absolute target names a
	# guest path, which the host may not have (or have from another package).
	chroot "$root" readlink -e /etc/alternatives/libblas.so.3-x86_64-linux-gnu >"$top/blas" ||
		die "the guest's libblas.so.3 alternative does not resolve inside the guest"

	log "guest: making the ext4 image"
	mke2fs -q -t ext4 -L npuroot -d "$root" "$top/rootfs.ext4" 4G
	touch "$top/.done"
fi
ln -sfn "$key" "$current"
log "guest ready: $current (kernel $(cat "$top/kver"), $(cat "$top/blas"))"
