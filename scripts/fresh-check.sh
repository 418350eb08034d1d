#!/usr/bin/env bash
# The proof that the README's `make demo` works on a NEW machine: a clean
# Debian root (debootstrap), the project copied in, an empty NPU_CACHE, and
# `make demo` run there as root, exactly as the README says.
#
#   fresh-check.sh [OPTIONS] [bookworm|trixie|auto]   run the check (default auto)
#   fresh-check.sh [OPTIONS] key                      print the check's key
#   fresh-check.sh [OPTIONS] ci [bookworm|trixie|auto]
#                  run the check unless this key already passed on this
#                  machine for the release whose turn it is (see below)
#
# Options:
#   --src DIR   check the tree DIR instead of this one (results go to DIR/build/)
#   --head      check DIR's committed HEAD (git archive) instead of its working
#               tree; the default is the working tree (`git ls-files -co
#               --exclude-standard`: tracked and new files, not ignored ones),
#               so that a change can be checked before it is committed
#   --keep      keep the run's root even when the check passes
#   --test      then the README's `make test` in the same root, once make
#               demo passed (results: build/fresh-check-<release>-test.json)
#
# auto is the release of this host when it is bookworm or trixie (a new
# machine of this kind), bookworm otherwise.
#
# The root: debootstrap's default variant (Priority required + important:
# what a minimal Debian install has), plus ca-certificates, make and git,
# which every machine that got the project with `git clone` and runs `make`
# has. Nothing else: no python3, no compiler, no apt lists (they are
# removed, as Debian's container images do). The project must install
# everything else itself. It is made once per release and recipe
# ($NPU_CACHE/fresh-roots/<release>-<hash of BASE_PKGS and make_root>) and
# copied afresh (cp -a) for every check, so each check starts pristine.
#
# In the copy, what the administrator of a new machine of this kind has
# set up: the host's Debian mirror as /etc/apt/sources.list.d/
# debian.sources (deb822; plus the host's security mirror if it has one),
# the host's apt Acquire:: settings (how this machine reaches its mirror),
# the certificate authorities the host trusts beyond Debian's own (a
# TLS-inspecting proxy's, say; in /usr/local/share/ca-certificates), pip's
# index if the host's is an http(s) one (otherwise pip's default, PyPI)
# and pip's `cert` setting, and /etc/resolv.conf. Then the project, at
# /root/npu, as a git repository of one commit of what was copied (a
# clone's history is not needed; its being a repository is, for the tests
# of the cache keys, which list the project's files with git). NPU_CACHE
# is left to its default, /root/.cache/npu-stack, empty. `make demo` then runs in
# a chroot with /proc, /dev (with /dev/pts and /dev/shm) and /sys, in
# private mount and PID namespaces: every mount and every process of the
# check goes away with it, however it ends (the namespace's init is killed
# when this script dies). The environment is only PATH, HOME=/root and
# DEBIAN_FRONTEND=noninteractive; stdin is /dev/null. No /dev/kvm is
# needed (the guest runs under TCG).
#
# Results: build/fresh-check-<release>.log (the whole output) and
# build/fresh-check-<release>.json (release, key, seconds = make demo's wall
# time, ok; also the root's creation time, and "stages": when each
# landmark line came (the build scripts' "[HH:MM:SS] ..." lines, the
# firmware, ResNet-50, the guest's boot, make's errors) and how long until
# the next); with --test, build/fresh-check-<release>-test.json (release,
# key, seconds = make test's wall time, ok). On a pass of make demo, the
# stamp $NPU_CACHE/stamps/fresh-check-<release>-<key>. The run's root is
# under $NPU_CACHE/fresh-runs/; it is deleted (in the background) on a
# pass, kept on a failure (for a look inside) until the next check of that
# release.
#
# The key hashes what decides how things are built and installed, by
# content and by path relative to the tree (a clone in another folder gets
# the same key): Makefile, scripts/ (the build scripts, the QEMU splice in
# build-qemu.sh, this script), guest/ (package lists, pip list, init, the
# kernel fragments in guest/kernel/), requirements*.txt, pyproject.toml,
# firmware/, kernel_module/Kbuild (npu.ko's build recipe),
# examples/models/make_resnet50.py (`make demo` runs it on the host with
# the venv's packages), and the set of names of qemu_device/*.c (they shape
# the splice's meson.build; their contents do not, as for build-qemu.sh's
# own key). Source code is not in it: the usual CI builds and tests that on
# every change.
#
# ci: the release whose turn it is comes from the key: an even last hex
# digit checks bookworm, an odd one trixie. Stateless and deterministic: a
# key always means the same release on every machine, a re-run of the same
# key is a skip, and over successive changes both releases get checked.
#
# Environment: FRESH_TIMEOUT (seconds for make demo, default 14400).
set -eEuo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# set -e ends the script; say where (in the script's own shell, not in subshells).
trap '[ "$BASHPID" != $$ ] || echo "fresh-check: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
# shellcheck source=scripts/common.sh disable=SC1091 # followed with shellcheck -x (make lint)
. "$here/common.sh"

