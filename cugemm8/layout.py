"""Scale-tensor layouts and the contiguous grouped layout.

The GEMM kernels read the LHS scales ``sfa`` (logical ``[m, ceil(k/128)]``, or
``[g, m, ceil(k/128)]``) **MN-major**: element ``(i, kb)`` at
``kb * m_pad + i`` floats, with ``m_pad`` a multiple of 4 so every K-block
column starts 16-byte aligned, because one TMA box of BLOCK_M consecutive
floats is loaded per pipeline stage (deepseek-ai/DeepGEMM issue #33 and
README).  Any ``sfa`` whose innermost (M) stride is one float and whose other
strides are multiples of 16 bytes is consumed as is; other layouts are
converted by :func:`get_col_major_tma_aligned_tensor`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Iterable

    import cupy

#: Rows per expert block in the contiguous grouped layout (the kernel's
#: BLOCK_M for that layout is at most this and divides it).
CONTIGUOUS_M_ALIGNMENT = 128


def get_m_alignment_for_contiguous_layout() -> int:
    """Row alignment of each expert's segment in the contiguous grouped GEMM.

    Every aligned block of this many rows of ``lhs`` belongs to a single
    expert or is padding (``m_indices == -1``).  Returns 128.
    """
    return CONTIGUOUS_M_ALIGNMENT


def tma_aligned_size(m: int, element_bytes: int = 4) -> int:
    """``m`` rounded up so that ``m * element_bytes`` is a multiple of 16."""
    per = 16 // element_bytes
    return -(-m // per) * per


def is_tma_aligned_mn_major(sfa: cupy.ndarray) -> bool:
    """True when ``sfa`` (2-D or 3-D float32) can be read by the kernel as is."""
    if sfa.dtype != np.float32 or sfa.ndim not in (2, 3):
        return False
    st = sfa.strides
    if sfa.data.ptr % 16:
        return False
    if sfa.shape[-2] > 1 and st[-2] != 4:
        return False
    if sfa.shape[-1] > 1 and (st[-1] % 16 or st[-1] < 4 * sfa.shape[-2]):
        return False
    if sfa.ndim == 3 and sfa.shape[0] > 1:
        # Groups must not overlap (no broadcast over groups): each holds
        # kb columns of at least m floats.
        column = st[-1] if sfa.shape[-1] > 1 else 4 * sfa.shape[-2]
        if st[0] % 16 or st[0] < column * sfa.shape[-1]:
            return False
    # TMA strides are below 2^40 bytes; anything else is converted, not rejected later.
    return all(0 <= s < 2 ** 40 for s in st)


def get_col_major_tma_aligned_tensor(sfa: cupy.ndarray) -> cupy.ndarray:
    """Return ``sfa`` in the MN-major, TMA-aligned layout the GEMMs read.

    Args:
        sfa: CuPy float32 array ``[m, kb]`` or ``[g, m, kb]`` (any strides).

    Returns:
        A CuPy float32 array with the same logical shape and values whose
        strides are ``(4, 4*m_pad)`` (2-D) or ``(4*m_pad*kb, 4, 4*m_pad)``
        (3-D), ``m_pad = ceil(m/4)*4``; the padding rows hold 0.  ``sfa``
        itself is returned when it already satisfies the layout.  Otherwise
        the cost is one device copy of ``sfa`` (one elementwise kernel).

    Raises:
        TypeError: ``sfa`` is not a float32 CuPy array.
        ValueError: ``sfa`` is not 2-D or 3-D.
    """
    import cupy
    from ._checks import check_device_array
    check_device_array("sfa", sfa, cupy)
    if sfa.dtype != np.float32:
        raise TypeError(f"sfa must be float32, got {sfa.dtype}")
    if sfa.ndim not in (2, 3):
        raise ValueError(f"sfa must be 2-D [m, kb] or 3-D [g, m, kb], got shape {sfa.shape}")
    if is_tma_aligned_mn_major(sfa):
        return sfa
    squeeze = sfa.ndim == 2
    x = sfa[None] if squeeze else sfa
    g, m, kb = x.shape
    m_pad = tma_aligned_size(m)
    buf = cupy.zeros((g, kb, m_pad), dtype=np.float32)
    buf[:, :, :m] = x.transpose(0, 2, 1)
    out = buf[:, :, :m].transpose(0, 2, 1)
    return out[0] if squeeze else out


def make_contiguous_layout(group_sizes: Iterable[int], alignment: int = CONTIGUOUS_M_ALIGNMENT
                           ) -> tuple[cupy.ndarray, np.ndarray]:
    """Build ``m_indices`` for the contiguous grouped GEMM from token counts.

    Expert ``e``'s ``group_sizes[e]`` rows start at a multiple of ``alignment``
    rows; the rows after them up to the next multiple are padding and get
    ``-1``; an expert with 0 rows gets no block at all.

    The same layout as :func:`cugemm8.reference.make_m_indices` (the host
    computation is that function's NumPy code; only ``m_indices`` is then
    copied to the GPU): ``make_contiguous_layout(s)`` equals
    ``make_m_indices(s)`` with its first array on the device.  Use
    ``make_m_indices`` for the host arrays alone (no GPU needed).

    Args:
        group_sizes: sequence of non-negative ints, one per expert (a list,
            tuple, range or 1-D integer NumPy array).
        alignment: row alignment, a multiple of
            :func:`get_m_alignment_for_contiguous_layout` (default: equal to it).

    Returns:
        ``(m_indices, offsets)``: ``m_indices`` a CuPy int32 array
        ``[m_sum]``, each row's expert or ``-1`` for padding (DeepGEMM's
        ``m_indices``), and ``offsets`` a host NumPy int64 array ``[g + 1]``:
        expert ``e`` owns rows ``offsets[e] : offsets[e + 1]``, its tokens
        being the first ``group_sizes[e]`` of them; ``offsets[0] = 0`` and
        ``offsets[g] = m_sum``, a multiple of ``alignment``.

    Raises:
        TypeError: ``group_sizes`` not a sequence, or a group size that is
            not an int.
        ValueError: a negative group size, an alignment that is not a
            positive multiple of 128, or a padded total ``m_sum`` beyond
            2^31 - 1 rows (the GEMMs' int32 row coordinates).
        cugemm8.DeviceError: no usable GPU to hold ``m_indices`` (raised
            after the argument checks, before any host array is built).
    """
    from . import _device
    from .reference.layout import _build_layout, _check_layout_args
    sizes, _, offsets = _check_layout_args(group_sizes, alignment, CONTIGUOUS_M_ALIGNMENT)
    cupy = _device.import_cupy()
    _device.current_device_id()          # DeviceError (not a CUDA error) without a GPU, before host work
    m_indices, offsets_array = _build_layout(sizes, offsets)
    return cupy.asarray(m_indices), offsets_array
