"""gemm_fp8 on bf16 x through the fused path (warp-MMA pick, B before the wait), for compute-sanitizer."""
import sys
import cupy as cp
import ml_dtypes
import numpy as np
sys.path.insert(0, ".")
import cugemm8
m, n, k = (int(v) for v in sys.argv[1:4])
rng = np.random.default_rng(0)
x = cp.asarray(rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16))
w = cp.asarray(rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16))
rhs = cugemm8.per_block_cast_to_fp8(w)
cugemm8.set_pdl(True)
for _ in range(3):
    out = cugemm8.gemm_fp8(x, rhs)
cp.cuda.runtime.deviceSynchronize()
print("ok", cugemm8.get_gemm_config("normal", m, n, k))