# What the fresh root has besides debootstrap's default variant.
BASE_PKGS=ca-certificates,make,git
# The key's inputs (relative to the tree); requirements*.txt and the device
# file names are added by key_inputs.
KEY_PATHS=(Makefile scripts guest firmware pyproject.toml kernel_module/Kbuild
	examples/models/make_resnet50.py)

usage() {
	sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

# key_inputs TREE: the key's files of TREE, relative, one per line, sorted;
# caches and files git ignores left out.
key_inputs() {
	local tree=$1 p
	(
		cd "$tree"
		for p in "${KEY_PATHS[@]}"; do
			[ -e "$p" ] || continue
			find "$p" \( -name __pycache__ -o -name '.*_cache' -o -name '*.egg-info' \) -prune -o \
				-type f ! -name '*.pyc' -print
		done
		find . -maxdepth 1 -type f -name 'requirements*.txt' -printf '%f\n'
	) | LC_ALL=C sort -u | {
		if git -C "$tree" rev-parse --is-inside-work-tree >/dev/null 2>&1 &&
			[ "$(git -C "$tree" rev-parse --show-toplevel)" = "$(cd "$tree" && pwd -P)" ]; then
			# Drop what git ignores (what a clone would not have).
			local names
			names=$(cat)
			[ -n "$names" ] || return 0
			comm -23 <(printf '%s\n' "$names") \
				<(printf '%s\n' "$names" | { git -C "$tree" check-ignore --stdin || true; } | LC_ALL=C sort -u)
		else
			cat
		fi
	}
}

# fresh_key TREE: the check's key of TREE.
fresh_key() {
	local tree=$1 f
	{
		key_inputs "$tree" | while IFS= read -r f; do
			printf '%s  %s\n' "$(sha256sum <"$tree/$f" | cut -d' ' -f1)" "$f"
		done
		find "$tree/qemu_device" -maxdepth 1 -name '*.c' -printf 'qemu_device file %f\n' 2>/dev/null |
			LC_ALL=C sort
	} | sha256sum | cut -c1-16
}

# host_release: this host's Debian codename.
host_release() {
	# shellcheck disable=SC1091 # the host's file
	(. /etc/os-release && echo "${VERSION_CODENAME:-}")
}

resolve_release() {
	case "$1" in
	bookworm | trixie) echo "$1" ;;
	auto)
		case "$(host_release)" in
		bookworm | trixie) host_release ;;
		*) echo bookworm ;;
		esac
		;;
	*) die "unknown release '$1' (bookworm, trixie or auto)" ;;
	esac
}

# turn_release KEY: the release ci checks for KEY (last hex digit's parity).
turn_release() {
	if (($(printf '%d' "0x${1: -1}") % 2 == 0)); then echo bookworm; else echo trixie; fi
}

# The host's tools for making the root (a fresh host has no debootstrap).
host_tools() {
	local p missing=()
	for p in debootstrap debian-archive-keyring; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} = 0 ] && return 0
	log "fresh-check: installing ${missing[*]} on the host"
	(
		flock 9
		apt-get update -qq -o DPkg::Lock::Timeout=600
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			-o DPkg::Lock::Timeout=600 "${missing[@]}"
	) 9>"$NPU_CACHE/deps.lock"
}

