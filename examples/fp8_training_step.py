"""One FP8 training step of a DeepSeek-V3 MLP and of a MoE expert layer, and a tiny FP8 regression.

    python examples/fp8_training_step.py            # on a Hopper GPU: cugemm8's kernels on CuPy
    python examples/fp8_training_step.py --cpu      # anywhere: the same steps on cugemm8.reference
    python examples/fp8_training_step.py --jax      # the MLP step with JAX arrays (DLPack, GPU)

DeepSeek-V3's FP8 recipe (technical report §3.3) for a linear layer
``y = x w^T`` (``x [tokens, k]``, ``w [n, k]``):

* forward:  ``y = x w^T``, x quantised 1x128 (``per_token_cast_to_fp8``), w
  128x128 (``per_block_cast_to_fp8``), BF16 out (the 1D2D GEMM);
* dgrad:    ``dx = dy w``, dy 1x128 along n, ``w^T`` from the cast-transpose
  ``cast_transpose_block_fp8(w)`` (transposed 128x128 scales), BF16 out;
* wgrad:    ``dw = dy^T x``, both quantised 1x128 along the *tokens*
  (``per_token_cast_to_fp8_t``), the 1D1D GEMM with FP32 out
  (``fp8_gemm_nt`` with an FP32 ``d``), accumulated into the gradient
  buffer in place (``c = d``).

Part 1 runs forward and backward of a SwiGLU MLP (``W1 [2I, H]`` gate and
up, ``W2 [H, I]``) and checks every output and gradient against float64
NumPy math on the same BF16 inputs, without autograd.  Part 2 runs a MoE
expert layer (``g`` experts, tokens grouped by expert, each group padded to
128 rows): forward and dgrad with the contiguous grouped GEMM, wgrad with
``k_grouped_fp8_gemm_nt_contiguous`` (expert ``e`` owns its padded tokens).
Part 3 fits a linear regression ``y = x W^T`` by gradient descent with FP8
forward and FP8 weight gradients, beside the same run in BF16 / FP32
(``--steps`` steps), and compares the loss curves.

Tolerances (relative Frobenius error against float64, or between the loss
curves): each FP8 GEMM of normal data is about 3.7 % off because both
operands are rounded to e4m3 (README; tests/test_readme_gpu.py), and a
gradient passes through two or three of them, so GRAD_TOLERANCE is 0.1.
The two loss curves (each divided by its initial loss) may differ by
LOSS_TOLERANCE = 0.01 at every step, and both must fall below 1 % of where
they started: the FP8 run's floor is the e4m3 rounding of its prediction,
about (0.037)^2 = 1.4e-3 of the initial loss, and its gradients' few-percent
error slows each step by as much.  The script exits 1 when a check fails, 2 without a GPU in GPU
mode.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GRAD_TOLERANCE = 0.10
LOSS_TOLERANCE = 0.01


# ----------------------------------------------------------------------------
# Two backends with one interface: cugemm8 on CuPy (GPU), cugemm8.reference (CPU)
# ----------------------------------------------------------------------------

class CpuBackend:
    """The FP8 steps on cugemm8.reference: bit-identical quantisers, float64
    GEMMs of the quantised operands (BF16 outputs rounded to BF16)."""
    name = "CPU (cugemm8.reference)"

    def __init__(self):
        import cugemm8.reference as R
        self.R, self.xp = R, np

    def asarray(self, x):
        return np.asarray(x, np.float32)

    def to_numpy(self, x):
        return np.asarray(x, np.float64)

    def bf16(self, x):
        return self.R.round_to_bf16(np.asarray(x, np.float64)).astype(np.float32)

    def quant_w(self, w):
        return self.R.per_block_cast_to_fp8(w)

    def quant_w_t(self, w):
        return self.R.cast_transpose_block_fp8(w)

    def linear(self, x, w_q):
        """``x w^T`` (w_q from quant_w) or ``x (w^T)^T`` (from quant_w_t), BF16 out."""
        a, sfa = self.R.per_token_cast_to_fp8(x)
        b, sfb = w_q
        return self.bf16(self.R.ref_gemm_nt(a, sfa, b[:, :a.shape[1]], sfb))

    def wgrad(self, dy, x, acc):
        """``acc += dy^T x`` (FP32)."""
        a, sfa = self.R.per_token_cast_to_fp8_t(dy)
        b, sfb = self.R.per_token_cast_to_fp8_t(x)
        acc[...] = self.R.ref_gemm_1d1d(a, sfa, b, sfb, acc).astype(np.float32)

    def grouped_linear(self, x, w_q, m_indices):
        a, sfa = self.R.per_token_cast_to_fp8(x)
        b, sfb = w_q
        return self.bf16(self.R.ref_gemm_contiguous(a, sfa, b[:, :, :a.shape[1]], sfb, m_indices))

    def k_grouped_wgrad(self, dy, x, ks, acc):
        a, sfa = self.R.per_token_cast_to_fp8_t(dy)
        b, sfb = self.R.per_token_cast_to_fp8_t(x)
        acc[...] = self.R.ref_k_grouped_gemm(a, sfa, b, sfb, ks, acc).astype(np.float32)

    def synchronize(self):
        pass


class GpuBackend:
    """The FP8 steps on cugemm8's kernels (CuPy arrays, BF16 activations)."""
    name = "GPU (cugemm8 on CuPy)"

    def __init__(self):
        import cupy
        import cugemm8
        self.cp, self.c8, self.xp = cupy, cugemm8, cupy
        self.bf16_dtype = cupy.dtype("bfloat16")

    def asarray(self, x):
        return self.cp.asarray(np.asarray(x, np.float32))

    def to_numpy(self, x):
        return self.cp.asnumpy(x.astype(self.cp.float32)).astype(np.float64)

    def bf16(self, x):
        return x.astype(self.bf16_dtype).astype(self.cp.float32)

    def quant_w(self, w):
        return self.c8.per_block_cast_to_fp8(w.astype(self.bf16_dtype))

    def quant_w_t(self, w):
        return self.c8.cast_transpose_block_fp8(w.astype(self.bf16_dtype))

    def linear(self, x, w_q):
        b, sfb = w_q
        a, sfa = self.c8.per_token_cast_to_fp8(x.astype(self.bf16_dtype))
        k = a.shape[1]
        out = self.cp.empty((x.shape[0], b.shape[0]), self.bf16_dtype)
        self.c8.gemm_fp8_fp8_bf16_nt((a, sfa), (b[:, :k], sfb), out)
        return out.astype(self.cp.float32)

    def wgrad(self, dy, x, acc):
        # mn_major: the scales in the layout the 1D1D GEMM reads (no conversion in the call)
        a, sfa = self.c8.per_token_cast_to_fp8_t(dy.astype(self.bf16_dtype), mn_major=True)
        b, sfb = self.c8.per_token_cast_to_fp8_t(x.astype(self.bf16_dtype), mn_major=True)
        self.c8.fp8_gemm_nt((a, sfa), (b, sfb), acc, c=acc)

    def grouped_linear(self, x, w_q, m_indices):
        b, sfb = w_q
        a, sfa = self.c8.per_token_cast_to_fp8(x.astype(self.bf16_dtype))
        k = a.shape[1]
        out = self.cp.empty((x.shape[0], b.shape[1]), self.bf16_dtype)
        mi = self.cp.asarray(np.asarray(m_indices, np.int32))
        self.c8.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (self.cp.ascontiguousarray(b[:, :, :k]), sfb),
                                                         out, mi)
        return out.astype(self.cp.float32)

    def k_grouped_wgrad(self, dy, x, ks, acc):
        a, sfa = self.c8.per_token_cast_to_fp8_t(dy.astype(self.bf16_dtype), mn_major=True)
        b, sfb = self.c8.per_token_cast_to_fp8_t(x.astype(self.bf16_dtype), mn_major=True)
        kt = sum(ks)
        self.c8.k_grouped_fp8_gemm_nt_contiguous((a[:, :kt], sfa), (b[:, :kt], sfb), acc, ks, None, c=acc)

    def synchronize(self):
        self.cp.cuda.runtime.deviceSynchronize()


