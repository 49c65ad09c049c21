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

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

import numpy as np

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


def is_tma_aligned_mn_major(sfa) -> bool:
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


def get_col_major_tma_aligned_tensor(sfa):
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


def make_contiguous_layout(group_sizes, alignment: int = CONTIGUOUS_M_ALIGNMENT):
    """Build ``m_indices`` for the contiguous grouped GEMM from token counts.

    Expert ``e``'s ``group_sizes[e]`` rows start at a multiple of ``alignment``
    rows; the rows after them up to the next multiple are padding and get
    ``-1``; an expert with 0 rows gets no block at all.

    Args:
        group_sizes: sequence of non-negative ints, one per expert.
        alignment: row alignment, a multiple of
            :func:`get_m_alignment_for_contiguous_layout` (default: equal to it).

    Returns:
        ``(m_indices, offsets)``: ``m_indices`` a CuPy int32 array ``[m_sum]``
        and ``offsets`` a host list of each expert's first row (``m_sum`` is a
        multiple of ``alignment``).

    Raises:
        TypeError: ``group_sizes`` not a sequence, or a group size that is
            not an int.
        cugemm8.DeviceError: no usable GPU to hold ``m_indices``.
        ValueError: a negative group size, an alignment that is not a
            positive multiple of 128, or a padded total ``m_sum`` beyond
            2^31 - 1 rows (the GEMMs' int32 row coordinates).
    """
    import cupy
    import numbers
    # An ordered sequence (list, tuple, range, 1-D NumPy array): a mapping
    # would give its keys and a set an arbitrary order.
    if (isinstance(group_sizes, (str, bytes, Mapping, AbstractSet))
            or not isinstance(group_sizes, Iterable)):
        raise TypeError(f"group_sizes must be a sequence of ints, one per expert, "
                        f"got {type(group_sizes).__name__}")
    sizes = list(group_sizes)
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"group_sizes must hold ints, got {s!r} ({type(s).__name__})")
    sizes = [int(s) for s in sizes]
    if any(s < 0 for s in sizes):
        raise ValueError(f"group_sizes must be non-negative, got {sizes}")
    if (isinstance(alignment, bool) or not isinstance(alignment, numbers.Integral)
            or alignment <= 0 or alignment % CONTIGUOUS_M_ALIGNMENT):
        raise ValueError(f"alignment = {alignment!r} must be a positive multiple of "
                         f"{CONTIGUOUS_M_ALIGNMENT} (every 128-row block must hold one expert)")
    offsets, total = [], 0
    for s in sizes:
        offsets.append(total)
        total += -(-s // alignment) * alignment
    if total > 2 ** 31 - 1:
        raise ValueError(f"group_sizes pad to m_sum = {total} rows; the grouped GEMMs take at most "
                         f"2^31 - 1 rows (int32 TMA coordinates)")
    from . import _device
    _device.current_device_id()          # DeviceError (not a CUDA error) without a GPU, before host work
    host = np.full(total, -1, dtype=np.int32)
    for e, (off, s) in enumerate(zip(offsets, sizes)):
        host[off:off + s] = e
    return cupy.asarray(host), offsets
