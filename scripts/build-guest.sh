#!/usr/bin/env bash
# Build the Debian bookworm guest: kernel + initramfs + ext4 root image.
#
# Cached in $NPU_CACHE/guest/<key>, keyed by this script and the guest recipe
# (guest/packages.txt, guest/requirements.txt, guest/npu-init). Also installs
# on the host the linux-headers package of the exact guest kernel version,
# which `make module` builds against.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/common.sh
. "$here/common.sh"

g="$NPU_ROOT/guest"
key=$(hash_files "$here/build-guest.sh" "$g/packages.txt" "$g/requirements.txt" "$g/npu-init")
top="$NPU_CACHE/guest/$key"
current="$NPU_CACHE/guest/current"

if [ ! -f "$top/.done" ]; then
	rm -rf "$top"
	mkdir -p "$top"
	root="$top/rootfs"
	pkgs=$(grep -v '^#' "$g/packages.txt" | xargs | tr ' ' ',')
	mirror=$(debian_mirror)
	log "guest: debootstrap bookworm from $mirror (about 4 min)"
	debootstrap --variant=minbase --include="$pkgs" bookworm "$root" "$mirror" \
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
	mkdir -p "$root/mnt/npu"
	# Keep boot fast: no module load list, no fstab work.
	: >"$root/etc/fstab"
	rm -rf "$root/var/cache/apt/archives"/*.deb "$root/usr/share/doc" "$root/usr/share/man"

	kver=$(find "$root/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n1)
	cp "$root/boot/vmlinuz-$kver" "$top/vmlinuz"
	cp "$root/boot/initrd.img-$kver" "$top/initrd.img"
	echo "$kver" >"$top/kver"

	log "guest: making the ext4 image"
	mke2fs -q -t ext4 -L npuroot -d "$root" "$top/rootfs.ext4" 2G
	rm -rf "$root"
	touch "$top/.done"
fi
ln -sfn "$top" "$current"

kver=$(cat "$top/kver")
if [ ! -d "/usr/src/linux-headers-$kver" ]; then
	log "guest: installing host headers linux-headers-$kver"
	apt-get install -y -qq --no-install-recommends "linux-headers-$kver" >/dev/null ||
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends "linux-headers-$kver" >/dev/null; }
fi
log "guest ready: $current (kernel $kver)"
