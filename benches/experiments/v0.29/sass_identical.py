"""Compare the SASS of 1D2D kernel instantiations between two cuda_src trees
(CPU only: NVRTC for sm_90a, cuobjdump).  v0.29's check that the contiguous
changes (B multicast, the row ids before the K loop) leave every other
kernel byte-identical to v0.28's (22c9a8c):

    rm -rf /tmp/v028 && mkdir -p /tmp/v028 && git archive 22c9a8c cuda_src | tar -x -C /tmp/v028
    python benches/experiments/v0.29/sass_identical.py /tmp/v028/cuda_src

Prints one line per instantiation: SASS instruction count in the other tree
and in this one, and IDENTICAL or DIFF (instruction addresses ignored)."""
import re
import sys
from pathlib import Path

sys.path.insert(0, ".")
sys.path.insert(1, "tools/perf")
from cugemm8 import _config, _jit, gemm as G  # noqa: E402
from sass_loop_count import functions as split_functions  # noqa: E402

# (kind, BM, BN, stages, multicast, on A, K splits, warpgroups, N, K, groups)
CASES = [("normal", 256, 128, 3, 1, False, 1, 2, 4096, 7168, 1), ("normal", 256, 128, 3, 2, True, 1, 2, 7168, 16384, 1),
         ("normal", 128, 176, 4, 2, False, 1, 2, 2112, 7168, 1), ("normal", 64, 32, 16, 1, False, 2, 1, 2112, 7168, 1),
         ("normal", 64, 64, 13, 1, False, 1, 1, 4096, 7168, 1), ("normal", 128, 64, 6, 1, False, 4, 2, 1000, 1936, 1),
         ("masked", 256, 128, 3, 1, False, 1, 2, 4096, 7168, 4), ("masked", 64, 176, 6, 1, False, 1, 1, 4096, 7168, 16),
         ("masked", 256, 112, 3, 2, True, 1, 2, 7168, 2048, 4),
         # the contiguous kernels change (expected DIFF):
         ("contiguous", 128, 192, 4, 2, True, 1, 2, 7168, 2048, 4),
         ("contiguous", 256, 128, 3, 2, True, 1, 2, 4096, 7168, 4)]


def functions(sass: str) -> dict:
    """{name: instruction lines} of a cuobjdump listing (split by
    tools/perf/sass_loop_count.py), each line with its encoding (control
    bits included) and without its address."""
    return {name: [re.sub(r"/\*[0-9a-f]{4}\*/", "", line).strip() for line in text.splitlines()
                   if re.search(r"/\*[0-9a-f]{4}\*/", line)]
            for name, text in split_functions(sass)}


def kernel_names(cases) -> list:
    """The 1D2D kernel names of ``cases`` (tuples as in CASES)."""
    names = []
    for kind, bm, bn, st, mc, on_a, ks, wgs, n, k, g in cases:
        cfg = _config.make_config(kind, bm, bn, st, k, num_multicast=mc, multicast_on_a=on_a, num_k_splits=ks,
                                  num_math_warpgroups=wgs, num_sms=120 if ks == 4 else 132)
        names.append(G._kernel_name(cfg, n, k, G._GEMM_TYPE[kind], g))
    return names


def main() -> None:
    other = Path(sys.argv[1])
    names = kernel_names(CASES)
    new = functions(_jit.compile_only("fp8_gemm_1d2d.cuh", names, sass=True).sass)
    old = functions(_jit.compile_only("fp8_gemm_1d2d.cuh", names, sass=True, root=other).sass)
    for name in sorted(new):
        a, b = new[name], old.get(name, [])
        print(f"{name[:110]:110s} {len(b):5d} {len(a):5d} {'IDENTICAL' if a == b else 'DIFF'}")


if __name__ == "__main__":
    main()
