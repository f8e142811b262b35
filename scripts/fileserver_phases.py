#!/usr/bin/env python3
"""The DSS file-server phases as real file operations (issue 7, live half).

Driven by scripts/bench_fileserver_live.sh, one phase per call (the file system is remounted
between phases so the kernel's caches start cold, as in the simulation, which models no host
page cache):

    fileserver_phases.py plan  STATE FILES DIRS TRANS SEED MAXSIZE   -> prints planned bytes
    fileserver_phases.py PHASE STATE ROOT                             -> prints seconds

Phases (the DSS seed, Figure 2): setup (FILES files in DIRS directories, sizes from the
SPECsfs-like table of crates/sim/src/fileserver.rs, capped at MAXSIZE), trans (TRANS
transactions: read a random existing file sequentially, or create a new file in a random
directory, half each), prefind and find (walk every directory and lstat every entry), archive
(read one directory's files and write them into one backup file), scan (read every file).
Writing phases end with sync(), inside the timed interval.
"""

import json
import os
import random
import sys
import time

# (upper bound in bytes, percent): the simulator's table (crates/sim/src/fileserver.rs).
SIZES = [
    (1 << 10, 20.0), (2 << 10, 12.0), (4 << 10, 12.0), (8 << 10, 10.0), (16 << 10, 9.0),
    (32 << 10, 7.0), (64 << 10, 6.0), (128 << 10, 5.0), (256 << 10, 4.0), (512 << 10, 3.0),
    (1 << 20, 3.0), (2 << 20, 2.0), (4 << 20, 2.0), (8 << 20, 1.5), (16 << 20, 1.5),
    (32 << 20, 2.0),
]
CHUNK = 64 << 10  # SPECsfs-like transfers


def file_size(rng, maxsize):
    x = rng.uniform(0, 100)
    lo = 512
    for hi, pct in SIZES:
        if x < pct:
            s = -(-rng.randint(lo, hi) // 512) * 512
            return min(s, maxsize)
        x -= pct
        lo = hi + 1
    return min(SIZES[-1][0], maxsize)


PATTERN = random.Random(7).randbytes(8 << 20)


def write_file(path, size, seed):
    with open(path, "wb") as f:
        off = (seed * 4099) % (4 << 20)
        left = size
        while left > 0:
            n = min(CHUNK, left)
            f.write(PATTERN[off:off + n])
            off = (off + n) % (4 << 20)
            left -= n


def read_file(path):
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(CHUNK)
            if not b:
                return n
            n += len(b)


def plan(state, files, dirs, trans, seed, maxsize):
    rng = random.Random(seed)
    setup = [(f"d{rng.randrange(dirs):04d}/f{i:06d}", file_size(rng, maxsize)) for i in range(files)]
    ops = []
    for t in range(trans):
        if rng.random() < 0.5:
            ops.append(("read", rng.randrange(files)))
        else:
            ops.append(("create", f"d{rng.randrange(dirs):04d}/t{t:06d}", file_size(rng, maxsize)))
    st = {"dirs": dirs, "setup": setup, "trans": ops, "archive_dir": "d0000"}
    with open(state, "w") as f:
        json.dump(st, f)
    total = sum(s for _, s in setup) + sum(o[2] for o in ops if o[0] == "create")
    print(total)


def walk(root):
    n = 0
    for d, subdirs, names in os.walk(root):
        for x in subdirs + names:
            os.lstat(os.path.join(d, x))
            n += 1
    return n


def main():
    if sys.argv[1] == "plan":
        state, files, dirs, trans, seed, maxsize = sys.argv[2:8]
        plan(state, int(files), int(dirs), int(trans), int(seed), int(maxsize))
        return
    phase, state, root = sys.argv[1:4]
    with open(state) as f:
        st = json.load(f)
    t0 = time.monotonic()
    if phase == "setup":
        for d in range(st["dirs"]):
            os.makedirs(os.path.join(root, f"d{d:04d}"), exist_ok=True)
        for i, (p, s) in enumerate(st["setup"]):
            write_file(os.path.join(root, p), s, i)
        os.sync()
    elif phase == "trans":
        for i, op in enumerate(st["trans"]):
            if op[0] == "read":
                read_file(os.path.join(root, st["setup"][op[1]][0]))
            else:
                write_file(os.path.join(root, op[1]), op[2], 1_000_000 + i)
        os.sync()
    elif phase in ("prefind", "find"):
        walk(root)
    elif phase == "archive":
        src = os.path.join(root, st["archive_dir"])
        with open(os.path.join(root, "archive.bak"), "wb") as out:
            for name in sorted(os.listdir(src)):
                with open(os.path.join(src, name), "rb") as f:
                    while True:
                        b = f.read(CHUNK)
                        if not b:
                            break
                        out.write(b)
        os.sync()
    elif phase == "scan":
        for d, _, names in os.walk(root):
            for x in names:
                read_file(os.path.join(d, x))
    else:
        sys.exit(f"unknown phase {phase}")
    print(f"{time.monotonic() - t0:.3f}")


if __name__ == "__main__":
    main()
