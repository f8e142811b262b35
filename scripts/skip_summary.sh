#!/usr/bin/env bash
# The skipped tests of a run, said at its end (.ci/run calls this). Tests that cannot run here
# (a tool, FUSE, root or the shared traces missing) pass as "ok" in libtest's and pytest's
# counts; each appended `TEST: REASON` to the skip log (crates/testskip, python/tests/conftest.py).
#
# Usage: scripts/skip_summary.sh [LOG]   (default $TIERCACHE_SKIP_LOG, else target/test-skips.log)
# Prints "N tests skipped:" and one line per skip (repeats counted), or nothing when none.
# Exits 1 when TIERCACHE_REQUIRE_NO_SKIP=1 and any test skipped, else 0.
set -euo pipefail
LOG=${1:-${TIERCACHE_SKIP_LOG:-target/test-skips.log}}
[ -s "$LOG" ] || exit 0
n=$(sort -u "$LOG" | grep -c . || true)
[ "$n" -gt 0 ] || exit 0
echo
if [ "$n" = 1 ]; then echo "1 test skipped:"; else echo "$n tests skipped:"; fi
# Same test and reason more than once (a test run twice): one line with a count.
sort "$LOG" | uniq -c | sort -k1,1nr -k2 | sed -E 's/^ *1 (.*)$/  \1/; s/^ *([0-9]+) (.*)$/  \2 (x\1)/'
if [ "${TIERCACHE_REQUIRE_NO_SKIP:-0}" = 1 ]; then
  echo "TIERCACHE_REQUIRE_NO_SKIP=1: failing because of the skips above (install what they name, or unset it)" >&2
  exit 1
fi
