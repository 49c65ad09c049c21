"""Kernel-configuration heuristics: pure, deterministic, CPU-only.

:func:`select_config` picks the tile (``block_m`` x ``block_n``), pipeline
depth, TMA multicast and grid size of the persistent FP8 1D2D kernel for one
GEMM.  Nothing here imports CuPy or reads the environment; the same inputs
always give the same :class:`GemmConfig` (the result is ``lru_cache``d).
``cugemm8 configs`` (or ``python -m cugemm8 configs``) prints the choices for the benchmark shapes.

Hard constraints (checked by :func:`is_legal`; the kernel static-asserts them)
------------------------------------------------------------------------------
- ``block_k`` = 128; ``block_m`` in {64, 128, 256}; two math warpgroups;
  each runs ``waves = max(1, block_m // 128)`` 64-row sub-tiles, except that
  with ``block_m`` = 64 both work on the same rows and split K (even / odd
  blocks), reducing through shared memory at the tile's end, or a single
  math warpgroup (``num_math_warpgroups`` = 1, ``w1``) runs every K block
  itself: no reduction, its 64*BN*4 bytes free for stages, any stage count.
- ``block_n`` a multiple of 8 in [8, 256] (WGMMA m64nNk32) whose tiles touch
  at most three 128-row blocks of B scales (:func:`sfb_tile_rows`), and three
  only where the boundary is a compile-time constant per tile (at most
  MAX_BOUNDARY_VARIANTS values: ``gcd(block_n, 128) >= 16``): every
  ``block_n <= 128``, then 136, 144, 160, 176, 192, 208, 224, 240, 256.
- Registers: ``(waves + 1) * block_n / 2 <= 192`` FP32 values per math thread,
  so ``block_m`` = 256 needs ``block_n <= 128`` and otherwise ``block_n <= 192``.
- Shared memory (:func:`smem_size`) ``<= smem_limit``; 3 to 16 stages, and at
  least 4 unless ``block_m * block_n >= 128 * 192`` (DeepGEMM's newest rule);
  an even count with ``block_m`` = 64 (split K, see :func:`_stages_ok`).
- ``contiguous``: any ``block_m``.  The expert of each 128-row block (the
  per-expert row alignment) is read from ``m_indices``; with ``block_m`` =
  256 a tile spans two blocks and runs in two passes, the second only where
  the two blocks belong to different experts (kernel: scheduler.cuh).
- Multicast (cluster of 2): on A for every kind, on B for ``normal`` only; the
  grid is then even.  An unpaired tile of a cluster runs as a phantom.
- Split K across a cluster of 2 (``num_k_splits`` = 2, never with
  multicast): both CTAs of a pair take the same tile and half of its K
  blocks each, so the number of 128-wide K blocks must be even, and
  ``block_m`` is 64 or 128 (the kernel static-asserts both); the grid must
  be even (a cluster launch of an odd grid fails; fp8_gemm_1d2d.cuh,
  docs/design.md level 5).  Across a cluster of 4 (``num_k_splits`` = 4,
  ``normal`` only): a quarter each, the K blocks a multiple of 4, the grid
  a multiple of 4, at least 3 stages for every tile (:func:`_min_stages`).
- Grid = min(available SMs (even when multicasting or splitting K), tiles
  incl. phantoms, times 2 with split K); four-way split K (select_config's
  twin rule only, :data:`SPLIT_K4_MAX_PICK_BLOCK_N`) runs tiles times 4 CTAs,
  at most :func:`split_k4_max_ctas` (the clusters of four resident at once).
- ``swizzle_d`` = the largest of 128/64/32 bytes dividing ``block_n * 2``,
  else 0.

Candidates
----------
``block_m`` in (64, 128, 256) x ``block_n`` in
:data:`BLOCK_N_CANDIDATES` = 8, 16, 24, ..., 128 (every multiple of 8: narrow
and "unaligned" tiles such as 16, 56 and 112 are what fills 132 SMs at small
M), then 144, 160, 176, 192 (above 128 only multiples of 16 that pass the
straddle rule; 136 is legal but left out, having no D swizzle; 208-256 pass
the straddle rule but never the register rule; 176, whose tiles touch three
rows of B scales, is what splits the 2112-column weights into 12 tiles:
384 tiles of 128x176 on 132 SMs fill 97 % of three waves, 352 of 128x192
89 %) x multicast in (none, on A, on B).  Stages: the largest count that fits, capped at 16 (and even with
``block_m`` = 64).  Split K (x2) for ``block_m`` in SPLIT_K_BLOCK_MS (64,
128) and ``block_n`` <= SPLIT_K_MAX_BLOCK_N (32; wider only as the
one-warpgroup twin of a 128-row pick, ``_split_k_one_wg_twin``, 64 x 2*BLOCK_N
at 64 < m <= 128, and as the 128 x 64 twin of a 64 x 64 one-warpgroup pick
at 64 < m <= 128 and ceil(K / 128) >= 56, ``_split_k_m128_twin``) when the K blocks are even
in number and twice the tiles fit in one wave of ``num_sms``: on the H200
(benches/experiments/sweep_v0.5_splitk.json) it made 64x16-class tiles 9-43 %
faster (64x2112x7168: 64x32 split 10.3 us against 64x16 12.1 us; the N =
576 shapes 1.4x; 5-39 % with the final kernel's cluster-scope exchange,
benches/RESULTS.md v0.5).  Where filling the SMs with pairs needs
``block_n`` >= 64, the best split was 0.6-37 % slower than the best unsplit
tile, the cost model notwithstanding (the 0.6 %, 128x64 k2 at
128x4096x7168, became a win with v0.6's skewed split: the m128 twin).

Cost model
----------
Sources: DeepGEMM's generation-1 wave rule (minimise waves = ceil(tiles /
SMs), then maximise last-wave utilisation) and its generation-3 cost model
(L2 bytes per tile = K * (BM / cluster_n + BN / cluster_m), L1 bytes, L2
bandwidth min(64 * SMs, 8e6 / 1300) bytes/cycle, all divided by the fraction
of SMs busy), after deepseek-ai/DeepGEMM deep_gemm/jit_kernels/gemm.py
(get_best_configs) and csrc/jit_kernels/heuristics/sm90.hpp.  We estimate,
in SM cycles, the critical path of the busiest CTA::

    score  = waves * t_tile,      waves = ceil(executed_tiles / grid)
    t_tile = (t_compute**4 + t_feed**4) ** (1/4) + C_TILE + BM*BN/64

``executed_tiles`` counts the phantom tiles of unpaired clusters, so the
wave count (and the last wave's utilisation) is the generation-1 rule made
continuous: a partly empty last wave costs as much as a full one.  The 4-norm
is a max that charges for imperfect overlap when compute and feed are close;
C_TILE + BM*BN/64 is the per-tile B-scale load, syncs and D staging
(BM*BN*2 bytes through shared memory at 128 B/cycle).

- ``t_compute`` = ceil(K/128) x the largest of, per 128-K block:
  - tensor: BM*BN/32 cycles (4096 FP8 MAC/cycle/SM, dense peak);
  - shared memory at 128 B/cycle (generation 3's L1 term): TMA writes
    128*(BM + BN) bytes and each 64-row sub-tile's 4 WGMMAs read its A rows
    and all of B, 128*(BM/64)*(64 + BN) bytes.  This term is what makes the
    wide tiles (256x128, 128x192) win at large M;
  - one warpgroup's serial chain: per sub-tile 4 WGMMAs of max(BN/2,
    16 + BN/4) cycles each plus BN/2 FFMA cycles of promotion, plus C_KB
    (400) cycles of per-K-block latency (full-barrier wait, WGMMA pipeline
    latency before ``wgmma.wait_group 0``, scale reads, release).  The
    promotion costs x1.25 (RUNTIME_SELECT) only where the kernel selects the
    B-scale row per 8-column chunk at run time: tiles whose B-scale boundary
    takes more than 8 values, 128 / gcd(BN, 128) > 8 (BN an odd multiple of
    8: 24, 40, 56, 72, 88, 104, 120, 136); for the others (BN dividing 128,
    or 112, 144, 160, 192, ...) the K loop is instantiated once per boundary
    value.  One warpgroup's promotion overlaps the other's WGMMAs, hence the
    max.  With BM = 64 the two warpgroups split K; that measured only 1-7 %
    faster than one warpgroup per 64 rows (benches/RESULTS.md, v0.2), so the
    chain is multiplied by SPLIT_K_CHAIN = 0.9, not halved, and the tile
    pays C_WG_REDUCE (2000) cycles for the reduction; one math warpgroup
    (``w1``) has its chain multiplied by ONE_WG_CHAIN = 0.95 and no
    reduction (both fitted to the v0.11 decode sweep: one warpgroup wins
    5-10 % on the narrow split-K and the K = 512 tiles, two win 1-3 % on
    64x56-64x96 tiles at K >= 1536).
  C_KB and SPLIT_K_CHAIN are fitted to the H200 v0.3 forced-config sweep
  (benches/experiments/sweep_v0.3.json).  C_KB is most of the per-K-block time
  the sweep shows for narrow tiles at M <= 128, nearly whatever BN and grid (at
  (64, 576, 7168), 64x8 on 72 CTAs and 64x32 on 18 CTAs both take ~14 us);
  the chain's growth with BN, split K's small gain and the L2 share below
  are what make 128x64 (112 CTAs) beat the split-K 64x112 (128 CTAs) at
  (128, 7168, K), by 15 % at K = 16384.  Any C_KB in [320, 448] with
  SPLIT_K_CHAIN in [0.85, 0.9] keeps every choice on that sweep within
  3.6 % of the shape's fastest measured config.
- ``t_feed``: bytes each CTA pulls through L2 per tile, K * (rows_A / share_A +
  cols_B / share_B), with the real (unpadded) average rows and columns of a
  tile and share = 2 for the multicast operand (multicast halves its L2
  traffic), at a per-CTA rate of min(64, 6154 / grid) bytes/cycle
  (generation 3's numbers): the chip's L2 bandwidth is shared by the CTAs
  that run, not by every available SM, so this term is the grid's total L2
  traffic over the L2 bandwidth until a CTA reaches its SM's 64 B/cycle
  ingest port (grids of at most 96 CTAs).  Fewer, wider CTAs with fewer
  duplicated bytes are therefore not penalised for leaving SMs idle.  The
  rate is further capped by Little's law (stages x stage bytes in flight
  over LATENCY cycles), and every byte landing in shared memory passes the
  64 B/cycle port.  Duplicated reads of A or B across tiles are paid in
  full.
- At M <= 128 (one wave) the chain and the feed decide together: a narrow
  tile has the shorter chain, a wide one fewer duplicated bytes.  The picks
  are 64x32 with split K for (64, 2112, 7168) (66 tiles on 132 CTAs) and
  128x64 for (128, 7168, 16384) (112 tiles).
- The contiguous layout with ``block_m`` = 256 runs the 256-row tiles that
  straddle two experts twice: the model adds half of min(experts - 1,
  m-tiles) tile rows (a boundary lands at an odd multiple of 128 rows half
  the time), and C_TWO_PASS (2300 cycles, measured: about 1.3 us) per tile
  for reading two expert ids and skipping the absent pass-1 twin.  So
  256x128 wins at K = 7168 with a few large experts (1439 vs 1521 us for
  128x192 on the H200), 128x192 at K = 2048 (774 vs 797 us) and with many
  small experts.
- Split K: the K blocks per CTA are halved (plus ``split_k_skew`` for the
  busier rank 0 of a BLOCK_M = 128 pair; the one-warpgroup skew is not
  counted, see ``_score``) and the grid doubled (twice the
  executed tiles); C_SPLIT (1500 cycles) is added per tile for the exchange
  of the FP32 partial tile (any value in [0, 5000] gives the same picks on
  the v0.5 sweep).
- Multicast (on A for every kind, on B for ``normal``; the contiguous
  128x192 picks switch to B, below) costs MC_PENALTY (2%)
  for the lock-step of the two CTAs, and is only considered when the
  multicast candidate has more than one wave and there are at least
  MULTICAST_MIN_ROWS (512) rows of work (m, m_sum, or num_groups *
  expected_m), after DeepGEMM's generation-2 "m >= 512" rule and its
  generation-3 "no multicast in one wave" rule.  Both sides are scored.
  Only the kinds in MULTICAST_KINDS consider it, for the tiles in
  MULTICAST_TILES, and the normal GEMM on B for the tiles in
  NORMAL_MULTICAST_B_TILES and on A for those in NORMAL_MULTICAST_A_TILES
  from K = NORMAL_MULTICAST_A_MIN_K (1536) (see their comments); the
  contiguous 128x192 picks share B instead of A with experts of at least 256
  rows on average and K <= 7168 (CONTIGUOUS_MULTICAST_B_TILES).
- The DRAM roof (unique bytes / HBM bandwidth) is the same for every
  candidate of a shape and so is left out of the ranking.

The constants are rough H200 figures, good for ranking, not for predicting
times (the sweep's times include several microseconds of launch and
pipeline fill that no term models).  tests/test_config.py checks the choice
for every shape of the sweeps against its measured times.  Ties (equal
score) are broken, in order, by: less padded work (executed_tiles * BM *
BN), no multicast before multicast, no split K before split K, larger BM,
smaller BN, multicast on A before on B.  ``m == 0`` is scored as ``m == 1``
(the caller does not launch, but gets a valid config).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import operator

from ._shapes import DEEPSEEK_NK

__all__ = [
    "KINDS", "BLOCK_K", "SMEM_LIMIT", "MAX_STAGES", "BLOCK_M_CANDIDATES",
    "BLOCK_N_CANDIDATES", "GemmConfig", "select_config", "ranked_configs",
    "smem_size", "max_stages", "candidate_block_ms", "candidate_block_ns",
    "swizzle_d_bytes", "is_legal", "make_config", "tile_counts", "max_k",
    "format_table", "BENCHMARK_CASES", "split_k_skew", "check_n_k", "math_warpgroup_options",
    "quant_a_config", "QUANT_A_MAX_ROWS", "swap_ab_smem_size", "swap_ab_max_stages", "swap_ab_config",
]

KINDS = ("normal", "contiguous", "masked")
BLOCK_K = 128
SMEM_LIMIT = 232448          # sm_90 opt-in dynamic shared memory per block
SMEM_PER_SM = 228 * 1024     # sm_90 shared memory per SM
MAX_STAGES = 16
MIN_STAGES = 3
REGISTER_LIMIT = 192         # FP32 accumulator registers per math thread
BLOCK_M_CANDIDATES = (64, 128, 256)
BLOCK_N_CANDIDATES = tuple(range(8, 129, 8)) + (144, 160, 176, 192)


# Cost-model constants (SM cycles, bytes); see the module docstring.
L2_BYTES_PER_CYCLE = 8e6 / 1300     # whole-chip L2 -> SM bandwidth
SM_BYTES_PER_CYCLE = 64.0           # one SM's ingest port
LATENCY = 1000.0                    # memory latency for Little's law
C_KB = 400.0                        # per-K-block latency of one warpgroup's chain (fitted)
SPLIT_K_CHAIN = 0.9                 # BLOCK_M = 64 split K: chain x 0.9 (v0.2: 1-7% faster)
C_TILE = 400.0                      # per-tile B-scale load + epilogue syncs
RUNTIME_SELECT = 1.25               # promotion with a run-time B-scale row select
MAX_BOUNDARY_VARIANTS = 8           # the kernel's kMaxFormerVariants (fp8_gemm_1d2d.cuh)
MC_PENALTY = 0.02                   # multicast lock-step overhead
C_TWO_PASS = 2300.0                 # contiguous, BLOCK_M = 256: per tile (measured, see _score)
#: The kinds whose candidates include TMA multicast (select_config).  The
#: v0.1 sweep measured multicast 25-50 % slower than the same tile without
#: it; with the remote-arrival fence fixed, the v0.3 sweep
#: (benches/experiments/sweep_v0.3.json) had it at -2..+5 % on the normal and
#: contiguous GEMMs with >= 512 rows and +2..+8 % on the masked ones, so it
#: stayed out.  v0.6 re-measured it on the current kernel
#: (git: 5170af9:benches/results/variants_v0.6/run_contig_mc.log, alternating runs): on
#: the contiguous layout A multicast is 2.5-3.0 % faster at K = 2048 (128x192:
#: 749-757 vs 770-778 us, three pairs on each shape) and 0.8-1.2 % at
#: K = 7168 (256x128), every pair the same way; on the normal GEMM at
#: M = 4096 it stays within -1..+3 % (run_mc4096.log), so only the contiguous
#: layout uses it.  Forced configurations (make_config) can use it anywhere.
MULTICAST_KINDS = ("contiguous",)
#: ... and only for these (BLOCK_M, BLOCK_N) tiles, the ones measured above;
#: other tiles' multicast was -2..+8 % in the v0.3 sweep and has not been
#: re-measured on the current kernel.  None: every tile (sweeps).
MULTICAST_TILES = ((128, 192), (256, 128))
#: The contiguous layout's 128x192 picks share B instead of A (the cluster's
#: two CTAs take two 128-row m-blocks of one n-block; they share B's loads
#: when both blocks have one expert, else each loads its own: kPairedB in
#: fp8_gemm_1d2d.cuh) when the experts average at least
#: CONTIGUOUS_MULTICAST_B_MIN_EXPERT_ROWS rows (m_sum / num_groups) and K is
#: at most CONTIGUOUS_MULTICAST_B_MAX_K.  The ranking keeps A's score; only
#: the side changes.  Measured on the H200 (benches/RESULTS.md v0.35,
#: benches/experiments/sweep_v0.35_contig_mc.json; CUPTI, 128x192 s4 c2B
#: against c2A): 4x8192x7168x2048 -0.8 %, 8x4096x7168x2048 -1.3 to -1.6 %,
#: 4x8192x24576x1536 -2.6 %, 4x8192x32768x512 -4.4 %, 128x256x7168x2048
#: -2.4 %, 8x384x7168x2048 -3.3 %, 32x1024x7168x2048 -1.0 %,
#: 64x512x24576x1536 -0.7 %, 32x1024x4096x7168 -0.2 %; with 128-row experts,
#: whose pairs never share B, +5.2 % (256x128x7168x2048) and +9.5 %
#: (72x128x4096x7168); at K = 16384 (16x2048x7168x16384) CUPTI +3.1 % and CUDA
#: events -0.9 %: not decided, so A there.
CONTIGUOUS_MULTICAST_B_TILES = ((128, 192),)
CONTIGUOUS_MULTICAST_B_MIN_EXPERT_ROWS = 256
CONTIGUOUS_MULTICAST_B_MAX_K = 7168
#: The normal GEMM's B multicast, for these (BLOCK_M, BLOCK_N) tiles only (the
#: cluster's two CTAs take two m-blocks of one n-block and share B's loads):
#: measured on the H200 (benches/RESULTS.md v0.23, CUPTI after the benches'
#: flush) 128x176 c2B against 128x176 at 4096x2112x7168 96.3 against 99.6 us,
#: 8192x2112x7168 186.4 against 194.5; in 1 s sustained loops at
#: 4096x2112x7168 a tie (112.1 against 113.7 us), at 8192 220.2 against
#: 225.3 us and 9 % less energy.  Forced in place of other picks it was
#: 3-20 % slower than the 256x128 / 128x144 picks at M = 2048-8192 (four of
#: the six DeepSeek-V3 (N, K)) and faster only at K = 16384 (1-2 %) and at
#: 2048x7168 (K = 2048 3 %, K = 16384 5 %), so _rank ranks the tile by its
#: unicast score and multicasts only where it already won: among the
#: benchmark shapes, 4096x2112x7168 and 8192x2112x7168.  Other normal
#: shapes where 128x176 wins the ranking (e.g. 4096x2112x2048,
#: 8192x1056x7168) get the multicast unmeasured.  The 256x128 picks keep no
#: B multicast; from K = 1536 they take A's (NORMAL_MULTICAST_A_MIN_K, below).
NORMAL_MULTICAST_B_TILES = ((128, 176),)
#: The normal GEMM's A multicast (the cluster's two CTAs take two n-blocks of
#: one m-block and share A's loads) for a 256x128 pick with K at least
#: NORMAL_MULTICAST_A_MIN_K, ranked like B's upgrade (by its unicast score).
#: Measured on the H200 after the v0.27 unroll and the v0.28 loop addressing
#: (benches/RESULTS.md v0.28, CUPTI kernel times; the sweep over K is
#: benches/experiments/sweep_v0.28_mc_a.json): 1.2 % faster at K = 8192, 1.6 %
#: at 10240, 2.1-2.2 % at 12288-16384 (4096x7168xK), 2.4 % at 8192x7168x16384,
#: 1.2 % at 4096x4096x16384, 1.8 % at 4096x24576x8192; 2.1 % in a 1 s
#: sustained loop at 4096x7168x16384 (v0.27: 2.0-2.4 %), at a higher clock
#: under the power cap, not in fewer cycles.  K = 7168 was re-measured in
#: v0.29 (benches/experiments/v0.29/mc_k7168.log, energy_k7168.log): -0.1 %
#: and +0.2 % at 4096x4096x7168 and 2048x7168x7168 (noise), 1.0-2.1 % at 4096x7168x7168,
#: 8192x4096x7168 and 4096x24576x7168 (CUPTI), 0.9 % and 1.2 % faster in
#: 1 s sustained loops at 4096x4096x7168 and 8192x4096x7168 (v0.27 had
#: -0.5 % at 4096x4096x7168 in CUPTI): so from K = 7168.  v0.33 and v0.34
#: went below on the sustained loops the issue judges by: v0.33
#: (benches/experiments/v0.33/energy_c2a.log, four alternating rounds of
#: 1 s) 2.1 % and 2.0 % less energy per GEMM at 4096x24576x1536 and
#: 4096x7168x2048 at a 30-60 MHz higher clock (L2 read sectors -27 %);
#: v0.34 (benches/experiments/v0.34/energy_*.log, three rounds) sustained
#: time -1.0 % at 4096x24576x1536, -0.4 % at 4096x7168x2048, -2.2 % at
#: 8192x7168x2048, -1.0 % at 2048x24576x1536, -0.6 % at 1024x24576x1536,
#: +0.3 % at 4096x7168x1536 (the energy readings of one kernel moved 3-4 % between
#: its two entries of the same run there, so they decide nothing at 2 %).
#: CUPTI (cold L2; benches/experiments/sweep_v0.34_mc_a.json): -0.2 % to
#: -1.3 % at 4096x24576x1536, 4096x7168x2048, 4096x7168x4096 and
#: 8192x7168x2048, a tie at 2048x24576x1536, +0.8 % at 4096x7168x1536 and +1.4 % at
#: 1024x24576x1536.  At K = 512 (4096x32768x512) it stays off: 3 % slower
#: in CUPTI (v0.33: 132.9 against 128.5 us), 7 % more cycles in Nsight
#: Compute, 6 % more energy sustained in v0.33 (-0.8 % sustained time in
#: v0.34: within the noise).  So from K = 1536.  Among the benchmark shapes
#: it moves 4096x7168x16384, 4096x4096x7168, 4096x24576x1536 and
#: 4096x7168x2048; other 256x128 picks at K >= 1536 (e.g. 1024x24576x8192,
#: 2048x4096x16384) get it unmeasured.
NORMAL_MULTICAST_A_TILES = ((256, 128),)
NORMAL_MULTICAST_A_MIN_K = 1536
# Split K across a cluster of 2 (num_k_splits = 2): one wave only, BLOCK_M
# 64 or 128, BLOCK_N <= 32 among the cost model's candidates (wider only as
# the two twins below), an even number of K blocks; C_SPLIT cycles per
# tile for the DSMEM exchange of the FP32 partial tile (module docstring).
SPLIT_K_ENABLED = True
SPLIT_K_SIZES = (1, 2, 4)
SPLIT_K_BLOCK_MS = (64, 128)
C_SPLIT = 1500.0
SPLIT_K_MAX_BLOCK_N = 32
# Split K across a cluster of 4 (num_k_splits = 4; the kernel's partial tiles
# meet as a tree, (p0 + p1) + (p2 + p3)): select_config's twin rule
# (_split_k4_twin).  A normal-GEMM pick of one wave whose tile is at most
# SPLIT_K4_MAX_PICK_BLOCK_N wide (the narrow-N weights, where two-way split
# K runs few CTAs or 8-16-column tiles) gives way to the narrowest tile
# (BLOCK_M 64 on one math warpgroup up to 64 rows, else 128) whose clusters
# of four all fit at once, if that tile is at most SPLIT_K4_MAX_TWIN_BLOCK_N
# wide (the widest measured), with at least SPLIT_K4_MIN_KB K blocks per CTA
# and m <= SPLIT_K4_MAX_M.  Measured on the H200 (benches/RESULTS.md v0.24,
# sweep_k4c.log, sweep_k4d.log): 576x7168 at M = 1-64 6.5-6.8 us against
# 8.3-8.4 (64x24 w1 k4 on 96 CTAs against 64x16 w1 k2 on 72), M = 128 7.8
# against 9.0, 64x512x7168 6.8 against 8.3, 1024x7168 7.2-7.6 against
# 8.4-8.5, 576x16384 9.9-10.2 against 14.8-15.0, 1536x7168 (64x56 w1 k4) a
# tie to 3 % faster; where the pick is already 32 wide on a full wave
# (2112x7168, 4096x7168) four-way tiles of 64-176 columns were 12-41 %
# slower.  Of the six issue-18 weight shapes none changes (at 132 SMs or a
# smaller budget: their twins would be wider than 56); 576x7168 (the
# seventh pair of cugemm8._shapes.DEEPSEEK_NK) does.
SPLIT_K4_MAX_PICK_BLOCK_N = 24
SPLIT_K4_MAX_TWIN_BLOCK_N = 56
SPLIT_K4_MIN_KB = 8
SPLIT_K4_MAX_M = 128
# Split K at 64 < M <= 128: a 128 x BLOCK_N pair-split pick (two math
# warpgroups, one m-block) runs as its one-warpgroup twin 64 x 2*BLOCK_N w1
# k2 on the same number of CTAs (two m-blocks, half the n-blocks: each CTA
# reads half of A's rows and twice B's columns, and its K loop is the
# pipelined one-warpgroup form, with the skewed split of split_k_skew).
# Measured on the H200 (benches/RESULTS.md v0.30, skew64b.log): at
# 128x2112x7168 128x32 s9 k2 10.59 µs, 64x64 s12 w1 k2 10.14 without the
# skew and 9.92 with it.  Only where the twin's BLOCK_N keeps the pipelined
# K loop (<= 96) and each rank keeps SPLIT_K_TWIN_MIN_KB K blocks, i.e.
# ceil(k / 128) >= 32 (the measured shape has 28 a rank); the cost model does not rank it there (its split
# candidates stop at SPLIT_K_MAX_BLOCK_N = 32, and widening that to 64
# moved 301 of 2016 picks, unmeasured: benches/experiments/v0.30/pick_diff.log).
SPLIT_K_TWIN_MAX_BLOCK_N = 96
SPLIT_K_TWIN_MIN_KB = 16
# The other way at 64 < M <= 128: an unsplit one-wave 64 x 64 one-warpgroup
# pick (two m-blocks, each CTA reading all of K for its 64 rows and 64
# columns) runs as the 128 x 64 pair split over the same number of CTAs
# (one m-block; each CTA reads half of K for all 128 rows: the same A bytes
# a CTA, half the B bytes, plus the pair's exchange of the partial tile,
# with split_k_skew's skewed split).  Measured on the H200 (64x64 w1
# against 128x64 s7 k2 on the same CTAs, the benches' dirty flush;
# benches/RESULTS.md v0.31, m128_twin.log, and at 128x4096x7168 also v0.30
# m128.log, v0.31 ksplit.log, addr1.log, addr2.log): 128x4096x7168 1.2-2.0 %
# faster in five runs (14.02 -> 13.74 µs in the last; the fastest config
# of v0.11's sweeps there too, 13.79 against 14.27 µs,
# benches/experiments/sweep_v0.11_grouped.json), 120x4224x7168 1.7 %,
# 128x4224x8192 2.6 %, 128x4096x8192 3.9 %; but 120x4096x4096 11 % slower
# (9.12 -> 10.14 µs: 16 K blocks a rank do not pay for the exchange).  So
# only where each rank keeps SPLIT_K_M128_TWIN_MIN_KB K blocks (the
# smallest measured win, K = 7168), and only for the measured width
# SPLIT_K_M128_TWIN_BLOCK_N: narrower picks save fewer B bytes a CTA
# against the same exchange, and wider 128-row tiles split K were 6-8 %
# slower at 128x4096x7168 in the v0.5 sweep (128x72 / 128x80 k2,
# benches/experiments/sweep_v0.5_splitk.json).  Where the model picks 64 x
# 64 w1 that is, on 132 SMs, M = 118-128, N = 3648-4224 (114-132 CTAs) and
# ceil(K / 128) = 56-80 (above, 64 x 64 on two warpgroups wins the model),
# and a little wider N on smaller SM budgets; measured at N = 4096-4224,
# K = 7168-8192 only.  Of the decode table's 48 shapes it moves
# 128x4096x7168 (benches/experiments/v0.31/pick_diff.log: 12 of 8976 picks
# on that grid).
SPLIT_K_M128_TWIN_BLOCK_N = 64
SPLIT_K_M128_TWIN_MIN_KB = 28
# Clusters of four CTAs (one per SM: these kernels' shared memory) that are
# resident at once: a cluster lives inside one GPC, so the GPCs' SM counts,
# not the SM total, bound them.  cuOccupancyMaxActiveClusters on the H200
# (132 SMs): 30 clusters of 4 (120 CTAs) against 66 of 2; a 33-cluster grid
# ran its last cluster as a second wave (64x64 w1 k4 at 16x2112x7168:
# 15.4 us against 10.0 for 64x72 w1 k4 on 30 clusters).  The same fraction
# is assumed for an SM budget below the device's (cugemm8.set_num_sms).
SPLIT_K4_CLUSTERS_PER_132_SMS = 30
# One math warpgroup at BLOCK_M = 64 (num_math_warpgroups = 1): its chain
# is multiplied by ONE_WG_CHAIN, and the two-warpgroup split pays
# C_WG_REDUCE cycles per tile for its reduction through shared memory and
# its two named barriers.  Fitted to the v0.11 decode sweep
# (tools/perf/wg_sweep.py, 48 shapes x 9-20 candidates; benches/RESULTS.md
# v0.11): any C_WG_REDUCE in [1500, 3000] with ONE_WG_CHAIN = 0.95 gives the
# same picks, 1.012x the fastest measured candidate in geomean (1.038x
# before), and 0.9 / 1.0 are worse (1.016x / 1.014-1.017x).
ONE_WARPGROUP_ENABLED = True
ONE_WG_CHAIN = 0.95
C_WG_REDUCE = 2000.0
OVERLAP_P = 4                       # soft max of compute and feed (imperfect overlap)
MULTICAST_MIN_ROWS = 512
# One-warpgroup normal tiles with at most this many K blocks per CTA get
# that many stages (_short_k_stages).
SHORT_K_BLOCKS = 4
# The swap-AB decode kernel (GemmConfig.swap_ab, cuda_src/fp8_gemm_swap_ab.cuh):
# token tiles (the WGMMA's N), weight tiles (64-row waves), cluster split K.
SWAP_AB_BLOCK_MS = (8, 16, 24, 32)
SWAP_AB_BLOCK_NS = (64, 128, 192, 256)
SWAP_AB_SPLITS = (1, 2, 4)
SWAP_AB_MAX_STAGES = 24
# select_config's swap-AB rule (_swap_ab_twin): a pick of one math warpgroup,
# 64 x SWAP_AB_TWIN_BLOCK_N, unsplit, in one wave, at m <= SWAP_AB_TWIN_MAX_M
# gives way to the swap-AB kernel's 8 x (2 * SWAP_AB_TWIN_BLOCK_N) tile with
# K split over a CTA pair (the same CTAs, the same bytes per CTA, half the
# WGMMAs, each m64n8k32 instead of m64n32k32) when each CTA still has at
# least SWAP_AB_TWIN_MIN_KB K blocks.  Measured on the H200 at 4096x7168
# (benches/RESULTS.md v0.16 and v0.17): 15-17 % faster at M <= 8 after a
# clean L2, 0.3-2 % slower after the benches' dirty flush; at M = 16-32 it
# loses 3-8 % after the dirty flush, and the other DeepSeek-V3 (N, K) pairs
# either do not have that pick or were measured no faster, so only this
# family of picks is switched.  The rule keys on the pick, not on the
# shape: other N that give a one-wave 64x32 pick (about 3500-4224) with K of
# 4096 or more take the twin too, by the same mechanism but unmeasured.
SWAP_AB_TWIN_MAX_M = 8
SWAP_AB_TWIN_BLOCK_N = 32
SWAP_AB_TWIN_MIN_KB = 16
# The warp-MMA decode kernel (GemmConfig.warp_mma, cuda_src/fp8_gemm_warp_mma.cuh):
# every warp streams its share of B into registers with 16-byte loads and
# multiplies it with m16n8k32 MMAs; no TMA ring, no producer.  select_config
# picks it for a normal GEMM with 1 <= m <= WARP_MMA_MAX_M whose B holds at
# most WARP_MMA_MAX_B_BYTES (n * k) bytes, on the whole device (a reduced SM
# budget keeps the persistent kernels: this grid is not persistent).
# Measured on the H200 (benches/RESULTS.md v0.19, tools/perf/warp_mma_probe.py,
# the benches' dirty flush): 1.04-1.13x the previous pick at M = 1 and
# 1.00-1.11x at M = 8 on the five DeepSeek-V3 (N, K) with B <= 38 MB;
# 7168x16384 (117 MB, more than the registers of the grid hold in flight)
# 2-4 % slower, so it keeps its TMA pick.
WARP_MMA_MAX_M = 8
WARP_MMA_MAX_B_BYTES = 48 << 20
# The only measured-best form: one 16-row slab per warp, one token tile of 8,
# two K blocks loaded ahead per warp (the probe's 270 variants: 32-row slabs,
# 4 or 8 blocks ahead and a two-batch software pipeline were never faster).
WARP_MMA_ROW_TILES = 1
WARP_MMA_UNROLL = 2
# Warps splitting one slab's K blocks, CTA sizes, and the most registers a
# thread of the unroll-2 form takes (ptxas: 92-98 over the picks and the
# tests' forced forms; CI checks every instantiation against it), which
# bound the CTAs an SM holds.
WARP_MMA_K_SPLITS = (1, 2, 4, 7, 8, 14, 16)
WARP_MMA_MIN_THREADS = 128
WARP_MMA_MAX_THREADS = 512
WARP_MMA_REGISTERS = 104
# The form that quantises 16-bit activations itself (gemm_fp8's one-kernel
# bf16-in path, the kernel's kAIn): its launch bounds cap a thread at this
# many registers (cuda_src/fp8_gemm_warp_mma.cuh kWarpMmaQuantARegisters;
# ptxas takes all of them, no spills: CI checks), which places its CTAs.
# float32 activations have no such form (their raw pieces would spill).
WARP_MMA_QUANT_A_REGISTERS = 128
# Its tokens are quantised before the main loop (one slab per CTA: each
# warp its own K blocks' groups; several slabs: the CTA's warps share them),
# 2 groups of 128 elements per warp step, WARP_MMA_QUANT_A_STEPS steps per
# round (fp8_gemm_warp_mma.cuh kWarpMmaQuantSteps).  gemm_fp8 takes this
# form up to the rows that give a warp at most
# warp_mma_one_kernel_max_groups groups: with one slab per CTA
# WARP_MMA_ONE_KERNEL_MAX_GROUPS, fewer than one full round, measured on the H200
# (benches/bench_e2e.py --one-kernel-rows 8, benches/RESULTS.md v0.20 and
# v0.21) against the quantiser + GEMM pair, with the float32 quotient
# (v0.21): 1.02-1.10x at up to 7 groups a warp (32768x512 M <= 6,
# 24576x1536 M <= 2, the three K = 7168 / 2048 pairs at M = 1), 0.94-1.02x
# at a full round of 8 (2112x7168 and 7168x2048 at M = 2, 32768x512 at
# M = 8) and 0.55-0.97x beyond.  Every CTA quantises all the tokens it
# reads (the whole of x for a one-slab grid), so the form's cost grows with
# M x K per CTA, not per grid; 8 steps a round (one round up to 16 groups)
# and x prefetched into L2 for later rounds were measured and lost.  The
# form whose CTA's warps share the groups (several slabs per CTA) takes a
# full round of 8: 32768x512 at M = 7-8 ran 1.04-1.07x the two kernels in
# two runs of v0.22 (benches/RESULTS.md v0.22), where the one-slab form's
# full rounds were 0.98-1.02x (2112x7168 at M = 2 faster, 7168x2048 slower).
WARP_MMA_QUANT_A_STEPS = 4
WARP_MMA_ONE_KERNEL_MAX_GROUPS = 7
WARP_MMA_ONE_KERNEL_MAX_GROUPS_SHARED = 8


def warp_mma_one_kernel_max_groups(config: "GemmConfig") -> int:
    """The most 1x128 groups the busiest warp of warp-MMA ``config``'s form
    that quantises x may take for gemm_fp8 to run it (one kernel) rather
    than the quantiser and the GEMM: :data:`WARP_MMA_ONE_KERNEL_MAX_GROUPS`
    with one slab per CTA (each warp its own K blocks),
    :data:`WARP_MMA_ONE_KERNEL_MAX_GROUPS_SHARED` with several (the CTA's
    warps share the groups); measured, see above."""
    return WARP_MMA_ONE_KERNEL_MAX_GROUPS if config.block_n == 16 else WARP_MMA_ONE_KERNEL_MAX_GROUPS_SHARED


def warp_mma_quant_groups_per_warp(config: "GemmConfig", m: int, k: int) -> int:
    """1x128 groups the busiest warp of warp-MMA ``config``'s form that
    quantises x itself quantises for ``m`` tokens and K = ``k``, as the
    kernel hands them out: with one slab per CTA a warp takes its own K
    blocks' groups (the first warps of an uneven split one block more);
    with several slabs the CTA's W warps take its G = m * K-blocks groups
    two at a time in turn, so warp 0 gets 2 floor(G / 2W) + min(2, G mod 2W)."""
    kb = _ceil_div(k, BLOCK_K)
    if config.block_n == 16:                      # one slab: each warp its own K blocks
        return m * _ceil_div(kb, config.num_k_splits)
    groups, pair = m * kb, 2 * (warp_mma_threads(config.block_n, config.num_k_splits) // 32)
    return 2 * (groups // pair) + min(2, groups % pair)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _align(x: int, a: int) -> int:
    return _ceil_div(x, a) * a


# ---------------------------------------------------------------------------
# Derived quantities
# ---------------------------------------------------------------------------

def smem_size(block_m: int, block_n: int, num_stages: int, k: int, num_k_splits: int = 1,
              num_math_warpgroups: int = 2, quant_a: int = 0) -> int:
    """Dynamic shared memory (bytes) of the kernel; the kernel static-asserts
    the same formula::

        align(BM*BN*2, 1024)                        D staging (BF16)
      + (64*BN*4 if BM == 64 and 2 warpgroups)      the warpgroups' split-K reduction (FP32)
      + (align(BM*BN*4 + 16, 1024) if split)        cluster split-K partial tile (FP32) + 2 barriers
      + stages * (A + BN*128 + align(BM*4, 128) + X)  A, B, A scales, x
      + align(32 * R * ceil(K/128), 16)             B scales: 8 warps x R rows x whole K
      + (384 if quant_a else 256)                   barriers and misc

    with R = max(2, :func:`sfb_tile_rows` (BN)), A = BM*128 (FP8, BLOCK_K
    wide) and X = 0; or, when the kernel
    quantises float activations itself (``quant_a``: their element size in
    bytes; gemm_fp8's one-kernel form, :func:`quant_a_config`), A = 8*128
    (the payload's 8 rows) and X = 8*128*quant_a (the same rows of x), and
    a third barrier per stage.
    """
    a_bytes = QUANT_A_MAX_ROWS * BLOCK_K if quant_a else block_m * BLOCK_K
    x_bytes = QUANT_A_MAX_ROWS * BLOCK_K * quant_a
    return (_align(block_m * block_n * 2, 1024)
            + (64 * block_n * 4 if block_m == 64 and num_math_warpgroups == 2 else 0)
            + (_align(block_m * block_n * 4 + 16, 1024) if num_k_splits > 1 else 0)
            + num_stages * (a_bytes + block_n * BLOCK_K + _align(block_m * 4, 128) + x_bytes)
            + _align(32 * max(2, sfb_tile_rows(block_n)) * _ceil_div(k, BLOCK_K), 16)
            + (384 if quant_a else 256))


#: Rows of float activations the kernel quantises itself (gemm_fp8's
#: one-kernel form): a stage's payload holds 8 rows (fp8_gemm_1d2d.cuh
#: kQuantARows, "Quantising A in the kernel").
QUANT_A_MAX_ROWS = 8


def quant_a_config(config: GemmConfig, k: int, itemsize: int, smem_limit: int = SMEM_LIMIT, *,
                   num_sms: int | None = None) -> GemmConfig | None:
    """The configuration of the kernel that quantises float activations of
    ``itemsize`` bytes (2 or 4) itself (gemm_fp8's one-kernel bf16-in form,
    cuda_src/quant_a.cuh) for the normal GEMM's pick ``config``, or None when
    that pick has no such form: the in-kernel quantisation needs, in the 1D2D
    kernel, ``block_m`` = 64 on one math warpgroup and no multicast (split
    K over two or four CTAs: each quantises its own K blocks), and in
    the swap-AB kernel a token tile (``block_m``) of 8 (the kernels
    static-assert it).  Same tile, grid, split K and warpgroup structure,
    hence the same accumulation order and output bits; the stages are the
    most that fit its stages with their slots for x (:func:`smem_size` or
    :func:`swap_ab_smem_size` with ``quant_a``), at most 16 (1D2D) or
    :data:`SWAP_AB_MAX_STAGES`.

    A warp-MMA pick's twin (cuda_src/fp8_gemm_warp_mma.cuh: each CTA
    quantises its tokens into shared memory before its main loop) is the
    same grid and K split with the tokens' shared memory added
    (:func:`warp_mma_smem_size` with ``k``), for 16-bit activations whose
    CTAs, at :data:`WARP_MMA_QUANT_A_REGISTERS` registers a thread and that
    shared memory, all fit at once on ``num_sms`` SMs (the device's,
    required for such a pick), as the pick's own do; never for float32
    activations."""
    if config.warp_mma:
        if num_sms is None:
            raise ValueError("quant_a_config of a warp-MMA config needs num_sms (the device's SMs)")
        smem = warp_mma_smem_size(config.block_m, config.block_n, config.num_k_splits, k)
        threads = warp_mma_threads(config.block_n, config.num_k_splits)
        per_sm = warp_mma_ctas_per_sm(threads, WARP_MMA_QUANT_A_REGISTERS, smem)
        if itemsize != 2 or smem > smem_limit or config.num_sms > per_sm * num_sms:
            return None
        return dataclasses.replace(config, smem_bytes=smem)
    if config.kind == "normal" and config.swap_ab and config.block_m == QUANT_A_MAX_ROWS:
        stages = swap_ab_max_stages(config.block_m, config.block_n, k, smem_limit,
                                    num_k_splits=config.num_k_splits, quant_a=itemsize)
        if not stages:
            return None
        return dataclasses.replace(config, num_stages=stages, smem_bytes=swap_ab_smem_size(
            config.block_m, config.block_n, stages, k, config.num_k_splits, quant_a=itemsize))
    if (config.kind != "normal" or config.swap_ab or config.block_m != 64
            or config.num_math_warpgroups != 1 or config.num_multicast != 1):
        return None
    stages = MAX_STAGES
    while stages >= _min_stages(64, config.block_n, config.num_k_splits):
        size = smem_size(64, config.block_n, stages, k, config.num_k_splits, 1, quant_a=itemsize)
        if size <= smem_limit:
            return dataclasses.replace(config, num_stages=stages, smem_bytes=size)
        stages -= 1
    return None


def swap_ab_smem_size(block_m: int, block_n: int, num_stages: int, k: int, num_k_splits: int = 1,
                      quant_a: int = 0) -> int:
    """Dynamic shared memory of the swap-AB kernel (``SwapABSmem::kTotal`` in
    cuda_src/fp8_gemm_swap_ab.cuh): per stage the weights' ``block_n`` x 128
    and the tokens' ``block_m`` x 128 bytes and the tokens' scales (128-byte
    aligned), and with ``quant_a`` (the element size of float activations
    the kernel quantises itself, cuda_src/quant_a.cuh) a slot for the token
    tile's rows of x (``block_m`` x 128 x ``quant_a`` bytes); each math
    warp's copy of the tile's B scales for all of K; rank 0's slots for the
    other ranks' FP32 partial tiles; the barriers (full and empty per stage,
    two for the exchange, with ``quant_a`` an x_full per stage)."""
    kb = _ceil_div(k, BLOCK_K)
    sfb_rows = block_n // 128 + (1 if block_n % 128 else 0)
    per_stage = block_n * BLOCK_K + block_m * BLOCK_K + _align(block_m * 4, 128) + block_m * BLOCK_K * quant_a
    red = (num_k_splits - 1) * (block_n // 64) * (block_m // 2) * 128 * 4
    return (num_stages * per_stage + _align(4 * sfb_rows * kb * 4, 16) + red
            + ((3 if quant_a else 2) * num_stages + 2) * 8)


def swap_ab_max_stages(block_m: int, block_n: int, k: int, smem_limit: int = SMEM_LIMIT,
                       num_k_splits: int = 1, quant_a: int = 0) -> int:
    """Largest stage count (at most :data:`SWAP_AB_MAX_STAGES`) of the swap-AB
    kernel (with ``quant_a``: its one-kernel bf16-in form) that fits
    ``smem_limit``, or 0 when fewer than the minimum do."""
    fixed = swap_ab_smem_size(block_m, block_n, 0, k, num_k_splits, quant_a)
    per_stage = swap_ab_smem_size(block_m, block_n, 1, k, num_k_splits, quant_a) - fixed
    stages = min(SWAP_AB_MAX_STAGES, max(0, smem_limit - fixed) // per_stage)
    return stages if stages >= MIN_STAGES else 0


def max_k(smem_limit: int = SMEM_LIMIT) -> int:
    """The largest K (a multiple of 128) any configuration fits: the per-warp
    B-scale copies grow with K (382,464 at the sm_90 limit)."""
    fixed = smem_size(64, 8, _min_stages(64, 8), 0)
    return max(0, (smem_limit - fixed) // 64) * BLOCK_K


def _min_stages(block_m: int, block_n: int, num_k_splits: int = 1) -> int:
    # Split K over four: one wave of CTAs that each run a quarter of K,
    # where the fourth stage is what the FP32 exchange buffer displaces
    # (128x128: 3 stages fit beside its 64 KB).
    return MIN_STAGES if block_m * block_n >= 128 * 192 or num_k_splits == 4 else MIN_STAGES + 1


def max_stages(block_m: int, block_n: int, k: int, smem_limit: int = SMEM_LIMIT,
               num_k_splits: int = 1, num_math_warpgroups: int = 2) -> int:
    """Largest stage count (capped at 16) whose :func:`smem_size` fits, even
    for ``block_m`` = 64 with two math warpgroups (:func:`_stages_ok`), or 0
    when fewer than the minimum (3, or 4 for tiles under 128x192) fit."""
    fixed = smem_size(block_m, block_n, 0, k, num_k_splits, num_math_warpgroups)
    per_stage = smem_size(block_m, block_n, 1, k, num_k_splits, num_math_warpgroups) - fixed
    stages = min(MAX_STAGES, max(0, smem_limit - fixed) // per_stage)
    while stages and not _stages_ok(block_m, stages, num_math_warpgroups):
        stages -= 1
    return stages if stages >= _min_stages(block_m, block_n, num_k_splits) else 0


def _stages_ok(block_m: int, num_stages: int, num_math_warpgroups: int = 2) -> bool:
    """With ``block_m`` = 64 two math warpgroups split K (even / odd K
    blocks) and each waits only on its own blocks' full barriers, by phase
    parity.  K block j uses stage j mod S: with S odd a stage alternates
    between the warpgroups lap by lap, and a warpgroup waiting for block j
    cannot tell "block j landed" from "block j - S (the other warpgroup's)
    has not landed yet" (same parity, two phases apart).  TMA loads land out
    of order, so it then read a stale stage and released it early: the
    intermittent launch failures (and, in principle, wrong values) of the
    v0.3 / v0.4 64x160 s5 kernel (benches/RESULTS.md, v0.4).  With S even
    each stage belongs to one warpgroup for the whole tile, which waits on
    every one of its phases in order.  (The owner can still change from one
    tile to the next when a tile has an odd number of K blocks, since the
    block index restarts; the split-K reduction's two barriers at each
    tile's end make that safe: every block of a tile has landed before
    either warpgroup waits on the next tile's.)  The kernel static-asserts
    the same rule.  One math warpgroup (``block_m`` = 64 only) waits on
    every stage itself, in order: any count."""
    return block_m != 64 or num_math_warpgroups == 1 or num_stages % 2 == 0


def num_math_warpgroups(block_m: int) -> int:
    """The default math warpgroup count: 2 (with BLOCK_M = 64 the two split
    K, even / odd blocks).  :func:`math_warpgroup_options` lists the legal
    counts."""
    return 2


_default_math_warpgroups = num_math_warpgroups


def math_warpgroup_options(block_m: int) -> tuple[int, ...]:
    """Legal math warpgroup counts for ``block_m``: (2, 1) for 64 (one
    warpgroup runs the whole K, with no reduction at the tile's end and its
    buffer's shared memory free for stages), (2,) otherwise (each warpgroup
    owns 64-row sub-tiles)."""
    return (2, 1) if block_m == 64 else (2,)


def _waves_per_warpgroup(block_m: int) -> int:
    return max(1, block_m // (64 * num_math_warpgroups(block_m)))


def swizzle_d_bytes(block_n: int) -> int:
    """Swizzle of the D staging buffer: largest of 128/64/32 B dividing a BF16
    row of the tile (``block_n * 2`` bytes), else 0."""
    for s in (128, 64, 32):
        if (block_n * 2) % s == 0:
            return s
    return 0


def _runtime_boundary(block_n: int) -> bool:
    """Whether the kernel selects the B-scale row per 8-column chunk at run
    time: the tile straddles a 128-row block of B scales and the boundary
    takes more than MAX_BOUNDARY_VARIANTS values (128 / gcd(block_n, 128)),
    too many to instantiate the K loop once per value."""
    return 128 % block_n != 0 and 128 // math.gcd(block_n, 128) > MAX_BOUNDARY_VARIANTS


def sfb_tile_rows(block_n: int) -> int:
    """128-row blocks of B scales one ``block_n``-wide tile can touch (the
    kernel's ``sfb_tile_rows``): 1 when ``block_n`` divides 128, else those
    under the worst start, ``128 - gcd(block_n, 128)`` columns into a block
    (2 for 112, 144, 160, 192; 3 for 176)."""
    if 128 % block_n == 0:
        return 1
    return _ceil_div(128 - math.gcd(block_n, 128) + block_n, 128)


def _straddle_ok(block_n: int) -> bool:
    rows = sfb_tile_rows(block_n)
    return rows <= 2 or (rows == 3 and not _runtime_boundary(block_n))


def _registers_ok(block_m: int, block_n: int) -> bool:
    return (_waves_per_warpgroup(block_m) + 1) * block_n // 2 <= REGISTER_LIMIT


def candidate_block_ms(kind: str) -> tuple[int, ...]:
    """BLOCK_M candidates: (64, 128, 256) for every kind (``contiguous``
    with 256 runs a second pass over the tiles that straddle two experts: a
    full row of tiles per expert boundary at an odd multiple of 128 rows,
    which the cost model charges)."""
    _check_kind(kind)
    return BLOCK_M_CANDIDATES


def candidate_block_ns(block_m: int | None = None) -> tuple[int, ...]:
    """BLOCK_N candidates: every multiple of 8 in [8, 128], then 144, 160, 176
    and 192 (multiples of 16 passing the B-scale straddle rule), restricted by the
    register rule when ``block_m`` is given (``block_m`` = 256: up to 128)."""
    if block_m is None:
        return BLOCK_N_CANDIDATES
    if block_m not in BLOCK_M_CANDIDATES:
        raise ValueError(f"block_m must be one of {BLOCK_M_CANDIDATES}, got {block_m!r}")
    return tuple(bn for bn in BLOCK_N_CANDIDATES if _registers_ok(block_m, bn))


# ---------------------------------------------------------------------------
# The configuration
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """One kernel configuration: what :func:`cugemm8.get_gemm_config` returns
    and the ops launch (frozen, hashable; see the module docstring of
    ``cugemm8._config`` for the rules and the cost model).  ``str(config)``
    reads e.g. ``128x192 s5 c2A sms132``.

    Attributes:
        kind: ``'normal'``, ``'contiguous'`` or ``'masked'``: the op.
        block_m: rows of one output tile (BLOCK_M): 64, 128 or 256.
        block_n: columns of one output tile (BLOCK_N): a multiple of 8 in
            [8, 192]; the heuristic picks from 8, 16, ..., 128, 144, 160, 176, 192.
        block_k: K extent of one pipeline stage, always 128 (one scale
            granule and one promotion interval).
        num_stages: depth of the TMA pipeline (shared-memory stages), 3 to 16.
        num_math_warpgroups: 2, or 1 with ``block_m`` = 64.  With
            ``block_m`` = 64 two warpgroups split K (even / odd 128-K blocks)
            and add their tiles at the end; one runs the whole K alone
            (``str``: ``w1``).
        num_multicast: 1, or 2 for a cluster of two CTAs that share one
            operand's TMA loads (multicast).
        multicast_on_a: with ``num_multicast`` = 2: True when A is shared
            (the pair computes tiles side by side in N), False when B is
            (``'normal'``, and ``'contiguous'`` with ``block_m`` = 128: there
            the pair's two 128-row blocks share B only when they have one
            expert).  False without multicast.
        num_k_splits: 1, or 2 (4) when the two (four, ``'normal'`` only)
            CTAs of a cluster take a half (quarter) of the K blocks of the
            same tile each and add their FP32 partial tiles, four as a tree
            ``(p0 + p1) + (p2 + p3)`` (never with multicast; ``str``: ``k2``,
            ``k4``).
        num_sms: the grid: persistent CTAs launched, never more than the SMs
            available (even with multicast or split K).
        swizzle_d: swizzle of the BF16 output staging buffer in bytes (128,
            64, 32, or 0 for none).
        smem_bytes: dynamic shared memory per CTA for this ``k``
            (:func:`cugemm8._config.smem_size`, or
            :func:`cugemm8._config.swap_ab_smem_size` with ``swap_ab``).
        swap_ab: the swap-AB decode kernel (cuda_src/fp8_gemm_swap_ab.cuh,
            ``'normal'`` only): the weights are the WGMMA's 64-row operand
            and the tokens its N, so ``block_m`` is the token tile (8, 16,
            24 or 32), ``block_n`` the weight rows per tile (64, 128, 192 or
            256), one math warpgroup, no multicast, ``num_k_splits`` 1, 2 or
            4 (a cluster of that many CTAs splits K), ``swizzle_d`` 0
            (``str``: ``8x64 s16 swapAB k2 sms128``).
        warp_mma: the warp-MMA decode kernel (cuda_src/fp8_gemm_warp_mma.cuh,
            ``'normal'`` only, ``m`` <= 8): no TMA and no shared-memory
            ring; ``block_m`` is the token tile (8), ``block_n`` the weight
            rows per CTA (16-row slabs, one per group of warps),
            ``num_k_splits`` the warps that split one slab's K blocks (1 ...
            16, partials added in shared memory), ``num_stages`` the K
            blocks each warp loads ahead (2), ``num_sms`` the number of
            CTAs (not persistent: it may exceed the SM count), no
            multicast, no D swizzle (``str``: ``8x16 u2 warpMMA k14
            ctas132``).
    """
    kind: str                 # 'normal' | 'contiguous' | 'masked'
    block_m: int
    block_n: int
    block_k: int              # always 128
    num_stages: int
    num_math_warpgroups: int  # 2, or 1 with block_m == 64 (2 with block_m == 64: split K)
    num_multicast: int        # 1 or 2 (cluster size along x)
    multicast_on_a: bool      # with num_multicast == 2: A shared (else B)
    num_k_splits: int         # 1, 2 or 4: K split across a cluster of that size (then num_multicast == 1)
    num_sms: int              # grid size (persistent CTAs) to launch
    swizzle_d: int            # D staging swizzle in bytes: 128, 64, 32 or 0
    smem_bytes: int           # smem_size(block_m, block_n, num_stages, k, num_k_splits)
    swap_ab: bool = False     # the swap-AB decode kernel (block_m: tokens, block_n: weight rows)
    warp_mma: bool = False    # the warp-MMA decode kernel (block_m: tokens, block_n: weight rows per CTA)

    def __str__(self) -> str:
        if self.warp_mma:
            return (f"{self.block_m}x{self.block_n} u{self.num_stages} warpMMA k{self.num_k_splits} "
                    f"ctas{self.num_sms}")
        if self.swap_ab:
            ks = f" k{self.num_k_splits}" if self.num_k_splits > 1 else ""
            return f"{self.block_m}x{self.block_n} s{self.num_stages} swapAB{ks} sms{self.num_sms}"
        mc = ""
        if self.num_multicast == 2:
            mc = " c2A" if self.multicast_on_a else " c2B"
        if self.num_k_splits > 1:
            mc = f" k{self.num_k_splits}"
        wg = " w1" if self.num_math_warpgroups == 1 else ""
        return f"{self.block_m}x{self.block_n} s{self.num_stages}{wg}{mc} sms{self.num_sms}"


def make_config(kind: str, block_m: int, block_n: int, num_stages: int, k: int, *,
                num_multicast: int = 1, multicast_on_a: bool = False,
                num_k_splits: int = 1, num_sms: int = 1,
                num_math_warpgroups: int | None = None, swap_ab: bool = False,
                warp_mma: bool = False) -> GemmConfig:
    """Build a :class:`GemmConfig` with its derived fields (swizzle, shared
    memory for ``k``; the warpgroup count when ``num_math_warpgroups`` is
    None: the default, 2, or 1 with ``swap_ab`` or ``warp_mma``) filled in.  Does not check
    legality: call :func:`is_legal` on the result."""
    if warp_mma or swap_ab:
        # The decode kernels: the given multicast / warpgroup fields are kept
        # (is_legal rejects any but one warpgroup and no multicast), not
        # silently replaced; no D staging, so no swizzle.
        smem = (warp_mma_smem_size(block_m, block_n, num_k_splits) if warp_mma
                else swap_ab_smem_size(block_m, block_n, num_stages, k, num_k_splits))
        return GemmConfig(kind=kind, block_m=block_m, block_n=block_n, block_k=BLOCK_K,
                          num_stages=num_stages,
                          num_math_warpgroups=1 if num_math_warpgroups is None else num_math_warpgroups,
                          num_multicast=num_multicast, multicast_on_a=multicast_on_a,
                          num_k_splits=num_k_splits, num_sms=num_sms, swizzle_d=0, smem_bytes=smem,
                          swap_ab=swap_ab, warp_mma=warp_mma)
    wgs = _default_math_warpgroups(block_m) if num_math_warpgroups is None else num_math_warpgroups
    return GemmConfig(kind=kind, block_m=block_m, block_n=block_n, block_k=BLOCK_K,
                      num_stages=num_stages,
                      num_math_warpgroups=wgs,
                      num_multicast=num_multicast,
                      multicast_on_a=bool(multicast_on_a) and num_multicast == 2,
                      num_k_splits=num_k_splits,
                      num_sms=num_sms, swizzle_d=swizzle_d_bytes(block_n),
                      smem_bytes=smem_size(block_m, block_n, num_stages, k, num_k_splits, wgs))


def is_legal(config: GemmConfig | None = None, *, k: int | None = None,
             available_sms: int | None = None, smem_limit: int = SMEM_LIMIT,
             **fields) -> tuple[bool, str]:
    """Check every hard constraint of the kernel on ``config`` (or on a config
    built from keyword ``fields`` by :func:`make_config`, which then needs
    ``k``; a ``num_sms`` field is the grid).  With ``k``, ``smem_bytes`` must
    equal :func:`smem_size`; with ``available_sms``, the grid must not exceed
    it.

    Returns ``(True, "ok")`` or ``(False, reason)``.
    """
    if config is None:
        if k is None:
            return False, "k is needed to build a config from fields"
        try:
            config = make_config(k=k, **fields)
        except TypeError as exc:
            return False, f"bad fields: {exc}"
    c = config
    bm, bn = c.block_m, c.block_n
    ints = ("block_m", "block_n", "block_k", "num_stages", "num_math_warpgroups",
            "num_multicast", "num_k_splits", "num_sms", "swizzle_d", "smem_bytes")
    for name in ints:
        v = getattr(c, name)
        if not isinstance(v, int) or isinstance(v, bool):
            return False, f"{name} must be an int, got {v!r}"
    if c.kind not in KINDS:
        return False, f"kind must be one of {KINDS}, got {c.kind!r}"
    if c.block_k != BLOCK_K:
        return False, f"block_k must be {BLOCK_K}, got {c.block_k}"
    if not isinstance(c.swap_ab, bool):
        return False, f"swap_ab must be a bool, got {c.swap_ab!r}"
    if not isinstance(c.warp_mma, bool):
        return False, f"warp_mma must be a bool, got {c.warp_mma!r}"
    if c.warp_mma and c.swap_ab:
        return False, "warp_mma and swap_ab are two different kernels"
    if c.warp_mma:
        return _warp_mma_legal(c, k, smem_limit)
    if c.swap_ab:
        return _swap_ab_legal(c, k, available_sms, smem_limit)
    if bm not in BLOCK_M_CANDIDATES:
        return False, f"block_m must be one of {BLOCK_M_CANDIDATES}, got {bm}"
    if c.num_math_warpgroups not in math_warpgroup_options(bm):
        return False, (f"num_math_warpgroups must be one of {math_warpgroup_options(bm)} for "
                       f"block_m {bm}, got {c.num_math_warpgroups}")
    if bn % 8 != 0 or not 8 <= bn <= 256:
        return False, f"block_n must be a multiple of 8 in [8, 256], got {bn}"
    if not _straddle_ok(bn):
        return False, (f"block_n {bn} tiles straddle {sfb_tile_rows(bn)} 128-row B-scale blocks (at most 2, "
                       f"or 3 with gcd(block_n, 128) >= 16)")
    if not _registers_ok(bm, bn):
        return False, (f"{bm}x{bn} needs {(_waves_per_warpgroup(bm) + 1) * bn // 2} "
                       f"accumulator registers per thread (> {REGISTER_LIMIT})")
    if not MIN_STAGES <= c.num_stages <= MAX_STAGES:
        return False, f"num_stages must be in [{MIN_STAGES}, {MAX_STAGES}], got {c.num_stages}"
    if c.num_stages < _min_stages(bm, bn, c.num_k_splits):
        return False, f"{bm}x{bn} needs at least {_min_stages(bm, bn, c.num_k_splits)} stages, got {c.num_stages}"
    if not _stages_ok(bm, c.num_stages, c.num_math_warpgroups):
        return False, (f"block_m 64 with two math warpgroups (split K) needs an even stage "
                       f"count, got {c.num_stages}: each math warpgroup must own its stages")
    splits = c.num_k_splits
    if splits not in SPLIT_K_SIZES:
        return False, f"num_k_splits must be one of {SPLIT_K_SIZES}, got {splits}"
    if splits > 1 and c.num_multicast != 1:
        return False, f"num_k_splits {splits} (a split-K cluster) excludes multicast"
    if splits == 4 and c.kind != "normal":
        return False, f"num_k_splits 4 is for kind 'normal' only, not {c.kind!r}"
    if splits > 1 and bm not in SPLIT_K_BLOCK_MS:
        return False, f"num_k_splits {splits} needs block_m in {SPLIT_K_BLOCK_MS}, got {bm}"
    if splits > 1 and k is not None and _ceil_div(k, BLOCK_K) % splits:
        return False, (f"num_k_splits {splits} needs a multiple of {splits} 128-wide K blocks, "
                       f"k = {k} has {_ceil_div(k, BLOCK_K)}")
    wgs = c.num_math_warpgroups
    if k is not None and c.smem_bytes != smem_size(bm, bn, c.num_stages, k, c.num_k_splits, wgs):
        return False, (f"smem_bytes {c.smem_bytes} != smem_size(...) = "
                       f"{smem_size(bm, bn, c.num_stages, k, c.num_k_splits, wgs)} for k={k}")
    if k is None and c.smem_bytes < smem_size(bm, bn, c.num_stages, 1, c.num_k_splits, wgs):
        return False, f"smem_bytes {c.smem_bytes} below the formula's minimum"
    if c.smem_bytes > smem_limit:
        return False, f"smem_bytes {c.smem_bytes} > limit {smem_limit}"
    if c.swizzle_d != swizzle_d_bytes(bn):
        return False, f"swizzle_d must be {swizzle_d_bytes(bn)} for block_n {bn}, got {c.swizzle_d}"
    if c.num_multicast not in (1, 2):
        return False, f"num_multicast must be 1 or 2, got {c.num_multicast}"
    if not isinstance(c.multicast_on_a, bool):
        return False, f"multicast_on_a must be a bool, got {c.multicast_on_a!r}"
    if c.num_multicast == 1 and c.multicast_on_a:
        return False, "multicast_on_a must be False without multicast"
    if c.num_multicast == 2 and not c.multicast_on_a and c.kind not in ("normal", "contiguous"):
        return False, f"multicast on B is only legal for kinds 'normal' and 'contiguous', not {c.kind!r}"
    if c.num_multicast == 2 and not c.multicast_on_a and c.kind == "contiguous" and bm != 128:
        return False, f"contiguous multicast on B pairs 128-row expert blocks: block_m must be 128, got {bm}"
    if c.num_sms < 1:
        return False, f"num_sms (grid) must be >= 1, got {c.num_sms}"
    if c.num_multicast == 2 and c.num_sms % 2:
        return False, f"grid {c.num_sms} must be even with multicast"
    if splits > 1 and c.num_sms % splits:
        return False, f"grid {c.num_sms} must be a multiple of {splits} with split K (clusters of {splits})"
    if available_sms is not None and c.num_sms > available_sms:
        return False, f"grid {c.num_sms} exceeds the {available_sms} SMs available"
    return True, "ok"


def _swap_ab_legal(c: GemmConfig, k: int | None, available_sms: int | None,
                   smem_limit: int) -> tuple[bool, str]:
    """:func:`is_legal`'s rules for a swap-AB config (fp8_gemm_swap_ab.cuh's static_asserts)."""
    if c.kind != "normal":
        return False, f"swap_ab is for kind 'normal' only, not {c.kind!r}"
    if c.block_m not in SWAP_AB_BLOCK_MS:
        return False, f"swap_ab block_m (the token tile) must be one of {SWAP_AB_BLOCK_MS}, got {c.block_m}"
    if c.block_n not in SWAP_AB_BLOCK_NS:
        return False, f"swap_ab block_n (64-row weight waves) must be one of {SWAP_AB_BLOCK_NS}, got {c.block_n}"
    if c.num_k_splits not in SWAP_AB_SPLITS:
        return False, f"swap_ab num_k_splits must be one of {SWAP_AB_SPLITS}, got {c.num_k_splits}"
    if (c.num_math_warpgroups, c.num_multicast, c.multicast_on_a, c.swizzle_d) != (1, 1, False, 0):
        return False, "swap_ab runs one math warpgroup, no multicast and no D swizzle"
    if not MIN_STAGES <= c.num_stages <= SWAP_AB_MAX_STAGES:
        return False, f"swap_ab num_stages must be in [{MIN_STAGES}, {SWAP_AB_MAX_STAGES}], got {c.num_stages}"
    if k is not None:
        if _ceil_div(k, BLOCK_K) < c.num_k_splits:
            return False, f"k = {k} has fewer 128-wide K blocks than num_k_splits {c.num_k_splits}"
        size = swap_ab_smem_size(c.block_m, c.block_n, c.num_stages, k, c.num_k_splits)
        if c.smem_bytes != size:
            return False, f"smem_bytes {c.smem_bytes} != swap_ab_smem_size(...) = {size} for k={k}"
    if c.smem_bytes > smem_limit:
        return False, f"smem_bytes {c.smem_bytes} > limit {smem_limit}"
    if c.num_sms < c.num_k_splits or c.num_sms % c.num_k_splits:
        return False, f"grid {c.num_sms} must be a positive multiple of the cluster size {c.num_k_splits}"
    if available_sms is not None and c.num_sms > available_sms:
        return False, f"grid {c.num_sms} exceeds the {available_sms} SMs available"
    return True, "ok"


def warp_mma_grid(n: int, block_n: int) -> int:
    """CTAs of a warp-MMA launch: one per ``block_n`` rows of ``n`` (the
    kernel is not persistent)."""
    return _ceil_div(n, block_n)


def warp_mma_threads(block_n: int, num_k_splits: int) -> int:
    """Threads of a warp-MMA CTA: ``num_k_splits`` warps per 16-row slab."""
    return 32 * num_k_splits * (block_n // 16)


def warp_mma_smem_size(block_m: int, block_n: int, num_k_splits: int, k: int | None = None) -> int:
    """Shared memory of a warp-MMA CTA (cuda_src/fp8_gemm_warp_mma.cuh,
    WarpMmaSmem): with ``num_k_splits`` > 1, every warp's FP32 partial
    (16 rows x ``block_m`` tokens) for the cross-warp sum; else none.  With
    ``k`` (the form that quantises x itself, WarpMmaQuantASmem), after it
    the CTA's 8 tokens quantised: per 128-wide K block 8 x 128 payload
    bytes and 8 f32 scales."""
    size = (block_n // 16) * num_k_splits * 16 * block_m * 4 if num_k_splits > 1 else 0
    if k is not None:
        size += _ceil_div(k, BLOCK_K) * (8 * BLOCK_K + 8 * 4)
    return size


def _warp_mma_legal(c: GemmConfig, k: int | None, smem_limit: int) -> tuple[bool, str]:
    """:func:`is_legal`'s rules for a warp-MMA config (fp8_gemm_warp_mma.cuh's static_asserts)."""
    if c.kind != "normal":
        return False, f"warp_mma is for kind 'normal' only, not {c.kind!r}"
    if c.block_m != 8:
        return False, f"warp_mma block_m (the token tile) must be 8, got {c.block_m}"
    slabs = c.block_n // 16
    threads = warp_mma_threads(c.block_n, c.num_k_splits)
    if c.block_n % 16 or not 1 <= slabs <= 32:
        return False, f"warp_mma block_n must be 16 times 1 ... 32 slabs, got {c.block_n}"
    if c.num_k_splits not in WARP_MMA_K_SPLITS:
        return False, f"warp_mma num_k_splits must be one of {WARP_MMA_K_SPLITS}, got {c.num_k_splits}"
    if not WARP_MMA_MIN_THREADS <= threads <= WARP_MMA_MAX_THREADS:
        return False, (f"warp_mma CTAs of {threads} threads (32 * num_k_splits * block_n / 16) are outside "
                       f"[{WARP_MMA_MIN_THREADS}, {WARP_MMA_MAX_THREADS}]")
    if c.num_stages != WARP_MMA_UNROLL:
        return False, f"warp_mma num_stages (K blocks loaded ahead per warp) must be {WARP_MMA_UNROLL}, got {c.num_stages}"
    if (c.num_math_warpgroups, c.num_multicast, c.multicast_on_a, c.swizzle_d) != (1, 1, False, 0):
        return False, "warp_mma has no math warpgroups, multicast or D swizzle fields to set"
    if k is not None and _ceil_div(k, BLOCK_K) < c.num_k_splits:
        return False, f"k = {k} has fewer 128-wide K blocks than num_k_splits {c.num_k_splits}"
    size = warp_mma_smem_size(c.block_m, c.block_n, c.num_k_splits)
    sizes = (size,) if k is None else (size, warp_mma_smem_size(c.block_m, c.block_n, c.num_k_splits, k))
    if c.smem_bytes not in sizes:
        return False, f"smem_bytes {c.smem_bytes} != warp_mma_smem_size(...) = {' or '.join(map(str, sizes))}"
    if c.smem_bytes > smem_limit:
        return False, f"smem_bytes {c.smem_bytes} > limit {smem_limit}"
    if c.num_sms < 1:
        return False, f"num_sms (the CTAs) must be >= 1, got {c.num_sms}"
    return True, "ok"


def warp_mma_ctas_per_sm(threads: int, registers: int = WARP_MMA_REGISTERS, smem_bytes: int = 0) -> int:
    """CTAs of ``threads`` threads and ``smem_bytes`` of shared memory one
    SM holds at ``registers`` registers a thread (64 K registers, 2048
    threads, 32 CTAs, 228 KB of shared memory of which each CTA also
    reserves 1 KB)."""
    return max(0, min(65536 // (threads * registers), 2048 // threads, 32, SMEM_PER_SM // (smem_bytes + 1024)))


def warp_mma_config(m: int, n: int, k: int, num_sms: int) -> GemmConfig | None:
    """The warp-MMA config select_config uses for a normal GEMM (see
    :data:`WARP_MMA_MAX_M`), or None when the shape is outside the rule.

    Among the K splits of :data:`WARP_MMA_K_SPLITS` and 1 ... 32 slabs per
    CTA (128 ... 512 threads) with at least one CTA per SM and all of them
    resident at once (one wave, :func:`warp_mma_ctas_per_sm`): one whose
    splits share the K blocks evenly, then the most warps in the grid
    (bytes in flight), then smaller CTAs, then fewer K splits.  None when
    N has too few 16-row slabs to give every SM a CTA (e.g. 576 x 7168:
    36 slabs), which was not measured.  This
    reproduces the fastest or a within-1.5 % variant of the probe's sweep on
    the five DeepSeek-V3 shapes it serves (benches/RESULTS.md v0.19:
    2112x7168 k14 x 1 slab, 4096x7168 k8 x 1, 7168x2048 k4 x 1, 32768x512
    k1 x 4, 24576x1536 k1 x 4)."""
    if not 1 <= m <= WARP_MMA_MAX_M or n * k > WARP_MMA_MAX_B_BYTES:
        return None
    kb = _ceil_div(k, BLOCK_K)
    slabs_total = _ceil_div(n, 16)
    best = None
    for splits in WARP_MMA_K_SPLITS:
        if splits > kb:
            continue
        for slabs in (1, 2, 4, 8, 16, 32):
            threads = warp_mma_threads(16 * slabs, splits)
            if not WARP_MMA_MIN_THREADS <= threads <= WARP_MMA_MAX_THREADS:
                continue
            ctas = warp_mma_grid(n, 16 * slabs)
            per_sm = warp_mma_ctas_per_sm(threads)
            if per_sm < 1 or not num_sms <= ctas <= per_sm * num_sms:
                continue
            key = (kb % splits != 0, -slabs_total * splits, threads, splits)
            if best is None or key < best[0]:
                best = (key, splits, slabs, ctas)
    if best is None:
        return None
    _, splits, slabs, ctas = best
    cfg = make_config("normal", 8, 16 * slabs, WARP_MMA_UNROLL, k, num_k_splits=splits, num_sms=ctas,
                      warp_mma=True)
    ok, _ = is_legal(cfg, k=k)
    return cfg if ok else None


def tile_counts(config: GemmConfig, m: int, n: int, num_groups: int = 1) -> tuple[int, int, int]:
    """``(tiles, executed_tiles, waves)`` of ``config`` on a problem: real
    output tiles, tiles the CTAs run including phantoms of unpaired clusters
    (with split K each tile counts once per CTA of its cluster:
    ``num_k_splits`` times), and
    ceil(executed / grid).  ``m`` is expected_m for ``masked`` (then
    ``num_groups`` groups) and m_sum for ``contiguous``.  A warp-MMA config
    (not persistent) runs one tile per CTA, all CTAs at once:
    ``(CTAs, CTAs, 1)``, or zeros for ``m`` = 0."""
    if config.warp_mma:
        ctas = warp_mma_grid(n, config.block_n) if m > 0 else 0
        return ctas, ctas, 1 if ctas else 0
    groups = num_groups if config.kind == "masked" else 1
    mb = _ceil_div(max(m, 0), config.block_m)
    nb = _ceil_div(n, config.block_n)
    executed = _executed_tiles(groups, mb, nb, config.num_multicast, config.multicast_on_a)
    executed *= config.num_k_splits
    return groups * mb * nb, executed, _ceil_div(executed, config.num_sms)


def _executed_tiles(groups: int, mb: int, nb: int, mc: int, on_a: bool) -> int:
    """Tiles run, counting phantoms: a cluster pairs adjacent n-blocks of one
    m-block (multicast on A) or adjacent m-blocks of one n-block (on B)."""
    if mc == 1:
        return groups * mb * nb
    if on_a:
        return groups * mb * 2 * _ceil_div(nb, 2)
    return groups * 2 * _ceil_div(mb, 2) * nb


def _pair_grid(groups: int, mb: int, nb: int, on_a: bool, num_sms: int) -> int | None:
    """The grid of a 2-CTA multicast launch on side A (``on_a``) or B, or None
    when its executed tiles fit in one wave (multicast only with more)."""
    executed = _executed_tiles(groups, mb, nb, 2, on_a)
    grid = min(num_sms - num_sms % 2, executed)
    return grid if _ceil_div(executed, grid) > 1 else None


# ---------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------

def _check_kind(kind) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def _as_int(name: str, value) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}") from None


def _validate(kind, m, n, k, num_groups, num_sms, smem_limit):
    _check_kind(kind)
    m, n, k = _as_int("m", m), _as_int("n", n), _as_int("k", k)
    num_groups, num_sms = _as_int("num_groups", num_groups), _as_int("num_sms", num_sms)
    smem_limit = _as_int("smem_limit", smem_limit)
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    if kind == "normal" and num_groups != 1:
        raise ValueError(f"num_groups must be 1 for kind 'normal', got {num_groups}")
    if num_sms < 1:
        raise ValueError(f"num_sms must be >= 1, got {num_sms}")
    if smem_limit < 1:
        raise ValueError(f"smem_limit must be > 0, got {smem_limit}")
    check_n_k(n, k, smem_limit)
    return kind, m, n, k, num_groups, num_sms, smem_limit


def check_n_k(n: int, k: int, smem_limit: int = SMEM_LIMIT, *, allow_empty: bool = False) -> None:
    """The GEMMs' rules on ``n`` and ``k`` (integers), shared by
    :func:`select_config` and the ops' validation (cugemm8/gemm.py).

    Raises ``ValueError`` unless ``n`` is a positive multiple of 8 (16-byte
    BF16 output rows), ``k`` a positive multiple of 16 (16-byte FP8 rows for
    TMA) and ``k <= max_k(smem_limit)``.  With ``allow_empty`` (the ops),
    ``n == 0`` and ``k == 0`` pass too: such calls launch no GEMM (an empty
    output, or zeros for ``k == 0``, as DeepGEMM does).
    """
    lo, kind = (0, "a non-negative") if allow_empty else (1, "a positive")
    if k < lo or k % 16:
        raise ValueError(f"k = {k} must be {kind} multiple of 16 (16-byte FP8 rows for TMA)")
    if n < lo or n % 8:
        raise ValueError(f"n = {n} must be {kind} multiple of 8 (16-byte BF16 output rows)")
    limit = max_k(smem_limit)
    if 0 < limit < k:           # (limit 0: no tile fits at all; _rank says so)
        raise ValueError(f"k = {k} exceeds {limit}: each math warp keeps the tile's "
                         f"B scales for the whole K in shared memory (64 * ceil(k/128) bytes), and "
                         f"beyond that even the smallest tile (64x8, {_min_stages(64, 8)} stages) "
                         f"does not fit smem_limit={smem_limit} bytes")


def _two_pass_rows(m: int, num_experts: int) -> int:
    """Expected 256-row tiles that straddle two experts in a contiguous
    layout of ``m`` rows and ``num_experts`` experts (each re-run by the
    second pass): a boundary between experts falls at an odd multiple of 128
    rows about half the time, and there are at most ``num_experts - 1``
    boundaries and one per tile."""
    return _ceil_div(min(max(num_experts - 1, 0), _ceil_div(m, 256)), 2)


def split_k_skew(block_m: int, k: int, num_math_warpgroups: int = 2) -> int:
    """K blocks that rank 0 of a split-K pair (``num_k_splits = 2``) takes
    beyond half of the ``ceil(k / 128)``; rank 1 takes as many fewer.

    The kernel's rule (``GemmTraits::kSplitSkew`` in
    cuda_src/fp8_gemm_1d2d.cuh): 2 with BLOCK_M = 128 or one math warpgroup
    (``num_math_warpgroups = 1``, BLOCK_M = 64) when each rank has at least
    8 blocks, else 0.  Rank 1 then finishes four blocks before rank 0, and
    its FP32 partial tile is in flight while rank 0 runs them.  Measured on
    the H200: 128x32 2.1 % and 128x64 2.4 % faster at K = 7168, no change at
    K = 2048 (benches/RESULTS.md, v0.6); 64x64 w1 2.2 % at 128x2112x7168 and
    64x32 w1 0-0.4 % at M <= 64 (v0.30).  BLOCK_M = 64 on two math
    warpgroups (which split K again between them) lost 1-3 % with it (v0.6)
    and keeps an even split.
    """
    half = _ceil_div(k, BLOCK_K) // 2
    return 2 if (block_m == 128 or num_math_warpgroups == 1) and half >= 8 else 0


def _score(kind, bm, bn, stages, mc, on_a, m, n, k, groups, grid,
           num_experts: int = 1, splits: int = 1, wgs: int = 2) -> tuple[float, int]:
    """Estimated cycles of the busiest CTA, and the padded work
    (executed tiles x BM x BN); see the module docstring."""
    # The busiest rank's K blocks.  The one-warpgroup skew (split_k_skew with
    # wgs = 1) is left out: it hides the exchange that C_SPLIT charges, and
    # counting its two extra blocks alone moved 23 of 2016 picks (all at
    # K = 16384) from w1 k2 to two warpgroups, unmeasured
    # (benches/experiments/v0.30/pick_diff.log).
    kb = _ceil_div(k, BLOCK_K) // splits + (split_k_skew(bm, k) if splits == 2 else 0)
    mb, nb = _ceil_div(m, bm), _ceil_div(n, bn)
    executed = _executed_tiles(groups, mb, nb, mc, on_a)
    if kind == "contiguous" and bm == 256:
        # Tiles straddling two experts run twice (scheduler.cuh).
        executed += _executed_tiles(1, _two_pass_rows(m, num_experts), nb, mc, on_a)
    waves = _ceil_div(executed * splits, grid)

    # Compute: per 128-K block.
    sub = _waves_per_warpgroup(bm)
    t_mma = max(bn / 2, 16 + bn / 4)                       # one m64nBNk32
    t_promo = bn / 2 * (RUNTIME_SELECT if _runtime_boundary(bn) else 1.0)  # FFMAs, one sub-tile
    t_chain = sub * (4 * t_mma + t_promo) + C_KB           # one warpgroup, serial
    if bm == 64:
        # two warpgroups split K: measured ~10 % shorter; one: 5 % (fitted)
        t_chain *= SPLIT_K_CHAIN if wgs == 2 else ONE_WG_CHAIN
    t_tensor = bm * bn / 32                                # all MACs at 4096/cycle
    # Shared memory at 128 B/cycle: TMA writes A and B, each sub-tile's WGMMAs
    # read its 64 rows of A and all of B.
    t_smem = (BLOCK_K * (bm + bn) + BLOCK_K * (bm // 64) * (64 + bn)) / 128
    t_compute = kb * max(t_chain, t_tensor, t_smem)

    # Feed: real rows/columns on average, multicast halves the shared operand.
    rows, cols = m / mb, n / nb
    share_a = 2 if mc == 2 and on_a else 1
    share_b = 2 if mc == 2 and not on_a else 1
    stage_bytes = BLOCK_K * (rows + cols)
    # L2 bandwidth is shared by the CTAs that run (the grid), not by every SM.
    rate = min(SM_BYTES_PER_CYCLE, L2_BYTES_PER_CYCLE / grid, stages * stage_bytes / LATENCY)
    t_feed = max(kb * BLOCK_K * (rows / share_a + cols / share_b) / rate,
                 kb * stage_bytes / SM_BYTES_PER_CYCLE)

    t_tile = (t_compute ** OVERLAP_P + t_feed ** OVERLAP_P) ** (1 / OVERLAP_P) + C_TILE + bm * bn / 64
    if kind == "contiguous" and bm == 256:
        # Per tile, the two-pass kernel also reads two expert ids and skips
        # an (almost always absent) pass-1 twin.  Measured on the H200
        # (benches/RESULTS.md, v0.4) against the normal GEMM's 256x128 at the
        # same M, with no straddling tiles: +40 us over 31 tiles per CTA at
        # K = 7168, +72 us over 54 at K = 2048, about 1.3 us per tile in both
        # (not split further between the skip and the reads).
        t_tile += C_TWO_PASS
    if mc == 2:
        t_tile *= 1 + MC_PENALTY
    if splits == 2:
        t_tile += C_SPLIT
    if bm == 64 and wgs == 2:
        t_tile += C_WG_REDUCE                              # the warpgroups' reduction
    return waves * t_tile, executed * bm * bn


def _rank(kind, m, n, k, num_groups, num_sms, smem_limit, warp_mma=True):
    m_eff = max(m, 1)
    groups = num_groups if kind == "masked" else 1
    rows_of_work = m_eff * groups
    ranked = []
    for bm in candidate_block_ms(kind):
        for bn in candidate_block_ns(bm):
            stages = max_stages(bm, bn, k, smem_limit)
            if not stages:
                continue
            mb, nb = _ceil_div(m_eff, bm), _ceil_div(n, bn)
            options = [(1, False, 1, stages)]
            if (kind in MULTICAST_KINDS and (MULTICAST_TILES is None or (bm, bn) in MULTICAST_TILES)
                    and num_sms >= 2 and rows_of_work >= MULTICAST_MIN_ROWS):
                options.append((2, True, 1, stages))
                if kind == "normal":
                    options.append((2, False, 1, stages))
            # NORMAL_MULTICAST_B_TILES: the tile is ranked by its unicast
            # score and, if it wins, runs with B multicast (the model's L2
            # saving would otherwise prefer it over 256x128 where it measured
            # 3-20 % slower).
            upgrade_b = (kind == "normal" and (bm, bn) in NORMAL_MULTICAST_B_TILES and num_sms >= 2
                         and rows_of_work >= MULTICAST_MIN_ROWS)
            # NORMAL_MULTICAST_A_TILES: the same upgrade with A multicast at long K.
            upgrade_a = (kind == "normal" and (bm, bn) in NORMAL_MULTICAST_A_TILES and num_sms >= 2
                         and k >= NORMAL_MULTICAST_A_MIN_K and rows_of_work >= MULTICAST_MIN_ROWS)
            # CONTIGUOUS_MULTICAST_B_TILES: A's multicast option, run with B's.
            contiguous_b = (kind == "contiguous" and (bm, bn) in CONTIGUOUS_MULTICAST_B_TILES
                            and k <= CONTIGUOUS_MULTICAST_B_MAX_K
                            and m_eff >= CONTIGUOUS_MULTICAST_B_MIN_EXPERT_ROWS * max(num_groups, 1))
            if (SPLIT_K_ENABLED and bm in SPLIT_K_BLOCK_MS and bn <= SPLIT_K_MAX_BLOCK_N
                    and num_sms >= 2
                    and _ceil_div(k, BLOCK_K) % 2 == 0
                    and 2 * _executed_tiles(groups, mb, nb, 1, False) <= num_sms):
                split_stages = max_stages(bm, bn, k, smem_limit, num_k_splits=2)
                if split_stages:
                    options.append((1, False, 2, split_stages))
            if ONE_WARPGROUP_ENABLED and bm == 64:
                for mc, on_a, splits, _ in list(options):
                    st1 = max_stages(bm, bn, k, smem_limit, num_k_splits=splits, num_math_warpgroups=1)
                    st1 = _short_k_stages(kind, m_eff, bm, bn, k, splits, st1)
                    if st1:
                        options.append((mc, on_a, splits, st1, 1))
            options = [o if len(o) == 5 else (*o, 2) for o in options]
            for mc, on_a, splits, st, wgs in options:
                executed = _executed_tiles(groups, mb, nb, mc, on_a)
                grid = min(num_sms - num_sms % max(mc, splits), executed * splits)
                if mc == 2 and _ceil_div(executed, grid) <= 1:
                    continue              # multicast only with more than one wave
                score, work = _score(kind, bm, bn, st, mc, on_a, m_eff, n, k,
                                     groups, grid, num_experts=num_groups, splits=splits, wgs=wgs)
                if (upgrade_a or upgrade_b) and mc == 1 and splits == 1:
                    grid_mc = _pair_grid(groups, mb, nb, upgrade_a, num_sms)
                    if grid_mc is not None:
                        mc, on_a, grid = 2, upgrade_a, grid_mc
                if contiguous_b and mc == 2 and on_a:
                    grid_b = _pair_grid(groups, mb, nb, False, num_sms)
                    if grid_b is not None:
                        on_a, grid = False, grid_b
                cfg = make_config(kind, bm, bn, st, k, num_multicast=mc,
                                  multicast_on_a=on_a, num_k_splits=splits, num_sms=grid,
                                  num_math_warpgroups=wgs)
                key = (score, work, mc, splits, -bm, bn, 0 if on_a else 1, -wgs)
                ranked.append((key, cfg))
    if not ranked:
        raise ValueError(f"no configuration fits smem_limit={smem_limit} bytes with k={k} "
                         f"(the smallest tile, 64x8 with {_min_stages(64, 8)} stages, needs "
                         f"{smem_size(64, 8, _min_stages(64, 8), k)} bytes)")
    ranked.sort(key=lambda e: e[0])
    out = tuple((key[0], cfg) for key, cfg in ranked)
    # The twin rules, in order: the first that takes the model's pick wins.
    for rule in (_swap_ab_twin, _split_k4_twin, _split_k_one_wg_twin, _split_k_m128_twin):
        twin = rule(kind, m, n, k, out[0][1], num_sms, smem_limit)
        if twin is not None:
            out = ((out[0][0], twin),) + out
            break
    wm = warp_mma_config(m, n, k, num_sms) if warp_mma and kind == "normal" else None
    # The cost model does not model the warp-MMA kernel: it takes the pick's score.
    return out if wm is None else ((out[0][0], wm),) + out


def _swap_ab_twin(kind: str, m: int, n: int, k: int, pick: GemmConfig, num_sms: int,
                  smem_limit: int) -> GemmConfig | None:
    """The swap-AB config that replaces the cost model's ``pick`` (see
    :data:`SWAP_AB_TWIN_MAX_M`), or None: ``pick`` a one-wave, unsplit,
    one-math-warpgroup ``64 x SWAP_AB_TWIN_BLOCK_N`` tile of a normal GEMM
    with 1 <= ``m`` <= SWAP_AB_TWIN_MAX_M, and its twin -- tokens 8, weight
    rows 2 * BLOCK_N, K split over a CTA pair, the most stages that fit (at
    most SWAP_AB_MAX_STAGES) -- legal, in one wave, with at least
    SWAP_AB_TWIN_MIN_KB K blocks per CTA.  The ranking gives the twin the
    pick's score (the cost model does not model the swap-AB kernel)."""
    if (kind != "normal" or not 1 <= m <= SWAP_AB_TWIN_MAX_M or pick.block_m != 64
            or pick.block_n != SWAP_AB_TWIN_BLOCK_N or pick.num_math_warpgroups != 1
            or pick.num_multicast != 1 or pick.num_k_splits != 1
            or _ceil_div(n, pick.block_n) > pick.num_sms):
        return None
    bn, splits = 2 * pick.block_n, 2
    if _ceil_div(k, BLOCK_K) // splits < SWAP_AB_TWIN_MIN_KB or _ceil_div(n, bn) * splits > num_sms:
        return None
    return swap_ab_config(m, n, k, 8, bn, SWAP_AB_MAX_STAGES, num_sms, splits, smem_limit)


