#!/usr/bin/env bash
# Install the host packages the build, the tests and the linters need.
# Idempotent: a stamp keyed by this file's hash skips the work next time.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/common.sh
. "$here/common.sh"

APT_PKGS=(
	build-essential ccache ninja-build meson pkg-config flex bison
	libglib2.0-dev libpixman-1-dev libdnnl-dev zlib1g-dev
	debootstrap e2fsprogs dpkg-dev fakeroot cpio xz-utils zstd
	python3-venv pciutils sparse git curl
	libcap-ng-dev libattr1-dev libfdt-dev qemu-system-data seabios
	shellcheck
)

stamp="$NPU_CACHE/stamps/deps-$(hash_files "$here/deps.sh" "$here/common.sh" "$NPU_ROOT/requirements-dev.txt")"
[ "${1:-}" = key ] && { echo "deps ${stamp##*/deps-}"; exit 0; }
if [ -f "$stamp" ]; then
	exit 0
fi

# One installer at a time (parallel make targets share this step).
exec 9>"$NPU_CACHE/deps.lock"
flock 9
[ -f "$stamp" ] && exit 0

log "installing host packages (apt)"
add_deb_src
apt_updated=0
missing=()
for p in "${APT_PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	apt-get update -qq
	apt_updated=1
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ $apt_updated = 1 ] || apt-get update -qq

log "installing host Python packages (pip, venv at $NPU_VENV)"
if [ ! -x "$NPU_VENV/bin/python" ]; then
	python3 -m venv "$NPU_VENV"
fi
"$NPU_VENV/bin/pip" install -q -r "$NPU_ROOT/requirements-dev.txt"

mkdir -p "$(dirname "$stamp")"
touch "$stamp"
log "host dependencies ready"
