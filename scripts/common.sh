# Shared settings for the build scripts (sourced, not run).
# shellcheck shell=bash

NPU_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Build products live outside the clone so that a fresh clone reuses them.
NPU_CACHE=${NPU_CACHE:-$HOME/.cache/npu-stack}
NPU_VENV=${NPU_VENV:-$NPU_CACHE/venv}
export NPU_ROOT NPU_CACHE NPU_VENV
mkdir -p "$NPU_CACHE"

log() {
	printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2
}

die() {
	log "error: $*"
	exit 1
}

# hash_files FILE... : short content hash of the given files (and dirs).
hash_files() {
	local f
	for f in "$@"; do
		if [ -d "$f" ]; then
			(cd "$f" && find . -type f ! -name '*.pyc' -print0 | LC_ALL=C sort -z |
				xargs -0 sha256sum)
		else
			sha256sum "$f"
		fi
	done | sha256sum | cut -c1-16
}

# debian_mirror: the Debian mirror URI the host's apt already uses.
debian_mirror() {
	local uri
	uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null |
		awk '{print $2}' | grep -v -- '-security' | grep -i debian | head -n1)
	if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
		uri=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
			/etc/apt/sources.list)
	fi
	[ -n "$uri" ] || die "no Debian mirror found in the host's apt sources"
	echo "$uri"
}

# add_deb_src: a deb-src entry for the host's release, from its own mirror.
add_deb_src() {
	local f=/etc/apt/sources.list.d/npu-stack-src.sources
	[ -f "$f" ] && return 0
	local codename
	codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
	cat >"$f" <<EOF
Types: deb-src
URIs: $(debian_mirror)
Suites: $codename $codename-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
}
