"""B's L2 evict-first hint on and off, same run (one GPU call):

    python tools/perf/hint_ab.py [--ms 1,8,32,64,128,256,512] [--reps 30] [--passes 2] [--json OUT]

For each M and DeepSeek-V3 (N, K) pair, the heuristic's configuration is
launched with ``kFlagBEvictFirst`` forced off and forced on
(``cugemm8.gemm.B_EVICT_FIRST_MAX_M_BLOCKS`` and ``B_EVICT_FIRST_MAX_ROWS``
set to 0 / a large number, ``B_EVICT_FIRST_MIN_K`` and
``B_EVICT_FIRST_MIN_K_BLOCK_M_256`` to 0 while the launcher is built), each
output checked against the float64 reference, then both timed in
interleaved passes (CUPTI kernel durations, 256 MB L2 flush before each
repetition).  Prints on / off per shape and the number of
BLOCK_M-row m-blocks, which the rule in ``gemm.b_evict_first`` keys on.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[1]))
sys.path.insert(1, str(_HERE.parents[1] / "benches"))

import cupy as cp  # noqa: E402

import common  # noqa: E402
import cugemm8  # noqa: E402
from cugemm8 import gemm as G  # noqa: E402
from cugemm8._shapes import DEEPSEEK_NK  # noqa: E402
from cugemm8.cli import Shape, bf16_to_f64, calc_diff, make_operands, poisoned_out, reference  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,8,32,64,128,256,512")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    flush = common.L2Flush()
    rows = []
    names = ("B_EVICT_FIRST_MAX_M_BLOCKS", "B_EVICT_FIRST_MAX_ROWS", "B_EVICT_FIRST_MIN_K",
             "B_EVICT_FIRST_MIN_K_BLOCK_M_256")
    saved = [getattr(G, x) for x in names]
    for n, k in DEEPSEEK_NK[:6]:
        for m in (int(x) for x in args.ms.split(",")):
            shape = Shape("normal", m, n, k)
            ops = make_operands(shape, cp, seed=m + n)
            ref, _ = reference(ops, shape, cp)
            sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
            cfg = cugemm8.get_gemm_config("normal", m, n, k)
            launchers, status = {}, {}
            for name, limit in (("off", 0), ("on", 1 << 30)):
                for x, v in zip(names, (limit, limit, 0, 0)):
                    setattr(G, x, v)
                out = poisoned_out(shape, ops, cp)
                launchers[name] = G._prepare_launch(cfg, "normal", n, k, 1, m, m, ops["a"], sfa, ops["b"],
                                                    ops["sfb"], out, None, 1)
                launchers[name]()
                cp.cuda.runtime.deviceSynchronize()
                d = calc_diff(bf16_to_f64(out, cp), ref, cp)
                status[name] = "ok" if d < 1e-3 else f"FAIL {d:.1e}"
            for x, v in zip(names, saved):
                setattr(G, x, v)
            times = {name: [] for name in launchers}
            for _ in range(args.passes):
                for name, fn in launchers.items():
                    t = common.kernel_times([fn], reps=args.reps, flush=flush)
                    times[name] += t.samples
            off, on = (statistics.median(times[x]) for x in ("off", "on"))
            mblocks = -(-m // cfg.block_m)
            rows.append({"m": m, "n": n, "k": k, "config": str(cfg), "m_blocks": mblocks,
                         "off_us": off, "on_us": on, "status": status})
            print(f"{m:5d} {n:6d} {k:6d}  {str(cfg):22s} mb={mblocks:3d}  off {off:8.2f}  on {on:8.2f}"
                  f"  on/off {on / off:6.3f}  {status['off']}/{status['on']}", flush=True)
            del ops, launchers
            common.release_memory()
    for mb in sorted({r["m_blocks"] for r in rows}):
        sel = [r["on_us"] / r["off_us"] for r in rows if r["m_blocks"] == mb]
        print(f"m_blocks {mb}: on/off geomean {common.geomean(sel):.3f} over {len(sel)} shapes")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
