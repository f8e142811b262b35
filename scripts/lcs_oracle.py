#!/usr/bin/env python3
"""libCacheSim as an oracle: miss counts of its policies on a stream of block ids.

    python3 scripts/lcs_oracle.py STREAM --policies LRU,FIFO --sizes 2692,13460

STREAM is either a libCacheSim oracleGeneral file (`*.bin`: 24-byte LE records
<u32 time, u64 obj_id, u32 size, i64 next_access_vtime>) whose objects all have size 1, or a
text file of one block id per line (converted to oracleGeneral with next-access times, so
Belady works). Every object has size 1, so a cache of N bytes holds N objects. Policies are
libCacheSim class names (LRU, FIFO, ARC, SLRU, Clock, S3FIFO, Belady, ...), run with their
defaults, optionally followed by libCacheSim's cache-specific parameters in parentheses,
e.g. `SLRU(n-seg=2)` or `S3FIFO(move-to-main-threshold=1)` (several separated by `;`). Prints JSON: {"requests": n, "misses": {"LRU": {"2692": misses, ...}, ...}}.

Used by crates/engine/tests/libcachesim_oracle.rs and crates/sim/tests/libcachesim_oracle.rs
(pip install libcachesim).
"""
import argparse
import json
import os
import re
import struct
import sys
import tempfile

import libcachesim as lcs
import libcachesim.libcachesim_python as lcs_c
from libcachesim import cache as lcs_cache


def text_to_oracle_general(path, out):
    with open(path) as f:
        ids = [int(x) for x in f if x.strip()]
    nxt = [-1] * len(ids)
    last = {}
    for i, k in enumerate(ids):
        p = last.get(k)
        if p is not None:
            nxt[p] = i
        last[k] = i
    rec = struct.Struct("<IQIq")
    with open(out, "wb") as f:
        for i, k in enumerate(ids):
            f.write(rec.pack(i & 0xFFFFFFFF, k, 1, nxt[i]))
    return len(ids)


def make_cache(spec, size):
    """`NAME` or `NAME(k=v;k=v)` -> a libCacheSim cache of `size` objects."""
    m = re.fullmatch(r"(\w+)(?:\((.*)\))?", spec.strip())
    if not m:
        sys.exit(f"bad policy spec {spec!r}")
    name, params = m.group(1), m.group(2)
    if params is None:
        cls = getattr(lcs, name, None)
        if cls is None:
            sys.exit(f"libcachesim has no policy {name!r}")
        return cls(cache_size=size)
    init = getattr(lcs_c, f"{name}_init", None)
    if init is None:
        sys.exit(f"libcachesim has no {name}_init")
    common = lcs_cache._create_common_params(size, 86400 * 300, 24, False, None)
    return lcs_cache.CacheBase(_cache=init(common, params.replace(";", ",")), admissioner=None)


def split_specs(text):
    """Splits on commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur:
        out.append(cur)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stream")
    ap.add_argument("--policies", default="LRU,FIFO")
    ap.add_argument("--sizes", required=True, help="cache sizes in objects, comma separated")
    a = ap.parse_args()
    tmp = None
    stream = a.stream
    if not stream.endswith(".bin"):
        fd, tmp = tempfile.mkstemp(suffix=".oracleGeneral.bin")
        os.close(fd)
        text_to_oracle_general(stream, tmp)
        stream = tmp
    try:
        n = os.path.getsize(stream) // 24
        out = {}
        for p in split_specs(a.policies):
            out[p] = {}
            for size in a.sizes.split(","):
                reader = lcs.TraceReader(stream, lcs.TraceType.ORACLE_GENERAL_TRACE)
                cache = make_cache(p, int(size))
                miss_ratio, _ = cache.process_trace(reader)
                out[p][size] = round(miss_ratio * n)
        print(json.dumps({"requests": n, "misses": out}))
    finally:
        if tmp:
            os.unlink(tmp)


if __name__ == "__main__":
    main()
