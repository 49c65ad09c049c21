"""Time forced kernel configurations on a few shapes (one H200 call), to test
the heuristic's picks against alternatives.  Each line: shape, config, µs,
TFLOPS; the best per shape is marked.  ``python benches/sweep_configs.py``."""
from __future__ import annotations

import sys

import numpy as np
import cupy as cp

sys.path.insert(0, ".")
import cugemm8
from cugemm8 import _config, gemm as G
sys.path.insert(0, "benches")
from common import L2Flush, time_call  # noqa: E402
from tests import gpu_helpers as H

SMALL_SHAPES = [(64, 2112, 7168), (128, 4096, 7168), (64, 7168, 16384), (128, 7168, 2048)]
LARGE_SHAPES = [(4096, 7168, 2048), (4096, 4096, 7168), (4096, 24576, 1536)]
BIG = [(256, 128, 3, 2, True), (256, 128, 3, 2, False), (256, 128, 3, 1, False), (128, 128, 5, 2, True),
       (128, 128, 5, 1, False), (128, 192, 4, 2, True), (128, 192, 4, 1, False), (128, 160, 4, 2, True),
       (128, 144, 5, 2, True), (256, 112, 3, 2, True), (128, 112, 6, 2, True)]
SMALL = [(64, 16, 16, 1, False), (64, 32, 16, 1, False), (64, 64, 13, 1, False), (64, 128, 8, 1, False),
         (128, 32, 12, 1, False), (128, 64, 9, 1, False), (64, 24, 16, 1, False), (64, 48, 14, 1, False)]


def main():
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", choices=("small", "large", "all"), default="all",
                   help="M <= 128 shapes (v0.2 sweep), M = 4096 shapes (v0.1 sweep), or both")
    which = p.parse_args().shapes
    shapes = {"small": SMALL_SHAPES, "large": LARGE_SHAPES, "all": LARGE_SHAPES + SMALL_SHAPES}[which]
    flush = L2Flush()
    for m, n, k in shapes:
        a, sfa, b, sfb = H.make_operands(cp, np.random.default_rng(0), m, n, k)
        sfa = cugemm8.get_col_major_tma_aligned_tensor(sfa)
        out = cp.empty((m, n), cp.dtype("bfloat16"))
        pick = cugemm8.get_gemm_config("normal", m, n, k)
        rows = []
        for bm, bn, st, mc, on_a in (BIG if m >= 1024 else SMALL):
            st = min(st, _config.max_stages(bm, bn, k)) or st
            for sms in (132,):
                cfg = _config.make_config("normal", bm, bn, st, k, num_multicast=mc, multicast_on_a=on_a,
                                          num_sms=sms)
                ok, why = _config.is_legal(cfg, k=k)
                if not ok:
                    continue
                fn = lambda cfg=cfg: G._launch(cfg, "normal", n, k, 1, m, m, a, sfa, b, sfb, out, None, 1)
                t = time_call(fn, reps=20, warmup=2, flush=flush).median
                rows.append((t, str(cfg)))
        t_pick = time_call(lambda: cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out), reps=20, warmup=2,
                           flush=flush).median
        best = min(rows)
        for t, c in sorted(rows):
            print(f"{m}x{n}x{k}  {c:24s} {t:8.1f} us {2*m*n*k/t/1e6:7.0f} TF{'  <- best' if (t, c) == best else ''}")
        print(f"{m}x{n}x{k}  heuristic {str(pick):24s} {t_pick:8.1f} us {2*m*n*k/t_pick/1e6:7.0f} TF\n", flush=True)


if __name__ == "__main__":
    main()
