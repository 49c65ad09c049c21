"""Which commit changed the SASS of the 1D2D kernel 128x64 s8 at 7168x16384
(the 128x7168x16384 decode pick)?  CPU only (NVRTC for sm_90a, cuobjdump):
each REV's cuda_src, from `git archive`, compiled with this tree's kernel
name and compared with this tree's listing (addresses ignored):

    python benches/experiments/v0.31/bisect_sass.py 6ec9de4 b25c6bb 66cfe45 6e39129 80bc948 0708bba^ 0708bba 53192cf acba4d9

Prints per REV its instruction count and this tree's, IDENTICAL or DIFF."""
import sys, subprocess, tempfile
from pathlib import Path
sys.path.insert(0, "."); sys.path.insert(1, "benches/experiments/v0.29")
from cugemm8 import _jit
from sass_identical import kernel_names, functions
names = kernel_names([("normal", 128, 64, 8, 1, False, 1, 2, 7168, 16384, 1)])
print(names)
head = functions(_jit.compile_only("fp8_gemm_1d2d.cuh", names, sass=True).sass)
h = list(head.values())[0]
for rev in sys.argv[1:]:
    d = Path(tempfile.mkdtemp())
    subprocess.run(f"git archive {rev} cuda_src | tar -x -C {d}", shell=True, check=True)
    try:
        o = list(functions(_jit.compile_only("fp8_gemm_1d2d.cuh", names, sass=True, root=d / "cuda_src").sass).values())[0]
        print(rev, len(o), len(h), "IDENTICAL" if o == h else "DIFF", flush=True)
    except Exception as e:
        print(rev, "FAIL", str(e)[:200], flush=True)
