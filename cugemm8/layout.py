"""Scale-tensor layouts and the contiguous grouped layout.

The GEMM kernels read the LHS scales ``sfa`` (logical ``[m, ceil(k/128)]``, or
``[g, m, ceil(k/128)]``) **MN-major**: element ``(i, kb)`` at
``kb * m_pad + i`` floats, with ``m_pad`` a multiple of 4 so every K-block
column starts 16-byte aligned, because one TMA box of BLOCK_M consecutive
floats is loaded per pipeline stage (DeepGEMM issue #33; kernel-design.md
§2.3).  Any ``sfa`` whose innermost (M) stride is one float and whose other
strides are multiples of 16 bytes is consumed as is; other layouts are
converted by :func:`get_col_major_tma_aligned_tensor`.
"""
from __future__ import annotations

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
    if sfa.ndim == 3 and sfa.shape[0] > 1 and st[0] % 16:
        return False
    return all(s >= 0 for s in st)


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
    if not isinstance(sfa, cupy.ndarray):
        raise TypeError(f"sfa must be a cupy.ndarray, got {type(sfa).__name__}")
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
        alignment: row alignment (default :func:`get_m_alignment_for_contiguous_layout`).

    Returns:
        ``(m_indices, offsets)``: ``m_indices`` a CuPy int32 array ``[m_sum]``
        and ``offsets`` a host list of each expert's first row (``m_sum`` is a
        multiple of ``alignment``).

    Raises:
        ValueError: a negative group size or a non-positive alignment.
    """
    import cupy
    sizes = [int(s) for s in group_sizes]
    if any(s < 0 for s in sizes):
        raise ValueError(f"group_sizes must be non-negative, got {sizes}")
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    offsets, total = [], 0
    for s in sizes:
        offsets.append(total)
        total += -(-s // alignment) * alignment
    host = np.full(total, -1, dtype=np.int32)
    for e, (off, s) in enumerate(zip(offsets, sizes)):
        host[off:off + s] = e
    return cupy.asarray(host), offsets
