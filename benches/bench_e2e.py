"""Quantise + GEMM from bf16 activations end to end: fused, two launches (PDL off / on), DeepGEMM.

The decode layer as a model runs it, from bf16 activations: the fused
quantise + GEMM call against two launches with and without programmatic
dependent launch (PDL) and DeepGEMM's pair; and a two-GEMM MLP chain.

    python benches/bench_e2e.py [--ms 1,8,32,64,128] [--chain-ms 1,8,64] [--reps 30] [--passes 2]
                                [--deepgemm] [--quick] [--one-kernel-rows N] [--json OUT]

Every time is a span (``common.kernel_spans``: CUPTI through torch.profiler,
from the start of a repetition's first kernel to the end of its last, so the
gaps between dependent kernels count and overlapping kernels count once; CUDA
events around the repetition when torch is missing), median over
``--passes`` interleaved passes of ``--reps`` repetitions, a 256 MB L2 flush
before each.

Table 1, per (M, N, K) over M in ``--ms`` and the six DeepSeek-V3 (N, K),
with bf16 activations x [M, K] (normal) and FP8 weights from
``per_block_cast_to_fp8`` of normal bf16 weights [N, K]:

* ``fused``: ``cugemm8.gemm_fp8(x, (b, sfb), out, workspace=ws)``, PDL off,
  in the form the library picks (``form``: ``1K`` when the GEMM quantises x
  itself, one kernel, at the few rows ``cugemm8.quant.one_kernel_rows``
  allows the pick; ``2K``
  when the per-token quantiser is its prologue and the GEMM its
  programmatic dependent);
* ``fused 2K``: the same call with the two-kernel form forced (rows where
  the pick is ``1K``; ``2K/1K`` is its time over the pick's); with
  ``--one-kernel-rows N`` (a probe: ``cugemm8.quant.ONE_KERNEL_MAX_M``
  replaced and the warp-MMA rule's group limits lifted for
  the run) every pick that has a one-kernel form takes it up to N rows, to
  measure that form where the library's rule keeps two kernels;
* ``2-launch``: ``per_token_cast_to_fp8(x)`` then ``gemm_fp8_fp8_bf16_nt``,
  ``cugemm8.set_pdl(False)``; ``2L+pdl``: the same with ``set_pdl(True)``;
* ``DG pair`` (``--deepgemm``, DeepGEMM on PYTHONPATH,
  ``../shared/anchors/README.md``): DeepGEMM's ``per_token_cast_to_fp8`` then
  ``fp8_gemm_nt`` (``deepgemm_anchor.cast_and_gemm``);
* the ratios ``2L/fused`` (target >= 1.2) and ``dg/fused`` (target >= 1.3);
  ``bits``: whether the fused and the 2L+pdl outputs are bit-identical to the
  2-launch output (``yes``, else which differs); ``dg diff``: calc_diff of
  DeepGEMM's output against the fused one.

Table 2, "MLP chain", per M in ``--chain-ms``: x [M, 7168] -> quantise ->
GEMM1 (N 4096, K 7168) -> h [M, 4096] bf16 -> quantise -> GEMM2 (N 7168,
K 4096), weights quantised once beforehand, timed as one span: built from
two-launch pairs and from two fused ``gemm_fp8`` calls (with workspaces),
each with PDL off and on in the same passes; the ratios off/on, 2L off over
fused on, and whether the final outputs are bit-identical between off and on.

Every path is checked before it is timed: calc_diff < 1e-3 against the
float64 product of the dequantised operands (cugemm8's own quantisation of x,
and of h for GEMM2); a failing path is reported, not timed.  The summary
gives the geomean of 2L/fused and dg/fused over the rows, the minimum and its
shape, and how many rows meet each target.  ``--quick``: M in {1, 64}, two
(N, K), 5 repetitions, one pass (a smoke run).  Without a usable Hopper GPU
it prints why and exits 2.  This script reports; it never asserts.
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

import common  # noqa: E402
from cugemm8 import cli  # noqa: E402
from cugemm8._shapes import DEEPSEEK_NK  # noqa: E402
from cugemm8.cli import Shape, bf16_to_f64, calc_diff, print_table  # noqa: E402

E2E_MS = (1, 8, 32, 64, 128)
CHAIN_MS = (1, 8, 64)
QUICK_MS = (1, 64)
QUICK_NK = ((2112, 7168), (7168, 2048))
CHAIN_DIMS = (7168, 4096)            # hidden, intermediate: GEMM1 4096 x 7168, GEMM2 7168 x 4096
CHECK_LIMIT = 1e-3
TARGET_2L, TARGET_DG = 1.2, 1.3


# ----------------------------------------------------------------------------
# Data and checks
# ----------------------------------------------------------------------------

def _bf16_normal(cp, rs, shape):
    """Normal values rounded to bfloat16 (nearest even) on the GPU, NaN-free."""
    import ml_dtypes
    bits = rs.standard_normal(shape, dtype=cp.float32).view(cp.uint32)
    bits = (bits + cp.uint32(0x7FFF) + ((bits >> 16) & cp.uint32(1))) >> 16
    return bits.astype(cp.uint16).view(ml_dtypes.bfloat16)


def _poisoned(cp, m, n):
    import ml_dtypes
    return cp.full((m, n), cli.POISON_BITS, dtype=cp.uint16).view(ml_dtypes.bfloat16)


def _weights(cugemm8, cp, rs, n, k):
    """FP8 weights (b, sfb) of normal bf16 weights [n, k]."""
    w = _bf16_normal(cp, rs, (n, k))
    b, sfb = cugemm8.per_block_cast_to_fp8(w)
    del w
    return b, sfb


def _reference(cugemm8, cp, x, b, sfb):
    """float64 product of cugemm8's quantisation of ``x`` and the dequantised ``(b, sfb)``."""
    a, sfa = cugemm8.per_token_cast_to_fp8(x)
    ops = {"a": a, "sfa": sfa, "b": b, "sfb": sfb}
    ref, _ = cli.reference(ops, Shape("normal", x.shape[0], b.shape[0], b.shape[1]), cp)
    return ref


