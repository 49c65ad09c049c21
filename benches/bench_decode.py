"""Decode-sized normal GEMMs: M = 1 ... 128 on the six DeepSeek-V3 weight shapes.

    python benches/bench_decode.py [--ms 1,2,4,8,16,32,64,128] [--reps 30] [--passes 2]
                                   [--deepgemm] [--sweep 1,8,32,64,128] [--sweep-kind full|multicast]
                                   [--flush write|read] [--nk 576x7168,...] [--json OUT]

Per (M, N, K) (the six DeepSeek-V3 (N, K) pairs, or ``--nk``'s), from one process: the config cugemm8 picks; its kernel time
(CUPTI through torch.profiler when torch is installed, else CUDA events),
median over ``--passes`` interleaved passes of ``--reps`` repetitions, a
256 MB L2 flush before each (``--flush write``, the default and DeepGEMM's
method, leaves L2 full of dirty lines; ``read`` leaves it clean:
``common.make_flush``); bytes per second (A + B + D + scales over the
time) against a device-to-device copy measured in the same run; and, timed
in the same passes on the same bytes, DeepGEMM's ``fp8_gemm_nt``
(``--deepgemm``: put DeepGEMM on PYTHONPATH, ``../shared/anchors/README.md``)
and cuBLASLt's blockwise FP8 through torch (M % 4 == 0 only; cuBLASLt
rejects the rest).  Every library's output is checked against the float64
reference first (calc_diff < 1e-3); a failing one is reported, not timed.

Targets (issue 18): every shape >= 1.0x DeepGEMM, geomean >= 1.15x; for
every (N, K) the time at any M <= 64 within 2 % of M = 64; bytes/s >= 60 %
of the copy in geomean over M <= 128, no shape below 40 %.

``--sweep`` also times forced configurations at the listed M (BLOCK_M 64 and
128 tiles over the BLOCK_N candidates, with and without split K, BLOCK_M 64
with one and with two math warpgroups, plus tune's candidates from the cost
model's top 6), each checked first, to judge the heuristic;
``--sweep-kind multicast`` times only the pick's TMA-multicast twins (A or
B multicast in clusters of 2).
This script reports; it never asserts.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(1, str(_HERE.parent))

import common  # noqa: E402
from cugemm8 import _shapes  # noqa: E402
from cugemm8._shapes import DEEPSEEK_NK  # noqa: E402
from cugemm8.cli import (Shape, bf16_to_f64, calc_diff, gemm_bytes,  # noqa: E402
                         make_operands, poisoned_out, print_table, reference)

DECODE_MS = _shapes.DECODE_MS
CHECK_LIMIT = 1e-3


def _timer(fn, reps, flush):
    t = common.kernel_times([fn], reps=reps, flush=flush)
    if t is None:
        t = common.time_call(fn, reps=reps, warmup=2, flush=flush)
    return t


def sweep_candidates(shape: Shape, num_sms: int) -> list:
    """Forced configs for one decode shape (see the module docstring)."""
    import sweep_configs
    found = []
    for bm, bns in ((64, (16, 24, 32, 48, 64, 96, 128)), (128, (32, 64, 128))):
        if bm == 128 and shape.m <= 64:
            continue
        for bn in bns:
            for splits in (1, 2):
                for wgs in (2, 1) if bm == 64 else (2,):
                    cfg = sweep_configs.forced_config(shape, bm, bn, 16, num_sms, splits=splits, wgs=wgs)
                    if cfg is not None:
                        found.append(cfg)
    return sweep_configs.unique_configs(found + sweep_configs.candidates(shape, 6, num_sms))


def multicast_candidates(shape: Shape, num_sms: int) -> list:
    """The pick's TMA-multicast twins (clusters of 2, A multicast, and B
    multicast where the pick has at least two M blocks to pair; a split-K
    pick's tile without the split, since a cluster either splits K or
    multicasts), for ``--sweep-kind multicast``."""
    import cugemm8
    import sweep_configs
    from cugemm8 import _tune
    pick = cugemm8.get_gemm_config("normal", shape.m, shape.n, shape.k)
    found = [sweep_configs.forced_config(shape, pick.block_m, pick.block_n, pick.num_stages, num_sms,
                                         wgs=pick.num_math_warpgroups)] if pick.num_k_splits > 1 else []
    m_blocks = -(-shape.m // pick.block_m)
    for on_a in (True, False):
        if not on_a and m_blocks < 2:
            continue            # one M block: a B-multicast pair would have no partner tile
        found.append(_tune.forced_config("normal", shape.m, shape.n, shape.k, 1, pick.block_m, pick.block_n,
                                         pick.num_stages, num_sms, mc=2, on_a=on_a, splits=1,
                                         wgs=pick.num_math_warpgroups))
    return sweep_configs.unique_configs([c for c in found if c is not None])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_run_args(p, DECODE_MS, dg_help="time DeepGEMM (importable deep_gemm) beside")
    p.add_argument("--sweep", default="", help="M values at which to time forced configs too")
    p.add_argument("--flush", choices=("write", "read"), default="write",
                   help="L2 flush before each repetition: a 256 MB write (dirty lines, DeepGEMM's "
                        "method) or read (clean lines)")
    p.add_argument("--nk", default="",
                   help="(N, K) pairs to time instead of the six DeepSeek-V3 ones, e.g. 576x7168,1536x7168")
    p.add_argument("--sweep-kind", choices=("full", "multicast"), default="full",
                   help="full: the candidates above; multicast: only the pick's multicast twins")
    args = p.parse_args(argv)
    nks = common.parse_nk(p, args.nk) if args.nk else DEEPSEEK_NK[:6]

    from cugemm8 import _device, gemm as G
    reason = _device.gpu_unavailable_reason()
    if reason is not None:
        print(f"no usable Hopper GPU ({reason}): nothing to time")
        return 2
    import cupy as cp
    import cugemm8
    ms = [int(x) for x in args.ms.split(",") if x]
    sweep_ms = {int(x) for x in args.sweep.split(",") if x}
    num_sms = cugemm8.get_num_sms()
    sweep_of = multicast_candidates if args.sweep_kind == "multicast" else sweep_candidates
    copy_gbps = common.copy_bandwidth_gbps()
    flush = common.make_flush(args.flush)
    torch, torch_api = common.load_torch()
    dg = None
    if args.deepgemm:
        import deepgemm_anchor
        dg = deepgemm_anchor.open_for([(m, n, k) for m in ms for n, k in nks])

    # Compile every kernel first, in parallel (NVRTC releases the GIL).
    jobs = {}
    for n, k in nks:
        for m in ms:
            shape = Shape("normal", m, n, k)
            cfgs = [cugemm8.get_gemm_config("normal", m, n, k)]
            if m in sweep_ms:
                cfgs += sweep_of(shape, num_sms)
            for cfg in cfgs:
                jobs[G._kernel_name(cfg, n, k, 0, 1)] = cfg.smem_bytes
    for name, why in common.compile_kernels(jobs, G._header_of).items():
        print(f"compile failed: {name}: {why}")

    rows, records = [], []
    for n, k in nks:
        for m in ms:
            shape = Shape("normal", m, n, k)
            ops = make_operands(shape, cp, seed=m * 7 + n)
            ref, _ = reference(ops, shape, cp)
            sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
            nbytes = gemm_bytes(m, n, k)
            entries = {}                            # name -> (callable, status)

            def add(name, fn, got):
                fn()
                cp.cuda.runtime.deviceSynchronize()
                d = calc_diff(got(), ref, cp)
                entries[name] = (fn, "ok" if d < CHECK_LIMIT else f"FAIL {d:.1e}")

            cfg = cugemm8.get_gemm_config("normal", m, n, k)
            out = poisoned_out(shape, ops, cp)
            add("cugemm8", lambda: cugemm8.gemm_fp8_fp8_bf16_nt((ops["a"], sfa), (ops["b"], ops["sfb"]), out),
                lambda: bf16_to_f64(out, cp))
            if dg is not None:
                try:
                    run = dg.gemm_nt(ops["a"], sfa, ops["b"], ops["sfb"])
                    add("deepgemm", run, lambda: common.torch_to_f64(run.out, m))
                except Exception as exc:
                    entries["deepgemm"] = (None, f"error {type(exc).__name__}: {exc}"[:80])
            if torch is not None and m % 4 == 0:
                try:
                    tb = common.torch_blockwise_gemm(ops["a"], ops["sfa"], ops["b"], ops["sfb"])
                    res = {}

                    def run_tb(tb=tb, res=res):
                        res["o"] = tb()
                    add("cublaslt", run_tb, lambda: common.torch_to_f64(res["o"], m))
                except Exception as exc:
                    entries["cublaslt"] = (None, f"error {type(exc).__name__}"[:80])
            forced = {}
            if m in sweep_ms:
                for c in sweep_of(shape, num_sms):
                    o = poisoned_out(shape, ops, cp)
                    launcher = G._prepare_launch(c, "normal", n, k, 1, m, m, ops["a"], sfa, ops["b"],
                                                 ops["sfb"], o, None, 1)
                    launcher()
                    cp.cuda.runtime.deviceSynchronize()
                    if calc_diff(bf16_to_f64(o, cp), ref, cp) < CHECK_LIMIT:
                        forced[str(c)] = launcher
            times = {name: [] for name, (fn, st) in entries.items() if fn is not None and st == "ok"}
            ftimes = {name: [] for name in forced}
            for _ in range(args.passes):
                for name in times:
                    times[name] += _timer(entries[name][0], args.reps, flush).samples
                for name, fn in forced.items():
                    ftimes[name] += _timer(fn, max(10, args.reps // 2), flush).samples
            med = {name: common.Timing(s).median for name, s in times.items() if s}
            rec = {"m": m, "n": n, "k": k, "config": str(cfg), "bytes": nbytes, "copy_gbps": copy_gbps,
                   "status": {name: st for name, (_, st) in entries.items()}, "us": med,
                   "forced_us": {name: common.Timing(s).median for name, s in ftimes.items() if s}}
            records.append(rec)
            cg = med.get("cugemm8")
            dgt = med.get("deepgemm")
            cb = med.get("cublaslt")
            best = min(rec["forced_us"].items(), key=lambda kv: kv[1]) if rec["forced_us"] else None
            rows.append((f"{m}x{n}x{k}", str(cfg), f"{cg:.2f}" if cg else entries["cugemm8"][1],
                         f"{dgt:.2f}" if dgt else entries.get("deepgemm", (0, "-"))[1][:12],
                         f"{dgt / cg:.2f}" if cg and dgt else "-",
                         f"{cb / cg:.2f}" if cg and cb else "-",
                         f"{100 * nbytes / (cg * 1e3) / copy_gbps:.0f}" if cg else "-",
                         f"{best[0]} {best[1]:.2f}" if best else ""))
            common.release_memory()
    if args.json:
        Path(args.json).write_text(json.dumps({"copy_gbps": copy_gbps, "torch": common.torch_version(),
                                               "flush": args.flush, "records": records}, indent=1))
    print_table(f"decode GEMMs (copy {copy_gbps:.0f} GB/s; times {'CUPTI' if torch else 'events'} µs; "
                f"L2 flushed by a {args.flush})",
                ("shape", "config", "cugemm8", "DeepGEMM", "xDG", "xcuBLASLt", "% copy", "best forced"),
                rows)
    summary(records)
    return 0


def summary(records) -> None:
    """Geomeans against the issue's targets."""
    x_dg = [r["us"]["deepgemm"] / r["us"]["cugemm8"] for r in records
            if "deepgemm" in r["us"] and "cugemm8" in r["us"]]
    x_cb = [r["us"]["cublaslt"] / r["us"]["cugemm8"] for r in records
            if "cublaslt" in r["us"] and "cugemm8" in r["us"]]
    frac = [r["bytes"] / (r["us"]["cugemm8"] * 1e3) / r["copy_gbps"] for r in records if "cugemm8" in r["us"]]
    flat = []
    by_nk = {}
    for r in records:
        if "cugemm8" in r["us"]:
            by_nk.setdefault((r["n"], r["k"]), {})[r["m"]] = r["us"]["cugemm8"]
    for nk, t in by_nk.items():
        if 64 in t:
            flat.append(max(v for m, v in t.items() if m <= 64) / t[64])
    print(f"geomean xDeepGEMM {common.geomean(x_dg):.3f} over {len(x_dg)} (min {min(x_dg, default=float('nan')):.2f}); "
          f"xcuBLASLt {common.geomean(x_cb):.3f}; % copy geomean {100 * common.geomean(frac):.1f} "
          f"(min {100 * min(frac, default=float('nan')):.1f}); worst max(M<=64)/M=64 "
          f"{max(flat, default=float('nan')):.3f}")


if __name__ == "__main__":
    sys.exit(main())
