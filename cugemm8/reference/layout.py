"""The contiguous grouped layout (``m_indices`` and the experts' row offsets),
built on the host with NumPy.  :func:`cugemm8.make_contiguous_layout` runs the
same code and copies ``m_indices`` to the GPU."""
from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

import numpy as np

from ._common import BLOCK_K

__all__ = ["make_m_indices"]


#: Largest ``m_sum`` (rows of the stacked layout): the grouped GEMMs' row
#: coordinates are int32 (TMA).
MAX_ROWS = 2 ** 31 - 1


def _check_layout_args(group_sizes: Iterable[int], alignment: int,
                       multiple: int = 1) -> tuple[list[int], int, list[int]]:
    """Validate the arguments of :func:`make_m_indices` (``alignment`` must be
    a multiple of ``multiple``: 128 for the GPU layout) from the sizes alone,
    before anything is allocated.  Returns ``(sizes, alignment, offsets)``,
    ``offsets`` the ``g + 1`` row offsets as Python ints."""
    # An ordered sequence (list, tuple, range, 1-D NumPy array): a mapping
    # would give its keys and a set an arbitrary order.
    if (isinstance(group_sizes, (str, bytes, Mapping, AbstractSet))
            or not isinstance(group_sizes, Iterable)):
        raise TypeError(f"group_sizes must be a sequence of ints, one per expert, "
                        f"got {type(group_sizes).__name__}")
    sizes = list(group_sizes)
    for s in sizes:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Integral):
            raise TypeError(f"group_sizes must hold ints, got {s!r} ({type(s).__name__})")
    sizes = [int(s) for s in sizes]
    if any(s < 0 for s in sizes):
        raise ValueError(f"group_sizes must be non-negative, got {sizes}")
    if (isinstance(alignment, (bool, np.bool_)) or not isinstance(alignment, numbers.Integral)
            or alignment <= 0 or alignment % multiple):
        if multiple == 1:
            raise ValueError(f"alignment = {alignment!r} must be a positive int")
        raise ValueError(f"alignment = {alignment!r} must be a positive multiple of "
                         f"{multiple} (every {multiple}-row block must hold one expert)")
    alignment = int(alignment)
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + -(-s // alignment) * alignment)
    if offsets[-1] > MAX_ROWS:
        raise ValueError(f"group_sizes pad to m_sum = {offsets[-1]} rows; the grouped GEMMs take "
                         f"at most 2^31 - 1 rows (int32 TMA coordinates)")
    return sizes, alignment, offsets


def _build_layout(sizes: list[int], offsets: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(m_indices, offsets)`` as NumPy arrays from checked sizes and offsets."""
    m_indices = np.full(offsets[-1], -1, dtype=np.int32)
    for e, (start, size) in enumerate(zip(offsets, sizes)):
        m_indices[start:start + size] = e
    return m_indices, np.asarray(offsets, dtype=np.int64)


def make_m_indices(group_sizes: Iterable[int], alignment: int = BLOCK_K
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Build the contiguous grouped layout: ``m_indices`` and the row offsets.

    Alignment rule (DeepGEMM README: "the contiguous grouped
    layout needs group starts at multiples of 128"): expert ``i``'s rows start
    at ``offsets[i]``, a multiple of ``alignment``; its ``group_sizes[i]``
    token rows come first and are followed by padding rows (``m_indices =
    -1``) up to the next multiple of ``alignment``.  An expert with 0 rows
    gets no block at all (``offsets[i] == offsets[i+1]``).  Every
    ``alignment``-row block therefore belongs to at most one expert.

    This is the one contiguous-layout helper: :func:`cugemm8.make_contiguous_layout`
    returns the same two arrays (``m_indices`` copied to the GPU) and
    accepts only alignments that are multiples of 128, as the kernels need.
    ``m_indices`` is DeepGEMM's (``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous``):
    one int32 per row, the row's expert or ``-1``.

    Parameters
    ----------
    group_sizes : sequence of int >= 0, length g (a list, tuple, range or
        1-D integer NumPy array; one token count per expert, in expert order).
    alignment : int >= 1 (default 128 = the contiguous kernels' row alignment).

    Returns
    -------
    m_indices : numpy.ndarray of int32, ``[m_sum]`` with
        ``m_sum = sum_i ceil(group_sizes[i] / alignment) * alignment``:
        row ``r``'s expert, or ``-1`` for a padding row.
    offsets : numpy.ndarray of int64, ``[g + 1]``; expert ``i`` owns rows
        ``offsets[i] : offsets[i+1]``, its tokens being
        ``offsets[i] : offsets[i] + group_sizes[i]``; ``offsets[0] = 0`` and
        ``offsets[g] = m_sum``.

    Raises
    ------
    TypeError
        ``group_sizes`` is not an ordered sequence (a mapping, a set, a
        string, a scalar) or holds something other than ints (bools and
        floats included).
    ValueError
        For negative sizes, an ``alignment`` that is not a positive int, or
        a padded ``m_sum`` beyond 2^31 - 1 rows (checked before anything is
        allocated).
    """
    sizes, _, offsets = _check_layout_args(group_sizes, alignment)
    return _build_layout(sizes, offsets)
