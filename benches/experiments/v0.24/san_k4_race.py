"""Four-way split K under racecheck: launches only (the checks ran in
san_k4.py and the GPU tests), one cluster running many tiles and a 64-row
one-warpgroup pick shape on two clusters."""
import sys
sys.path.insert(0, ".")
import numpy as np, cupy as cp
import cugemm8
from cugemm8 import _config, gemm as _gemm
from tests import gpu_helpers as H
rng = np.random.default_rng(0)
for (bm, bn, st, wgs, m, n, k, sms) in [(128, 128, 3, 2, 130, 520, 1936, 4), (64, 24, 16, 1, 64, 576, 1936, 8)]:
    cfg = _config.make_config("normal", bm, bn, st, k, num_k_splits=4, num_sms=sms, num_math_warpgroups=wgs)
    assert _config.is_legal(cfg, k=k)[0]
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    out = cp.empty((m, n), cp.dtype("bfloat16"))
    _gemm._launch(cfg, "normal", n, k, 1, m, m, a, cugemm8.get_col_major_tma_aligned_tensor(sfa), b, sfb, out, None, 1)
    cp.cuda.runtime.deviceSynchronize()
    print("launched", cfg)
print("san_k4_race OK")
