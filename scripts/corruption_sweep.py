#!/usr/bin/env python3
"""Damage pools past their first 2 MiB and count what `pmtx recover` (and `pmtx check`) make of it.

Usage: scripts/corruption_sweep.py [--bin target/release/pmtx] [--trials 110] [--engine falcon,zen]
                                   [--seed 1] [--check]

For each engine: create a pool with `pmtx bench ycsb --records 20000 --duration 1`, then per trial
copy it, overwrite 1 to 8 random bytes at a random offset past 2 MiB ("random": anywhere in the
pool; "targeted": in an allocated page, within its first 256 KiB where tuple headers, window
slots and the meta page live; "header": in the tuple header of a random slot of a heap page,
past Falcon's CC word, which recovery rewrites), run `pmtx recover` on the copy and classify:
  refused   exit != 0 with an error message (what we want for damage recovery would trust)
  panic     the process panicked or was killed by a signal
  same      exit 0, same rows per table as the undamaged pool
  CHANGED   exit 0, other rows per table: silent corruption
With --check, also runs `pmtx check` on each damaged copy and reports its exit codes.
Pools go to /dev/shm and are removed.
"""
import argparse, json, os, random, shutil, struct, subprocess, sys

PAGE = 2 << 20

def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)

def rows(bin_, pool, engine_args):
    r = run([bin_, "recover", pool, "--json"] + engine_args)
    if r.returncode != 0:
        return r, None
    return r, json.loads(r.stdout)["rows_per_table"]

def used_pages(pool):
    with open(pool, "rb") as f:
        f.seek(4096 + 16)
        (pages,) = struct.unpack("<Q", f.read(8))
        f.seek(8192)
        table = f.read(8 * pages)
    return [i for i in range(pages) if struct.unpack_from("<Q", table, 8 * i)[0] != 0]

def heap_layout(pool, engine):
    """(heap page indexes, slot bytes, header bytes) from the page table and the catalog."""
    with open(pool, "rb") as f:
        f.seek(4096 + 16)
        (pages,) = struct.unpack("<Q", f.read(8))
        f.seek(8192)
        table = f.read(8 * pages)
        best = None
        for slot in range(2):
            f.seek(PAGE + 4096 + slot * 256 * 1024)
            seq, length = struct.unpack("<QQ", f.read(16))
            f.seek(PAGE + 4096 + slot * 256 * 1024 + 24)
            if seq and (best is None or seq > best[0]):
                best = (seq, json.loads(f.read(length)))
    cols = best[1]["tables"][0]["columns"]
    row = sum(8 if isinstance(c["ty"], str) else list(c["ty"].values())[0] for c in cols)
    header = 32 if engine != "zen" else 16
    slot = (header + row + 15) // 16 * 16
    heap = [i for i in range(pages)
            if struct.unpack_from("<Q", table, 8 * i)[0] >> 56 == 2]
    return heap, slot, header

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/pmtx")
    ap.add_argument("--trials", type=int, default=110)
    ap.add_argument("--engine", default="falcon,zen")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--engine-arg", action="store_true",
                    help="pass --engine to recover (old binaries default to falcon)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    total_changed = 0
    for engine in a.engine.split(","):
        base = f"/dev/shm/sweep-{os.getpid()}-{engine}.pool"
        work = base + ".damaged"
        eargs = ["--engine", engine] if a.engine_arg else []
        try:
            r = run([a.bin, "bench", "ycsb", "--pool", base, "--engine", engine,
                     "--duration", "1", "--warmup", "0", "--records", "20000"])
            if r.returncode != 0:
                sys.exit(f"bench failed: {r.stderr}")
            r, clean = rows(a.bin, base, eargs)
            if clean is None:
                sys.exit(f"clean recover failed: {r.stderr}")
            size = os.path.getsize(base)
            pages = used_pages(base)
            heap, slot, header = heap_layout(base, engine)
            skip = 8 if engine != "zen" else 0
            counts = {}
            check_codes = {}
            for t in range(a.trials):
                mode = ("random", "targeted", "header")[t % 3]
                if mode == "random":
                    off = rng.randrange(PAGE, size - 8)
                elif mode == "header":
                    page = rng.choice(heap)
                    s_ = rng.randrange(0, PAGE // slot)
                    off = (page + 1) * PAGE + s_ * slot + rng.randrange(skip, header)
                else:
                    page = rng.choice(pages)
                    off = (page + 1) * PAGE + rng.randrange(0, 256 << 10)
                n = rng.randint(1, 8) if mode != "header" else 1
                shutil.copyfile(base, work)
                with open(work, "r+b") as f:
                    f.seek(off)
                    old = f.read(n)
                    new = bytes(b ^ rng.randint(1, 255) for b in old)
                    f.seek(off)
                    f.write(new)
                if a.check:
                    c = run([a.bin, "check", work])
                    check_codes[c.returncode] = check_codes.get(c.returncode, 0) + 1
                r, got = rows(a.bin, work, eargs)
                if r.returncode < 0 or r.returncode == 101 or "panicked" in r.stderr:
                    kind = "panic"
                elif got is None:
                    kind = "refused"
                elif got == clean:
                    kind = "same"
                else:
                    kind = "CHANGED"
                    print(f"  {engine} {mode} offset {off} ({n} bytes): rows {clean} -> {got}")
                counts[(mode, kind)] = counts.get((mode, kind), 0) + 1
            for mode in ("random", "targeted", "header"):
                line = ", ".join(f"{k} {counts.get((mode, k), 0)}"
                                 for k in ("refused", "panic", "same", "CHANGED"))
                print(f"{engine:7} {mode:9} {line}")
            if a.check:
                print(f"{engine:7} pmtx check exit codes: {dict(sorted(check_codes.items()))}")
            total_changed += sum(v for (m, k), v in counts.items() if k in ("CHANGED", "panic"))
        finally:
            for p in (base, work):
                if os.path.exists(p):
                    os.remove(p)
    sys.exit(1 if total_changed else 0)

if __name__ == "__main__":
    main()
