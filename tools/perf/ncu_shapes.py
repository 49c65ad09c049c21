"""Run the library's own pick once for each normal-GEMM shape of the
DeepSeek-V3 table (for Nsight Compute: one profiled launch per shape).

    ncu --clock-control none -k regex:fp8_gemm --section SpeedOfLight ... \\
        python tools/perf/ncu_shapes.py [M ...]

Each shape is compiled and run once before the profiled launch is made
(``RUNS`` launches, default 1, after a synchronised warm-up that ncu skips
with ``--launch-skip`` = the number of shapes); the config of each shape is
printed in launch order so the ncu report can be matched to it.
"""
import os
import sys

sys.path.insert(0, ".")
import cupy as cp  # noqa: E402

from cugemm8.cli import DEEPSEEK_NK, Shape, config_string, gemm_call, make_operands, poisoned_out  # noqa: E402

# The (N, K) pairs with DeepGEMM figures: the table without N = 576
NK = [(n, k) for n, k in DEEPSEEK_NK if n != 576]
ms = [int(v) for v in sys.argv[1:]] or [64, 128, 4096]
calls = []
for m in ms:
    for n, k in NK:
        shape = Shape("normal", m, n, k)
        ops = make_operands(shape, cp, seed=0)
        out = poisoned_out(shape, ops, cp)
        calls.append((shape, gemm_call(shape, ops, out), config_string(shape, ops)))
for shape, run, _ in calls:          # warm-up: JIT and first launches
    run()
cp.cuda.runtime.deviceSynchronize()
for shape, run, cfg in calls:
    for _ in range(int(os.environ.get("RUNS", "1"))):
        run()
    cp.cuda.runtime.deviceSynchronize()
    print(f"{shape.m}x{shape.n}x{shape.k}: {cfg}", flush=True)
