"""``cugemm8 tune --shapes FILE``: time the heuristic's configuration and a
pruned set of legal alternatives for each shape on this GPU, and record the
fastest in the tuned-configurations file, which the ops then use
(:mod:`cugemm8._tuned`: where the file lives, what an entry matches, why a
bad file can cost speed but never a wrong result).

Per shape (:mod:`cugemm8._tune` has the candidate family and the timing
method): every candidate's kernel is compiled first (threads); each is run
once on random operands and its output checked against the float64
reference (``calc_diff`` < 1e-3 on the valid rows), a wrong one is never
timed or chosen; then CUDA-event timings with a 256 MB L2 flush before each
repetition (``--flush``: a write, the default, or a read; see
:func:`cugemm8.cli._data.make_l2_flush`), interleaved across candidates in
rounds, median per candidate.
The heuristic's pick stays unless a candidate is more than 1 % faster.
The training kinds (``wgrad``, ``k_grouped``: the 1D1D GEMMs) are timed
accumulating in place (``c = d``, the gradient-accumulation call; each
candidate first checked without ``c``) over
:func:`cugemm8._tune.candidates_1d1d`.
``--budget-s`` is a soft limit on the run: compiling is never cut short,
and a shape whose share of the time runs out keeps what its first round
measured.
"""
from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .._shapes import ALL_KINDS, KINDS_1D1D, Shape
from ._common import (_nonnegative_int, _one_line, _positive_int, _positive_seconds, _progress, gpu_reason,
                      load_shapes_or_report, nvrtc_reason, print_table)

CHECK_LIMIT = 1e-3


