"""Kernel configurations of the 1D1D GEMMs (FP32 out; ``cuda_src/fp8_gemm_1d1d.cuh``):
pure, deterministic, CPU-only.

Hard constraints (the kernel static-asserts them; :func:`is_legal`)
------------------------------------------------------------------
- ``block_m`` in {128, 256}: two math warpgroups owning 64-row sub-tiles
  (one each, or two each); ``block_k`` = 128 (one promotion interval).
- ``block_n`` a multiple of 8 in [8, 256] with at most 208 FP32 registers
  per math thread held across the promotion: ``(block_m / 128 + 1) *
  block_n / 2`` accumulators, plus ``block_n / 4`` B scales with ``block_m``
  = 128 (so 128 x 160 and 256 x 128 at most; 128 x 176 spilled 8 bytes
  in the epilogue, 128 x 192 in the K loop).
- Shared memory (:func:`smem_size`) at most 232,448 bytes, 3 to 16 stages.
- The TMA epilogue (``tma_store``: D staged in 64 x 32 FP32 chunks, 32 KB,
  stored by TMA, or reduce-added into ``d`` when ``c`` is ``d``) needs
  ``block_n % 32 == 0``; calls with ``c`` another array, or ``d`` not 16-byte
  aligned, take the register epilogue.
- Grid: at most the SMs available and at most the tiles.

Selection (:func:`select_config`)
---------------------------------
Candidates: ``block_m`` = 128 (:data:`SELECT_BLOCK_MS`; 256 is legal but
measured slower) x ``block_n`` in :data:`BLOCK_N_CANDIDATES`, each with the
most stages that fit, with the TMA epilogue wherever the call and the tile
allow it (measured 0.2-4 % faster without ``c`` and 3-20 % with ``c = d`` on
all 12 shapes of ``benches/bench_training.py``, one stage fewer; H200, v0.13,
benches/RESULTS.md).  On those shapes this picks the fastest of 6 measured
tiles every time (128x160, or 128x128 at N = 512 where 160 pads a quarter of
the columns; v0.11).  Score, in
SM cycles of the busiest CTA (the 1D2D model's structure,
cugemm8/_config.py, with the 1D1D kernel's own terms)::

    score = waves * (kb * t_block + t_epilogue + C_TILE)
    waves = ceil(groups * tiles / grid)
    t_block = max(BM*BN/32,                      tensor core, 4096 FP8 MAC/cycle
                  (BM + BN) * 128 / feed_rate,    L2 -> SM, feed_rate = min(64, 6154 / grid)
                  BM/128 * 2.25 * BN + C_KB)      promotion: 2 FP32 ops per element
                                                  + an 8-byte B-scale load per 8 columns,
                                                  two math warps per SM sub-partition
    t_epilogue = BM*BN*4 / 32 * (2 with C else 1) FP32 stores (and C loads) at 32 B/cycle;
                 BM*BN*4 / 32 * 0.5               with the TMA epilogue (staging only)

with ``kb`` the mean 128-K blocks of a tile (k-grouped: over the groups).
Ties go to fewer padded elements, then larger BLOCK_M, then smaller
BLOCK_N.  These are rough H200 figures for ranking, not times.
"""
from __future__ import annotations

import dataclasses
import functools

from ._config import _align, _as_int, _ceil_div

__all__ = ["Gemm1d1dConfig", "BLOCK_M_CANDIDATES", "BLOCK_N_CANDIDATES", "smem_size", "max_stages",
           "is_legal", "make_config", "select_config", "ranked_configs"]

BLOCK_K = 128
SMEM_LIMIT = 232448
MAX_STAGES = 16
MIN_STAGES = 3
#: BLOCK_N up to which a 128-row tile pipelines its WGMMAs (fp8_gemm_1d1d.cuh kPipelineMma)
PIPELINE_MAX_BLOCK_N = 128
REGISTER_LIMIT = 208          # of the 232 a math thread has after setmaxnreg (128x176 spilled)
BLOCK_M_CANDIDATES = (128, 256)
#: The BLOCK_M values :func:`select_config` considers.  256 (two sub-tiles per
#: math warpgroup, B's scales re-read from shared memory per sub-tile, the
#: stage released after both) measured 1-15 % slower than the best 128-row
#: tile on all 12 shapes of benches/bench_training.py (H200, v0.11,
#: benches/RESULTS.md), so it stays a forced-configuration option only.
SELECT_BLOCK_MS = (128,)
BLOCK_N_CANDIDATES = (64, 96, 112, 128, 144, 160, 176, 192)
C_KB = 300.0                 # per-K-block latency: barrier wait, scale reads, release
C_TILE = 1500.0              # per tile: pipeline refill behind the epilogue
STORE_BYTES_PER_CYCLE = 32.0
TMA_EPILOGUE = 0.5           # TMA epilogue: staging only, the stores (or L2 reduce-adds) drain behind the K loop
L2_BYTES_PER_CYCLE = 8e6 / 1300
SM_BYTES_PER_CYCLE = 64.0


