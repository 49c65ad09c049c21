"""Reproduce the split-K odd-stage race (fixed in v0.4; see
cugemm8/_config.py ``_stages_ok``).

    python tools/repro_tile_flake.py [--runs 10] [--tile 64x160] [--stages S] [--root CUDA_SRC]

With BLOCK_M = 64 the two math warpgroups split K (even / odd K blocks) and
each waits on its own blocks' full barriers by phase parity.  With an odd
stage count a stage changes hands every lap, and a warpgroup can pass its
wait on a phase that has not landed (the parity of "my block landed" and
"the other warpgroup's previous block has not landed yet" is the same) when
TMA loads land out of order: it reads a stale stage and releases it early,
which ends in a CUDA error about one launch in 20 here.

Each run is a fresh process doing what benches/bench_tp.py's N = 1 layer did
when this was found: the DeepSeek-V3 MLP of examples/tensor_parallel.py at
64 tokens on all SMs (heuristic tiles), then on 124 SMs with the W1 GEMM
(64x36864x7168) forced to ``--tile`` with ``--stages`` (default: the most
that fit, even for BLOCK_M = 64), 7 layers each, synchronising after every
GEMM.  Prints how many runs hit a CUDA error.  The kernel now refuses odd
split-K stage counts at compile time, so ``--stages 5`` needs ``--root``
pointing at an older copy of cuda_src/ (e.g. ``git archive 690ab92
cuda_src``).  benches/RESULTS.md (v0.4) has the counts.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


def child(tile: str, stages: int, root: str | None) -> None:
    sys.path.insert(0, str(_ROOT))
    sys.path.insert(0, str(_ROOT / "examples"))
    import cupy as cp

    import cugemm8
    import tensor_parallel as tp
    from cugemm8 import _config, _jit, gemm as G
    if root:
        src = Path(root).resolve()
        _jit.cuda_src_dir = lambda: src
    bm, bn = (int(v) for v in tile.split("x"))
    w1, w2 = tp.tp_weight_slices(0, 1, seed=0)
    w1q, w2q = cugemm8.per_block_cast_to_fp8(w1), cugemm8.per_block_cast_to_fp8(w2)
    del w1, w2
    orig = cugemm8.gemm_fp8_fp8_bf16_nt
    forced = {"on": False}

    def traced(lhs, rhs, out):
        m, k = lhs[0].shape
        n = rhs[0].shape[0]
        if forced["on"] and n == w1q[0].shape[0]:
            s = stages or _config.max_stages(bm, bn, k)
            cfg = _config.make_config("normal", bm, bn, s, k, num_sms=cugemm8.get_num_sms())
            with G._forced_config(cfg):
                orig(lhs, rhs, out)
        else:
            orig(lhs, rhs, out)
        cp.cuda.runtime.deviceSynchronize()

    cugemm8.gemm_fp8_fp8_bf16_nt = traced
    for sms, force in ((cugemm8.get_num_sms(), False), (124, True)):
        cugemm8.set_num_sms(sms)
        forced["on"] = force
        x = tp.tp_activations(64, seed=0)
        tp.time_on_stream(lambda mid: tp.mlp_forward(x, w1q, w2q, mid_event=mid), reps=3, warmup=3)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--tile", default="64x160")
    p.add_argument("--stages", type=int, default=0, help="0: the most that fit")
    p.add_argument("--root", default=None, help="another cuda_src/ directory")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.tile, args.stages, args.root)
        return 0
    failed = 0
    for i in range(args.runs):
        cmd = [sys.executable, __file__, "--child", "--tile", args.tile, "--stages", str(args.stages)]
        cmd += ["--root", args.root] if args.root else []
        res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        bad = res.returncode != 0
        failed += bad
        errors = [ln for ln in res.stderr.splitlines() if "Error" in ln]
        last = (errors or res.stderr.strip().splitlines() or [""])[0][:160]
        print(f"run {i + 1}: {'FAILED: ' + last if bad else 'ok'}", flush=True)
    print(f"{args.tile} s{args.stages or 'max'}{' (' + args.root + ')' if args.root else ''}: "
          f"{failed} of {args.runs} runs failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
