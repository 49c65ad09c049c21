"""Test data that makes scale mistakes visible (block-varied magnitudes)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._common import BLOCK_K, _ceil_div

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["block_varied_normal"]


# ---------------------------------------------------------------------------
# Test data
# ---------------------------------------------------------------------------

def block_varied_normal(rng: np.random.Generator, shape: Sequence[int], *,
                        block: tuple[int, int] = (1, BLOCK_K), spread: int = 3) -> np.ndarray:
    """Normal data with each block multiplied by ``2^u``, ``u`` uniform in [-spread, spread].

    "Block-varied data": a scale mis-indexing changes the
    answer by O(1) instead of hiding in noise.  Use ``block=(1, 128)`` for
    activations ``[m, k]`` and ``(128, 128)`` for weights ``[n, k]``; blocks
    tile the last two dims (partial blocks at the edges), leading dims get
    independent exponents.

    Parameters
    ----------
    rng : numpy.random.Generator
    shape : tuple of int, at least 2 dims.
    block : (rows, cols), keyword-only.
    spread : int >= 0, keyword-only.

    Returns
    -------
    numpy.ndarray of float32, ``shape``.  Multiplying by 2^u is exact.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        raise ValueError(f"shape must have at least 2 dims, got {shape}")
    br, bc = (int(block[0]), int(block[1]))
    if br < 1 or bc < 1 or int(spread) < 0:
        raise ValueError(f"block must be positive and spread >= 0, got {block}, {spread}")
    *lead, r, c = shape
    x = rng.standard_normal(shape, dtype=np.float32)
    u = rng.integers(-int(spread), int(spread) + 1,
                     size=(*lead, _ceil_div(r, br), _ceil_div(c, bc)))
    u = np.repeat(np.repeat(u, br, axis=-2)[..., :r, :], bc, axis=-1)[..., :c]
    return np.ldexp(x, u.astype(np.int32)).astype(np.float32)
