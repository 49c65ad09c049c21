"""SASS loop counts and resources behind RESULTS v0.28 (CPU only; NVRTC + ptxas + cuobjdump).

    git archive 8b22e98 cuda_src | tar -x -C .run/pre      # before the loop addressing
    git archive HEAD cuda_src | tar -x -C .run/ids  && patch -p1 -d .run/ids  < benches/experiments/v0.28/ids_ahead.patch
    git archive HEAD cuda_src | tar -x -C .run/vote && patch -p1 -d .run/vote < benches/experiments/v0.28/epilogue_vote.patch
    python benches/experiments/v0.28/sass_counts.py > benches/experiments/v0.28/sass_counts.log
"""
import sys
from pathlib import Path

sys.path.insert(0, "tools/perf")
from sass_loop_count import report  # noqa: E402

from cugemm8 import _config, _config_1d1d, _jit, _tune  # noqa: E402
from cugemm8 import gemm as G, gemm_1d1d as G1  # noqa: E402

TREES = {"pre": Path(".run/pre/cuda_src"), "head": None, "ids": Path(".run/ids/cuda_src"),
         "vote": Path(".run/vote/cuda_src")}


def show(label, header, name, qgmma, trees):
    for t in trees:
        rep = _jit.compile_only(header, [name], sass=True, root=TREES[t])
        r = next(iter(rep.resources.values()))
        print(f"{report(rep.sass, f'{label} [{t}]', qgmma)}; registers {r.registers}, "
              f"spills {r.spill_stores}/{r.spill_loads}, warnings {len(rep.warnings)}", flush=True)


for m, n, k in [(4096, 7168, 2048), (4096, 2112, 7168)]:
    cfg = _config_1d1d.select_config(m, n, k)
    show(f"1d1d {m}x{n}x{k} {cfg}", G1._HEADER, G1._kernel_name(cfg, n, 0, 1), 8 if cfg.block_m == 256 else 4,
         ("pre", "head"))
cfg = _config.select_config("normal", 1, 4096, 7168, warp_mma=False)
name = G._kernel_name(cfg, 4096, 7168, 0, 1, None)
show(f"swap-AB 1x4096x7168 {cfg}", G._header_of(name), name, 4, ("pre", "head"))
for text in ("128x192 s4 c2", "256x128 s3 c2"):
    cfg = _tune.parse_config(text, "contiguous", 32768, 7168, 2048, 4, 132)
    name = G._kernel_name(cfg, 7168, 2048, 1, 4, None)
    show(f"contiguous 4x8192x7168x2048 {cfg}", G._header_of(name), name, 8 if cfg.block_m == 256 else 4,
         ("head", "ids", "vote"))
