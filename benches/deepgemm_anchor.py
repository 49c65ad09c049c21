"""DeepGEMM as a measuring instrument, timed in the same process as cugemm8.

Never a dependency: the benches import this module only when asked
(``--deepgemm``), and it reports why DeepGEMM is unusable instead of
failing.  DeepGEMM v2.x takes torch tensors; the operands are cugemm8's own
CuPy arrays shared through DLPack without copies (FP8 crosses as uint8 and
is viewed as ``torch.float8_e4m3fn``), so both libraries multiply the same
bytes.  Its API as documented in ``../shared/anchors/README.md``:
``fp8_gemm_nt((a, sfa), (b, sfb), d, disable_ue8m0_cast=True)`` with
``sfa = get_mn_major_tma_aligned_tensor(sfa)`` built once, and
``per_token_cast_to_fp8(x, use_ue8m0=False)``.

DeepGEMM compiles each new kernel with NVCC on its first call (2-3.5 s);
:func:`prewarm` makes those first calls in parallel processes (sharing
``DG_JIT_CACHE_DIR``) before anything is timed.
"""
from __future__ import annotations

import multiprocessing as mp
import os

_state: dict = {}


def load():
    """``(deep_gemm, torch)`` or ``(None, reason)``."""
    if "r" not in _state:
        try:
            import torch
            import deep_gemm
            if not torch.cuda.is_available():
                raise RuntimeError("torch sees no CUDA device")
            _state["r"] = (deep_gemm, torch)
        except Exception as exc:     # not installed, no extension, no GPU
            _state["r"] = (None, f"DeepGEMM not usable ({type(exc).__name__}: {exc})")
    return _state["r"]


def _t(torch, x, fp8: bool = False):
    t = torch.from_dlpack(x)
    return t.view(torch.float8_e4m3fn) if fp8 else t


def gemm_nt(a, sfa, b, sfb):
    """A no-argument callable running DeepGEMM's ``fp8_gemm_nt`` on cugemm8's
    operands (CuPy: ``a`` uint8 [m, k], ``sfa`` float32 [m, kb] any layout,
    ``b`` uint8 [n, k], ``sfb`` float32 [nb, kb]); ``run.out`` is its torch
    bf16 output [m, n].  Raises RuntimeError when DeepGEMM is unusable."""
    dg, torch = load()
    if dg is None:
        raise RuntimeError(torch)
    m, n = a.shape[0], b.shape[0]
    ta, tb = _t(torch, a, True), _t(torch, b, True)
    tsa = dg.get_mn_major_tma_aligned_tensor(_t(torch, sfa))
    tsb = _t(torch, sfb)
    d = torch.empty((m, n), dtype=torch.bfloat16, device=ta.device)

    def run():
        dg.fp8_gemm_nt((ta, tsa), (tb, tsb), d, disable_ue8m0_cast=True)
    run.out = d
    run.keep = (a, sfa, b, sfb)
    return run


def cast_and_gemm(x, b, sfb):
    """DeepGEMM's decode pair on a bf16 CuPy ``x`` [m, k]: its
    ``per_token_cast_to_fp8`` then ``fp8_gemm_nt`` (two launches), as one
    callable; ``run.out`` the bf16 output."""
    dg, torch = load()
    if dg is None:
        raise RuntimeError(torch)
    tx = _t(torch, x)
    tb, tsb = _t(torch, b, True), _t(torch, sfb)
    d = torch.empty((x.shape[0], b.shape[0]), dtype=torch.bfloat16, device=tx.device)

    def run():
        xq, xs = dg.per_token_cast_to_fp8(tx, use_ue8m0=False)
        dg.fp8_gemm_nt((xq, xs), (tb, tsb), d, disable_ue8m0_cast=True)
    run.out = d
    run.keep = (x, b, sfb)
    return run


