"""FP8 x FP8 -> BF16 GEMMs with DeepSeek-V3 fine-grained scaling (public ops).

Math (DeepSeek-V3 technical report §3.3; DeepGEMM README)::

    D[m, n] = sum_kb SFA[m, kb] * SFB[n // 128, kb] * sum_{k in kb} A[m, k] * B[n, k]

with 128-wide K blocks ``kb``.  Each op validates every argument (raising
``TypeError`` / ``ValueError`` that name the argument and the rule) before it
launches anything, picks a configuration with the deterministic heuristics of
:mod:`cugemm8._config`, and launches the persistent warp-specialised kernel of
``cuda_src/fp8_gemm_1d2d.cuh`` on CuPy's current stream, without a host-device
synchronisation.

Common operand rules (all ops)
------------------------------
* FP8 payloads ``a``/``b`` are CuPy ``uint8`` arrays of e4m3fn bit patterns
  (an ``ml_dtypes.float8_e4m3fn`` view is accepted too), **K-major**: the last
  stride is 1 byte, every other stride a positive multiple of 16 bytes below
  2^40 (no broadcast or reversed views), the base address 16-byte aligned
  (TMA rules, CUDA driver ``cuTensorMapEncodeTiled``).
* ``k`` is a multiple of 16, at most 382,464
  (:func:`cugemm8._config.max_k`: each math warp keeps the tile's B scales
  for the whole K in shared memory); a K tail that is not a multiple of 128
  is zero-filled by TMA inside the last K block.  ``n`` is a multiple of 8.
  ``m`` may be anything ``>= 0``.
* Degenerate sizes (DeepGEMM's conventions): ``m == 0``, ``n == 0`` (and,
  masked, ``g == 0`` or ``m_max == 0``) launch nothing; ``k == 0`` writes
  the empty sum, zeros, into the valid region of ``out`` (the contiguous
  layout's violating rows NaN, as with any ``k``) with one small elementwise
  kernel and no GEMM.  The low-level ops keep the ``k % 16`` rule; the
  quantisers and :func:`cugemm8.gemm_fp8` accept any ``k``.
* ``sfa`` is float32 ``[..., m, ceil(k/128)]``.  Its MN-major TMA-aligned
  layout (see :mod:`cugemm8.layout`) is used as is; any other strides are
  converted on the GPU inside the call (one extra copy kernel and a temporary
  allocation) - call :func:`cugemm8.get_col_major_tma_aligned_tensor` once to
  avoid paying that per call.  Under CUDA-graph capture such a conversion is
  refused with ``ValueError``: the graph would keep the address of a
  temporary freed when the call returns (a use after free on replay).
* ``sfb`` is float32 ``[..., ceil(n/128), ceil(k/128)]``; a non-contiguous
  ``sfb`` is copied to a contiguous one (values by logical index, never
  reinterpreted), which is refused under CUDA-graph capture like the ``sfa``
  conversion.
* ``out`` is a CuPy bfloat16 array with a contiguous last dimension and
  16-byte aligned rows (row stride below 2^33 bytes); its elements must not
  overlap each other or any input.  Only ``out``'s valid region is written.
* All arrays live on the current CuPy device.

Repeated calls
--------------
A call whose arrays have the same (address, shape, strides, dtype) as an
earlier successful call, on the same device and SM budget, and that needed no
scale conversion, reuses that call's launcher (kernel, grid and tensor maps)
without validating again: every check depends only on those properties.  A
repeated call costs about 2 us of Python on top of CuPy's launch
(``benches/bench_host.py``).  :func:`clear_launch_cache` empties the cache.
"""
from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

import numpy as np

from . import _config, _device, _env, _jit, _tma, _tuned
from ._launch import Launcher
from ._checks import check_device_array, check_on_current_device, refuse_temporary_under_capture
from .layout import get_col_major_tma_aligned_tensor, is_tma_aligned_mn_major

if TYPE_CHECKING:
    from typing import Literal

    import cupy

    from ._config import GemmConfig

_HEADER = "fp8_gemm_1d2d.cuh"
_SWAP_AB_HEADER = "fp8_gemm_swap_ab.cuh"
_WARP_MMA_HEADER = "fp8_gemm_warp_mma.cuh"


def _header_of(kernel_name: str) -> str:
    """The ``cuda_src`` header that defines ``kernel_name`` (a name from
    :func:`_kernel_name`): the warp-MMA kernel's, the swap-AB kernel's or
    the 1D2D kernel's.  Every place that compiles GEMM kernels ahead of a
    launch (tune, warmup, the benches and probes) goes through this."""
    if "fp8_gemm_warp_mma_kernel" in kernel_name:
        return _WARP_MMA_HEADER
    return _SWAP_AB_HEADER if "fp8_gemm_swap_ab_kernel" in kernel_name else _HEADER


_GEMM_TYPE = {"normal": 0, "contiguous": 1, "masked": 2}
_NULL = np.uint64(0)
_INT32_MAX = 2 ** 31 - 1


# ----------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------