def _same_bits(cp, x, y) -> bool:
    return x.shape == y.shape and bool(cp.array_equal(x.view(cp.uint16), y.view(cp.uint16)))


def _compare(cp, paths, outs, name, other):
    """Whether path ``name``'s output is bit-identical to path ``other``'s;
    None unless both passed their check."""
    return _same_bits(cp, outs[name], outs[other]) if paths[name].ok and paths[other].ok else None


def _error(exc) -> str:
    return f"error {type(exc).__name__}: {exc}"[:80]


# ----------------------------------------------------------------------------
# Running and timing paths
# ----------------------------------------------------------------------------

class Timed:
    """One timed path: a no-argument callable, the PDL setting it runs
    under, its check status and the span samples gathered."""

    def __init__(self, fn, pdl: bool):
        self.fn, self.pdl, self.status, self.samples = fn, pdl, "not run", []

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def median(self):
        return common.Timing(self.samples).median if self.samples else None


def _run_once(cugemm8, cp, path: Timed) -> None:
    try:
        cugemm8.set_pdl(path.pdl)
        path.fn()
        cp.cuda.runtime.deviceSynchronize()
    finally:
        cugemm8.set_pdl(False)


def _check(cugemm8, cp, path: Timed, pairs) -> None:
    """Run ``path`` once, then set its status from ``pairs``: (got() -> float64
    array, float64 reference) for each output it must produce."""
    try:
        _run_once(cugemm8, cp, path)
        bad = [d for d in (calc_diff(got(), ref, cp) for got, ref in pairs) if not d < CHECK_LIMIT]
        path.status = f"FAIL {bad[0]:.1e}" if bad else "ok"          # NaN fails too
    except Exception as exc:  # a failing path is reported, not timed
        path.status = _error(exc)


