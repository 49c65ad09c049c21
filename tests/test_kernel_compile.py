"""CPU (no GPU) compile checks of the GEMM kernels for sm_90a.

Compiles the instantiations the heuristics pick for every benchmark shape
(and a few forced edge configurations) with NVRTC, then asserts from ptxas's
report and the SASS: no spills, no stack frame, no WGMMA serialisation
warning, QGMMA (FP8 tensor-core) instructions present.
"""
from __future__ import annotations

import re

import pytest

from cugemm8 import _config, _jit, gemm as _gemm
from cugemm8._shapes import DEEPSEEK_NK

pytestmark = pytest.mark.compile

NORMAL = [(m, n, k) for m in (1, 16, 32, 64, 128, 4096)
          for n, k in DEEPSEEK_NK]
GROUPED = [("contiguous", 4 * 8192, 4096, 7168, 4), ("contiguous", 4 * 8192, 7168, 2048, 4),
           ("contiguous", 8 * 4096, 4096, 7168, 8), ("contiguous", 8 * 4096, 7168, 2048, 8),
           ("masked", 1024, 4096, 7168, 1), ("masked", 1024, 7168, 2048, 1), ("masked", 512, 4096, 7168, 2),
           ("masked", 512, 7168, 2048, 2), ("masked", 256, 4096, 7168, 4), ("masked", 256, 7168, 2048, 4)]
# Extra edge instantiations: every swizzle width, both multicast sides, BLOCK_N 8 / 136 / 160.
FORCED = [("normal", 64, 8, 16, 1, False, 576, 7168), ("normal", 128, 136, 4, 1, False, 1000, 1040),
          ("normal", 128, 160, 4, 2, True, 1000, 1040), ("normal", 256, 128, 3, 2, False, 1000, 1040),
          ("normal", 64, 24, 6, 2, False, 1000, 1040), ("masked", 256, 112, 3, 2, True, 1000, 640),
          ("contiguous", 128, 192, 4, 2, False, 520, 1040), ("contiguous", 128, 64, 4, 2, False, 520, 1040)]
# Split K across a CTA pair (kind, bm, bn, stages, n, k): the forms the GPU tests force.
SPLIT_K = [("normal", 64, 16, 8, 1000, 1168), ("normal", 128, 64, 6, 1000, 1168),
           ("contiguous", 64, 32, 8, 520, 1168), ("masked", 128, 32, 6, 1000, 768),
           ("normal", 64, 32, 8, 1000, 256)]
# Split K across a cluster of four (bm, bn, stages, math warpgroups, n, k):
# the forms tests/test_gemm_gpu.py forces (BLOCK_M 64 on one and on two
# warpgroups, 128x128 on 3 stages beside its 64 KB exchange buffer).
SPLIT_K4 = [(128, 64, 6, 2, 1000, 1936), (64, 64, 8, 2, 1000, 1936), (128, 128, 3, 2, 520, 1936),
            (64, 32, 8, 2, 1000, 512)]

# One math warpgroup at BLOCK_M = 64 (kind, bn, stages, K splits, n, k): odd
# stage counts, split K, both grouped layouts, the widest register tile.
ONE_WARPGROUP = [("normal", 128, 8, 1, 32768, 512), ("normal", 64, 13, 1, 4096, 7168),
                 ("normal", 32, 16, 2, 2112, 7168), ("normal", 192, 6, 1, 1000, 1040),
                 ("masked", 128, 7, 1, 1000, 768), ("contiguous", 32, 8, 2, 520, 1168)]


# gemm_fp8's one-kernel form (the GEMM quantises float activations itself):
# the heuristic's DeepSeek-V3 picks at these M that have one, in every input dtype.
ONE_KERNEL_MS = (1, 8)


def _one_kernel_names(swap_ab: bool = False):
    """The 1D2D kernel's (or, with ``swap_ab``, the swap-AB kernel's) names."""
    names = set()
    for m in ONE_KERNEL_MS:
        for n, k in DEEPSEEK_NK:
            for dtype, itemsize in (("bfloat16", 2), ("float16", 2), ("float32", 4)):
                # (the persistent picks: the warp-MMA kernel, picked on the
                # whole device, has no such form; a reduced SM budget runs these)
                pick = _config.select_config("normal", m, n, k, num_sms=132, warp_mma=False)
                cfg = _config.quant_a_config(pick, k, itemsize)
                if cfg is not None and cfg.swap_ab == swap_ab:
                    names.add(_gemm._kernel_name(cfg, n, k, 0, 1, dtype))
    return names


