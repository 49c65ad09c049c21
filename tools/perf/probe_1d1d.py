"""One 1D1D wgrad GEMM (2112 x 7168 x 4096 by default) timed with and without c, for ncu (one GPU call):

    python tools/perf/probe_1d1d.py [--shape 2112,7168,4096] [--config 128x128] [--once]
    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \\
        -k regex:fp8_gemm_1d1d -c 1 python tools/perf/probe_1d1d.py --once

Prints the CUPTI kernel time (256 MB L2 flush before each repetition) with
c = None, with c = d (in place) and, for the same bytes, the 1D2D GEMM's
time (BF16 out, 128x128 B scales) as a same-structure reference.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[1]))
sys.path.insert(1, str(_HERE.parents[1] / "benches"))

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

import common  # noqa: E402
import cugemm8  # noqa: E402
from cugemm8 import _config_1d1d as C1, gemm_1d1d as G1  # noqa: E402
from tests import gpu_helpers as H  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="2112,7168,4096")
    ap.add_argument("--config", default="")
    ap.add_argument("--once", action="store_true", help="one launch (for ncu)")
    args = ap.parse_args()
    m, n, k = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    a, b = H.random_fp8(cp, rng, (m, k)), H.random_fp8(cp, rng, (n, k))
    sfa = cugemm8.get_col_major_tma_aligned_tensor(H.random_scales(cp, rng, (m, k // 128)))
    sfb = cugemm8.get_col_major_tma_aligned_tensor(H.random_scales(cp, rng, (n, k // 128)))
    d = cp.zeros((m, n), cp.float32)
    cfg = None
    if args.config:
        bm, bn = (int(v) for v in args.config.split("x"))
        cfg = C1.make_config(bm, bn, C1.max_stages(bm, bn), cugemm8.get_num_sms())
    forced = G1._forced_config(cfg) if cfg else None
    if forced:
        forced.__enter__()
    if args.once:
        cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d)
        cp.cuda.runtime.deviceSynchronize()
        return 0
    flush = common.L2Flush()
    t0 = common.kernel_times([lambda: cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d)], reps=10, flush=flush).median
    t1 = common.kernel_times([lambda: cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d, c=d)], reps=10, flush=flush).median
    out = cp.empty((m, n), cp.dtype("bfloat16"))
    sfb2 = H.random_scales(cp, rng, (-(-n // 128), k // 128))
    t2 = common.kernel_times([lambda: cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb2), out)], reps=10,
                             flush=flush).median
    fl = 2 * m * n * k
    print(f"{m}x{n}x{k} {cfg or cugemm8.get_gemm_1d1d_config(m, n, k)}: no c {t0:.1f} us ({fl / t0 / 1e6:.0f} TF), "
          f"c = d {t1:.1f} us, 1D2D {cugemm8.get_gemm_config('normal', m, n, k)} {t2:.1f} us ({fl / t2 / 1e6:.0f} TF)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