def _span(fn, reps, flush):
    t = common.kernel_spans([fn], reps=reps, flush=flush)
    if t is None:
        t = common.time_call(fn, reps=reps, warmup=2, flush=flush)
    return t


def _time_paths(cugemm8, paths: dict, *, passes: int, reps: int, flush) -> None:
    """Interleaved passes over the paths that passed their check."""
    for _ in range(passes):
        for path in paths.values():
            if not path.ok:
                continue
            try:
                cugemm8.set_pdl(path.pdl)
                path.samples += _span(path.fn, reps, flush).samples
            except Exception as exc:
                path.status = _error(exc)
                path.samples = []
            finally:
                cugemm8.set_pdl(False)


def _us(x) -> str:
    return f"{x:.2f}" if x is not None else "-"


def _ratio(num, den):
    return num / den if num is not None and den else None


def _cell(path: Timed | None) -> str:
    if path is None:
        return "-"
    return _us(path.median) if path.median is not None else path.status.split(":")[0][:24]


# ----------------------------------------------------------------------------
# Table 1: one quantise + GEMM
# ----------------------------------------------------------------------------

def bench_row(cugemm8, cp, m, n, k, *, args, flush, dg) -> dict:
    rs = cp.random.RandomState(m * 7 + n + k)
    x = _bf16_normal(cp, rs, (m, k))
    b, sfb = _weights(cugemm8, cp, rs, n, k)
    ref = _reference(cugemm8, cp, x, b, sfb)
    outs = {name: _poisoned(cp, m, n) for name in ("fused", "fused 2K", "2-launch", "2L+pdl")}
    paths: dict = {}
    ws = ws_error = None
    try:
        ws = cp.empty(cugemm8.gemm_fp8_workspace_bytes(m, k), dtype=cp.uint8)
    except Exception as exc:
        ws_error = _error(exc)

    def fused(out=outs["fused"]):
        cugemm8.gemm_fp8(x, (b, sfb), out, workspace=ws)

    def fused_two_kernels(out=outs["fused 2K"]):
        with _two_kernel_form(cugemm8):
            cugemm8.gemm_fp8(x, (b, sfb), out, workspace=ws)

    def two(out):
        def run():
            a, sfa = cugemm8.per_token_cast_to_fp8(x)
            cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
        return run

    form = _fused_form(cugemm8, x, n)
    paths["fused"] = Timed(fused, False)
    if form == "1K":
        paths["fused 2K"] = Timed(fused_two_kernels, False)
    paths["2-launch"] = Timed(two(outs["2-launch"]), False)
    paths["2L+pdl"] = Timed(two(outs["2L+pdl"]), True)
    for name in ("2-launch", "2L+pdl", "fused", "fused 2K"):
        if name not in paths:
            continue
        if name.startswith("fused") and ws_error is not None:
            paths[name].status = ws_error
            continue
        _check(cugemm8, cp, paths[name], [(lambda o=outs[name]: bf16_to_f64(o, cp), ref)])
    bits = {name: _compare(cp, paths, outs, name, "2-launch") for name in ("fused", "fused 2K", "2L+pdl")
            if name in paths}
    dg_diff = None
    ours = next((outs[name] for name in ("fused", "2-launch") if paths[name].ok), None)
    if dg is not None:
        try:
            run = _dg_pair(dg, cp, x, b, sfb)
            paths["dg pair"] = Timed(run, False)
            _check(cugemm8, cp, paths["dg pair"], [(lambda: common.torch_to_f64(run.out, m), ref)])
            if ours is not None:
                dg_diff = calc_diff(common.torch_to_f64(run.out, m), bf16_to_f64(ours, cp), cp)
        except Exception as exc:
            paths["dg pair"] = Timed(None, False)
            paths["dg pair"].status = _error(exc)
    _time_paths(cugemm8, paths, passes=args.passes, reps=args.reps, flush=flush)
    med = {name: p.median for name, p in paths.items() if p.median is not None}
    return {"m": m, "n": n, "k": k, "config": cli.config_string(Shape("normal", m, n, k)), "form": form,
            "us": med,
            "spread": {name: common.Timing(p.samples).spread for name, p in paths.items() if p.samples},
            "status": {name: p.status for name, p in paths.items()},
            "bits_identical": bits, "dg_diff": dg_diff,
            "x_2l": _ratio(med.get("2-launch"), med.get("fused")),
            "x_2l_pdl": _ratio(med.get("2L+pdl"), med.get("fused")),
            "x_2k": _ratio(med.get("fused 2K"), med.get("fused")),
            "x_dg": _ratio(med.get("dg pair"), med.get("fused")),
            "_paths": paths}