# make_root RELEASE DIR MIRROR: the fresh machine's root file system.
make_root() {
	local release=$1 dir=$2 mirror=$3 script=/usr/share/debootstrap/scripts/$1
	# An older debootstrap may not know the release yet; it bootstraps as sid.
	[ -e "$script" ] || script=/usr/share/debootstrap/scripts/sid
	debootstrap --include="$BASE_PKGS" \
		--keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
		"$release" "$dir" "$mirror" "$script"
	# Each check writes its own sources; a new machine has no package lists.
	rm -f "$dir/etc/apt/sources.list"
	chroot "$dir" apt-get clean
	rm -rf "$dir/var/lib/apt/lists"/*
	mkdir -p "$dir/var/lib/apt/lists/partial"
}

# fresh_root RELEASE: the cached root's directory (made when missing).
fresh_root() {
	local release=$1 h base t0
	h=$({ echo "$release $BASE_PKGS"; declare -f make_root; } | sha256sum | cut -c1-16)
	base="$NPU_CACHE/fresh-roots/$release-$h"
	mkdir -p "$NPU_CACHE/fresh-roots"
	exec 6>"$base.lock"
	flock 6
	if [ ! -f "$base/.done" ]; then
		log "fresh-check: making the $release root (debootstrap, about 3 min) in $base"
		t0=$SECONDS
		rm -rf --one-file-system "$base"
		mkdir -p "$base"
		make_root "$release" "$base/root" "$(debian_mirror)" >"$base/debootstrap.log" 2>&1 ||
			{ tail -n 30 "$base/debootstrap.log" >&2; die "debootstrap of $release failed (see $base/debootstrap.log)"; }
		echo $((SECONDS - t0)) >"$base/seconds"
		touch "$base/.done"
		root_cached=false
	else
		root_cached=true
	fi
	exec 6>&-
	root_seconds=$(cat "$base/seconds")
	root_dir="$base/root"
}

# The host's security mirror (if its sources have one).
security_mirror() {
	{ grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
		awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}' \
			/etc/apt/sources.list 2>/dev/null; } | grep -i -- '-security' | head -n1 || true
}

# The host's pip settings that a new machine of this kind has too: an
# http(s) index (local file:// indexes and paths are this host's own) and
# the certificate bundle pip is told to trust, when the root has that file
# (the system bundle, say: see host_cas).
pip_conf() {
	local r=$1 idx=${PIP_INDEX_URL:-} extra=${PIP_EXTRA_INDEX_URL:-} cert=${PIP_CERT:-} f confs=()
	for f in /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
		[ -f "$f" ] && confs+=("$f")
	done
	if [ ${#confs[@]} -gt 0 ]; then
		[ -n "$idx$extra" ] || {
			idx=$(sed -n 's/^[[:space:]]*index-url[[:space:]]*=[[:space:]]*//p' "${confs[@]}" | tail -n1)
			extra=$(sed -n 's/^[[:space:]]*extra-index-url[[:space:]]*=[[:space:]]*//p' "${confs[@]}" | tail -n1)
		}
		[ -n "$cert" ] || cert=$(sed -n 's/^[[:space:]]*cert[[:space:]]*=[[:space:]]*//p' "${confs[@]}" | tail -n1)
	fi
	idx=$(printf '%s\n' "$idx" | tr ' ' '\n' | { grep -E '^https?://' || true; } | head -n1)
	extra=$(printf '%s\n' "$extra" | tr ' ' '\n' | { grep -E '^https?://' || true; } | xargs)
	if [ -z "$cert" ] || [ ! -f "$r$cert" ]; then cert=; fi
	[ -n "$idx$extra$cert" ] || return 0
	echo "[global]"
	[ -z "$idx" ] || echo "index-url = $idx"
	[ -z "$extra" ] || echo "extra-index-url = $extra"
	[ -z "$cert" ] || echo "cert = $cert"
}

# pem_split BUNDLE DIR: each certificate of BUNDLE into DIR/<hash of its body>.crt.
pem_split() {
	awk -v d="$2" '
	/-----BEGIN CERTIFICATE-----/ { c = 1; pem = ""; body = "" }
	c { pem = pem $0 "\n"; if ($0 !~ /-----/) body = body $0 }
	/-----END CERTIFICATE-----/ && c {
		c = 0
		cmd = "printf %s \"" body "\" | sha256sum | cut -c1-16"
		cmd | getline h; close(cmd)
		f = d "/" h ".crt"; printf "%s", pem > f; close(f)
	}' "$1"
}

# host_cas ROOT: the certificate authorities this host trusts beyond Debian's
# own (those an administrator added: a TLS-inspecting proxy's, a company's)
# installed in the root as an administrator does, in
# /usr/local/share/ca-certificates + update-ca-certificates.
host_cas() {
	local r=$1 t f n=0
	[ -f /etc/ssl/certs/ca-certificates.crt ] || return 0
	t=$(mktemp -d)
	mkdir "$t/host" "$t/debian"
	pem_split /etc/ssl/certs/ca-certificates.crt "$t/host"
	find /usr/share/ca-certificates -name '*.crt' -exec cat {} + >"$t/debian.pem" 2>/dev/null || true
	pem_split "$t/debian.pem" "$t/debian"
	for f in "$t/host"/*.crt; do
		if [ -e "$f" ] && [ ! -e "$t/debian/${f##*/}" ]; then
			mkdir -p "$r/usr/local/share/ca-certificates"
			cp "$f" "$r/usr/local/share/ca-certificates/host-${f##*/}"
			n=$((n + 1))
		fi
	done
	rm -rf "$t"
	[ "$n" = 0 ] && return 0
	log "fresh-check: the root trusts the host's $n own certificate authorities too"
	chroot "$r" update-ca-certificates >/dev/null 2>&1
}

