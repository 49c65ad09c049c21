"""Four-way split K under compute-sanitizer: a forced 128x128 k4 on one
cluster (many tiles: the exchange barriers' phases turn over), the picks at
64 / 128 x 576 x 7168, and gemm_fp8's one-kernel form at 1 x 576 x 7168."""
import sys
sys.path.insert(0, ".")
import numpy as np, cupy as cp
import cugemm8
from cugemm8 import _config, gemm as _gemm
from tests import gpu_helpers as H
rng = np.random.default_rng(0)
cfg = _config.make_config("normal", 128, 128, 3, 1936, num_k_splits=4, num_sms=4)
a, sfa, b, sfb = H.make_operands(cp, rng, 130, 520, 1936)
out, full = H.poisoned_out(cp, 130, 520)
_gemm._launch(cfg, "normal", 520, 1936, 1, 130, 130, a, cugemm8.get_col_major_tma_aligned_tensor(sfa), b, sfb, out, None, 1)
ref, bound = H.reference_and_bound(cp, a, sfa, b, sfb)
H.check_against(cp, out, ref, bound, what=str(cfg)); assert H.guards_intact(cp, full, 130, 520)
for m in (64, 128):
    a, sfa, b, sfb = H.make_operands(cp, rng, m, 576, 7168)
    out, full = H.poisoned_out(cp, m, 576)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, cugemm8.get_col_major_tma_aligned_tensor(sfa)), (b, sfb), out)
    ref, bound = H.reference_and_bound(cp, a, sfa, b, sfb)
    H.check_against(cp, out, ref, bound, what=f"m={m}"); assert H.guards_intact(cp, full, m, 576)
    print(m, cugemm8.get_gemm_config("normal", m, 576, 7168))
x = cp.asarray(rng.standard_normal((1, 7168)).astype(np.float32)).astype(cp.dtype("bfloat16"))
b, sfb = H.make_operands(cp, rng, 1, 576, 7168)[2:]
y = cugemm8.gemm_fp8(x, (b, sfb))
a1, s1 = cugemm8.per_token_cast_to_fp8(x)
y2 = cp.empty((1, 576), cp.dtype("bfloat16"))
cugemm8.gemm_fp8_fp8_bf16_nt((a1, s1), (b, sfb), y2)
assert bool(cp.all(y.view(cp.uint16) == y2.view(cp.uint16)))
cp.cuda.runtime.deviceSynchronize()
print("san_k4 OK")
