"""``cugemm8 check`` (the default command, the main job): every DeepSeek-V3
normal-GEMM shape (M in 1, 64, 128, 4096), one contiguous and one masked
grouped shape, and the training GEMMs (the six weight gradients at 4096
tokens and one k-grouped MoE weight gradient, FP32 out) on random data, each
result checked against a float64 reference of the dequantised operands with
a per-element error bound, then timed.  Prints a table; exits 1 if any shape fails, 2 when no Hopper GPU is
usable."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .._shapes import Shape, check_shapes
from ._common import _fmt, _one_line, _progress, gpu_reason, print_table
from ._data import (DIFF_LIMIT, POISON_BITS, calc_diff, config_string, gemm_bytes, gemm_bytes_1d1d,
                    gemm_call, gemm_flops, make_l2_flush, make_operands, out_to_f64, poisoned_out,
                    reference, time_us, valid_rows)


@dataclasses.dataclass
class CheckResult:
    shape: Shape
    config: str = ""
    us: float = float("nan")
    tflops: float = float("nan")
    gbps: float = float("nan")
    diff: float = float("nan")
    max_err: float = float("nan")          # worst |D - ref| / bound (<= 1 passes)
    passed: bool = False
    note: str = ""




def _check_values(shape: Shape, ops: dict, out, cp, res: CheckResult) -> None:
    """Fill ``res.diff``, ``res.max_err``, ``res.passed``, ``res.note``."""
    ref, bound = reference(ops, shape, cp, bound=True)
    got = out_to_f64(out, cp)
    valid = ops["valid"]
    # an element whose bound is 0 (an empty k-group: D = 0 exactly) must equal its reference
    diff = cp.abs(got - ref)
    err = cp.where(bound > 0, diff / cp.where(bound > 0, bound, 1.0), cp.where(diff == 0, 0.0, cp.inf))
    res.diff = calc_diff(got[valid], ref[valid], cp)
    res.max_err = float(cp.nan_to_num(err[valid], nan=cp.inf).max()) if bool(valid.any()) else 0.0
    notes = []
    if not res.diff < DIFF_LIMIT:
        notes.append(f"calc_diff {res.diff:.2e} >= {DIFF_LIMIT:g}")
    if not res.max_err <= 1.0:
        notes.append("element error above its bound")
    invalid = ~valid
    if bool(invalid.any()):
        bits = out.view(cp.uint16)[invalid]
        if shape.kind == "contiguous" and not bool((got[invalid] == 0).all()):
            notes.append("padding rows not zero")
        if shape.kind == "masked" and not bool((bits == POISON_BITS).all()):
            notes.append("rows past masked_m were written")
    res.passed = not notes
    res.note = "; ".join(notes)


def check_one(shape: Shape, *, seed: int, reps: int, flush=None) -> CheckResult:
    """Build data, run, check against the reference, then time one shape."""
    import cupy as cp
    res = CheckResult(shape)
    try:
        ops = make_operands(shape, cp, seed=seed, vary=shape.kind != "normal")
        res.config = config_string(shape, ops)
        out = poisoned_out(shape, ops, cp)
        run = gemm_call(shape, ops, out)
        run()
        cp.cuda.get_current_stream().synchronize()
        _check_values(shape, ops, out, cp, res)
        res.us = time_us(run, cp, reps=reps, flush=flush)
        rows = valid_rows(shape, ops)
        num_b = shape.num_groups
        res.tflops = gemm_flops(shape.kind, rows, shape.n, shape.k) / res.us / 1e6
        nbytes = (gemm_bytes_1d1d(shape.m, shape.n, shape.k, shape.num_groups) if shape.kind in ("wgrad", "k_grouped")
                  else gemm_bytes(rows, shape.n, shape.k, num_b))
        res.gbps = nbytes / res.us / 1e3
    except Exception as exc:
        res.passed = False
        res.note = _one_line(f"{type(exc).__name__}: {exc}")[:300]
    finally:
        cp.get_default_memory_pool().free_all_blocks()
    return res


CHECK_COLUMNS = ("kind", "shape", "config", "µs", "TFLOPS", "GB/s", "calc_diff", "err/bound", "result")


def _check_row(r: CheckResult) -> tuple:
    verdict = "PASS" if r.passed else "FAIL" + (f": {r.note}" if r.note else "")
    return (r.shape.kind, r.shape.label(), r.config, _fmt(r.us, ".1f"), _fmt(r.tflops, ".1f"),
            _fmt(r.gbps, ".0f"), _fmt(r.diff, ".2e"), _fmt(r.max_err, ".3f"), verdict)



def cmd_check(args) -> int:
    reason = gpu_reason()
    if reason is not None:
        print(f"cugemm8: no usable Hopper GPU: {reason}")
        return 2
    import cupy as cp
    shapes = check_shapes(quick=args.quick)
    flush = make_l2_flush(cp)
    advance, close = _progress(len(shapes))
    results = []
    try:
        for i, shape in enumerate(shapes):
            results.append(check_one(shape, seed=args.seed + i, reps=args.reps, flush=flush))
            advance(f"{shape.kind} {shape.label()}")
    finally:
        close()
    failed = sum(not r.passed for r in results)
    title = (f"cugemm8 check: {len(results) - failed}/{len(results)} passed "
             f"(median of {args.reps}, L2 flushed; err/bound <= 1 and calc_diff < {DIFF_LIMIT:g} pass)")
    print_table(title, CHECK_COLUMNS, [_check_row(r) for r in results])
    if args.json:
        rows = [dict(dataclasses.asdict(r), shape=dataclasses.asdict(r.shape)) for r in results]
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 1 if failed else 0



def register(sub) -> None:
    p = sub.add_parser("check", help="run, verify and time the DeepSeek-V3 shapes (default)",
                       description="Check every DeepSeek-V3 shape against a float64 reference and time it. "
                                   "Exit 0: all pass; 1: a shape failed; 2: no usable Hopper GPU.")
    p.add_argument("--quick", action="store_true", help="a handful of shapes only")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions per shape (median; default 10)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    p.set_defaults(func=cmd_check)
