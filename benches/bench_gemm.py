"""Benchmark cugemm8's FP8 GEMMs on the DeepSeek-V3 shapes.

    python benches/bench_gemm.py [--kinds normal,contiguous,masked] [--quick]
                                 [--m1] [--reps 40] [--deepgemm] [--energy ROUNDS]
                                 [--json OUT] [--plot OUT.png]
    python benches/bench_gemm.py --from-json OUT [--plot OUT.png]   # re-render, no GPU

Per shape: the chosen config; two kernel times, each the median of --reps
repetitions with a 256 MB L2 flush before each: CUDA events around the launch
("µs ev", which also counts the GPU's ~3 µs launch latency) and, when torch is
installed, the CUPTI kernel duration through torch.profiler ("µs", DeepGEMM's
bench_kineto method, the one its anchor figures use); TFLOPS (2MNK/t), GB/s
(A + B + D + SFA + SFB over t) and its share of the device-to-device copy
rate measured in the same run, from the CUPTI time when there is one; a
calc_diff check against a float64 reference; the cuBLASLt blockwise-FP8
baseline through PyTorch in the same run (checked too; 'wrong' results are
excluded), timed both ways, each ratio taken between like times; DeepGEMM's
H200 figure and the 1.10x target from docs/benchmarks.md.  Geometric means
close the report.

``--energy ROUNDS`` then prints the energy table of the M = 4096 normal
shapes from the same process (benches/bench_energy.py: J per GEMM, W,
TFLOPS per watt and the SM clock over sustained 1 s loops, alternating the
libraries ROUNDS times; issue 20).

``--deepgemm`` times DeepGEMM itself in the same run instead of quoting its
figure (put DeepGEMM v2.6.1 on PYTHONPATH: ../shared/anchors/README.md):
for every kind, on the same bytes (benches/deepgemm_anchor.py: ``fp8_gemm_nt``,
``m_grouped_fp8_gemm_nt_contiguous``, ``m_grouped_fp8_gemm_nt_masked``, the
same expected_m), its kernels prewarmed in parallel processes first, its
output checked against the same float64 reference (valid rows only) and
then timed right after cugemm8's with the same two timers and flush; the
table then shows its time and cugemm8's speed-up over it (its time over
cugemm8's, like timer with like: > 1 means cugemm8 is faster) in place of
the H200 figure, and the summary its geomean, minimum and the shapes below
1.0 and below the 1.10x target.  When DeepGEMM is not usable the run says
why and goes on without it.

Test data: see :mod:`cugemm8.cli` (block-varied normal values quantised per
1x128 / 128x128 block, amax / 448 scales).  Grouped shapes use exactly M rows
per group (contiguous: 128-aligned, no padding rows; masked: masked_m = m_max).
This script reports; it never asserts.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
if (_HERE.parent / "cugemm8").is_dir() and str(_HERE.parent) not in sys.path:
    sys.path.insert(1, str(_HERE.parent))          # benchmark the checkout it lives in

from cugemm8 import _shapes  # noqa: E402
from cugemm8._shapes import DEEPSEEK_NK  # noqa: E402
from cugemm8.cli import (Shape, bf16_to_f64, calc_diff, config_string,  # noqa: E402
                         gemm_bytes, gemm_call, make_operands, poisoned_out, print_table,
                         reference, valid_rows)
from cugemm8.cli import _group_parts as group_parts  # noqa: E402

PEAK_TFLOPS = 1979.0                  # H200 dense FP8 tensor-core peak
TARGET_FACTOR = 1.10
CHECK_LIMIT = 1e-3

# The tables live in cugemm8._shapes (also `cugemm8 tune --shapes @normal /
# @grouped`).  MASKED_DECODE: decode-sized masked GEMMs (expected_m <= 64
# rows per expert: issue 5's "bandwidth-bound at >= 75 % of copy" case; no
# DeepGEMM anchor).
NORMAL_MS = _shapes.NORMAL_MS
CONTIGUOUS = _shapes.CONTIGUOUS_TABLE
MASKED = _shapes.MASKED_TABLE[:6]
MASKED_DECODE = _shapes.MASKED_TABLE[6:]

#: DeepGEMM v2.6.1 on an H200, TFLOPS (docs/benchmarks.md, anchor 1),
#: keyed by (kind, G, M, N, K) with M per group for grouped kinds.
_DG_NORMAL = {64: (194, 294, 239, 373, 278, 236),
              128: (355, 566, 412, 695, 543, 411),
              4096: (1313, 1337, 1082, 1471, 1365, 1295)}
DEEPGEMM_H200 = {("normal", 1, m, n, k): tf
                 for m, row in _DG_NORMAL.items() for (n, k), tf in zip(DEEPSEEK_NK[:6], row)}
DEEPGEMM_H200.update({("contiguous",) + s: tf for s, tf in zip(CONTIGUOUS, (1375, 1326, 1331, 1328))})
DEEPGEMM_H200.update({("masked",) + s: tf for s, tf in zip(MASKED, (1185, 848, 1266, 906, 1060, 841))})


# ----------------------------------------------------------------------------
# Shapes
# ----------------------------------------------------------------------------

def bench_shapes(kinds, quick: bool, m1: bool) -> list[Shape]:
    """The shapes to run, in report order."""
    if quick:
        normal = [Shape("normal", m, n, k) for m, n, k in
                  ((64, 2112, 7168), (128, 7168, 2048), (4096, 4096, 7168))]
        contiguous = [Shape("contiguous", 4096, 7168, 2048, 8)]
        masked = [Shape("masked", 256, 7168, 2048, 4)]
    else:
        ms = ((1,) if m1 else ()) + NORMAL_MS
        normal = [Shape("normal", m, n, k) for m in ms for n, k in DEEPSEEK_NK]
        contiguous = [Shape("contiguous", m, n, k, g) for g, m, n, k in CONTIGUOUS]
        masked = [Shape("masked", m, n, k, g) for g, m, n, k in MASKED + MASKED_DECODE]
    table = {"normal": normal, "contiguous": contiguous, "masked": masked}
    return [s for kind in kinds for s in table[kind]]


def anchor_tflops(shape: Shape):
    return DEEPGEMM_H200.get((shape.kind, shape.num_groups, shape.m, shape.n, shape.k))


# ----------------------------------------------------------------------------
# Measuring one shape
# ----------------------------------------------------------------------------

def _groups(shape: Shape, ops: dict) -> list[tuple]:
    """(a, sfa, b, sfb, rows of D) per group, for the per-group baseline."""
    a, sfa, b, sfb = ops["a"], ops["sfa"], ops["b"], ops["sfb"]
    if shape.kind == "normal":
        return [(a, sfa, b, sfb, slice(None))]
    return [(a[rows], sfa[rows], b[g], sfb[g], rows) for rows, g in group_parts(ops, shape)]


def check_f64(ops: dict, got, ref, cp) -> tuple[str, float]:
    """('ok' | 'FAIL', calc_diff) of a float64 output like D against the
    reference, over the valid rows only (``ops['valid']``: contiguous
    padding rows and masked rows past masked_m left out)."""
    valid = ops["valid"]
    diff = calc_diff(got[valid], ref[valid], cp)
    return ("ok" if diff < CHECK_LIMIT else "FAIL"), diff


def check_cugemm8(shape: Shape, ops: dict, out, ref, cp) -> tuple[str, float]:
    """('ok' | 'FAIL', calc_diff) of cugemm8's output against the reference."""
    return check_f64(ops, bf16_to_f64(out, cp), ref, cp)