def _as_fp8(name: str, x, ndim: int, cupy):
    check_device_array(name, x, cupy)
    if x.dtype != np.uint8:
        if x.dtype.itemsize == 1 and x.dtype.name == "float8_e4m3fn":
            x = x.view(np.uint8)
        else:
            raise TypeError(f"{name} must hold e4m3fn bits as uint8 (or a float8_e4m3fn view), "
                            f"got dtype {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    if x.size == 0:
        return x          # nothing is read from an empty operand
    if x.shape[-1] % 16:
        # Checked before the strides: with such a k no copy could make them legal.
        raise ValueError(f"{name} has k = {x.shape[-1]}; k must be a multiple of 16 "
                         f"(16-byte FP8 rows for TMA)")
    if x.shape[-1] > 1 and x.strides[-1] != 1:
        raise ValueError(f"{name} must be K-major (last stride 1 byte), got strides {x.strides}")
    _check_tma_layout(name, x)
    return x


_TMA_MAX_STRIDE = 2 ** 40     # bytes, exclusive (cuTensorMapEncodeTiled)
_TMA_MAX_EXTENT = 2 ** 32     # elements per dimension


def _check_tma_layout(name: str, x) -> None:
    """The TMA rules for an array read or written through a tensor map: base
    16-byte aligned; every outer stride a positive multiple of 16 bytes below
    2^40 (no broadcast / stride-0 rows, no negative strides); extents <= 2^32
    (CUDA driver API, cuTensorMapEncodeTiled)."""
    for i, s in enumerate(x.strides[:-1]):
        if x.shape[i] <= 1:
            continue
        if s <= 0 or s % 16:
            raise ValueError(f"{name} stride {s} B of dimension {i} must be a positive multiple of "
                             f"16 bytes (TMA; broadcast or reversed views need a copy), got strides {x.strides}")
        if s >= _TMA_MAX_STRIDE:
            raise ValueError(f"{name} stride {s} B of dimension {i} must be below 2^40 bytes (TMA)")
    for i, n in enumerate(x.shape):
        if n > _TMA_MAX_EXTENT:
            raise ValueError(f"{name} extent {n} of dimension {i} exceeds 2^32 (TMA)")
    if x.data.ptr % 16:
        raise ValueError(f"{name} base address {x.data.ptr:#x} must be 16-byte aligned (TMA)")


def _check_typed(name: str, x, dtype_name: str, shape: tuple, cupy) -> None:
    """``x`` is a CuPy array of dtype ``dtype_name`` and exactly ``shape``."""
    check_device_array(name, x, cupy)
    if x.dtype.name != dtype_name:
        raise TypeError(f"{name} must be {dtype_name}, got {x.dtype}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(x.shape)}")


def _check_f32(name: str, x, shape: tuple, cupy):
    _check_typed(name, x, "float32", shape, cupy)


def _check_out(name: str, x, shape: tuple, cupy):
    _check_typed(name, x, "bfloat16", shape, cupy)
    if x.size == 0:
        return
    if shape[-1] > 1 and x.strides[-1] != 2:
        raise ValueError(f"{name} must have a contiguous last dimension, got strides {x.strides}")
    _check_tma_layout(name, x)
    if x.ndim >= 2 and x.shape[-2] > 1 and x.strides[-2] // 2 >= 2 ** 32:
        raise ValueError(f"{name} row stride {x.strides[-2]} B must be below 2^33 B "
                         f"(the kernel takes it as a 32-bit element count)")
    _check_no_self_overlap(name, x, shape)


def _check_no_self_overlap(name: str, x, shape: tuple) -> None:
    """Distinct elements of an output must not share memory (that would be
    a write race): no zero, negative or too small outer strides."""
    if x.size == 0:
        return
    if shape[-1] > 1 and x.strides[-1] <= 0:
        raise ValueError(f"{name} stride {x.strides[-1]} B of its last dimension makes its elements "
                         f"overlap, got strides {x.strides}")
    inner = 2 * shape[-1]
    for i in range(x.ndim - 2, -1, -1):
        if x.shape[i] > 1 and x.strides[i] < inner:
            raise ValueError(f"{name} stride {x.strides[i]} B of dimension {i} makes its elements overlap "
                             f"(needs >= {inner} B), got strides {x.strides}")
        inner = max(inner, x.strides[i] * x.shape[i]) if x.shape[i] > 1 else inner


def _check_int32(name: str, x, shape: tuple, cupy):
    _check_typed(name, x, "int32", shape, cupy)
    if x.size and not x.flags.c_contiguous:
        raise ValueError(f"{name} must be contiguous, got strides {x.strides}")
    if x.size and x.data.ptr % 4:
        # The kernel reads it with 4-byte loads; a misaligned address faults.
        raise ValueError(f"{name} base address {x.data.ptr:#x} must be 4-byte aligned")


def _span(x):
    """[lo, hi) byte range an array can touch."""
    lo = hi = x.data.ptr
    for n, s in zip(x.shape, x.strides):
        if n == 0:
            return (x.data.ptr, x.data.ptr)
        if s >= 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    return lo, hi + x.itemsize


def _first_overlap(span: tuple, arrays: dict):
    """The name of the first array in ``arrays`` whose bytes meet the byte
    range ``span`` = [lo, hi), or None."""
    lo, hi = span
    for name, x in arrays.items():
        if x is None or x.size == 0:
            continue
        xlo, xhi = _span(x)
        if xlo < hi and lo < xhi:
            return name
    return None


def _check_no_alias(out, inputs: dict, out_name: str = "out"):
    name = _first_overlap(_span(out), inputs)
    if name is not None:
        raise ValueError(f"{out_name} overlaps {name} in memory; the output must not alias an input")


def _pair(name: str, pair):
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"{name} must be a (payload, scale) pair, got {type(pair).__name__}")
    return pair


def _unpack(lhs, rhs, a_ndim: int, b_ndim: int, cupy):
    """``(a, sfa, b, sfb)`` from the two operand pairs, payloads checked."""
    a, sfa = _pair("lhs", lhs)
    b, sfb = _pair("rhs", rhs)
    return (_as_fp8("lhs[0] (a)", a, a_ndim, cupy), sfa, _as_fp8("rhs[0] (b)", b, b_ndim, cupy), sfb)


def _check_placement(out, inputs: dict, cupy, out_name: str = "out") -> None:
    """All arrays on the current device; ``out`` (called ``out_name`` in
    the messages) overlapping none of the inputs."""
    check_on_current_device({**inputs, out_name: out}, cupy)
    _check_no_alias(out, inputs, out_name)


def _prepare_sfa(sfa, cupy, name: str = "sfa", fix: str | None = None):
    """``sfa`` as the kernel reads it (converted when it is not; refused
    under capture with ``fix``, by default the forward ops' advice)."""
    if is_tma_aligned_mn_major(sfa):
        return sfa
    refuse_temporary_under_capture(
        f"{name} is not in the MN-major TMA-aligned layout the kernel reads, so this call would convert "
        "it into a temporary",
        fix or (f"convert it once before capturing with {name} = cugemm8.get_col_major_tma_aligned_tensor("
                f"{name}) (the forward GPU quantisers already return that layout) and capture the call on "
                "the result"), cupy)
    return get_col_major_tma_aligned_tensor(sfa)


def _prepare_sfb(sfb, cupy):
    if sfb.flags.c_contiguous and sfb.data.ptr % 4 == 0:
        return sfb
    refuse_temporary_under_capture(
        "sfb is not C-contiguous, so this call would copy it into a temporary",
        "make it contiguous once before capturing (sfb = cupy.ascontiguousarray(sfb)) and capture "
        "the call on the result", cupy)
    return cupy.ascontiguousarray(sfb)


# ----------------------------------------------------------------------------
# launch
# ----------------------------------------------------------------------------

