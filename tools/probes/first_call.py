"""Handoff proof (issue 22): with CUPY_CACHE_DIR pointing at a cache built
without a GPU (`cugemm8 warmup --compile-only --shapes @check`), the first
quantise + GEMM call and then the whole main job compile no cugemm8 kernel.
Run on the GPU from the checkout: CUPY_CACHE_DIR=$PWD/.prebuilt CUGEMM8_JIT_DEBUG=1 python tools/probes/first_call.py
(not from inside the cache directory: its cugemm8/ folder would shadow the package)"""
import sys
import time

import cupy as cp

import cugemm8
from cugemm8 import _jit, cli

print(f"cache {_jit.cache_dir()}; keys here: {cli.warmup.key_summary()}", flush=True)
x = cp.random.standard_normal((64, 7168), dtype=cp.float32).astype(cp.dtype("bfloat16"))
w = cp.random.standard_normal((2112, 7168), dtype=cp.float32).astype(cp.dtype("bfloat16"))
out = cp.empty((64, 2112), dtype=cp.dtype("bfloat16"))
cp.cuda.Device().synchronize()
t0 = time.perf_counter()
a, sfa = cugemm8.per_token_cast_to_fp8(x)
b, sfb = cugemm8.per_block_cast_to_fp8(w)
cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
cp.cuda.Device().synchronize()
print(f"first call (2 quantisers + 1 GEMM, 64x2112x7168): {(time.perf_counter() - t0) * 1e3:.1f} ms; "
      f"{_jit.stats}", flush=True)
first_ok = _jit.stats.compiles == 0 and _jit.stats.disk_hits > 0
rc = cli.main(["check"] + sys.argv[1:])
print(f"main job exit {rc}; {_jit.stats}")
print("HANDOFF OK: nothing compiled" if first_ok and _jit.stats.compiles == 0 else "HANDOFF FAILED: something compiled")
sys.exit(0 if first_ok and _jit.stats.compiles == 0 and rc == 0 else 1)