# configure_root ROOT RELEASE: what the new machine's administrator set up.
configure_root() {
	local r=$1 release=$2 sec f
	sec=$(security_mirror)
	{
		printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: %s\n' \
			"$(debian_mirror)" "$release" "$release" /usr/share/keyrings/debian-archive-keyring.gpg
		[ -z "$sec" ] ||
			printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\nSigned-By: %s\n' \
				"$sec" "$release" /usr/share/keyrings/debian-archive-keyring.gpg
	} >"$r/etc/apt/sources.list.d/debian.sources"
	for f in /etc/apt/apt.conf.d/*; do
		[ -f "$f" ] && grep -q '^[[:space:]]*Acquire::' "$f" && cp "$f" "$r/etc/apt/apt.conf.d/"
	done
	host_cas "$r"
	pip_conf "$r" >"$r/etc/pip.conf"
	[ -s "$r/etc/pip.conf" ] || rm -f "$r/etc/pip.conf"
	rm -f "$r/etc/resolv.conf"
	cp -L /etc/resolv.conf "$r/etc/resolv.conf"
}

# export_tree SRC DST HEAD: the project's files into DST.
export_tree() {
	local src=$1 dst=$2 head=$3
	mkdir -p "$dst"
	if [ "$head" = 1 ]; then
		git -C "$src" archive --format=tar HEAD | tar -x -C "$dst"
	elif git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		(cd "$src" && git ls-files -z -co --exclude-standard |
			while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
			tar -c --null -T - -f -) | tar -x -C "$dst"
	else
		tar -c -C "$src" --exclude=./.git --exclude=./build -f - . | tar -x -C "$dst"
	fi
}

# snapshot_repo DIR: DIR as a git repository of one commit holding what was
# copied in. A new machine got the project with `git clone`, and the tests
# of the cache keys list the project's files with git, as a user's clone
# lets them.
snapshot_repo() {
	git -C "$1" init -q
	git -C "$1" add -A
	git -C "$1" -c user.name=fresh-check -c user.email=fresh-check@localhost \
		commit -q -m "fresh-check: the tree under test"
}

# run_in_root ROOT TEST: `make demo` in the root, as the README says, then
# with TEST=1 `make test`; its status (124 when it timed out). Each make
# ends with a line "fresh-check: make X exited with RC after N s". Run it in
# the background (`run_in_root ROOT TEST &`): it execs, so that its process
# is this script's child.
run_in_root() {
	local r=$1 test=$2
	# The root is bound onto itself: on a real machine / is a mount point
	# (unshare --propagation, as scripts/common.sh's guest_chroot does, fails
	# on a / that is not). Namespaces: mount (the binds vanish with it) and
	# PID (the chroot's shell is its init; when it ends, or when unshare
	# dies, every process in it is killed). setpriv --pdeathsig: timeout
	# dies with this script and unshare with timeout, however they die.
	# shellcheck disable=SC2016 # expanded by the inner shells
	exec setpriv --pdeathsig KILL -- timeout --kill-after=60 "${FRESH_TIMEOUT:-14400}" \
		setpriv --pdeathsig KILL -- \
		unshare --mount --propagation private --pid --fork --kill-child -- sh -c '
		r=$1 test=$2
		mount --bind "$r" "$r" &&
		mount -t proc proc "$r/proc" &&
		mount --rbind /dev "$r/dev" &&
		mount --rbind /sys "$r/sys" &&
		exec chroot "$r" /usr/bin/env -i \
			PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			HOME=/root DEBIAN_FRONTEND=noninteractive \
			/bin/bash -c "
				cd /root/npu || exit 1
				for target in demo \$([ $test = 1 ] && echo test); do
					t=\$SECONDS
					echo \"[\$(date +%T)] fresh-check: make \$target\"
					make \$target
					rc=\$?
					echo \"[\$(date +%T)] fresh-check: make \$target exited with \$rc after \$((SECONDS - t)) s\"
					[ \$rc = 0 ] || exit \$rc
				done
			"
	' sh "$r" "$test" </dev/null
}

# follow LOG PID TIMES T0: while PID runs, the build scripts' progress lines
# of LOG to stderr, and LOG's landmark lines with the time they came (seconds
# since T0) into TIMES: the build scripts' "[HH:MM:SS] what" lines, the
# firmware, ResNet-50 made, the guest booted, make's errors.
follow() {
	local log=$1 pid=$2 times=$3 t0=$4 raw line
	tail -n +1 -F --pid="$pid" "$log" 2>/dev/null | while IFS= read -r raw; do
		# Plain text for JSON: no control characters, quotes or backslashes.
		line=${raw//[[:cntrl:]]/}
		line=${line//\\//}
		line=${line//\"/\'}
		case "$line" in
		\[[0-9][0-9]:[0-9][0-9]:[0-9][0-9]\]\ *)
			printf '%s\n' "$raw" >&2
			printf '%d\t%s\n' $((SECONDS - t0)) "${line:11}" >>"$times"
			;;
		"mkfw: "* | "resnet50.onnx: "* | "guest.py: booted"* | "make: ***"*)
			printf '%d\t%s\n' $((SECONDS - t0)) "$line" >>"$times"
			;;
		esac
	done
}

# stages_json TIMES: those lines as a JSON list of {"at": seconds since
# make demo started, "seconds": until the next one, "what"}.
stages_json() {
	[ -f "$1" ] || { printf '[]'; return 0; }
	awk -F '\t' '
	{ n++; at[n] = $1; w[n] = $2 }
	END {
		printf "["
		for (i = 1; i <= n; i++) {
			d = (i < n) ? at[i + 1] - at[i] : 0
			printf "%s{\"at\": %d, \"seconds\": %d, \"what\": \"%s\"}", (i > 1 ? ", " : ""), at[i], d, w[i]
		}
		printf "]"
	}' "$1"
}

# discard DIR: DIR (a run) out of the way at once, deleted in the background
# (many small files: minutes). The run's mount namespace ended with its
# processes; a directory that still has a mount under it is left alone.
discard() {
	local d=$1 trash="$NPU_CACHE/fresh-runs/.trash"
	if findmnt -rn -o TARGET | grep -qF "$d/"; then
		log "fresh-check: $d has mounts; left alone"
		return 0
	fi
	mkdir -p "$trash"
	mv "$d" "$trash/${d##*/}.$$"
	rm -f "$d.lock"
	(setsid rm -rf --one-file-system "$trash" </dev/null >/dev/null 2>&1 &)
}

