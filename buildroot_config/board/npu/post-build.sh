#!/bin/sh
# Post-build script of npu_qemu_x86_64_defconfig (BR2_ROOTFS_POST_BUILD_SCRIPT).
# Buildroot runs it with the target directory as $1 and BR2_EXTERNAL_NPU_PATH
# in the environment, before it makes the file system images.
#
# The init script and the udev rule are the Debian guest's: they are copied
# from guest/, their one source, never kept under buildroot_config/.
set -eu

target=${1:?usage: post-build.sh TARGET_DIR}
guest=${BR2_EXTERNAL_NPU_PATH:?BR2_EXTERNAL_NPU_PATH is not set (run by Buildroot)}/../guest

install -D -m 0755 "$guest/npu-init" "$target/sbin/npu-init"
install -D -m 0644 "$guest/99-npu.rules" "$target/etc/udev/rules.d/99-npu.rules"

# PID 1. The kernel command line may name it (init=/sbin/npu-init); with
# BR2_INIT_NONE nothing else claims /sbin/init, so the default finds it too.
ln -sfn npu-init "$target/sbin/init"

# The group of /dev/npuN in the udev rule: a system group, as
# "groupadd -r npu" makes it in the Debian guest (the highest free GID
# below 1000).
if ! grep -q '^npu:' "$target/etc/group"; then
	gid=999
	while cut -d: -f3 "$target/etc/group" | grep -qx "$gid"; do
		gid=$((gid - 1))
	done
	echo "npu:x:$gid:" >>"$target/etc/group"
fi

# guest/npu-init starts udevd by its Debian (systemd) path; eudev installs
# the daemon as udevd.
udevd=
for p in /sbin/udevd /usr/sbin/udevd /lib/udev/udevd /usr/lib/udev/udevd; do
	# -L too: a symlink may point into the target's root, not the host's.
	if [ -x "$target$p" ] || [ -L "$target$p" ]; then
		udevd=$p
		break
	fi
done
[ -n "$udevd" ] || {
	echo "post-build.sh: no udevd in $target (eudev not built?)" >&2
	exit 1
}
mkdir -p "$target/lib/systemd"
ln -sfn "$udevd" "$target/lib/systemd/systemd-udevd"

# What else npu-init expects of the root: the share's mount point and a
# directory for the poweroff(8) it writes at boot.
mkdir -p "$target/mnt/npu" "$target/usr/local/sbin"