@dataclasses.dataclass(frozen=True)
class Gemm1d1dConfig:
    """One 1D1D kernel configuration (``str``: e.g. ``128x128 s6 sms132``).

    Attributes:
        block_m: rows of one output tile (BLOCK_M): 128 or 256.
        block_n: columns of one output tile (BLOCK_N): a multiple of 8.
        num_stages: depth of the TMA pipeline (shared-memory stages).
        num_sms: the grid (persistent CTAs).
        smem_bytes: dynamic shared memory per CTA (:func:`smem_size`).
        tma_store: the epilogue stores D through TMA (staged 64 x 32 FP32
            chunks; with ``c`` a TMA reduce-add into ``d``, so ``c`` must be
            ``d``); False: FP32 stores from registers (any ``c``).
    """
    block_m: int
    block_n: int
    num_stages: int
    num_sms: int
    smem_bytes: int
    tma_store: bool = False

    def __str__(self) -> str:
        return (f"{self.block_m}x{self.block_n} s{self.num_stages} sms{self.num_sms}"
                + (" tma" if self.tma_store else ""))


#: Shared memory of the TMA epilogue's D staging: 2 warpgroups x 2 buffers of 64 x 32 FP32.
TMA_STORE_SMEM = 2 * 2 * 64 * 32 * 4


def smem_size(block_m: int, block_n: int, num_stages: int, tma_store: bool = False) -> int:
    """Dynamic shared memory (bytes); ``SmemLayout1d1d`` in the kernel::

        (32768 if tma_store) + stages * (BM*128 + BN*128 + align(BM*4, 128) + align(BN*4, 128)) + 256
    """
    per_stage = block_m * BLOCK_K + block_n * BLOCK_K + _align(block_m * 4, 128) + _align(block_n * 4, 128)
    return (TMA_STORE_SMEM if tma_store else 0) + num_stages * per_stage + 256


