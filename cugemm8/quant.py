"""FP8 (e4m3fn) quantisation on the GPU, writing exactly what the GEMMs read.

Math (DeepSeek-V3 fine-grained scaling; bit-identical to
:func:`cugemm8.reference.per_token_cast_to_fp8` / ``per_block_cast_to_fp8``)::

    amax  = max |x| over each 1x128 group (per token) or 128x128 tile (per
            block), K and N tails zero-padded, NaN propagating
    amax  = max(amax, float32(min_amax))
    scale = float32(amax / 448)            (IEEE float32 quotient, RNE)
            -> 2^ceil(log2(scale)) if pow2_scale (exact)
    q     = e4m3fn(clip(float32(x / scale), -448, 448))   (RNE, NaN stays NaN)

so ``x ~= e4m3(q) * scale``.  Finite inputs never produce NaN payloads
(finite overflow saturates to +-448) and an all-zero group gets
``scale = min_amax / 448``.  A NaN poisons only its own group / tile (NaN
scale, NaN payloads); an Inf gives its group an Inf scale, NaN at the Inf
positions and zeros elsewhere, so the dequantised group is NaN.

NaN encodings: the kernels write every NaN payload as ``0x7F``, and a NaN
scale carries the largest ``|x|`` NaN pattern of its group (sign cleared);
NumPy may give ``0xFF`` or other NaN bits at the same positions (it
propagates NaN signs and payloads through the division).  Both are NaN:
compare NaN positions, not NaN bits.

Kernels (``cuda_src/quant.cuh``): one pass over the input, 16-byte loads;
per token, one warp per run of 128-group chunks of a row with a
warp-shuffle amax; per block, one 256-thread CTA per 128x128 tile held in
registers; the backward pass's transposing casts
(:func:`per_token_cast_to_fp8_t`, :func:`cast_transpose_block_fp8`),
256-thread CTAs staging 128-row tiles in shared memory with cp.async (by
default one 32 KB tile per CTA, one CTA per tile, four CTAs per SM; the
float32 per-tile cast one 64 KB tile per CTA, three per SM, persistent),
each column's 16-row runs leaving transposed as 16-byte stores
(:func:`transpose_configs`).  Everything runs
on CuPy's current stream without host synchronisation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from . import _config, _device, _jit, _launch
from ._checks import check_device_array, check_on_current_device, refuse_temporary_under_capture
from .layout import tma_aligned_size
from .reference.quant import MIN_AMAX_FLOOR, check_bool, check_quant_options

if TYPE_CHECKING:
    import cupy

_HEADER = "quant.cuh"
_THREADS = 256                     # quant::kThreads
_WARPS = _THREADS // 32
_UNROLL = 4                        # per_token_cast_kernel's kUnroll
_GROUP = 128
_E4M3_MAX = 448.0
_INT32_MAX = 2 ** 31 - 1
_IN_DTYPES = {"float32": "kFloat32", "float16": "kFloat16", "bfloat16": "kBFloat16"}
_DEFAULT_MIN_AMAX = 1e-4           # the casts' default min_amax (DeepGEMM's recipe), also gemm_fp8's

__all__ = ["per_token_cast_to_fp8", "per_block_cast_to_fp8", "per_token_cast_to_fp8_t",
           "cast_transpose_block_fp8", "gemm_fp8", "gemm_fp8_workspace_bytes", "MIN_AMAX_FLOOR"]


# ----------------------------------------------------------------------------
# Kernel names
# ----------------------------------------------------------------------------

def kernel_name(kind: str, dtype_name: str, pow2_scale: bool, config: "TransposeConfig | None" = None) -> str:
    """Fully qualified name expression of one quantisation kernel.

    ``kind`` is ``"per_token"``, ``"per_block"``, ``"transpose_column"``
    (:func:`per_token_cast_to_fp8_t`) or ``"transpose_block"``
    (:func:`cast_transpose_block_fp8`); ``dtype_name`` one of
    ``"float32"``, ``"float16"``, ``"bfloat16"``.  The transposing kinds
    take a :class:`TransposeConfig` (one of :func:`transpose_configs`;
    default: the first, the one the public functions launch).
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, _KINDS))}, got {kind!r}")
    pow2 = 'true' if pow2_scale else 'false'
    dt = f"cugemm8::InDtype::{_IN_DTYPES[dtype_name]}"
    if kind.startswith("transpose_"):
        cfg = _transpose_config(kind, dtype_name, config)
        per_column = 'true' if kind == "transpose_column" else 'false'
        return (f"cugemm8::cast_transpose_kernel<{dt}, {pow2}, {per_column}, {cfg.tile_cols}, {cfg.stages}, "
                f"{cfg.ctas_per_sm}>")
    if config is not None:
        raise ValueError(f"config applies to the transposing casts only, not to {kind!r}")
    return f"cugemm8::{kind}_cast_kernel<{dt}, {pow2}>"


#: kernel kinds: the forward casts and the transposing casts of the backward pass
_KINDS = ("per_token", "per_block", "transpose_column", "transpose_block")


def launched_kernels() -> list:
    """``(kind, dtype_name, pow2, config)`` of every instantiation the public
    functions can launch: each kind, input dtype and pow2 setting (the
    transposing casts in their default configuration, ``config`` None) and,
    for 16-bit inputs per column, the one-round configuration
    (:func:`select_transpose_config`)."""
    out = [(kind, dt, p, None) for kind in _KINDS for dt in _IN_DTYPES for p in (False, True)]
    out += [("transpose_column", dt, p, ONE_ROUND_TRANSPOSE_CONFIG)
            for dt in _IN_DTYPES if dt != "float32" for p in (False, True)]
    return out


def all_kernel_names() -> list:
    """The names of :func:`launched_kernels` (for compile checks and
    ``cugemm8 warmup``)."""
    return [kernel_name(*entry) for entry in launched_kernels()]


# ----------------------------------------------------------------------------
# The transposing casts' configurations (cast_transpose_kernel, issue 21)
# ----------------------------------------------------------------------------

