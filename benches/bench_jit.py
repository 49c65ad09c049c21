"""JIT and import costs (issue 4's targets: cold compile <= 2 s per kernel,
disk-cache load <= 20 ms, no compile on a repeated call, import <= 0.5 s).

    python benches/bench_jit.py [--kernels 4]

Every measurement runs in a fresh Python process, with CuPy's kernel cache
(``CUPY_CACHE_DIR``) pointed at a new empty directory:

1. ``import cugemm8`` (wall time of the import statement);
2. cold: the first GEMM call of each shape (compile + load + launch), and
   the compile time the JIT itself records (``cugemm8._jit.stats``);
3. warm: the same calls in a second fresh process reading the disk cache;
4. repeated: a second identical call in the same process must not build.

Without a Hopper GPU it reports the NVRTC compile time only
(``_jit.compile_only``, no load or launch).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SHAPES = [("normal", 1, 64, 2112, 7168), ("normal", 1, 4096, 7168, 2048),
          ("contiguous", 4, 4096, 4096, 7168), ("masked", 4, 256, 7168, 2048)]

_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import cugemm8
t_import = time.perf_counter() - t0
PROFILE = os.environ.get("BENCH_JIT_PROFILE") == "1"
profile_text = ""
import cupy as cp
from cugemm8 import _jit
from cugemm8.cli import Shape, gemm_call, make_operands, poisoned_out
rows = []
for kind, g, m, n, k in json.loads(sys.argv[1]):
    shape = Shape(kind, m, n, k, g)
    ops = make_operands(shape, cp, seed=0)
    out = poisoned_out(shape, ops, cp)
    run = gemm_call(shape, ops, out)
    cp.cuda.runtime.deviceSynchronize()
    b0, s0 = _jit.stats.builds, _jit.stats.seconds
    prof = None
    if PROFILE and not rows:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    t = time.perf_counter(); run(); cp.cuda.runtime.deviceSynchronize()
    first = time.perf_counter() - t
    if prof is not None:
        import io, pstats
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        profile_text = buf.getvalue()
    b1, s1 = _jit.stats.builds, _jit.stats.seconds
    t = time.perf_counter(); run(); cp.cuda.runtime.deviceSynchronize()
    second = time.perf_counter() - t
    rows.append({"shape": f"{kind} {shape.label()}", "first_s": first, "build_s": s1 - s0,
                 "builds_first": b1 - b0, "builds_second": _jit.stats.builds - b1,
                 "second_s": second})
print(json.dumps({"import_s": t_import, "rows": rows, "profile": profile_text}))
"""


def child(shapes, cache_dir: str, profile: bool = False) -> dict:
    env = dict(os.environ, CUPY_CACHE_DIR=cache_dir, BENCH_JIT_PROFILE="1" if profile else "0")
    env.pop("CUPY_CACHE_IN_MEMORY", None)
    env.pop("CUGEMM8_DISABLE_CACHE", None)
    res = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(shapes)], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", type=int, default=len(SHAPES), help="how many of the shapes")
    p.add_argument("--profile", default=None, help="write a cProfile of the warm first call here")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from cugemm8 import _device
    from cugemm8.cli import print_table
    shapes = SHAPES[:args.kernels]
    reason = _device.gpu_unavailable_reason()
    if reason is not None:
        import time
        from cugemm8 import _config, _jit, gemm
        print(f"no usable Hopper GPU ({reason}): NVRTC compile time only")
        rows = []
        for kind, g, m, n, k in shapes:
            cfg = _config.select_config(kind, m * g if kind == "contiguous" else m, n, k, num_groups=g)
            t = time.perf_counter()
            name = gemm._kernel_name(cfg, n, k, gemm._GEMM_TYPE[kind], g)
            _jit.compile_only(gemm._header_of(name), [name])
            rows.append((f"{kind} {g}x{m}x{n}x{k}", str(cfg), f"{time.perf_counter() - t:.2f}"))
        print_table("NVRTC compile (no GPU)", ("shape", "config", "seconds"), rows)
        return 0
    with tempfile.TemporaryDirectory() as cache:
        cold = child(shapes, cache)
        warm = child(shapes, cache, profile=args.profile is not None)
    if args.profile:
        Path(args.profile).write_text(warm["profile"])
    rows = []
    for c, w in zip(cold["rows"], warm["rows"]):
        rows.append((c["shape"], f"{c['build_s']:.2f}", f"{c['first_s']:.2f}", f"{w['build_s'] * 1e3:.1f}",
                     f"{w['first_s'] * 1e3:.1f}", str(c["builds_second"] + w["builds_second"]),
                     f"{w['second_s'] * 1e6:.0f}"))
    first = warm["rows"][0]["first_s"] if warm["rows"] else float("nan")
    print(f"warm start: import {warm['import_s'] * 1e3:.1f} ms + first call {first * 1e3:.1f} ms "
          f"= {(warm['import_s'] + first) * 1e3:.1f} ms")
    print_table(f"JIT: import {cold['import_s']:.2f} s cold / {warm['import_s']:.2f} s warm",
                ("shape", "cold build s", "cold 1st call s", "disk-cache load ms", "warm 1st call ms",
                 "builds on repeat", "repeat call µs"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