def _names():
    names = set(_one_kernel_names())
    for m, n, k in NORMAL:
        for warp_mma in (True, False):
            cfg = _config.select_config("normal", m, n, k, num_sms=132, warp_mma=warp_mma)
            if cfg.swap_ab or cfg.warp_mma:
                continue      # their kernels' own lists (_swap_ab_names, _warp_mma_names)
            names.add(_gemm._kernel_name(cfg, n, k, 0, 1))
    for kind, m, n, k, g in GROUPED:
        cfg = _config.select_config(kind, m, n, k, num_groups=g, num_sms=132)
        names.add(_gemm._kernel_name(cfg, n, k, _gemm._GEMM_TYPE[kind], g))
    for kind, bm, bn, st, mc, on_a, n, k in FORCED:
        cfg = _config.make_config(kind, bm, bn, st, k, num_multicast=mc, multicast_on_a=on_a, num_sms=132)
        assert _config.is_legal(cfg, k=k)[0]
        names.add(_gemm._kernel_name(cfg, n, k, _gemm._GEMM_TYPE[kind], 3 if kind == "masked" else 1))
    for kind, bm, bn, st, n, k in SPLIT_K:
        cfg = _config.make_config(kind, bm, bn, st, k, num_k_splits=2, num_sms=132)
        assert _config.is_legal(cfg, k=k)[0]
        names.add(_gemm._kernel_name(cfg, n, k, _gemm._GEMM_TYPE[kind], 3 if kind == "masked" else 1))
    for bm, bn, st, wgs, n, k in SPLIT_K4:
        cfg = _config.make_config("normal", bm, bn, st, k, num_k_splits=4, num_sms=120, num_math_warpgroups=wgs)
        assert _config.is_legal(cfg, k=k)[0]
        names.add(_gemm._kernel_name(cfg, n, k, 0, 1))
    for kind, bn, st, splits, n, k in ONE_WARPGROUP:
        cfg = _config.make_config(kind, 64, bn, st, k, num_k_splits=splits, num_sms=132,
                                  num_math_warpgroups=1)
        assert _config.is_legal(cfg, k=k)[0]
        names.add(_gemm._kernel_name(cfg, n, k, _gemm._GEMM_TYPE[kind], 3 if kind == "masked" else 1))
    return sorted(names)


def compile_report(header: str, names) -> "_jit.CompileReport":
    """_jit.compile_only of ``names`` from ``header``, with SASS when ptxas
    and cuobjdump are found (the SASS tests skip or, under CI, fail through
    the ``sass_tools`` fixture otherwise)."""
    want_sass = _jit.find_tool("ptxas") is not None and _jit.find_tool("cuobjdump") is not None
    return _jit.compile_only(header, names, sass=want_sass)


@pytest.fixture(scope="module")
def report():
    return compile_report("fp8_gemm_1d2d.cuh", _names())


def test_every_instantiation_compiles_without_spills(report):
    names = _names()
    assert len(report.resources) == len(names)
    for r in report.resources.values():
        assert r.stack_frame == 0, r
        assert r.spill_stores == 0 and r.spill_loads == 0, r
        assert r.registers <= 255, r


def test_one_kernel_form_covers_most_decode_picks():
    """The 1D2D kernel's in-kernel quantisation exists for the BLOCK_M = 64
    one-warpgroup picks at M = 1: 2112 x 7168, 24576 x 1536, 32768 x 512,
    7168 x 2048 and 576 x 7168 (not 7168 x 16384, whose pick runs two math
    warpgroups, nor 4096 x 7168, whose swap-AB pick's form is in
    _swap_ab_names)."""
    names = _one_kernel_names()
    assert len(names) >= 5 * len(_gemm.A_IN_CODES)
    assert all(name.endswith((", 1>", ", 2>", ", 3>")) for name in names)


def test_no_ptxas_performance_warnings(report):
    # e.g. "wgmma.mma_async instructions are serialized due to ..." (C7514 / C7515, printed as "info" lines)
    assert not [w for w in report.warnings if "serializ" in w.lower() or "setmaxnreg" in w.lower()], \
        report.warnings


def test_sass_uses_fp8_wgmma(report, sass_tools):
    assert report.sass is not None
    funcs = re.split(r"\n\s*Function : ", report.sass)[1:]
    assert len(funcs) == len(report.resources)
    for body in funcs:
        name = body.splitlines()[0].strip()
        assert "QGMMA" in body, f"{name}: no FP8 WGMMA (QGMMA) in SASS"
        assert "LDL" not in body and "STL" not in body, f"{name}: local-memory traffic"
        # CuPy compiles with -ftz=true: every FP32 operation on accumulators
        # and scales must be an explicit .rn form (subnormals kept), or a
        # tiny partial sum is flushed (the split-K reductions were, to v0.5)
        ftz = re.findall(r"\bF(?:ADD|MUL|FMA)\S*\.FTZ\b", body)
        assert not ftz, f"{name}: flush-to-zero arithmetic {sorted(set(ftz))}"


