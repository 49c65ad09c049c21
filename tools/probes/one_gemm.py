"""Run one GEMM a few times (for ncu / compute-sanitizer): python tools/probes/one_gemm.py M N K"""
import sys

import numpy as np
import cupy as cp

sys.path.insert(0, ".")
import cugemm8
from tests import gpu_helpers as H

m, n, k = (int(x) for x in sys.argv[1:4])
a, sfa, b, sfb = H.make_operands(cp, np.random.default_rng(0), m, n, k)
sfa = cugemm8.get_col_major_tma_aligned_tensor(sfa)
out = cp.empty((m, n), cp.dtype("bfloat16"))
for _ in range(3):
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
cp.cuda.runtime.deviceSynchronize()
print("ok", cugemm8.get_gemm_config("normal", m, n, k))