def _split_twin_config(bm: int, bn: int, k: int, splits: int, ctas: int, wgs: int, num_sms: int,
                       smem_limit: int) -> GemmConfig | None:
    """A twin rule's split-K config (normal GEMM): ``bm`` x ``bn`` on
    ``wgs`` math warpgroups, K split over ``splits`` CTAs, on ``ctas`` CTAs,
    with the most stages that fit ``smem_limit``; None if none fit or the
    config is illegal on ``num_sms`` SMs (:func:`is_legal`)."""
    stages = max_stages(bm, bn, k, smem_limit, num_k_splits=splits, num_math_warpgroups=wgs)
    if not stages:
        return None
    cfg = make_config("normal", bm, bn, stages, k, num_k_splits=splits, num_sms=ctas, num_math_warpgroups=wgs)
    return cfg if is_legal(cfg, k=k, available_sms=num_sms, smem_limit=smem_limit)[0] else None


def split_k4_max_ctas(num_sms: int) -> int:
    """CTAs of a four-way split-K grid whose clusters can all be resident
    on ``num_sms`` SMs: 4 x min(num_sms // 4, the GPC-bound cluster count
    :data:`SPLIT_K4_CLUSTERS_PER_132_SMS` scaled to ``num_sms``) -- 120 on
    the H200's 132."""
    return 4 * min(num_sms // 4, num_sms * SPLIT_K4_CLUSTERS_PER_132_SMS // 132)


def _split_k4_twin(kind: str, m: int, n: int, k: int, pick: GemmConfig, num_sms: int,
                   smem_limit: int) -> GemmConfig | None:
    """The four-way split-K config that replaces the cost model's ``pick``
    (see :data:`SPLIT_K4_MAX_PICK_BLOCK_N`), or None: ``pick`` a one-wave
    TMA tile of a normal GEMM, at most SPLIT_K4_MAX_PICK_BLOCK_N wide, with
    1 <= ``m`` <= SPLIT_K4_MAX_M; its twin is the narrowest BLOCK_N
    (multiples of 8 from the pick's) of BLOCK_M 64 on one math warpgroup
    (``m`` <= 64) or 128 whose tiles times four fit
    :func:`split_k4_max_ctas`, if it is at most SPLIT_K4_MAX_TWIN_BLOCK_N
    wide, with the most stages that fit and at least
    SPLIT_K4_MIN_KB of the ``ceil(k / 128)`` K blocks (a multiple of 4) per
    CTA.  The ranking gives the twin the pick's score (the cost model does
    not model four-way split K)."""
    if (kind != "normal" or not 1 <= m <= SPLIT_K4_MAX_M or pick.swap_ab or pick.warp_mma
            or pick.num_multicast != 1 or pick.num_k_splits == 4
            or pick.block_n > SPLIT_K4_MAX_PICK_BLOCK_N or tile_counts(pick, m, n)[2] > 1):
        return None
    kb = _ceil_div(k, BLOCK_K)
    if kb % 4 or kb // 4 < SPLIT_K4_MIN_KB:
        return None
    bm, wgs = (64, 1) if m <= 64 else (128, 2)
    cap = split_k4_max_ctas(num_sms)
    for bn in candidate_block_ns(bm):
        tiles = _ceil_div(m, bm) * _ceil_div(n, bn)
        if bn < pick.block_n or tiles * 4 > cap:
            continue
        if bn > SPLIT_K4_MAX_TWIN_BLOCK_N:
            return None
        return _split_twin_config(bm, bn, k, 4, tiles * 4, wgs, num_sms, smem_limit)
    return None


def _split_k_one_wg_twin(kind: str, m: int, n: int, k: int, pick: GemmConfig, num_sms: int,
                         smem_limit: int) -> GemmConfig | None:
    """The one-math-warpgroup config that replaces the cost model's ``pick``
    (see :data:`SPLIT_K_TWIN_MAX_BLOCK_N`), or None: ``pick`` a normal
    GEMM's 128 x BLOCK_N tile split over a CTA pair (no multicast) with
    64 < ``m`` <= 128; its twin is 64 x 2*BLOCK_N on one math warpgroup,
    split over a pair, with the most stages that fit, on the same CTA count
    or fewer, if 2*BLOCK_N <= SPLIT_K_TWIN_MAX_BLOCK_N and each rank keeps at
    least SPLIT_K_TWIN_MIN_KB of the ``ceil(k / 128)`` K blocks.  The ranking
    gives the twin the pick's score."""
    if (kind != "normal" or not 64 < m <= 128 or pick.swap_ab or pick.warp_mma
            or pick.block_m != 128 or pick.num_k_splits != 2 or pick.num_multicast != 1):
        return None
    bn = 2 * pick.block_n
    if bn > SPLIT_K_TWIN_MAX_BLOCK_N or _ceil_div(k, BLOCK_K) // 2 < SPLIT_K_TWIN_MIN_KB:
        return None
    ctas = 2 * _ceil_div(n, bn) * 2
    if ctas > min(num_sms, pick.num_sms):
        return None
    return _split_twin_config(64, bn, k, 2, ctas, 1, num_sms, smem_limit)


def _split_k_m128_twin(kind: str, m: int, n: int, k: int, pick: GemmConfig, num_sms: int,
                       smem_limit: int) -> GemmConfig | None:
    """The 128-row split-K config that replaces the cost model's ``pick``
    (see :data:`SPLIT_K_M128_TWIN_BLOCK_N`), or None: ``pick`` a normal
    GEMM's unsplit 64 x BLOCK_N tile on one math warpgroup (no multicast)
    with 64 < ``m`` <= 128 and every tile in one wave, BLOCK_N =
    SPLIT_K_M128_TWIN_BLOCK_N; its twin is 128 x BLOCK_N on two math
    warpgroups split over a CTA pair, with the most stages that fit, on the
    same CTA count, if ``ceil(k / 128)`` is even and each rank keeps at
    least SPLIT_K_M128_TWIN_MIN_KB K blocks.  The ranking gives the twin the
    pick's score."""
    if (kind != "normal" or not 64 < m <= 128 or pick.swap_ab or pick.warp_mma
            or pick.block_m != 64 or pick.num_math_warpgroups != 1 or pick.num_k_splits != 1
            or pick.num_multicast != 1 or pick.block_n != SPLIT_K_M128_TWIN_BLOCK_N):
        return None
    kb = _ceil_div(k, BLOCK_K)
    ctas = 2 * _ceil_div(n, pick.block_n)          # the pick's tiles: two m-blocks, all in one wave
    if kb % 2 or kb // 2 < SPLIT_K_M128_TWIN_MIN_KB or ctas > min(num_sms, pick.num_sms):
        return None
    return _split_twin_config(128, pick.block_n, k, 2, ctas, 2, num_sms, smem_limit)


def swap_ab_config(m: int, n: int, k: int, bm: int, bn: int, stages: int, num_sms: int,
                   splits: int = 1, smem_limit: int = SMEM_LIMIT) -> GemmConfig | None:
    """The swap-AB config of a ``bm`` (tokens) x ``bn`` (weight rows) tile at
    most ``stages`` deep (fewer where fewer fit ``smem_limit``), split K over
    ``splits`` CTAs, on as many CTAs as it has tiles times splits (up to
    ``num_sms``, a multiple of ``splits``), or None if illegal
    (:func:`is_legal`).  select_config's twin rule and ``cugemm8 tune``'s
    forced configs (cugemm8._tune.parse_config, swap_ab_candidates) build it here."""
    stages = min(stages, swap_ab_max_stages(bm, bn, k, smem_limit, num_k_splits=splits) or stages)
    tiles = _ceil_div(max(m, 1), bm) * _ceil_div(n, bn)
    grid = max(min(num_sms - num_sms % splits, tiles * splits), splits)
    cfg = make_config("normal", bm, bn, stages, k, num_k_splits=splits, num_sms=grid, swap_ab=True)
    ok, _ = is_legal(cfg, k=k, available_sms=num_sms, smem_limit=smem_limit)
    return cfg if ok else None


def _short_k_stages(kind: str, m: int, bm: int, bn: int, k: int, splits: int, stages: int) -> int:
    """Stages of a one-warpgroup normal-GEMM candidate at decode sizes
    (``m`` <= 64) whose unsplit tile is at least 128 wide and has at most
    :data:`SHORT_K_BLOCKS` K blocks: those blocks, not more (the minimum at
    least).  Deeper rings only load the next tile's blocks early, and every
    CTA then has two tiles of B in flight at the start: measured on the H200
    (benches/RESULTS.md v0.16, ``plan_32768x512.json``) 64x128 w1 at
    32768x512 runs 0.2-0.5 us faster with 4 stages than with 8 (M = 1 and
    64, with and without B's evict-first hint), 5 in between.  Only that
    family was measured, so narrower, split or larger-M tiles keep the
    deepest ring that fits."""
    kb = _ceil_div(k, BLOCK_K) // splits
    if (kind != "normal" or not stages or kb > SHORT_K_BLOCKS or m > 64 or splits != 1
            or bn < 128):
        return stages
    return min(stages, max(kb, _min_stages(bm, bn)))


def ranked_configs(kind: str, m: int, n: int, k: int, *, num_groups: int = 1,
                   num_sms: int = 132, smem_limit: int = SMEM_LIMIT, warp_mma: bool = True
                   ) -> tuple[tuple[float, GemmConfig], ...]:
    """Every candidate with its estimated cycles, best first (the first is
    :func:`select_config`'s choice).  For inspection and tests."""
    return _rank(*_validate(kind, m, n, k, num_groups, num_sms, smem_limit), warp_mma=warp_mma)


@functools.lru_cache(maxsize=8192)
def _select(kind, m, n, k, num_groups, num_sms, smem_limit, warp_mma=True) -> GemmConfig:
    return _rank(kind, m, n, k, num_groups, num_sms, smem_limit, warp_mma)[0][1]


def select_config(kind: str, m: int, n: int, k: int, *, num_groups: int = 1,
                  num_sms: int = 132, smem_limit: int = SMEM_LIMIT, warp_mma: bool = True) -> GemmConfig:
    """Choose the kernel configuration for one GEMM ``D[m, n] = A[m, k] B[n, k]^T``.

    Arguments:
        kind: ``'normal'``; ``'contiguous'`` (``m`` = m_sum, all groups'
            rows stacked, each group padded to 128 rows); ``'masked'`` (``m``
            = expected_m rows per group, ``num_groups`` groups).
        m: rows (>= 0; 0 returns a valid config that need not be launched).
        n, k: output columns and reduction length (> 0).
        num_groups: groups of a grouped GEMM (must be 1 for ``'normal'``).
        num_sms: SMs available (the device's count or the user's setting);
            the config's ``num_sms`` is the grid, never more than this.
        smem_limit: opt-in shared memory per block in bytes.
        warp_mma: whether the warp-MMA decode kernel may be chosen
            (:func:`warp_mma_config`).  Its grid is not persistent, so the
            ops allow it only when ``num_sms`` is the whole device (a
            budget set by :func:`cugemm8.set_num_sms` below the SM count
            keeps the persistent kernels).

    Raises ``ValueError`` naming the argument for impossible values and
    ``TypeError`` for non-integers.  Deterministic and cached.
    """
    return _select(*_validate(kind, m, n, k, num_groups, num_sms, smem_limit), bool(warp_mma))


# ---------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------

#: The DeepSeek-V3 benchmark shapes (docs/benchmarks.md):
#: (kind, num_groups, m, n, k) with m = m_sum for contiguous and expected_m
#: for masked.
BENCHMARK_CASES = (
    tuple(("normal", 1, m, n, k)
          for m in (1, 8, 16, 32, 64, 128, 4096)
          for n, k in DEEPSEEK_NK)
    + tuple(("contiguous", g, g * mg, n, k)
            for g, mg, n, k in ((4, 8192, 4096, 7168), (4, 8192, 7168, 2048),
                                (8, 4096, 4096, 7168), (8, 4096, 7168, 2048)))
    + tuple(("masked", g, m, n, k)
            for g, m, n, k in ((1, 1024, 4096, 7168), (1, 1024, 7168, 2048),
                               (2, 512, 4096, 7168), (2, 512, 7168, 2048),
                               (4, 256, 4096, 7168), (4, 256, 7168, 2048)))
)


def format_table(cases=BENCHMARK_CASES, *, num_sms: int = 132,
                 smem_limit: int = SMEM_LIMIT) -> str:
    """A text table of the choices for ``cases`` of (kind, num_groups, m, n, k):
    the config, its shared memory, real and executed tiles, waves, and the
    cost model's score converted at 1.755 GHz (a ranking aid, not a forecast;
    "-" for the warp-MMA kernel, which the model does not cover)."""
    head = ("kind", "G", "m", "n", "k", "config", "smem", "tiles", "exec", "waves", "model_us")
    rows = []
    for kind, g, m, n, k in cases:
        cfg = select_config(kind, m, n, k, num_groups=g, num_sms=num_sms, smem_limit=smem_limit)
        tiles, executed, waves = tile_counts(cfg, m, n, g)
        est = ranked_configs(kind, m, n, k, num_groups=g, num_sms=num_sms,
                             smem_limit=smem_limit)[0][0]
        rows.append((kind, str(g), str(m), str(n), str(k), str(cfg), str(cfg.smem_bytes),
                     str(tiles), str(executed), str(waves), "-" if cfg.warp_mma else f"{est / 1755:.1f}"))
    return text_table(head, rows)


def text_table(head, rows) -> str:
    """Plain-text columns: the first left-aligned, the others right-aligned,
    a dashed rule under the header (``cugemm8 configs``'s tables)."""
    widths = [max(len(r[i]) for r in list(rows) + [head]) for i in range(len(head))]

    def fmt(r):
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))

    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])