class _two_kernel_form:
    """``with _two_kernel_form(cugemm8):`` gemm_fp8's fused path takes its
    two-kernel form (no row count qualifies for the one-kernel form)."""

    def __init__(self, cugemm8):
        self.quant = cugemm8.quant

    def __enter__(self):
        self.saved = self.quant._one_kernel_config
        self.quant._one_kernel_config = lambda *args: None

    def __exit__(self, *exc):
        self.quant._one_kernel_config = self.saved


def _fused_form(cugemm8, x, n) -> str:
    """``1K`` when gemm_fp8's fused path runs x [m, k] against [n, k]
    weights as one kernel, else ``2K``."""
    from cugemm8 import gemm
    k = cugemm8.quant.padded_k(x.shape[1])
    return "1K" if cugemm8.quant._one_kernel_config(x, n, k, gemm) is not None else "2K"


def _dg_pair(dg, cp, x, b, sfb):
    """``deepgemm_anchor.cast_and_gemm``; when torch cannot take the bf16
    CuPy ``x`` through DLPack, a torch bf16 view of its bits instead."""
    try:
        return dg.cast_and_gemm(x, b, sfb)
    except (TypeError, ValueError, RuntimeError, BufferError):
        torch = dg.load()[1]
        return dg.cast_and_gemm(torch.from_dlpack(x.view(cp.int16)).view(torch.bfloat16), b, sfb)


def _bits_cell(rec) -> str:
    """``yes`` when fused and 2L+pdl both match 2-launch bit for bit; else
    which differ (``NO ...``) or which alone was compared (``yes fused``)."""
    compared = {name: same for name, same in rec["bits_identical"].items() if same is not None}
    bad = [name for name, same in compared.items() if not same]
    if bad:
        return "NO " + ",".join(bad)
    if not compared:
        return "-"
    return "yes" if len(compared) == len(rec["bits_identical"]) else "yes " + ",".join(compared)


def row_cells(rec) -> tuple:
    p = rec["_paths"]
    return (rec["m"], rec["n"], rec["k"], rec["config"], rec["form"], _cell(p["fused"]), _cell(p.get("fused 2K")),
            _cell(p["2-launch"]), _cell(p["2L+pdl"]), _cell(p.get("dg pair")), _ratio_cell(rec["x_2l"]),
            _ratio_cell(rec["x_dg"]), _ratio_cell(rec["x_2k"]), _bits_cell(rec),
            f"{rec['dg_diff']:.1e}" if rec["dg_diff"] is not None else "-")


def _ratio_cell(r) -> str:
    return f"{r:.2f}" if r is not None else "-"


# ----------------------------------------------------------------------------
# Table 2: the MLP chain
# ----------------------------------------------------------------------------