def _op_m(s: Shape) -> int:
    """The m the op hands the heuristic on the operands tune builds
    (shapes-file semantics: expected_m for masked; for contiguous, m_sum
    with every group of ceil(m / g) rows padded to 128, as the data is)."""
    if s.kind == "contiguous":
        per_group = -(-s.m // s.num_groups)
        return s.num_groups * (-(-per_group // 128) * 128)
    return s.m


def _data_shape(s: Shape) -> Shape:
    """The Shape of cugemm8.cli's data generator (contiguous: rows per group)."""
    if s.kind == "contiguous":
        return Shape("contiguous", max(1, -(-s.m // s.num_groups)), s.n, s.k, s.num_groups)
    return s


def _launcher_1d1d(cfg, s: Shape, ops: dict, sfa, sfb, out, c):
    """The 1D1D op's launch of ``cfg`` (``c``: None, or ``out`` to accumulate
    in place; ``sfa`` / ``sfb`` MN-major), not run."""
    from .. import gemm_1d1d as G1
    gt = G1._GROUPED_K if s.kind == "k_grouped" else G1._NORMAL
    return G1._prepare_launch(cfg, gt, s.m, s.n, s.k, s.num_groups, ops["a"], sfa, ops["b"], sfb, out, c,
                              ops.get("ks_tensor"))


def _launcher(cfg, s: Shape, ops: dict, sfa, out):
    """The op's launch of ``cfg`` on these operands (not run)."""
    from .. import gemm as G
    a, b, sfb = ops["a"], ops["b"], ops["sfb"]
    if s.kind == "normal":
        m = a.shape[0]
        return G._prepare_launch(cfg, "normal", s.n, s.k, 1, m, m, a, sfa, b, sfb, out, None, 1)
    if s.kind == "contiguous":
        m = a.shape[0]
        return G._prepare_launch(cfg, "contiguous", s.n, s.k, s.num_groups, m, m, a, sfa, b, sfb, out,
                                 ops["m_indices"], 1)
    m_max = a.shape[1]
    return G._prepare_launch(cfg, "masked", s.n, s.k, s.num_groups, m_max, m_max, a, sfa, b, sfb, out,
                             ops["masked_m"], s.num_groups)


def cmd_tune(args) -> int:
    shapes = load_shapes_or_report(args.shapes, "tune")
    if shapes is None:
        return 2
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] or list(ALL_KINDS)
    bad = [k for k in kinds if k not in ALL_KINDS]
    if bad:
        print(f"cugemm8 tune: unknown kind(s) {', '.join(bad)}; choose from {', '.join(ALL_KINDS)}",
              file=sys.stderr)
        return 2
    shapes = [s for s in shapes if s.kind in kinds]
    if not shapes:
        print("cugemm8 tune: no shapes of the chosen kinds", file=sys.stderr)
        return 2
    reason = gpu_reason() or nvrtc_reason()
    if reason is not None:
        print(f"cugemm8 tune: no usable Hopper GPU ({_one_line(reason)}): nothing to tune", file=sys.stderr)
        return 2
    import cupy as cp

    import cugemm8

    from .. import _device, _jit, _tune, _tuned, gemm as G, gemm_1d1d as G1
    from ._data import calc_diff, make_l2_flush, make_operands, out_to_f64, poisoned_out, reference

    path = Path(args.out) if args.out else _tuned.tuned_path()
    if path is None and not args.dry_run:
        print(f"cugemm8 tune: tuned configurations are off ({_tuned.ENV_VAR}); give --out FILE",
              file=sys.stderr)
        return 2
    if path is not None and not args.dry_run:
        try:                          # fail now, not after the measurements
            path.parent.mkdir(parents=True, exist_ok=True)
            with _tuned._file_lock(Path(os.path.realpath(path))):
                pass
        except OSError as exc:
            print(f"cugemm8 tune: cannot write the tuned file {path}: {exc}", file=sys.stderr)
            return 2
    if args.num_sms is not None:
        try:
            cugemm8.set_num_sms(args.num_sms)
        except ValueError as exc:
            print(f"cugemm8 tune: --num-sms: {exc}", file=sys.stderr)
            return 2
    num_sms = cugemm8.get_num_sms()
    env = _tuned.environment(num_sms)
    t_start = time.monotonic()
    deadline_all = t_start + args.budget_s

    plan = []
    for s in shapes:
        m = _op_m(s)
        try:
            if s.kind in KINDS_1D1D:
                cands = _tune.candidates_1d1d(m, s.n, s.k, s.num_groups, num_sms, top=args.top)
            else:
                cands = _tune.candidates(s.kind, m, s.n, s.k, s.num_groups, num_sms,
                                         top=args.top, split_k=args.split_k,
                                         warp_mma=_device.is_whole_device(_device.current_device_id()))
        except (TypeError, ValueError) as exc:
            print(f"cugemm8 tune: {s.kind} {s.label()}: {exc}", file=sys.stderr)
            return 2
        plan.append((s, cands))

    def kernel_name(c, s):
        if s.kind in KINDS_1D1D:
            return G1._kernel_name(c, s.n, G1._GROUPED_K if s.kind == "k_grouped" else G1._NORMAL, s.num_groups)
        return G._kernel_name(c, s.n, s.k, G._GEMM_TYPE[s.kind], s.num_groups)

    names = {}
    for s, cands in plan:
        for c in cands:
            name = kernel_name(c, s)
            names[name] = (c.smem_bytes, G1._HEADER if s.kind in KINDS_1D1D else G._header_of(name))
    device_id = cp.cuda.Device().id
    advance, close = _progress(len(names), "cugemm8 tune: compiling")

    def build(item):
        with cp.cuda.Device(device_id):
            try:
                _jit.get_kernel(item[1][1], item[0], max_dynamic_smem=item[1][0])
                return None
            except Exception as exc:          # reported per candidate below
                return f"{type(exc).__name__}: {exc}"
    compile_errors = {}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for (name, _), err in zip(names.items(), pool.map(build, names.items())):
            advance(name.split("<", 1)[1][:40])
            if err:
                compile_errors[name] = err
    close()
    t_compiled = time.monotonic()

    flush = make_l2_flush(cp, kind=args.flush)
    results, new_entries = [], []
    advance, close = _progress(len(plan), "cugemm8 tune: timing")
    for i, (s, cands) in enumerate(plan):
        deadline = t_compiled + (deadline_all - t_compiled) * (i + 1) / len(plan)
        ops = make_operands(_data_shape(s), cp, seed=i + 1)
        ref, _ = reference(ops, _data_shape(s), cp)
        valid = ops["valid"]
        sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
        sfb = cugemm8.get_col_major_tma_aligned_tensor(ops["sfb"]) if s.kind in KINDS_1D1D else None
        runs, measured = {}, []
        for c in cands:
            meas = _tune.Measured(c)
            measured.append(meas)
            name = kernel_name(c, s)
            if name in compile_errors:
                meas.status = "error " + _one_line(compile_errors[name])[:80]
                continue
            try:
                out = poisoned_out(_data_shape(s), ops, cp)
                if s.kind in KINDS_1D1D:
                    _launcher_1d1d(c, s, ops, sfa, sfb, out, None)()      # checked without c
                    launch = _launcher_1d1d(c, s, ops, sfa, sfb, out, out)   # timed accumulating in place
                else:
                    launch = _launcher(c, s, ops, sfa, out)
                    launch()
                cp.cuda.runtime.deviceSynchronize()
                diff = calc_diff(out_to_f64(out, cp)[valid], ref[valid], cp)
            except Exception as exc:
                meas.status = f"error {type(exc).__name__}: {_one_line(exc)}"[:100]
                continue
            if not diff < CHECK_LIMIT:
                meas.status = f"wrong (calc_diff {diff:.1e})"
                continue
            runs[str(c)] = (meas, launch)
        _tune.time_candidates(runs, cp, flush, rounds=args.rounds, reps=args.reps,
                              deadline=min(deadline, deadline_all))
        heuristic = measured[0]
        win = _tune.choose(heuristic, measured)
        key_m = _op_m(s)                      # the m the candidates were chosen for
        h_us, w_us = heuristic.us, win.us
        timed = sum(1 for m in measured if m.us is not None)
        results.append({"kind": s.kind, "label": s.label(), "m": s.m, "n": s.n, "k": s.k,
                        "num_groups": s.num_groups, "heuristic": str(heuristic.config),
                        "heuristic_us": h_us, "heuristic_status": heuristic.status,
                        "tuned": str(win.config), "tuned_us": w_us, "candidates": len(measured),
                        "timed": timed,
                        "rows": [{"config": str(m.config), "us": m.us, "status": m.status}
                                 for m in measured]})
        if w_us is not None:
            new_entries.append(_tune.record(s.kind, key_m, s.n, s.k, s.num_groups, env, win, heuristic,
                                            len(measured), flush=args.flush))
        advance(s.label())
        del ops, ref, runs
        cp.get_default_memory_pool().free_all_blocks()
    close()
    elapsed = time.monotonic() - t_start

    written = None
    if new_entries and not args.dry_run:
        try:
            written = _tuned.write_entries(new_entries, path)
        except OSError as exc:
            print(f"cugemm8 tune: cannot write {path}: {exc}", file=sys.stderr)
            return 1
        G.reload_tuned_configs()

    rows, gains = [], []
    for r in results:
        h, w = r["heuristic_us"], r["tuned_us"]
        gain = h / w if h and w else None
        if gain:
            gains.append(gain)
        rows.append((r["kind"], r["label"], r["heuristic"], f"{h:.1f}" if h else r["heuristic_status"],
                     r["tuned"] if r["tuned"] != r["heuristic"] else "=", f"{w:.1f}" if w else "-",
                     f"{gain:.3f}" if gain else "-", f"{r['timed']}/{r['candidates']}"))
    title = (f"cugemm8 tune: {len(results)} shapes, {env['gpu']}, {num_sms} SMs, "
             f"{elapsed:.0f} s ({t_compiled - t_start:.0f} s compiling)")
    print_table(title, ("kind", "shape", "heuristic", "µs", "tuned", "µs", "gain", "timed"), rows)
    if gains:
        import math
        geo = math.exp(sum(math.log(g) for g in gains) / len(gains))
        changed = sum(1 for r in results if r["tuned"] != r["heuristic"])
        print(f"geomean gain over the heuristic {geo:.3f} ({changed} of {len(results)} shapes changed)")
    if written is not None:
        print(f"wrote {len(new_entries)} entries to {written}")
    elif args.dry_run:
        print("--dry-run: nothing written")
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "num_sms": num_sms, "elapsed_s": elapsed,
                                               "file": str(written) if written else None,
                                               "shapes": results}, indent=1))
    return 0


def register(sub) -> None:
    p = sub.add_parser("tune", help="time candidate kernel configurations on this GPU and record the fastest",
                       description="Time the heuristic's configuration and a pruned set of legal "
                                   "alternatives for each shape on this GPU (each checked against the "
                                   "float64 reference first), and record the fastest in the tuned file "
                                   "($CUGEMM8_TUNED_FILE, default ~/.cache/cugemm8/tuned.json), which the "
                                   "ops then use where GPU, SM budget, driver, NVRTC, CuPy, kernel "
                                   "sources and shape bucket match.")
    p.add_argument("--shapes", required=True, metavar="FILE",
                   help="shapes file (see `cugemm8 warmup --help`) or a preset: @normal (18 shapes), "
                        "@decode (48), @grouped, @check, @check-quick")
    p.add_argument("--kinds", default="", help="comma-separated kinds to tune (default: all in the file)")
    p.add_argument("--budget-s", type=_positive_seconds, default=300.0,
                   help="soft time limit of the run (default 300 s): compiling is never cut short, and "
                        "every shape gets at least one timing round")
    p.add_argument("--num-sms", type=_positive_int, default=None,
                   help="tune for this SM budget (cugemm8.set_num_sms; default: the device's)")
    p.add_argument("--top", type=_positive_int, default=6, help="the cost model's top configs per shape (6)")
    p.add_argument("--split-k", type=_nonnegative_int, default=4, help="split-K candidates per shape (4)")
    p.add_argument("--rounds", type=_positive_int, default=4, help="interleaved timing rounds (4)")
    p.add_argument("--reps", type=_positive_int, default=5, help="repetitions per candidate per round (5)")
    p.add_argument("--jobs", type=_positive_int, default=min(16, os.cpu_count() or 1),
                   help="compile threads (default: the CPU count, at most 16)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="tuned file to merge into (default: $CUGEMM8_TUNED_FILE or ~/.cache/cugemm8/tuned.json)")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the full report (every candidate) here")
    p.add_argument("--dry-run", action="store_true", help="measure and report, write nothing")
    p.add_argument("--flush", choices=("write", "read"), default="write",
                   help="L2 flush before each timed repetition: a 256 MB write (default; leaves dirty "
                        "lines, DeepGEMM's benchmark method) or read (clean lines, closer to a decode step "
                        "in a model; e.g. the swap-AB decode kernel wins at 4096x7168 only after this)")
    p.set_defaults(func=cmd_tune)
