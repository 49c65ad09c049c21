"""Timeline of the in-kernel quantisation of A (gemm_fp8's one-kernel form),
read from ``%clock64`` stamps in an instrumented copy of the kernel (one GPU call).

    python tools/perf/convert_probe.py [M,N,K[,dtype]] ...     (default: a few decode shapes)

For CTA 0 the copy records, per K block: in the converter warp that owns
the block's stage, the clock before its x_full wait, after it, after its
empty wait (the stage released), after the conversion and after its
arrival; in math warp 0, before and after its full-barrier wait.  Prints,
per shape, the medians over the blocks (SM cycles): how long the
conversion takes, how long the converter waited for the stage, how long
the math warpgroup waited for each full barrier, and the block-to-block
period of the math warpgroup (what the converters must keep up with: each
of the three converts every third block).  The copy's output is checked
bit for bit against per_token_cast_to_fp8 followed by the GEMM.  Without a
usable Hopper GPU it prints why and exits 2.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT))

KERNEL = "fp8_gemm_1d2d.cuh"
SLOTS = 8                                # stamps per block
MAX_BLOCKS = 512
DEFAULT = ("1,4096,7168", "8,4096,7168", "1,2112,7168", "8,7168,2048", "8,32768,512")

# (anchor text in the converter loop, stamp index): each stamp goes before its
# anchor, in the converter warp that owns block j (index -1: only checked).
_CONVERTER_STAMPS = (
    ("          mbarrier_wait(x_full_bar + stage, pipe.phase);", 0),
    ("          mbarrier_wait(empty_bar + stage, pipe.phase ^ 1);", 1),
    ("          #pragma unroll 1\n          for (uint32_t r0 = 0; r0 < rows;) {", 2),
    ("          fence_proxy_async_smem();   // the payload, to WGMMA's async proxy", 3),
    ("          if (lane == 0) {\n            mbarrier_arrive(full_bar + stage);", -1),
)


def _stamp(index: int, j: str, lane_test: str) -> str:
    return (f"if (blockIdx.x == 0 && {lane_test} && {j} < {MAX_BLOCKS}u) "
            f"cugemm8_probe[{j} * {SLOTS}u + {index}u] = clock64();\n")


def instrumented_tree(dest: Path) -> Path:
    """A copy of cuda_src/ whose 1D2D kernel writes the stamps."""
    from cugemm8 import _jit
    tree = dest / "cuda_src"
    shutil.copytree(_jit.cuda_src_dir(), tree)
    path = tree / KERNEL
    text = path.read_text()
    text = text.replace("namespace cugemm8 {", "__device__ unsigned long long cugemm8_probe["
                        f"{MAX_BLOCKS * SLOTS}];\nnamespace cugemm8 {{", 1)
    for anchor, index in _CONVERTER_STAMPS:
        assert anchor in text, anchor
        if index >= 0:
            text = text.replace(anchor, "          " + _stamp(index, "j", "lane == 0") + anchor, 1)
    # after the arrival and the next x load
    anchor = "            if (j + kNumStages < num_blocks) load_x(j + kNumStages);\n          }\n"
    assert anchor in text
    text = text.replace(anchor, anchor + "          " + _stamp(4, "j", "lane == 0"), 1)
    # math warp 0: around the full-barrier wait of each K block (j counts the CTA's blocks)
    anchor = "              mbarrier_wait(full_bar + stage, pipe.phase);\n"
    assert anchor in text
    text = text.replace(anchor, "              " + _stamp(5, "probe_j", "threadIdx.x == 0") + anchor
                        + "              " + _stamp(6, "probe_j", "threadIdx.x == 0")
                        + "              ++probe_j;\n", 1)
    anchor = "    uint32_t red_phase = 0;   // split K across the cluster: exchanges done, mod 2\n"
    assert anchor in text
    text = text.replace(anchor, anchor + "    uint32_t probe_j = 0;\n", 1)
    path.write_text(text)
    return tree


def main(argv=None) -> int:
    from cugemm8 import cli
    reason = cli.gpu_reason()
    if reason is not None:
        print(f"no usable Hopper GPU ({reason})")
        return 2
    import cupy as cp
    import ml_dtypes
    import numpy as np
    import cugemm8
    from cugemm8 import _jit, gemm, quant

    shapes = []
    for spec in (argv if argv else DEFAULT):
        parts = spec.split(",")
        dtype = np.dtype(parts[3]) if len(parts) > 3 else np.dtype(ml_dtypes.bfloat16)
        shapes.append((int(parts[0]), int(parts[1]), int(parts[2]), dtype))
    clock_khz = cp.cuda.Device().attributes["ClockRate"]
    with tempfile.TemporaryDirectory() as tmp:
        tree = instrumented_tree(Path(tmp))
        modules = {}
        real_get = _jit.get_kernel

        def get_kernel(header, name, *, max_dynamic_smem=0, **kw):
            if header != KERNEL or not name.endswith(("1>", "2>", "3>")) or name.count(",") != 12:
                return real_get(header, name, max_dynamic_smem=max_dynamic_smem, **kw)
            if name not in modules:
                src = _jit.build_source(header, tree)
                cubin, _, lowered = _jit._nvrtc_compile(src, _jit.nvrtc_options(tree), [name], "cubin")
                path = Path(tmp) / f"k{len(modules)}.cubin"
                path.write_bytes(cubin)
                mod = cp.RawModule(path=str(path))
                kern = mod.get_function(lowered[name])
                kern.max_dynamic_shared_size_bytes = max_dynamic_smem
                modules[name] = (mod, kern)
            return modules[name][1]
        _jit.get_kernel = get_kernel
        try:
            for m, n, k, dtype in shapes:
                rs = cp.random.RandomState(m + n + k)
                x = rs.standard_normal((m, k), dtype=cp.float32).astype(dtype)
                b, sfb = cugemm8.per_block_cast_to_fp8(rs.standard_normal((n, k), dtype=cp.float32)
                                                       .astype(ml_dtypes.bfloat16))
                cfg = quant._one_kernel_config(x, n, quant.padded_k(k), gemm)
                if cfg is None:
                    print(f"{m}x{n}x{k} {dtype.name}: no one-kernel form")
                    continue
                gemm.clear_launch_cache()
                out = cp.empty((m, n), ml_dtypes.bfloat16)
                cugemm8.gemm_fp8(x, (b, sfb), out)
                name = [nm for nm in modules if f"<{n}, {quant.padded_k(k)}," in nm][-1]
                mod = modules[name][0]
                probe = cp.ndarray((MAX_BLOCKS * SLOTS,), cp.uint64, mod.get_global("cugemm8_probe"))
                probe[...] = 0
                cp.cuda.Device().synchronize()
                cugemm8.gemm_fp8(x, (b, sfb), out)
                cp.cuda.Device().synchronize()
                want = cp.empty((m, n), ml_dtypes.bfloat16)
                cugemm8.gemm_fp8_fp8_bf16_nt(cugemm8.per_token_cast_to_fp8(x), (b, sfb), want)
                same = bool((out.view(cp.uint16) == want.view(cp.uint16)).all())
                t = cp.asnumpy(probe).reshape(MAX_BLOCKS, SLOTS).astype(np.int64)
                blocks = int((t[:, 5] > 0).sum())
                t = t[:blocks]
                c = t[t[:, 0] > 0]                      # blocks the converters stamped
                conv = c[:, 3] - c[:, 2]
                arrive = c[:, 4] - c[:, 3]
                x_wait = c[:, 1] - c[:, 0]
                stage_wait = c[:, 2] - c[:, 1]
                math_wait = t[:, 6] - t[:, 5]
                period = np.diff(t[:, 6])
                ready_lead = t[:, 6][t[:, 0] > 0] - c[:, 4]   # math past its wait minus the converter's arrival
                med = lambda v: int(np.median(v)) if len(v) else -1   # noqa: E731
                print(f"{m}x{n}x{k} {dtype.name} {cfg}: {blocks} blocks, bits {'ok' if same else 'DIFFER'}; "
                      f"median cycles: convert {med(conv)}, fence+arrive+load {med(arrive)}, "
                      f"x wait {med(x_wait)}, stage wait {med(stage_wait)}, math full wait {med(math_wait)}, "
                      f"math period {med(period)} (max {int(period.max()) if len(period) else -1}), "
                      f"math after arrival {med(ready_lead)}; kernel {int(t[-1, 6] - c[0, 0])} cycles "
                      f"at <= {clock_khz / 1e3:.0f} MHz")
        finally:
            _jit.get_kernel = real_get
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
