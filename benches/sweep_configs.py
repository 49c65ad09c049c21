"""Time forced kernel configurations against the heuristic's pick (one H200 call).

    python benches/sweep_configs.py [--kinds normal,contiguous,masked] [--ms 64,128,4096]
                                    [--top 6] [--split-k 6] [--reps 10] [--json OUT]

For every benchmark shape (``bench_gemm.py``'s table) the candidates are the
cost model's ``--top`` ranked configs with multicast allowed, the
no-multicast twin of each, up to ``--split-k`` split-K configurations (K
split across a cluster of 2) that fill half the SMs or more, DeepGEMM's own
config from docs/benchmarks.md (anchor 1) where it is legal here, and the
heuristic's pick.  All kernels are
compiled first, in parallel threads; each config's output is checked against
the float64 reference (calc_diff < 1e-3) before it is timed (median of ``--reps``,
256 MB L2 flush before each), with CUDA events and, where torch is
installed, CUPTI kernel times (``common.kernel_times``; the table ranks by
these when present).  The JSON holds every
(config, µs) so the cost model in ``cugemm8/_config.py`` can be fitted to it.
This script reports; it never asserts.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(1, str(_HERE.parent))

import bench_gemm  # noqa: E402
from cugemm8.cli import (Shape, bf16_to_f64, calc_diff, gemm_call, make_operands,  # noqa: E402
                         poisoned_out, print_table, reference)

# DeepGEMM's configs on the H200 (docs/benchmarks.md, anchor 1): "c2" multicasts
# A across a 2-CTA cluster, "c2B" multicasts B.
_DG_NORMAL_CFG = {
    64: ("64x16 s16", "64x96 s10 c2", "64x128 s8 c2", "64x64 s13", "64x32 s16", "64x64 s13"),
    128: ("64x32 s16", "128x192 s4", "128x128 s5 c2B", "64x112 s9", "64x64 s13", "64x112 s9"),
    4096: ("128x192 s4 c2", "256x128 s3 c2B", "256x128 s3 c2B", "256x128 s3 c2B", "256x128 s3 c2B",
           "256x128 s3 c2B"),
}
_DG_GROUPED_CFG = {"contiguous": "128x192 s4 c2"}


def anchor_config(shape: Shape):
    from cugemm8._shapes import DEEPSEEK_NK
    if shape.kind == "normal" and shape.m in _DG_NORMAL_CFG and (shape.n, shape.k) in DEEPSEEK_NK[:6]:
        return _DG_NORMAL_CFG[shape.m][DEEPSEEK_NK.index((shape.n, shape.k))]
    return _DG_GROUPED_CFG.get(shape.kind)


# The candidate family lives in cugemm8._tune (`cugemm8 tune` uses it too);
# these adapters take a Shape (contiguous m = rows per group, as the bench
# tables write it).

def _m(shape: Shape) -> int:
    return shape.m * shape.num_groups if shape.kind == "contiguous" else shape.m


def parse_config(text: str, shape: Shape, num_sms: int):
    """A GemmConfig from 'BMxBN sS [w1] [c2|c2B|k2|k4]' with the largest legal grid, or None."""
    from cugemm8 import _tune
    return _tune.parse_config(text, shape.kind, _m(shape), shape.n, shape.k, shape.num_groups, num_sms)


def forced_config(shape: Shape, bm: int, bn: int, stages: int, num_sms: int, *, mc: int = 1,
                  on_a: bool = False, splits: int = 1, wgs: int = 2):
    """cugemm8._tune.forced_config for ``shape``."""
    from cugemm8 import _tune
    return _tune.forced_config(shape.kind, _m(shape), shape.n, shape.k, shape.num_groups, bm, bn, stages,
                               num_sms, mc=mc, on_a=on_a, splits=splits, wgs=wgs)


def candidates(shape: Shape, top: int, num_sms: int, split_k: int = 0) -> list:
    """cugemm8._tune.candidates for ``shape``, plus DeepGEMM's own config
    (docs/benchmarks.md, anchor 1) where it is legal here."""
    from cugemm8 import _tune
    anchor = anchor_config(shape)
    extra = [parse_config(anchor, shape, num_sms)] if anchor else []
    return _tune.candidates(shape.kind, _m(shape), shape.n, shape.k, shape.num_groups, num_sms,
                            top=top, split_k=split_k, extra=[c for c in extra if c is not None])


def unique_configs(configs) -> list:
    from cugemm8 import _tune
    return _tune.unique_configs(configs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kinds", default="normal,contiguous,masked")
    p.add_argument("--ms", default="64,128,4096", help="normal-GEMM M values")
    p.add_argument("--top", type=int, default=6)
    p.add_argument("--split-k", type=int, default=6, help="split-K candidates per shape")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import cupy as cp
    import common
    import cugemm8
    from cugemm8 import _jit, gemm as G

    num_sms = cugemm8.get_num_sms()
    ms = tuple(int(x) for x in args.ms.split(","))
    shapes = [s for s in bench_gemm.bench_shapes(args.kinds.split(","), False, False)
              if s.kind != "normal" or s.m in ms]
    plan = [(s, candidates(s, args.top, num_sms, args.split_k)) for s in shapes]

    names = {}
    for s, cfgs in plan:
        for c in cfgs:
            names[G._kernel_name(c, s.n, s.k, G._GEMM_TYPE[s.kind], s.num_groups)] = c.smem_bytes
    t0 = time.perf_counter()
    device_id = cp.cuda.Device().id

    def build(item):
        name, smem = item
        with cp.cuda.Device(device_id):
            try:
                _jit.get_kernel(G._header_of(name), name, max_dynamic_smem=smem)
                return None
            except Exception as exc:
                return f"{name}: {type(exc).__name__}: {exc}"[:300]
    with ThreadPoolExecutor(max_workers=16) as pool:
        errors = [e for e in pool.map(build, names.items()) if e]
    print(f"compiled {len(names)} kernels in {time.perf_counter() - t0:.1f} s "
          f"({len(errors)} failed)", flush=True)
    for e in errors:
        print("  compile error:", e)

    flush = common.L2Flush()
    results, table = [], []
    for s, cfgs in plan:
        ops = make_operands(s, cp, seed=0, vary=False)
        ref, _ = reference(ops, s, cp)
        valid = ops["valid"]
        pick = str(G._select(s.kind, s.m * s.num_groups if s.kind == "contiguous" else s.m,
                             s.n, s.k, s.num_groups))
        rows = []
        for c in cfgs:
            label = str(c)
            with G._forced_config(c):
                try:
                    out = poisoned_out(s, ops, cp)
                    run = gemm_call(s, ops, out)
                    run()
                    diff = calc_diff(bf16_to_f64(out, cp)[valid], ref[valid], cp)
                    if not diff < 1e-3:
                        rows.append({"config": label, "us": None, "status": f"WRONG {diff:.2e}"})
                        continue
                    t_ev = common.time_call(run, reps=args.reps, warmup=1, flush=flush).median
                    cupti = common.kernel_times([run], reps=args.reps, flush=flush)
                    t = cupti.median if cupti is not None else t_ev
                    rows.append({"config": label, "us": t, "events_us": t_ev,
                                 "timer": "cupti" if cupti is not None else "events", "status": "ok"})
                except Exception as exc:
                    rows.append({"config": label, "us": None,
                                 "status": f"error {type(exc).__name__}: {exc}"[:200]})
        del ref
        common.release_memory()
        flops = 2 * s.m * s.num_groups * s.n * s.k
        timed = [r for r in rows if r["us"] is not None]
        best = min(timed, key=lambda r: r["us"]) if timed else None
        heur = next((r for r in rows if r["config"] == pick), None)
        anchor = anchor_config(s)
        for r in sorted(rows, key=lambda r: (r["us"] is None, r["us"] or 0)):
            tf = f"{flops / r['us'] / 1e6:7.0f} TF" if r["us"] else ""
            mark = ("  <- best" if r is best else "") + ("  (heuristic)" if r is heur else "")
            print(f"{s.kind:10s} {s.label():18s} {r['config']:24s} "
                  f"{(r['us'] or float('nan')):9.1f} us {tf} {r['status'] if r['status'] != 'ok' else ''}{mark}")
        print(flush=True)
        results.append({"kind": s.kind, "label": s.label(), "m": s.m, "n": s.n, "k": s.k,
                        "g": s.num_groups, "heuristic": pick, "anchor": anchor, "rows": rows})
        if best:
            h_us = heur["us"] if heur and heur["us"] else None
            table.append((s.kind, s.label(), pick, f"{h_us:.1f}" if h_us else "-", best["config"],
                          f"{best['us']:.1f}", f"{h_us / best['us']:.2f}" if h_us else "-",
                          f"{flops / best['us'] / 1e6:.0f}"))
    if args.json:
        Path(args.json).write_text(json.dumps({"num_sms": num_sms, "shapes": results}, indent=1))
    print_table("Forced-config sweep: heuristic pick vs best measured",
                ("kind", "shape", "heuristic", "µs", "best", "µs", "heur/best", "best TF"), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