class TransposeConfig(NamedTuple):
    """One build and launch of ``cast_transpose_kernel``: tiles of 128 rows x
    ``tile_cols`` columns, a ring of ``stages`` tiles in shared memory per
    CTA, registers capped for ``ctas_per_sm`` CTAs of 256 threads per SM.
    ``grid`` (the launch only; CTA ``i`` takes tiles ``i``, ``i + grid``,
    ...):

    * ``"balanced"``: as many rounds of tiles as ``"full"`` needs, over the
      fewest CTAs that keep them (every CTA then takes the same number of
      tiles, give or take one, so no round ends with a few CTAs alone);
    * ``"full"``: ``ctas_per_sm`` CTAs per SM (the SM budget of
      :func:`cugemm8.get_num_sms`), at most one per tile;
    * ``"tiles"``: one CTA per tile.
    """
    tile_cols: int
    stages: int
    ctas_per_sm: int
    grid: str = "balanced"

    def smem_bytes(self, itemsize: int) -> int:
        """Dynamic shared memory of one CTA: the ring of tiles."""
        return self.stages * _GROUP * self.tile_cols * itemsize

    def label(self) -> str:
        return f"{self.tile_cols}c s{self.stages} x{self.ctas_per_sm} {self.grid}"

    def grid_size(self, tiles: int, num_sms: int) -> int:
        """CTAs of the launch for ``tiles`` tiles on ``num_sms`` SMs."""
        if self.grid == "tiles":
            return tiles
        full = min(tiles, self.ctas_per_sm * num_sms)
        if self.grid == "full":
            return full
        rounds = -(-tiles // full)
        return -(-tiles // rounds)


#: The configurations of each (kind, 4-byte input): the first is the one the
#: public functions launch, the others are built for timing
#: (tools/perf/sweep_cast_t.py) and compile-checked.  Default: one 32 KB tile
#: per CTA (256-byte rows: 128 columns of 16-bit input, 64 of float32), four
#: CTAs per SM, one CTA per tile: the fastest of the sweep's 10-11 variants on
#: three of its four cases and within 0.5 us of the fastest on the fourth
#: ([4096, 7168] bf16 per column 81 % of a same-size copy, [4096, 2048] 76 %,
#: [7168, 7168] bf16 per tile 98 %, [4096, 7168] float32 per column 90 %;
#: H200, benches/RESULTS.md v0.13).  The block scales need 128 columns, so
#: float32 weights take one 64 KB tile per CTA (not measured).
_TRANSPOSE_CONFIGS = {
    ("transpose_column", False): (TransposeConfig(128, 1, 4, "tiles"), TransposeConfig(128, 2, 3),
                                  TransposeConfig(128, 3, 2), TransposeConfig(64, 2, 6)),
    ("transpose_column", True): (TransposeConfig(64, 1, 4, "tiles"), TransposeConfig(64, 2, 3),
                                 TransposeConfig(64, 3, 2), TransposeConfig(128, 1, 3)),
    ("transpose_block", False): (TransposeConfig(128, 1, 4, "tiles"), TransposeConfig(128, 2, 3),
                                 TransposeConfig(128, 3, 2)),
    ("transpose_block", True): (TransposeConfig(128, 1, 3),),
}

#: The per-column cast's configuration for 16-bit inputs whose tiles of the
#: default (128 columns) all fit in its one round (at most ``ctas_per_sm``
#: x SMs of them): 64-column tiles in rings of two, six CTAs per SM, the
#: balanced grid, so each CTA's second tile loads while its first is cast
#: instead of every load landing before any store.  Measured on the H200
#: (benches/RESULTS.md v0.23, ``tools/perf/sweep_cast_t.py --extra-cases``,
#: CUPTI, % of a same-size copy): [4096, 2048] bf16 77.5 against 75.5,
#: fp16 78.7 against 75.5, [4096, 1536] 76.8 against 70.9, [2048, 2048] 73.6
#: against 67.6; with two rounds or more ([4096, 4096], [8192, 2048],
#: [4096, 7168]) the default stays 0.5-7 % faster.  Float32 inputs (64-column
#: tiles already) keep theirs: 64c s1 x4 was the fastest at [4096, 2048] too.
ONE_ROUND_TRANSPOSE_CONFIG = TransposeConfig(64, 2, 6, "balanced")

_GRIDS = ("balanced", "full", "tiles")
_SMEM_PER_SM = 228 * 1024           # sm_90
_SMEM_RESERVED_PER_CTA = 1024
_TRANSPOSE_STATIC_SMEM = 128      # the kernel's warp maxima (64 B), padded so the ring is 128-byte aligned


def transpose_configs(kind: str, dtype_name: str) -> tuple:
    """The :class:`TransposeConfig` s built for one transposing kind and input
    dtype, the default first (any ``grid`` launches each)."""
    if kind not in ("transpose_column", "transpose_block"):
        raise ValueError(f"kind must be 'transpose_column' or 'transpose_block', got {kind!r}")
    if dtype_name not in _IN_DTYPES:
        raise ValueError(f"dtype_name must be one of {', '.join(_IN_DTYPES)}, got {dtype_name!r}")
    return _TRANSPOSE_CONFIGS[(kind, dtype_name == "float32")]


def select_transpose_config(kind: str, dtype_name: str, tiles: int, num_sms: int) -> TransposeConfig:
    """The configuration the transposing casts launch for an input of
    ``tiles`` tiles of the default's 128 x ``tile_cols`` on ``num_sms`` SMs:
    :data:`ONE_ROUND_TRANSPOSE_CONFIG` for a 16-bit input per column whose
    tiles fit in the default's one round, else the default (the first of
    :func:`transpose_configs`).  Raises ValueError on an unknown kind or
    dtype."""
    default = transpose_configs(kind, dtype_name)[0]
    if (kind == "transpose_column" and dtype_name != "float32"
            and tiles <= default.ctas_per_sm * max(num_sms, 1)):
        return ONE_ROUND_TRANSPOSE_CONFIG
    return default


def _default_tiles(kind: str, dtype_name: str, g: int, rows: int, cols: int) -> int:
    """Tiles of 128 rows x the default configuration's ``tile_cols`` in ``g``
    matrices of ``rows x cols`` (what :func:`select_transpose_config` and the
    2^31 tile limit count)."""
    return g * -(-rows // _GROUP) * -(-cols // transpose_configs(kind, dtype_name)[0].tile_cols)


def _transpose_config(kind: str, dtype_name: str, config) -> TransposeConfig:
    built = transpose_configs(kind, dtype_name)
    if config is None:
        return built[0]
    cfg = TransposeConfig(*config)
    if cfg.grid not in _GRIDS:
        raise ValueError(f"config grid must be one of {', '.join(map(repr, _GRIDS))}, got {cfg.grid!r}")
    if tuple(cfg[:3]) not in [tuple(c[:3]) for c in built]:
        raise ValueError(f"{kind} {dtype_name}: config {tuple(config)} is not one of the built "
                         f"configurations {[tuple(c[:3]) for c in built]}")
    return cfg


def _transpose_smem_ctas(cfg: TransposeConfig, itemsize: int) -> int:
    """CTAs per SM that shared memory allows (the kernel's kSmemCtas)."""
    per_cta = cfg.smem_bytes(itemsize) + _TRANSPOSE_STATIC_SMEM + _SMEM_RESERVED_PER_CTA
    return min(2048 // _THREADS, _SMEM_PER_SM // per_cta)


def transpose_variant_names() -> list:
    """Every built instantiation of the transposing casts (each dtype, pow2
    and configuration; the defaults included), for compile checks."""
    return [kernel_name(kind, dt, p, cfg) for kind in ("transpose_column", "transpose_block")
            for dt in _IN_DTYPES for p in (False, True) for cfg in transpose_configs(kind, dt)]


# ----------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------

def _check_input(name: str, x, cupy):
    check_device_array(name, x, cupy)
    if x.dtype.name not in _IN_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16 (ml_dtypes.bfloat16), "
                        f"got dtype {x.dtype}")
    if x.ndim not in (2, 3):
        raise ValueError(f"{name} must be 2-D [rows, k] or 3-D [g, rows, k], got shape {x.shape}")
    check_on_current_device({name: x}, cupy)
    if x.shape[-2] > _INT32_MAX or padded_k(x.shape[-1]) > _INT32_MAX:
        raise ValueError(f"{name} shape {x.shape}: rows and k must be below 2^31")


def padded_k(k: int) -> int:
    """Columns of a quantised payload for ``k`` input columns: ``k`` rounded
    up to a multiple of 16 (the GEMMs' 16-byte FP8 rows, a TMA rule)."""
    return -(-k // 16) * 16


def _pad_k(name: str, x, cupy):
    """``x`` with its last dimension zero-padded to :func:`padded_k` columns
    (a new array), or ``x`` itself when no padding is needed.  Zero columns
    change no 128-group's amax, so the scales are those of the unpadded
    input, and they quantise to zero bytes."""
    k = x.shape[-1]
    kp = padded_k(k)
    if kp == k:
        return x
    refuse_temporary_under_capture(
        f"{name} has k = {k} columns, not a multiple of 16, so this call would zero-pad it into a "
        f"temporary", f"pad it once before capturing (zeros up to {kp} columns) or quantise it "
        f"outside the capture", cupy)
    xp = cupy.zeros(x.shape[:-1] + (kp,), dtype=x.dtype)
    xp[..., :k] = x
    return xp


def _readable_in_place(x) -> bool:
    """Whether the kernels can read ``x`` as it is: a contiguous last
    dimension, a 16-byte aligned base and every other stride a multiple of 16
    bytes (negative and zero strides included)."""
    item = x.itemsize
    if x.shape[-1] > 1 and x.strides[-1] != item:
        return False
    if x.data.ptr % 16:
        return False
    return all(x.shape[d] <= 1 or x.strides[d] % 16 == 0 for d in range(x.ndim - 1))


def _in_place_or_copy(x, cupy):
    """``x`` itself when :func:`_readable_in_place`, else a fresh
    C-contiguous (hence 16-byte aligned) copy (refused under CUDA-graph
    capture: the copy is a temporary)."""
    if not x.size or _readable_in_place(x):
        return x
    refuse_temporary_under_capture(
        "the input's strides cannot be read in place, so this call would copy it into a temporary",
        "make it contiguous once before capturing (cupy.ascontiguousarray) and capture the call "
        "on the result", cupy)
    return x.copy(order="C")


def _kernel_operand(x):
    """``(x', batch_stride, row_stride)`` (strides in elements) of an input
    that :func:`_in_place_or_copy` has made readable."""
    item = x.itemsize
    x3 = x if x.ndim == 3 else x[None]
    batch = x3.strides[0] // item if x3.shape[0] > 1 else 0
    row = x3.strides[1] // item if x3.shape[1] > 1 else 0
    return x3, batch, row


# ----------------------------------------------------------------------------
# Launch geometry
# ----------------------------------------------------------------------------

def _per_token_split(rows: int, k: int, itemsize: int, num_sms: int):
    """``(tasks_per_row, chunks_per_task)`` for the per-token kernel.

    A chunk is one 16-byte load per lane of a warp (512 bytes of input).  A
    warp normally takes ``_UNROLL`` chunks (its loads all in flight at once);
    fewer (2, then 1) when that would give the GPU fewer than 16 warps per
    SM, as for decode-sized batches (m = 128, k = 7168: 3584 warps of one
    chunk instead of 896 of four).  The threshold is measured
    (``benches/sweep_quant.py``, benches/RESULTS.md v0.7): four chunks per
    warp are fastest from 384 rows of k = 7168 up (2688 warps), two at 256
    rows; the v0.6 rule (two full waves, 10560 warps) took one chunk up to
    754 rows and two up to 1508; the v0.7 rule takes 11-27 % less time at
    256-1024 rows.
    """
    chunks_per_row = -(-k // (32 * (16 // itemsize)))
    per_task = _UNROLL
    target = 16 * num_sms
    while per_task > 1 and rows * -(-chunks_per_row // per_task) < target:
        per_task //= 2
    return -(-chunks_per_row // per_task), per_task


def _launch_per_token(x, a, sfa_buf, min_amax_f32, pow2_scale: bool, cupy, *, launch: bool = True):
    """Launch the per-token kernel: ``x`` validated and non-empty, ``a``
    uint8 ``[g, m, k]`` and ``sfa_buf`` float32 ``[g, ceil(k/128), m_pad]``,
    both C-contiguous (tests pass poisoned buffers here).  Returns its
    :class:`cugemm8._launch.Launcher` (with ``launch=False``: without
    launching)."""
    *_, m, k = x.shape
    g = x.shape[0] if x.ndim == 3 else 1
    m_pad = sfa_buf.shape[-1]
    rows = g * m
    x3, batch_stride, row_stride = _kernel_operand(x)
    num_sms = _device.device_info(_device.require_hopper())["num_sms"]
    tasks_per_row, per_task = _per_token_split(rows, k, x.itemsize, num_sms)
    warps = rows * tasks_per_row
    if warps > _INT32_MAX or rows >= 2 ** 32:
        raise ValueError(f"x shape {x.shape} is too large for the per-token kernel's 32-bit "
                         f"work indices ({warps} warp tasks)")
    kern = _jit.get_kernel(_HEADER, kernel_name("per_token", x.dtype.name, pow2_scale))
    # Raw addresses, not the arrays: gemm_fp8's cached fused launcher holds
    # this launch and must not keep the caller's x alive.
    args = (np.uint64(x3.data.ptr), np.uint64(a.data.ptr), np.uint64(sfa_buf.data.ptr),
            np.uint32(m), np.uint32(k), np.uint32(rows),
            np.int64(batch_stride), np.int64(row_stride), np.uint32(m_pad),
            np.uint32(tasks_per_row), np.uint32(per_task), min_amax_f32)
    launcher = _launch.Launcher(kern, (-(-warps // _WARPS),), (_THREADS,), args)
    if launch:
        launcher()
    return launcher


def _launch_per_block(w, b, sfb, min_amax_f32, pow2_scale: bool, cupy) -> None:
    """Launch the per-block kernel: ``w`` validated and non-empty, ``b`` uint8
    ``[g, n, k]`` and ``sfb`` float32 ``[g, ceil(n/128), ceil(k/128)]``, both
    C-contiguous."""
    *_, n, k = w.shape
    g = w.shape[0] if w.ndim == 3 else 1
    nb, kb = -(-n // _GROUP), -(-k // _GROUP)
    tiles = g * nb * kb
    if tiles > _INT32_MAX:
        raise ValueError(f"w shape {w.shape} has {tiles} 128x128 tiles; at most 2^31 - 1")
    w3, batch_stride, row_stride = _kernel_operand(w)
    kern = _jit.get_kernel(_HEADER, kernel_name("per_block", w.dtype.name, pow2_scale))
    args = (w3, b, sfb, np.uint32(n), np.uint32(k), np.uint32(nb), np.uint32(kb),
            np.int64(batch_stride), np.int64(row_stride), min_amax_f32)
    _launch.Launcher(kern, (tiles,), (_THREADS,), args)()


# ----------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------

def per_token_cast_to_fp8(x: cupy.ndarray, *, min_amax: float = _DEFAULT_MIN_AMAX, pow2_scale: bool = False
                          ) -> tuple[cupy.ndarray, cupy.ndarray]:
    """Quantise activations to e4m3fn with one scale per token per 128 K.

    For each row and each 1x128 group along K (the K tail zero-padded)::

        amax  = max(max |x|, float32(min_amax))         (NaN propagates)
        scale = float32(amax / 448)   [-> 2^ceil(log2(scale)) if pow2_scale]
        a     = e4m3fn(clip(float32(x / scale), -448, 448))

    bit-identical to :func:`cugemm8.reference.per_token_cast_to_fp8` (NaN
    payloads and NaN scales compare as NaN, see the module docstring).

    Requirements:
        ``x`` is a CuPy array on the current device, float32, float16 or
        bfloat16 (``ml_dtypes.bfloat16``), 2-D ``[m, k]`` or 3-D
        ``[g, m, k]``, any ``k``.  Any strides are accepted: a view
        whose last dimension is contiguous, whose base address and other
        strides are multiples of 16 bytes is read in place (e.g. the batch
        slice ``x_full[:, 3:, :]``, a padded row pitch, negative strides);
        any other view is first copied to a contiguous array (one extra
        device copy, a temporary as large as ``x``).  When ``k`` is not a
        multiple of 16, ``x`` is first copied into a zero-padded temporary of
        ``k_pad = ceil(k/16)*16`` columns (one extra device copy).

        The calls that need a temporary (a copy or the K padding) are refused
        with ``ValueError`` under CUDA-graph capture: the graph would keep
        the freed temporary's address.  Aligned, in-place-readable inputs
        capture fine.

    Arguments:
        x: activations ``[m, k]`` or ``[g, m, k]``.
        min_amax: lower clamp of amax (keyword-only), a real number whose
            float32 rounding is finite and ``>= 448 * 2^-126`` (~5.3e-36), so
            that every scale is a normal float32.  Default 1e-4 (DeepGEMM's
            recipe).
        pow2_scale: round every scale up to a power of two (keyword-only).

    Returns:
        ``(a, sfa)``:

        * ``a``: uint8 ``[..., m, k_pad]`` e4m3fn bit patterns,
          C-contiguous (``a.view(ml_dtypes.float8_e4m3fn)`` gives a typed
          view), ``k_pad = ceil(k/16)*16`` (the GEMMs' ``k % 16`` rule):
          columns ``[0, k)`` are bit-identical to the reference and columns
          ``[k, k_pad)`` are zero bytes (+0.0), which add nothing to a GEMM;
          ``k_pad == k`` when ``k % 16 == 0``;
        * ``sfa``: float32, logical shape ``[..., m, ceil(k/128)]``, stored
          MN-major and TMA-aligned as the GEMMs read it: it is a transposed
          view of a buffer ``[..., ceil(k/128), m_pad]`` with
          ``m_pad = ceil(m/4)*4``, so ``sfa.strides`` is ``(4, 4*m_pad)``
          (2-D) or ``(4*m_pad*kb, 4, 4*m_pad)`` (3-D).  The padding rows
          ``m..m_pad-1`` of the buffer hold 0.

        ``m == 0`` or ``k == 0`` (or ``g == 0``) returns empty arrays of these
        shapes without launching anything.

    Raises:
        TypeError: ``x`` not a CuPy array of a supported dtype; ``min_amax``
            not a real number; ``pow2_scale`` not a bool.
        ValueError: wrong ndim, another device, sizes beyond the kernels'
            32-bit indexing, ``min_amax`` out of range; a temporary needed
            under CUDA-graph capture (see Requirements).
        cugemm8.DeviceError: no usable Hopper GPU / NVRTC.
    """
    cupy = _device.import_cupy()
    _check_input("x", x, cupy)
    min_amax_f32 = check_quant_options(min_amax, pow2_scale)
    x = _in_place_or_copy(_pad_k("x", x, cupy), cupy)
    squeeze = x.ndim == 2
    *lead, m, k = x.shape
    g = lead[0] if lead else 1
    kb = -(-k // _GROUP)
    m_pad = -(-m // 4) * 4
    a = cupy.empty((g, m, k), dtype=np.uint8)
    sfa_buf = cupy.empty((g, kb, m_pad), dtype=np.float32)
    sfa = sfa_buf.transpose(0, 2, 1)[:, :m, :]      # [g, m, kb], strides (4*m_pad*kb, 4, 4*m_pad)
    if g and m and k:
        _launch_per_token(x, a, sfa_buf, min_amax_f32, bool(pow2_scale), cupy)
    return (a[0], sfa[0]) if squeeze else (a, sfa)


def per_block_cast_to_fp8(w: cupy.ndarray, *, min_amax: float = _DEFAULT_MIN_AMAX, pow2_scale: bool = False
                          ) -> tuple[cupy.ndarray, cupy.ndarray]:
    """Quantise weights to e4m3fn with one scale per 128x128 block.

    For each 128 (N) x 128 (K) tile (N and K tails zero-padded)::

        amax  = max(max |w|, float32(min_amax))         (NaN propagates)
        scale = float32(amax / 448)   [-> 2^ceil(log2(scale)) if pow2_scale]
        b     = e4m3fn(clip(float32(w / scale), -448, 448))

    bit-identical to :func:`cugemm8.reference.per_block_cast_to_fp8` (NaN
    payloads and scales compare as NaN).

    Requirements:
        As :func:`per_token_cast_to_fp8`: a CuPy float32 / float16 /
        bfloat16 array ``[n, k]`` or ``[g, n, k]`` on the current device,
        any ``k`` (zero-padded to ``k_pad = ceil(k/16)*16`` columns in a
        temporary when ``k % 16 != 0``); views with a contiguous last
        dimension and 16-byte aligned base and strides are read in place,
        others copied first; no temporary under CUDA-graph capture.

    Arguments:
        w: weights ``[n, k]`` or ``[g, n, k]``.
        min_amax, pow2_scale: as :func:`per_token_cast_to_fp8`.

    Returns:
        ``(b, sfb)``: ``b`` uint8 ``[..., n, k_pad]`` e4m3fn bits,
        C-contiguous, columns ``[k, k_pad)`` zero bytes; ``sfb`` float32
        ``[..., ceil(n/128), ceil(k/128)]``, C-contiguous.
        Empty inputs return empty arrays without a launch.

    Raises:
        As :func:`per_token_cast_to_fp8`.
    """
    cupy = _device.import_cupy()
    _check_input("w", w, cupy)
    min_amax_f32 = check_quant_options(min_amax, pow2_scale)
    w = _in_place_or_copy(_pad_k("w", w, cupy), cupy)
    squeeze = w.ndim == 2
    *lead, n, k = w.shape
    g = lead[0] if lead else 1
    nb, kb = -(-n // _GROUP), -(-k // _GROUP)
    b = cupy.empty((g, n, k), dtype=np.uint8)
    sfb = cupy.empty((g, nb, kb), dtype=np.float32)
    if g and n and k:
        _launch_per_block(w, b, sfb, min_amax_f32, bool(pow2_scale), cupy)
    return (b[0], sfb[0]) if squeeze else (b, sfb)


def _cast_transposed(name: str, x, min_amax, pow2_scale, per_column: bool, mn_major: bool = False):
    """The two transposing casts (see :func:`per_token_cast_to_fp8_t` and
    :func:`cast_transpose_block_fp8`)."""
    check_bool("mn_major", mn_major)
    cupy = _device.import_cupy()
    _check_input(name, x, cupy)
    min_amax_f32 = check_quant_options(min_amax, pow2_scale)
    squeeze = x.ndim == 2
    *lead, rows, cols = x.shape
    g = lead[0] if lead else 1
    rb, cb = -(-rows // _GROUP), -(-cols // _GROUP)
    kind = "transpose_column" if per_column else "transpose_block"
    tiles = _default_tiles(kind, x.dtype.name, g, rows, cols)
    if tiles > _INT32_MAX:                # before any copy or allocation
        raise ValueError(f"{name} shape {x.shape} has {tiles} tiles of 128 x "
                         f"{transpose_configs(kind, x.dtype.name)[0].tile_cols}; at most 2^31 - 1")
    xk = _in_place_or_copy(_pad_k(name, x, cupy), cupy)   # whole 16-byte loads; cols stays the true count
    r_pad = padded_k(rows)
    out = cupy.empty((g, cols, r_pad), dtype=np.uint8)
    if mn_major:
        # The 1D1D GEMM's layout (get_col_major_tma_aligned_tensor): channels
        # contiguous, padded to 4 (zeros), one row per 128 tokens.
        sf_buf = cupy.empty((g, rb, tma_aligned_size(cols)), dtype=np.float32)
        sf = sf_buf[:, :, :cols].transpose(0, 2, 1)
    else:
        sf = sf_buf = cupy.empty((g, cols, rb) if per_column else (g, cb, rb), dtype=np.float32)
    if g and rows and cols:
        _launch_cast_transpose(xk, out, sf_buf, rows, cols, min_amax_f32, bool(pow2_scale), per_column,
                               mn_major)
    return (out[0], sf[0]) if squeeze else (out, sf)


def _launch_cast_transpose(xk, out, sf, rows: int, cols: int, min_amax_f32, pow2_scale: bool,
                           per_column: bool, mn_major: bool = False, *, config=None) -> None:
    """Launch the transposing cast: ``xk`` validated, readable in place, its
    last dimension padded to whole 16-byte loads (``cols`` the true column
    count); ``out`` uint8 ``[g, cols, ceil(rows/16)*16]`` and ``sf`` float32
    ``[g, cols, ceil(rows/128)]`` (per column), ``[g, ceil(rows/128),
    ceil(cols/4)*4]`` (per column, ``mn_major``) or ``[g, ceil(cols/128),
    ceil(rows/128)]``, all C-contiguous.  ``config``: a
    :class:`TransposeConfig` of :func:`transpose_configs` (default:
    :func:`select_transpose_config`'s)."""
    kind = "transpose_column" if per_column else "transpose_block"
    g = xk.shape[0] if xk.ndim == 3 else 1
    rb = -(-rows // _GROUP)
    if config is None:
        cfg = select_transpose_config(kind, xk.dtype.name, _default_tiles(kind, xk.dtype.name, g, rows, cols),
                                      _device.get_num_sms())
    else:
        cfg = _transpose_config(kind, xk.dtype.name, config)
    ct = -(-cols // cfg.tile_cols)
    tiles = g * rb * ct
    if tiles > _INT32_MAX:
        raise ValueError(f"x shape {xk.shape} has {tiles} tiles of 128 x {cfg.tile_cols}; at most 2^31 - 1")
    x3, batch_stride, row_stride = _kernel_operand(xk)
    smem = cfg.smem_bytes(xk.itemsize)
    kern = _jit.get_kernel(_HEADER, kernel_name(kind, xk.dtype.name, pow2_scale, cfg),
                           max_dynamic_smem=smem, smem_carveout=100)
    if mn_major:                        # scale (c, r) at r * cols_pad + c
        cols_pad = tma_aligned_size(cols)
        sf_strides = (rb * cols_pad, 1, cols_pad, cols_pad)
    else:                               # (c, r) at c * rb + r (the per-block form ignores these)
        sf_strides = (cols * rb, rb, 1, cols)
    grid = cfg.grid_size(tiles, _device.get_num_sms())
    args = (x3, out, sf, np.uint32(rows), np.uint32(cols), np.uint32(padded_k(rows)), np.uint32(rb),
            np.uint32(ct), np.uint32(tiles), np.int64(batch_stride), np.int64(row_stride), min_amax_f32,
            np.uint64(sf_strides[0]), np.uint32(sf_strides[1]), np.uint32(sf_strides[2]),
            np.uint32(sf_strides[3]))
    _launch.Launcher(kern, (grid,), (_THREADS,), args, smem)()


def per_token_cast_to_fp8_t(x: cupy.ndarray, *, min_amax: float = _DEFAULT_MIN_AMAX, pow2_scale: bool = False,
                            mn_major: bool = False) -> tuple[cupy.ndarray, cupy.ndarray]:
    """Quantise ``x [m, k]`` 1x128 along the token dimension m, written transposed.

    The wgrad operands of a linear layer (DeepSeek-V3 technical report,
    section 3.3: the backward GEMM ``dw = dy^T x`` reduces over tokens, so
    both operands are quantised in 128-token groups per channel): for each
    channel ``c`` and each group of 128 tokens (the token tail zero-padded),
    the recipe of :func:`per_token_cast_to_fp8`.  Bit-identical to
    :func:`cugemm8.reference.per_token_cast_to_fp8_t` (which is
    ``per_token_cast_to_fp8(x.T)``) on its ``m`` columns (the reference
    returns ``[k, m]``; here each row is padded to ``m_pad`` with zeros), in
    one pass over ``x``: each 128x128 tile is read once and leaves transposed.

    Requirements:
        As :func:`per_token_cast_to_fp8` (float32 / float16 / bfloat16 CuPy
        array ``[m, k]`` or ``[g, m, k]`` on the current device; views read
        in place when their last dimension is contiguous and their base and
        other strides are multiples of 16 bytes, otherwise copied; a ``k``
        that is not a multiple of 16 zero-padded in a temporary; no
        temporary under CUDA-graph capture).

    Arguments:
        x: tokens x channels, ``[m, k]`` or ``[g, m, k]``.
        min_amax, pow2_scale: as :func:`per_token_cast_to_fp8`.
        mn_major: return ``sf`` in the MN-major TMA-aligned layout that
            :func:`cugemm8.fp8_gemm_nt` and
            :func:`cugemm8.k_grouped_fp8_gemm_nt_contiguous` read as they are
            (the layout :func:`cugemm8.get_col_major_tma_aligned_tensor`
            returns, written by the kernel itself: no conversion kernel, no
            temporary in the GEMM call, CUDA-graph capturable); same values.
            Keyword-only, a bool.

    Returns:
        ``(a_t, sf)``: ``a_t`` uint8 ``[..., k, m_pad]`` e4m3fn bits,
        C-contiguous, ``m_pad = ceil(m/16)*16`` (16-byte rows for TMA; bytes
        ``[m, m_pad)`` of each row are zero); ``sf`` float32
        ``[..., k, ceil(m/128)]`` (``sf[c, mb]`` scales tokens ``128 mb ...
        128 mb + 127`` of channel ``c``): C-contiguous, or with
        ``mn_major`` a view with strides ``(4, 4 * k_pad4)`` (2-D; 3-D:
        ``(4 * k_pad4 * ceil(m/128), 4, 4 * k_pad4)``), ``k_pad4 =
        ceil(k/4)*4``, of a buffer whose padding channels hold 0.  Empty
        inputs return empty arrays without a launch.

    Raises:
        TypeError: ``mn_major`` not a bool; otherwise as
            :func:`per_token_cast_to_fp8`.
        ValueError: as :func:`per_token_cast_to_fp8`.
    """
    return _cast_transposed("x", x, min_amax, pow2_scale, per_column=True, mn_major=mn_major)


def cast_transpose_block_fp8(w: cupy.ndarray, *, min_amax: float = _DEFAULT_MIN_AMAX, pow2_scale: bool = False
                             ) -> tuple[cupy.ndarray, cupy.ndarray]:
    """Quantise weights ``w [n, k]`` 128x128 and write them transposed, ``[k, n]``.

    The dgrad operand ``W^T`` of a linear layer (``dx = dy W`` is a 1D2D
    GEMM whose K dimension is n; DeepSeek-V3 technical report section 3.3):
    bit-identical to :func:`per_block_cast_to_fp8` followed by transposing
    its payload and its block scales (the 128x128 tiles map onto each other),
    i.e. to :func:`cugemm8.reference.cast_transpose_block_fp8`, in one pass.

    Requirements:
        As :func:`per_block_cast_to_fp8`.

    Arguments:
        w: weights ``[n, k]`` or ``[g, n, k]``.
        min_amax, pow2_scale: as :func:`per_token_cast_to_fp8`.

    Returns:
        ``(b_t, sf_t)``: ``b_t`` uint8 ``[..., k, n_pad]`` e4m3fn bits,
        C-contiguous, ``n_pad = ceil(n/16)*16`` (bytes ``[n, n_pad)`` of each
        row zero); ``sf_t`` float32 ``[..., ceil(k/128), ceil(n/128)]``,
        C-contiguous: ``sf_t[j, i]`` is the scale of tile (rows ``128 i``,
        columns ``128 j``) of ``w``.  Empty inputs return empty arrays
        without a launch.

    Raises:
        As :func:`per_token_cast_to_fp8`.
    """
    return _cast_transposed("w", w, min_amax, pow2_scale, per_column=False)


def gemm_fp8(a: cupy.ndarray | tuple[cupy.ndarray, cupy.ndarray],
             b: cupy.ndarray | tuple[cupy.ndarray, cupy.ndarray],
             out: cupy.ndarray | None = None, *, pow2_scale: bool = False,
             workspace: cupy.ndarray | None = None) -> cupy.ndarray:
    """One-call FP8 GEMM: ``out = a @ b^T`` in bfloat16, quantising as needed.

    With float activations ``a`` and already quantised weights ``b`` (the
    decode case: ``gemm_fp8(x, (b, sfb), out)``) this is the **fused
    bf16-in path**, in one of two forms, both bit-identical to
    ``per_token_cast_to_fp8(a)`` followed by
    :func:`cugemm8.gemm_fp8_fp8_bf16_nt` (same quantisation arithmetic, same
    GEMM configuration, hence the same accumulation order):

    * **one kernel**, for a few rows (:func:`one_kernel_rows`) when ``a``'s
      rows can be read in place (contiguous last dimension, 16-byte aligned
      base and row stride): the GEMM quantises ``a`` itself, with the
      per-token kernel's own device functions.  No workspace and no second
      launch, so it also captures in CUDA graphs without a ``workspace``.

      - The warp-MMA decode pick (1 <= m <= 8 on the whole device,
        cuda_src/fp8_gemm_warp_mma.cuh), for 16-bit ``a`` (bfloat16 /
        float16; float32 takes two kernels): each CTA quantises its tokens
        into shared memory before its main loop while its first weights
        are in flight, up to the rows that leave its busiest warp at most
        7 groups of 128 elements, 8 where a CTA's warps share them
        (:func:`cugemm8._config.warp_mma_one_kernel_max_groups`; 32768 x
        512: m <= 8, 24576 x 1536: m <= 2, 4096 x 7168, 7168 x 2048 and
        2112 x 7168: m = 1).  Measured on the H200 (``benches/bench_e2e.py``,
        benches/RESULTS.md v0.20-v0.22): 1.11-1.37x the span of the
        two-launch path and 1.02-1.20x the two-kernel form on those rows.  Rows of ``a`` that are not
        whole 16-byte pieces (``k % 8`` for 16-bit ``a``) take two kernels.
      - The TMA picks (a reduced SM budget, or larger m): up to 8 rows of
        16-bit ``a`` where the pick is at least 128 columns wide, 4 where
        it is 48-120 wide or the swap-AB kernel's 64-row weight tile, half
        that for float32, never for the narrow 1D2D tiles of the K = 7168
        decode shapes (:func:`one_kernel_max_m`).  Idle warps of its
        producer warpgroup load each 128-column block of ``a`` by TMA a
        ring lap ahead and quantise it while the stage's weights are in
        flight (cuda_src/quant_a.cuh, in the 1D2D and the swap-AB kernels).
        Measured (benches/RESULTS.md v0.14): 1.20x (24576 x 1536), 1.31x
        (32768 x 512) and 1.34-1.39x (7168 x 2048) the span of the
        two-launch path at M <= 4, and 1.05-1.22x the two-kernel form;
    * **two kernels** otherwise: ``a`` is quantised 1x128 by the per-token
      kernel into a workspace, and the GEMM is launched as its programmatic
      dependent (``cuLaunchKernelEx`` with programmatic stream serialization,
      whatever :func:`cugemm8.set_pdl` says): its CTAs launch and set up
      while the quantiser runs, and its first global access waits for it
      (``griddepcontrol.wait``; the warp-MMA pick streams its first weights
      before that wait); the quantised activations (``m * k`` bytes plus
      scales) stay in L2 between the two kernels.  Measured: 1.02-1.18x the
      span of the two-launch path, the same as the two launches with
      :func:`cugemm8.set_pdl` on (benches/RESULTS.md v0.9, v0.12, v0.20).

    Either form takes 2-5x less time than DeepGEMM's ``per_token_cast_to_fp8`` +
    ``fp8_gemm_nt`` pair (same run).

    Any ``m``, ``n`` and ``k`` work for float inputs (the common unaligned
    research case, e.g. 1000 x 1000 x 1000): ``k`` is zero-padded to a
    multiple of 16 by the quantisers and ``n`` to a multiple of 8 here
    (zero rows of ``b``), which changes no scale and adds nothing to the
    product; only the ``[m, n]`` result is returned or written.

    Arguments:
        a: either a float CuPy array ``[m, k]`` (float32 / float16 /
            bfloat16), quantised with :func:`per_token_cast_to_fp8`, or an
            already quantised ``(payload_uint8 [m, k], sfa [m, ceil(k/128)])``
            pair (the GEMM's rules: ``k % 16 == 0``, K-major).
        b: either a float CuPy array ``[n, k]``, quantised with
            :func:`per_block_cast_to_fp8`, or a ``(payload [n, k],
            sfb [ceil(n/128), ceil(k/128)])`` pair (``n % 8 == 0``).
            The two ``k`` are compared after padding to a multiple of 16, so a
            float ``[m, 1000]`` pairs with a quantised ``[n, 1008]`` payload
            made from ``[n, 1000]`` weights.
        out: optional bfloat16 ``[m, n]`` output; allocated when None.
        pow2_scale: power-of-two scales for the operands quantised here
            (keyword-only).
        workspace: fused path only (float ``a``, quantised ``b``): a CuPy
            uint8 1-D C-contiguous array of at least
            :func:`gemm_fp8_workspace_bytes` ``(m, k)`` bytes, 16-byte
            aligned, on the current device, overlapping no operand, that
            receives the quantised ``a`` in the two-kernel form
            (keyword-only; the one-kernel form does not use it).  When None,
            a temporary is allocated per call.  Needed under CUDA-graph
            capture by the two-kernel form (keep it alive as long as the
            graph, and do not share it between launches that may run
            concurrently).  A call with ``out``, a contiguous ``sfb``, and
            either the one-kernel form (any ``k``) or a workspace and
            ``k % 16 == 0`` is cached like the GEMMs' repeated calls.

    Returns:
        ``out``, bfloat16 ``[m, n]``.  When ``out`` is None and ``n % 8 != 0``
        it is a view of an ``[m, ceil(n/8)*8]`` buffer (row stride padded to
        16 bytes).

    Quantised temporaries: a float input is quantised into arrays that live
    only for this call, so under CUDA-graph capture such calls are refused
    (``ValueError``), except on the fused path in its one-kernel form or
    with a ``workspace``: else
    quantise with the cast functions and keep their outputs alive, then
    capture :func:`cugemm8.gemm_fp8_fp8_bf16_nt`.

    Raises:
        TypeError: an operand is neither a float CuPy array nor a
            ``(payload, scale)`` pair of CuPy arrays, or has a wrong dtype.
        ValueError: a shape, stride or alignment rule of the quantisers or of
            the GEMM is broken (the message names the argument); a float
            input (or a padded ``out``) under CUDA-graph capture without a
            ``workspace``; a ``workspace`` that is too small, misaligned,
            not 1-D contiguous, overlapping an operand, or given outside the
            fused path.
        cugemm8.DeviceError: no usable Hopper GPU.
    """
    from . import gemm as _gemm  # imported lazily: quant works without the GEMM module
    key = _fused_key(a, b, out, workspace, pow2_scale, _gemm)
    if _gemm._launch_cached(key):
        return out
    cupy = _device.import_cupy()
    # The GEMM's shape, dtype and layout rules first, so that nothing is
    # quantised (no launch) for a call the GEMM would reject.
    m, k = _operand_shape("a", a, cupy, _gemm)
    n, k_b = _operand_shape("b", b, cupy, _gemm)
    a_pair, b_pair = isinstance(a, (tuple, list)), isinstance(b, (tuple, list))
    # Two float operands must agree exactly; a float operand and a quantised
    # pair agree when the float one pads to the pair's K (its payload was
    # padded the same way by the quantiser).
    same_k = padded_k(k_b) == padded_k(k) if a_pair != b_pair else k_b == k
    if not same_k:
        raise ValueError(f"a is [m, k] = {[m, k]} and b is [n, k] = {[n, k_b]}: k differs")
    k = padded_k(k)
    n_gemm = n if b_pair else -(-n // 8) * 8          # float weights: zero rows up to n % 8 == 0
    _config.check_n_k(n_gemm, k, allow_empty=True)
    # The scales of already quantised pairs, every array's device, and out
    # against every input: all before anything is quantised.
    kb = -(-k // _GROUP)
    arrays = {}
    if a_pair:
        _gemm._check_f32("a scale (sfa)", a[1], (m, kb), cupy)
        arrays.update({"a payload": a[0], "a scale (sfa)": a[1]})
    else:
        arrays["a"] = a
    if b_pair:
        _gemm._check_f32("b scale (sfb)", b[1], (-(-n // _GROUP), kb), cupy)
        arrays.update({"b payload": b[0], "b scale (sfb)": b[1]})
    else:
        arrays["b"] = b
    fused = not a_pair and b_pair and bool(m and n and k)
    if workspace is not None:
        _check_workspace(workspace, m, k, fused, {**arrays, "out": out}, cupy)
    if out is not None:
        if n_gemm == n:
            _gemm._check_out("out", out, (m, n), cupy)
        else:                        # written by a copy from an aligned buffer, not by TMA
            _gemm._check_typed("out", out, "bfloat16", (m, n), cupy)
            _gemm._check_no_self_overlap("out", out, (m, n))
        _gemm._check_placement(out, arrays, cupy)
    else:
        check_on_current_device(arrays, cupy)
    one_kernel = _one_kernel_config(a, n, k, _gemm, b[0]) if fused else None
    if not (a_pair and b_pair) and not (fused and (workspace is not None or one_kernel is not None)):
        refuse_temporary_under_capture(
            "gemm_fp8 quantises its float operands into temporaries",
            "pass workspace=cupy.empty(cugemm8.gemm_fp8_workspace_bytes(m, k), dtype=cupy.uint8) "
            "(kept alive as long as the graph) for float activations with quantised weights, or "
            "quantise before capturing with per_token_cast_to_fp8 / per_block_cast_to_fp8, keep "
            "their outputs alive, and capture gemm_fp8_fp8_bf16_nt on them", cupy)
    if one_kernel is not None:
        return _gemm_fp8_one_kernel(a, b, out, one_kernel, pow2_scale, key, cupy, _gemm)
    if fused:
        return _gemm_fp8_fused(a, b, out, workspace, pow2_scale, key, cupy, _gemm)
    lhs = tuple(a) if a_pair else per_token_cast_to_fp8(a, pow2_scale=pow2_scale)
    if b_pair:
        rhs = tuple(b)
    else:
        w = b
        if n_gemm != n:
            w = cupy.zeros((n_gemm, b.shape[1]), dtype=b.dtype)
            w[:n] = b
        rhs = per_block_cast_to_fp8(w, pow2_scale=pow2_scale)
    if out is not None and n_gemm == n:
        _gemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
        return out
    import ml_dtypes
    full = cupy.empty((m, n_gemm), dtype=ml_dtypes.bfloat16)      # rows padded to n % 8 == 0
    _gemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, full)
    if out is None:
        return full[:, :n]
    out[...] = full[:, :n]
    return out


def gemm_fp8_workspace_bytes(m: int, k: int) -> int:
    """Bytes of the ``workspace`` that :func:`gemm_fp8`'s fused bf16-in path
    needs for activations ``[m, k]``.

    Layout (``k_pad = ceil(k/16)*16``, ``kb = ceil(k_pad/128)``,
    ``m_pad = ceil(m/4)*4``): the e4m3fn payload ``[m, k_pad]`` at byte 0,
    then, at the next multiple of 256 bytes, the float32 scales
    ``[kb, m_pad]`` (MN-major, as :func:`per_token_cast_to_fp8` stores them).

    Raises:
        TypeError: ``m`` or ``k`` not an int.
        ValueError: ``m`` or ``k`` negative.
    """
    for name, v in (("m", m), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    return _workspace_layout(int(m), int(k))[-1]


def _workspace_layout(m: int, k: int) -> tuple:
    """``(k_pad, kb, m_pad, sfa_offset, total_bytes)`` of the fused path's workspace."""
    kp = padded_k(k)
    kb, m_pad = -(-kp // _GROUP), -(-m // 4) * 4
    off = -(-(m * kp) // 256) * 256
    return kp, kb, m_pad, off, off + kb * m_pad * 4


def _check_workspace(ws, m: int, k: int, fused: bool, others: dict, cupy) -> None:
    if not fused:
        raise ValueError("workspace is used only by gemm_fp8's fused path (a float array a with a "
                         "quantised (payload, sfb) pair b and m, n, k > 0); pass workspace=None here")
    check_device_array("workspace", ws, cupy)
    if ws.dtype != np.uint8:
        raise TypeError(f"workspace must be uint8, got dtype {ws.dtype}")
    if ws.ndim != 1 or not ws.flags.c_contiguous:
        raise ValueError(f"workspace must be a 1-D C-contiguous array, got shape {ws.shape} "
                         f"strides {ws.strides}")
    need = _workspace_layout(m, k)[-1]
    if ws.size < need:
        raise ValueError(f"workspace has {ws.size} bytes; a = [m, k] = {[m, k]} needs "
                         f"gemm_fp8_workspace_bytes({m}, {k}) = {need}")
    if ws.data.ptr % 16:
        raise ValueError(f"workspace base address {ws.data.ptr:#x} must be 16-byte aligned (TMA)")
    check_on_current_device({"workspace": ws}, cupy)
    from .gemm import _first_overlap
    name = _first_overlap((ws.data.ptr, ws.data.ptr + need), others)
    if name is not None:
        raise ValueError(f"workspace overlaps {name} in memory")


def _fused_key(a, b, out, workspace, pow2_scale, gemm):
    """The repeated-call cache key of a fused call (an out, no copies; a
    workspace, or none for the one-kernel form), else None: the GEMMs' own
    key (:func:`cugemm8.gemm._fast_key`: device, SM budget, every array's
    signature, ``pow2_scale`` by type and value), with ``(a, workspace)``
    (``(a, a)`` without one) in the place of the quantised pair.  Only
    launches that hold no temporary are remembered under it (the callers)."""
    return gemm._fast_key("gemm_fp8 fused", (a, a if workspace is None else workspace), b, out, pow2_scale,
                          workspace is None)


#: Rows of float activations up to which :func:`gemm_fp8`'s fused path
#: quantises them inside a TMA GEMM (one kernel; cuda_src/quant_a.cuh; the
#: warp-MMA pick's rule is :func:`cugemm8._config.warp_mma_one_kernel_max_groups`) instead
#: of in a per-token prologue kernel: by x's element size, ``((min BLOCK_N,
#: max rows), ...)`` of the GEMM's pick (for a swap-AB pick its weight tile,
#: the WGMMA's 64-row waves), the first match deciding, none meaning never
#: (:func:`one_kernel_max_m`).  Each of the
#: three converter warps of a CTA must quantise a stage's rows (about 800 SM
#: cycles for up to 2 rows of bf16, 1000 for 4, 1850 for 8, plus 400 of
#: barriers: tools/perf/convert_probe.py) within three of the math
#: warpgroup's K blocks, and a K block of a narrow tile is short (about 340
#: cycles at BLOCK_N = 32, 420 at 56, 800 at 192).  Measured on the H200
#: (benches/bench_e2e.py, benches/RESULTS.md v0.14), one kernel against the
#: two-kernel form: BLOCK_N 192 and 128 1.11-1.17x at M <= 4 and 1.05-1.17x at
#: M = 8; 56 1.16-1.22x at M <= 4, 0.84x at 8; 32 0.78-0.96x at every M.  The
#: other widths are placed by those (48-120 like 56, 128 and up like 128); the
#: swap-AB pick at 4096 x 7168 (8x64, K split over a pair: about 700 cycles
#: per K block) like 56, measured in benches/RESULTS.md v0.17.
#: float32 x takes twice the steps per row (one row per step, not two), so
#: half the rows (estimated from the probe, not measured end to end).  The
#: kernel's own limit is _config.QUANT_A_MAX_ROWS (8).
ONE_KERNEL_MAX_M = {2: ((128, 8), (48, 4)), 4: ((128, 4), (48, 2))}


def one_kernel_max_m(block_n: int, itemsize: int) -> int:
    """Rows of float activations of ``itemsize`` bytes up to which the fused
    path quantises them inside a GEMM whose pick has ``block_n`` columns
    (:data:`ONE_KERNEL_MAX_M`); 0: never."""
    for min_block_n, rows in ONE_KERNEL_MAX_M.get(itemsize, ()):
        if block_n >= min_block_n:
            return min(rows, _config.QUANT_A_MAX_ROWS)
    return 0


def one_kernel_rows(twin, itemsize: int, k: int) -> int:
    """Rows of float activations of ``itemsize`` bytes up to which the fused
    path runs ``twin`` (a :func:`cugemm8._config.quant_a_config` result) at
    K = ``k``: for the warp-MMA kernel the most rows that give its busiest
    warp at most :func:`cugemm8._config.warp_mma_one_kernel_max_groups`
    groups to quantise (measured, see there), else :func:`one_kernel_max_m`
    of the TMA twin's BLOCK_N."""
    if twin.warp_mma:
        rows = 0
        while (rows < min(twin.block_m, _config.WARP_MMA_MAX_M) and _config.warp_mma_quant_groups_per_warp(
                twin, rows + 1, k) <= _config.warp_mma_one_kernel_max_groups(twin)):
            rows += 1
        return rows
    return one_kernel_max_m(twin.block_n, itemsize)


def _one_kernel_config(x, n: int, k: int, gemm, b=None):
    """The configuration of :func:`gemm_fp8`'s one-kernel form for float
    activations ``x [m, k_x]`` (validated; ``k`` = padded_k(k_x)) against
    quantised weights ``[n, k]``, or None when that form does not apply: a
    layout the kernel cannot read in place (the last dimension not
    contiguous, the base or row stride not 16-byte aligned; for the
    warp-MMA kernel, whose 16-byte loads are not bounds-checked as TMA's
    are, also rows that are not whole 16-byte pieces (``k_x * itemsize %
    16``), or a row stride of x or of the weights ``b`` (the payload, when
    given) of 4 GiB or more), a GEMM pick without
    such a form (:func:`cugemm8._config.quant_a_config`: the warp-MMA pick
    has one for 16-bit activations), or more rows than
    :func:`one_kernel_max_m` gives a TMA pick.  Broadcast or reversed rows
    (a zero or negative row stride) take the two-kernel form, whose
    quantiser reads them.  The pick is the normal GEMM's
    own (tuned or heuristic), so the output bits are those of
    ``per_token_cast_to_fp8`` followed by :func:`cugemm8.gemm_fp8_fp8_bf16_nt`."""
    m, item = x.shape[0], x.itemsize
    if not 1 <= m <= min(_config.QUANT_A_MAX_ROWS, max((r for _, r in ONE_KERNEL_MAX_M.get(item, ())), default=0)):
        return None                     # (before choosing a configuration)
    if (x.data.ptr % 16 or (x.shape[1] > 1 and x.strides[1] != item)
            or (m > 1 and (x.strides[0] <= 0 or x.strides[0] % 16))):
        return None                     # (TMA: positive 16-byte multiples; broadcast / reversed rows: two kernels)
    pick = gemm._select("normal", m, n, k, 1)
    cfg = _config.quant_a_config(pick, k, item, num_sms=_device.get_num_sms() if pick.warp_mma else None)
    if cfg is None or m > one_kernel_rows(cfg, item, k):
        return None
    if cfg.warp_mma and not gemm._warp_mma_operands_fit(x, None, b, m, 1, x.dtype.name):
        return None                     # (32-bit stride arguments; reads past a row's end)
    return cfg


def _fused_weights_and_out(b, out, m: int, cupy, gemm):
    """``(b payload, sfb, out)`` of both fused forms: the validated weight pair
    in the GEMM's layout (``sfb`` converted only if it must be) and ``out``,
    a fresh bfloat16 ``[m, n]`` array when None."""
    b_q = gemm._as_fp8("b payload", b[0], 2, cupy)
    sfb = gemm._prepare_sfb(b[1], cupy)
    if out is None:
        import ml_dtypes
        out = cupy.empty((m, b_q.shape[0]), dtype=ml_dtypes.bfloat16)
    return b_q, sfb, out


def _gemm_fp8_one_kernel(x, b, out, cfg, pow2_scale, key, cupy, gemm):
    """The one-kernel form of :func:`gemm_fp8`'s fused path (see
    :func:`_one_kernel_config`): validated float ``x`` [m, k_x], quantised
    ``b`` pair, configuration ``cfg``.  Holds no temporary, so it captures
    in CUDA graphs without a workspace."""
    check_quant_options(_DEFAULT_MIN_AMAX, pow2_scale)
    m, kp = x.shape[0], padded_k(x.shape[1])
    b_q, sfb, out = _fused_weights_and_out(b, out, m, cupy, gemm)
    n = b_q.shape[0]
    flags = gemm.FLAG_A_POW2_SCALE if pow2_scale else 0
    launch = gemm._prepare_launch(cfg, "normal", n, kp, 1, m, m, x, None, b_q, sfb, out, None, 1, flags,
                                  x_dtype=x.dtype.name)
    launch()
    if sfb is b[1]:
        gemm._remember(key, launch, False)
    return out


def _gemm_fp8_fused(x, b, out, workspace, pow2_scale, key, cupy, gemm):
    """The fused bf16-in path of :func:`gemm_fp8` (see there): validated
    float ``x`` [m, k], quantised ``b`` pair, ``m, n, k > 0``."""
    min_amax_f32 = check_quant_options(_DEFAULT_MIN_AMAX, pow2_scale)
    xk = _in_place_or_copy(_pad_k("a", x, cupy), cupy)
    m, kp = xk.shape
    _, kb, m_pad, off, total = _workspace_layout(m, kp)
    ws = workspace if workspace is not None else cupy.empty(total, dtype=np.uint8)
    a_q = ws[:m * kp].reshape(m, kp)
    sfa_buf = ws[off:total].view(np.float32).reshape(1, kb, m_pad)
    sfa = sfa_buf[0].T[:m]                       # [m, kb], strides (4, 4 * m_pad)
    b_q, sfb, out = _fused_weights_and_out(b, out, m, cupy, gemm)
    n = b_q.shape[0]
    cfg = gemm._select("normal", m, n, kp, 1)
    # Every descriptor is encoded before the first launch.  The warp-MMA
    # kernel may stream its first batch of B while the quantiser runs (its
    # predecessor here writes only the workspace: ptx/griddep.cuh's rule).
    flags = gemm.FLAG_B_BEFORE_WAIT if cfg.warp_mma else 0
    gemm_launch = gemm._prepare_launch(cfg, "normal", n, kp, 1, m, m, a_q, sfa, b_q, sfb, out, None, 1, flags)
    quant_launch = _launch_per_token(xk, a_q[None], sfa_buf, min_amax_f32, bool(pow2_scale), cupy,
                                     launch=False)

    def run():
        quant_launch()
        gemm_launch(pdl=True)
    run()
    if xk is x and sfb is b[1] and workspace is not None:
        gemm._remember(key, run, False)
    return out


def _operand_shape(name: str, x, cupy, gemm) -> tuple:
    """Validate one operand of :func:`gemm_fp8` without launching anything
    and return its 2-D shape: a float CuPy array (the quantiser's rules), or
    a ``(payload, scale)`` pair whose payload follows the GEMM's rules (its
    scale is checked by the caller, once the shapes are known)."""
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise TypeError(f"{name} must be a float array or a (payload, scale) pair, "
                            f"got a sequence of length {len(x)}")
        payload = gemm._as_fp8(f"{name} payload", x[0], 2, cupy)
    else:
        _check_input(name, x, cupy)      # a float CuPy array, or the specific TypeError / ValueError
        payload = x
    if payload.ndim != 2:
        raise ValueError(f"{name} must be 2-D [rows, k], got shape {payload.shape}")
    return tuple(payload.shape)