# exited TARGET FIELD LOG: make TARGET's exit status (FIELD 1) or seconds
# (FIELD 2) from its "exited with" line in LOG; nothing if it never ended.
exited() {
	sed -n "s/.*fresh-check: make $1 exited with \([0-9]*\) after \([0-9]*\) s.*/\\$2/p" "$3" | tail -n1
}

# check RELEASE: the whole check; exits with its result.
check() {
	local release=$1 runs run r key log json rc t0 seconds ok d tailpid label
	host_tools
	fresh_root "$release"
	mkdir -p "$src/build"
	log="$src/build/fresh-check-$release.log"
	json="$src/build/fresh-check-$release.json"

	# Earlier runs of this release that no check is using (a failed one is
	# kept for a look inside until now) are deleted in the background.
	runs="$NPU_CACHE/fresh-runs"
	mkdir -p "$runs"
	for d in "$runs/$release".*/; do
		[ -d "$d" ] || continue
		d=${d%/}
		if flock -n "$d.lock" true 2>/dev/null; then
			log "fresh-check: deleting the earlier run $d"
			discard "$d"
		fi
	done
	run=$(mktemp -d "$runs/$release.XXXXXX")
	exec 7>"$run.lock"
	flock 7
	r="$run/root"
	log "fresh-check: copying the $release root to $r"
	t0=$SECONDS
	cp -a --reflink=auto "$root_dir" "$r"
	configure_root "$r" "$release"
	export_tree "$src" "$r/root/npu" "$head"
	snapshot_repo "$r/root/npu"
	copy_seconds=$((SECONDS - t0))
	key=$(fresh_key "$r/root/npu")
	label=$([ "$head" = 1 ] && echo "HEAD of $src" || echo "working tree of $src")
	log "fresh-check: $release, key $key ($label): make demo in $r/root/npu (log: $log)"

	: >"$log"
	t0=$SECONDS
	run_in_root "$r" "$test" >"$log" 2>&1 &
	pid=$!
	follow "$log" "$pid" "$run/times" "$t0" &
	tailpid=$!
	# shellcheck disable=SC2064 # the pid is known now
	trap "trap - ERR; kill $pid 2>/dev/null; wait $pid || true; log 'fresh-check: interrupted'; exit 130" INT TERM
	rc=0
	wait "$pid" || rc=$?
	trap - INT TERM
	seconds=$((SECONDS - t0))
	wait "$tailpid" 2>/dev/null || true
	[ "$rc" != 124 ] || echo "fresh-check: make demo timed out after ${FRESH_TIMEOUT:-14400}s" >>"$log"

	# make demo's own status and time (the whole run's when it never ended).
	demo_rc=$(exited demo 1 "$log")
	demo_rc=${demo_rc:-$rc}
	demo_s=$(exited demo 2 "$log")
	ok=false
	[ "$demo_rc" = 0 ] && ok=true
	printf '{"release": "%s", "key": "%s", "seconds": %d, "ok": %s, "rc": %d, "source": "%s", "root_seconds": %d, "root_cached": %s, "copy_seconds": %d, "finished": "%s", "stages": %s}\n' \
		"$release" "$key" "${demo_s:-$seconds}" "$ok" "$demo_rc" "$label" "$root_seconds" "$root_cached" \
		"$copy_seconds" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(stages_json "$run/times")" >"$json"
	if [ "$test" = 1 ] && [ "$ok" = true ]; then
		test_rc=$(exited test 1 "$log")
		test_rc=${test_rc:-$rc}
		test_s=$(exited test 2 "$log")
		printf '{"release": "%s", "key": "%s", "seconds": %d, "ok": %s, "rc": %d, "source": "%s", "finished": "%s"}\n' \
			"$release" "$key" "${test_s:-$((seconds - ${demo_s:-0}))}" \
			"$([ "$test_rc" = 0 ] && echo true || echo false)" "$test_rc" "$label" \
			"$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$src/build/fresh-check-$release-test.json"
	fi
	if [ "$ok" = true ]; then
		mkdir -p "$NPU_CACHE/stamps"
		touch "$NPU_CACHE/stamps/fresh-check-$release-$key"
	fi
	if [ "$ok" = true ] && [ "$rc" = 0 ]; then
		exec 7>&-
		[ "$keep" = 1 ] || discard "$run"
		log "fresh-check: $release passed in ${seconds}s (key $key; $json)"
		return 0
	fi
	echo "---- last lines of $log ----" >&2
	tail -n 40 "$log" >&2
	log "fresh-check: $release FAILED (exit $rc after ${seconds}s; log $log; root kept at $r)"
	return 1
}

