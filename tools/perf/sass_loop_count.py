"""Count the SASS instructions of a GEMM kernel's main K loop, per K block
and warp, by opcode (CPU only: NVRTC, ptxas and cuobjdump, no GPU):

    python tools/perf/sass_loop_count.py N K "256x128 s3 c2" [--kind normal] [--m 4096] [--groups 1]
                                         [--plan PLAN.json --variant NAME]
    python tools/perf/sass_loop_count.py --cubin kernel.cubin     # e.g. DeepGEMM's JIT cache

The main loop is the innermost backward branch whose body holds the most
QGMMAs (``main_loop``: the K loop, not the tile loop around it); a K block
of the 1D2D kernel is 8 of them at BLOCK_M = 256 (two 64-row
sub-tiles of four k32 WGMMAs per math warpgroup) and 4 below, so the count
per block is the body's length over (QGMMAs / QGMMAs per block).  With
``--plan``/``--variant`` the kernel is that ``tools/perf/variant_sweep.py``
plan variant's source.  benches/RESULTS.md v0.27 compares cugemm8's
256x128 loop with DeepGEMM's this way (200.8 and 191.8 instructions per K
block and warp).  cugemm8's SASS comes from ``cugemm8._jit.compile_only``
(NVRTC's PTX through the ``ptxas`` found on the machine), a cubin's from
whatever built it: the two may be different compiler versions.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT))
sys.path.insert(1, str(_ROOT / "tools" / "perf"))

_LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")


def functions(sass: str) -> list[tuple[str, str]]:
    """(name, text) of each function of a cuobjdump listing (addresses
    restart at 0 in each); the whole text as one function without headers."""
    parts = re.split(r"^\s*Function : (\S+)\s*$", sass, flags=re.M)
    if len(parts) == 1:
        return [("", sass)]
    return list(zip(parts[1::2], parts[2::2]))


def main_loop(sass: str) -> tuple[list[str], int, tuple[int, int]]:
    """(instructions of the main loop's body, its QGMMA count, its address
    range) over the listing's functions.  Loops are backward branches (BRA,
    BRA.U, BRA.DIV, JMP ...); among those holding QGMMAs, only innermost ones
    count (no other such loop inside: the K loop, not the tile loop around
    it), and the one with the most QGMMAs wins.  A K loop that the compiler
    unrolled completely (fewer K blocks than the unroll) has no back edge of
    its own: the tile loop is then reported; check the printed range."""
    best: tuple[int, list[str], tuple[int, int]] = (0, [], (0, 0))
    for _, text in functions(sass):
        lines = [(int(m.group(1), 16), m.group(2)) for m in map(_LINE.match, text.splitlines()) if m]
        loops = []
        for addr, ins in lines:
            m = re.search(r"\b(?:BRA|JMP)(?:\.[A-Z.]+)? (0x[0-9a-f]+)", ins)
            if m and int(m.group(1), 16) < addr:
                lo = int(m.group(1), 16)
                body = [t for a, t in lines if lo <= a <= addr]
                q = sum("QGMMA" in t for t in body)
                if q:
                    loops.append((lo, addr, q, body))
        for lo, hi, q, body in loops:
            has_inner = any(lo <= lo2 and hi2 <= hi and (lo2, hi2) != (lo, hi) for lo2, hi2, _, _ in loops)
            if not has_inner and q > best[0]:
                best = (q, body, (lo, hi))
    return best[1], best[0], best[2]


def opcode(text: str) -> str:
    tok = text.split()
    op = tok[1] if tok[0].startswith("@") else tok[0]
    return op.split(".")[0]


def report(sass: str, label: str, qgmma_per_block: int) -> str:
    body, q, (lo, hi) = main_loop(sass)
    if not q:
        return f"{label}: no loop with QGMMA found"
    blocks = q / qgmma_per_block
    ops = collections.Counter(opcode(t) for t in body)
    top = ", ".join(f"{o} {c / blocks:.2f}" for o, c in ops.most_common(16))
    return (f"{label}: loop {lo:#x}-{hi:#x} of {len(body)} instructions, {blocks:g} K blocks, "
            f"{len(body) / blocks:.1f} per K block and warp; {top}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("n", nargs="?", type=int)
    p.add_argument("k", nargs="?", type=int)
    p.add_argument("config", nargs="?", help="'BMxBN sS [w1] [c2|c2B|k2|k4]'")
    p.add_argument("--kind", default="normal")
    p.add_argument("--m", type=int, default=4096, help="rows (m_sum for contiguous, m_max for masked)")
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--plan")
    p.add_argument("--variant")
    p.add_argument("--cubin", help="disassemble this cubin instead of compiling a cugemm8 kernel")
    p.add_argument("--qgmma-per-block", type=int, default=None,
                   help="QGMMAs per K block (default: 8 at BLOCK_M = 256 or for --cubin, else 4)")
    args = p.parse_args(argv)
    if args.cubin:
        from cugemm8 import _jit
        print(report(_jit.disassemble_cubin(args.cubin), Path(args.cubin).name, args.qgmma_per_block or 8))
        return 0
    if args.n is None or args.k is None or not args.config:
        p.error("N K CONFIG (or --cubin)")
    from cugemm8 import _jit, _tune, gemm as G
    root = None
    if args.plan:
        from variant_sweep import make_tree
        spec = json.loads(Path(args.plan).read_text())["variants"][args.variant]
        root = make_tree(_jit.cuda_src_dir(), spec, Path(tempfile.mkdtemp()) / args.variant)
    cfg = _tune.parse_config(args.config.replace("c2A", "c2"), args.kind, args.m, args.n, args.k, args.groups, 132)
    if cfg is None:
        p.error(f"{args.config} is not legal for {args.kind} {args.m}x{args.n}x{args.k}")
    name = G._kernel_name(cfg, args.n, args.k, G._GEMM_TYPE[args.kind], args.groups, None)
    rep = _jit.compile_only(G._header_of(name), [name], sass=True, root=root)
    label = f"{args.kind} {args.m}x{args.n}x{args.k} {cfg}" + (f" [{args.variant}]" if args.variant else "")
    print(report(rep.sass, label, args.qgmma_per_block or (8 if cfg.block_m == 256 else 4)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