def max_stages(block_m: int, block_n: int, smem_limit: int = SMEM_LIMIT, tma_store: bool = False) -> int:
    """The most stages (at most 16) that fit, or 0 below the minimum of 3."""
    fixed = smem_size(block_m, block_n, 0, tma_store)
    per_stage = smem_size(block_m, block_n, 1) - smem_size(block_m, block_n, 0)
    stages = min(MAX_STAGES, max(0, smem_limit - fixed) // per_stage)
    return stages if stages >= MIN_STAGES else 0


def make_config(block_m: int, block_n: int, num_stages: int, num_sms: int,
                tma_store: bool = False) -> Gemm1d1dConfig:
    return Gemm1d1dConfig(block_m, block_n, num_stages, num_sms,
                          smem_size(block_m, block_n, num_stages, tma_store), tma_store)


def tma_store_ok(block_n: int) -> bool:
    """Whether the TMA epilogue can take this BLOCK_N (whole 32-column chunks)."""
    return block_n % 32 == 0


def _registers_needed(block_m: int, block_n: int) -> int:
    """FP32 registers per math thread held across the promotion: the WGMMA
    accumulators and the final tile(s), BLOCK_N / 2 each; with BLOCK_M = 128
    and BLOCK_N <= 128 the kernel pipelines the WGMMAs across K blocks
    (``kPipelineMma``: a second accumulator, scales read during the
    promotion), otherwise BLOCK_M = 128 also holds B's scales for the
    thread's columns (BLOCK_N / 4)."""
    waves = block_m // 128
    if waves == 1 and block_n <= PIPELINE_MAX_BLOCK_N:
        return 3 * block_n // 2
    return (waves + 1) * block_n // 2 + (block_n // 4 if waves == 1 else 0)


def _registers_ok(block_m: int, block_n: int) -> bool:
    return _registers_needed(block_m, block_n) <= REGISTER_LIMIT


def is_legal(cfg: Gemm1d1dConfig, *, available_sms: int | None = None,
             smem_limit: int = SMEM_LIMIT) -> tuple[bool, str]:
    """``(True, "ok")`` or ``(False, reason)`` for the kernel's rules."""
    bm, bn = cfg.block_m, cfg.block_n
    for name in ("block_m", "block_n", "num_stages", "num_sms", "smem_bytes"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool):
            return False, f"{name} must be an int, got {v!r}"
    if bm not in BLOCK_M_CANDIDATES:
        return False, f"block_m must be one of {BLOCK_M_CANDIDATES}, got {bm}"
    if bn % 8 or not 8 <= bn <= 256:
        return False, f"block_n must be a multiple of 8 in [8, 256], got {bn}"
    if not _registers_ok(bm, bn):
        return False, (f"{bm}x{bn} needs {_registers_needed(bm, bn)} accumulator and scale registers "
                       f"per thread (> {REGISTER_LIMIT})")
    if not MIN_STAGES <= cfg.num_stages <= MAX_STAGES:
        return False, f"num_stages must be in [{MIN_STAGES}, {MAX_STAGES}], got {cfg.num_stages}"
    if not isinstance(cfg.tma_store, bool):
        return False, f"tma_store must be a bool, got {cfg.tma_store!r}"
    if cfg.tma_store and not tma_store_ok(bn):
        return False, f"the TMA epilogue stores 32-column chunks: block_n must be a multiple of 32, got {bn}"
    want = smem_size(bm, bn, cfg.num_stages, cfg.tma_store)
    if cfg.smem_bytes != want:
        return False, f"smem_bytes {cfg.smem_bytes} != smem_size(...) = {want}"
    if cfg.smem_bytes > smem_limit:
        return False, f"smem_bytes {cfg.smem_bytes} > limit {smem_limit}"
    if cfg.num_sms < 1:
        return False, f"num_sms (grid) must be >= 1, got {cfg.num_sms}"
    if available_sms is not None and cfg.num_sms > available_sms:
        return False, f"grid {cfg.num_sms} exceeds the {available_sms} SMs available"
    return True, "ok"


def _score(bm: int, bn: int, m: int, n: int, kb_mean: float, groups: int, grid: int, with_c: bool,
           tma_store: bool = False):
    tiles = groups * _ceil_div(m, bm) * _ceil_div(n, bn)
    waves = _ceil_div(tiles, grid)
    feed = min(SM_BYTES_PER_CYCLE, L2_BYTES_PER_CYCLE / grid)
    t_block = max(bm * bn / 32, (bm + bn) * BLOCK_K / feed, bm / 128 * 2.25 * bn + C_KB)
    if tma_store:
        t_epi = bm * bn * 4 / STORE_BYTES_PER_CYCLE * TMA_EPILOGUE
    else:
        t_epi = bm * bn * 4 / STORE_BYTES_PER_CYCLE * (2 if with_c else 1)
    return waves * (kb_mean * t_block + t_epi + C_TILE), tiles * bm * bn


@functools.lru_cache(maxsize=4096)
def _rank(m: int, n: int, kb_total: int, groups: int, num_sms: int, with_c: bool, smem_limit: int,
          tma_store: bool = True, block_ms: tuple = SELECT_BLOCK_MS):
    kb_mean = kb_total / groups
    out = []
    for bm in block_ms:
        for bn in BLOCK_N_CANDIDATES:
            if not _registers_ok(bm, bn):
                continue
            tma = tma_store and tma_store_ok(bn)
            st = max_stages(bm, bn, smem_limit, tma)
            if not st:
                continue
            tiles = groups * _ceil_div(max(m, 1), bm) * _ceil_div(max(n, 8), bn)
            grid = max(1, min(num_sms, tiles))
            score, work = _score(bm, bn, max(m, 1), max(n, 8), kb_mean, groups, grid, with_c, tma)
            out.append(((score, work, -bm, bn), make_config(bm, bn, st, grid, tma)))
    if not out:
        raise ValueError(f"no 1D1D configuration fits smem_limit={smem_limit} bytes")
    out.sort(key=lambda e: e[0])
    return tuple((key[0], cfg) for key, cfg in out)


def ranked_configs(m: int, n: int, k: int, *, num_groups: int = 1, num_sms: int = 132,
                   with_c: bool = False, smem_limit: int = SMEM_LIMIT, tma_store: bool = True):
    """Every candidate with its score, best first (see the module docstring);
    ``k`` is the total K (k-grouped: the sum over the groups); ``tma_store``:
    whether the call allows the TMA epilogue (no ``c`` or ``c`` is ``d``, and
    ``d`` 16-byte aligned)."""
    m, n, k = _as_int("m", m), _as_int("n", n), _as_int("k", k)
    num_groups, num_sms = _as_int("num_groups", num_groups), _as_int("num_sms", num_sms)
    if m < 0 or n < 0 or k < 0:
        raise ValueError(f"m, n, k must be >= 0, got {m}, {n}, {k}")
    if num_groups < 1 or num_sms < 1:
        raise ValueError(f"num_groups and num_sms must be >= 1, got {num_groups}, {num_sms}")
    return _rank(m, n, _ceil_div(k, BLOCK_K), num_groups, num_sms, bool(with_c), smem_limit, bool(tma_store))


def select_config(m: int, n: int, k: int, *, num_groups: int = 1, num_sms: int = 132,
                  with_c: bool = False, smem_limit: int = SMEM_LIMIT, tma_store: bool = True) -> Gemm1d1dConfig:
    """The configuration :func:`cugemm8.fp8_gemm_nt` (FP32 out) and
    :func:`cugemm8.k_grouped_fp8_gemm_nt_contiguous` launch for D ``[m, n]``
    (per group) and total K ``k``; ``tma_store`` as for :func:`ranked_configs`.
    Raises ``ValueError`` / ``TypeError`` for impossible or non-integer
    arguments."""
    return ranked_configs(m, n, k, num_groups=num_groups, num_sms=num_sms, with_c=with_c,
                          smem_limit=smem_limit, tma_store=tma_store)[0][1]