def _unpredicated_hinted_loads(ptx: str) -> list:
    """The TMA loads of a PTX listing that carry an L2 cache hint without a
    guard predicate."""
    return [ln.strip() for ln in ptx.splitlines()
            if "cp.async.bulk.tensor" in ln and ".L2::cache_hint" in ln and not ln.strip().startswith("@")]


def test_l2_hints_only_under_the_evict_first_predicate(report, swap_ab_report):
    """Every TMA load with an L2 cache hint is predicated (on kFlagBEvictFirst:
    ptx/tma.cuh, tma_load_3d_hint_if), with an unhinted twin under the
    opposite predicate: a hinted load, even evict-normal, is never merged by
    the L2 request coalescer, which cost the prefill GEMMs 4 % of their L2
    reads (benches/RESULTS.md v0.35)."""
    for rep in (report, swap_ab_report):
        assert rep.ptx.count(".L2::cache_hint") > 0
        assert not _unpredicated_hinted_loads(rep.ptx)
        hinted = sum(1 for ln in rep.ptx.splitlines() if ln.strip().startswith("@p cp.async.bulk.tensor"))
        unhinted = sum(1 for ln in rep.ptx.splitlines() if ln.strip().startswith("@!p cp.async.bulk.tensor"))
        assert hinted == unhinted > 0


# fp8_gemm_1d2d_kernel<SHAPE_N, SHAPE_K, BLOCK_M, BLOCK_N, stages, multicast,
# multicast on A, D swizzle, GEMM type, groups, K splits, math warpgroups, A input>
def wgmma_waits(sass: str, name_re: "re.Pattern"):
    """Per kernel function of a SASS listing: its name, ``name_re``'s match
    in it (asserted), its QGMMA lines, those that wait for their group
    (``gsb0``), and whether a wait leaves the next group in flight
    (``WARPGROUP.DEPBAR.LE gsb0, 0x1``: WGMMAs pipelined across K blocks)."""
    for body in re.split(r"\n\s*Function : ", sass)[1:]:
        name = body.splitlines()[0].strip()
        args = name_re.search(name)
        assert args, name
        qgmma = [ln for ln in body.splitlines() if "QGMMA" in ln]
        yield name, args, qgmma, [ln for ln in qgmma if "gsb0" in ln], "WARPGROUP.DEPBAR.LE gsb0, 0x1" in body


_KERNEL_ARGS = re.compile(r"fp8_gemm_1d2d_kernelI" + r"Lj(\d+)E" * 6 + r"Lb([01])E" + r"Lj(\d+)E" * 6 + "E")


def test_one_warpgroup_decode_kernels_overlap_k_blocks(report, sass_tools):
    """kPipelineMma (one math warpgroup, BLOCK_N <= 96): each pair of K
    blocks waits for its first WGMMA group while the second is in flight
    (``WARPGROUP.DEPBAR.LE gsb0, 0x1``); the kernels with two math
    warpgroups keep the one-block loop.  No kernel's WGMMAs are serialised
    (ptxas then gives every QGMMA its own ``gsb0`` wait instead of one per
    K block's four).  The output bits are the same either way; this guards
    the measured speed (benches/RESULTS.md v0.15)."""
    checked = 0
    for name, args, qgmma, waits, overlapped in wgmma_waits(report.sass, _KERNEL_ARGS):
        block_n, math_wgs = int(args.group(4)), int(args.group(12))
        assert 2 * len(waits) < len(qgmma), f"{name}: WGMMAs serialised ({len(waits)} of {len(qgmma)} wait)"
        assert overlapped == (math_wgs == 1 and block_n <= 96), f"{name}: K-block overlap {overlapped}"
        checked += overlapped
    assert checked >= 10, checked


