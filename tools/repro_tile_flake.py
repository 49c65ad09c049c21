"""Reproduce the intermittent launch failure of the 64x160 split-K tile
(excluded from the heuristic: cugemm8/_config.py EXCLUDED_TILES).

    python tools/repro_tile_flake.py [--runs 10] [--tile 64x160] [--root CUDA_SRC]

Each run is a fresh process doing what benches/bench_tp.py's N = 1 layer did
when it was found: the DeepSeek-V3 MLP of examples/tensor_parallel.py at 64
tokens on all SMs (heuristic tiles), then on 124 SMs with the W1 GEMM
(64x36864x7168) forced to the given tile, 7 layers each, synchronising and
checking after every GEMM.  Prints how many runs hit a CUDA error.  On the
H200 (v0.3 and v0.4 kernels alike): 3 of 10 runs failed with 64x160 s5,
0 of 20 with the heuristic's 64x144.  ``--root`` runs another copy of
cuda_src/ (e.g. an older kernel).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


def child(tile: str, root: str | None) -> None:
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
            stages = _config.max_stages(bm, bn, k)
            cfg = _config.make_config("normal", bm, bn, stages, k, num_sms=cugemm8.get_num_sms())
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
    p.add_argument("--root", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.tile, args.root)
        return 0
    failed = 0
    for i in range(args.runs):
        cmd = [sys.executable, __file__, "--child", "--tile", args.tile] + (["--root", args.root] if args.root else [])
        res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        bad = res.returncode != 0
        failed += bad
        errors = [ln for ln in res.stderr.splitlines() if "Error" in ln]
        last = (errors or res.stderr.strip().splitlines() or [""])[0][:160]
        print(f"run {i + 1}: {'FAILED: ' + last if bad else 'ok'}", flush=True)
    print(f"{args.tile}: {failed} of {args.runs} runs failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
