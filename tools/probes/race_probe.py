"""Forced small-grid configurations (several tiles per CTA) for racecheck:

    python tools/probes/race_probe.py KIND BMxBN STAGES MC [GRID]

KIND normal (M=333, N=320, K=640), masked (4 groups, m_max=200,
masked_m = 0, 1, 137, 200) or contiguous (5 experts of 200 +- 30% rows,
each padded to 128 rows: with BLOCK_M = 256 some tiles straddle two experts
and run both passes); MC 1, 2A, 2B, k2 (split K across the CTA pair;
K=2304: 18 K blocks, which BLOCK_M = 128 pairs split 11 / 7 and BLOCK_M =
64 pairs 9 / 9) or k4 (normal only: split K across a cluster of four,
K=2048: 4 K blocks each; GRID a multiple of 4).  The result is checked."""
import sys

import numpy as np

sys.path.insert(0, ".")
import cupy as cp  # noqa: E402

from cugemm8 import _config, gemm as G  # noqa: E402
from cugemm8.cli import Shape, bf16_to_f64, calc_diff, gemm_call, make_operands, poisoned_out, reference  # noqa: E402

kind, tile, stages, mc = sys.argv[1:5]
grid = int(sys.argv[5]) if len(sys.argv) > 5 else 8
bm, bn = (int(x) for x in tile.split("x"))
k = {"k2": 2304, "k4": 2048}.get(mc, 640)
shape = {"normal": Shape("normal", 333, 320, k), "masked": Shape("masked", 200, 320, k, 4),
         "contiguous": Shape("contiguous", 200, 320, k, 5)}[kind]
ops = make_operands(shape, cp, seed=3, vary=kind == "contiguous")
if kind == "masked":
    host = np.array([0, 1, 137, 200], np.int32)
    ops.update(masked_m=cp.asarray(host), masked_host=host.tolist(),
               valid=cp.asarray(np.arange(200)[None, :] < host[:, None]))
if mc in ("k2", "k4"):
    cfg = _config.make_config(kind, bm, bn, int(stages), k, num_k_splits=int(mc[1]), num_sms=grid)
else:
    cfg = _config.make_config(kind, bm, bn, int(stages), k, num_multicast=int(mc[0]),
                              multicast_on_a=mc.endswith("A"), num_sms=grid)
out = poisoned_out(shape, ops, cp)
with G._forced_config(cfg):
    gemm_call(shape, ops, out)()
ref, _ = reference(ops, shape, cp)
v = ops["valid"]
print(kind, cfg, f"calc_diff {calc_diff(bf16_to_f64(out, cp)[v], ref[v], cp):.2e}")
