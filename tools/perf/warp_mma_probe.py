"""The warp-MMA decode kernel's variants beside the pick and DeepGEMM (one GPU call):

    python tools/perf/warp_mma_probe.py [--ms 1,8,16,32] [--reps 10] [--passes 2]
                                        [--deepgemm] [--flush write|read] [--json OUT]
                                        [--only REGEX]

For each DeepSeek-V3 (N, K) and each M, every variant (R, KS, RG, U) of
``cuda_src/fp8_gemm_warp_mma.cuh`` (16 * R weight rows per warp, KS warps
splitting K per slab, RG slabs per CTA, U K blocks loaded ahead per warp;
the token tile from M) is compiled, run on the same operands, checked
against the float64 reference (calc_diff < 1e-3, the decode bench's check)
and timed with CUPTI kernel durations after the benches' 256 MB L2 flush,
interleaved with cugemm8's pick and (``--deepgemm``) DeepGEMM's
``fp8_gemm_nt``.  ``--only`` keeps the variants whose label (``wm KSxRG rR
uU``) matches the regular expression (``re.search``).  Prints one row per shape: the pick, DeepGEMM, the fastest
variant and its ratio to the pick.  This script reports; it never asserts.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[1]))
sys.path.insert(1, str(_HERE.parents[1] / "benches"))

import common  # noqa: E402
from cugemm8._shapes import DEEPSEEK_NK  # noqa: E402
from cugemm8.cli import (Shape, bf16_to_f64, calc_diff, make_operands,  # noqa: E402
                         poisoned_out, print_table, reference)

HEADER = "fp8_gemm_warp_mma.cuh"
CHECK_LIMIT = 1e-3


def variants(k: int, tt: int) -> list[tuple[int, int, int, int]]:
    """(R, KS, RG, U) to try at this K and token tile: 128-512
    threads, KS <= K blocks, U no more than twice a warp's share of K
    blocks, and only register footprints that compile without spills (more
    than 256 threads leave <= 128 registers a thread: U = 2; R = 2 and
    16-32 tokens: U = 2)."""
    kb = -(-k // 128)
    out = []
    for r in (1, 2):
        for ks in (1, 2, 4, 7, 8, 14, 16, 28, 32):
            if ks > kb:
                continue
            for rg in (1, 2, 4, 8, 16):
                threads = 32 * ks * rg
                if not 128 <= threads <= 512:
                    continue
                per = -(-kb // ks)
                for u in (2, 4, 8):
                    if (threads > 256 or r > 1 or tt > 1) and u > 2:
                        continue
                    if u > 2 and u >= 2 * per:
                        continue
                    if r > 1 and threads > 256:
                        continue
                    out.append((r, ks, rg, u))
    return out


def select_variants(k: int, tt: int, only: str = "") -> list[tuple[int, int, int, int]]:
    """:func:`variants` whose :func:`label` matches the regular expression
    ``only`` (``re.search``; all of them when it is empty)."""
    rx = re.compile(only) if only else None
    return [v for v in variants(k, tt) if rx is None or rx.search(label(v))]


def kernel_name(n: int, k: int, tt: int, v) -> str:
    r, ks, rg, u = v
    return f"cugemm8::fp8_gemm_warp_mma_kernel<{n}, {k}, {tt}, {r}, {ks}, {rg}, {u}>"


def label(v) -> str:
    r, ks, rg, u = v
    return f"wm {ks}x{rg} r{r} u{u}"


def smem_bytes(tt: int, v) -> int:
    r, ks, rg, _ = v
    return rg * ks * r * tt * 16 * 8 * 4 if ks > 1 else 0


def launcher(kern, n, k, m, tt, v, a, sfa, b, sfb, out):
    from cugemm8 import gemm as G
    r, ks, rg, _ = v
    kb = -(-k // 128)
    slabs = -(-n // (16 * r))
    grid = -(-slabs // rg)
    ld_sfa = G._scale_pitch(sfa, m, kb)
    args = (np.uint32(m), np.uint32(kb), np.uint32(0), np.uint64(a.data.ptr), np.uint32(a.strides[0] if m > 1 else k),
            np.uint64(sfa.data.ptr), np.uint32(ld_sfa), np.uint64(b.data.ptr), np.uint32(b.strides[0]),
            np.uint64(sfb.data.ptr), np.uint64(out.data.ptr), np.uint32(out.strides[0] // 2 if m > 1 else n),
            np.uint32(0))                # shape_k_x: read by the float-A form only
    smem = smem_bytes(tt, v)

    def run():
        kern((grid,), (32 * ks * rg,), args, shared_mem=smem)
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ms", default="1,4,8")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--deepgemm", action="store_true")
    p.add_argument("--flush", choices=("write", "read"), default="write")
    p.add_argument("--shapes", default="", help="N,K pairs as NxK;NxK (default: the six)")
    p.add_argument("--json", default="")
    p.add_argument("--only", default="", help="keep the variants whose label ('wm KSxRG rR uU') matches")
    args = p.parse_args(argv)

    import cupy as cp
    import cugemm8
    from cugemm8 import _jit
    ms = [int(x) for x in args.ms.split(",") if x]
    nks = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(";") if s] or list(DEEPSEEK_NK[:6])
    flush = common.make_flush(args.flush)
    def chosen(k: int, tt: int) -> list:
        return select_variants(k, tt, args.only)
    dg = None
    if args.deepgemm:
        import deepgemm_anchor
        dg = deepgemm_anchor.open_for([(m, n, k) for m in ms for n, k in nks])

    jobs = {}
    for n, k in nks:
        for m in ms:
            tt = -(-m // 8)
            for v in chosen(k, tt):
                jobs[kernel_name(n, k, tt, v)] = smem_bytes(tt, v)
    failed = common.compile_kernels(jobs, lambda _name: HEADER)
    for name, why in failed.items():
        print(f"compile failed: {name}: {why}")

    rows, records = [], []
    for n, k in nks:
        for m in ms:
            tt = -(-m // 8)
            shape = Shape("normal", m, n, k)
            ops = make_operands(shape, cp, seed=m * 7 + n)
            ref, _ = reference(ops, shape, cp)
            sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
            fns, status = {}, {}

            def add(name, fn, got):
                try:
                    fn()
                    cp.cuda.runtime.deviceSynchronize()
                    d = calc_diff(got(), ref, cp)
                except Exception as exc:
                    status[name] = f"error {type(exc).__name__}: {exc}"[:80]
                    print(f"{m}x{n}x{k} {name}: {status[name]}", flush=True)
                    try:                # a kernel fault is sticky: the context is lost, stop here
                        cp.cuda.runtime.deviceSynchronize()
                    except Exception:
                        raise exc from None
                    return
                status[name] = "ok" if d < CHECK_LIMIT else f"FAIL {d:.1e}"
                if d < CHECK_LIMIT:
                    fns[name] = fn

            out = poisoned_out(shape, ops, cp)
            add("pick", lambda: cugemm8.gemm_fp8_fp8_bf16_nt((ops["a"], sfa), (ops["b"], ops["sfb"]), out),
                lambda: bf16_to_f64(out, cp))
            if dg is not None:
                try:
                    run = dg.gemm_nt(ops["a"], sfa, ops["b"], ops["sfb"])
                except Exception as exc:
                    status["deepgemm"] = f"error {type(exc).__name__}"
                else:           # add() reports its own errors and stops at a kernel fault
                    add("deepgemm", run, lambda: common.torch_to_f64(run.out, m))
            for v in chosen(k, tt):
                name = kernel_name(n, k, tt, v)
                if name in failed:
                    continue
                o = poisoned_out(shape, ops, cp)
                kern = _jit.get_kernel(HEADER, name, max_dynamic_smem=smem_bytes(tt, v))
                add(label(v),
                    launcher(kern, n, k, m, tt, v, ops["a"], sfa, ops["b"], ops["sfb"], o),
                    lambda o=o: bf16_to_f64(o, cp))
            times = {name: [] for name in fns}
            for _ in range(args.passes):
                for name, fn in fns.items():
                    t = common.kernel_times([fn], reps=args.reps, flush=flush)
                    times[name] += t.samples if t is not None else []
            med = {name: common.Timing(s).median for name, s in times.items() if s}
            bad = {name: st for name, st in status.items() if st != "ok"}
            rec = {"m": m, "n": n, "k": k, "pick": str(cugemm8.get_gemm_config("normal", m, n, k)),
                   "us": med, "bad": bad}
            records.append(rec)
            wm = {name: t for name, t in med.items() if name.startswith("wm ")}
            best = min(wm.items(), key=lambda kv: kv[1]) if wm else ("-", float("nan"))
            pk, dgt = med.get("pick"), med.get("deepgemm")
            rows.append((f"{m}x{n}x{k}", f"{pk:.2f}" if pk else status.get("pick"), f"{dgt:.2f}" if dgt else "-",
                         best[0], f"{best[1]:.2f}", f"{pk / best[1]:.3f}" if pk else "-",
                         f"{dgt / best[1]:.3f}" if dgt else "-", str(len(bad))))
            print(f"{m}x{n}x{k}: " + "  ".join(f"{nm} {t:.2f}" for nm, t in sorted(med.items(), key=lambda kv: kv[1])),
                  flush=True)
            if bad:
                print(f"  not ok: {bad}", flush=True)
            common.release_memory()
    if args.json:
        Path(args.json).write_text(json.dumps({"flush": args.flush, "records": records}, indent=1))
    print_table(f"warp-MMA variants (CUPTI µs, L2 flushed by a {args.flush})",
                ("shape", "pick", "DeepGEMM", "best variant", "µs", "pick/best", "DG/best", "bad"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
