"""CPU check of benches/experiments/v0.31/plan_addr_parts.json: each
variant's SASS for 128x64 s8 and 256x128 s3 c2A at 7168x16384 against this
tree's and 0708bba^'s (the plan's `pre` root), from the repository root:

    rm -rf .run/pre && mkdir -p .run/pre && git archive 0708bba^ cuda_src | tar -x -C .run/pre
    python benches/experiments/v0.31/addr_parts_sass.py benches/experiments/v0.31/plan_addr_parts.json

Prints the compile report (registers, spill stores) per variant, then per
kernel each variant's SASS instruction count, marked =head / =pre where
the listing is identical to that tree's (addresses ignored)."""
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, ".")
sys.path.insert(1, "tools/perf")
sys.path.insert(2, "benches/experiments/v0.29")
from cugemm8 import _jit  # noqa: E402
from sass_identical import functions, kernel_names  # noqa: E402
import variant_sweep as vs  # noqa: E402

plan = json.load(open(sys.argv[1]))
names = kernel_names([("normal", 128, 64, 8, 1, False, 1, 2, 7168, 16384, 1),
                      ("normal", 256, 128, 3, 2, True, 1, 2, 7168, 16384, 1)])
base = Path("cuda_src").resolve()
out = {}
for name, spec in plan["variants"].items():
    tree = vs.make_tree(base, spec, Path(tempfile.mkdtemp()) / "cuda_src")
    rep = _jit.compile_only("fp8_gemm_1d2d.cuh", names, sass=True, root=tree)
    out[name] = functions(rep.sass)
    regs = [(r.registers, r.spill_stores) for r in rep.resources.values()]
    print(name, "compiled", regs, flush=True)
for kn in out["head"]:
    row = [f"{name}:{len(f[kn])}{'=head' if f[kn] == out['head'][kn] else ''}{'=pre' if f[kn] == out['pre'][kn] else ''}"
           for name, f in out.items()]
    print(kn[34:80], " ".join(row))
