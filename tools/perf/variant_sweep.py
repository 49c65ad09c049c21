"""Time kernel *source variants* against each other on forced configurations
(one GPU call).

    python tools/perf/variant_sweep.py PLAN.json [--reps 20] [--json OUT] [--profiler] [--bitwise]
                                      [--sweep-json OUT]

A variant is a copy of ``cuda_src/`` with some ``#define NAME VALUE`` lines
of ``fp8_gemm_1d2d.cuh`` rewritten (experiment switches) and optional
literal text replacements ``[file, old, new]``.  PLAN.json::

    {"variants": {"base": {}, "pipe": {"defines": {"CUGEMM8_PIPE_MAX_BN": 128}},
                  "direct": {"defines": {"CUGEMM8_DIRECT_D": 1}, "direct_d": true}},
     "cases": [["normal", 64, 2112, 7168, "64x16 s16", ["base", "pipe"]], ...]}

``unchecked`` times a variant whose results are knowingly wrong (a probe
that removes work).  ``tiled_b`` re-encodes B's tensor map as rows of 128
bytes, for probes of a pre-tiled B layout (the variant's kernel must
address it).  ``root`` starts the variant from another ``cuda_src/``
tree (e.g. an older commit's: ``git archive REV cuda_src | tar -x -C
DIR``); a tree older than v0.8 gets its own launch: BLOCK_M-row A boxes and
no ``a_box_rows`` argument.  ``direct_d`` drops the D staging buffer from ``_config.smem_size``
for that variant, so configurations that only fit without it become
legal.  Every
(case, variant) is compiled first (threads), its output checked against the
float64 reference (calc_diff < 1e-3), then timed with CUDA events (median of
``--reps``, 256 MB L2 flush before each) and, with ``--profiler`` and torch
installed, also with CUPTI kernel durations (``benches/common.kernel_times``,
what DeepGEMM's ``bench_kineto`` reports).  The switches the v0.4 experiments
used are in git (``git show
35b25a1:benches/results/variants_v0.4/experiment_switches.patch``); the
patch applies to commit 690ab92's ``cuda_src/`` (check that tree out to try
them again).  Cases of the training kinds (``wgrad``, ``k_grouped``: the
1D1D kernel, ``fp8_gemm_1d1d.cuh``, timed without ``c``) take configs
``'BMxBN sS [tma]'``; their ``#define`` switches are not supported (use
replacements).  Prints one line per (case, variant).  With ``VARIANT_TREES=DIR`` the
variant trees are kept in DIR (see :func:`trees_dir`), so a later process
(``forced_gemm.py`` with ``VARIANT=``) reuses the kernels compiled here.
``--sweep-json`` also writes the first variant's timings in the config-sweep
format of ``benches/sweep_configs.py`` (:func:`sweep_json`), so a forced
comparison can ground a heuristic rule in ``tests/test_config.py``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[1]))
sys.path.insert(1, str(_HERE.parents[1] / "benches"))

import cupy as cp  # noqa: E402

import common  # noqa: E402
from cugemm8 import _config, _config_1d1d as C1, _jit, gemm as G, gemm_1d1d as G1  # noqa: E402
from cugemm8.cli import (Shape, calc_diff, gemm_call, make_operands, out_to_f64,  # noqa: E402
                         poisoned_out, reference)
from sweep_configs import parse_config  # noqa: E402

#: Kinds the 1D1D kernel (fp8_gemm_1d1d.cuh) runs; their configs read
#: ``'BMxBN sS [tma]'`` (grid: the tiles, up to the SMs).
TRAINING_KINDS = ("wgrad", "k_grouped")
_1D1D_RE = re.compile(r"(\d+)x(\d+) s(\d+)( tma)?")


def parse_case_config(text: str, s: Shape, num_sms: int):
    """The forced config of one case: a 1D2D / swap-AB config (sweep_configs)
    or, for the training kinds, a 1D1D one (None when illegal)."""
    if s.kind not in TRAINING_KINDS:
        return parse_config(text, s, num_sms)
    mt = _1D1D_RE.fullmatch(text.strip())
    if mt is None:
        raise ValueError(f"1D1D config {text!r} is not of the form 'BMxBN sS [tma]'")
    bm, bn, st = (int(mt.group(i)) for i in (1, 2, 3))
    tiles = s.num_groups * -(-s.m // bm) * -(-s.n // bn)
    cfg = C1.make_config(bm, bn, st, max(1, min(num_sms, tiles)), bool(mt.group(4)))
    return cfg if C1.is_legal(cfg)[0] else None


def kernel_of(cfg, s: Shape) -> tuple[str, str]:
    """(header, name expression) of the kernel ``cfg`` launches for ``s``."""
    if s.kind in TRAINING_KINDS:
        name = G1._kernel_name(cfg, s.n, G1._GROUPED_K if s.kind == "k_grouped" else G1._NORMAL, s.num_groups)
        return G1._HEADER, name
    name = G._kernel_name(cfg, s.n, s.k, G._GEMM_TYPE[s.kind], s.num_groups)
    return G._header_of(name), name


def forced(cfg, s: Shape):
    return G1._forced_config(cfg) if s.kind in TRAINING_KINDS else G._forced_config(cfg)

KERNEL = "fp8_gemm_1d2d.cuh"


def trees_dir(prefix: str) -> Path:
    """Where the variant trees go: ``$VARIANT_TREES`` when set (a fixed
    path, so that CuPy's kernel cache, whose key includes the include path,
    serves the same variant to later processes: ``forced_gemm.py`` under
    ncu, a second script), else a fresh temporary directory."""
    fixed = os.environ.get("VARIANT_TREES")
    if fixed:
        Path(fixed).mkdir(parents=True, exist_ok=True)
        return Path(fixed)
    return Path(tempfile.mkdtemp(prefix=prefix))


def make_tree(base: Path, spec: dict, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(Path(spec["root"]) if "root" in spec else base, dest)
    path = dest / KERNEL
    text = path.read_text()
    for name, value in spec.get("defines", {}).items():
        text, n = re.subn(rf"#define {name} \S+", f"#define {name} {value}", text)
        if n != 1:
            raise ValueError(f"#define {name} not found once in {KERNEL}")
    path.write_text(text)
    for fname, old, new in spec.get("replace", []):
        path = dest / fname
        text = path.read_text()
        if text.count(old) != 1:
            raise ValueError(f"replacement text not found once in {fname}: {old!r}")
        path.write_text(text.replace(old, new))
    return dest


@contextlib.contextmanager
def variant(tree: Path, spec: dict):
    """Point the JIT at ``tree`` (and drop the D buffer from the shared-memory
    formula for direct-store variants) for the duration of the block."""
    saved_dir, saved_smem = _jit.cuda_src_dir, _config.smem_size
    _jit.cuda_src_dir = lambda: tree
    if spec.get("direct_d"):
        def smem(bm, bn, stages, k, *args, _orig=saved_smem, **kw):
            return _orig(bm, bn, stages, k, *args, **kw) - ((bm * bn * 2 + 1023) // 1024) * 1024
        _config.smem_size = smem
    saved_prep, saved_make = G._prepare_launch, G._tma.make_descriptor
    if spec.get("tiled_b"):
        # Probe: B's map reads each (n-block, k-block) box as one contiguous
        # BLOCK_N x 128-byte chunk of B's memory (as if B were pre-tiled; the
        # variant's kernel addresses it so); values are then meaningless.
        state = {"u8": 0}

        def prep(*args, **kw):
            state["u8"] = 0
            return saved_prep(*args, **kw)

        def make(dtype, address, dims, strides, box, **kw):
            if dtype == "u8":
                state["u8"] += 1
                if state["u8"] == 2:   # A is encoded first, then B
                    k, n, g = dims
                    dims, strides = (128, n * k // 128, g), (128, strides[1] if g > 1 else n * k)
            return saved_make(dtype, address, dims, strides, box, **kw)
        G._prepare_launch, G._tma.make_descriptor = prep, make
    saved_get, saved_box = _jit.get_kernel, G.a_box_rows
    if "a_box_rows" not in (tree / KERNEL).read_text():
        # A tree older than v0.8 (commit e36340f): its kernel expects A boxes
        # of BLOCK_M rows and takes no a_box_rows argument, so encode those
        # boxes and drop the argument from the launch.
        G.a_box_rows = lambda rows, block_m: block_m

        def get_kernel(*args, **kw):
            kern = saved_get(*args, **kw)

            def launch(grid, block, kargs, **lkw):
                return kern(grid, block, kargs[:1] + kargs[2:], **lkw)
            return launch
        _jit.get_kernel = get_kernel
    _jit._kernels.clear()
    G.clear_launch_cache()
    try:
        yield
    finally:
        _jit.get_kernel, G.a_box_rows = saved_get, saved_box
        G._prepare_launch, G._tma.make_descriptor = saved_prep, saved_make
        _jit.cuda_src_dir, _config.smem_size = saved_dir, saved_smem
        _jit._kernels.clear()
        G.clear_launch_cache()


def sweep_json(rows: list, variant_name: str, num_sms: int, note: str) -> dict:
    """The rows of one variant in the config-sweep format of
    ``benches/sweep_configs.py`` (``tests/test_config.py`` judges the
    heuristic's picks by it): one entry per shape, each timed config under
    its full name (``str(cfg)``, e.g. ``256x128 s3 c2A sms132``) with the
    CUPTI kernel time where measured, else the CUDA-event time.  A config
    timed twice keeps the later reading."""
    shapes: dict = {}
    for r in rows:
        if r["variant"] != variant_name or "full_config" not in r:
            continue
        key = (r["kind"], r["shape"])
        entry = shapes.setdefault(key, {"kind": r["kind"], "label": r["shape"], "m": r["m"], "n": r["n"],
                                        "k": r["k"], "g": r["g"], "heuristic": None, "anchor": None,
                                        "rows": {}})
        us = r.get("kernel_us") or r.get("us")
        entry["rows"][r["full_config"]] = {"config": r["full_config"], "us": us,
                                           "timer": "cupti" if r.get("kernel_us") else "events",
                                           "status": r["status"]}
    out = []
    for entry in shapes.values():
        entry["rows"] = list(entry["rows"].values())
        out.append(entry)
    return {"num_sms": num_sms, "note": note, "shapes": out}


def _build(item) -> str | None:
    try:
        _jit.get_kernel(item[0], item[1], max_dynamic_smem=item[2])
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:400]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("plan")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json")
    p.add_argument("--sweep-json", metavar="OUT",
                   help="also write the plan's first variant's timings in the config-sweep format "
                        "(benches/sweep_configs.py --json; tests/test_config.py reads it)")
    p.add_argument("--profiler", action="store_true")
    p.add_argument("--bitwise", action="store_true",
                   help="also report whether each output equals, bit for bit, the first "
                        "checked variant's output on the same case (shape and config)")
    args = p.parse_args(argv)
    plan = json.loads(Path(args.plan).read_text())
    base = _jit.cuda_src_dir()
    tmp = trees_dir("cugemm8_variants_")
    trees = {name: make_tree(base, spec, tmp / name) for name, spec in plan["variants"].items()}
    num_sms = cp.cuda.Device().attributes["MultiProcessorCount"]

    jobs = []   # (shape, config text, variant)
    for kind, m, n, k, cfg_text, names in plan["cases"]:
        g = 1
        if isinstance(m, list):
            g, m = m
        for name in names:
            jobs.append((Shape(kind, m, n, k, g), cfg_text, name))

    # Compile everything first, one variant at a time (the JIT root is global), in threads.
    t0 = time.perf_counter()
    configs = {}
    for name, tree in trees.items():
        spec = plan["variants"][name]
        with variant(tree, spec):
            todo = []
            for s, text, vname in jobs:
                if vname != name:
                    continue
                cfg = parse_case_config(text, s, num_sms)
                configs[(s, text, vname)] = cfg
                if cfg is not None:
                    todo.append((*kernel_of(cfg, s), cfg.smem_bytes))
            with ThreadPoolExecutor(max_workers=16) as pool:
                for t, err in zip(sorted(set(todo)), pool.map(_build, sorted(set(todo)))):
                    if err:
                        print(f"  {name}: {t[1]}: {err}", flush=True)
    print(f"compiled in {time.perf_counter() - t0:.1f} s", flush=True)

    flush = common.L2Flush()
    results = []
    by_shape = {}
    for s, text, name in jobs:
        by_shape.setdefault(s, []).append((text, name))
    for s, items in by_shape.items():
        ops = make_operands(s, cp, seed=0, vary=False)
        ref, _ = reference(ops, s, cp)
        valid = ops["valid"]
        # k-grouped: k is the groups' total tokens, each group's product [m, n]
        flops = 2 * s.m * s.n * s.k * (1 if s.kind == "k_grouped" else s.num_groups)
        first_bits = {}   # config text -> (variant, output bytes) of its first checked variant
        for text, name in items:
            cfg = configs[(s, text, name)]
            row = {"shape": s.label(), "kind": s.kind, "config": text, "variant": name,
                   "m": s.m, "n": s.n, "k": s.k, "g": s.num_groups}
            if cfg is None:
                row["status"] = "illegal"
            else:
                row["full_config"] = str(cfg)
                with variant(trees[name], plan["variants"][name]), forced(cfg, s):
                    try:
                        out = poisoned_out(s, ops, cp)
                        run = gemm_call(s, ops, out)
                        run()
                        diff = calc_diff(out_to_f64(out, cp)[valid], ref[valid], cp)
                        row["calc_diff"] = diff
                        unchecked = plan["variants"][name].get("unchecked", False)
                        if args.bitwise and diff < 1e-3:
                            # the first variant whose output passed the check is the reference
                            bits = cp.asnumpy(out).tobytes()
                            ref_name, ref_bits = first_bits.setdefault(text, (name, bits))
                            row["same_bits_as"] = ref_name if bits == ref_bits else None
                        if not diff < 1e-3 and not unchecked:
                            row["status"] = f"WRONG {diff:.2e}"
                        else:
                            row["us"] = common.time_call(run, reps=args.reps, warmup=2, flush=flush).median
                            if args.profiler:
                                kt = common.kernel_times([run], reps=args.reps, flush=flush)
                                row["kernel_us"] = kt.median if kt else None
                            row["status"] = "ok"
                    except Exception as exc:
                        row["status"] = f"error {type(exc).__name__}: {exc}"[:300]
            us, kus = row.get("us"), row.get("kernel_us")
            tf = f"{flops / us / 1e6:6.0f} TF" if us else ""
            print(f"{s.label():20s} {str(cfg) if cfg else text:22s} {name:10s} "
                  f"{us or float('nan'):8.2f} us  kernel {kus or float('nan'):8.2f} us {tf} "
                  f"{'' if row['status'] == 'ok' else row['status']}"
                  f"{'' if 'same_bits_as' not in row else ' bits=' + str(row['same_bits_as'])}", flush=True)
            results.append(row)
        del ref, ops
        common.release_memory()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.sweep_json:
        first = next(iter(plan["variants"]))
        note = (f"tools/perf/variant_sweep.py {Path(args.plan).name} --reps {args.reps}"
                f"{' --profiler (CUPTI' if args.profiler else ' (CUDA events'}, 256 MB flush), variant {first!r}")
        Path(args.sweep_json).write_text(json.dumps(sweep_json(results, first, num_sms, note), indent=1))
    if not os.environ.get("VARIANT_TREES"):
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