def test_math_warpgroups_meet_before_each_tile_only_from_k_7168(report, sass_tools):
    """kSyncMathWGs: a kernel with two math warpgroups on their own rows
    (not split K) and at least 56 K blocks has both warpgroups meet at named
    barrier 1 (256 threads) before each tile's K loop; below 56 K blocks no
    kernel without split K syncs there.  The barrier made the K = 16384
    prefill GEMMs 0.9-1.6 % faster (K = 7168: -0.4 % to a tie), was a tie at
    K = 3072-4096 and cost 0.6-2.1 % at K <= 2048 (benches/RESULTS.md v0.36),
    so the rule is part of the speed."""
    seen = {True: 0, False: 0}
    for body in re.split(r"\n\s*Function : ", report.sass)[1:]:
        name = body.splitlines()[0].strip()
        args = _KERNEL_ARGS.search(name)
        assert args, name
        k, splits, math_wgs = int(args.group(2)), int(args.group(11)), int(args.group(12))
        if splits > 1 or math_wgs != 2 or int(args.group(3)) == 64:
            continue
        want = (k + 127) // 128 >= 56
        has = "BAR.SYNC.DEFER_BLOCKING 0x1, 0x100" in body
        assert has == want, f"{name}: tile-start barrier {has}, K = {k}"
        seen[want] += 1
    assert seen[True] >= 3 and seen[False] >= 3, seen


def test_split_k_exchange_uses_cluster_scope(report):
    """The split-K exchange: st.async into the peer, cluster-scope acquire
    waits, and a release.cluster arrival after rank 0's reads of the partial
    tile (the buffer rank 1 overwrites next)."""
    assert "st.async" in report.ptx
    assert "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64" in report.ptx
    assert "mbarrier.arrive.release.cluster.shared::cluster.b64" in report.ptx


def _compile_static_asserts(checks: list, header: str = "fp8_gemm_1d2d.cuh") -> None:
    """One NVRTC compile (PTX, sm_90a) of a GEMM header followed by
    ``checks``; a failed static_assert raises RuntimeError."""
    import cupy._core.core as core
    src = _jit.build_source(header) + "\n" + "\n".join(checks) + "\n"
    opts = core.assemble_cupy_compiler_options(_jit.compile_options()) + (
        "-arch=compute_90a", "--device-as-default-execution-space")
    _jit._nvrtc_compile(src, opts, [], "ptx")


def test_smem_layout_matches_the_python_formula():
    """cugemm8/_config.py smem_size is what the launch requests; the kernel's
    SmemLayout is what it uses.  One NVRTC compile of static asserts that the
    two totals agree (and the 1024-byte alignment of the TMA stages, the
    8-byte alignment of the split-K barriers) over every candidate tile,
    split or not, at several K and stage counts."""
    checks = []
    for k in (128, 1168, 16384):
        for bm in _config.BLOCK_M_CANDIDATES:
            for bn in _config.candidate_block_ns(bm):
                for splits in ((1, 2) if bm in _config.SPLIT_K_BLOCK_MS else (1,)):
                    for wgs in _config.math_warpgroup_options(bm):
                        for stages in (2, 5, 16):
                            for quant_a in (0, 2, 4):
                                t = (f"cugemm8::SmemLayout<{k}u, {bm}u, {bn}u, {stages}u, {splits}u, {wgs}u, "
                                     f"{quant_a}u>")
                                want = _config.smem_size(bm, bn, stages, k, splits, wgs, quant_a)
                                checks.append(f"static_assert({t}::kTotal == {want}u && {t}::kOffA % 1024 == 0 "
                                              f"&& {t}::kOffB % 1024 == 0 && {t}::kOffX % 128 == 0 "
                                              f"&& {t}::kOffClusterBar % 8 == 0, "
                                              f"\"{k} {bm} {bn} {stages} {splits} {wgs} {quant_a}\");")
    # The in-kernel quantisation's constants: the per-token cast's default
    # min_amax, the pow2 flag bit.
    import numpy as np
    from cugemm8 import quant
    checks.append(f"static_assert(cugemm8::kQuantAMinAmax == {float(np.float32(quant._DEFAULT_MIN_AMAX))!r}f && "
                  f"cugemm8::kFlagAPow2Scale == {_gemm.FLAG_A_POW2_SCALE}u && "
                  f"cugemm8::kFlagBEvictFirst == {_gemm.FLAG_B_EVICT_FIRST}u, \"kernel flags and min_amax\");")
    # The rows of float activations a stage holds beside their payload.
    for dtype, code in _gemm.A_IN_CODES.items():
        itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
        t = f"cugemm8::GemmTraits<2112u, 7168u, 64u, 32u, 16u, 1u, false, 64u, 0u, 1u, 2u, 1u, {code}u>"
        checks.append(f"static_assert({t}::kMaxQuantARows == {_config.QUANT_A_MAX_ROWS}u && "
                      f"{t}::kXBytes == {itemsize}u, \"{dtype}\");")
    _compile_static_asserts(checks)