#: The GEMM kernels' kAIn (cuda_src/quant_a.cuh) of float activations quantised in the kernel
#: (1 + quant.cuh InDtype), by dtype name; 0 (kAInFp8, the default template
#: argument, left out of the name) is an FP8 A loaded by TMA.
A_IN_CODES = {"float32": 1, "float16": 2, "bfloat16": 3}
#: TMA data types of those activations (cugemm8._tma)
_X_TMA_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def _kernel_name(cfg: "_config.GemmConfig", n: int, k: int, gemm_type: int, num_groups: int,
                 x_dtype: str | None = None) -> str:
    a_in = f", {A_IN_CODES[x_dtype]}" if x_dtype is not None else ""
    if cfg.warp_mma:
        if x_dtype == "float32":
            raise ValueError(f"config {cfg} (warp_mma) quantises 16-bit activations only, not {x_dtype}")
        return (f"cugemm8::fp8_gemm_warp_mma_kernel<{n}, {k}, {cfg.block_m // 8}, {_config.WARP_MMA_ROW_TILES}, "
                f"{cfg.num_k_splits}, {cfg.block_n // 16}, {cfg.num_stages}{a_in}>")
    if cfg.swap_ab:
        return (f"cugemm8::fp8_gemm_swap_ab_kernel<{n}, {k}, {cfg.block_m}, {cfg.block_n}, "
                f"{cfg.num_stages}, {cfg.num_k_splits}{a_in}>")
    return (f"cugemm8::fp8_gemm_1d2d_kernel<{n}, {k}, {cfg.block_m}, {cfg.block_n}, {cfg.num_stages}, "
            f"{cfg.num_multicast}, {'true' if cfg.multicast_on_a else 'false'}, {cfg.swizzle_d}, "
            f"{gemm_type}, {num_groups}, {cfg.num_k_splits}, {cfg.num_math_warpgroups}{a_in}>")


_printed: set = set()


_tuned_envs: dict = {}


def _tuned_environment(device_id: int, num_sms: int) -> dict:
    """:func:`cugemm8._tuned.environment` of this device and SM budget,
    computed once (cleared by :func:`reload_tuned_configs`); the 1D2D and
    1D1D ops' tuned lookups share it."""
    env = _tuned_envs.get((device_id, num_sms))
    if env is None:
        env = _tuned_envs[(device_id, num_sms)] = _tuned.environment(num_sms, device_id)
    return env


def _choose(kind: str, m: int, n: int, k: int, num_groups: int, device_id: int, num_sms: int):
    """(config, source): a matching tuned entry of this device and SM budget
    (:mod:`cugemm8._tuned`, written by ``cugemm8 tune``) when there is one,
    else the heuristic's pick; source is ``'tuned'`` or ``'heuristic'``."""
    if _tuned.tuned_path() is not None and _tuned.has_entries():
        cfg = _tuned.lookup(kind, m, n, k, num_groups, _tuned_environment(device_id, num_sms))
        if cfg is not None:
            return cfg, "tuned"
    # The warp-MMA kernel's grid is not persistent: only on the whole device.
    return _config.select_config(kind, m, n, k, num_groups=num_groups, num_sms=num_sms,
                                 warp_mma=_device.is_whole_device(device_id)), "heuristic"


def _select(kind: str, m: int, n: int, k: int, num_groups: int):
    device_id = _device.require_hopper()
    cfg, source = _choose(kind, m, n, k, num_groups, device_id, _device.get_num_sms(device_id))
    if _env.PRINT_CONFIGS:
        key = (kind, m, n, k, num_groups, cfg)
        if key not in _printed:
            _printed.add(key)
            print(f"[cugemm8] {kind} m={m} n={n} k={k} groups={num_groups}: {cfg} ({source})", file=sys.stderr)
    return cfg


def _map_stride(x, dim: int, packed: int) -> int:
    """Byte stride of dimension ``dim`` for a tensor map: the array's own when
    that dimension has more than one element (validated already), else the
    packed value (any legal stride serves an extent of 1), kept inside the
    TMA rules (a positive multiple of 16 below 2^40)."""
    if x is not None and x.shape[dim] > 1:
        return x.strides[dim]
    return max(16, min(packed, _TMA_MAX_STRIDE - 16))


def _scale_pitch(sf, rows: int, kb: int) -> int:
    """Elements between consecutive K blocks of an MN-major TMA-aligned scale
    tensor ``sf [..., rows, kb]`` (its last stride; with one K block any
    legal pitch, so rows rounded up to 4: 16-byte rows for TMA)."""
    return sf.strides[-1] // 4 if kb > 1 else -(-rows // 4) * 4


