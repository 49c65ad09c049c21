"""The transposing casts (issue 21) on one GPU, in one call: exactness of every
built configuration, then their times against a same-size copy and v0.10.

    python3 tools/perf/sweep_cast_t.py --out DIR [--reps 30] [--passes 2] [--budget-s 80]
                                       [--skip-checks] [--extra-cases] [--configs 'C1;C2']
                                       [--cases 'LABEL1;LABEL2']

1. Every kernel the sweep launches is compiled first, in threads.
2. Exactness: every configuration of ``quant.transpose_configs`` (both
   kinds, every input dtype, both persistent grids and, for one-tile rings,
   one CTA per tile) on awkward shapes -- tails in both dimensions, batches, NaN / Inf
   columns and tiles, a NaN in a partial 16-row chunk, pow2 scales, both
   scale layouts of the per-column kind -- into poisoned, guarded buffers,
   against :mod:`cugemm8.reference` (NaN compared as NaN), the persistent
   grid cut to two SMs so each CTA's ring wraps many times; then, on each
   timed case, the default configuration against the reference and every
   other one against the default, bit for bit.
3. Timing, on the four cases of benches/RESULTS.md v0.10 "Issue 21: the
   transposing casts on the GPU": per_token_t [4096, 7168] bf16,
   [4096, 2048] bf16, cast_transpose [7168, 7168] bf16, per_token_t
   [4096, 7168] fp32 (and the default with ``mn_major=True``): a 256 MB L2
   flush before every repetition, ``--passes`` interleaved passes of
   ``--reps``, median; CUDA events for every variant and CUPTI kernel
   durations (torch.profiler, when torch is importable; the v0.10 numbers are
   CUPTI) while the time budget lasts.  Each case's same-size copy
   (cudaMemcpyAsync moving the case's bytes, benches/bench_quant.py) is timed
   the same way in the same run, and a 2 GB copy gives the large-copy
   ceiling.  Only exact variants are timed.

Prints, per case and variant: µs (events, CUPTI), GB/s, % of the same-size
copy (its time over the variant's, same method), % of the large-copy
ceiling, the v0.10 kernel's time over this one, and the driver's CTAs per
SM; the best variant per case.  Writes DIR/sweep_cast_t.json.  Reports;
never asserts (exit status 1 when any variant was not exact).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import traceback
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[1]))
sys.path.insert(1, str(_HERE.parents[1] / "benches"))

import cupy as cp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import bench_quant  # noqa: E402
import common  # noqa: E402
from cugemm8 import _device, _jit, quant as Q  # noqa: E402
from cugemm8 import reference as R  # noqa: E402

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
KINDS = ("transpose_column", "transpose_block")
REF = {"transpose_column": R.per_token_cast_to_fp8_t, "transpose_block": R.cast_transpose_block_fp8}

#: benches/RESULTS.md v0.10 (bench_quant.py, CUPTI column): (kernel µs, same-size copy µs)
V010 = {"per_token_t [4096, 7168] bf16": (67.6, 22.9), "per_token_t [4096, 2048] bf16": (21.6, 7.9),
        "cast_transpose [7168, 7168] bf16": (97.7, 41.0), "per_token_t [4096, 7168] fp32": (65.8, 37.0)}

#: (label, kind, dtype, shape) of the timed cases
CASES = (("per_token_t [4096, 7168] bf16", "transpose_column", "bfloat16", (4096, 7168)),
         ("per_token_t [4096, 2048] bf16", "transpose_column", "bfloat16", (4096, 2048)),
         ("cast_transpose [7168, 7168] bf16", "transpose_block", "bfloat16", (7168, 7168)),
         ("per_token_t [4096, 7168] fp32", "transpose_column", "float32", (4096, 7168)))

#: More timed cases (``--extra-cases``): the one-round inputs (at most 4 x 132
#: tiles of 128 x 128, the default's one wave) beside larger ones, to decide
#: the grid of small inputs.
EXTRA_CASES = (("per_token_t [2048, 2048] bf16", "transpose_column", "bfloat16", (2048, 2048)),
               ("per_token_t [4096, 1536] bf16", "transpose_column", "bfloat16", (4096, 1536)),
               ("per_token_t [4096, 2048] fp16", "transpose_column", "float16", (4096, 2048)),
               ("per_token_t [4096, 4096] bf16", "transpose_column", "bfloat16", (4096, 4096)),
               ("per_token_t [8192, 2048] bf16", "transpose_column", "bfloat16", (8192, 2048)),
               ("per_token_t [4096, 2048] fp32", "transpose_column", "float32", (4096, 2048)),
               ("cast_transpose [2048, 7168] bf16", "transpose_block", "bfloat16", (2048, 7168)),
               ("cast_transpose [2048, 2048] bf16", "transpose_block", "bfloat16", (2048, 2048)))

#: (shape, pow2) of the exactness checks; NaN / Inf are placed by _check_input
CHECK_SHAPES = (((2, 300, 520), False), ((129, 257), True), ((1, 16), False), ((3, 128, 136), True))


# ----------------------------------------------------------------------------
# Variants
# ----------------------------------------------------------------------------

_CONFIG_RE = re.compile(r"(\d+)c s(\d+) x(\d+)(?: (balanced|full|tiles))?")


def parse_config(text: str):
    """``'64c s2 x3 [balanced|full|tiles]'`` -> TransposeConfig of the
    per-column cast for 16-bit inputs (64, 128 or 256 columns: tile rows of
    128-512 bytes; at least one stage and one CTA per SM; grid balanced by
    default).  Raises ValueError otherwise."""
    m = _CONFIG_RE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"config {text!r} is not of the form '64c s2 x3 [balanced|full|tiles]'")
    cols, stages, ctas = (int(m.group(i)) for i in (1, 2, 3))
    if cols not in (64, 128, 256) or stages < 1 or ctas < 1:
        raise ValueError(f"config {text!r}: columns 64, 128 or 256, stages and CTAs per SM at least 1")
    return Q.TransposeConfig(cols, stages, ctas, m.group(4) or "balanced")


def add_configs(configs) -> None:
    """Build and time ``configs`` too, for the per-column cast of 16-bit
    inputs: appended (for this process) to the configurations the library
    builds, after its default, so every step below treats them as built
    (every grid form of each is timed, so the grid given only names it)."""
    key = ("transpose_column", False)
    built = list(Q._TRANSPOSE_CONFIGS[key])
    for c in configs:
        if tuple(c[:3]) not in [tuple(b[:3]) for b in built]:
            built.append(c)
    Q._TRANSPOSE_CONFIGS[key] = tuple(built)


def variants(kind: str, dtype_name: str) -> list:
    """Every built configuration in both persistent grid forms, and the
    one-tile rings also as one CTA per tile; the default (as it launches)
    first (``--configs`` ones are among the built ones: :func:`add_configs`)."""
    out = []
    for cfg in Q.transpose_configs(kind, dtype_name):
        forms = [cfg] + [cfg._replace(grid=g) for g in ("balanced", "full", "tiles")
                         if g != cfg.grid and (g != "tiles" or cfg.stages == 1)]
        out += [f for f in forms if f not in out]
    return out


def kernel_jobs() -> list:
    """(name, dynamic smem) of every kernel this sweep launches."""
    jobs = {}
    for kind in KINDS:
        for dt in DTYPES:
            for cfg in Q.transpose_configs(kind, dt):
                for pow2 in (False, True):
                    jobs[Q.kernel_name(kind, dt, pow2, cfg)] = cfg.smem_bytes(np.dtype(DTYPES[dt]).itemsize)
    return list(jobs.items())


def occupancy(kind: str, dtype_name: str, cfg) -> int | None:
    """The driver's resident CTAs per SM for a configuration (None if it cannot say)."""
    try:
        from cupy_backends.cuda.api import driver
        smem = cfg.smem_bytes(np.dtype(DTYPES[dtype_name]).itemsize)
        kern = _jit.get_kernel(Q._HEADER, Q.kernel_name(kind, dtype_name, False, cfg), max_dynamic_smem=smem,
                               smem_carveout=100)
        return int(driver.occupancyMaxActiveBlocksPerMultiprocessor(kern.kernel.ptr, Q._THREADS, smem))
    except Exception:  # a report field, not a failure
        return None