def test_1d1d_smem_layout_matches_the_python_formula():
    """cugemm8/_config_1d1d.py smem_size against the 1D1D kernel's
    SmemLayout1d1d (and its 1024-byte aligned stages) for every BLOCK_M and
    BLOCK_N multiple of 8 up to 256 at several stage counts."""
    from cugemm8 import _config_1d1d as C1
    checks = []
    for bm in C1.BLOCK_M_CANDIDATES:
        for bn in range(8, 257, 8):
            for stages in (2, 6, 16):
                for tma in (False, True):
                    t = f"cugemm8::SmemLayout1d1d<{bm}u, {bn}u, {stages}u, {str(tma).lower()}>"
                    want = C1.smem_size(bm, bn, stages, tma)
                    checks.append(f"static_assert({t}::kTotal == {want}u && {t}::kOffA % 1024 == 0 && "
                                  f"{t}::kOffB % 1024 == 0 && {t}::kOffBar % 8 == 0, \"{bm} {bn} {stages} {tma}\");")
    _compile_static_asserts(checks, header="fp8_gemm_1d1d.cuh")


def test_split_k_skew_matches_the_python_rule():
    """The kernel's split point (GemmTraits::kSplitSkew) is what
    _config.split_k_skew, the cost model and the reference's summation
    order assume: static asserts over every split-K BLOCK_M and several K."""
    checks = []
    for k in (256, 1792, 2048, 2288, 2304, 7168, 16384):
        for bm in _config.SPLIT_K_BLOCK_MS:
            for wgs in ((1, 2) if bm == 64 else (2,)):
                t = f"cugemm8::GemmTraits<2112u, {k}u, {bm}u, 32u, 6u, 1u, false, 64u, 0u, 1u, 2u, {wgs}u>"
                skew = _config.split_k_skew(bm, k, wgs)
                half = -(-k // 128) // 2
                checks.append(f"static_assert({t}::kSplitSkew == {skew}u && {t}::kKBlocksRank0 == {half + skew}u "
                              f"&& {t}::kKBlocksRank1 == {half - skew}u, \"{bm} {wgs} {k}\");")
    _compile_static_asserts(checks)


def test_arch_guard_rejects_plain_sm90():
    """The #error guard: a non-sm_90a build must fail loudly."""
    src = _jit.build_source("fp8_gemm_1d2d.cuh")
    import cupy._core.core as core
    opts = core.assemble_cupy_compiler_options(_jit.compile_options()[1:]) + ("-arch=sm_90",)
    with pytest.raises(RuntimeError, match="sm_90a"):
        _jit._nvrtc_compile(src, opts, [], "cubin")


def test_cold_compile_time(report):
    # Cold NVRTC compile per kernel, a guard against compile-time blow-ups
    # (a kernel that unrolls too much), not a benchmark: benches/bench_jit.py
    # measures it.  About 1.7-2.3 s per kernel on a 2-core CI machine alone;
    # a fresh-user run sharing those cores with another suite measured 3.0 s,
    # so the limit leaves room for a loaded machine.
    assert report.seconds / len(report.resources) < 5.0


# The swap-AB decode kernel (m, n, k, token tile, weight tile, stages, K
# splits): every token tile and weight tile, clusters of 1, 2 and 4, the
# tails the GPU tests force, and tune's candidates for the six DeepSeek-V3
# (N, K) at M = 1 and 32.
SWAP_AB = [(1, 4096, 7168, 8, 64, 24, 2), (13, 2112, 7168, 16, 64, 16, 4), (24, 7168, 2048, 24, 128, 10, 2),
           (32, 24576, 1536, 32, 192, 8, 1), (1, 32768, 512, 8, 256, 4, 1), (40, 1000, 1040, 32, 128, 6, 4),
           (5, 520, 16, 8, 64, 4, 1)]


def _swap_ab_names():
    from cugemm8 import _tune
    cfgs = []
    for m, n, k, bm, bn, st, splits in SWAP_AB:
        cfg = _config.make_config("normal", bm, bn, st, k, num_k_splits=splits, num_sms=132 - 132 % splits,
                                  swap_ab=True)
        assert _config.is_legal(cfg, k=k)[0], (cfg, _config.is_legal(cfg, k=k))
        cfgs.append((cfg, n, k))
    for m in (1, 32):
        for n, k in DEEPSEEK_NK:
            cfgs += [(c, n, k) for c in _tune.swap_ab_candidates(m, n, k, 132)]
    # The one-kernel bf16-in form (quant_a.cuh) of the heuristic's swap-AB
    # picks, every input dtype, and of a cluster of 4 and a K tail.
    quant = set(_one_kernel_names(swap_ab=True))
    assert quant, "no swap-AB pick has a one-kernel form"
    for m, n, k, splits in ((3, 520, 1040, 4), (8, 1000, 16, 1)):
        cfg = _config.make_config("normal", 8, 64, 24, k, num_k_splits=splits, num_sms=132 - 132 % splits,
                                  swap_ab=True)
        cfg = _config.quant_a_config(cfg, k, 2)
        quant.add(_gemm._kernel_name(cfg, n, k, 0, 1, "bfloat16"))
    names = {_gemm._kernel_name(c, n, k, 0, 1) for c, n, k in cfgs} | quant
    for m, n, k in NORMAL:
        cfg = _config.select_config("normal", m, n, k, num_sms=132, warp_mma=False)
        if cfg.swap_ab:
            names.add(_gemm._kernel_name(cfg, n, k, 0, 1))
    return sorted(names)


@pytest.fixture(scope="module")
def swap_ab_report():
    return compile_report("fp8_gemm_swap_ab.cuh", _swap_ab_names())


def test_swap_ab_instantiations_compile_clean(swap_ab_report):
    """No spills, no stack frame, no serialised WGMMAs, no warning."""
    rep = swap_ab_report
    assert len(rep.resources) == len(_swap_ab_names())
    for r in rep.resources.values():
        assert r.stack_frame == 0 and r.spill_stores == 0 and r.spill_loads == 0, r
    assert not [w for w in rep.warnings if "serializ" in w.lower()], rep.warnings
    assert "warning" not in (rep.log or "").lower(), rep.log


def test_swap_ab_sass(swap_ab_report, sass_tools):
    """FP8 WGMMAs of N = the token tile (QGMMA.64xBLOCK_Mx32), one group wait
    per K block's waves (not per instruction), no local memory, no
    flush-to-zero arithmetic."""
    rep = swap_ab_report
    funcs = re.split(r"\n\s*Function : ", rep.sass)[1:]
    assert len(funcs) == len(rep.resources)
    for body in funcs:
        name = body.splitlines()[0].strip()
        m = re.search(r"fp8_gemm_swap_ab_kernelILj\d+ELj\d+ELj(\d+)E", name)
        assert m, name
        qgmma = [ln for ln in body.splitlines() if "QGMMA" in ln]
        assert qgmma and all(f"QGMMA.64x{m.group(1)}x32.F32.E4M3.E4M3" in ln for ln in qgmma), name
        waits = [ln for ln in qgmma if "gsb0" in ln]
        assert 2 * len(waits) < len(qgmma) or len(qgmma) == 4, f"{name}: WGMMAs serialised"
        assert "LDL" not in body and "STL" not in body, f"{name}: local-memory traffic"
        assert not re.findall(r"\bF(?:ADD|MUL|FMA)\S*\.FTZ\b", body), f"{name}: flush-to-zero arithmetic"


def test_swap_ab_smem_layout_matches_the_python_formula():
    """_config.swap_ab_smem_size against SwapABSmem::kTotal (and the
    1024-byte alignment of the TMA stages, 16 of the exchange slots, 8 of
    the barriers) over every token tile, weight tile and split."""
    checks = []
    for k in (128, 1168, 16384):
        for bm in _config.SWAP_AB_BLOCK_MS:
            for bn in _config.SWAP_AB_BLOCK_NS:
                for splits in _config.SWAP_AB_SPLITS:
                    for stages, quant_a in ((3, 0), (7, 0), (16, 0), (5, 2), (16, 4)):
                        t = f"cugemm8::SwapABSmem<{k}u, {bm}u, {bn}u, {stages}u, {splits}u, {quant_a}u>"
                        want = _config.swap_ab_smem_size(bm, bn, stages, k, splits, quant_a)
                        checks.append(f"static_assert({t}::kTotal == {want}u && {t}::kOffA % 1024 == 0 "
                                      f"&& {t}::kB % 1024 == 0 && {t}::kA % 1024 == 0 && {t}::kOffRed % 16 == 0 "
                                      f"&& {t}::kOffX % 128 == 0 && {t}::kOffBar % 8 == 0, "
                                      f"\"{k} {bm} {bn} {stages} {splits} {quant_a}\");")
    _compile_static_asserts(checks, header="fp8_gemm_swap_ab.cuh")


def test_every_tune_candidate_compiles_from_its_own_header():
    """tune, warmup, the benches and the probes compile kernels ahead of a
    launch through gemm._header_of: a swap-AB name from the 1D2D header does
    not compile, so each name must come with its own (one swap-AB, one
    warp-MMA and one 1D2D candidate of tune's plan at M = 8 compiled here)."""
    from cugemm8 import _tune
    cands = _tune.candidates("normal", 8, 4096, 7168, 1, 132)
    swap = next(c for c in cands if c.swap_ab)
    plain = next(c for c in cands if not c.swap_ab and not c.warp_mma)
    wm = next(c for c in cands if c.warp_mma)
    for cfg in (swap, plain, wm):
        name = _gemm._kernel_name(cfg, 4096, 7168, 0, 1)
        header = _gemm._header_of(name)
        assert header == ("fp8_gemm_swap_ab.cuh" if cfg.swap_ab else
                          "fp8_gemm_warp_mma.cuh" if cfg.warp_mma else "fp8_gemm_1d2d.cuh")
        rep = _jit.compile_only(header, [name], sass=False)
        assert len(rep.resources) == 1
    with pytest.raises(RuntimeError):
        _jit.compile_only("fp8_gemm_1d2d.cuh", [_gemm._kernel_name(swap, 4096, 7168, 0, 1)], sass=False)


# ---------------------------------------------------------------- the warp-MMA decode kernel

# (K splits, slabs per CTA, n, k): the GPU tests' forced forms (tests/test_warp_mma_gpu.py)
WARP_MMA_FORCED = [(1, 4, 1000, 2064), (1, 16, 1000, 2064), (2, 2, 1000, 2064), (4, 4, 1000, 2064),
                   (7, 1, 1000, 2064), (8, 2, 1000, 2064), (14, 1, 1000, 2064), (16, 1, 1000, 2064),
                   (14, 1, 24, 7168), (4, 4, 520, 7168), (1, 4, 520, 16), (2, 4, 520, 144)]


def _warp_mma_names():
    """The heuristic's warp-MMA picks (M = 1 ... 8, the DeepSeek-V3 pairs)
    and the GPU tests' forced forms, each also quantising bf16 x itself
    (gemm_fp8's one-kernel form), the picks also fp16 x."""
    cfgs = []
    for m in range(1, 9):
        for n, k in DEEPSEEK_NK:
            cfg = _config.select_config("normal", m, n, k, num_sms=132)
            if cfg.warp_mma:
                cfgs.append((cfg, n, k))
    assert {(n, k) for _, n, k in cfgs} == set(DEEPSEEK_NK) - {(7168, 16384), (576, 7168)}, "the rule's pairs"
    for splits, slabs, n, k in WARP_MMA_FORCED:
        cfg = _config.make_config("normal", 8, 16 * slabs, _config.WARP_MMA_UNROLL, k, num_k_splits=splits,
                                  num_sms=-(-n // (16 * slabs)), warp_mma=True)
        assert _config.is_legal(cfg, k=k)[0], cfg
        cfgs.append((cfg, n, k))
    names = {_gemm._kernel_name(c, n, k, 0, 1) for c, n, k in cfgs}
    names |= {_gemm._kernel_name(c, n, k, 0, 1, "bfloat16") for c, n, k in cfgs}
    names |= {_gemm._kernel_name(c, n, k, 0, 1, "float16") for c, n, k in cfgs[:5]}
    return sorted(names)


def _warp_mma_x_form(rep, mangled: str) -> bool:
    """Whether a compiled warp-MMA entry is a form that quantises x (kAIn != 0)."""
    expr = next(e for e, m in rep.lowered.items() if m == mangled)
    return expr.count(",") == 7               # (kAIn, the eighth template argument, is named only for x)


@pytest.fixture(scope="module")
def warp_mma_report():
    names = _warp_mma_names()
    assert {_gemm._header_of(n) for n in names} == {"fp8_gemm_warp_mma.cuh"}
    return compile_report("fp8_gemm_warp_mma.cuh", names)


def test_warp_mma_instantiations_compile_clean(warp_mma_report):
    """No spills, no stack frame, no warning, and no more registers than
    the rule's one-wave count assumes (_config.WARP_MMA_REGISTERS; the
    forms that quantise x: _config.WARP_MMA_QUANT_A_REGISTERS)."""
    rep = warp_mma_report
    assert len(rep.resources) == len(_warp_mma_names())
    for mangled, r in rep.resources.items():
        assert r.stack_frame == 0 and r.spill_stores == 0 and r.spill_loads == 0, r
        limit = _config.WARP_MMA_QUANT_A_REGISTERS if _warp_mma_x_form(rep, mangled) else _config.WARP_MMA_REGISTERS
        assert r.registers <= limit, r
    assert "warning" not in (rep.log or "").lower(), rep.log


def test_warp_mma_sass(warp_mma_report, sass_tools):
    """The m16n8k32 e4m3 MMA (sm_90 runs it as FP16 HMMAs of the unpacked
    bytes), evict-first 16-byte loads of B issued a whole batch at a time in
    both loops (no MMA between the loads of one batch: the ptxas
    interleaving a __syncwarp and a run-time trip count prevent), no local
    memory, no flush-to-zero arithmetic.  The forms that quantise x: the
    per-token cast's bytes through the float32 quotient (quant.cuh
    quotient_f32: no per-element float64 conversion) and the shuffles of a
    group's amax and the tokens' scales."""
    rep = warp_mma_report
    funcs = re.split(r"\n\s*Function : ", rep.sass)[1:]
    assert len(funcs) == len(rep.resources)
    batch = 4 * _config.WARP_MMA_UNROLL          # 2 K blocks x 2 halves x rows g, g + 8
    for body in funcs:
        name = body.splitlines()[0].strip()
        ops = [ln.split(";")[0] for ln in body.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
        assert any("HMMA.16816.F32" in o for o in ops), name
        assert any("F2FP.F16.E4M3.UNPACK_B" in o for o in ops), name
        # EF loads between consecutive runs of HMMAs: a whole batch or none
        gaps, count = [], 0
        for o in ops:
            if "LDG.E.EF.128" in o:
                count += 1
            elif "HMMA" in o:
                gaps.append(count)
                count = 0
        assert gaps and all(g == 0 or g >= batch for g in gaps), f"{name}: a batch's loads split by MMAs {gaps}"
        assert "LDL" not in body and "STL" not in body, f"{name}: local-memory traffic"
        assert not re.findall(r"\bF(?:ADD|MUL|FMA)\S*\.FTZ\b", body), f"{name}: flush-to-zero arithmetic"
        if _warp_mma_x_form(rep, name):
            # quant.cuh's float32 quotient and scale (div448_f32): float64
            # only for each group's reciprocal (its Newton steps' DFMAs and
            # one F2F), three FMA-pipe operations an element (8 elements a
            # lane a step); no DMUL (the scale's float64 product, until v0.21)
            steps = _config.WARP_MMA_QUANT_A_STEPS
            assert not any(re.search(r"\bDMUL\b", o) for o in ops), name
            assert any(re.search(r"\bDFMA\b", o) for o in ops), name
            assert sum("F2F.F32.F64" in o for o in ops) <= steps, name
            assert sum(re.search(r"\bFFMA\b", o) is not None for o in ops) >= 2 * 8 * steps, name
            assert sum("SHFL" in o for o in ops) >= 4 * _config.WARP_MMA_UNROLL, name


def test_warp_mma_reads_only_b_before_its_grid_dependency_wait(warp_mma_report):
    """ptx/griddep.cuh's rule: the activations and every scale are read only
    after a griddepcontrol.wait; before the first one, at most one batch of
    B (kFlagBBeforeWait's path), through ld.global.cs.  The forms that
    quantise x have one loop, which reads nothing before its wait."""
    entries = warp_mma_report.ptx.split(".entry")[1:]
    assert len(entries) == len(warp_mma_report.resources)
    for entry in entries:
        mangled = entry.split("(", 1)[0].strip()
        x_form = _warp_mma_x_form(warp_mma_report, mangled)
        first_wait = entry.find("griddepcontrol.wait")
        assert first_wait >= 0 and entry.count("griddepcontrol.wait") == (1 if x_form else 2)   # one per loop copy
        before = entry[:first_wait]
        assert "ld.global.nc" not in before and "st.global" not in before
        assert before.count("ld.global.cs") <= (0 if x_form else 4 * _config.WARP_MMA_UNROLL)
        trigger = entry.find("griddepcontrol.launch_dependents")
        assert trigger > first_wait


def test_warp_mma_smem_matches_the_python_formula():
    """_config.warp_mma_smem_size against WarpMmaSmem::kTotal (and, with k,
    the x form's WarpMmaQuantASmem::kTotal)."""
    checks = []
    for splits, slabs, _, _ in WARP_MMA_FORCED:
        want = _config.warp_mma_smem_size(8, 16 * slabs, splits)
        checks.append(f"static_assert(cugemm8::WarpMmaSmem<1, 1, {splits}, {slabs}>::kTotal == {want}u);")
    for k in (16, 1008, 2064, 7168):
        want = _config.warp_mma_smem_size(8, 16, 1, k)
        checks.append(f"static_assert(cugemm8::WarpMmaQuantASmem<{k}>::kTotal == {want}u);")
    checks.append(f"static_assert(cugemm8::kWarpMmaQuantARegisters == {_config.WARP_MMA_QUANT_A_REGISTERS}u);")
    checks.append(f"static_assert(cugemm8::kWarpMmaQuantSteps == {_config.WARP_MMA_QUANT_A_STEPS}u);")
    _compile_static_asserts(checks, header="fp8_gemm_warp_mma.cuh")
