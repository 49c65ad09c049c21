"""Split-K pairs on one math warpgroup (the skewed split of v0.30) under
compute-sanitizer: the normal GEMM at 128x2112x7168 (the twin pick) on 132
and 6 CTAs, K = 2288 (11 / 7 K blocks) on 4 CTAs, and the contiguous and
masked layouts at K = 2288 on 4 CTAs.  Run from the repository root:
    compute-sanitizer --tool memcheck --report-api-errors no python benches/experiments/v0.31/san_w1k2.py

(v0.31's run, san_w1k2_memcheck.log, left API errors on: its 34 "errors"
are all CUDA_ERROR_INVALID_VALUE from host cuGetProcAddress_v2 lookups made
while the libraries load, none from a kernel; the same script without the
sanitizer: san_w1k2_plain.log.)"""
import sys
sys.path.insert(0, ".")
import numpy as np
import cupy as cp
from cugemm8 import _config, gemm as _gemm
from tests import gpu_helpers as H
from tests.test_grouped_gpu import STRADDLING_SIZES, check_contiguous, check_masked


def w1(kind, bn, stages, k, splits, sms):
    cfg = _config.make_config(kind, 64, bn, stages, k, num_k_splits=splits, num_sms=sms, num_math_warpgroups=1)
    ok, why = _config.is_legal(cfg, k=k)
    assert ok, why
    return cfg


for m, n, k, bn, st, sms in ((128, 2112, 7168, 64, 12, 132), (128, 2112, 7168, 64, 12, 6),
                             (100, 1000, 2288, 32, 8, 4), (64, 520, 2288, 112, 6, 4)):
    cfg = w1("normal", bn, st, k, 2, sms)
    H.run_forced(cp, cfg, m, n, k, seed=m + n)
    print(cfg, m, n, k, "ok", flush=True)
cfg = w1("contiguous", 64, 8, 2288, 2, 4)
with _gemm._forced_config(cfg):
    check_contiguous(cp, np.random.default_rng(3), STRADDLING_SIZES, 520, 2288)
print(cfg, "contiguous ok", flush=True)
cfg = w1("masked", 32, 8, 2288, 2, 4)
check_masked(cp, np.random.default_rng(4), 3, 200, 1000, 2288, [200, 0, 77], 100, cfg=cfg)
print(cfg, "masked ok", flush=True)
print("san_w1k2 OK")
