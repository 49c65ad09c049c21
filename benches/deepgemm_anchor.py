"""DeepGEMM as a measuring instrument, timed in the same process as cugemm8.

Never a dependency: the benches import this module only when asked
(``--deepgemm``), and it reports why DeepGEMM is unusable instead of
failing.  DeepGEMM v2.x takes torch tensors; the operands are cugemm8's own
CuPy arrays shared through DLPack without copies (FP8 crosses as uint8 and
is viewed as ``torch.float8_e4m3fn``), so both libraries multiply the same
bytes.  Its API as documented in ``../shared/anchors/README.md``:
``fp8_gemm_nt((a, sfa), (b, sfb), d, disable_ue8m0_cast=True)`` with
``sfa = get_mn_major_tma_aligned_tensor(sfa)`` built once, and
``per_token_cast_to_fp8(x, use_ue8m0=False)``; the grouped GEMMs
``m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, m_indices,
disable_ue8m0_cast=True)`` and ``m_grouped_fp8_gemm_nt_masked((a, sfa), (b,
sfb), d, masked_m, expected_m, disable_ue8m0_cast=True)``
(:func:`grouped_contiguous`, :func:`grouped_masked`).

DeepGEMM compiles each new kernel with NVCC on its first call (2-3.5 s a
normal GEMM, about 6 s a grouped one); :func:`prewarm` makes those first
calls in parallel processes (sharing ``DG_JIT_CACHE_DIR``) before anything
is timed.
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


def contiguous_alignment() -> int:
    """Rows each group of DeepGEMM's contiguous layout must start on
    (``get_mk_alignment_for_contiguous_layout()``: 128 on SM90, the same as
    cugemm8's ``GROUP_ALIGN``).  Raises RuntimeError when DeepGEMM is
    unusable."""
    dg, torch = load()
    if dg is None:
        raise RuntimeError(torch)
    return int(dg.get_mk_alignment_for_contiguous_layout())


def contiguous_layout_problem(m_indices, alignment: int, num_groups: int) -> str | None:
    """Why the host int array ``m_indices`` (group of each row of A, -1 for
    padding) is not a layout DeepGEMM's SM90 contiguous kernel reads as
    cugemm8 does, or None when it is.  That kernel takes the group of each
    block of ``alignment`` rows from the block's first row and skips a block
    whose first row is -1: so within a block the non-padding rows must all
    be one group, and a block holding any non-padding row must start with
    one (padding only after a group's rows, each group starting on a
    multiple of ``alignment``)."""
    import numpy as np
    mi = np.asarray(m_indices).reshape(-1).astype(np.int64)
    if mi.size == 0:
        return None
    if mi.min() < -1 or mi.max() >= num_groups:
        return f"m_indices must lie in [-1, {num_groups}) (found {int(mi.min())} .. {int(mi.max())})"
    pad = (-mi.size) % alignment
    blocks = np.concatenate([mi, np.full(pad, -1, np.int64)]).reshape(-1, alignment)
    first = blocks[:, :1]
    mixed = ((blocks != first) & (blocks != -1)).any(axis=1)
    skipped = (first[:, 0] == -1) & (blocks != -1).any(axis=1)
    bad = np.flatnonzero(mixed | skipped)
    if bad.size:
        i = int(bad[0])
        return (f"rows {i * alignment}..{(i + 1) * alignment - 1} of m_indices are not one group's rows "
                f"followed by padding: every group must start on a multiple of {alignment} rows")
    return None


def grouped_contiguous(a, sfa, b, sfb, m_indices):
    """A no-argument callable running DeepGEMM's
    ``m_grouped_fp8_gemm_nt_contiguous`` on cugemm8's contiguous operands
    (CuPy, as :func:`cugemm8.cli.make_operands` builds them):

    * ``a`` uint8 [m_sum, k] (e4m3 bits, K-major, rows contiguous): every
      group's rows one after another, each group padded to a multiple of
      :func:`contiguous_alignment` rows (128);
    * ``sfa`` float32 [m_sum, ceil(k/128)] (1x128 scales, any layout; made
      MN-major TMA-aligned here, once, by DeepGEMM's
      ``get_mn_major_tma_aligned_tensor``, so the call launches no
      transpose);
    * ``b`` uint8 [g, n, k] K-major, ``sfb`` float32 [g, ceil(n/128),
      ceil(k/128)] contiguous (128x128 scales, used as they are);
    * ``m_indices`` int32 [m_sum], contiguous: the group of each row, -1 for
      padding rows (checked here against DeepGEMM's block rule:
      :func:`contiguous_layout_problem`; ValueError when it fails).

    ``run.out`` is DeepGEMM's torch bf16 output [m_sum, n], filled with NaN
    before the first call (rows DeepGEMM skips stay NaN); ``run.keep`` the
    CuPy arrays its views alias.  Raises RuntimeError when DeepGEMM is
    unusable."""
    dg, torch = load()
    if dg is None:
        raise RuntimeError(torch)
    import numpy as np
    if a.ndim != 2 or b.ndim != 3 or m_indices.shape != (a.shape[0],):
        raise ValueError(f"contiguous: want a [m_sum, k], b [g, n, k], m_indices [m_sum]; got a {a.shape}, "
                         f"b {b.shape}, m_indices {m_indices.shape}")
    if np.dtype(m_indices.dtype) != np.int32:
        raise ValueError(f"m_indices must be int32 (got {m_indices.dtype})")
    host = m_indices.get() if hasattr(m_indices, "get") else np.asarray(m_indices)
    problem = contiguous_layout_problem(host, contiguous_alignment(), b.shape[0])
    if problem is not None:
        raise ValueError(problem)
    ta, tb = _t(torch, a, True), _t(torch, b, True)
    tsa = dg.get_mn_major_tma_aligned_tensor(_t(torch, sfa))
    tsb = _t(torch, sfb)
    tmi = _t(torch, m_indices)
    d = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=torch.bfloat16, device=ta.device)

    def run():
        dg.m_grouped_fp8_gemm_nt_contiguous((ta, tsa), (tb, tsb), d, tmi, disable_ue8m0_cast=True)
    run.out = d
    run.keep = (a, sfa, b, sfb, m_indices)
    return run


def grouped_masked(a, sfa, b, sfb, masked_m, expected_m: int):
    """A no-argument callable running DeepGEMM's
    ``m_grouped_fp8_gemm_nt_masked`` on cugemm8's masked operands (CuPy):

    * ``a`` uint8 [g, m_max, k] K-major, ``sfa`` float32 [g, m_max,
      ceil(k/128)] (1x128 scales, any layout; made MN-major TMA-aligned
      per group here, once: a [g, m_max, kb] view with strides
      (tma(m_max) * kb, 1, tma(m_max)));
    * ``b`` uint8 [g, n, k], ``sfb`` float32 [g, ceil(n/128), ceil(k/128)]
      contiguous;
    * ``masked_m`` int32 [g], contiguous, on the device: the rows of each
      group that count (<= m_max); ``expected_m`` the host hint both
      libraries are given (cugemm8's benches pass m_max).

    ``run.out`` is DeepGEMM's torch bf16 output [g, m_max, n], filled with
    NaN first (rows at or past ``masked_m[e]`` are never written);
    ``run.keep`` the CuPy arrays its views alias.  Raises RuntimeError when
    DeepGEMM is unusable."""
    dg, torch = load()
    if dg is None:
        raise RuntimeError(torch)
    import numpy as np
    if a.ndim != 3 or b.ndim != 3 or masked_m.shape != (a.shape[0],) or b.shape[0] != a.shape[0]:
        raise ValueError(f"masked: want a [g, m_max, k], b [g, n, k], masked_m [g]; got a {a.shape}, "
                         f"b {b.shape}, masked_m {masked_m.shape}")
    if np.dtype(masked_m.dtype) != np.int32:
        raise ValueError(f"masked_m must be int32 (got {masked_m.dtype})")
    ta, tb = _t(torch, a, True), _t(torch, b, True)
    tsa = dg.get_mn_major_tma_aligned_tensor(_t(torch, sfa))
    tsb = _t(torch, sfb)
    tmm = _t(torch, masked_m)
    d = torch.full((a.shape[0], a.shape[1], b.shape[1]), float("nan"), dtype=torch.bfloat16, device=ta.device)
    expected_m = int(expected_m)

    def run():
        dg.m_grouped_fp8_gemm_nt_masked((ta, tsa), (tb, tsb), d, tmm, expected_m, disable_ue8m0_cast=True)
    run.out = d
    run.keep = (a, sfa, b, sfb, masked_m)
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


KINDS = ("normal", "contiguous", "masked")


def warm_spec(shape) -> tuple:
    """``(kind, m, n, k, g, expected_m)`` of a prewarm entry: ``(m, n, k)`` (a
    normal GEMM, as the decode benches pass) or ``(kind, m, n, k, g[,
    expected_m])`` with ``m`` the rows of A (normal), the rows of each
    group (contiguous: each padded to :func:`contiguous_alignment`) or m_max
    (masked; ``expected_m`` defaults to it, as cugemm8's benches pass)."""
    shape = tuple(shape)
    if len(shape) == 3:
        return ("normal",) + tuple(int(v) for v in shape) + (1, int(shape[0]))
    if len(shape) not in (5, 6) or shape[0] not in KINDS:
        raise ValueError(f"a prewarm entry is (m, n, k) or (kind, m, n, k, g[, expected_m]) "
                         f"with kind in {KINDS}; got {shape!r}")
    kind, m, n, k, g = shape[0], *(int(v) for v in shape[1:5])
    return (kind, m, n, k, g, int(shape[5]) if len(shape) == 6 else m)


def _warm_one(spec) -> None:
    """One first call of DeepGEMM's kernel for ``spec`` (:func:`warm_spec`),
    on zero operands of that shape."""
    import cupy as cp
    import numpy as np
    kind, m, n, k, g, expected_m = spec
    kb, nb = -(-k // 128), -(-n // 128)
    if kind == "normal":
        gemm_nt(cp.zeros((m, k), cp.uint8), cp.ones((m, kb), cp.float32),
                cp.zeros((n, k), cp.uint8), cp.ones((nb, kb), cp.float32))()
        return
    b, sfb = cp.zeros((g, n, k), cp.uint8), cp.ones((g, nb, kb), cp.float32)
    if kind == "contiguous":
        align = contiguous_alignment()
        rows = -(-m // align) * align
        host = np.full(g * rows, -1, np.int32)
        for e in range(g):
            host[e * rows:e * rows + m] = e
        grouped_contiguous(cp.zeros((g * rows, k), cp.uint8), cp.ones((g * rows, kb), cp.float32), b, sfb,
                           cp.asarray(host))()
    else:
        grouped_masked(cp.zeros((g, m, k), cp.uint8), cp.ones((g, m, kb), cp.float32), b, sfb,
                       cp.full(g, m, cp.int32), expected_m)()


def _warm_worker(specs):
    """(kernels warmed, first error or '') for a chunk of :func:`warm_spec`
    entries, in a spawned process."""
    dg, torch = load()
    if dg is None:
        return 0, torch
    done, error = 0, ""
    for spec in specs:
        try:
            _warm_one(spec)
            torch.cuda.synchronize()
            done += 1
        except Exception as exc:           # reported; the bench then reports that shape's own error
            error = error or f"{spec[0]} {spec[1:5]}: {type(exc).__name__}: {exc}"
    return done, error


def open_for(shapes):
    """This module, with DeepGEMM's kernels prewarmed for every entry of
    ``shapes`` (:func:`warm_spec`: ``(m, n, k)`` normal GEMMs, or ``(kind,
    m, n, k, g[, expected_m])`` for any kind), or None when DeepGEMM is not
    usable; prints the prewarm summary or the reason (the benches'
    ``--deepgemm`` start-up)."""
    if load()[0] is None:
        print(load()[1])
        return None
    import sys
    print(prewarm(shapes))
    return sys.modules[__name__]


def prewarm(shapes, processes: int = 8) -> str:
    """Compile DeepGEMM's kernel for every entry of ``shapes`` (see
    :func:`open_for`) in up to ``processes`` parallel processes; returns a
    one-line summary (naming the first failure, if any)."""
    if load()[0] is None:
        return load()[1]
    os.environ.setdefault("DG_JIT_CACHE_DIR", "/tmp/dg_jit")
    specs = list(dict.fromkeys(warm_spec(s) for s in shapes))
    processes = max(1, min(processes, len(specs)))
    chunks = [c for c in (specs[i::processes] for i in range(processes)) if c]
    if not chunks:
        return "DeepGEMM: nothing to prewarm"
    with mp.get_context("spawn").Pool(len(chunks)) as pool:
        results = pool.map(_warm_worker, chunks)
    done = sum(r[0] for r in results)
    errors = [r[1] for r in results if r[1]]
    kinds = sorted({s[0] for s in specs}, key=KINDS.index)
    return (f"DeepGEMM prewarmed {done} of {len(specs)} shapes ({', '.join(kinds)}) in {len(chunks)} processes"
            + (f"; first failure: {errors[0]}"[:300] if errors else ""))
