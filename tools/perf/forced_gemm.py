"""Run one GEMM with forced configurations, a few times each (for ncu):

    python tools/perf/forced_gemm.py M N K "256x128 s3" "256x128 s3 c2A" ...

A config is 'BMxBN sS' with an optional ' c2' / ' c2A' (multicast A) or
' c2B' (multicast B); the grid is the largest legal one on this device.
The word ``deepgemm`` instead of a config runs DeepGEMM's ``fp8_gemm_nt``
on the same operands (its tree on PYTHONPATH, ``../shared/anchors``), so one
Nsight Compute report holds both libraries' kernels (``-k regex:fp8_gemm``
matches DeepGEMM's ``sm90_fp8_gemm_1d2d_impl`` too).
KIND=contiguous|masked NGROUPS=G makes it that grouped GEMM with M rows per
group (masked: M = expected_m, every group full), the same shape as
``variant_sweep.py``'s grouped cases; "deepgemm" then runs DeepGEMM's
contiguous kernel (masked: not wired).
Each config runs RUNS times (default 3) and is then checked against the
float64 reference.  With VARIANT=PLAN.json:NAME the kernel is that
``tools/perf/variant_sweep.py`` plan variant's source (an ``unchecked``
probe's diff is large by design); with VARIANT_TREES=DIR as well, the tree
is DIR/NAME, so kernels a variant_sweep.py run compiled there come from
CuPy's cache."""
import os
import sys

sys.path.insert(0, ".")
sys.path.insert(1, "benches")
import cupy as cp  # noqa: E402

import cugemm8  # noqa: E402
from cugemm8 import gemm as G  # noqa: E402
from cugemm8.cli import Shape, bf16_to_f64, calc_diff, gemm_call, make_operands, poisoned_out, reference  # noqa: E402
from sweep_configs import parse_config  # noqa: E402

m, n, k = (int(x) for x in sys.argv[1:4])
kind = os.environ.get("KIND", "normal")
shape = Shape(kind, m, n, k, int(os.environ.get("NGROUPS", "1")))
ops = make_operands(shape, cp, seed=0)
ref, _ = reference(ops, shape, cp)
variant_ctx = None
if os.environ.get("VARIANT"):
    import json
    from pathlib import Path
    sys.path.insert(2, "tools/perf")
    from cugemm8 import _jit  # noqa: E402
    from variant_sweep import make_tree, trees_dir, variant  # noqa: E402
    plan_path, name = os.environ["VARIANT"].rsplit(":", 1)
    spec = json.loads(Path(plan_path).read_text())["variants"][name]
    tree = make_tree(_jit.cuda_src_dir(), spec, trees_dir("cugemm8_variant_") / name)
    variant_ctx = variant(tree, spec)
    variant_ctx.__enter__()
for text in sys.argv[4:]:
    if text == "deepgemm" and kind == "masked":
        print("deepgemm: not wired for the masked kind here")
        continue
    if text == "deepgemm":
        import common
        import deepgemm_anchor
        dg_module, dg_reason = deepgemm_anchor.load()
        if dg_module is None:
            print(dg_reason)
            continue
        if kind == "contiguous":
            run = deepgemm_anchor.grouped_contiguous(ops["a"], ops["sfa"], ops["b"], ops["sfb"], ops["m_indices"])
        else:
            sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
            run = deepgemm_anchor.gemm_nt(ops["a"], sfa, ops["b"], ops["sfb"])
        run.out.fill_(float("nan"))        # poisoned, as cugemm8's output is
        for _ in range(int(os.environ.get("RUNS", "3"))):
            run()
        cp.cuda.runtime.deviceSynchronize()
        rows = run.out.shape[0]
        print(f"{shape.label()} deepgemm: calc_diff {calc_diff(common.torch_to_f64(run.out, rows), ref, cp):.2e}",
              flush=True)
        continue
    cfg = parse_config(text.replace("c2A", "c2"), shape, cugemm8.get_num_sms())
    if cfg is None:
        print(f"{text}: not legal here")
        continue
    with G._forced_config(cfg):
        out = poisoned_out(shape, ops, cp)
        run = gemm_call(shape, ops, out)
        for _ in range(int(os.environ.get("RUNS", "3"))):
            run()
        cp.cuda.runtime.deviceSynchronize()
    print(f"{shape.label()} {cfg}: calc_diff {calc_diff(bf16_to_f64(out, cp), ref, cp):.2e}", flush=True)