def bench_chain(cugemm8, cp, m, w1, w2, *, args, flush) -> dict:
    hidden, inter = CHAIN_DIMS
    (b1, sfb1), (b2, sfb2) = w1, w2
    rs = cp.random.RandomState(1000 + m)
    x = _bf16_normal(cp, rs, (m, hidden))
    variants = (("2L off", "2L", False), ("2L on", "2L", True), ("fused off", "fused", False),
                ("fused on", "fused", True))
    bufs = {name: (_poisoned(cp, m, inter), _poisoned(cp, m, hidden)) for name, _, _ in variants}
    paths: dict = {}
    ws1 = ws2 = ws_error = None
    try:
        ws1 = cp.empty(cugemm8.gemm_fp8_workspace_bytes(m, hidden), dtype=cp.uint8)
        ws2 = cp.empty(cugemm8.gemm_fp8_workspace_bytes(m, inter), dtype=cp.uint8)
    except Exception as exc:
        ws_error = _error(exc)

    def two_chain(h, y):
        def run():
            a1, s1 = cugemm8.per_token_cast_to_fp8(x)
            cugemm8.gemm_fp8_fp8_bf16_nt((a1, s1), (b1, sfb1), h)
            a2, s2 = cugemm8.per_token_cast_to_fp8(h)
            cugemm8.gemm_fp8_fp8_bf16_nt((a2, s2), (b2, sfb2), y)
        return run

    def fused_chain(h, y):
        def run():
            cugemm8.gemm_fp8(x, (b1, sfb1), h, workspace=ws1)
            cugemm8.gemm_fp8(h, (b2, sfb2), y, workspace=ws2)
        return run

    for name, kind, pdl in variants:
        paths[name] = Timed((two_chain if kind == "2L" else fused_chain)(*bufs[name]), pdl)
    # References: GEMM1 from x; GEMM2 from the 2L-off chain's own h.
    ref_h = _reference(cugemm8, cp, x, b1, sfb1)
    ref_y = None
    for name, kind, _ in variants:
        if kind == "fused" and ws_error is not None:
            paths[name].status = ws_error
            continue
        h, y = bufs[name]
        if ref_y is None:
            try:
                _run_once(cugemm8, cp, paths[name])
                ref_y = _reference(cugemm8, cp, h, b2, sfb2)
            except Exception as exc:   # the next variant's h serves instead
                paths[name].status = _error(exc)
                continue
        _check(cugemm8, cp, paths[name], [(lambda h=h: bf16_to_f64(h, cp), ref_h),
                                          (lambda y=y: bf16_to_f64(y, cp), ref_y)])
    y_of = {name: bufs[name][1] for name, _, _ in variants}
    bits = {"2L off=on": _compare(cp, paths, y_of, "2L on", "2L off"),
            "fused off=on": _compare(cp, paths, y_of, "fused on", "fused off"),
            "fused=2L (off)": _compare(cp, paths, y_of, "fused off", "2L off")}
    _time_paths(cugemm8, paths, passes=args.passes, reps=args.reps, flush=flush)
    med = {name: p.median for name, p in paths.items() if p.median is not None}
    return {"m": m, "dims": [m, hidden, inter], "us": med,
            "spread": {name: common.Timing(p.samples).spread for name, p in paths.items() if p.samples},
            "status": {name: p.status for name, p in paths.items()}, "bits_identical": bits,
            "x_2l_off_on": _ratio(med.get("2L off"), med.get("2L on")),
            "x_fused_off_on": _ratio(med.get("fused off"), med.get("fused on")),
            "x_2l_off_fused_on": _ratio(med.get("2L off"), med.get("fused on")),
            "_paths": paths}


def chain_cells(rec) -> tuple:
    p, bits = rec["_paths"], rec["bits_identical"]

    def same(key):
        return "-" if bits[key] is None else "yes" if bits[key] else "NO"
    return (rec["m"], _cell(p["2L off"]), _cell(p["2L on"]), _ratio_cell(rec["x_2l_off_on"]),
            _cell(p["fused off"]), _cell(p["fused on"]), _ratio_cell(rec["x_fused_off_on"]),
            _ratio_cell(rec["x_2l_off_fused_on"]), same("2L off=on"), same("fused off=on"))


