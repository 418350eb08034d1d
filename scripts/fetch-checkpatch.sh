#!/usr/bin/env bash
# Fetch the kernel's checkpatch.pl (and the data files it reads) from
# Debian's linux-source package into $NPU_CACHE/checkpatch. Only those
# files are kept; no kernel source enters the project tree.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/common.sh
. "$here/common.sh"

out="$NPU_CACHE/checkpatch"
[ -x "$out/scripts/checkpatch.pl" ] && exit 0
pkg=$(apt-cache depends linux-source 2>/dev/null | awk '/Depends: linux-source-/ {print $2; exit}')
pkg=${pkg:-linux-source-6.1}
log "lint: fetching checkpatch.pl from $pkg (one time, ~140 MB)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -qq "$pkg" >/dev/null 2>&1) ||
	{ apt-get update -qq && (cd "$tmp" && apt-get download -qq "$pkg" >/dev/null); }
dpkg-deb --fsys-tarfile "$tmp"/*.deb | tar -x -C "$tmp" --wildcards './usr/src/linux-source-*.tar.xz'
tarball=$(ls "$tmp"/usr/src/linux-source-*.tar.xz)
top=$(basename "$tarball" .tar.xz)
mkdir -p "$tmp/x"
tar -xJf "$tarball" -C "$tmp/x" "$top/scripts/checkpatch.pl" "$top/scripts/spelling.txt" \
	"$top/scripts/const_structs.checkpatch"
rm -rf "$out"
mkdir -p "$out"
mv "$tmp/x/$top/scripts" "$out/scripts"
log "lint: checkpatch.pl ready in $out"
