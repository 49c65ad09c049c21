"""Helpers shared by the GPU tests: FP8 test data, a float64 reference computed
on the GPU from the dequantised operands, the per-element error bound, and
poisoned outputs with guard rows and columns.

The reference here is the same math as :func:`cugemm8.reference.ref_gemm_nt`
(dequantise A and B in float64, multiply), run with CuPy so the large
DeepSeek-V3 shapes stay fast; small shapes are cross-checked against the
NumPy reference itself in the tests.
"""
from __future__ import annotations

import numpy as np

import ml_dtypes

POISON_BITS = 0x7FC1        # a quiet-NaN bf16 pattern: any element left unwritten stays NaN

_E4M3_LUT = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def e4m3_lut(cp):
    return cp.asarray(_E4M3_LUT)


def random_fp8(cp, rng, shape, *, nan_free=True):
    """Uniformly random e4m3fn bit patterns (every finite code, both signs)."""
    bits = rng.integers(0, 256, size=shape, dtype=np.uint8)
    if nan_free:
        bits[(bits & 0x7F) == 0x7F] = 0x7E
    return cp.asarray(bits)


def random_scales(cp, rng, shape, *, spread=3):
    """Positive FP32 scales 2^u / 448 with u uniform in [-spread, spread]:
    "block-varied" magnitudes (adversarial.md conventions) so a scale read
    from the wrong block changes the result by O(1)."""
    u = rng.uniform(-spread, spread, size=shape)
    return cp.asarray((np.exp2(u) / 448.0).astype(np.float32))


def dequant_lhs(cp, a, sfa):
    """float64 A * SFA broadcast over 128-wide K groups; a [..., m, k]."""
    k = a.shape[-1]
    x = e4m3_lut(cp)[a]
    s = cp.repeat(sfa.astype(cp.float64), 128, axis=-1)[..., :k]
    return x * s


def dequant_rhs(cp, b, sfb):
    n, k = b.shape[-2:]
    x = e4m3_lut(cp)[b]
    s = cp.repeat(cp.repeat(sfb.astype(cp.float64), 128, axis=-1), 128, axis=-2)[..., :n, :k]
    return x * s


def reference_and_bound(cp, a, sfa, b, sfb):
    """(ref, bound): the float64 product of the dequantised operands and a
    per-element bound on |kernel_bf16 - ref| for a correct promoted kernel.

    bound = (2^-12 + kb * 2^-23) * S + 2^-8 * |ref| + 2^-126, with
    S = |A*SFA| @ |B*SFB|^T.  The first term covers the tensor core's
    per-128-K partial sums (~13-14 kept mantissa bits, DeepGEMM issues
    #50/#176) and the FP32 promotion adds; the second BF16 rounding (half an
    ulp is 2^-9 relative); the last BF16's smallest normal.  A scale read from
    the wrong block or a missing promotion gives errors far above it.
    """
    da, db = dequant_lhs(cp, a, sfa), dequant_rhs(cp, b, sfb)
    ref = da @ db.T
    s = cp.abs(da) @ cp.abs(db).T
    kb = -(-a.shape[-1] // 128)
    bound = (2.0 ** -12 + kb * 2.0 ** -23) * s + 2.0 ** -8 * cp.abs(ref) + 2.0 ** -126
    return ref, bound


def poisoned_out(cp, m, n, *, guard_rows=1, guard_cols=8, batch=None):
    """A bf16 view [m, n] (or [batch, m, n]) inside a NaN-poisoned buffer with
    guard rows above and below and guard columns to the right.

    Returns (out_view, full_buffer).  The padded row stride also exercises a
    non-contiguous (but legal) output.
    """
    shape = (m + 2 * guard_rows, n + guard_cols)
    if batch is not None:
        shape = (batch,) + shape
    full = cp.full(shape, POISON_BITS, dtype=cp.uint16).view(cp.dtype("bfloat16"))
    view = full[..., guard_rows:guard_rows + m, :n]
    return view, full


def guards_intact(cp, full, m, n, *, guard_rows=1):
    bits = full.view(cp.uint16)
    top = bits[..., :guard_rows, :]
    bottom = bits[..., guard_rows + m:, :]
    right = bits[..., :, n:]
    return bool(cp.all(top == POISON_BITS)) and bool(cp.all(bottom == POISON_BITS)) \
        and bool(cp.all(right == POISON_BITS))


def to_f64(cp, out):
    return out.astype(cp.float32).astype(cp.float64)


def check_against(cp, out, ref, bound, *, what=""):
    """Assert every element finite-where-ref-finite, within bound, and report
    the worst offender's coordinates."""
    got = to_f64(cp, out)
    err = cp.abs(got - ref)
    bad = ~(err <= bound)
    nbad = int(bad.sum())
    if nbad:
        idx = np.unravel_index(int(cp.argmax(cp.where(bad, err / (bound + 1e-300), 0))), ref.shape)
        raise AssertionError(
            f"{what}: {nbad} of {ref.size} elements outside the bound; worst at {idx}: "
            f"got {float(got[idx])!r}, ref {float(ref[idx])!r}, bound {float(bound[idx])!r}")
    return float(cp.max(err / (cp.abs(ref) + 1e-30)))


def calc_diff(cp, x, y):
    x = x.astype(cp.float64)
    y = y.astype(cp.float64)
    den = float(cp.sum(x * x + y * y))
    return 0.0 if den == 0 else 1.0 - 2.0 * float(cp.sum(x * y)) / den
