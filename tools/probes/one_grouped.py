"""Run the grouped GEMMs on awkward inputs a few times (for compute-sanitizer):

    python tools/probes/one_grouped.py

Contiguous: 5 experts of uneven sizes (one empty), padding rows marked -1,
NaN payload bits in every padding row of A.  Masked: m_max = 200 (not a
multiple of BLOCK_M), masked_m in {0, 1, 137, 200}, NaN bits and 3e38 scales
in every row at or beyond masked_m.  Each op runs with the heuristic's
config and with a forced 2-CTA multicast config, and every result is checked
against the float64 reference (and the untouched masked rows against their
poison) before the next run."""
import sys

import numpy as np

sys.path.insert(0, ".")
sys.path.insert(1, "benches")
import cupy as cp  # noqa: E402

from cugemm8 import _config, gemm as G  # noqa: E402
from cugemm8.cli import (POISON_BITS, Shape, bf16_to_f64, calc_diff, gemm_call,  # noqa: E402
                         make_operands, poisoned_out, reference)

NAN_E4M3 = 0x7F
failures = 0


def check(label, shape, ops, out, ref):
    global failures
    valid = ops["valid"]
    got = bf16_to_f64(out, cp)
    diff = calc_diff(got[valid], ref[valid], cp)
    ok = diff < 1e-3 and bool(cp.isfinite(got[valid]).all())
    if shape.kind == "masked":
        bits = cp.ascontiguousarray(out).view(cp.uint16)
        ok = ok and bool((bits[~valid] == POISON_BITS).all())
    elif shape.kind == "contiguous":
        ok = ok and bool((got[~valid] == 0).all())
    failures += not ok
    print(f"{label}: calc_diff {diff:.2e} {'ok' if ok else 'FAIL'}", flush=True)


def run(shape, ops, forced=None):
    ref, _ = reference(ops, shape, cp)
    with G._forced_config(forced):
        for _ in range(2):
            out = poisoned_out(shape, ops, cp)
            gemm_call(shape, ops, out)()
            cp.cuda.runtime.deviceSynchronize()
            check(f"{shape.kind} {shape.label()} {forced or 'heuristic'}", shape, ops, out, ref)


# Contiguous: uneven experts, one empty, junk in padding rows.
shape = Shape("contiguous", 160, 320, 640, 5)
ops = make_operands(shape, cp, seed=1, vary=True)
sizes = [150, 0, 129, 1, 255]
offsets, total = [], 0
for s in sizes:
    offsets.append(total)
    total += -(-s // 128) * 128
m_indices = np.full(total, -1, np.int32)
for e, (o, s) in enumerate(zip(offsets, sizes)):
    m_indices[o:o + s] = e
src = make_operands(Shape("normal", total, 320, 640), cp, seed=2)
ops.update(a=src["a"], sfa=src["sfa"], m_indices=cp.asarray(m_indices), sizes=sizes,
           offsets=offsets, valid=cp.asarray(m_indices >= 0))
ops["a"][~ops["valid"]] = NAN_E4M3
run(shape, ops)
run(shape, ops, _config.make_config("contiguous", 128, 64, 4, 640, num_multicast=2,
                                    multicast_on_a=True, num_sms=8))

# Masked: m_max not a multiple of BLOCK_M, empty and single-row groups, junk beyond masked_m.
shape = Shape("masked", 200, 320, 640, 4)
ops = make_operands(shape, cp, seed=3)
host = np.array([0, 1, 137, 200], np.int32)
ops.update(masked_m=cp.asarray(host), masked_host=host.tolist(),
           valid=cp.asarray(np.arange(200)[None, :] < host[:, None]))
ops["a"][~ops["valid"]] = NAN_E4M3
ops["sfa"][~ops["valid"]] = 3e38
run(shape, ops)
run(shape, ops, _config.make_config("masked", 64, 64, 4, 640, num_multicast=2,
                                    multicast_on_a=True, num_sms=8))
print("FAILURES", failures)
sys.exit(1 if failures else 0)
