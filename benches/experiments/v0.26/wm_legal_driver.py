"""v0.26's driver for tools/perf/variant_sweep.py on warp-MMA configurations
the library's rules refuse (an experiment only; run from the repository root):

    [STAGE=1] python benches/experiments/v0.26/wm_legal_driver.py PLAN.json --reps 20 --profiler [--json OUT]

Widens cugemm8._config's warp-MMA legality for the process: K splits 28 and
32, CTAs up to 1024 threads, any unroll (num_stages) instead of 2.  The
plan's variants raise the launch bounds' CTA count by a source replacement
so that those CTAs stay resident.  With STAGE=1 every warp-MMA launch gets
the shared memory that CUGEMM8_WM_STAGE_TOKENS needs (stage_tokens.patch):
slabs x K splits x ceil(K blocks / K splits) x 1 KB after the reduction
area; variants without the switch (the plan's base) leave it unused but
still ask for it, which matters only where shared memory limits the CTAs
an SM holds.  The plan runs one K at a time (that size depends on K), so
``--json OUT`` (as two arguments) writes OUT.k<K> for each K.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.getcwd() + "/tools/perf")
sys.path.insert(0, os.getcwd() + "/benches")
from cugemm8 import _config  # noqa: E402

_config.WARP_MMA_K_SPLITS = (1, 2, 4, 7, 8, 14, 16, 28, 32)
_config.WARP_MMA_MAX_THREADS = 1024
_orig_legal = _config._warp_mma_legal


def legal(c, k, smem_limit):
    saved = _config.WARP_MMA_UNROLL
    _config.WARP_MMA_UNROLL = c.num_stages
    try:
        return _orig_legal(c, k, smem_limit)
    finally:
        _config.WARP_MMA_UNROLL = saved


_config._warp_mma_legal = legal
STAGE_K = [0]
_orig_smem = _config.warp_mma_smem_size


def smem(block_m, block_n, num_k_splits, k=None):
    extra = 0
    if STAGE_K[0]:
        per_warp = -(-(-(-STAGE_K[0] // 128)) // num_k_splits)
        extra = (block_n // 16) * num_k_splits * per_warp * (block_m // 8) * 1024
    return _orig_smem(block_m, block_n, num_k_splits, k) + extra


_config.warp_mma_smem_size = smem

import variant_sweep  # noqa: E402


def main(argv) -> int:
    plan_path, rest = argv[0], argv[1:]
    plan = json.load(open(plan_path))
    rc = 0
    for k in sorted({c[3] for c in plan["cases"]}):
        STAGE_K[0] = k if os.environ.get("STAGE") == "1" else 0
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"plan_k{k}.json")
            with open(path, "w") as f:
                json.dump(dict(plan, cases=[c for c in plan["cases"] if c[3] == k]), f)
            args = [a + (f".k{k}" if i and rest[i - 1] == "--json" else "") for i, a in enumerate(rest)]
            rc |= variant_sweep.main([path] + args)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
