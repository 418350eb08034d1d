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
# Names enter the hash relative to the project (or to a hashed directory),
# never as absolute paths, so a clone in another folder gets the same key.
hash_files() {
	local f
	for f in "$@"; do
		if [ -d "$f" ]; then
			(cd "$f" && find . -type f ! -name '*.pyc' -print0 | LC_ALL=C sort -z |
				xargs -0 sha256sum)
		else
			printf '%s  %s\n' "$(sha256sum <"$f" | cut -d' ' -f1)" "${f#"$NPU_ROOT"/}"
		fi
	done | sha256sum | cut -c1-16
}

# The guest's Debian release (the host stays on its own).
GUEST_SUITE=trixie

# add_suite_src SUITE: a deb-src entry for SUITE from the host's own mirror,
# so that `apt-get source` can fetch that release's packages.
# Builds run in parallel (make -j2) and apt allows one `apt-get update` at a
# time: the check, the entry and its update happen under one lock, so a
# second caller waits for the first one's update instead of failing on
# apt's own lock or reading half-updated lists.
add_suite_src() {
	local suite=$1 f="${NPU_APT_SOURCES:-/etc/apt/sources.list.d}/npu-stack-$1-src.sources"
	(
		flock 9
		[ -f "$f" ] && exit 0
		printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' \
			"$(debian_mirror)" "$suite" /usr/share/keyrings/debian-archive-keyring.gpg >"$f.tmp"
		mv "$f.tmp" "$f"
		apt-get update -qq -o DPkg::Lock::Timeout=600 || { rm -f "$f"; exit 1; }
	) 9>"$NPU_CACHE/apt-sources.lock"
}

# newest_build_of DIR VERSION: the newest DIR/*/source-version file that
# reads VERSION, or nothing (and success) when there is none, as on a fresh
# machine, where grep matches nothing and pipefail must not end the caller.
newest_build_of() {
	{ grep -lx "$2" "$1"/*/source-version 2>/dev/null || true; } | xargs -r ls -t | head -n1
}

# fetch_source PKG VERSION: the unpacked Debian source package PKG=VERSION
# (patches applied) under $NPU_CACHE/src/PKG-VERSION (no epoch: colons
# upset build tools); prints that path.
fetch_source() {
	local pkg=$1 ver=$2 d="$NPU_CACHE/src/$1-${2#*:}"
	if [ ! -f "$d/.done" ]; then
		rm -rf "$d"
		mkdir -p "$d/dl"
		(cd "$d/dl" && apt-get source -qq "$pkg=$ver" >/dev/null 2>"$d/fetch.log") ||
			{ cat "$d/fetch.log" >&2; die "apt-get source $pkg=$ver failed"; }
		mv "$d/dl/$pkg"-*/ "$d/tree"
		rm -rf "$d/dl"
		touch "$d/.done"
	fi
	echo "$d/tree"
}

# guest_chroot CMD...: run CMD in the trixie root tree of the guest image
# (its toolchain: gcc-14 and the guest kernel's headers), with the project at
# /src and the cache at /cache. The mounts live in a private mount namespace
# and vanish with the command.
guest_chroot() {
	local r
	r=$(readlink -f "$NPU_CACHE/guest/current")/rootfs
	[ -d "$r/usr" ] || die "no guest root tree at $r (make guest)"
	# shellcheck disable=SC2016 # expanded by the inner shell
	unshare -m --propagation private sh -c '
		r=$1; shift
		mount --bind "$NPU_ROOT" "$r/src" &&
		mount --bind "$NPU_CACHE" "$r/cache" &&
		mount -t proc proc "$r/proc" &&
		exec chroot "$r" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
			LC_ALL=C.UTF-8 "$@"
	' sh "$r" "$@"
}

# debian_mirror: the Debian mirror URI the host's apt already uses.
debian_mirror() {
	local uri
	# No *.sources file (a host with /etc/apt/sources.list only) is no error:
	# under pipefail, grep's failure would end the caller without a word.
	uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null |
		awk '{print $2}' | grep -v -- '-security' | grep -i debian | head -n1 || true)
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

# The newest 6.12 source of the guest's release that the mirror serves (a
# mirror may list a version whose files it does not carry).
linux_source_version_probe() {
	local v uri
	for v in $(apt-cache showsrc linux 2>/dev/null | awk '/^Version: 6\.12\./ {print $2}' | sort -rV -u); do
		uri=$(apt-get source --print-uris -qq "linux=$v" 2>/dev/null | awk '/\.dsc/ {print $1}' | tr -d "'")
		[ -n "$uri" ] && curl -fsI -o /dev/null "$uri" && { echo "$v"; return 0; }
	done
	return 1
}

# linux_source_version: that version (adding the deb-src entry if needed).
linux_source_version() {
	linux_source_version_probe ||
		{ add_suite_src "$GUEST_SUITE" && linux_source_version_probe; } ||
		die "no Debian 6.12 linux source package can be fetched"
}
