#!/usr/bin/env bash
# RAM per cached line of the live direct layout, every online policy (issue 16 item 1):
# opens a write-back cache of LINES lines of 4 KiB on tmpfs, fills it (clean lines, dirty
# lines over half of them, partial lines), flushes, and prints `ram_index_bytes` per cached
# line next to the heap a counting allocator measured (crates/server/tests/ram_accounting.rs;
# the test fails when the two differ by more than 5 %).
#   scripts/ram_per_line.sh [LINES]     (default 131072 = a 512 MiB cache; needs 2x that in /dev/shm)
set -euo pipefail
cd "$(dirname "$0")/.."
LINES=${1:-131072}
TIERCACHE_RAM_LINES=$LINES cargo test --release -q -p tiercache-server --test ram_accounting -- --nocapture 2>&1 \
  | grep -E 'lines:|panicked|test result'
