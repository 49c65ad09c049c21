"""Helpers shared by the GPU tests: FP8 test data, a float64 reference computed
on the GPU from the dequantised operands, the per-element error bound, and
poisoned outputs with guard rows and columns; and the e4m3 payload
comparison the quantisation tests share with their CPU emulation test
(NumPy only: this module imports no CuPy).

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


def _scales_f64(cp, s):
    # Widen on the host: CuPy's own kernels run with -ftz=true and would flush
    # subnormal scales (e.g. 1e-40) to zero in an on-device astype.
    return cp.asarray(cp.asnumpy(s).astype(np.float64))


def make_operands(cp, rng, m, n, k, *, spread=3):
    """Random FP8 operands of a normal GEMM: (a, sfa, b, sfb), sfa row-major."""
    kb, nb = -(-k // 128), -(-n // 128)
    a = random_fp8(cp, rng, (m, k))
    b = random_fp8(cp, rng, (n, k))
    sfa = random_scales(cp, rng, (m, kb), spread=spread)
    sfb = random_scales(cp, rng, (nb, kb), spread=spread)
    return a, sfa, b, sfb


def dequant_lhs(cp, a, sfa):
    """float64 A * SFA broadcast over 128-wide K groups; a [..., m, k]."""
    k = a.shape[-1]
    x = e4m3_lut(cp)[a]
    s = cp.repeat(_scales_f64(cp, sfa), 128, axis=-1)[..., :k]
    return x * s


def dequant_rhs(cp, b, sfb):
    n, k = b.shape[-2:]
    x = e4m3_lut(cp)[b]
    s = cp.repeat(cp.repeat(_scales_f64(cp, sfb), 128, axis=-1), 128, axis=-2)[..., :n, :k]
    return x * s


def reference_and_bound(cp, a, sfa, b, sfb):
    """(ref, bound): the float64 product of the dequantised operands and a
    per-element bound on |kernel_bf16 - ref| for a correct promoted kernel.

    Model of the error (DeepGEMM issues #50 / #176): inside each 32-deep
    WGMMA step the tensor core aligns the FP8 products to the largest exponent
    and keeps about 13 bits, so step c loses at most 33 * 2^-13 * max_c|p|
    <= 33 * 2^-13 * sqrt(Q_c), Q_c = sum of squared products of the step.
    Summed over the K/32 steps (Cauchy-Schwarz):
        tc <= 33 * 2^-13 * sqrt(K/32) * sqrt(Q),  Q = (A*SFA)^2 @ ((B*SFB)^2)^T.
    Promotion adds are FP32 (kb * 2^-23 * S, S = |A*SFA| @ |B*SFB|^T), BF16
    rounding is half an ulp (2^-8 |ref| with margin), plus BF16's smallest
    normal.  Tests pair this loose per-element bound with the tight
    :func:`check_rows` relative-error check, which a wrong scale or tile fails.
    """
    da, db = dequant_lhs(cp, a, sfa), dequant_rhs(cp, b, sfb)
    ref = da @ db.T
    k = a.shape[-1]
    kb = -(-k // 128)
    s = cp.abs(da) @ cp.abs(db).T
    q = (da * da) @ (db * db).T
    tc = 33 * 2.0 ** -13 * np.sqrt(max(1, -(-k // 32))) * cp.sqrt(q)
    bound = tc + kb * 2.0 ** -23 * s + 2.0 ** -8 * cp.abs(ref) + 2.0 ** -126
    return ref, bound


#: The global relative error a correct BF16 result may have: BF16's
#: round-to-nearest alone reaches 2^-8 relative on every element, so on a
#: small output the norm of the error can too (hypothesis found 3.08e-3 at
#: m = 1, n = 8, k = 144, the kernel's output equal bit for bit to the
#: promotion model rounded to BF16), plus the FP8 accumulation's share.
GLOBAL_TOL = 2.0 ** -8 + 2e-4


def check_rows(cp, got, ref, *, tol=1e-2, what=""):
    """Per-row relative Frobenius error <= tol and global <= GLOBAL_TOL (a
    global metric alone hides a few bad rows; adversarial.md invariants)."""
    err = got - ref
    rn = cp.sqrt(cp.sum(ref * ref, axis=-1))
    en = cp.sqrt(cp.sum(err * err, axis=-1))
    rows = en > tol * rn + 1e-30
    if bool(rows.any()):
        i = int(cp.argmax(cp.where(rows, en / (rn + 1e-300), 0)))
        raise AssertionError(f"{what}: {int(rows.sum())} rows with relative error > {tol}; "
                             f"worst row {i}: {float(en[i] / (rn[i] + 1e-300)):.3e}")
    tot = float(cp.linalg.norm(err)) / (float(cp.linalg.norm(ref)) + 1e-300)
    assert tot <= GLOBAL_TOL or float(cp.linalg.norm(ref)) == 0, f"{what}: global relative error {tot:.3e}"


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
    finite = cp.isfinite(ref).all(axis=-1)
    if bool(finite.all()):
        check_rows(cp, got, ref, what=what)
    return float(cp.max(err / (cp.abs(ref) + 1e-30)))


def calc_diff(cp, x, y):
    x = x.astype(cp.float64)
    y = y.astype(cp.float64)
    den = float(cp.sum(x * x + y * y))
    return 0.0 if den == 0 else 1.0 - 2.0 * float(cp.sum(x * y)) / den


def assert_payload_equal(got, want, what="payload"):
    """Bit-exact comparison of two e4m3 payloads (uint8 host arrays), every
    NaN code (0x7F / 0xFF) counted equal to every other; reports the first
    mismatching byte."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == np.uint8 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    nan_g, nan_w = (got & 0x7F) == 0x7F, (want & 0x7F) == 0x7F
    bad = (nan_g != nan_w) | (~nan_w & (got != want))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} bytes differ; first at "
                             f"{idx}: got {int(got[idx]):#04x}, want {int(want[idx]):#04x}")


