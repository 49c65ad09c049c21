"""One or two math warpgroups at BLOCK_M = 64, and tune's other candidates, on the decode shapes (one GPU call):

    python tools/perf/wg_sweep.py [--ms 1,2,4,8,16,32,64,128] [--reps 10] [--passes 2]
                                  [--multicast] [--json OUT]

For each M and DeepSeek-V3 (N, K) pair the candidates are
``cugemm8._tune.candidates`` (the heuristic's pick first, the cost model's
top 4, split K, and the one-math-warpgroup twin, ``w1``, of every BLOCK_M =
64 candidate), without the multicast ones unless ``--multicast``.  Every
kernel is compiled first, in threads; each candidate's output is checked
against the float64 reference (calc_diff < 1e-3) and only then timed:
CUPTI kernel durations (torch.profiler), a 256 MB L2 flush before each
repetition, ``--passes`` interleaved passes of ``--reps``, median.  Prints,
per shape, the heuristic's pick, the best two-warpgroup and the best
one-warpgroup candidate and their ratio; the JSON keeps every (config, µs)
for fitting the cost model (cugemm8/_config.py).  Reports; never asserts.
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
from cugemm8 import _tune, gemm as G  # noqa: E402
from cugemm8._shapes import DEEPSEEK_NK  # noqa: E402
from cugemm8.cli import Shape, bf16_to_f64, calc_diff, make_operands, poisoned_out, reference  # noqa: E402


def shape_candidates(m, n, k, num_sms, multicast):
    cands = _tune.candidates("normal", m, n, k, 1, num_sms, top=4, split_k=3)
    return [c for c in cands if multicast or c.num_multicast == 1 or c is cands[0]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--multicast", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    ms = [int(x) for x in args.ms.split(",") if x]
    num_sms = cugemm8.get_num_sms()
    nks = DEEPSEEK_NK[:6]
    jobs = {}
    for n, k in nks:
        for m in ms:
            for c in shape_candidates(m, n, k, num_sms, args.multicast):
                jobs[G._kernel_name(c, n, k, 0, 1)] = c.smem_bytes
    for name, why in common.compile_kernels(jobs, G._header_of).items():
        print(f"compile failed: {name}: {why}")
    print(f"{len(jobs)} kernels compiled", flush=True)
    flush = common.L2Flush()
    rows = []
    for n, k in nks:
        for m in ms:
            shape = Shape("normal", m, n, k)
            ops = make_operands(shape, cp, seed=m * 13 + n)
            ref, _ = reference(ops, shape, cp)
            sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
            cands = shape_candidates(m, n, k, num_sms, args.multicast)
            launchers, status = {}, {}
            for c in cands:
                out = poisoned_out(shape, ops, cp)
                fn = G._prepare_launch(c, "normal", n, k, 1, m, m, ops["a"], sfa, ops["b"], ops["sfb"], out,
                                       None, 1)
                fn()
                cp.cuda.runtime.deviceSynchronize()
                d = calc_diff(bf16_to_f64(out, cp), ref, cp)
                status[str(c)] = "ok" if d < 1e-3 else f"FAIL {d:.1e}"
                if d < 1e-3:
                    launchers[str(c)] = fn
            times = {name: [] for name in launchers}
            for p in range(args.passes):
                order = list(launchers.items())
                order = order[p % len(order):] + order[:p % len(order)]
                for name, fn in order:
                    times[name] += common.kernel_times([fn], reps=args.reps, flush=flush).samples
            us = {name: statistics.median(s) for name, s in times.items()}
            heur = str(cands[0])
            w2 = {c: t for c, t in us.items() if " w1" not in c}
            w1 = {c: t for c, t in us.items() if " w1" in c}
            b2 = min(w2.items(), key=lambda kv: kv[1]) if w2 else None
            b1 = min(w1.items(), key=lambda kv: kv[1]) if w1 else None
            twin = None
            if heur in us and cands[0].block_m == 64:
                tw = _tune.forced_config("normal", m, n, k, 1, 64, cands[0].block_n, 16, num_sms,
                                         splits=cands[0].num_k_splits, wgs=1)
                if tw is not None and str(tw) in us:
                    twin = (str(tw), us[str(tw)])
            rows.append({"m": m, "n": n, "k": k, "heuristic": heur, "us": us, "status": status})
            fails = [c for c, s in status.items() if s != "ok"]
            print(f"{m:4d} {n:6d} {k:6d}  heur {heur:22s} {us.get(heur, float('nan')):7.2f}"
                  f"  twin {twin[0] if twin else '-':24s} {twin[1] if twin else float('nan'):7.2f}"
                  f"  best2 {b2[0] if b2 else '-':24s} {b2[1] if b2 else float('nan'):7.2f}"
                  f"  best1 {b1[0] if b1 else '-':24s} {b1[1] if b1 else float('nan'):7.2f}"
                  f"  b2/b1 {b2[1] / b1[1] if b1 and b2 else float('nan'):5.3f}"
                  f"{'  FAILED: ' + ', '.join(fails) if fails else ''}", flush=True)
            del ops, launchers
            common.release_memory()
    def gm(vals):
        return common.geomean(vals) if vals else float("nan")
    regret = [r["us"][r["heuristic"]] / min(r["us"].values()) for r in rows if r["heuristic"] in r["us"]]
    print(f"heuristic / best over {len(regret)} shapes: geomean {gm(regret):.3f}, max {max(regret, default=0):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