# ----------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------

def summarize(records) -> dict:
    out = {}
    for key, target in (("x_2l", TARGET_2L), ("x_dg", TARGET_DG), ("x_2l_pdl", None), ("x_2k", None)):
        vals = [(r[key], f"{r['m']}x{r['n']}x{r['k']}") for r in records if r[key] is not None]
        worst = min(vals, default=(None, None))
        out[key] = {"rows": len(vals), "geomean": common.geomean(v for v, _ in vals) if vals else None,
                    "min": worst[0], "min_shape": worst[1], "target": target,
                    "meeting": sum(v >= target for v, _ in vals) if target else None}
    for name in ("fused", "fused 2K", "2L+pdl"):
        compared = [r["bits_identical"].get(name) for r in records if r["bits_identical"].get(name) is not None]
        out[f"bits_{name}"] = {"compared": len(compared), "identical": sum(compared)}
    return out


def print_summary(summary, n_rows) -> None:
    for key, label in (("x_2l", "2-launch/fused"), ("x_dg", "DG pair/fused"), ("x_2l_pdl", "2L+pdl/fused"),
                       ("x_2k", "fused 2K/1K (rows of the one-kernel form)")):
        s = summary[key]
        if not s["rows"]:
            print(f"{label}: no rows timed")
            continue
        line = (f"{label}: geomean {s['geomean']:.3f} over {s['rows']} rows, min {s['min']:.2f} "
                f"({s['min_shape']})")
        if s["target"]:
            line += f"; {s['meeting']}/{s['rows']} rows >= {s['target']}"
        print(line)
    counts = [(name, summary[f"bits_{name}"]) for name in ("fused", "fused 2K", "2L+pdl")]
    print("bit-identical to 2-launch: " + "; ".join(
        f"{name} in {c['identical']} of {c['compared']} rows compared" for name, c in counts)
          + f" (of {n_rows})")


# ----------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------