def launch_forced(cp, cfg, a, sfa, b, sfb, m, n, k):
    """Launch the normal GEMM with the forced config ``cfg`` into a poisoned
    ``[m, n]`` output (``sfa`` row-major: converted to the kernel's layout
    here) and check the guard rows and columns; returns the output."""
    import cugemm8
    from cugemm8 import gemm
    out, full = poisoned_out(cp, m, n)
    gemm._launch(cfg, "normal", n, k, 1, m, m, a, cugemm8.get_col_major_tma_aligned_tensor(sfa), b, sfb,
                 out, None, 1)
    assert guards_intact(cp, full, m, n), f"{cfg}: a guard row/column was written"
    return out


def run_forced(cp, cfg, m, n, k, seed, *, reruns=1, rows_too=False):
    """Fresh operands from ``seed``, ``cfg`` launched ``1 + reruns`` times
    (:func:`launch_forced`), the first output checked against the float64
    reference within the bound (and per row with ``rows_too``), the reruns
    bit for bit against it; returns ``(a, sfa, b, sfb, out)``."""
    rng = np.random.default_rng(seed)
    a, sfa, b, sfb = make_operands(cp, rng, m, n, k)
    outs = [launch_forced(cp, cfg, a, sfa, b, sfb, m, n, k) for _ in range(1 + reruns)]
    ref, bound = reference_and_bound(cp, a, sfa, b, sfb)
    check_against(cp, outs[0], ref, bound, what=f"{cfg} m={m} n={n} k={k}")
    if rows_too:
        check_rows(cp, outs[0], ref, what=f"{cfg} m={m} n={n} k={k}")
    for o in outs[1:]:
        assert bool(cp.all(outs[0].view(cp.uint16) == o.view(cp.uint16))), f"{cfg}: rerun differs"
    return a, sfa, b, sfb, outs[0]


def check_split_against_model(cp, cfg, m, n, k, seed, *, distinct_from=None, **model_kw):
    """Fresh operands, two poisoned launches of ``cfg`` (guards checked,
    bit-identical reruns), and the output equal bit for bit to the promotion
    model (:func:`cugemm8.reference.promoted_accumulation_model`) with
    ``model_kw`` (its split-K summation order).

    ``distinct_from`` (other model keywords, e.g. another split point): the
    operands are the first drawn from ``seed``, ``seed + 1``, ... (at most
    32) on which the two models' BF16 outputs differ somewhere, so that the
    comparison tells the two summation orders apart (a last-bit difference
    of FP32 sums often rounds away in BF16: at M = 8, N = 1000 two split
    points give the same bits for most seeds)."""
    from cugemm8 import reference as R

    def model_bits(a, sfa, b, sfb, **kw):
        model = R.promoted_accumulation_model(cp.asnumpy(a), cp.asnumpy(sfa), cp.asnumpy(b), cp.asnumpy(sfb),
                                              tensor_core="hopper", **kw)
        return R.round_to_bf16(model).view(np.uint16)

    for s in range(seed, seed + (32 if distinct_from is not None else 1)):
        a, sfa, b, sfb = make_operands(cp, np.random.default_rng(s), m, n, k)
        want = model_bits(a, sfa, b, sfb, **model_kw)
        if distinct_from is None or np.any(want != model_bits(a, sfa, b, sfb, **distinct_from)):
            break
    else:
        raise AssertionError(f"m={m} n={n} k={k}: no seed in [{seed}, {seed + 32}) tells {model_kw} "
                             f"from {distinct_from}")
    outs = [launch_forced(cp, cfg, a, sfa, b, sfb, m, n, k) for _ in range(2)]   # poisoned, guards checked
    assert bool(cp.all(outs[0].view(cp.uint16) == outs[1].view(cp.uint16))), f"{cfg}: rerun differs"
    got = cp.asnumpy(outs[0].view(cp.uint16))
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{cfg} m={m} n={n} k={k}: {len(bad)} outputs differ from the model, first at {tuple(bad[0])}"


def check_special_value_rows(cp, cfg, m, n, k):
    """A NaN in one token's row (row 2) stays in that token's output row; a
    zero token row (row 4) gives zeros; the other rows match the reference
    within the bound.  ``cfg`` forced (:func:`launch_forced`), m >= 6."""
    rng = np.random.default_rng(5)
    a, sfa, b, sfb = make_operands(cp, rng, m, n, k)
    a[2, 100] = 0x7F               # e4m3 NaN
    a[4, :] = 0
    out = launch_forced(cp, cfg, a, sfa, b, sfb, m, n, k)
    got = to_f64(cp, out)
    assert bool(cp.all(cp.isnan(got[2])))
    assert bool(cp.all(got[4] == 0))
    a[2, 100] = 0
    ref, bound = reference_and_bound(cp, a, sfa, b, sfb)
    keep = [r for r in range(m) if r not in (2, 4)]
    check_against(cp, out[keep], ref[keep], bound[keep], what=f"{cfg} rows without NaN")