def quant_w_stack(be, ws, transpose: bool):
    """Per-expert weight quantisation, stacked into ``[g, ...]`` payloads and scales."""
    q = [be.quant_w_t(w) if transpose else be.quant_w(w) for w in ws]
    xp = be.xp
    return xp.stack([p for p, _ in q]), xp.stack([s for _, s in q])


def rel(got, want) -> float:
    want = np.asarray(want, np.float64)
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want))


# ----------------------------------------------------------------------------
# Part 1: a SwiGLU MLP, forward and backward
# ----------------------------------------------------------------------------

def silu_parts(xp, g):
    sig = 1.0 / (1.0 + xp.exp(-g))
    return g * sig, sig


def mlp_step(be, x, w1, w2, dy):
    """FP8 forward and backward; returns (y, dx, dw1, dw2) as float64 NumPy."""
    xp = be.xp
    inter = w2.shape[1]
    h = be.linear(x, be.quant_w(w1))                         # [T, 2I]
    g, u = h[:, :inter], h[:, inter:]
    s, sig = silu_parts(xp, g)
    act = be.bf16(s * u)                                     # [T, I]
    y = be.linear(act, be.quant_w(w2))                       # [T, H]
    d_act = be.linear(dy, be.quant_w_t(w2))                  # dgrad: dy W2 -> [T, I]
    dw2 = xp.zeros(w2.shape, xp.float32)
    be.wgrad(dy, act, dw2)                                   # dy^T act -> [H, I]
    dg = d_act * u * sig * (1.0 + g * (1.0 - sig))
    du = d_act * s
    dh = be.bf16(xp.concatenate([dg, du], axis=1))           # [T, 2I]
    dx = be.linear(dh, be.quant_w_t(w1))                     # dh W1 -> [T, H]
    dw1 = xp.zeros(w1.shape, xp.float32)
    be.wgrad(dh, x, dw1)                                     # dh^T x -> [2I, H]
    be.synchronize()
    return tuple(be.to_numpy(v) for v in (y, dx, dw1, dw2))


