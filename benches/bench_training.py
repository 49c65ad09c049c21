"""The 1D1D (FP32-out) GEMMs of FP8 training, beside DeepGEMM in one process (one GPU call).

    python benches/bench_training.py [--tokens 4096] [--reps 10] [--deepgemm]
                                     [--configs 128x128,256x128,...] [--json OUT]

Rows:

* **wgrad**: ``cugemm8.fp8_gemm_nt`` with FP32 ``d`` for the weight
  gradient ``dW [N, K] = dY^T X`` of each DeepSeek-V3 linear layer (the six
  (N, K) pairs), K = ``--tokens`` tokens: D ``[N, K_in]`` over ``tokens``,
  accumulated in place (``c = d``, gradient accumulation), DeepGEMM's
  ``fp8_gemm_nt(..., c=d, recipe=(1, 1, 128))`` on the same bytes;
* **k-grouped**: ``cugemm8.k_grouped_fp8_gemm_nt_contiguous`` on DeepGEMM's
  ``enumerate_k_grouped_contiguous`` sizes (tests/generators.py: groups,
  m, n, mean tokens per group, per-group tokens drawn in [0.7, 1.3]x and
  aligned to 128), in place; DeepGEMM's kernel on its own group-by-group
  copy of the same operands (``benches/deepgemm_anchor.py``).

``--configs`` also times each listed BLOCK_MxBLOCK_N (as many stages as fit;
a ``t`` suffix, e.g. ``128x160t``, takes the TMA epilogue) on every shape,
with ``c = d`` and without ``c``, each checked bit for bit against the
heuristic's output first (every config promotes the same blocks in the same
order), and prints the fastest per shape.

The wgrad rows also time cuBLASLt's blockwise FP8 GEMM with 1x128 scales on
both operands (torch's ``F.scaled_mm``, ``BlockWise1x128`` twice; BF16 out,
so compared with cugemm8 at BF16 precision: ``common.torch_blockwise_1x128_gemm``)
where torch supports it.  cuBLASLt accumulates into nothing, so ``xcuBLASLt``
is taken against cugemm8's own run without ``c`` (the ``no c`` column: D
written, not read; cuBLASLt still writes half the bytes, BF16).  cuBLASLt
has no grouped form of this mode: the k-grouped rows have no such column.

Times: CUPTI kernel durations (torch.profiler), 256 MB L2 flush before each
repetition, median; TFLOPS = 2 m n k / time.  Each output is checked first:
cugemm8 against a float64 product on the GPU (calc_diff), DeepGEMM against
cugemm8.  Reports; never asserts.  With ``--deepgemm``, put DeepGEMM on
PYTHONPATH (``../shared/anchors/README.md``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(1, str(_HERE.parent))

import numpy as np  # noqa: E402

import common  # noqa: E402
from cugemm8._shapes import DEEPSEEK_NK  # noqa: E402
from cugemm8.cli import print_table  # noqa: E402

K_GROUPED = ((4, 4096, 7168, 8192), (4, 7168, 2048, 8192), (8, 4096, 7168, 4096), (8, 7168, 2048, 4096),
             (16, 4096, 7168, 2048), (16, 7168, 2048, 2048))


def _operands(cp, rng, m, n, k):
    from tests import gpu_helpers as H
    kb = -(-k // 128)
    return (H.random_fp8(cp, rng, (m, k)), H.random_scales(cp, rng, (m, kb)),
            H.random_fp8(cp, rng, (n, k)), H.random_scales(cp, rng, (n, kb)))


def _ref(cp, a, sfa, b, sfb):
    from tests import gpu_helpers as H
    return H.dequant_lhs(cp, a, sfa) @ H.dequant_lhs(cp, b, sfb).T


def _time(fn, reps, flush):
    t = common.kernel_times([fn], reps=reps, flush=flush)
    if t is None:
        t = common.time_call(fn, reps=reps, warmup=2, flush=flush)
    return t.median


def _checked_time(name, build, output, product, reps, flush, limit=float("inf")):
    """Build another library's callable (``build()``), run it once, compare
    ``output(result)`` with cugemm8's ``product`` (calc_diff), and time it
    when the difference is below ``limit``: ``(µs or None, status suffix)``.
    Any exception becomes the status (a bench reports; it never dies)."""
    import cupy as cp
    try:
        run = build()
        got = output(run())
        cp.cuda.runtime.deviceSynchronize()
        diff = common_calc_diff(cp, got, product)
        us = _time(run, reps, flush) if diff < limit else None
        return us, f"; {name} calc_diff {diff:.1e}"
    except Exception as exc:
        return None, f"; {name} {type(exc).__name__}: {exc}"[:80]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--deepgemm", action="store_true")
    p.add_argument("--configs", default="", help="BMxBN tiles to time on every shape too")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from cugemm8 import _device
    reason = _device.gpu_unavailable_reason()
    if reason is not None:
        print(f"no usable Hopper GPU ({reason}): nothing to time")
        return 2
    import cupy as cp
    import cugemm8
    flush = common.L2Flush()
    dg = None
    if args.deepgemm:
        import deepgemm_anchor
        if deepgemm_anchor.load()[0] is None:
            print(deepgemm_anchor.load()[1])
        else:
            dg = deepgemm_anchor
    rng = np.random.default_rng(0)
    rows, records = [], []
    from cugemm8 import _config_1d1d as C1, gemm_1d1d as G1
    forced, sweeps = [], {}
    for t in (x for x in args.configs.split(",") if x):
        tma = t.endswith("t")
        bm, bn = (int(v) for v in t.rstrip("t").split("x"))
        st = C1.max_stages(bm, bn, tma_store=tma)
        if st and C1._registers_ok(bm, bn) and (not tma or C1.tma_store_ok(bn)):
            forced.append((bm, bn, st, tma))
        else:
            print(f"skipping {t}: not legal")

    def sweep(label, call, out, product):
        """Time every --configs tile on one shape, with c = d and without c:
        {config: (µs with c, µs without)} (checked first)."""
        res = {}
        for bm, bn, st, tma in forced:
            cfg = C1.make_config(bm, bn, st, cugemm8.get_num_sms(), tma)
            with G1._forced_config(cfg):
                out[...] = 0
                call(False)
                cp.cuda.runtime.deviceSynchronize()
                if not bool(cp.all(out.view(cp.uint32) == product.view(cp.uint32))):
                    res[str(cfg)] = "not bit-identical"
                    continue
                res[str(cfg)] = (_time(lambda: call(True), args.reps, flush),
                                 _time(lambda: call(False), args.reps, flush))
        sweeps[label] = res
        ok = {c: t for c, t in res.items() if not isinstance(t, str)}
        if ok:
            best = min(ok, key=lambda c: ok[c][0])
            best_no_c = min(ok, key=lambda c: ok[c][1])
            print(f"  {label}: " + ", ".join(f"{c} {t if isinstance(t, str) else f'{t[0]:.1f}/{t[1]:.1f}'}"
                                           for c, t in res.items())
                  + f"  -> best {best} (c = d), {best_no_c} (no c)", flush=True)
        return res

    def record(kind, label, flops, cfg, ours, theirs, status, cublaslt=None, ours_no_c=None):
        rec = {"kind": kind, "shape": label, "config": cfg, "us": ours, "deepgemm_us": theirs,
               "cublaslt_us": cublaslt, "no_c_us": ours_no_c,
               "tflops": flops / ours / 1e6 if ours else None, "status": status}
        records.append(rec)
        rows.append((kind, label, cfg, f"{ours:.1f}" if ours else "-", f"{rec['tflops']:.0f}" if ours else "-",
                     f"{theirs:.1f}" if theirs else "-", f"{theirs / ours:.2f}" if ours and theirs else "-",
                     f"{ours_no_c:.1f}" if ours_no_c else "-",
                     f"{cublaslt / ours_no_c:.2f}" if ours_no_c and cublaslt else
                     ("n/a" if kind == "k-grouped" else "-"), status))

    for n_out, k_in in DEEPSEEK_NK[:6]:
        m, n, k = n_out, k_in, args.tokens
        a, sfa, b, sfb = _operands(cp, rng, m, n, k)
        sfa, sfb = cugemm8.get_col_major_tma_aligned_tensor(sfa), cugemm8.get_col_major_tma_aligned_tensor(sfb)
        d = cp.zeros((m, n), cp.float32)
        cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d)
        ref = _ref(cp, a, sfa, b, sfb)
        diff = common_calc_diff(cp, d, ref)
        status = "ok" if diff < 1e-5 else f"FAIL {diff:.1e}"
        del ref
        product = d.copy()
        ours = _time(lambda: cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d, c=d), args.reps, flush)
        d_no_c = cp.empty_like(d)
        ours_no_c = _time(lambda: cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d_no_c), args.reps, flush)
        del d_no_c
        theirs = None
        if dg is not None:
            d_dg = cp.zeros_like(d)
            theirs, note = _checked_time("DG", lambda: dg.gemm_nt_1d1d(a, sfa, b, sfb, d_dg), lambda _: d_dg,
                                         product, args.reps, flush)
            status += note
        if forced:
            sweep(f"{m}x{n}x{k}", lambda c: cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d, c=d if c else None),
                  d, product)
        lt, note = _checked_time("cuBLASLt", lambda: common.torch_blockwise_1x128_gemm(a, sfa, b, sfb),
                                 lambda out: common.torch_to_f64(out, m)[:, :n], product, args.reps, flush,
                                 limit=1e-4)
        status += note
        cfg = str(cugemm8.get_gemm_1d1d_config(m, n, k, with_c=True))
        record("wgrad", f"{m}x{n}x{k}", 2 * m * n * k, cfg, ours, theirs, status, lt, ours_no_c)
        common.release_memory()

    for g, m, n, k_mean in K_GROUPED:
        ks = [int(round(k_mean * f / 128)) * 128 for f in rng.uniform(0.7, 1.3, g)]
        kt = sum(ks)
        a, sfa, b, sfb = _operands(cp, rng, m, n, kt)
        sfa_t, sfb_t = cugemm8.get_col_major_tma_aligned_tensor(sfa), cugemm8.get_col_major_tma_aligned_tensor(sfb)
        kst = cp.asarray(np.asarray(ks, np.int32))
        d = cp.zeros((g, m, n), cp.float32)
        cugemm8.k_grouped_fp8_gemm_nt_contiguous((a, sfa_t), (b, sfb_t), d, ks, kst)
        # check two groups against float64
        off, worst = 0, 0.0
        for e, ke in enumerate(ks[:2]):
            ref = _ref(cp, a[:, off:off + ke], sfa[:, off // 128:(off + ke) // 128],
                       b[:, off:off + ke], sfb[:, off // 128:(off + ke) // 128])
            worst = max(worst, common_calc_diff(cp, d[e], ref))
            off += ke
        status = "ok" if worst < 1e-5 else f"FAIL {worst:.1e}"
        product = d.copy()
        ours = _time(lambda: cugemm8.k_grouped_fp8_gemm_nt_contiguous((a, sfa_t), (b, sfb_t), d, ks, kst, c=d),
                     args.reps, flush)
        theirs = None
        if dg is not None:
            d_dg = cp.zeros_like(d)
            theirs, note = _checked_time("DG", lambda: dg.k_grouped_1d1d(a, sfa, b, sfb, ks, d_dg),
                                         lambda _: d_dg, product, args.reps, flush)
            status += note
        if forced:
            sweep(f"{g}x{m}x{n}x{kt}", lambda c: cugemm8.k_grouped_fp8_gemm_nt_contiguous(
                (a, sfa_t), (b, sfb_t), d, ks, kst, c=d if c else None), d, product)
        cfg = str(cugemm8.get_gemm_1d1d_config(m, n, kt, num_groups=g, with_c=True))
        record("k-grouped", f"{g}x{m}x{n}x{kt}", 2 * m * n * kt, cfg, ours, theirs, status)
        common.release_memory()

    print_table("1D1D GEMMs (FP32 out, c = d; CUPTI µs)",
                ("kind", "shape", "config", "µs", "TFLOPS", "DeepGEMM µs", "xDG", "no c µs", "xcuBLASLt", "check"),
                rows)
    x = [r["deepgemm_us"] / r["us"] for r in records if r["us"] and r["deepgemm_us"]]
    if x:
        print(f"geomean xDeepGEMM {common.geomean(x):.3f} over {len(x)} (min {min(x):.2f})")
    x = [r["cublaslt_us"] / r["no_c_us"] for r in records if r.get("no_c_us") and r.get("cublaslt_us")]
    if x:
        print(f"geomean xcuBLASLt (1x128 x 1x128, BF16 out; against cugemm8 without c) "
              f"{common.geomean(x):.3f} over {len(x)} (min {min(x):.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": records, "sweeps": sweeps} if sweeps else records, indent=1))
    return 0


def common_calc_diff(cp, x, y):
    from tests import gpu_helpers as H
    return H.calc_diff(cp, x, y)


if __name__ == "__main__":
    sys.exit(main())
