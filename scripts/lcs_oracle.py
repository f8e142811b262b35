#!/usr/bin/env python3
"""libCacheSim as an oracle: miss counts of its policies on a stream of block ids.

    python3 scripts/lcs_oracle.py STREAM.bin --policies LRU,FIFO --sizes 2692,13460

STREAM.bin is a libCacheSim oracleGeneral file (24-byte records) whose objects all have
size 1, so a cache of N bytes holds N objects. Prints JSON: {"LRU": {"2692": misses, ...}}.
Used by crates/engine/tests/libcachesim_oracle.rs (pip install libcachesim).
"""
import argparse
import json
import os

import libcachesim as lcs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stream")
    ap.add_argument("--policies", default="LRU,FIFO")
    ap.add_argument("--sizes", required=True)
    a = ap.parse_args()
    n = os.path.getsize(a.stream) // 24
    out = {}
    for p in a.policies.split(","):
        out[p] = {}
        for size in a.sizes.split(","):
            reader = lcs.TraceReader(a.stream, lcs.TraceType.ORACLE_GENERAL_TRACE)
            cache = getattr(lcs, p)(cache_size=int(size))
            miss_ratio, _ = cache.process_trace(reader)
            out[p][size] = round(miss_ratio * n)
    print(json.dumps({"requests": n, "misses": out}))


if __name__ == "__main__":
    main()
