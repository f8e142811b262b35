#!/usr/bin/env python3
"""Simulator throughput next to libCacheSim, on the same trace in the same run.

    python3 scripts/bench_sim.py [--requests 10000000] [--blocks 1000000] [--repeat 3]

Writes a Zipf(1.0) trace of REQUESTS 4 KiB reads over BLOCKS blocks in libCacheSim's
oracleGeneral binary format (our `tiercache trace gen`), then replays it with
`tiercache sim` (LRU and S3-FIFO at 1 % and 10 % of the footprint) and with libCacheSim's
Python package (LRU and S3FIFO, same sizes), each REPEAT times, and prints a Markdown table
of the best requests/s of each, the speed-up, miss ratios (they must agree for LRU) and our
index RAM per cached line. Both sides read and parse the trace file as part of the timed run.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(*args, **kw):
    return subprocess.run(args, check=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", help="keep the trace at this path")
    a = ap.parse_args()

    import libcachesim as lcs  # pip install libcachesim

    sh("cargo", "build", "--release", "-q", "-p", "tiercache", cwd=ROOT)
    exe = os.path.join(ROOT, "target", "release", "tiercache")
    tmp = tempfile.mkdtemp()
    trace = a.keep or os.path.join(tmp, "zipf.oracleGeneral.bin")
    wss = a.blocks * 4096
    spec = f"zipf:theta=1.0,wss={wss},requests={a.requests},read=100,size=4k"
    t = time.time()
    sh(exe, "trace", "gen", spec, "--to", "oracle-general", "-o", trace, "--seed", "1")
    print(f"trace: {spec} -> {trace} ({os.path.getsize(trace) >> 20} MiB, {time.time() - t:.1f} s)", file=sys.stderr)

    # Footprint, for the cache sizes both sides use: floor(p x footprint) objects.
    st = json.loads(sh(exe, "trace", "stats", trace, "--format", "oracle-general", "--json", "-q",
                       capture_output=True).stdout)
    footprint = st["footprint_blocks"]

    rows = []
    for ours, theirs in (("lru", "LRU"), ("s3fifo", "S3FIFO")):
        for pct in (1, 10):
            n = footprint * pct // 100
            best_ours, best_lcs = None, None
            for _ in range(a.repeat):
                r = json.loads(sh(exe, "sim", "--trace", trace, "--format", "oracle-general", "--cache-size",
                                  f"{pct}%", "--policy", ours, "--json", "-q", capture_output=True).stdout)
                if best_ours is None or r["requests_per_s"] > best_ours["requests_per_s"]:
                    best_ours = r
                reader = lcs.TraceReader(trace, lcs.TraceType.ORACLE_GENERAL_TRACE)
                cache = getattr(lcs, theirs)(cache_size=n * 4096)
                t0 = time.perf_counter()
                miss_ratio, _ = cache.process_trace(reader)
                dt = time.perf_counter() - t0
                rps = a.requests / dt
                if best_lcs is None or rps > best_lcs[0]:
                    best_lcs = (rps, miss_ratio)
            rows.append((ours, pct, n, best_ours, best_lcs))

    print(f"\nMachine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; "
          f"date {time.strftime('%Y-%m-%d')}; trace {a.requests:,} requests, footprint {footprint:,} blocks\n")
    print("| policy | cache | tiercache req/s | libCacheSim req/s | speed-up | miss ratio (ours / lcs) | index B/line |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for ours, pct, n, r, (lrps, lmiss) in rows:
        print(f"| {ours} | {pct} % ({n:,} lines) | {r['requests_per_s'] / 1e6:.2f} M | {lrps / 1e6:.2f} M | "
              f"{r['requests_per_s'] / lrps:.1f}x | {r['miss_ratio']:.4f} / {lmiss:.4f} | {r['index_bytes_per_line']:.1f} |")


if __name__ == "__main__":
    main()