# ----------------------------------------------------------------------------
# Launching into given (or guarded) buffers
# ----------------------------------------------------------------------------

def out_shapes(kind: str, shape, mn_major: bool):
    """(payload shape, scale buffer shape) of the 3-D launch form."""
    *lead, rows, cols = shape
    g = lead[0] if lead else 1
    rb, cb = -(-rows // 128), -(-cols // 128)
    if mn_major:
        sf = (g, rb, Q.tma_aligned_size(cols))
    else:
        sf = (g, cols, rb) if kind == "transpose_column" else (g, cb, rb)
    return (g, cols, Q.padded_k(rows)), sf


class Prepared:
    """An input made kernel-ready once (K padding, in-place check) and the
    output buffers of one launch form; ``launch(cfg)`` runs one variant."""

    def __init__(self, kind, x_dev, pow2=False, mn_major=False, guard=0, poison=(0, 0)):
        self.kind, self.pow2, self.mn_major = kind, pow2, mn_major
        self.shape = tuple(x_dev.shape)
        *_, self.rows, self.cols = self.shape
        self.xk = Q._in_place_or_copy(Q._pad_k("x", x_dev, cp), cp)
        b_shape, s_shape = out_shapes(kind, self.shape, mn_major)
        self.b, self.b_whole = _buffer(b_shape, np.uint8, guard, poison[0])
        self.sf, self.s_whole = _buffer(s_shape, np.float32, guard, poison[1])
        self.guard, self.poison = guard, poison
        self.min_amax = np.float32(1e-4)

    def launch(self, cfg) -> None:
        Q._launch_cast_transpose(self.xk, self.b, self.sf, self.rows, self.cols, self.min_amax, self.pow2,
                                 self.kind == "transpose_column", self.mn_major, config=cfg)

    def results(self):
        """(payload [..., cols, rows], scales in the reference's layout) on the host."""
        b = self.b.get()[..., :self.rows]
        s = self.sf.get()
        if self.mn_major:
            s = np.swapaxes(s[..., :self.cols], -1, -2)
        if len(self.shape) == 2:
            b, s = b[0], s[0]
        return b, s

    def padding_ok(self) -> bool:
        ok = not self.b.get()[..., self.rows:].any()
        if self.mn_major:
            ok = ok and not self.sf.get()[..., self.cols:].any()
        return bool(ok)

    def guards_ok(self) -> bool:
        if not self.guard:
            return True
        ok = True
        for whole, bits in ((self.b_whole, self.poison[0]), (self.s_whole, self.poison[1])):
            h = whole.get()
            n = self.guard // h.itemsize
            ok = ok and bool(np.all(h[:n] == bits) and np.all(h[-n:] == bits))
        return ok


def _buffer(shape, dtype, guard: int, poison: int):
    """A C-contiguous ``shape`` array; with ``guard`` bytes, a view into a
    larger buffer whose every element (guards included) holds ``poison``."""
    if not guard:
        a = cp.empty(shape, dtype=dtype)
        return a, a
    item = np.dtype(dtype).itemsize
    count = int(np.prod(shape))
    raw = {1: np.uint8, 4: np.uint32}[item]
    whole = cp.full(count + 2 * guard // item, poison, dtype=raw)
    return whole[guard // item:guard // item + count].view(dtype).reshape(shape), whole


def compare(got, want) -> str | None:
    """None when the payloads and scales are bit-identical (every NaN code
    equal to every other), else what differs first."""
    (gb, gs), (wb, ws) = got, want
    gb, wb = np.asarray(gb), np.asarray(wb)
    gs, ws = np.asarray(gs, np.float32), np.asarray(ws, np.float32)
    if gb.shape != wb.shape or gs.shape != ws.shape:
        return f"shape payload {gb.shape} / {wb.shape}, scales {gs.shape} / {ws.shape}"
    nan_g, nan_w = (gb & 0x7F) == 0x7F, (wb & 0x7F) == 0x7F
    bad = (nan_g != nan_w) | (~nan_w & (gb != wb))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return f"{int(bad.sum())} payload bytes differ, first at {idx}: {int(gb[idx]):#04x} vs {int(wb[idx]):#04x}"
    sn_g, sn_w = np.isnan(gs), np.isnan(ws)
    bad = (sn_g != sn_w) | (~sn_w & (gs.view(np.uint32) != ws.view(np.uint32)))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return f"{int(bad.sum())} scales differ, first at {idx}: {gs[idx]!r} vs {ws[idx]!r}"
    return None


# ----------------------------------------------------------------------------
# Exactness
# ----------------------------------------------------------------------------

def _check_input(rng, shape, dtype_name):
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-8, 9, shape)
    flat = x.reshape(-1, shape[-2], shape[-1])
    rows, cols = shape[-2:]
    if rows >= 300 and cols > 200:
        flat[-1, 290, 5] = np.nan          # last row block: chunk rows 288..303, 12 of them valid
        flat[0, 260, 9] = np.inf
        flat[0, 100, 130] = -np.inf
        flat[-1, :, 200] = np.nan          # a whole channel
    elif rows > 100 and cols > 100:
        flat[0, 3, 100] = np.nan
        flat[-1, rows - 1, 7] = -np.inf
    with np.errstate(over="ignore"):
        return x.astype(DTYPES[dtype_name])


def run_checks(report: dict, log) -> int:
    """The awkward-shape exactness checks of every variant; returns the failure count."""
    fails = 0
    saved = _device.get_num_sms
    _device.get_num_sms = lambda device_id=None: 2          # every persistent CTA's ring wraps
    try:
        for shape, pow2 in CHECK_SHAPES:
            for dt in DTYPES:
                rng = np.random.default_rng(zlib.crc32(repr((shape, dt)).encode()))
                x = _check_input(rng, shape, dt)
                xd = cp.asarray(x)
                for kind in KINDS:
                    with np.errstate(all="ignore"):
                        want = REF[kind](x, pow2_scale=pow2)
                    for mn_major in ((False, True) if kind == "transpose_column" else (False,)):
                        for cfg in variants(kind, dt):
                            what = f"{kind} {dt} {shape} pow2={pow2} mn_major={mn_major} [{cfg.label()}]"
                            try:
                                for poison in ((0x5A, 0x7FC00001), (0xA5, 0x3F800000)):
                                    p = Prepared(kind, xd, pow2, mn_major, guard=4096, poison=poison)
                                    p.launch(cfg)
                                    err = compare(p.results(), want)
                                    if err is None and not p.padding_ok():
                                        err = "padding not zero"
                                    if err is None and not p.guards_ok():
                                        err = "wrote outside its outputs"
                                    if err is not None:
                                        break
                            except Exception as exc:  # a report, not a crash
                                err = f"{type(exc).__name__}: {exc}"
                            report["checks"].append({"what": what, "ok": err is None, "error": err})
                            if err is not None:
                                fails += 1
                                log(f"  FAIL {what}: {err}")
        cp.cuda.runtime.deviceSynchronize()
    finally:
        _device.get_num_sms = saved
    return fails


# ----------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------

def cupti_times(fns, reps: int, flush) -> list:
    """CUPTI kernel durations (µs) of each callable, ``reps`` times, each run
    after its own L2 flush, in ONE profiler session (benches/common.py's
    _profiled_reps splits the activities at every flush: group i belongs to
    callable i % len(fns)); empty lists when torch / CUPTI recorded nothing."""
    seq = []
    for fn in fns:
        seq += [fn, flush]
    groups = common._profiled_reps(seq[:-1], reps=reps, flush=flush)
    out = [[] for _ in fns]
    if groups is None or len(groups) != reps * len(fns):
        return out
    for i, acts in enumerate(groups):
        total = sum(dur for _, dur in acts)
        if total:
            out[i % len(fns)].append(total)
    return out


def time_case(label, kind, dt, shape, args, flush, ceiling, budget_end, log, fails_out):
    x = bench_quant._input(np.random.default_rng(zlib.crc32(label.encode())), shape, DTYPES[dt])
    nbytes = bench_quant.case_bytes(kind, shape[0], shape[1], np.dtype(DTYPES[dt]).itemsize)
    # exactness on this case: the default against the reference, the others against the default
    forms = [(cfg, False) for cfg in variants(kind, dt)]
    if kind == "transpose_column":
        forms.append((Q.transpose_configs(kind, dt)[0], True))        # the training path's mn_major
    preps = {mn: Prepared(kind, x, False, mn) for mn in {mn for _, mn in forms}}
    default = forms[0][0]
    with np.errstate(all="ignore"):
        want = REF[kind](x.get())
    errs = {}
    try:
        preps[False].launch(default)
        base = preps[False].results()
        err = compare(base, want)
    except Exception as exc:  # reported, the other variants still run
        base, err = None, f"{type(exc).__name__}: {exc}"
    if err is not None:
        errs[(default, False)] = f"default vs reference: {err}"
        base = None                         # then every variant is compared with the reference itself
    base_b, base_s = (preps[False].b.copy(), preps[False].sf.copy()) if base is not None else (None, None)
    for cfg, mn in forms:
        if (cfg, mn) == (default, False):
            continue
        prep = preps[mn]
        try:
            prep.launch(cfg)
            if base is not None and not mn and bool(cp.array_equal(prep.b, base_b)) and bool(
                    cp.array_equal(prep.sf.view(cp.uint32), base_s.view(cp.uint32))):
                continue                   # bit for bit the default's outputs (compared on the GPU)
            e = compare(prep.results(), base if base is not None else want)
            if e is not None:
                e = f"vs the {'default' if base is not None else 'reference'}: {e}"
        except Exception as exc:
            e = f"{type(exc).__name__}: {exc}"
        if e is not None:
            errs[(cfg, mn)] = e
    del base_b, base_s
    for (cfg, mn), e in errs.items():
        fails_out.append(f"{label} [{cfg.label()}{' mn_major' if mn else ''}]: {e}")
        log(f"  FAIL {label} [{cfg.label()}{' mn_major' if mn else ''}]: {e}")
    timed = [(cfg, mn) for cfg, mn in forms if (cfg, mn) not in errs]
    copy = bench_quant.same_size_copy(nbytes)
    fns = {"copy": copy}
    for cfg, mn in timed:
        fns[(cfg, mn)] = (lambda p=preps[mn], c=cfg: p.launch(c))
    ev = {key: [] for key in fns}
    ku = {key: [] for key in fns}
    keys = list(fns)
    use_cupti = common.load_torch()[0] is not None
    for pss in range(args.passes):
        order = keys[pss % len(keys):] + keys[:pss % len(keys)]
        for key in order:
            ev[key] += common.time_call(fns[key], reps=args.reps, warmup=2, flush=flush).samples
        if use_cupti and time.perf_counter() < budget_end:
            for key, samples in zip(order, cupti_times([fns[k] for k in order], args.reps, flush)):
                ku[key] += samples
    med = {key: (statistics.median(ev[key]), statistics.median(ku[key]) if ku[key] else None) for key in keys}
    copy_ev, copy_k = med["copy"]
    v_us, v_copy = V010[label] if label in V010 else (None, None)
    rows = []
    for cfg, mn in timed:
        t_ev, t_k = med[(cfg, mn)]
        row = {"config": cfg._asdict(), "label": cfg.label() + (" mn_major" if mn else ""), "mn_major": mn,
               "us_events": t_ev, "us_cupti": t_k, "gbps_events": nbytes / t_ev / 1e3,
               "of_same_size_copy_events": copy_ev / t_ev, "of_copy_events": nbytes / t_ev / 1e3 / ceiling,
               "ctas_per_sm_driver": occupancy(kind, dt, cfg)}
        if t_k is not None:
            row.update(gbps_cupti=nbytes / t_k / 1e3, of_copy_cupti=nbytes / t_k / 1e3 / ceiling)
            if copy_k is not None:
                row["of_same_size_copy_cupti"] = copy_k / t_k
            if v_us is not None:
                row["speedup_vs_v010"] = v_us / t_k
        elif v_us is not None:              # no CUPTI: events also count the launch, so this understates
            row["speedup_vs_v010_events"] = v_us / t_ev
        rows.append(row)
    del x, preps, fns, copy
    common.release_memory()
    return {"case": label, "kind": kind, "dtype": dt, "shape": list(shape), "bytes": nbytes,
            "copy_us_events": copy_ev, "copy_us_cupti": copy_k,
            "v010_us_cupti": v_us, "v010_copy_us_cupti": v_copy,
            "v010_of_same_size_copy": (v_copy / v_us) if v_us else None,
            "not_exact": [f"{c.label()}{' mn_major' if m else ''}: {e}" for (c, m), e in errs.items()],
            "variants": rows}


def _pct(v):
    return f"{100 * v:6.1f}%" if v is not None else "    n/a"


def _us(v):
    return f"{v:8.1f}" if v is not None else "     n/a"


def print_case(res, log) -> None:
    v = res["v010_us_cupti"]
    log(f"\n{res['case']}  ({res['bytes'] / 1e6:.1f} MB moved)  same-size copy: {_us(res['copy_us_events'])} us "
        f"events, {_us(res['copy_us_cupti'])} us CUPTI" + (f"   v0.10: {v:.1f} us CUPTI, "
                                                           f"{100 * res['v010_of_same_size_copy']:.1f}% of "
                                                           f"its copy" if v else ""))
    log(f"  {'variant':<28}{'us ev':>8}{'us cupti':>9}{'GB/s':>7}{'%copy ev':>9}{'%copy cu':>9}"
        f"{'%ceil':>8}{'x v0.10':>8}{'CTA/SM':>7}")
    for r in sorted(res["variants"], key=lambda r: r["us_cupti"] or r["us_events"]):
        gb = r.get("gbps_cupti", r["gbps_events"])
        if "speedup_vs_v010" in r:
            x = f"{r['speedup_vs_v010']:8.2f}"
        elif "speedup_vs_v010_events" in r:
            x = f"{r['speedup_vs_v010_events']:7.2f}e"
        else:
            x = "     n/a"
        occ = r["ctas_per_sm_driver"]
        log(f"  {r['label']:<28}{_us(r['us_events'])} {_us(r['us_cupti'])}{gb:7.0f}"
            f"{_pct(r['of_same_size_copy_events']):>9}{_pct(r.get('of_same_size_copy_cupti')):>9}"
            f"{_pct(r.get('of_copy_cupti', r['of_copy_events'])):>8}{x}{occ if occ is not None else 'n/a':>7}")
    if any("speedup_vs_v010_events" in r for r in res["variants"]):
        log("  (x v0.10 marked e: v0.10's CUPTI time over this run's CUDA-event time, which also counts the "
            "launch: understated)")
    for e in res["not_exact"]:
        log(f"  NOT EXACT (not timed): {e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for sweep_cast_t.json")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=80.0,
                    help="CUPTI timing stops once this many seconds have passed (events continue)")
    ap.add_argument("--skip-checks", action="store_true", help="skip the awkward-shape exactness checks")
    ap.add_argument("--extra-cases", action="store_true", help="also time EXTRA_CASES (smaller and one-round inputs)")
    ap.add_argument("--configs", default="",
                    help="more per-column configurations for 16-bit inputs, ';'-separated, e.g. "
                         "'64c s2 x3;64c s3 x2' (compiled, checked and timed in every grid form)")
    ap.add_argument("--cases", default="",
                    help="time only the cases whose label contains one of these ';'-separated strings")
    args = ap.parse_args(argv)
    try:
        add_configs([parse_config(c) for c in args.configs.split(";") if c.strip()])
    except ValueError as exc:
        ap.error(str(exc))
    cases = CASES + (EXTRA_CASES if args.extra_cases else ())
    wanted = [c.strip() for c in args.cases.split(";") if c.strip()]
    unknown = [w for w in wanted if not any(w in c[0] for c in cases)]
    if unknown:
        ap.error(f"--cases: no case label contains {unknown} (labels: {[c[0] for c in cases]})")
    if wanted:
        cases = tuple(c for c in cases if any(w in c[0] for w in wanted))
    t0 = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(s=""):
        print(s, flush=True)
        lines.append(s)

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    report = {"device": name, "num_sms": _device.get_num_sms(), "reps": args.reps, "passes": args.passes,
              "torch": common.torch_version(), "checks": [], "cases": [], "errors": []}
    log(f"device: {name}, {report['num_sms']} SMs; {report['torch']}")
    jobs = kernel_jobs()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda j: _jit.get_kernel(Q._HEADER, j[0], max_dynamic_smem=j[1], smem_carveout=100), jobs))
    log(f"{len(jobs)} kernels built in {time.perf_counter() - t0:.1f} s")
    fails = 0
    if not args.skip_checks:
        t1 = time.perf_counter()
        fails = run_checks(report, log)
        log(f"exactness: {len(report['checks']) - fails} of {len(report['checks'])} variant checks bit-identical "
            f"to the reference ({time.perf_counter() - t1:.1f} s)")
    flush = common.L2Flush()
    ceiling = common.copy_bandwidth_gbps(common.COPY_BYTES, reps=5)
    report["copy_gbps"] = ceiling
    log(f"large D2D copy ceiling: {ceiling:.0f} GB/s (2 GB, read + write); %copy: the same-size copy's time "
        f"over the variant's (same method); %ceil: GB/s over the ceiling")
    case_fails = []
    for label, kind, dt, shape in cases:
        try:
            res = time_case(label, kind, dt, shape, args, flush, ceiling, t0 + args.budget_s, log, case_fails)
            report["cases"].append(res)
            print_case(res, log)
        except Exception as exc:  # keep the other cases
            report["errors"].append(f"{label}: {type(exc).__name__}: {exc}")
            log(f"\n{label}: ERROR {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        (out_dir / "sweep_cast_t.json").write_text(json.dumps(report, indent=1))
    log("\nbest per case (row-major scales; CUPTI where measured, else events):")
    for res in report["cases"]:
        if not res["variants"]:
            continue
        row_major = [r for r in res["variants"] if not r["mn_major"]]
        if not row_major:
            continue
        best = min(row_major, key=lambda r: r["us_cupti"] or r["us_events"])
        want = Q.transpose_configs(res["kind"], res["dtype"])[0]._asdict()
        default = next((r for r in row_major if r["config"] == want), None)
        text = (f"default {default['label']} {default['us_cupti'] or default['us_events']:7.1f} us "
                f"({_pct(default.get('of_same_size_copy_cupti', default['of_same_size_copy_events'])).strip()})"
                if default is not None else "default NOT EXACT")
        log(f"  {res['case']:<34} best {best['label']:<24} {best['us_cupti'] or best['us_events']:7.1f} us "
            f"({_pct(best.get('of_same_size_copy_cupti', best['of_same_size_copy_events'])).strip()} of copy); "
            + text)
    report["seconds"] = time.perf_counter() - t0
    report["log"] = lines
    (out_dir / "sweep_cast_t.json").write_text(json.dumps(report, indent=1))
    total_fails = fails + len(case_fails) + len(report["errors"])
    log(f"{'ALL EXACT' if not fails and not case_fails else f'{fails + len(case_fails)} NOT EXACT'}; "
        f"{len(report['errors'])} errors; {report['seconds']:.1f} s; wrote {out_dir / 'sweep_cast_t.json'}")
    return 1 if total_fails else 0


if __name__ == "__main__":
    sys.exit(main())
