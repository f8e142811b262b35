#!/usr/bin/env python3
"""Data-reduction ratios of some bytes, computed independently of tiercache.

Splits the input files (taken one after the other, as they are written to a volume) into
lines, keeps the last content written at each line, and reports what a log-layout cache
holding all of them stores:

  dedup_ratio       = lines / distinct contents                (SHA-256, not BLAKE3)
  compression_ratio = distinct x line / stored bytes,  stored = lz4 block size when it
                      shrinks the line, else the line size   (the reference lz4 library,
                      not lz4_flex)

Usage: reduction_ratios.py [--line 4096] [--offsets O1,O2,...] FILE...
`--offsets` places each file at a byte offset of the volume (default: back to back).
Prints one JSON object. Needs `pip install lz4`.
"""

import argparse
import hashlib
import json
import sys

try:
    import lz4.block
except ImportError:  # pragma: no cover
    sys.exit("reduction_ratios.py needs the lz4 module: python3 -m pip install lz4")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--line", type=int, default=4096, help="cache line (extent) size in bytes")
    ap.add_argument("--offsets", help="comma-separated byte offset of each file in the volume")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    line = a.line
    if line <= 0 or line & (line - 1):
        sys.exit(f"--line {line}: must be a power of two")
    offsets = None
    if a.offsets:
        offsets = [int(x) for x in a.offsets.split(",")]
        if len(offsets) != len(a.files):
            sys.exit(f"--offsets has {len(offsets)} values for {len(a.files)} files")
    volume = {}  # line number -> digest
    stored = {}  # digest -> stored bytes
    pos = 0
    for i, path in enumerate(a.files):
        if offsets is not None:
            pos = offsets[i]
        if pos % line:
            sys.exit(f"{path}: offset {pos} is not a multiple of the line size {line}")
        with open(path, "rb") as f:
            while True:
                chunk = f.read(line)
                if not chunk:
                    break
                if len(chunk) < line:
                    chunk += bytes(line - len(chunk))
                d = hashlib.sha256(chunk).digest()
                volume[pos // line] = d
                if d not in stored:
                    z = len(lz4.block.compress(chunk, store_size=False))
                    stored[d] = z if z < line else line
                pos += line
    live = set(volume.values())
    lines = len(volume)
    stored_bytes = sum(stored[d] for d in live)
    out = {
        "line_size": line,
        "lines": lines,
        "distinct": len(live),
        "dedup_ratio": lines / len(live) if live else 1.0,
        "compression_ratio": len(live) * line / stored_bytes if stored_bytes else 1.0,
        "stored_bytes": stored_bytes,
        "effective_capacity": lines * line / stored_bytes if stored_bytes else 0.0,
    }
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
