"""Kernel times after a dirty and after a clean L2 flush, same run (one GPU call):

    python tools/perf/flush_ab.py --case M N K CONFIG [CONFIG ...] [--case ...] [--reps 15] [--passes 2]

Each forced configuration (``'64x32 s16 w1'``, ``'8x64 s24 swapAB k2'``,
... as ``cugemm8._tune.parse_config`` reads them) of each shape is timed
(CUPTI kernel durations, ``benches/common.kernel_times``) with two flushes
before every repetition: a 256 MB write (``common.L2Flush``, DeepGEMM's
``bench_kineto`` method: L2 left full of dirty lines, whose write-backs the
kernel's misses pay for) and a 256 MB read (``common.make_flush('read')``: clean
lines, closer to a decode step in a model, whose activations are a few KB).
The configs of a shape alternate within each pass; the lowest pass median is
printed.  Outputs are not checked here (run the GPU tests or
``variant_sweep.py`` for that).  benches/RESULTS.md v0.16: the swap-AB
kernel at 1x4096x7168 is 12.42 / 10.30 us (dirty / clean), the 1D2D pick
12.38 / 12.29.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[1]))
sys.path.insert(1, str(_HERE.parents[1] / "benches"))

import cupy as cp  # noqa: E402

import common  # noqa: E402
from cugemm8 import _tune, gemm as G  # noqa: E402
from cugemm8.cli import Shape, gemm_call, make_operands, poisoned_out  # noqa: E402


def parse_case(words: list[str]) -> tuple[int, int, int, list[str]]:
    """``M N K CONFIG [CONFIG ...]``."""
    if len(words) < 4:
        raise SystemExit(f"a case is M N K CONFIG [CONFIG ...], got {' '.join(words)!r}")
    return int(words[0]), int(words[1]), int(words[2]), words[3:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", nargs="+", action="append", required=True, metavar="ARG",
                   help="M N K CONFIG [CONFIG ...] (each config quoted), repeated")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--passes", type=int, default=2)
    args = p.parse_args(argv)
    flushes = {"write": common.make_flush("write"), "read": common.make_flush("read")}
    print(f"{'shape':16s} {'config':24s} {'write':>7s} {'read':>7s}  (CUPTI µs, L2 flushed by a 256 MB ...)")
    for m, n, k, texts in (parse_case(c) for c in args.case):
        shape = Shape("normal", m, n, k)
        ops = make_operands(shape, cp, seed=0)
        res = {t: {f: [] for f in flushes} for t in texts}
        for _ in range(args.passes):
            for text in texts:
                cfg = _tune.parse_config(text, "normal", m, n, k, 1, cp.cuda.Device().attributes["MultiProcessorCount"])
                if cfg is None:
                    raise SystemExit(f"{text}: not legal for {m}x{n}x{k}")
                with G._forced_config(cfg):
                    out = poisoned_out(shape, ops, cp)
                    run = gemm_call(shape, ops, out)
                    run()
                    cp.cuda.runtime.deviceSynchronize()
                    for name, flush in flushes.items():
                        res[text][name].append(common.kernel_times([run], reps=args.reps, flush=flush).median)
        for text in texts:
            print(f"{f'{m}x{n}x{k}':16s} {text:24s} {min(res[text]['write']):7.2f} {min(res[text]['read']):7.2f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
