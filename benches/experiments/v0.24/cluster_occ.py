"""cuOccupancyMaxActiveClusters for split-K clusters of 2 and 4."""
import sys
sys.path.insert(0, ".")
import cupy as cp
from cuda.bindings import driver as d
from cugemm8 import _config, _jit, gemm as G
from cugemm8._tune import parse_config
for text, m, n, k in [("64x32 s16 w1 k2", 64, 2112, 7168), ("128x32 s9 k2", 128, 2112, 7168),
                      ("64x64 s16 w1 k4", 64, 2112, 7168), ("128x128 s3 k4", 128, 4096, 7168),
                      ("64x32 s16 w1", 64, 4096, 7168), ("64x64 s8 c2A", 4096, 4096, 7168)]:
    cfg = parse_config(text, "normal", m, n, k, 1, 132)
    name = G._kernel_name(cfg, n, k, 0, 1)
    kern = _jit.get_kernel(G._header_of(name), name, max_dynamic_smem=cfg.smem_bytes)
    func = d.CUfunction(kern.kernel.ptr)
    lc = d.CUlaunchConfig()
    lc.gridDimX, lc.gridDimY, lc.gridDimZ = 132, 1, 1
    lc.blockDimX, lc.blockDimY, lc.blockDimZ = kern.kernel.max_threads_per_block if False else (384 if cfg.num_math_warpgroups == 2 else 256), 1, 1
    lc.sharedMemBytes = cfg.smem_bytes
    lc.numAttrs = 0
    err, nclu = d.cuOccupancyMaxActiveClusters(func, lc)
    print(f"occ {text:20s} cluster={cfg.num_k_splits * cfg.num_multicast} smem={cfg.smem_bytes} -> {err.name} max_active_clusters={nclu}")
