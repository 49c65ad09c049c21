"""Split K over four: bit-exact against the promotion model's tree order,
reruns identical, guards intact (first GPU look; the tests come after)."""
import sys, numpy as np, cupy as cp
sys.path.insert(0, ".")
import cugemm8
from cugemm8 import _config, gemm as _gemm, reference as R
from tests import gpu_helpers as H
rows = []
CASES = [  # bm, bn, stages, wgs, m, n, k, sms
    (128, 64, 6, 2, 200, 1000, 1936, 132), (128, 64, 6, 2, 200, 1000, 1936, 8),
    (64, 64, 8, 1, 77, 1000, 1936, 132), (64, 64, 8, 1, 77, 1000, 1936, 8),
    (64, 64, 8, 2, 77, 1000, 1936, 12), (64, 128, 6, 1, 64, 1000, 7168, 132),
    (128, 128, 3, 2, 130, 520, 1936, 8), (64, 32, 8, 2, 33, 1000, 512, 132),
    (128, 32, 8, 2, 1, 1000, 512, 4), (64, 64, 8, 1, 5, 2112, 7168, 132),
]
ok_all = True
for bm, bn, st, wgs, m, n, k, sms in CASES:
    cfg = _config.make_config("normal", bm, bn, st, k, num_k_splits=4, num_sms=sms, num_math_warpgroups=wgs)
    ok, why = _config.is_legal(cfg, k=k)
    if not ok:
        rows.append((str(cfg), m, n, k, "ILLEGAL " + why)); ok_all = False; continue
    rng = np.random.default_rng(m * n + bm + sms)
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    sfa_t = cugemm8.get_col_major_tma_aligned_tensor(sfa)
    outs = []
    for _ in range(2):
        out, full = H.poisoned_out(cp, m, n)
        _gemm._launch(cfg, "normal", n, k, 1, m, m, a, sfa_t, b, sfb, out, None, 1)
        cp.cuda.runtime.deviceSynchronize()
        guards = H.guards_intact(cp, full, m, n)
        outs.append(out)
    same = bool(cp.all(outs[0].view(cp.uint16) == outs[1].view(cp.uint16)))
    model = R.promoted_accumulation_model(cp.asnumpy(a), cp.asnumpy(sfa), cp.asnumpy(b), cp.asnumpy(sfb),
                                          tensor_core="hopper", k_splits=4,
                                          warpgroup_split=(bm == 64 and wgs == 2))
    want = R.round_to_bf16(model).view(np.uint16)
    got = cp.asnumpy(outs[0].view(cp.uint16))
    nbad = int((got != want).sum())
    res = "OK" if (nbad == 0 and same and guards) else f"FAIL bad={nbad} same={same} guards={guards}"
    ok_all &= res == "OK"
    rows.append((str(cfg), m, n, k, res))
for r in rows:
    print("k4check", *r)
print("k4check ALL", "OK" if ok_all else "FAIL")
