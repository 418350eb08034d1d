#!/usr/bin/env bash
# Every checker the project promises: ruff + mypy (Python), checkpatch
# --strict + a W=1 sparse build (kernel), QEMU's checkpatch (device model),
# and shellcheck for the scripts. Exits non-zero if any of them complains.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/common.sh
. "$here/common.sh"
cd "$NPU_ROOT" || exit 1

fail=0
step() {
	log "lint: $1"
}
bad() {
	log "lint: FAILED: $1"
	fail=1
}

step "ruff"
"$NPU_VENV/bin/ruff" check runtime_py tests scripts examples || bad ruff
"$NPU_VENV/bin/ruff" format --check -q runtime_py tests scripts examples || bad "ruff format"
step "mypy --strict (runtime_py)"
"$NPU_VENV/bin/mypy" || bad mypy
step "mypy --strict (the device fuzzer, tests/fuzz)"
MYPYPATH=tests/host "$NPU_VENV/bin/mypy" --strict tests/fuzz/*.py || bad "mypy (tests/fuzz)"

step "shellcheck"
shellcheck -x -P "$NPU_ROOT" scripts/*.sh guest/npu-init .ci/run buildroot_config/board/npu/*.sh ||
	bad shellcheck

step "kernel checkpatch --strict"
cp_pl=$(bash "$here/fetch-checkpatch.sh") || bad "fetching checkpatch"
if [ -x "$cp_pl" ]; then
	"$cp_pl" --strict --no-tree --quiet --show-types \
		-f kernel_module/npu_*.[ch] || bad "kernel checkpatch"
	# The contract headers are shared with QEMU and user space, which have
	# no BIT() macro.
	"$cp_pl" --strict --no-tree --quiet --show-types --ignore BIT_MACRO \
		-f include/*.h || bad "kernel checkpatch (include/)"
fi

step "kernel W=1 + sparse build (the guest kernel's headers, gcc-14, in the guest root)"
out=$(bash "$here/build-module.sh" distro W=1 C=2 2>&1) || bad "kernel module build"
echo "$out" | grep -E 'warning|error' && bad "kernel W=1/sparse"

step "QEMU checkpatch"
qemu_cp="$NPU_CACHE/qemu/current/src/scripts/checkpatch.pl"
if [ -f "$qemu_cp" ]; then
	perl "$qemu_cp" --no-tree -q -f qemu_device/*.[ch] || bad "QEMU checkpatch"
else
	bad "QEMU source tree missing (run make qemu)"
fi

if [ $fail -ne 0 ]; then
	log "lint: some checks failed"
	exit 1
fi
log "lint: all checks passed"
