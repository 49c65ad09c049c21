"""Where two kernels' instructions and stalls differ, from Nsight Compute's
per-instruction source page (no GPU needed once the page is written).

    ncu --section SourceCounters --section WarpStateStats -o rep python3 tools/perf/forced_gemm.py ...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > page.csv
    python tools/perf/ncu_sass_profile.py page.csv [--regions 300000] [--top 14] [--kernels 0,2]

The page holds, for every profiled kernel, one row per SASS instruction with
its executed warp-instructions ("Instructions Executed") and its warp-state
samples, in total and per stall reason (``stall_*``; Nsight Compute's
"Warp Stall Sampling").  Printed per kernel:

* totals: instructions executed, samples, and samples per stall reason (every
  reason with any);
* **regions**: runs of consecutive executed instructions with the same
  execution count (instructions never executed are skipped; a
  straight-line block: e.g. 24576 = once per tile and math warp
  for 3072 tiles and 8 math warps), those above ``--regions``
  warp-instructions in all, with their length and samples, so a K loop, a
  tile prologue, an epilogue and a producer loop can be told apart and
  compared between kernels of the same tile shape;
* the ``--top`` instructions by samples, with their dominant stall reasons;
* with two or more kernels, executed instructions by opcode side by side.

Samples of warps parked at a barrier that never issue again (idle producer
warps at the kernel's closing cluster barrier, ``UCGABAR_WAIT``) are counted
like any others: they show as "barrier" stalls without costing issue slots.
Reports; never asserts.  Used for benches/RESULTS.md v0.33.
"""
from __future__ import annotations

import argparse
import collections
import csv
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_loop_count import opcode as sass_opcode  # noqa: E402

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path: str) -> list[tuple[str, list[dict]]]:
    """[(kernel name, rows)] in page order; each row a dict of the page's columns."""
    kernels: list[tuple[str, list[dict]]] = []
    header = None
    with open(path, newline="") as f:
        for rec in csv.reader(f):
            if not rec:
                continue
            if rec[0] == "Kernel Name":
                kernels.append((rec[1], []))
            elif rec[0] == "Address":
                header = rec
            elif header is not None and kernels:
                kernels[-1][1].append(dict(zip(header, rec)))
    return kernels


def _int(row: dict, key: str) -> int:
    v = row.get(key) or "0"
    try:
        return int(float(v.replace(",", "")))
    except ValueError:
        return 0


def opcode(source: str) -> str:
    """'QGMMA' of '@!P0 QGMMA.64x128x32.F32 ...' (sass_loop_count.opcode: the
    predicate and the modifiers dropped); '?' for an empty row."""
    return sass_opcode(source) if source.strip() else "?"


def stall_columns(rows: list[dict]) -> list[str]:
    return [k for k in (rows[0] if rows else {}) if k.startswith("stall_") and "Not Issued" not in k]


def regions(rows: list[dict], min_total: int) -> list[dict]:
    """Runs of consecutive rows with one execution count, those with at least
    ``min_total`` warp-instructions in all."""
    out, cur = [], None
    for i, r in enumerate(rows):
        n = _int(r, EXECUTED)
        if n == 0:          # never executed (the other branch of a switch): not a boundary
            continue
        if cur is not None and n == cur["count"]:
            cur["length"] += 1
            cur["samples"] += _int(r, SAMPLES)
        else:
            cur = {"first": i, "count": n, "length": 1, "samples": _int(r, SAMPLES),
                   "source": r.get("Source", "").strip()}
            out.append(cur)
    return [g for g in out if g["count"] * g["length"] >= min_total]


def short_name(name: str) -> str:
    """'ns::kernel<24576,1536,256,...>' of the page's full name: the
    template's first eight values, each cast '(type)value' read as value."""
    head, _, tail = name.replace("void ", "", 1).partition("<")
    vals = re.findall(r"\([^()]*\)(-?\d+)", tail.split(">(")[0])
    return f"{head}<{','.join(vals[:8])}...>" if vals else head[:80]


def report(kernels, args) -> None:
    pick = range(len(kernels)) if not args.kernels else [int(x) for x in args.kernels.split(",")]
    chosen = [kernels[i] for i in pick]
    for idx, (name, rows) in zip(pick, chosen):
        stalls = stall_columns(rows)
        total = collections.Counter({s: sum(_int(r, s) for r in rows) for s in stalls})
        print(f"[{idx}] {short_name(name)}")
        print(f"    instructions {sum(_int(r, EXECUTED) for r in rows):,}  samples {sum(_int(r, SAMPLES) for r in rows):,}")
        print("    stalls: " + ", ".join(f"{s[6:]} {v}" for s, v in total.most_common() if v))
        print(f"    regions (>= {args.regions:,} warp-instructions): first row, count x length, samples")
        for g in regions(rows, args.regions):
            print(f"      {g['first']:5d}  {g['count']:9,d} x {g['length']:4d} = {g['count'] * g['length']:12,d}"
                  f"  {g['samples']:6d}  {g['source'][:56]}")
        print(f"    top {args.top} instructions by samples")
        top = sorted(range(len(rows)), key=lambda i: -_int(rows[i], SAMPLES))[:args.top]
        for i in sorted(top):
            r = rows[i]
            why = sorted(((_int(r, s), s[6:]) for s in stalls), reverse=True)[:2]
            why_text = ", ".join(f"{s} {v}" for v, s in why if v)
            print(f"      {i:5d}  n={_int(r, EXECUTED):9,d}  s={_int(r, SAMPLES):5d}  "
                  f"{r.get('Source', '').strip()[:56]:56s}  {why_text}")
    if len(chosen) >= 2:
        counts = [collections.Counter() for _ in chosen]
        for c, (_, rows) in zip(counts, chosen):
            for r in rows:
                c[opcode(r.get("Source", ""))] += _int(r, EXECUTED)
        ops = sorted(set().union(*counts), key=lambda o: (-sum(c[o] for c in counts), o))
        print("executed by opcode: " + " | ".join(f"[{i}]" for i in pick))
        for o in ops[:args.opcodes]:
            print(f"    {o:10s} " + " ".join(f"{c[o]:14,d}" for c in counts))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("page", help="ncu --page source --csv --print-source sass output")
    p.add_argument("--regions", type=int, default=300_000, help="smallest region to list (warp-instructions)")
    p.add_argument("--top", type=int, default=14, help="instructions listed by samples")
    p.add_argument("--opcodes", type=int, default=30, help="opcodes listed side by side")
    p.add_argument("--kernels", default="", help="indices of the kernels to report (default: all)")
    args = p.parse_args(argv)
    kernels = load(args.page)
    if not kernels:
        print(f"{args.page}: no kernel in the page", file=sys.stderr)
        return 1
    report(kernels, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