def gemm_nt_1d1d(a, sfa, b, sfb, d):
    """DeepGEMM's 1D1D ``fp8_gemm_nt`` (recipe (1, 1, 128), FP32 out) on
    cugemm8's operands (``sfa [m, kb]``, ``sfb [n, kb]`` float32) into the
    CuPy float32 ``d [m, n]`` (shared through DLPack), accumulating in place
    (``c = d``, DeepGEMM's wgrad form).  Raises RuntimeError when DeepGEMM
    is unusable."""
    dg, torch = load()
    if dg is None:
        raise RuntimeError(torch)
    ta, tb = _t(torch, a, True), _t(torch, b, True)
    tsa = dg.get_mn_major_tma_aligned_tensor(_t(torch, sfa))
    tsb = dg.get_mn_major_tma_aligned_tensor(_t(torch, sfb))
    td = _t(torch, d)

    def run():
        dg.fp8_gemm_nt((ta, tsa), (tb, tsb), td, c=td, recipe=(1, 1, 128), disable_ue8m0_cast=True)
    run.keep = (a, sfa, b, sfb, d)
    return run


def k_grouped_1d1d(a, sfa, b, sfb, ks, d):
    """DeepGEMM's ``k_grouped_fp8_gemm_nt_contiguous`` on cugemm8's operands
    (``a [m, sum ks]`` K-major over the concatenated tokens, ``sfa [m, sum
    ks / 128]``; likewise ``b``): its SM90 kernel reads each group's
    ``[m, ks[e]]`` block contiguously, group after group, so A and B are
    copied into that layout once here (outside the timed call); ``d``
    ``[g, m, n]`` float32 CuPy, accumulated in place (``c = d``, which its
    SM90 entry point requires)."""
    dg, torch = load()
    if dg is None:
        raise RuntimeError(torch)
    ta, tb = _t(torch, a, True), _t(torch, b, True)
    offs = [0]
    for k in ks:
        offs.append(offs[-1] + k)
    flat_a = torch.cat([ta[:, offs[e]:offs[e + 1]].contiguous().flatten() for e in range(len(ks))])
    flat_b = torch.cat([tb[:, offs[e]:offs[e + 1]].contiguous().flatten() for e in range(len(ks))])
    tsa, tsb = _t(torch, sfa), _t(torch, sfb)
    td = _t(torch, d)
    layout = torch.tensor(list(ks), dtype=torch.int32, device=ta.device)
    ks = list(ks)

    def run():
        dg.k_grouped_fp8_gemm_nt_contiguous((flat_a, tsa), (flat_b, tsb), td, ks, layout, td,
                                            recipe=(1, 1, 128))
    run.keep = (a, sfa, b, sfb, d)
    return run


def _warm_worker(shapes):
    import cupy as cp
    dg, torch = load()
    if dg is None:
        return 0
    done = 0
    for m, n, k in shapes:
        a = cp.zeros((m, k), cp.uint8)
        sfa = cp.ones((m, -(-k // 128)), cp.float32)
        b = cp.zeros((n, k), cp.uint8)
        sfb = cp.ones((-(-n // 128), -(-k // 128)), cp.float32)
        gemm_nt(a, sfa, b, sfb)()
        done += 1
    torch.cuda.synchronize()
    return done


def open_for(shapes):
    """This module, with DeepGEMM's kernels prewarmed for every (m, n, k) in
    ``shapes``, or None when DeepGEMM is not usable; prints the prewarm
    summary or the reason (the benches' ``--deepgemm`` start-up)."""
    if load()[0] is None:
        print(load()[1])
        return None
    import sys
    print(prewarm(shapes))
    return sys.modules[__name__]


def prewarm(shapes, processes: int = 8) -> str:
    """Compile DeepGEMM's kernel for every (m, n, k) in ``shapes`` in
    ``processes`` parallel processes; returns a one-line summary."""
    if load()[0] is None:
        return load()[1]
    os.environ.setdefault("DG_JIT_CACHE_DIR", "/tmp/dg_jit")
    shapes = list(shapes)
    chunks = [shapes[i::processes] for i in range(processes)]
    with mp.get_context("spawn").Pool(processes) as pool:
        done = sum(pool.map(_warm_worker, [c for c in chunks if c]))
    return f"DeepGEMM prewarmed {done} shapes in {processes} processes"