src=$NPU_ROOT
head=0
keep=0
test=0
args=()
while [ $# -gt 0 ]; do
	case "$1" in
	--src) src=$(cd "${2:?--src needs a directory}" && pwd) && shift ;;
	--head) head=1 ;;
	--keep) keep=1 ;;
	--test) test=1 ;;
	-h | --help) usage ;;
	-*) usage ;;
	*) args+=("$1") ;;
	esac
	shift
done
set -- "${args[@]}"

case "${1:-auto}" in
key)
	if [ "$head" = 1 ]; then
		tmp=$(mktemp -d)
		trap 'rm -rf "$tmp"' EXIT
		export_tree "$src" "$tmp" 1
		fresh_key "$tmp"
	else
		fresh_key "$src"
	fi
	;;
ci)
	[ "$head" = 0 ] || die "ci checks the working tree (a CI clone is its HEAD)"
	key=$(fresh_key "$src")
	if [ "${2:-auto}" = auto ]; then
		release=$(turn_release "$key")
		why="its turn: the key's last hex digit ${key: -1} is $([ "$release" = bookworm ] && echo even || echo odd)"
	else
		release=$(resolve_release "$2")
		why="asked for"
	fi
	stamp="$NPU_CACHE/stamps/fresh-check-$release-$key"
	if [ -f "$stamp" ]; then
		log "fresh-check: skipped: $release ($why) already passed for key $key on this machine ($(date -r "$stamp" '+%F %T'); $stamp)"
		exit 0
	fi
	log "fresh-check: $release ($why) has no pass for key $key on this machine: checking"
	check "$release"
	;;
bookworm | trixie | auto)
	[ $# -le 1 ] || usage
	check "$(resolve_release "${1:-auto}")"
	;;
*) usage ;;
esac