def _prepare_launch(cfg, kind: str, n: int, k: int, num_groups: int, shape_m: int, rows: int,
                    a, sfa, b, sfb, out, layout, groups_a: int, flags: int = 0, x_dtype: str | None = None):
    """Encode descriptors; return a :class:`cugemm8._launch.Launcher` (it
    launches on CuPy's current stream at call time, as a programmatic
    dependent launch when :func:`cugemm8.set_pdl` is on or it is called with
    ``pdl=True``).

    ``rows`` is the per-group row extent of A / SFA / D (m, m_sum or m_max)
    and ``groups_a`` their group count (1 unless masked); ``flags`` extra
    kernel flag bits (``kFlagBEvictFirst`` is added by :func:`b_evict_first`'s
    rule).  With ``x_dtype`` (a key of :data:`A_IN_CODES`), ``a`` is not an
    FP8 payload but the float activations ``[m, k_x]`` (``k_x`` padding to
    ``k``; a contiguous last dimension, 16-byte aligned base and row stride)
    that the kernel quantises itself (``cfg`` from
    :func:`cugemm8._config.quant_a_config`), and ``sfa`` is None.
    """
    kb = -(-k // 128)
    if cfg.warp_mma and not _warp_mma_operands_fit(a, sfa, b, rows, kb, x_dtype):
        if x_dtype is not None:       # (gemm_fp8 takes two kernels there: quant._one_kernel_config)
            raise ValueError(f"config {cfg} (warp_mma) quantising {x_dtype} activations takes strides below "
                             f"4 GiB and rows of whole 16-byte pieces, not [m, k_x] = {list(a.shape)}")
        # Rows 4 GiB apart or more (legal for TMA, whose strides reach 2^40):
        # the persistent pick, whose tensor maps take them.
        cfg = _config.select_config(kind, rows, n, k, num_groups=num_groups, num_sms=_device.get_num_sms(),
                                    warp_mma=False)
        flags &= ~FLAG_B_BEFORE_WAIT
    if cfg.warp_mma:
        return _prepare_warp_mma(cfg, kind, n, k, num_groups, shape_m, rows, a, sfa, b, sfb, out, x_dtype, flags)
    if flags & FLAG_B_BEFORE_WAIT:
        raise ValueError(f"config {cfg}: only the warp-MMA kernel loads B before its grid-dependency wait")
    if cfg.swap_ab and (kind != "normal" or num_groups != 1):
        raise ValueError(f"config {cfg} (swap_ab) runs the normal GEMM only, not kind {kind!r}")
    if cfg.swap_ab and x_dtype is not None and cfg.block_m != _config.QUANT_A_MAX_ROWS:
        raise ValueError(f"config {cfg} (swap_ab) quantises {x_dtype} activations only with a token tile "
                         f"of {_config.QUANT_A_MAX_ROWS} (cugemm8._config.quant_a_config)")
    if b_evict_first(rows, cfg.block_m, k):
        flags |= FLAG_B_EVICT_FIRST
    name = _kernel_name(cfg, n, k, _GEMM_TYPE[kind], num_groups, x_dtype)
    kern = _jit.get_kernel(_header_of(name), name, max_dynamic_smem=cfg.smem_bytes)

    box_m = a_box_rows(rows, cfg.block_m)
    if x_dtype is None:
        a_row = _map_stride(a, -2, k)
        a_grp = _map_stride(a, 0, a_row * rows) if a.ndim == 3 else _map_stride(None, 0, a_row * rows)
        tmap_a = _tma.make_descriptor("u8", a.data.ptr, (k, rows, groups_a), (a_row, a_grp),
                                      (128, box_m, 1), swizzle=128)
    else:
        # The activations' own K (the tail past it reads as zeros, as the
        # per-token cast pads it); no swizzle: the kernel's converter warps
        # read the box row by row (cuda_src/quant_a.cuh).
        a_row = _map_stride(a, -2, -(-a.shape[1] * a.itemsize // 16) * 16)
        tmap_a = _tma.make_descriptor(_X_TMA_DTYPES[x_dtype], a.data.ptr, (a.shape[1], rows, 1),
                                      (a_row, _map_stride(None, 0, a_row * rows)), (128, box_m, 1),
                                      swizzle=0)
    b_row = _map_stride(b, -2, k)
    b_grp = _map_stride(b, 0, b_row * n) if b.ndim == 3 else _map_stride(None, 0, b_row * n)
    tmap_b = _tma.make_descriptor("u8", b.data.ptr, (k, n, num_groups if b.ndim == 3 else 1),
                                  (b_row, b_grp), (128, cfg.block_n, 1), swizzle=128)
    if sfa is None:
        tmap_sfa = _tma.NULL_DESCRIPTOR          # A's scales come from the kernel's own quantisation
    else:
        m_pad = _scale_pitch(sfa, rows, kb)
        s_grp = _map_stride(sfa, 0, m_pad * kb * 4) if sfa.ndim == 3 else _map_stride(None, 0, m_pad * kb * 4)
        tmap_sfa = _tma.make_descriptor("f32", sfa.data.ptr, (rows, kb, groups_a),
                                        (m_pad * 4, s_grp), (-(-box_m // 4) * 4, 1, 1),
                                        swizzle=0, l2_256=False)
    if out.ndim == 3 and out.shape[-2] == 1 and out.shape[0] > 1:
        # One row per group: the kernel's row stride is the group stride.
        d_row = out.strides[0]
    else:
        d_row = _map_stride(out, -2, n * 2)
    d_grp = _map_stride(out, 0, d_row * rows) if out.ndim == 3 else _map_stride(None, 0, d_row * rows)
    if cfg.swap_ab:
        # The swap-AB kernel stores D element by element (no tensor map); a
        # producer warp and, quantising x itself, three converter warps.
        tmap_d = _tma.NULL_DESCRIPTOR
        threads = 160 if x_dtype is None else 256
    else:
        d_cols = cfg.swizzle_d // 2 if cfg.swizzle_d else cfg.block_n
        tmap_d = _tma.make_descriptor("bf16", out.data.ptr, (n, rows, groups_a),
                                      (d_row, d_grp), (d_cols, 64, 1),
                                      swizzle=cfg.swizzle_d, l2_256=False)
        threads = 128 * (cfg.num_math_warpgroups + 1)
    # Raw device addresses, not the arrays: a cached launcher (see _fast_key)
    # must not keep the caller's memory alive.
    args = (np.uint32(shape_m), np.uint32(box_m), np.uint32(flags), np.uint64(sfb.data.ptr),
            np.uint64(layout.data.ptr) if layout is not None else _NULL, np.uint64(out.data.ptr),
            np.uint32(d_row // 2), tmap_a, tmap_b, tmap_sfa, tmap_d)
    return Launcher(kern, (cfg.num_sms,), (threads,), args, cfg.smem_bytes)


def _warp_mma_operands_fit(a, sfa, b, rows: int, kb: int, x_dtype: str | None = None) -> bool:
    """Whether the warp-MMA kernel can take these operands: its 32-bit
    stride arguments hold A's and B's row strides (bytes) and SFA's K-block
    pitch (elements) (``sfa`` or ``b`` None: not checked), and, with float
    activations ``a`` (``x_dtype``), their rows are whole 16-byte pieces
    (its 16-byte loads are not bounds-checked as TMA's are)."""
    limit = 2 ** 32
    a_row = a.strides[0] if rows > 1 else 0           # one row: its stride is not passed
    return (a_row < limit and (b is None or b.strides[0] < limit)
            and (sfa is None or _scale_pitch(sfa, rows, kb) < limit)
            and (x_dtype is None or a.shape[1] * a.itemsize % 16 == 0))


def _prepare_warp_mma(cfg, kind, n, k, num_groups, shape_m, rows, a, sfa, b, sfb, out, x_dtype, flags=0):
    """:func:`_prepare_launch` for a warp-MMA config (cuda_src/fp8_gemm_warp_mma.cuh):
    raw addresses and strides, no tensor maps.  The operands' layouts are
    the TMA kernels' (validated already: 16-byte aligned rows, MN-major
    TMA-aligned ``sfa``, C-contiguous ``sfb``).  ``flags``: 0 or
    :data:`FLAG_B_BEFORE_WAIT` (gemm_fp8's two-kernel fused path only).
    With ``x_dtype`` (16-bit), ``a`` is the float activations ``[m, k_x]``
    (16-byte aligned base and rows, ``k_x`` padding to ``k``) that the
    kernel quantises itself, ``sfa`` is None, and ``flags`` may hold
    :data:`FLAG_A_POW2_SCALE`."""
    form = f"warp_mma, {x_dtype} in" if x_dtype is not None else "warp_mma"
    allowed = FLAG_A_POW2_SCALE if x_dtype is not None else FLAG_B_BEFORE_WAIT
    if flags & ~allowed:
        raise ValueError(f"config {cfg} ({form}) takes no kernel flags but {allowed}, got {flags}")
    if kind != "normal" or num_groups != 1:
        raise ValueError(f"config {cfg} (warp_mma) runs the normal GEMM only, not kind {kind!r}")
    if a.ndim != 2:
        raise ValueError(f"config {cfg} (warp_mma) takes a 2-D A, got {a.ndim}-D")
    grid = _config.warp_mma_grid(n, cfg.block_n)
    if cfg.num_sms != grid:
        raise ValueError(f"config {cfg} (warp_mma) must launch one CTA per {cfg.block_n} rows of n = {n}: "
                         f"num_sms {grid}, not {cfg.num_sms}")
    if not 1 <= shape_m <= cfg.block_m:
        raise ValueError(f"config {cfg} (warp_mma) takes 1 ... {cfg.block_m} rows, not m = {shape_m}")
    need = _config.warp_mma_smem_size(cfg.block_m, cfg.block_n, cfg.num_k_splits, k if x_dtype else None)
    if cfg.smem_bytes != need:
        raise ValueError(f"config {cfg} ({form}) needs smem_bytes {need} (cugemm8._config.quant_a_config "
                         f"gives the form that quantises x), not {cfg.smem_bytes}")
    kb = -(-k // 128)
    name = _kernel_name(cfg, n, k, 0, 1, x_dtype)        # (refuses float32 x: no such form)
    kern = _jit.get_kernel(_header_of(name), name, max_dynamic_smem=cfg.smem_bytes)
    a_row = a.strides[0] if shape_m > 1 else k * a.itemsize
    d_row = out.strides[0] // 2 if shape_m > 1 else n
    if x_dtype is None:
        sfa_ptr, sfa_pitch, k_x = sfa.data.ptr, _scale_pitch(sfa, rows, kb), k
    else:
        sfa_ptr, sfa_pitch, k_x = 0, 0, a.shape[1]
    args = (np.uint32(shape_m), np.uint32(kb), np.uint32(flags), np.uint64(a.data.ptr), np.uint32(a_row),
            np.uint64(sfa_ptr), np.uint32(sfa_pitch), np.uint64(b.data.ptr),
            np.uint32(b.strides[0]), np.uint64(sfb.data.ptr), np.uint64(out.data.ptr), np.uint32(d_row),
            np.uint32(k_x))
    return Launcher(kern, (grid,), (_config.warp_mma_threads(cfg.block_n, cfg.num_k_splits),), args,
                    cfg.smem_bytes)


#: common.cuh kFlagBEvictFirst
FLAG_B_EVICT_FIRST = 2
#: common.cuh kFlagAPow2Scale: power-of-two scales for the activations
#: the kernel quantises itself
FLAG_A_POW2_SCALE = 4
#: common.cuh kFlagBBeforeWait: the warp-MMA kernel streams its first batch
#: of B before its grid-dependency wait (gemm_fp8's fused path, whose
#: predecessor is cugemm8's quantiser: it never writes B)
FLAG_B_BEFORE_WAIT = 8
#: the evict-first rule's limits (see b_evict_first); probe switches
B_EVICT_FIRST_MAX_M_BLOCKS = 4
B_EVICT_FIRST_MAX_ROWS = 512
B_EVICT_FIRST_MIN_K = 0
#: the least K with the hint for 256-row blocks
B_EVICT_FIRST_MIN_K_BLOCK_M_256 = 1536


def b_evict_first(rows: int, block_m: int, k: int) -> bool:
    """Whether B's TMA loads carry an L2 evict-first hint (``kFlagBEvictFirst``).

    When the rows of a group (``rows``: m, m_sum or m_max) span at most
    :data:`B_EVICT_FIRST_MAX_M_BLOCKS` blocks of ``block_m`` rows, each B tile
    is read by that few CTAs, which the scheduler hands out close together
    (scheduler.cuh: the m-blocks of a band of n-blocks are consecutive
    tiles), so B streams through L2 about once, and its lines had better
    replace one another than what else L2 holds (the caller's activations;
    in the benches, the L2 flush's dirty lines).  Measured on the H200
    (``tools/perf/hint_ab.py``, benches/RESULTS.md v0.10): the DeepSeek-V3
    decode shapes 1-11 % faster with the hint at K >= 1536 and up to 4
    m-blocks.  v0.10 measured K = 512 (four K blocks per tile) 1-9 % slower
    with it, hence a :data:`B_EVICT_FIRST_MIN_K` of 1536 until v0.16, whose
    kernel runs 32768x512 2-5 % faster with the hint at M = 1, 64 and 128
    (benches/RESULTS.md v0.16), so the limit is now 0.

    And at most :data:`B_EVICT_FIRST_MAX_ROWS` rows, and with 256-row blocks
    only from K = :data:`B_EVICT_FIRST_MIN_K_BLOCK_M_256` (v0.35): a hinted
    load is never merged by the L2 request coalescer (``cuda_src/ptx/tma.cuh``,
    ``tma_load_3d_hint_if``), so where several CTAs read each B tile at about
    the same time the hint can cost more than it saves.  Measured on the H200
    (``python tools/perf/hint_ab.py --ms 256,384,512,640,768,1024``, CUPTI,
    time with the hint over time without; benches/RESULTS.md v0.35): 256-row
    blocks at K = 512 1.015 (256x32768x512), 1.093 (512 rows), 1.168 (768),
    1.164 (1024); at 768-1024 rows and K = 1536 1.013-1.048; at K >= 2048
    0.98-1.004.  With 128- and 64-row blocks and up to 512 rows the hint stays
    faster or ties (0.90-1.00: 384x32768x512 0.979, 256x4096x7168 0.904).
    """
    if -(-rows // block_m) > B_EVICT_FIRST_MAX_M_BLOCKS or rows > B_EVICT_FIRST_MAX_ROWS:
        return False
    return k >= (B_EVICT_FIRST_MIN_K_BLOCK_M_256 if block_m == 256 else B_EVICT_FIRST_MIN_K)


def a_box_rows(rows: int, block_m: int) -> int:
    """Rows of the TMA box that loads A (and, rounded up to 4, SFA) per stage.

    ``block_m``, or ``rows`` (the per-group row extent of A's tensor map: m,
    m_sum or m_max) when that is smaller, so that decode-sized calls
    (M = 1 ... 63) move M rows of A per stage instead of a 64-row box of
    which all but M rows are zero-filled out of bounds (measured: up to 1.8x
    the M = 64 time at M = 1, benches/RESULTS.md v0.8).  The kernel never
    stores the tile rows past the box (they are past ``rows``).
    """
    return max(1, min(rows, block_m))


def _launch(*args):
    """Encode descriptors and launch now (see :func:`_prepare_launch`)."""
    launcher = _prepare_launch(*args)
    launcher()
    return launcher


# ----------------------------------------------------------------------------
# repeated calls: a launcher cache keyed by everything validation looks at
# ----------------------------------------------------------------------------
#
# Every check an op makes is a function of its arrays' (address, shape,
# strides, dtype), the current device (under unified addressing an address
# belongs to one device) and the SM budget; the configuration and the tensor
# maps are functions of the same things.  So after one validated call, an
# identical call can reuse the launcher: issue 4's host budget (<= 15 us per
# call at M = 64) leaves no room for re-validating.  A call is cached only if
# it needed no scale conversion (no temporary arrays); the launcher holds raw
# addresses and tensor maps, never the arrays.  Re-allocating the same shapes
# at the same addresses reuses the entry, which is correct because nothing in
# it depends on the contents.

_FAST_MAX = 4096
_fast: dict = {}


def _sig(x):
    # The array's own device too: checks reject arrays on another device, and
    # a freed address can come back on another GPU.
    return (x.data.ptr, x.data.device_id, x.shape, x.strides, x.dtype)


def _fast_key(op: str, lhs, rhs, out, *extra):
    """The cache key of a call, or None when any argument is not shaped like
    a valid call (then the slow path validates and raises)."""
    if not (isinstance(lhs, (tuple, list)) and isinstance(rhs, (tuple, list))):
        return None                      # the slow path raises the pair TypeError
    try:
        (a, sfa), (b, sfb) = lhs, rhs
        device = _device.current_device_id()
        return (op, device, _device.get_num_sms(device), _sig(a), _sig(sfa), _sig(b), _sig(sfb),
                _sig(out)) + tuple((type(e), e) if isinstance(e, (int, np.integer)) else _sig(e)
                               for e in extra)
    except Exception:
        return None


def _launch_cached(key) -> bool:
    """Run the launcher cached under ``key``; False when there is none."""
    launcher = _fast.get(key) if key is not None else None
    if launcher is None:
        return False
    launcher()
    return True


def _remember(key, launcher, converted: bool) -> None:
    if key is None or converted:
        return
    if len(_fast) >= _FAST_MAX:
        _fast.clear()
    _fast[key] = launcher


def _launch_and_remember(key, cupy, cfg, kind, n, k, num_groups, shape_m, rows, a, sfa, b, sfb, out,
                         layout, groups_a) -> None:
    """Bring the scales into the kernel's layout, launch, and cache the
    launcher under ``key`` unless a scale had to be converted (the launcher
    would point at a temporary)."""
    sfa_k, sfb_k = _prepare_sfa(sfa, cupy), _prepare_sfb(sfb, cupy)
    launcher = _launch(cfg, kind, n, k, num_groups, shape_m, rows, a, sfa_k, b, sfb_k, out, layout, groups_a)
    _remember(key, launcher, sfa_k is not sfa or sfb_k is not sfb)


@contextlib.contextmanager
def _forced_config(cfg):
    """Within the block the ops launch ``cfg`` instead of the heuristic's
    pick (``None``: the heuristic), for benches and tools that time or
    sanitize forced configurations.  The launch cache is emptied on entry and
    exit, so no launcher built under one choice serves the other."""
    global _select
    saved = _select
    if cfg is not None:
        _select = lambda *args: cfg        # noqa: E731
    clear_launch_cache()
    try:
        yield
    finally:
        _select = saved
        clear_launch_cache()


def clear_launch_cache() -> None:
    """Forget the cached launchers of repeated calls (they are rebuilt on the
    next call).  Never needed for correctness; for tests and memory hygiene."""
    _fast.clear()


def reload_tuned_configs() -> None:
    """Read the tuned-configurations file again and forget every cached
    launch, so the next call of each shape selects its configuration anew.

    The file (written by ``cugemm8 tune``) is otherwise read once per
    process, at the first GEMM that selects a configuration; its location
    (``$CUGEMM8_TUNED_FILE``, default ``~/.cache/cugemm8/tuned.json``), the
    matching rules and the safety rules are in :mod:`cugemm8._tuned`.  A
    malformed file gives one ``RuntimeWarning`` and no entries; it never
    raises.
    """
    _tuned.reload()
    _tuned_envs.clear()
    clear_launch_cache()


# ----------------------------------------------------------------------------
# k == 0: the grouped layouts' rules without a GEMM
# ----------------------------------------------------------------------------
#
# With k == 0 every product is an empty sum.  The ops then write what the
# kernel would: zeros into the valid region, and (contiguous) NaN into rows
# that break the layout contract, with one small elementwise kernel over the
# output's logical elements (CuPy's CArray indexing follows out's strides);
# nothing outside the valid region is written.

_k0_kernels: dict = {}


def _empty_k_contiguous(cupy):
    kern = _k0_kernels.get("contiguous")
    if kern is None:
        kern = _k0_kernels["contiguous"] = cupy.ElementwiseKernel(
            "raw int32 m_indices, int64 g, int64 n", "raw uint16 out",
            """
            const long long r = i / n;
            const int e = m_indices[r], first = m_indices[r / 128 * 128];
            const bool ok = e == -1 || (e == first && first >= 0 && first < g);
            out[i] = ok ? 0 : 0x7fc0;   // bf16 +0.0, or a quiet NaN for a layout violation
            """, "cugemm8_contiguous_empty_k")
    return kern


def _empty_k_masked(cupy):
    kern = _k0_kernels.get("masked")
    if kern is None:
        kern = _k0_kernels["masked"] = cupy.ElementwiseKernel(
            "raw int32 masked_m, int64 m_max, int64 n", "raw uint16 out",
            """
            const long long row = i / n, grp = row / m_max, r = row % m_max;
            int v = masked_m[grp];
            v = v < 0 ? 0 : (v > m_max ? m_max : v);
            if (r < v) out[i] = 0;      // rows >= masked_m stay untouched
            """, "cugemm8_masked_empty_k")
    return kern


# ----------------------------------------------------------------------------
# public ops
# ----------------------------------------------------------------------------

def gemm_fp8_fp8_bf16_nt(lhs: tuple[cupy.ndarray, cupy.ndarray], rhs: tuple[cupy.ndarray, cupy.ndarray],
                         out: cupy.ndarray) -> None:
    """``out = (A * SFA) @ (B * SFB)^T`` with FP8 operands and BF16 output.

    Args:
        lhs: ``(a, sfa)``: ``a`` uint8 ``[m, k]`` e4m3fn bits, K-major;
            ``sfa`` float32 ``[m, ceil(k/128)]``, one scale per token per
            128 K (any strides; MN-major TMA-aligned is the fast path).
        rhs: ``(b, sfb)``: ``b`` uint8 ``[n, k]`` K-major; ``sfb`` float32
            ``[ceil(n/128), ceil(k/128)]``, one scale per 128x128 block.
        out: bfloat16 ``[m, n]``, row-major with 16-byte aligned rows;
            written in full, nothing outside it.

    Requirements: ``k % 16 == 0``, ``n % 8 == 0``, any ``m >= 0`` (``k == 0``
    writes zeros, ``m == 0`` or ``n == 0`` launches nothing); see the module
    docstring for strides and alignment.

    Raises:
        TypeError: wrong container or dtype.
        ValueError: shape, stride, alignment, device or aliasing rule broken.
        cugemm8.DeviceError: no usable Hopper GPU.
    """
    key = _fast_key("normal", lhs, rhs, out)
    if _launch_cached(key):
        return
    cupy = _device.import_cupy()
    a, sfa, b, sfb = _unpack(lhs, rhs, 2, 2, cupy)
    m, k = a.shape
    n, kb_ = b.shape
    if kb_ != k:
        raise ValueError(f"a is [m, k] = {list(a.shape)} and b is [n, k] = {list(b.shape)}: k differs")
    _config.check_n_k(n, k, allow_empty=True)    # before any device lookup: a ValueError on any machine
    kb, nb = -(-k // 128), -(-n // 128)
    _check_f32("lhs[1] (sfa)", sfa, (m, kb), cupy)
    _check_f32("rhs[1] (sfb)", sfb, (nb, kb), cupy)
    _check_out("out", out, (m, n), cupy)
    if m > _INT32_MAX:
        raise ValueError(f"m = {m} exceeds 2^31 - 1 rows (TMA coordinates are int32)")
    _check_placement(out, {"a": a, "sfa": sfa, "b": b, "sfb": sfb}, cupy)
    if m == 0 or n == 0:
        return
    if k == 0:
        out[...] = 0          # an empty sum (DeepGEMM's convention); no GEMM launch
        return
    cfg = _select("normal", m, n, k, 1)
    _launch_and_remember(key, cupy, cfg, "normal", n, k, 1, m, m, a, sfa, b, sfb, out, None, 1)


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs: tuple[cupy.ndarray, cupy.ndarray],
                                              rhs: tuple[cupy.ndarray, cupy.ndarray],
                                              out: cupy.ndarray, m_indices: cupy.ndarray) -> None:
    """Grouped GEMM over experts whose rows are stacked contiguously (MoE prefill).

    Row ``r`` of ``lhs`` is multiplied by expert ``m_indices[r]``'s weights.

    Args:
        lhs: ``(a, sfa)``: ``a`` uint8 ``[m_sum, k]``, ``sfa`` float32
            ``[m_sum, ceil(k/128)]``.
        rhs: ``(b, sfb)``: ``b`` uint8 ``[g, n, k]``, ``sfb`` float32
            ``[g, ceil(n/128), ceil(k/128)]``.
        out: bfloat16 ``[m_sum, n]``.
        m_indices: int32 ``[m_sum]`` on the device: each row's expert in
            ``[0, g)``, or ``-1`` for padding.

    Layout contract (:func:`cugemm8.get_m_alignment_for_contiguous_layout`
    = 128): every aligned block of 128 rows holds rows of one expert, possibly
    followed by ``-1`` padding rows; an all-``-1`` block is padding.
    :func:`cugemm8.layout.make_contiguous_layout` builds such a layout.

    Results, one rule per row ``r`` for every tile size the heuristic or a
    forced config may use (BLOCK_M 64, 128 and 256 alike): let ``e0`` be the
    expert of the first row of ``r``'s aligned 128-row block.  A ``-1`` row is
    written as **zeros**; a row whose expert equals ``e0``, with ``e0`` in
    ``[0, g)``, is computed with expert ``e0``; every other row breaks the
    contract (an expert id different from ``e0``, ``e0`` itself ``-1`` or
    outside ``[0, g)``, or an id outside ``[-1, g)``) and is written as
    **NaN**, so the violation is visible; it never causes an out-of-bounds
    access.  A padding block costs no tensor-core work unless a 256-row tile
    pairs it with an expert's block (the tile's WGMMAs then cover it and its
    rows are discarded).  ``m_indices`` is read on the device only: no host
    synchronisation.

    Raises: as :func:`gemm_fp8_fp8_bf16_nt`.
    """
    key = _fast_key("contiguous", lhs, rhs, out, m_indices)
    if _launch_cached(key):
        return
    cupy = _device.import_cupy()
    a, sfa, b, sfb = _unpack(lhs, rhs, 2, 3, cupy)
    m, k = a.shape
    g, n, kb_ = b.shape
    if kb_ != k:
        raise ValueError(f"a is [m_sum, k] = {list(a.shape)} and b is [g, n, k] = {list(b.shape)}: k differs")
    if g < 1:
        raise ValueError("b must hold at least one expert (g >= 1)")
    _config.check_n_k(n, k, allow_empty=True)    # before any device lookup: a ValueError on any machine
    kb, nb = -(-k // 128), -(-n // 128)
    _check_f32("lhs[1] (sfa)", sfa, (m, kb), cupy)
    _check_f32("rhs[1] (sfb)", sfb, (g, nb, kb), cupy)
    _check_out("out", out, (m, n), cupy)
    _check_int32("m_indices", m_indices, (m,), cupy)
    if m > _INT32_MAX:
        raise ValueError(f"m_sum = {m} exceeds 2^31 - 1 rows (TMA coordinates are int32)")
    _check_placement(out, {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "m_indices": m_indices}, cupy)
    if m == 0 or n == 0:
        return
    if k == 0:
        _empty_k_contiguous(cupy)(m_indices, np.int64(g), np.int64(n), out.view(np.uint16), size=m * n)
        return
    cfg = _select("contiguous", m, n, k, g)
    _launch_and_remember(key, cupy, cfg, "contiguous", n, k, g, m, m, a, sfa, b, sfb, out, m_indices, 1)


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs: tuple[cupy.ndarray, cupy.ndarray],
                                          rhs: tuple[cupy.ndarray, cupy.ndarray],
                                          out: cupy.ndarray, masked_m: cupy.ndarray,
                                          expected_m: int) -> None:
    """Grouped GEMM over per-expert padded batches (MoE decode, CUDA-graph friendly).

    For each group ``g``, rows ``[0, masked_m[g])`` of ``lhs[g]`` are
    multiplied by expert ``g``'s weights.

    Args:
        lhs: ``(a, sfa)``: ``a`` uint8 ``[g, m_max, k]``, ``sfa`` float32
            ``[g, m_max, ceil(k/128)]``.
        rhs: ``(b, sfb)``: ``b`` uint8 ``[g, n, k]``, ``sfb`` float32
            ``[g, ceil(n/128), ceil(k/128)]``.
        out: bfloat16 ``[g, m_max, n]``; its group stride must equal
            ``m_max`` times its row stride.
        masked_m: int32 ``[g]`` on the device: valid rows per group.  Read
            on the device only, so it may change between calls (or CUDA
            graph replays) without recompiling or synchronising.  Values are
            clamped to ``[0, m_max]``.
        expected_m: host int ``>= 1``, a hint of the typical ``masked_m`` used
            only to choose the kernel configuration.

    Results: rows ``>= masked_m[g]`` of ``out[g]`` are **left untouched**;
    whatever the padding rows of ``lhs`` or their scales hold (NaN, huge
    values, uninitialised memory) never reaches a valid row.  Any ``m_max``
    works; reads and writes never cross into the next group.

    Raises: as :func:`gemm_fp8_fp8_bf16_nt`.
    """
    key = _fast_key("masked", lhs, rhs, out, masked_m, expected_m)
    if _launch_cached(key):
        return
    cupy = _device.import_cupy()
    a, sfa, b, sfb = _unpack(lhs, rhs, 3, 3, cupy)
    g, m_max, k = a.shape
    gb, n, kb_ = b.shape
    if gb != g:
        raise ValueError(f"a has {g} groups but b has {gb}")
    if kb_ != k:
        raise ValueError(f"a is [g, m_max, k] = {list(a.shape)} and b is [g, n, k] = {list(b.shape)}: k differs")
    _config.check_n_k(n, k, allow_empty=True)    # before any device lookup: a ValueError on any machine
    kb, nb = -(-k // 128), -(-n // 128)
    _check_f32("lhs[1] (sfa)", sfa, (g, m_max, kb), cupy)
    _check_f32("rhs[1] (sfb)", sfb, (g, nb, kb), cupy)
    _check_out("out", out, (g, m_max, n), cupy)
    _check_int32("masked_m", masked_m, (g,), cupy)
    if isinstance(expected_m, bool) or not isinstance(expected_m, (int, np.integer)):
        raise TypeError(f"expected_m must be a host int, got {type(expected_m).__name__}")
    if expected_m < 1:
        raise ValueError(f"expected_m = {expected_m} must be >= 1")
    if g > 1 and m_max > 1 and out.strides[0] != m_max * out.strides[1]:
        # The kernel stores a group's partial last tile row by row at
        # (group * m_max + row) * row stride.
        raise ValueError(f"out's group stride {out.strides[0]} B must equal m_max * row stride "
                         f"= {m_max * out.strides[1]} B")
    if g > 1 and m_max == 1 and out.strides[0] // 2 >= 2 ** 32:
        # One row per group: the kernel takes the group stride as its 32-bit row stride.
        raise ValueError(f"out's group stride {out.strides[0]} B must be below 2^33 B when m_max == 1 "
                         f"(the kernel takes it as a 32-bit element count)")
    if g * m_max > _INT32_MAX:
        raise ValueError(f"g * m_max = {g * m_max} exceeds 2^31 - 1 rows")
    _check_placement(out, {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "masked_m": masked_m}, cupy)
    if g == 0 or m_max == 0 or n == 0:
        return
    if k == 0:
        _empty_k_masked(cupy)(masked_m, np.int64(m_max), np.int64(n), out.view(np.uint16),
                              size=g * m_max * n)
        return
    cfg = _select("masked", min(int(expected_m), m_max), n, k, g)
    _launch_and_remember(key, cupy, cfg, "masked", n, k, g, m_max, m_max, a, sfa, b, sfb, out, masked_m, g)


def get_gemm_config(kind: Literal["normal", "contiguous", "masked"], m: int, n: int, k: int,
                    num_groups: int = 1, num_sms: int | None = None) -> GemmConfig:
    """The kernel configuration (:class:`cugemm8.GemmConfig`) an op would use.

    Args:
        kind: ``'normal'`` (:func:`gemm_fp8_fp8_bf16_nt`), ``'contiguous'``
            (:func:`m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`: ``m`` is
            ``m_sum``, all groups' rows) or ``'masked'``
            (:func:`m_grouped_gemm_fp8_fp8_bf16_nt_masked`: ``m`` is the
            op's ``min(expected_m, m_max)``).
        m: rows (``>= 0``).
        n, k: output columns (a positive multiple of 8) and reduction length
            (a positive multiple of 16, at most 382,464).
        num_groups: groups of a grouped GEMM (1 for ``'normal'``).
        num_sms: the SMs the persistent kernel may occupy.  ``None``
            (default): the current device's budget, :func:`cugemm8.get_num_sms`
            (needs a GPU), and the configuration the op launches there: a
            matching entry of the tuned file (``cugemm8 tune``;
            :mod:`cugemm8._tuned` says where it lives and what matches) if
            there is one, else the heuristic's.  Given, the heuristic's pick
            for that budget, and nothing touches a GPU, so the choice can be
            inspected on any machine (132 for an H200 / H100 SXM).  A
            given ``num_sms`` is taken as the whole device's SM count: the
            warp-MMA decode kernel (not persistent), which the ops use only
            on the whole device, may be the answer.

    Returns:
        The frozen :class:`cugemm8.GemmConfig` (tile, stages, multicast,
        split K, grid, shared memory).  The heuristic is deterministic: the
        same arguments give the same configuration on every machine, the one
        the op launches when the device's SM budget is ``num_sms`` and no
        tuned entry matches.

    Raises:
        TypeError: a size, ``num_groups`` or ``num_sms`` that is not an int.
        ValueError: an unknown ``kind``, ``m < 0``, ``n`` or ``k`` breaking
            the rules above, ``num_groups < 1`` (or not 1 for
            ``'normal'``), ``num_sms < 1``.  Checked before any device
            lookup, so these are the errors on any machine.
        cugemm8.DeviceError: ``num_sms`` is ``None`` and there is no usable
            GPU (after the argument checks).
    """
    if num_sms is None:
        # The argument checks first (with a placeholder SM count), so a bad
        # argument raises the same error on a machine without a GPU.
        _config._validate(kind, m, n, k, num_groups, 1, _config.SMEM_LIMIT)
        device_id = _device.require_hopper()
        return _choose(kind, m, n, k, num_groups, device_id, _device.get_num_sms(device_id))[0]
    return _config.select_config(kind, m, n, k, num_groups=num_groups, num_sms=num_sms)
