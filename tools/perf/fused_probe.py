"""Probe of gemm_fp8's one-kernel fused path (issue 19), one GPU call.

    python tools/perf/fused_probe.py [--seeds 40]

1. Determinism and agreement: for forced configurations and m in {1, 5, 64},
   over ``--seeds`` random x, the fused output against the two-launch output
   (same configuration) bit for bit; the fused workspace's payload and scales
   against ``per_token_cast_to_fp8`` bit for bit; repeated runs on one x
   (does either path vary between runs?).
2. Prints one line per case: mismatching elements, payload / scale
   mismatches, distinct outputs over repeats.
Reports; never asserts.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=40)
    args = ap.parse_args()
    import cupy as cp
    import ml_dtypes
    import cugemm8
    from cugemm8 import _config, gemm as G, quant as Q
    bf16 = np.dtype(ml_dtypes.bfloat16)
    cases = [(64, 128, 8, {"num_math_warpgroups": 1}, 2120, 2048),
             (64, 32, 16, {"num_math_warpgroups": 1, "num_k_splits": 2}, 2112, 7168),
             (128, 64, 8, {}, 7168, 2048),
             (64, 56, 12, {"num_math_warpgroups": 2}, 7168, 2048)]
    for bm, bn, st, opts, n, k in cases:
        cfg = _config.make_config("normal", bm, bn, st, k, num_sms=cugemm8.get_num_sms(), **opts)
        G._select = lambda kind, m_, n_, k_, g, cfg=cfg: cfg
        w = cp.random.RandomState(1).standard_normal((n, k), dtype=cp.float32).astype(bf16)
        rhs = cugemm8.per_block_cast_to_fp8(w)
        for m in (1, 5, 64):
            bad_out = bad_a = bad_s = 0
            worst = 0
            for seed in range(args.seeds):
                x = cp.random.RandomState(100 + seed).standard_normal((m, k), dtype=cp.float32).astype(bf16)
                ws = cp.full(cugemm8.gemm_fp8_workspace_bytes(m, k), 0xFF, dtype=cp.uint8)
                o1 = cp.empty((m, n), bf16)
                cugemm8.gemm_fp8(x, rhs, o1, workspace=ws)
                a, sfa = cugemm8.per_token_cast_to_fp8(x)
                o2 = cp.empty((m, n), bf16)
                cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), rhs, o2)
                _, kb, m_pad, a_off, sfa_off, total = Q._workspace_layout(m, k)
                wa = ws[a_off:a_off + m * k].reshape(m, k)
                ws_s = ws[sfa_off:total].view(cp.float32).reshape(kb, m_pad)[:, :m].T
                d = int((o1.view(cp.uint16) != o2.view(cp.uint16)).sum())
                da = int((wa != a).sum())
                ds = int((ws_s.view(cp.uint32) != cp.ascontiguousarray(sfa).view(cp.uint32)).sum())
                bad_out += d > 0
                bad_a += da > 0
                bad_s += ds > 0
                worst = max(worst, d)
                if d and bad_out <= 2:
                    idx = cp.asnumpy(cp.argwhere(o1.view(cp.uint16) != o2.view(cp.uint16)))[:4].tolist()
                    print(f"   {cfg} m={m} seed={seed}: {d} differ at {idx}; payload diffs {da}, scale diffs {ds}")
            # repeats on one x
            x = cp.random.RandomState(7).standard_normal((m, k), dtype=cp.float32).astype(bf16)
            ws = cp.zeros(cugemm8.gemm_fp8_workspace_bytes(m, k), dtype=cp.uint8)
            f_outs, t_outs = set(), set()
            a, sfa = cugemm8.per_token_cast_to_fp8(x)
            for _ in range(20):
                o = cp.empty((m, n), bf16)
                cugemm8.gemm_fp8(x, rhs, o, workspace=ws)
                f_outs.add(cp.asnumpy(o.view(cp.uint16)).tobytes())
                o = cp.empty((m, n), bf16)
                cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), rhs, o)
                t_outs.add(cp.asnumpy(o.view(cp.uint16)).tobytes())
            print(f"{str(cfg):26s} n={n} k={k} m={m:3d}: out mismatch in {bad_out}/{args.seeds} seeds "
                  f"(worst {worst} elems), payload {bad_a}, scales {bad_s}; distinct outputs over 20 runs: "
                  f"fused {len(f_outs)}, two-launch {len(t_outs)}, same {f_outs == t_outs}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
