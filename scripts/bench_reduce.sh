#!/usr/bin/env bash
# Data-reduction speed per core on real bytes, in one run on one data file:
#   * `lz4 -b1` (the reference lz4, level 1, its own in-memory benchmark),
#   * tiercache's per-line BLAKE3 alone, lz4 alone, BLAKE3+lz4 and BLAKE3+zstd:1 (the log
#     layout's write-path reduction; criterion bench crates/server/benches/reduce.rs).
# Usage: scripts/bench_reduce.sh [MiB]   (default 256 MiB of files under /usr)
set -euo pipefail
cd "$(dirname "$0")/.."
MIB=${1:-256}
DATA=${TMPDIR:-/dev/shm}/tiercache-reduce-data.bin
if [ ! -s "$DATA" ] || [ "$(stat -c %s "$DATA")" -ne $((MIB << 20)) ]; then
  # Binaries, libraries and text, in a fixed order: what a system image's blocks hold.
  find /usr/lib /usr/share /usr/bin -xdev -type f -size +0 2>/dev/null | LC_ALL=C sort |
    xargs cat 2>/dev/null | head -c $((MIB << 20)) > "$DATA" || true
fi
echo "data: $DATA ($(($(stat -c %s "$DATA") >> 20)) MiB), $(nproc) cores, $(date -u +%F)"
command -v lz4 >/dev/null || { echo "lz4 CLI missing: apt-get install -y lz4"; exit 1; }
echo "== lz4 -b1 (reference lz4, 1 thread)"
lz4 -b1 -e1 "$DATA" 2>&1 | tr '\r' '\n' | grep 'MB/s' | tail -1
echo "== tiercache reduction per 4 KiB line (1 thread)"
TIERCACHE_REDUCE_DATA="$DATA" cargo bench -q -p tiercache-server --bench reduce -- --noplot 2>&1 |
  grep -E '^(reduce_4k_lines|live_log_write)|thrpt' | grep -v '%' | paste - - | sed -E 's/ +/ /g'
