#!/usr/bin/env bash
# The kernel's checkpatch.pl (and the data files it reads) of the guest
# kernel's release: copied from Debian 13's linux source package (fetched
# once into $NPU_CACHE/src, as for the debug kernel) into
# $NPU_CACHE/checkpatch/<version>; prints the script's path. No kernel
# source enters the project tree.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/common.sh
. "$here/common.sh"

ver=$(linux_source_version)
out="$NPU_CACHE/checkpatch/$ver"
if [ ! -x "$out/scripts/checkpatch.pl" ]; then
	tree=$(fetch_source linux "$ver")
	mkdir -p "$out/scripts"
	cp "$tree/scripts/checkpatch.pl" "$tree/scripts/spelling.txt" \
		"$tree/scripts/const_structs.checkpatch" "$out/scripts/"
	log "lint: checkpatch.pl of linux $ver ready in $out"
fi
echo "$out/scripts/checkpatch.pl"