def warm_specs(shapes: list[Shape]) -> list[tuple]:
    """:func:`deepgemm_anchor.warm_spec` entries for the shapes (masked:
    expected_m = m_max, the hint cugemm8 gets too)."""
    out = []
    for s in shapes:
        if s.kind == "normal":
            out.append((s.m, s.n, s.k))
        else:
            out.append((s.kind, s.m, s.n, s.k, s.num_groups) + ((s.m,) if s.kind == "masked" else ()))
    return out


def _error_text(exc: BaseException, limit: int = 200) -> str:
    """'TypeName: message' of ``exc`` on one line (whitespace runs collapsed),
    cut to ``limit`` characters: the form every status cell of the report takes."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:limit]


def deepgemm_call(shape: Shape, ops: dict, dg):
    """DeepGEMM's callable for ``shape`` on cugemm8's operands ``ops`` (the
    same bytes; ``run.out`` its torch bf16 output like D)."""
    a, sfa, b, sfb = ops["a"], ops["sfa"], ops["b"], ops["sfb"]
    if shape.kind == "normal":
        return dg.gemm_nt(a, sfa, b, sfb)
    if shape.kind == "contiguous":
        return dg.grouped_contiguous(a, sfa, b, sfb, ops["m_indices"])
    return dg.grouped_masked(a, sfa, b, sfb, ops["masked_m"], shape.m)


def measure_deepgemm(shape: Shape, ops: dict, ref, args, flush, dg, cp, ours=None) -> dict:
    """DeepGEMM on the same operands (``--deepgemm``; ``dg`` is
    :mod:`deepgemm_anchor`, or None: nothing measured): its output, NaN
    before the first call, checked against ``ref`` over the valid rows, then
    timed like cugemm8 (CUDA events and CUPTI, same reps and flush).  With
    ``ours`` (cugemm8's call) both are then timed once more in one CUPTI
    sequence that alternates the two (:func:`common.kernel_times_alternating`):
    the sequential timings put DeepGEMM's repetitions after cugemm8's, the
    alternating one gives both the same clock history.
    Returns dg_status ('ok', 'FAIL <diff>' or 'error: ...'), dg_diff,
    dg_first_call_s, dg_us, dg_spread, dg_kus and, alternating, alt_kus /
    dg_alt_kus."""
    import common
    if dg is None:
        return {}
    res = {"dg_us": None, "dg_kus": None}
    try:
        run = deepgemm_call(shape, ops, dg)
        run.out.fill_(float("nan"))
        t0 = time.perf_counter()
        run()
        cp.cuda.runtime.deviceSynchronize()
        res["dg_first_call_s"] = time.perf_counter() - t0
        got = common.torch_to_f64(run.out, run.out.shape[0])
        status, res["dg_diff"] = check_f64(ops, got, ref, cp)
        del got
        if status != "ok":
            res["dg_status"] = f"FAIL {res['dg_diff']:.1e}"
            return res
        timing = common.time_call(run, reps=args.reps, warmup=args.warmup, flush=flush)
        res["dg_us"], res["dg_spread"] = timing.median, timing.spread
        kt = common.kernel_times([run], reps=args.reps, flush=flush)
        res["dg_kus"] = kt.median if kt else None
        res["dg_status"] = "ok"
    except Exception as exc:
        res["dg_status"] = "error: " + _error_text(exc)
        return res
    if ours is not None:
        res.update(alternating_times(ours, run, args, flush))
    return res


def alternating_times(ours, theirs, args, flush) -> dict:
    """``alt_kus`` (cugemm8) and ``dg_alt_kus`` (DeepGEMM): the medians of
    one CUPTI sequence alternating the two calls
    (:func:`common.kernel_times_alternating`); ``alt_error`` instead when it
    fails, which leaves the sequential timings standing."""
    import common
    try:
        alt = common.kernel_times_alternating({"cugemm8": ours, "deepgemm": theirs}, reps=args.reps, flush=flush)
    except Exception as exc:
        return {"alt_error": _error_text(exc)}
    if alt is None:
        return {}
    return {"alt_kus": alt["cugemm8"].median, "dg_alt_kus": alt["deepgemm"].median}


def measure_baseline(shape: Shape, ops: dict, ref, args, flush) -> dict:
    """Per-group cuBLASLt loop: validated against ``ref``, then timed (summed
    kernel times).  Returns base_us / base_status / base_rel."""
    import common
    res = {"base_us": None, "base_kus": None, "base_status": "", "base_rel": None}
    if args.no_baseline:
        res["base_status"] = "n/a: --no-baseline"
        return res
    torch, api = common.load_torch()
    if torch is None:
        res["base_status"] = f"n/a: {api}"
        return res
    try:
        runs, worst = [], 0.0
        for a, sfa, b, sfb, rows in _groups(shape, ops):
            run = common.torch_blockwise_gemm(a, sfa, b, sfb)
            got = common.torch_to_f64(run(), a.shape[0])
            worst = max(worst, common.rel_error(got, ref[rows]))
            runs.append(run)
        res["base_rel"] = worst
        if not worst <= common.BASELINE_REL_LIMIT:
            res["base_status"] = f"wrong (rel {worst:.1e})"
            return res
        res["base_us"] = common.time_calls(runs, reps=args.reps, warmup=args.warmup, flush=flush).median
        kt = common.kernel_times(runs, reps=args.reps, flush=flush)
        res["base_kus"] = kt.median if kt else None
        res["base_status"] = "ok"
    except Exception as exc:
        res["base_status"] = "n/a: " + _error_text(exc, 160)
    return res


def measure_same_m_normal(shape: Shape, ops: dict, args, flush, cp) -> dict:
    """Contiguous only: a normal cugemm8 GEMM with the same total M (A and
    group 0's B), the 'within 5%' reference of benchmarks.md."""
    import common
    import cugemm8
    m_sum = ops["a"].shape[0]
    normal = Shape("normal", m_sum, shape.n, shape.k)
    out = cp.empty((m_sum, shape.n), dtype=cp.dtype("bfloat16"))
    sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
    lhs, rhs = (ops["a"], sfa), (ops["b"][0], ops["sfb"][0])
    try:
        run = lambda: cugemm8.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)  # noqa: E731
        t = common.time_call(run, reps=args.reps, warmup=args.warmup, flush=flush)
        kt = common.kernel_times([run], reps=args.reps, flush=flush)
        return {"same_m_us": t.median, "same_m_kus": kt.median if kt else None,
                "same_m_config": config_string(normal)}
    except Exception as exc:
        return {"same_m_us": None, "same_m_config": f"error: {type(exc).__name__}: {exc}"[:160]}


def bench_shape(shape: Shape, args, flush, copy_gbps: float, dg=None) -> dict:
    """Everything the report says about one shape (a JSON-able dict); ``dg``
    (:mod:`deepgemm_anchor` or None) times DeepGEMM beside."""
    import common
    import cupy as cp
    row = {"kind": shape.kind, "m": shape.m, "n": shape.n, "k": shape.k, "g": shape.num_groups,
           "label": shape.label()}
    try:
        ops = make_operands(shape, cp, seed=args.seed, vary=False)
        row["config"] = config_string(shape, ops)
        out = poisoned_out(shape, ops, cp)
        run = gemm_call(shape, ops, out)
        t0 = time.perf_counter()
        run()
        cp.cuda.get_current_stream().synchronize()
        row["first_call_s"] = time.perf_counter() - t0
        ref, _ = reference(ops, shape, cp)
        row["check"], row["diff"] = check_cugemm8(shape, ops, out, ref, cp)
        timing = common.time_call(run, reps=args.reps, warmup=args.warmup, flush=flush)
        row["us"], row["spread"] = timing.median, timing.spread
        kt = common.kernel_times([run], reps=args.reps, flush=flush)
        row["kus"] = kt.median if kt else None
        row.update(measure_deepgemm(shape, ops, ref, args, flush, dg, cp, ours=run))
        row.update(measure_baseline(shape, ops, ref, args, flush))
        del ref
        if shape.kind == "contiguous":
            row.update(measure_same_m_normal(shape, ops, args, flush, cp))
        rows, num_b = valid_rows(shape, ops), shape.num_groups
    except Exception as exc:
        row.setdefault("config", "?")
        row["check"] = "error: " + _error_text(exc)
        rows, num_b = None, shape.num_groups
    finally:
        common.release_memory()
    return add_metrics(row, shape, rows, num_b, copy_gbps)


def add_metrics(row: dict, shape: Shape, rows, num_b: int, copy_gbps: float) -> dict:
    """FLOPs, bytes, TFLOPS, GB/s, % of copy, ratios to the baseline and anchor."""
    rows = shape.m * shape.num_groups if rows is None else rows
    row["flops"] = 2.0 * rows * shape.n * shape.k
    row["bytes"] = gemm_bytes(rows, shape.n, shape.k, num_b)
    # The primary time: CUPTI kernel duration when measured, else CUDA events.
    us_ev, kus = row.get("us"), row.get("kus")
    row["timer"] = "cupti" if kus else "events"
    t = kus or us_ev
    row["t_us"] = t
    row["tflops"] = row["flops"] / t / 1e6 if t else None
    row["gbps"] = row["bytes"] / t / 1e3 if t else None
    row["copy_pct"] = 100.0 * row["gbps"] / copy_gbps if t and copy_gbps else None
    # cuBLASLt: like against like (CUPTI with CUPTI, events with events).
    base_t = row.get("base_kus") if kus else row.get("base_us")
    row["base_tflops"] = row["flops"] / base_t / 1e6 if base_t else None
    row["ratio_base"] = base_t / t if base_t and t else None
    row["ratio_base_events"] = (row["base_us"] / us_ev if row.get("base_us") and us_ev else None)
    anchor = anchor_tflops(shape)
    row["anchor_tflops"] = anchor
    row["target_tflops"] = anchor * TARGET_FACTOR if anchor else None
    row["ratio_anchor"] = row["tflops"] / anchor if anchor and row["tflops"] else None
    # DeepGEMM in the same run (--deepgemm): like against like, as cuBLASLt.
    dg_t = row.get("dg_kus") if kus else row.get("dg_us")
    row["dg_t_us"] = dg_t
    row["dg_tflops"] = row["flops"] / dg_t / 1e6 if dg_t else None
    row["ratio_dg"] = dg_t / t if dg_t and t else None
    row["ratio_dg_events"] = row["dg_us"] / us_ev if row.get("dg_us") and us_ev else None
    alt, dg_alt = row.get("alt_kus"), row.get("dg_alt_kus")
    row["ratio_dg_alternating"] = dg_alt / alt if alt and dg_alt else None
    same = row.get("same_m_kus") if kus else row.get("same_m_us")
    if same and t:
        row["contig_over_normal"] = t / same
    return row


# ----------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------

def _geomean(values) -> float:
    vals = [v for v in values if v is not None and v == v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")


def summarize(rows: list[dict]) -> dict:
    """Per kind and overall: geometric means of the ratios, counts of misses."""
    out = {}
    for kind in ("normal", "contiguous", "masked", "all"):
        sel = [r for r in rows if kind == "all" or r["kind"] == kind]
        if not sel:
            continue
        small = [r["copy_pct"] for r in sel if r["kind"] == "normal" and r["m"] <= 128 and r.get("copy_pct")]
        out[kind] = {
            "shapes": len(sel),
            "check_failures": sum(r.get("check") != "ok" for r in sel),
            "geomean_vs_cublaslt": _geomean(r.get("ratio_base") for r in sel),
            "geomean_vs_cublaslt_events": _geomean(r.get("ratio_base_events") for r in sel),
            "baseline_shapes": sum(r.get("ratio_base") is not None for r in sel),
            "min_vs_cublaslt": min((r["ratio_base"] for r in sel if r.get("ratio_base")), default=None),
            "geomean_vs_deepgemm": _geomean(r.get("ratio_anchor") for r in sel),
            "below_deepgemm": sum(r.get("ratio_anchor") is not None and r["ratio_anchor"] < 1 for r in sel),
            "below_target": sum(r.get("ratio_anchor") is not None and r["ratio_anchor"] < TARGET_FACTOR
                                for r in sel),
            "anchored_shapes": sum(r.get("ratio_anchor") is not None for r in sel),
            "min_copy_pct_m_le_128": min(small) if small else None,
        }
        if deepgemm_measured(sel):
            measured = [r["ratio_dg"] for r in sel if r.get("ratio_dg")]
            out[kind].update({
                "dg_shapes": len(measured),
                "dg_failures": sum(r.get("dg_status") not in (None, "ok") for r in sel),
                "geomean_vs_dg_same_run": _geomean(measured),
                "geomean_vs_dg_same_run_events": _geomean(r.get("ratio_dg_events") for r in sel),
                "geomean_vs_dg_alternating": _geomean(r.get("ratio_dg_alternating") for r in sel),
                "min_vs_dg_alternating": min((r["ratio_dg_alternating"] for r in sel
                                              if r.get("ratio_dg_alternating")), default=None),
                "min_vs_dg_same_run": min(measured, default=None),
                "below_dg_same_run": sum(v < 1 for v in measured),
                "below_target_same_run": sum(v < TARGET_FACTOR for v in measured),
            })
    return out


def deepgemm_measured(rows: list[dict]) -> bool:
    """Whether DeepGEMM was timed in the run (``--deepgemm`` and usable):
    the report then shows its measured time and ratio in place of the H200
    figure."""
    return any(r.get("dg_status") for r in rows)


def _f(x, spec: str, none: str = "-") -> str:
    return none if x is None or x != x else format(x, spec)


COLUMNS = ("kind", "shape", "config", "µs", "µs ev", "TFLOPS", "GB/s", "%copy", "check",
           "cuBLASLt TF", "×cuBLASLt", "DeepGEMM TF", "×DeepGEMM", "target TF", "note")
#: With DeepGEMM timed in the run: its time (the row's timer) and cugemm8's
#: speed-up over it replace the H200 figure, its ratio and the target.
#: '×DG alt': the same ratio from the alternating CUPTI sequence.
COLUMNS_DG = COLUMNS[:11] + ("DeepGEMM µs", "×DeepGEMM", "×DG alt", "note")


def _dg_cells(r: dict) -> tuple:
    """(DeepGEMM µs, ×DeepGEMM, ×DG alt) cells of a row timed with
    --deepgemm: the time and the two ratios, or why there is none
    (FAIL <diff>, error: ..., '-' not run)."""
    status = r.get("dg_status")
    if status == "ok" and r.get("dg_t_us"):
        return (_f(r["dg_t_us"], ".1f"), _f(r.get("ratio_dg"), ".2f"),
                _f(r.get("ratio_dg_alternating"), ".3f"))
    return ((status or "-")[:40], "-", "-")


def table_row(r: dict, measured: bool = False) -> tuple:
    """One table line; ``measured``: the :data:`COLUMNS_DG` layout."""
    base = _f(r.get("base_tflops"), ".0f") if r.get("base_status") == "ok" else (r.get("base_status") or "-")
    check = r.get("check", "?")
    if r.get("diff") is not None:
        check = f"{check} {r['diff']:.1e}"
    note = ""
    if r.get("contig_over_normal"):
        same = r.get("same_m_kus") if r.get("timer") == "cupti" else r.get("same_m_us")
        note = (f"normal M={r['m'] * r['g']}: {same:.1f} µs "
                f"({r['same_m_config']}), contig/normal {r['contig_over_normal']:.3f}")
    if r.get("spread") is not None and r["spread"] > 0.1:
        note = (note + "; " if note else "") + f"noisy: p10-p90 {100 * r['spread']:.0f}%"
    if measured and r.get("dg_spread") is not None and r["dg_spread"] > 0.1:
        note = (note + "; " if note else "") + f"DeepGEMM noisy: p10-p90 {100 * r['dg_spread']:.0f}%"
    t = r.get("t_us", r.get("us"))
    head = (r["kind"], r["label"], r.get("config", "?"), _f(t, ".1f"), _f(r.get("us"), ".1f"),
            _f(r.get("tflops"), ".0f"),
            _f(r.get("gbps"), ".0f"), _f(r.get("copy_pct"), ".0f"), check, base,
            _f(r.get("ratio_base"), ".2f"))
    if measured:
        return head + _dg_cells(r) + (note,)
    return head + (_f(r.get("anchor_tflops"), ".0f"),
                   _f(r.get("ratio_anchor"), ".2f"), _f(r.get("target_tflops"), ".0f"), note)


def summary_line(kind: str, s: dict) -> str:
    """One kind's summary line; DeepGEMM's measured ratios when the run
    timed it (``dg_shapes`` in ``s``), else the ratios to its H200 figure."""
    line = (f"{kind:>10}: {s['shapes']} shapes, {s['check_failures']} check failures; "
            f"geomean ×cuBLASLt {_f(s['geomean_vs_cublaslt'], '.3f')} over {s['baseline_shapes']} "
            f"(min {_f(s['min_vs_cublaslt'], '.2f')}; events/events "
            f"{_f(s.get('geomean_vs_cublaslt_events'), '.3f')}); ")
    if "dg_shapes" in s:
        line += (f"geomean ×DeepGEMM (same run) {_f(s['geomean_vs_dg_same_run'], '.3f')} over "
                 f"{s['dg_shapes']} (min {_f(s['min_vs_dg_same_run'], '.2f')}, {s['below_dg_same_run']} "
                 f"below 1.0, {s['below_target_same_run']} below the 1.10× target; events/events "
                 f"{_f(s.get('geomean_vs_dg_same_run_events'), '.3f')}; alternating CUPTI "
                 f"{_f(s.get('geomean_vs_dg_alternating'), '.3f')}, min "
                 f"{_f(s.get('min_vs_dg_alternating'), '.2f')}"
                 + (f"; DeepGEMM failed on {s['dg_failures']}" if s.get("dg_failures") else "") + ")")
    else:
        line += (f"geomean ×DeepGEMM {_f(s['geomean_vs_deepgemm'], '.3f')} over {s['anchored_shapes']}, "
                 f"{s['below_deepgemm']} below DeepGEMM, {s['below_target']} below the 1.10× target")
    if s.get("min_copy_pct_m_le_128") is not None:
        line += f"; min %copy at M<=128: {s['min_copy_pct_m_le_128']:.0f}%"
    return line


def print_report(meta: dict, rows: list[dict], summary: dict) -> None:
    print(f"cugemm8 {meta.get('cugemm8')}  ({meta.get('commit', '?')})  on {meta.get('device', '?')}")
    print(f"  {meta.get('versions', '')}")
    print(f"  copy ceiling {_f(meta.get('copy_gbps'), '.0f')} GB/s (d2d, read+write, same run); "
          f"FP8 peak {meta.get('peak_tflops')} TFLOPS; median of {meta.get('reps')} reps, "
          f"{meta.get('flush_mb')} MB L2 flush before each; baseline: {meta.get('baseline')}")
    timers = {r.get("timer") for r in rows if r.get("timer")}
    print("  µs / TFLOPS / GB/s / ratios: " + (
        "CUPTI kernel durations (torch.profiler; DeepGEMM's bench_kineto method)" if timers == {"cupti"}
        else "CUDA events (no torch: no CUPTI)" if timers == {"events"}
        else "CUPTI where measured, else CUDA events (per row: 'timer' in --json)")
        + "; 'µs ev' = CUDA events around each launch (adds the GPU launch latency)")
    measured = deepgemm_measured(rows)
    if measured:
        print(f"  DeepGEMM: {meta.get('deepgemm', 'timed in this run')}; 'DeepGEMM µs' with the row's timer, "
              "'×DeepGEMM' = its time / cugemm8's (> 1: cugemm8 faster), checked first like cugemm8; "
              "'×DG alt' = the same ratio from one CUPTI sequence alternating the two (DeepGEMM's "
              "own repetitions otherwise run after cugemm8's)")
    else:
        print("  DeepGEMM: its H200 figure (docs/benchmarks.md, anchor 1), not measured in this run"
              + (f" ({meta['deepgemm']})" if meta.get("deepgemm") else "; --deepgemm times it"))
    print_table("cugemm8 FP8 GEMM benchmark", COLUMNS_DG if measured else COLUMNS,
                [table_row(r, measured) for r in rows])
    print("\n".join(summary_line(kind, s) for kind, s in summary.items()))


# ----------------------------------------------------------------------------
# Plot
# ----------------------------------------------------------------------------

def _plot_groups(rows: list[dict]) -> list[tuple[str, int, int]]:
    """(heading, first index, last index + 1) of each run of rows that share a
    kind (and, for normal GEMMs, an M), in row order."""
    groups = []
    for i, r in enumerate(rows):
        name = f"normal, M = {r['m']}" if r["kind"] == "normal" else r["kind"]
        if groups and groups[-1][0] == name:
            groups[-1][2] = i + 1
        else:
            groups.append([name, i, i + 1])
    return [tuple(g) for g in groups]


def _plot_label(r: dict) -> str:
    """Tick label of one shape: M×N×K, or G×M×N×K for grouped kinds."""
    return r["label"].replace("x", "×")


def _plain(v, _pos=None) -> str:
    """A log-axis tick as a plain number (200, not 2 x 10^2)."""
    return f"{v:g}"


def _plain_2_5(v, _pos=None) -> str:
    """Minor log-axis ticks: label only the 2s and 5s of each decade."""
    text = f"{v:g}"
    return text if text[0] in "25" else ""


def plot_results(meta: dict, rows: list[dict], path: str) -> None:
    """Three panels over the shapes, grouped by kind (and M for normal GEMMs):
    cugemm8's speed-up over cuBLASLt and over DeepGEMM (timed in the run with
    --deepgemm, else its H200 figure) on a linear axis (1.0 = parity, the
    1.10x target marked); TFLOPS of the three;
    and a roofline (TFLOPS against FLOP per byte, FP8 peak and copy roofs).
    The title names the cugemm8 version, commit, device and timer."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    rows = [r for r in rows if r.get("tflops")]
    if not rows:
        raise ValueError("no row has a time to plot")
    groups = _plot_groups(rows)
    x = list(range(len(rows)))
    width = max(13.0, 0.36 * len(rows) + 4)
    fig = plt.figure(figsize=(width, 16), layout="constrained")
    grid = fig.add_gridspec(3, 1, height_ratios=(1.15, 1.0, 0.9))
    ax_ratio = fig.add_subplot(grid[0])
    ax_tf = fig.add_subplot(grid[1], sharex=ax_ratio)
    ax_roof = fig.add_subplot(grid[2])
    colors = {"cugemm8": "tab:blue", "cuBLASLt": "tab:gray", "DeepGEMM": "tab:orange"}

    def separate(ax, labels: bool) -> None:
        for _, lo, _ in groups[1:]:
            ax.axvline(lo - 0.5, color="black", lw=0.8, alpha=0.5)
        if labels:
            for name, lo, hi in groups:
                ax.text((lo + hi - 1) / 2, 1.01, name, transform=ax.get_xaxis_transform(),
                        ha="center", va="bottom", fontsize=10, fontweight="bold")

    # DeepGEMM timed in the run (--deepgemm) replaces its H200 figure.
    measured = deepgemm_measured(rows)
    dg_name, dg_ratio, dg_tf = (("same run", "ratio_dg", "dg_tflops") if measured
                                else ("H200 figure", "ratio_anchor", "anchor_tflops"))

    # Panel 1: speed-up, linear.
    half = 0.38
    ratios = (("× cuBLASLt (same run)", "ratio_base", colors["cuBLASLt"]),
              (f"× DeepGEMM ({dg_name})", dg_ratio, colors["DeepGEMM"]))
    top = max([r.get(key) or 0.0 for r in rows for _, key, _ in ratios] + [TARGET_FACTOR])
    for i, (name, key, color) in enumerate(ratios):
        xs = [v + (i - 0.5) * half for v in x]
        vals = [r.get(key) for r in rows]
        ax_ratio.bar([p for p, v in zip(xs, vals) if v], [v for v in vals if v], half, label=name, color=color)
        for p, v in zip(xs, vals):
            if v:
                ax_ratio.text(p, v + 0.01 * top, f"{v:.2f}", ha="center", va="bottom", rotation=90, fontsize=8)
    for p, r in zip(x, rows):                  # why a cuBLASLt (or DeepGEMM) bar is missing
        status = r.get("base_status") or ""
        if not r.get("ratio_base") and status:
            ax_ratio.text(p - 0.5 * half, 0.02 * top, "wrong" if status.startswith("wrong") else "n/a",
                          ha="center", va="bottom", rotation=90, fontsize=7, color="dimgray")
        dg_status = r.get("dg_status") or ""
        if measured and not r.get("ratio_dg") and dg_status not in ("", "ok"):   # why no DeepGEMM bar
            ax_ratio.text(p + 0.5 * half, 0.02 * top, dg_status.split(":")[0].split()[0],
                          ha="center", va="bottom", rotation=90, fontsize=7, color="dimgray")
    ax_ratio.axhline(1.0, color="black", lw=1.0, label="1.0: as fast")
    ax_ratio.axhline(TARGET_FACTOR, color="tab:red", lw=1.0, ls="--",
                     label=f"target: {TARGET_FACTOR:.2f}× DeepGEMM")
    ax_ratio.set_ylim(0, top * 1.2)
    ax_ratio.yaxis.set_major_locator(MaxNLocator(nbins=12, steps=[1, 2, 2.5, 5, 10]))
    ax_ratio.set_ylabel("cugemm8 speed-up (×, linear)", fontsize=11)
    ax_ratio.grid(axis="y", alpha=0.3)
    ax_ratio.legend(loc="upper left", fontsize=9, ncol=4, framealpha=0.9)
    ax_ratio.tick_params(axis="x", labelbottom=False)
    separate(ax_ratio, labels=True)

    # Panel 2: TFLOPS, log (the shapes span 30-1500 TFLOPS).
    third = 0.27
    series = (("cugemm8", "tflops"), ("cuBLASLt blockwise (same run)", "base_tflops"),
              (f"DeepGEMM ({dg_name})", dg_tf))
    for i, ((name, key), color) in enumerate(zip(series, colors.values())):
        vals = [r.get(key) for r in rows]
        ax_tf.bar([v + (i - 1) * third for v, t in zip(x, vals) if t], [t for t in vals if t], third,
                  label=name, color=color)
    targets = ([r["dg_tflops"] * TARGET_FACTOR if r.get("dg_tflops") else None for r in rows] if measured
               else [r.get("target_tflops") for r in rows])
    ax_tf.scatter([v for v, t in zip(x, targets) if t], [t for t in targets if t], marker="_", s=160,
                  color="tab:red", label=f"target ({TARGET_FACTOR:.2f}× DeepGEMM)", zorder=3)
    ax_tf.set_yscale("log")
    ax_tf.yaxis.set_major_formatter(FuncFormatter(_plain))
    ax_tf.yaxis.set_minor_formatter(FuncFormatter(_plain_2_5))
    ax_tf.set_ylabel("TFLOPS (log)", fontsize=11)
    ax_tf.grid(axis="y", alpha=0.3, which="both")
    ax_tf.legend(loc="upper left", fontsize=9, ncol=4, framealpha=0.9)
    ax_tf.set_xticks(x, [_plot_label(r) for r in rows], rotation=90, fontsize=9)
    ax_tf.set_xlim(-0.6, len(rows) - 0.4)
    ax_tf.set_xlabel("shape: M×N×K (normal), G×M×N×K (grouped: G groups of M rows)", fontsize=10)
    separate(ax_tf, labels=False)

    # Panel 3: roofline.
    peak = meta.get("peak_tflops") or PEAK_TFLOPS
    bw = meta.get("copy_gbps") or 4300.0
    ai = [r["flops"] / r["bytes"] for r in rows]
    lo, hi = min(ai) / 2, max(max(ai) * 2, 4 * peak * 1e3 / bw)
    line = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax_roof.plot(line, [min(peak, a * bw / 1e3) for a in line], color="black",
                 label=f"roof: {peak:.0f} TFLOPS FP8 peak, {bw:.0f} GB/s copy (same run)")
    kinds = {"normal": "tab:blue", "contiguous": "tab:green", "masked": "tab:purple"}
    for kind, color in kinds.items():
        pts = [(a, r["tflops"]) for a, r in zip(ai, rows) if r["kind"] == kind]
        if pts:
            ax_roof.scatter(*zip(*pts), color=color, label=f"cugemm8 {kind}", zorder=3)
    base = [(a, r["base_tflops"]) for a, r in zip(ai, rows) if r.get("base_tflops")]
    if base:
        ax_roof.scatter(*zip(*base), marker="x", color="tab:gray", label="cuBLASLt blockwise", zorder=2)
    ax_roof.set_xscale("log")
    ax_roof.set_yscale("log")
    for axis in (ax_roof.xaxis, ax_roof.yaxis):
        axis.set_major_formatter(FuncFormatter(_plain))
    ax_roof.yaxis.set_minor_formatter(FuncFormatter(_plain_2_5))
    ax_roof.set_xlabel("arithmetic intensity: FLOP per byte of A + B + D + scales (log)", fontsize=10)
    ax_roof.set_ylabel("TFLOPS (log)", fontsize=11)
    ax_roof.legend(loc="lower right", fontsize=9)
    ax_roof.grid(alpha=0.3, which="both")

    timers = {r.get("timer") for r in rows}
    timer = ("CUPTI kernel times" if timers == {"cupti"} else "CUDA-event times" if timers == {"events"}
             else "CUPTI kernel times where measured, else CUDA events")
    version = meta.get("cugemm8", "?")
    commit = f" ({meta['commit']})" if meta.get("commit") else ""
    fig.suptitle(f"cugemm8 {version}{commit}: FP8 GEMM on {meta.get('device', '?')}", fontsize=15)
    date = str(meta.get("date", ""))[:10]
    ax_ratio.set_title(f"{timer}, median of {meta.get('reps', '?')} repetitions, "
                       f"{meta.get('flush_mb', '?')} MB L2 flush before each; baseline: "
                       f"{meta.get('baseline', '?')}" + (f"; {date}" if date else ""), fontsize=10, pad=24)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------

def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(_HERE), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=5).stdout.strip() or "?"
    except Exception:
        return "?"


def collect_meta(args, copy_gbps: float, deepgemm: str | None = None) -> dict:
    import common
    import cupy as cp
    import cugemm8
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    name = props.get("name", b"?")
    name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    _, api = common.load_torch()
    return {
        "cugemm8": cugemm8.__version__, "commit": _commit(),
        "device": f"{name} ({props.get('multiProcessorCount')} SMs)",
        "versions": (f"cupy {cp.__version__}, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}, "
                     f"driver {cp.cuda.runtime.driverGetVersion()}, {common.torch_version()}"),
        "baseline": ("disabled" if args.no_baseline else
                     f"cuBLASLt blockwise via {api}" if common.load_torch()[0] is not None else f"n/a: {api}"),
        "copy_gbps": copy_gbps, "peak_tflops": PEAK_TFLOPS, "reps": args.reps, "warmup": args.warmup,
        "flush_mb": common.FLUSH_BYTES >> 20, "seed": args.seed,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "deepgemm": deepgemm,        # None: not asked (--deepgemm); 'n/a: why'; or what was timed
    }


def open_deepgemm(args, shapes: list[Shape]):
    """(:mod:`deepgemm_anchor` with every shape's kernel prewarmed, or None;
    the meta note): ``--deepgemm``'s start-up.  Never fatal: when DeepGEMM
    is not usable the reason is printed and kept, and the run goes on."""
    if not args.deepgemm:
        return None, None
    try:
        import deepgemm_anchor
        dg_mod, why = deepgemm_anchor.load()
    except Exception as exc:          # a broken install must not end the cugemm8 run
        dg_mod, why = None, "DeepGEMM not usable (" + _error_text(exc) + ")"
    if dg_mod is None:
        print(f"--deepgemm: {why}; going on without it")
        return None, f"n/a: {why}"
    try:
        print(deepgemm_anchor.prewarm(warm_specs(shapes)))
    except Exception as exc:          # each shape's first call then compiles its kernel
        print(f"--deepgemm: prewarm failed ({type(exc).__name__}: {exc}); first calls will compile")
    version = getattr(dg_mod, "__version__", "?")
    return deepgemm_anchor, f"DeepGEMM {version} timed in this run ({Path(dg_mod.__file__).parent})"


def run_benchmarks(args) -> tuple[dict, list[dict]]:
    import common
    from cugemm8.cli import gpu_reason
    reason = gpu_reason()
    if reason is not None:
        raise SystemExit(f"bench_gemm: no usable Hopper GPU: {reason}")
    shapes = bench_shapes(args.kinds, args.quick, args.m1)
    dg, dg_note = open_deepgemm(args, shapes)
    copy_gbps = common.copy_bandwidth_gbps()
    meta = collect_meta(args, copy_gbps, dg_note)
    flush = common.L2Flush()
    rows = []
    for i, shape in enumerate(shapes):
        print(f"[{i + 1}/{len(shapes)}] {shape.kind} {shape.label()}", file=sys.stderr, flush=True)
        rows.append(bench_shape(shape, args, flush, copy_gbps, dg))
        time.sleep(args.pause)
    return meta, rows


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench_gemm.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", default="normal,contiguous,masked",
                   help="comma-separated subset of normal,contiguous,masked")
    p.add_argument("--quick", action="store_true", help="a handful of shapes")
    p.add_argument("--m1", action="store_true", help="add the M=1 normal shapes")
    p.add_argument("--reps", type=int, default=40, help="timed repetitions (median; default 40)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before timing (default 3)")
    p.add_argument("--pause", type=float, default=0.2, help="seconds of idle between shapes (default 0.2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-baseline", action="store_true", help="skip the cuBLASLt (torch) baseline")
    p.add_argument("--deepgemm", action="store_true",
                   help="time DeepGEMM (an importable deep_gemm v2.x, e.g. v2.6.1 on PYTHONPATH) in the same "
                        "run on the same bytes, every kind, instead of quoting its H200 figure; "
                        "without a usable DeepGEMM the run says why and goes on")
    p.add_argument("--energy", type=int, default=0, metavar="ROUNDS",
                   help="after the tables, the energy table of the M = 4096 normal shapes (benches/"
                        "bench_energy.py: sustained 1 s loops, NVML's energy counter, ROUNDS alternations "
                        "of the libraries, DeepGEMM with --deepgemm) in the same run; with --json it also "
                        "writes OUT's stem + '.energy.json'")
    p.add_argument("--json", metavar="OUT", help="write meta, rows and summary as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="write a bar chart + roofline (matplotlib)")
    p.add_argument("--from-json", metavar="IN", help="re-render a saved --json result (no GPU needed)")
    args = p.parse_args(argv)
    args.kinds = [s.strip() for s in args.kinds.split(",") if s.strip()]
    bad = [s for s in args.kinds if s not in ("normal", "contiguous", "masked")]
    if bad:
        p.error(f"unknown kinds {bad}; choose from normal, contiguous, masked")
    if args.reps < 1:
        p.error("--reps must be >= 1")
    if args.energy < 0:
        p.error("--energy takes a number of rounds >= 1 (0: no energy table)")
    return args


def energy_argv(args) -> list[str]:
    """bench_energy.py's arguments for ``--energy ROUNDS``: the six M = 4096
    normal shapes, DeepGEMM beside when ``--deepgemm``, its JSON beside
    ``--json``'s (``run.json`` -> ``run.energy.json``)."""
    argv = ["--ms", "4096", "--rounds", str(args.energy)]
    if args.deepgemm:
        argv.append("--deepgemm")
    if args.json:
        out = Path(args.json)
        argv += ["--json", str(out.with_name(out.stem + ".energy.json"))]
    return argv


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        meta, rows = saved["meta"], saved["rows"]
    else:
        meta, rows = run_benchmarks(args)
    summary = summarize(rows)
    print_report(meta, rows, summary)
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows, "summary": summary},
                                              indent=1, default=str))
    if args.plot:
        try:
            plot_results(meta, rows, args.plot)
            print(f"plot written to {args.plot}")
        except ImportError as exc:
            print(f"--plot skipped: matplotlib is not importable ({exc})", file=sys.stderr)
    if args.energy and not args.from_json:
        import bench_energy
        print()
        return bench_energy.main(energy_argv(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
