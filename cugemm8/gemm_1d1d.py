"""FP8 x FP8 -> FP32 GEMMs with both operands scaled 1x128 along K ("1D1D"):
the weight gradients of DeepSeek-V3's FP8 training recipe (public ops).

Math (DeepSeek-V3 technical report §3.3; DeepGEMM's ``fp8_gemm_nt`` with
recipe ``(1, 1, 128)`` and ``k_grouped_fp8_gemm_nt_contiguous``)::

    D[m, n] = (C[m, n] +) sum_kb SFA[m, kb] * SFB[n, kb] * sum_{k in kb} A[m, k] * B[n, k]

promoted into FP32 every 128 K with the scale product taken per element
(``cuda_src/fp8_gemm_1d1d.cuh``; the order is
:func:`cugemm8.reference.training.promoted_accumulation_model_1d1d`'s, and
every GPU result is checked against
:func:`~cugemm8.reference.training.error_bound_1d1d` in the tests).  For a
linear layer ``y = x @ w.T`` the weight gradient ``dW = dY^T X`` is this GEMM
with K = tokens: ``A, SFA = per_token_cast_to_fp8_t(dy)`` and ``B, SFB =
per_token_cast_to_fp8_t(x)``.  The kernel reads MN-major scales: pass
``mn_major=True`` to those quantisers to get them in that layout, written by
the quantiser itself.  Row-major (K-major) scales, their default, are
converted inside each call (a small copy kernel and a temporary; refused
under CUDA-graph capture), or once by
:func:`cugemm8.get_col_major_tma_aligned_tensor`.

Operand rules
-------------
* ``a [m, k]`` / ``b [n, k]``: CuPy ``uint8`` e4m3fn bits (or a
  ``float8_e4m3fn`` view), K-major, the TMA rules of :mod:`cugemm8.gemm`
  (last stride 1, other strides positive multiples of 16 bytes, base 16-byte
  aligned); ``k`` a multiple of 16 and at most 2^31 - 128 (a tail below 128
  is zero-filled by TMA); ``m`` and ``n`` below 2^31.
* ``sfa [m, ceil(k/128)]`` and ``sfb [n, ceil(k/128)]`` float32, any strides:
  the MN-major TMA-aligned layout (:func:`cugemm8.get_col_major_tma_aligned_tensor`)
  is read as is, any other is converted inside the call (refused under
  CUDA-graph capture, as for the 1D2D ops).
* ``d``: float32, C-contiguous, ``[m, n]`` (``[g, m, n]`` k-grouped), 8-byte
  aligned; ``n`` a multiple of 8.  ``c`` (optional): float32 with ``d``'s
  shape, C-contiguous, 8-byte aligned; ``c is d`` (or any array header over
  exactly d's memory, e.g. ``d[...]`` or a second DLPack wrapper of the
  same tensor) accumulates in place (gradient accumulation); otherwise ``c``
  must not overlap ``d``.  No input may overlap ``d``.
* Degenerate sizes: ``m == 0`` or ``n == 0`` launch nothing; ``k == 0``
  stores ``c`` (or zeros).
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Sequence

import numpy as np

from . import _config, _config_1d1d, _device, _jit, _tma, _tuned
from ._checks import check_device_array, refuse_temporary_under_capture
from ._launch import Launcher
from .gemm import (_INT32_MAX, _as_fp8, _check_f32, _check_int32, _check_placement, _first_overlap,
                   _map_stride, _pair, _prepare_sfa, _scale_pitch, _span, _tuned_environment)

if TYPE_CHECKING:
    import cupy

__all__ = ["fp8_gemm_nt", "k_grouped_fp8_gemm_nt_contiguous", "get_gemm_1d1d_config"]

_HEADER = "fp8_gemm_1d1d.cuh"
_NORMAL, _GROUPED_K = 0, 3
_NULL = np.uint64(0)
#: the fix the capture refusal names for wgrad scales (cugemm8.gemm._prepare_sfa)
_WGRAD_SCALES_FIX = ("quantise with per_token_cast_to_fp8_t(..., mn_major=True), which writes that layout "
                     "itself (also inside the graph), or convert the scales once before capturing with "
                     "cugemm8.get_col_major_tma_aligned_tensor and capture the call on the result")


def _kernel_name(cfg: _config_1d1d.Gemm1d1dConfig, n: int, gemm_type: int, num_groups: int) -> str:
    return (f"cugemm8::fp8_gemm_1d1d_kernel<{n}, {cfg.block_m}, {cfg.block_n}, {cfg.num_stages}, "
            f"{gemm_type}, {num_groups}, {'true' if cfg.tma_store else 'false'}>")


def _tma_store_allowed(d, c) -> bool:
    """Whether the call can take the TMA epilogue: no ``c`` or ``c`` is ``d``
    (a TMA reduce-add into ``d``), and ``d`` 16-byte aligned (TMA's rule)."""
    return (c is None or c is d) and d.data.ptr % 16 == 0


def _check_d(name: str, x, shape: tuple, cupy) -> None:
    check_device_array(name, x, cupy)
    if x.dtype != np.float32:
        extra = " (a bfloat16 d runs the 1D2D GEMM, fp8_gemm_nt's other form)" if name == "d" else ""
        raise TypeError(f"{name} must be float32 (the 1D1D GEMM's output), got {x.dtype}{extra}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(x.shape)}")
    if x.size and not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous, got strides {x.strides}")
    if x.size and x.data.ptr % 8:
        raise ValueError(f"{name} base address {x.data.ptr:#x} must be 8-byte aligned")


def _check_c(c, d, cupy):
    """``c`` as the kernel takes it: None; ``d`` itself for in-place
    accumulation (``c is d``, or another array header over exactly d's
    memory: same address, shape, strides and dtype, e.g. ``d[...]`` or a
    second DLPack wrapper of the same tensor); or a float32 array of d's
    shape that does not overlap d."""
    if c is None or c is d:
        return c
    _check_d("c", c, tuple(d.shape), cupy)
    if c.data.ptr == d.data.ptr and c.strides == d.strides and c.device.id == d.device.id:
        return d
    if c.size and d.size and _first_overlap(_span(d), {"c": c}) is not None:
        raise ValueError("c overlaps d in memory without being d; pass c=d to accumulate in place")
    return c


#: The largest K (tokens): the kernel's TMA K coordinate (128 * K block) is an int32.
MAX_K = 2 ** 31 - 128


def _check_n_k(n: int, k: int) -> None:
    """The 1D1D rules on n and k (no shared-memory bound on k: the kernel
    keeps no per-K state in shared memory, unlike the 1D2D kernel's B-scale
    copies; K coordinates are int32)."""
    if k < 0 or k % 16:
        raise ValueError(f"k = {k} must be a non-negative multiple of 16 (16-byte FP8 rows for TMA)")
    if k > MAX_K:
        raise ValueError(f"k = {k} must be at most 2^31 - 128 (the kernel's TMA K coordinates are int32)")
    if n < 0 or n % 8:
        raise ValueError(f"n = {n} must be a non-negative multiple of 8")


def _nothing_to_multiply(m: int, n: int, k: int, d, c, inputs: dict, cupy) -> bool:
    """The checks both ops end with (sizes within TMA's int32 coordinates;
    every array on the current device; d overlapping no input, and c only
    as d itself), then the degenerate sizes: True when the call is done
    without a GEMM (``m == 0`` or ``n == 0``: nothing; ``k == 0``: ``d = c``
    or zeros, the empty sum)."""
    if m > _INT32_MAX or n > _INT32_MAX:
        raise ValueError(f"m = {m} and n = {n} must be below 2^31 (TMA coordinates are int32)")
    _check_placement(d, {**inputs, **({"c": c} if c is not None and c is not d else {})}, cupy, out_name="d")
    if m == 0 or n == 0:
        return True
    if k == 0:
        if c is None:
            d[...] = 0
        elif c is not d:
            d[...] = c
        return True
    return False


def _operands(lhs, rhs, cupy):
    a, sfa = _pair("a", lhs)
    b, sfb = _pair("b", rhs)
    a = _as_fp8("a[0]", a, 2, cupy)
    b = _as_fp8("b[0]", b, 2, cupy)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a is [m, k] = {list(a.shape)} and b is [n, k] = {list(b.shape)}: k differs")
    return a, sfa, b, sfb


_forced: list = []     # see _forced_config


@contextlib.contextmanager
def _forced_config(cfg: _config_1d1d.Gemm1d1dConfig):
    """Within the block every 1D1D launch uses ``cfg`` instead of the
    heuristic's pick (tests and benches that force configurations)."""
    _forced.append(cfg)
    try:
        yield
    finally:
        _forced.pop()


def get_gemm_1d1d_config(m: int, n: int, k: int, *, num_groups: int = 1, with_c: bool = False,
                         num_sms: int | None = None, tma_store: bool = True) -> _config_1d1d.Gemm1d1dConfig:
    """The kernel configuration (:class:`cugemm8.Gemm1d1dConfig`) the 1D1D
    ops launch for D ``[m, n]`` (per group) and total K ``k`` (the rules and
    the cost model are in ``cugemm8/_config_1d1d.py``); ``with_c``: whether
    ``c`` is given; ``tma_store``: whether the TMA epilogue is allowed (the
    ops pass False when ``c`` is given and is not ``d``, or ``d`` is not
    16-byte aligned).  A matching entry of the tuned file (``cugemm8 tune``,
    kinds ``wgrad`` / ``k_grouped``; :mod:`cugemm8._tuned`) is used instead
    of the heuristic's pick when the call allows its epilogue (an entry with
    the TMA epilogue needs ``tma_store``).  ``num_sms`` defaults to the current device's budget
    (:func:`cugemm8.set_num_sms`), which needs a GPU: without one, pass
    ``num_sms``, or this raises :class:`cugemm8.DeviceError`.  Raises
    ``ValueError`` / ``TypeError`` for negative or non-integer sizes."""
    if _forced:
        return _forced[-1]
    device_id = None
    if num_sms is None:
        device_id = _device.require_hopper()
        num_sms = _device.get_num_sms(device_id)
    if device_id is not None and _tuned.tuned_path() is not None and _tuned.has_entries():
        cfg = _tuned.lookup("k_grouped" if num_groups > 1 else "wgrad", m, n, k, num_groups,
                            _tuned_environment(device_id, num_sms))
        if cfg is not None and (tma_store or not cfg.tma_store):
            return cfg
    return _config_1d1d.select_config(m, n, k, num_groups=num_groups, num_sms=num_sms, with_c=with_c,
                                      tma_store=tma_store)



def _launch(cfg, gemm_type: int, m: int, n: int, k_total: int, num_groups: int, a, sfa, b, sfb, d, c,
            ks_tensor) -> None:
    _prepare_launch(cfg, gemm_type, m, n, k_total, num_groups, a, sfa, b, sfb, d, c, ks_tensor)()


def _prepare_launch(cfg, gemm_type: int, m: int, n: int, k_total: int, num_groups: int, a, sfa, b, sfb, d, c,
                    ks_tensor) -> Launcher:
    """Compile (or fetch) the kernel and encode its descriptors: a
    :class:`cugemm8._launch.Launcher` of this call (``cugemm8 tune`` times it)."""
    kb = -(-k_total // 128)
    kern = _jit.get_kernel(_HEADER, _kernel_name(cfg, n, gemm_type, num_groups), max_dynamic_smem=cfg.smem_bytes)
    a_row = _map_stride(a, 0, k_total)
    tmap_a = _tma.make_descriptor("u8", a.data.ptr, (k_total, m, 1), (a_row, a_row * m),
                                  (128, cfg.block_m, 1), swizzle=128)
    b_row = _map_stride(b, 0, k_total)
    tmap_b = _tma.make_descriptor("u8", b.data.ptr, (k_total, n, 1), (b_row, b_row * n),
                                  (128, cfg.block_n, 1), swizzle=128)

    def scale_map(sf, rows, box):
        pad = _scale_pitch(sf, rows, kb)
        return _tma.make_descriptor("f32", sf.data.ptr, (rows, kb, 1), (pad * 4, pad * 4 * kb),
                                    (box, 1, 1), swizzle=0, l2_256=False)

    if cfg.tma_store:
        if not _tma_store_allowed(d, c):
            raise ValueError(f"configuration {cfg} stores D through TMA, which needs c to be None or d and d "
                             f"16-byte aligned")
        # D as (n, m, groups) FP32, 64 x 32 boxes (128 B rows, 128B swizzle: the staging layout).
        tmap_d = _tma.make_descriptor("f32", d.data.ptr, (n, m, num_groups), (n * 4, n * 4 * m),
                                      (32, 64, 1), swizzle=128, l2_256=False)
    else:
        tmap_d = _tma.NULL_DESCRIPTOR
    args = (np.uint32(m), np.uint32(k_total),
            np.uint64(ks_tensor.data.ptr) if ks_tensor is not None else _NULL,
            np.uint64(d.data.ptr), np.uint64(c.data.ptr) if c is not None else _NULL, np.uint32(n),
            tmap_a, tmap_b, scale_map(sfa, m, cfg.block_m), scale_map(sfb, n, cfg.block_n), tmap_d)
    return Launcher(kern, (cfg.num_sms,), (384,), args, cfg.smem_bytes)


def fp8_gemm_nt(a: tuple[cupy.ndarray, cupy.ndarray], b: tuple[cupy.ndarray, cupy.ndarray],
                d: cupy.ndarray, c: cupy.ndarray | None = None) -> None:
    """``d = (c +) (A * SFA) @ (B * SFB)^T``, both scaled 1x128 along K, FP32 out.

    DeepGEMM's ``fp8_gemm_nt(a, b, d, c)`` with recipe ``(1, 1, 128)`` (its
    1D1D kernel), argument order kept.  A ``d`` of dtype bfloat16 with
    ``sfb [ceil(n/128), ceil(k/128)]`` runs the 1D2D GEMM instead
    (:func:`cugemm8.gemm_fp8_fp8_bf16_nt`; ``c`` must then be None).

    Args:
        a: ``(a, sfa)``: uint8 ``[m, k]`` e4m3fn bits, K-major; float32
            ``[m, ceil(k/128)]`` scales (one per row per 128 K).
        b: ``(b, sfb)``: uint8 ``[n, k]``; float32 ``[n, ceil(k/128)]``.
        d: float32 ``[m, n]``, C-contiguous (bfloat16: the 1D2D GEMM).
        c: optional float32 ``[m, n]`` (C-contiguous) added to the product,
            ``d = fl32(c + acc)``; ``c is d`` accumulates in place.

    Requirements: ``k % 16 == 0`` and ``k <= 2^31 - 128``, ``n % 8 == 0``,
    ``m, n < 2^31``; see the module docstring for strides, alignment and
    degenerate sizes.  Scales not already MN-major TMA-aligned (the
    transposing quantisers' default, row-major) are converted inside each
    call, which is refused under CUDA-graph capture: quantise with
    ``per_token_cast_to_fp8_t(..., mn_major=True)``, or convert them once
    with :func:`cugemm8.get_col_major_tma_aligned_tensor`.

    Raises:
        TypeError: wrong container or dtype.
        ValueError: shape, stride, alignment, device or aliasing rule broken.
        cugemm8.DeviceError: no usable Hopper GPU.
    """
    cupy = _device.import_cupy()
    check_device_array("d", d, cupy)
    if d.dtype.name == "bfloat16":
        if c is not None:
            raise ValueError("c (accumulation) needs an FP32 d (the 1D1D GEMM); the BF16 1D2D GEMM has no c")
        from .gemm import gemm_fp8_fp8_bf16_nt
        gemm_fp8_fp8_bf16_nt(a, b, d)
        return
    a, sfa, b, sfb = _operands(a, b, cupy)
    m, k = a.shape
    n = b.shape[0]
    _check_n_k(n, k)
    kb = -(-k // 128)
    _check_f32("a[1] (sfa)", sfa, (m, kb), cupy)
    _check_f32("b[1] (sfb)", sfb, (n, kb), cupy)
    _check_d("d", d, (m, n), cupy)
    c = _check_c(c, d, cupy)
    if _nothing_to_multiply(m, n, k, d, c, {"a": a, "sfa": sfa, "b": b, "sfb": sfb}, cupy):
        return
    cfg = get_gemm_1d1d_config(m, n, k, with_c=c is not None, tma_store=_tma_store_allowed(d, c))
    sfa, sfb = (_prepare_sfa(sfa, cupy, "a[1] (sfa)", _WGRAD_SCALES_FIX),
                _prepare_sfa(sfb, cupy, "b[1] (sfb)", _WGRAD_SCALES_FIX))
    _launch(cfg, _NORMAL, m, n, k, 1, a, sfa, b, sfb, d, c, None)


def k_grouped_fp8_gemm_nt_contiguous(a: tuple[cupy.ndarray, cupy.ndarray],
                                     b: tuple[cupy.ndarray, cupy.ndarray], d: cupy.ndarray,
                                     ks: Sequence[int], ks_tensor: cupy.ndarray | None = None,
                                     c: cupy.ndarray | None = None) -> None:
    """MoE weight gradients: ``d[e] = (c[e] +) A_e B_e^T`` over each expert's own tokens.

    DeepGEMM's ``k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, ks_tensor, c)``
    (recipe ``(1, 1, 128)``), argument order kept.  Expert ``e`` owns the
    ``ks[e]`` token columns after those of experts ``< e`` (``off_e =
    sum(ks[:e])``) of one long K (token) dimension, so the operands are the
    plain 2-D outputs of :func:`cugemm8.per_token_cast_to_fp8_t` over the
    concatenated tokens (not DeepGEMM's group-by-group buffers).

    Args:
        a: ``(a, sfa)``: uint8 ``[m, sum(ks)]`` K-major; float32
            ``[m, sum(ks)/128]`` (1x128 along the tokens).
        b: ``(b, sfb)``: uint8 ``[n, sum(ks)]``; float32 ``[n, sum(ks)/128]``.
        d: float32 ``[g, m, n]``, C-contiguous, ``g = len(ks)``.
        ks: host sequence of ``g`` ints, each a non-negative multiple of 128
            (an expert with no tokens stores ``c[e]``, or zeros).
        ks_tensor: int32 ``[g]`` on the device holding the same values: the
            kernel reads the groups' extents from it, so a captured CUDA
            graph follows its contents at replay (they must stay
            non-negative multiples of 128 summing to K; ``ks`` only
            validates the call).  Built from ``ks`` when None, which is
            refused under CUDA-graph capture (pass it).  Values that break
            those rules give wrong results, never an access outside the
            operands or ``d`` and never a longer K loop than the operands
            have (each group's run is clamped to them).
        c: optional float32 ``[g, m, n]``; ``c is d`` accumulates in place.

    Scales not already MN-major TMA-aligned are converted inside each call
    (refused under CUDA-graph capture): quantise with
    ``per_token_cast_to_fp8_t(..., mn_major=True)``, or convert them once
    with :func:`cugemm8.get_col_major_tma_aligned_tensor`.

    Raises:
        TypeError: wrong container, dtype, or ``ks`` not a sequence of ints.
        ValueError: shape, stride, alignment, device or aliasing rule
            broken; a ``ks`` entry negative or not a multiple of 128; the sum
            of ``ks`` not the operands' K.
        cugemm8.DeviceError: no usable Hopper GPU.
    """
    cupy = _device.import_cupy()
    if not isinstance(ks, (list, tuple, range, np.ndarray)) or (isinstance(ks, np.ndarray) and ks.ndim != 1):
        raise TypeError(f"ks must be a list, tuple, range or 1-D integer array of ints (tokens per group), "
                        f"got {type(ks).__name__}")
    ks = [_config._as_int(f"ks[{i}]", v) for i, v in enumerate(ks)]
    g = len(ks)
    if g < 1:
        raise ValueError("ks must name at least one group")
    for i, v in enumerate(ks):
        if v < 0 or v % 128:
            raise ValueError(f"ks[{i}] = {v} must be a non-negative multiple of 128 "
                             f"(no 128-token scale block may straddle two groups)")
    a, sfa, b, sfb = _operands(a, b, cupy)
    m, k = a.shape
    n = b.shape[0]
    if sum(ks) != k:
        raise ValueError(f"sum(ks) = {sum(ks)} must equal the operands' K = {k}")
    _check_n_k(n, k)
    kb = k // 128
    _check_f32("a[1] (sfa)", sfa, (m, kb), cupy)
    _check_f32("b[1] (sfb)", sfb, (n, kb), cupy)
    _check_d("d", d, (g, m, n), cupy)
    c = _check_c(c, d, cupy)
    if ks_tensor is not None:
        _check_int32("ks_tensor", ks_tensor, (g,), cupy)
    if _nothing_to_multiply(m, n, k, d, c, {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "ks_tensor": ks_tensor},
                            cupy):
        return
    cfg = get_gemm_1d1d_config(m, n, k, num_groups=g, with_c=c is not None, tma_store=_tma_store_allowed(d, c))
    if ks_tensor is None:
        refuse_temporary_under_capture(
            "ks_tensor was not given, so this call would copy ks to the device into a temporary",
            "pass ks_tensor = cupy.asarray(ks, dtype=cupy.int32), made once before capturing", cupy)
        ks_tensor = cupy.asarray(np.asarray(ks, np.int32))
    sfa, sfb = (_prepare_sfa(sfa, cupy, "a[1] (sfa)", _WGRAD_SCALES_FIX),
                _prepare_sfa(sfb, cupy, "b[1] (sfb)", _WGRAD_SCALES_FIX))
    _launch(cfg, _GROUPED_K, m, n, k, g, a, sfa, b, sfb, d, c, ks_tensor)