def mlp_reference(x, w1, w2, dy):
    """The same MLP in float64, no quantisation (the BF16 inputs as given)."""
    x, w1, w2, dy = (np.asarray(v, np.float64) for v in (x, w1, w2, dy))
    inter = w2.shape[1]
    h = x @ w1.T
    g, u = h[:, :inter], h[:, inter:]
    s, sig = silu_parts(np, g)
    act = s * u
    y = act @ w2.T
    d_act = dy @ w2
    dw2 = dy.T @ act
    dh = np.concatenate([d_act * u * sig * (1.0 + g * (1.0 - sig)), d_act * s], axis=1)
    return y, dh @ w1, dh.T @ x, dw2


# ----------------------------------------------------------------------------
# Part 2: a MoE expert layer (y_e = x_e W_e^T), forward, dgrad, k-grouped wgrad
# ----------------------------------------------------------------------------

def moe_layout(counts):
    """Contiguous layout: each expert's rows padded to a multiple of 128;
    returns (m_indices, padded row offset of each expert, padded counts)."""
    padded = [-(-c // 128) * 128 for c in counts]
    m_indices = np.full(sum(padded), -1, np.int32)
    offs = np.cumsum([0] + padded)
    for e, c in enumerate(counts):
        m_indices[offs[e]:offs[e] + c] = e
    return m_indices, offs, padded


def moe_step(be, xs, ws, dys):
    """xs[e] [c_e, K], ws[e] [N, K], dys[e] [c_e, N]: (y, dx, dw) per expert (float64 NumPy)."""
    xp = be.xp
    counts = [x.shape[0] for x in xs]
    m_indices, offs, padded = moe_layout(counts)
    k, n = xs[0].shape[1], ws[0].shape[0]

    def stack_rows(parts, width):
        out = xp.zeros((int(offs[-1]), width), xp.float32)
        for e, p in enumerate(parts):
            out[offs[e]:offs[e] + p.shape[0]] = p
        return out
    x_all, dy_all = stack_rows(xs, k), stack_rows(dys, n)
    y_all = be.grouped_linear(x_all, quant_w_stack(be, ws, False), m_indices)
    dx_all = be.grouped_linear(dy_all, quant_w_stack(be, ws, True), m_indices)
    dw = xp.zeros((len(ws), n, k), xp.float32)
    be.k_grouped_wgrad(dy_all, x_all, padded, dw)            # padding rows are zero in both
    be.synchronize()
    y, dx, dwn = be.to_numpy(y_all), be.to_numpy(dx_all), be.to_numpy(dw)
    return ([y[offs[e]:offs[e] + c] for e, c in enumerate(counts)],
            [dx[offs[e]:offs[e] + c] for e, c in enumerate(counts)], list(dwn))


# ----------------------------------------------------------------------------
# Part 3: a tiny regression, FP8 against BF16 / FP32
# ----------------------------------------------------------------------------

def regression(be, rng, steps: int, tokens: int, k: int, n: int, lr: float):
    """Gradient descent on ``L(W) = mean over tokens of |x_t W^T - y_t|^2``
    (``y = x W_true^T`` plus 1 % noise); returns the two loss curves, each
    normalised by its first value."""
    x = be.bf16(be.asarray(rng.standard_normal((tokens, k))))
    w_true = rng.standard_normal((n, k)) / np.sqrt(k)
    y = be.bf16(be.asarray(np.asarray(be.to_numpy(x)) @ w_true.T + 0.01 * rng.standard_normal((tokens, n))))
    w_fp8 = be.asarray(np.zeros((n, k)))
    w_ref = np.zeros((n, k))
    x64, y64 = be.to_numpy(x), be.to_numpy(y)
    curves = ([], [])
    scale = 2.0 / tokens             # dL/dW = (2 / tokens) r^T x; the Hessian is about 2 I
    for _ in range(steps):
        # FP8: forward through the 1D2D GEMM, weight gradient through the 1D1D one.
        pred = be.linear(x, be.quant_w(be.bf16(w_fp8)))
        r = pred - y
        curves[0].append(float(np.sum(be.to_numpy(r) ** 2) / tokens))
        grad = be.xp.zeros((n, k), be.xp.float32)
        be.wgrad(be.bf16(r), x, grad)                        # r^T x
        w_fp8 = w_fp8 - lr * scale * grad
        # BF16 weights and activations, FP32 arithmetic.
        w_b = np.asarray(be.to_numpy(be.bf16(be.asarray(w_ref))))
        r_ref = x64 @ w_b.T - y64
        curves[1].append(float(np.sum(r_ref ** 2) / tokens))
        w_ref = w_ref - lr * scale * (r_ref.T @ x64)
    be.synchronize()
    return [v / curves[0][0] for v in curves[0]], [v / curves[1][0] for v in curves[1]]


# ----------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--cpu", action="store_true", help="run on cugemm8.reference (NumPy), no GPU")
    mode.add_argument("--jax", action="store_true", help="part 1 with JAX arrays through DLPack (GPU)")
    p.add_argument("--tokens", type=int, default=None, help="tokens of part 1 (default 512 GPU, 256 CPU)")
    p.add_argument("--steps", type=int, default=16, help="gradient-descent steps of part 3 (>= 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random input")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error(f"--steps must be at least 2, got {args.steps}")
    if args.tokens is not None and args.tokens < 1:
        p.error(f"--tokens must be positive, got {args.tokens}")
    rng = np.random.default_rng(args.seed)
    if args.cpu:
        be = CpuBackend()
        hidden, inter, tokens = 512, 256, args.tokens if args.tokens is not None else 256
        moe = dict(g=4, n=256, k=512, counts=[150, 0, 300, 77])
        reg = dict(tokens=512, k=256, n=128)
    else:
        from cugemm8 import _device
        reason = _device.gpu_unavailable_reason()
        if reason is not None:
            print(f"no usable Hopper GPU ({reason}); run with --cpu for the reference backend")
            return 2
        be = GpuBackend()
        hidden, inter, tokens = 7168, 2048, args.tokens if args.tokens is not None else 512   # a DeepSeek-V3 expert MLP
        moe = dict(g=6, n=2048, k=7168, counts=[300, 0, 517, 128, 1000, 64])   # float64 checks on the host
        reg = dict(tokens=2048, k=1024, n=512)
    print(f"backend: {be.name}")
    ok = True

    def bf16_host(a):
        return np.asarray(be.to_numpy(be.bf16(be.asarray(a))))

    # Part 1
    x = bf16_host(rng.standard_normal((tokens, hidden)))
    w1 = bf16_host(rng.standard_normal((2 * inter, hidden)) / np.sqrt(hidden))
    w2 = bf16_host(rng.standard_normal((hidden, inter)) / np.sqrt(inter))
    dy = bf16_host(rng.standard_normal((tokens, hidden)))
    t0 = time.perf_counter()
    if args.jax:
        got = jax_mlp_step(be, x, w1, w2, dy)
    else:
        got = mlp_step(be, be.asarray(x), be.asarray(w1), be.asarray(w2), be.asarray(dy))
    t1 = time.perf_counter()
    want = mlp_reference(x, w1, w2, dy)
    print(f"part 1: SwiGLU MLP {tokens} tokens, hidden {hidden}, intermediate {inter}"
          f"{' (JAX arrays)' if args.jax else ''}: {1e3 * (t1 - t0):.0f} ms")
    for name, g, w in zip(("y", "dx", "dW1", "dW2"), got, want):
        e = rel(g, w)
        ok &= e <= GRAD_TOLERANCE
        print(f"  {name:4s} relative error vs float64 {e:.4f} {'ok' if e <= GRAD_TOLERANCE else 'FAIL'}")

    # Part 2
    g_, n_, k_ = moe["g"], moe["n"], moe["k"]
    xs = [bf16_host(rng.standard_normal((c, k_))) for c in moe["counts"]]
    ws = [bf16_host(rng.standard_normal((n_, k_)) / np.sqrt(k_)) for _ in range(g_)]
    dys = [bf16_host(rng.standard_normal((c, n_))) for c in moe["counts"]]
    ys, dxs, dws = moe_step(be, [be.asarray(v) for v in xs], [be.asarray(v) for v in ws],
                            [be.asarray(v) for v in dys])
    print(f"part 2: MoE expert layer, {g_} experts with {moe['counts']} tokens, N = {n_}, K = {k_}")
    worst = {"y": 0.0, "dx": 0.0, "dW": 0.0}
    for e, c in enumerate(moe["counts"]):
        if c == 0:
            zero = bool(np.all(dws[e] == 0))              # an expert with no tokens has a zero gradient
            ok &= zero
            print(f"  expert {e} has no tokens: its dW is {'zero, ok' if zero else 'NOT zero: FAIL'}")
            continue
        worst["y"] = max(worst["y"], rel(ys[e], xs[e] @ ws[e].T))
        worst["dx"] = max(worst["dx"], rel(dxs[e], dys[e] @ ws[e]))
        worst["dW"] = max(worst["dW"], rel(dws[e], dys[e].T @ xs[e]))
    for name, e in worst.items():
        ok &= e <= GRAD_TOLERANCE
        print(f"  {name:4s} worst expert's relative error {e:.4f} {'ok' if e <= GRAD_TOLERANCE else 'FAIL'}")

    # Part 3
    fp8, ref = regression(be, rng, args.steps, reg["tokens"], reg["k"], reg["n"], lr=0.2)
    dev = max(abs(a - b) for a, b in zip(fp8, ref))
    converged = fp8[-1] < 0.01 and ref[-1] < 0.01
    ok &= dev <= LOSS_TOLERANCE and converged
    print(f"part 3: regression {reg['tokens']} x {reg['k']} -> {reg['n']}, {args.steps} steps; "
          f"loss / initial loss")
    print("  step  " + " ".join(f"{i:>8d}" for i in range(len(fp8))))
    print("  FP8   " + " ".join(f"{v:8.4f}" for v in fp8))
    print("  BF16  " + " ".join(f"{v:8.4f}" for v in ref))
    print(f"  largest difference {dev:.5f} of the initial loss {'ok' if dev <= LOSS_TOLERANCE else 'FAIL'}")
    print(f"  final loss below 1 % of the initial one in both runs: {'ok' if converged else 'FAIL (more --steps?)'}")
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


def jax_mlp_step(be, x, w1, w2, dy):
    """Part 1 with the activations and weights held by JAX (GPU): each array
    crosses to CuPy through DLPack without a copy (cugemm8.interop.to_cupy)."""
    import jax.numpy as jnp
    from cugemm8 import interop
    arrays = [jnp.asarray(v, jnp.bfloat16) for v in (x, w1, w2, dy)]
    cx, cw1, cw2, cdy = (interop.to_cupy(a).astype(be.cp.float32) for a in arrays)
    return mlp_step(be, cx, cw1, cw2, cdy)


if __name__ == "__main__":
    sys.exit(main())
