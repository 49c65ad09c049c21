"""CPU check of sfb_prefetch.patch: SASS size, registers and spills of ten
1D2D instantiations with the prefetch on (.run/pf/cuda_src: the working tree
with the patch applied) against HEAD's tree (/tmp/head/cuda_src), and whether
the patch's code with kPrefetchNextSFB = false (the working tree given as
argv[1]) compiles to HEAD's SASS.

    git archive HEAD cuda_src | tar -x -C /tmp/head
    python benches/experiments/v0.29/sfb_prefetch_compile.py OFF_TREE ON_TREE"""
import sys
from pathlib import Path

sys.path.insert(0, ".")
sys.path.insert(1, "benches/experiments/v0.29")
from cugemm8 import _jit  # noqa: E402
from sass_identical import functions, kernel_names  # noqa: E402

CASES = [("normal", 256, 128, 3, 1, False, 1, 2, 32768, 512, 1), ("normal", 256, 128, 3, 1, False, 1, 2, 7168, 2048, 1),
         ("normal", 256, 128, 3, 2, True, 1, 2, 4096, 7168, 1), ("normal", 128, 176, 4, 2, False, 1, 2, 2112, 7168, 1),
         ("normal", 64, 32, 16, 1, False, 2, 1, 2112, 7168, 1), ("normal", 128, 64, 6, 1, False, 4, 2, 1000, 1936, 1),
         ("masked", 256, 128, 3, 1, False, 1, 2, 4096, 7168, 4), ("contiguous", 128, 192, 4, 2, True, 1, 2, 7168, 2048, 4),
         ("contiguous", 256, 128, 3, 2, True, 1, 2, 4096, 7168, 4), ("normal", 64, 128, 4, 1, False, 1, 1, 32768, 512, 1)]

names = kernel_names(CASES)
head = functions(_jit.compile_only("fp8_gemm_1d2d.cuh", names, sass=True, root=Path("/tmp/head/cuda_src")).sass)
off = functions(_jit.compile_only("fp8_gemm_1d2d.cuh", names, sass=True, root=Path(sys.argv[1])).sass)
on_rep = _jit.compile_only("fp8_gemm_1d2d.cuh", names, sass=True, root=Path(sys.argv[2]))
on = functions(on_rep.sass)
print(f"{'kernel':70s} {'HEAD':>5s} {'on':>5s}  off==HEAD  regs spills")
for name in sorted(head):
    r = on_rep.resources[name]
    print(f"{name[22:92]:70s} {len(head[name]):5d} {len(on[name]):5d}  {off[name] == head[name]!s:9s} {r.registers:4d} "
          f"{r.spill_stores + r.spill_loads}")
