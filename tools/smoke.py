"""Quick GPU smoke check of the GEMM kernels (one process per call of the
device tool): runs a few configurations, each in a subprocess-safe order from
simplest to most involved, and prints one line each."""
import sys
import time
import traceback

import numpy as np
import cupy as cp

sys.path.insert(0, ".")
import cugemm8
from cugemm8 import _config, gemm as G
from tests import gpu_helpers as H

CASES = [  # kind, m, n, k, forced (bm, bn, stages, mc, on_a) or None
    ("normal", 128, 256, 128, (64, 128, 4, 1, False)),
    ("normal", 128, 256, 512, (128, 128, 4, 1, False)),
    ("normal", 333, 1000, 1040, (128, 112, 5, 1, False)),
    ("normal", 333, 1000, 1040, (256, 128, 3, 1, False)),
    ("normal", 333, 1000, 1040, (128, 144, 4, 1, False)),
    ("normal", 333, 1000, 1040, (128, 192, 4, 2, True)),
    ("normal", 333, 1000, 1040, (256, 128, 3, 2, False)),
    ("normal", 64, 2112, 7168, None),
    ("normal", 4096, 7168, 2048, None),
]


def run(kind, m, n, k, forced):
    rng = np.random.default_rng(0)
    kb, nb = -(-k // 128), -(-n // 128)
    a, b = H.random_fp8(cp, rng, (m, k)), H.random_fp8(cp, rng, (n, k))
    sfa, sfb = H.random_scales(cp, rng, (m, kb)), H.random_scales(cp, rng, (nb, kb))
    out, full = H.poisoned_out(cp, m, n)
    if forced:
        bm, bn, st, mc, on_a = forced
        cfg = _config.make_config("normal", bm, bn, st, k, num_multicast=mc, multicast_on_a=on_a, num_sms=132)
        G._launch(cfg, "normal", n, k, 1, m, m, a, cugemm8.get_col_major_tma_aligned_tensor(sfa), b, sfb, out, None, 1)
    else:
        cfg = cugemm8.get_gemm_config("normal", m, n, k)
        cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    cp.cuda.runtime.deviceSynchronize()
    ref, bound = H.reference_and_bound(cp, a, sfa, b, sfb)
    got = H.to_f64(cp, out)
    err = cp.abs(got - ref)
    nbad = int((~(err <= bound)).sum())
    rel = float(cp.linalg.norm(got - ref) / cp.linalg.norm(ref))
    guards = H.guards_intact(cp, full, m, n)
    return cfg, nbad, rel, guards


if __name__ == "__main__":
    ok = True
    for case in CASES:
        t = time.time()
        try:
            cfg, nbad, rel, guards = run(*case)
            status = "PASS" if nbad == 0 and guards else "FAIL"
            ok &= status == "PASS"
            print(f"{status} {case[:4]} {cfg} bad={nbad} rel={rel:.2e} guards={guards} {time.time()-t:.1f}s", flush=True)
        except Exception:
            ok = False
            print(f"ERROR {case[:4]}", flush=True)
            traceback.print_exc()
            if "illegal" in traceback.format_exc().lower() or "launch failure" in traceback.format_exc().lower():
                break
    sys.exit(0 if ok else 1)
