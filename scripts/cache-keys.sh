#!/usr/bin/env bash
# Print the cache key of every cached build product, one "name key" line
# each. A clone in another folder must print the same lines
# (tests/host/test_cache_keys.py): no key may depend on where the clone is.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/deps.sh" key
bash "$here/build-qemu.sh" release key
bash "$here/build-qemu.sh" asan key
bash "$here/build-guest.sh" key
bash "$here/build-kernel.sh" key