def _precompile(cugemm8, shapes) -> None:
    """Load every GEMM kernel the shapes need in parallel threads (NVRTC
    releases the GIL), as ``cugemm8 warmup`` does; best effort."""
    try:
        import cupy as cp
        jobs, _ = cli.plan_warmup([Shape("normal", m, n, k) for m, n, k in shapes], cugemm8.get_num_sms())
        device_id = cp.cuda.Device().id
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda job: cli._load_on_gpu(job, device_id), jobs))
    except Exception as exc:  # the first calls compile instead
        print(f"precompile skipped ({type(exc).__name__}: {exc})"[:200])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_run_args(p, E2E_MS, ms_help="M values of table 1",
                        dg_help="time DeepGEMM's pair (importable deep_gemm) beside")
    p.add_argument("--chain-ms", default=",".join(map(str, CHAIN_MS)), help="M values of the MLP chain")
    p.add_argument("--quick", action="store_true", help="M 1 and 64, two (N, K), 5 reps, one pass")
    p.add_argument("--one-kernel-rows", type=int, default=None, metavar="N",
                   help="probe: the one-kernel form for every pick that has one, up to N rows (at most 8)")
    args = p.parse_args(argv)
    if args.one_kernel_rows is not None and not 0 <= args.one_kernel_rows <= 8:
        p.error("--one-kernel-rows must be in [0, 8] (the kernels' limit: _config.QUANT_A_MAX_ROWS)")

    reason = cli.gpu_reason()
    if reason is not None:
        print(f"no usable Hopper GPU ({reason}): nothing to time")
        return 2                      # as bench_decode.py and `cugemm8 check` without a GPU
    import cupy as cp
    import cugemm8
    if args.one_kernel_rows is not None:
        rows = args.one_kernel_rows
        cugemm8.quant.ONE_KERNEL_MAX_M = {2: ((8, rows),), 4: ((8, rows),)}
        cugemm8._config.WARP_MMA_ONE_KERNEL_MAX_GROUPS = 1 << 30   # the warp-MMA rule's limits lifted too
        cugemm8._config.WARP_MMA_ONE_KERNEL_MAX_GROUPS_SHARED = 1 << 30
        print(f"probe: the one-kernel form for every pick that has one, up to {rows} rows")
    ms = [int(v) for v in args.ms.split(",") if v]
    chain_ms = [int(v) for v in args.chain_ms.split(",") if v]
    nks = list(DEEPSEEK_NK[:6])
    if args.quick:
        ms = [m for m in ms if m in QUICK_MS] or list(QUICK_MS)
        chain_ms = [m for m in chain_ms if m in QUICK_MS] or list(QUICK_MS)
        nks = list(QUICK_NK)
        args.reps, args.passes = min(args.reps, 5), 1
    flush = common.L2Flush()
    timer = "CUPTI spans" if common.load_torch()[0] is not None else "CUDA-event spans"
    hidden, inter = CHAIN_DIMS
    gemm_shapes = [(m, n, k) for m in ms for n, k in nks]
    chain_shapes = [(m, inter, hidden) for m in chain_ms] + [(m, hidden, inter) for m in chain_ms]
    dg = None
    if args.deepgemm:
        import deepgemm_anchor
        dg = deepgemm_anchor.open_for(gemm_shapes)
    _precompile(cugemm8, gemm_shapes + chain_shapes)

    meta = {"cugemm8": cugemm8.__version__, "timer": timer, "reps": args.reps, "passes": args.passes,
            "one_kernel_rows": args.one_kernel_rows,
            "flush_mb": common.FLUSH_BYTES >> 20, "torch": common.torch_version(),
            "deepgemm": dg is not None, "check_limit": CHECK_LIMIT}
    records, chains = [], []
    t0 = time.perf_counter()

    def dump():          # after every row, so that a run cut short keeps what it measured
        if args.json:
            strip = [[{key: v for key, v in r.items() if not key.startswith("_")} for r in recs]
                     for recs in (records, chains)]
            Path(args.json).write_text(json.dumps({"meta": meta, "rows": strip[0], "chain": strip[1],
                                                   "summary": summarize(records)}, indent=1))

    def progress(label):
        print(f"  {label} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    for n, k in nks:
        for m in ms:
            records.append(bench_row(cugemm8, cp, m, n, k, args=args, flush=flush, dg=dg))
            common.release_memory()
            dump()
            progress(f"{m}x{n}x{k}")
    rs = cp.random.RandomState(7)
    w1, w2 = _weights(cugemm8, cp, rs, inter, hidden), _weights(cugemm8, cp, rs, hidden, inter)
    for m in chain_ms:
        chains.append(bench_chain(cugemm8, cp, m, w1, w2, args=args, flush=flush))
        common.release_memory()
        dump()
        progress(f"chain M={m}")

    print_table(f"quantise + GEMM from bf16 x (span µs, {timer}, median of {args.passes}x{args.reps}; "
                f"targets 2L/fused >= {TARGET_2L}, dg/fused >= {TARGET_DG})",
                ("M", "N", "K", "config", "form", "fused", "fused 2K", "2-launch", "2L+pdl", "DG pair", "2L/fused",
                 "dg/fused", "2K/1K", "bits", "dg diff"), [row_cells(r) for r in records])
    print_table(f"MLP chain {hidden} -> {inter} -> {hidden} (span µs, {timer}; PDL off / on)",
                ("M", "2L off", "2L pdl", "off/on", "fused off", "fused pdl", "off/on", "2L off/fused pdl",
                 "2L bits off=on", "fused bits off=on"), [chain_cells(r) for r in chains])
    print_summary(summarize(records), len(records))
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
