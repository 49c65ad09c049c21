"""The contiguous layout's B multicast (kPairedB) under compute-sanitizer:
128-row tiles whose pairs of blocks share an expert, straddle a boundary,
hold padding or lie past m_sum, on a grid of 4 CTAs (every pipeline wraps
many times) and of 132.  Run from the repository root:
    compute-sanitizer --tool memcheck python benches/experiments/v0.29/san_c2b.py"""
import sys
sys.path.insert(0, ".")
import numpy as np
import cupy as cp
from cugemm8 import _config, gemm as _gemm
from tests.test_grouped_gpu import STRADDLING_SIZES, check_contiguous, check_contiguous_layout

for bm, bn, st in ((128, 192, 4), (128, 64, 4)):
    for sms in (4, 132):
        cfg = _config.make_config("contiguous", bm, bn, st, 1040, num_multicast=2, multicast_on_a=False, num_sms=sms)
        with _gemm._forced_config(cfg):
            check_contiguous(cp, np.random.default_rng(sms), STRADDLING_SIZES, 520, 1040)
        print(cfg, "ok", flush=True)
blocks = [0, 0, 1, -1, -1, 2, 3]
idx = np.repeat(np.array(blocks, np.int32), 128)
idx[2 * 128 + 60: 3 * 128] = -1
bad = 5 * 128 + 17
idx[bad] = 3
idx = idx[:6 * 128 + 88]
cfg = _config.make_config("contiguous", 128, 128, 4, 576, num_multicast=2, multicast_on_a=False, num_sms=4)
with _gemm._forced_config(cfg):
    check_contiguous_layout(cp, np.random.default_rng(7), idx, 4, 520, 576, junk_padding=False, nan_rows=(bad,))
print(cfg, "edge layout ok")
print("san_c2b OK")
