"""Multi-GPU FP8 layers with cugemm8 and CuPy's own NCCL bindings (cupy.cuda.nccl).

Two DeepSeek-V3 layers (hidden 7168), one process per visible GPU:

* **Tensor-parallel dense MLP** (intermediate 18432)::

      out = all_reduce_sum( W2_r @ (silu(W1gate_r @ x) * (W1up_r @ x)) )

  W1's gate and up halves are split by output feature (column parallel), W2
  by its K = intermediate (row parallel), so rank r holds
  ``W1_r = [gate rows r*I/N..; up rows r*I/N..]`` ``[2*I/N, 7168]`` and
  ``W2_r = W2[:, r*I/N:(r+1)*I/N]`` ``[7168, I/N]``.  Activations are
  quantised per token (``cugemm8.per_token_cast_to_fp8``), weights per
  128x128 block (``per_block_cast_to_fp8``), the GEMMs are
  ``cugemm8.gemm_fp8_fp8_bf16_nt``, and each rank's BF16 partial output is
  cast to FP32 and summed with ``allReduce(NCCL_FLOAT32, NCCL_SUM)`` on CuPy's
  current stream.

  Slice boundaries: a per-block scale covers 128 rows (W1) or 128 columns
  (W2), so every rank's slice must start and end on a multiple of 128:
  18432 / N must be a multiple of 128.  18432 = 144 * 128, so N must divide
  144: N in {1, 2, 4, 8} (and 3, 6, 9, ...) works, N = 5 or 7 does not and is
  refused.  With aligned boundaries, quantising the whole weight and
  quantising a rank's slice give the same payload bytes and the same scales
  (each 128x128 block is quantised on its own); rank 0 asserts this for every
  rank's slice and compares every rank's scales and payload checksums (NCCL
  allGather) with the slices of its full quantised weights.

  Check (rank 0): the whole layer on rank 0's GPU with the unsplit quantised
  weights: relative L2 difference < 1e-2 (the split changes only the FP32
  summation order and adds one BF16 rounding per partial output); and the
  float64 layer on the unquantised (BF16) weights computed with CuPy:
  relative L2 error < 0.1 (two chained FP8 GEMMs give about 6 %).

  Part ``overlap``: the same layer through
  ``cugemm8.parallel.mlp_forward_overlapped`` (``--chunks`` token chunks,
  chunk i's all-reduce on a communication stream under chunk i+1's GEMMs,
  ``--reserve-sms`` SMs left to NCCL).  Check (every rank): bit-identical
  to the same chunks reduced on the compute stream, and within 1e-2 of the
  unchunked layer.

* **Expert-parallel MoE step** (expert intermediate 2048, ``--experts-per-rank``
  experts per rank, default 8, top-2 routing).  Each rank routes its own
  tokens at random, quantises them per token (per-token quantisation acts on
  rows, so moving quantised rows equals quantising moved rows), and sends every
  (token, expert) row to the expert's owner: one grouped NCCL exchange of the
  counts (``groupStart`` / ``send`` / ``recv`` / ``groupEnd``), then one of
  the rows (FP8 payload, FP32 scales and the local expert id packed into one
  byte row).  The owner packs the rows into the masked layout
  ``[local_experts, m_max, 7168]`` and runs
  ``cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked`` for W1 (gate+up, 4096
  outputs), SiLU-mul, quantises, and runs the masked GEMM for W2.  The BF16
  results go back the same way (``NCCL_BFLOAT16``) and each rank combines its
  tokens' k results with the routing weights.  Rows a rank sends to itself
  are copied on the device, not through NCCL.

  Check (rank 0): tokens, routing and the quantised expert weights of every
  rank are gathered with ``allGather``; rank 0 computes every token's expert
  outputs with the plain ``gemm_fp8_fp8_bf16_nt`` per expert and combines
  them the same way: relative L2 difference < 1e-2.

  Part ``decode``: the same tokens through
  ``cugemm8.parallel.EPMoEDecodeStep``: fixed buffers (lossless capacities,
  ``expected_m`` from the gathered routing), the whole step captured into a
  CUDA graph on every rank and replayed; the same check, and no row dropped.

Test data: weights and activations come from a counter-based hash (splitmix64
+ Box-Muller, one CuPy elementwise kernel), so every rank generates exactly its
own slice, bit-identical to the same slice of rank 0's full matrix, without
shipping weights around.  Routing uses NumPy's seeded generator.

NVLink multicast (NVLS) stays off: ``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and ``NVSHMEM_DISABLE_NVLS=1`` are set in
the parent and again in every child before NCCL is touched
(``cugemm8.launch``, which also starts the processes: ``run_ranks``).  (cugemm8's "TMA
multicast" is a thread-block-cluster feature inside one GPU, unrelated to
NVLink multicast, and is off in its default configurations.)

Run on Hopper GPUs::

    python examples/tensor_parallel.py [--tokens 64,1024] [--check-only] [--nprocs N]
                                       [--num-sms N] [--experts-per-rank 8]
                                       [--parts tp,overlap,ep,decode] [--chunks 2]
                                       [--reserve-sms 8]

Prints one line per rank per check and a summary; exits 0 when every check
passes, 1 on a failure, 2 without a GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
import time
import traceback
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
if (_HERE.parent / "cugemm8").is_dir() and str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))          # use the checkout this example lives in

# Process management, NCCL plumbing and the layers live in the library
# (cugemm8.launch, cugemm8.parallel); re-exported here for benches/bench_tp.py.
from cugemm8.launch import (MULTICAST_OFF_ENV, all_gather, barrier, multicast_off,  # noqa: E402,F401
                            nccl_type, run_ranks, stream_ptr, visible_gpus)
from cugemm8.parallel import mlp_forward, silu_mul  # noqa: E402

HIDDEN = 7168
DENSE_INTER = 18432                 # DeepSeek-V3 dense MLP intermediate size
EXPERT_INTER = 2048                 # DeepSeek-V3 routed-expert intermediate size
TOP_K = 2
BLOCK = 128                         # quantisation block (1x128 activations, 128x128 weights)

TP_TOL_VS_SINGLE = 1e-2             # TP layer vs the same layer on one GPU
TP_TOL_VS_F64 = 0.1                 # TP layer vs float64 unquantised layer (~6 % expected)
EP_TOL = 1e-2                       # EP MoE step vs per-expert plain GEMMs on rank 0
PARTS = ("tp", "overlap", "ep", "decode")


# ----------------------------------------------------------------------------
# Small helpers (host side; no CuPy needed)
# ----------------------------------------------------------------------------

def parse_tokens(text: str) -> list[int]:
    """``"64,1024"`` -> ``[64, 1024]``; every count must be >= 1."""
    try:
        vals = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tokens wants comma-separated ints, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"--tokens wants positive ints, got {text!r}")
    return vals


def tp_split(n_ranks: int, inter: int | None = None) -> int:
    """Per-rank intermediate size ``inter / n_ranks`` (default: the dense MLP's
    18432); raises ValueError unless it is a whole multiple of 128 (per-block
    scales must not straddle ranks)."""
    inter = DENSE_INTER if inter is None else inter
    if n_ranks < 1 or inter % n_ranks or (inter // n_ranks) % BLOCK:
        raise ValueError(
            f"tensor parallelism over {n_ranks} GPUs splits the intermediate size {inter} into "
            f"{inter / n_ranks:g} per rank, which is not a multiple of {BLOCK}: the 128x128 weight "
            f"scales would straddle ranks.  Use a GPU count that divides {inter // BLOCK}")
    return inter // n_ranks


def seed_of(*parts) -> int:
    """A 64-bit seed derived from ``parts`` (stable across processes and runs)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def offsets(counts) -> np.ndarray:
    """Exclusive prefix sum: where each peer's rows start in a packed buffer."""
    counts = np.asarray(counts, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def route(tokens: int, n_experts: int, k: int, rng: np.random.Generator):
    """Random top-k routing: ``(ids int32 [tokens, k], weights float32 [tokens, k])``;
    each token's k experts are distinct and its weights are a softmax over them."""
    if n_experts < k:
        raise ValueError(f"top-{k} routing needs at least {k} experts, got {n_experts}")
    logits = rng.standard_normal((tokens, n_experts))
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    sel = np.take_along_axis(logits, ids, axis=1)
    w = np.exp(sel - sel.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    return ids.astype(np.int32), w.astype(np.float32)


@dataclasses.dataclass
class DispatchPlan:
    """Where a rank's (token, expert) pairs go.

    Pair ``q = t * k + j`` is token ``t``'s ``j``-th choice.  ``order`` sorts
    the pairs by global expert (stable), so the rows for rank ``d`` are the
    contiguous run ``[offsets(send_counts)[d], + send_counts[d])``, sorted by
    expert inside it.
    """
    order: np.ndarray          # int64 [P]: pair index of each sorted row
    token: np.ndarray          # int64 [P]: token of each sorted row
    local_expert: np.ndarray   # int32 [P]: expert index on its owner rank
    send_counts: np.ndarray    # int64 [n_ranks]


def dispatch_plan(topk_ids, n_ranks: int, experts_per_rank: int) -> DispatchPlan:
    ids = np.asarray(topk_ids, dtype=np.int64)
    k = ids.shape[1]
    flat = ids.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= n_ranks * experts_per_rank):
        raise ValueError("expert id out of range")
    order = np.argsort(flat, kind="stable")
    expert = flat[order]
    send_counts = np.bincount(expert // experts_per_rank, minlength=n_ranks).astype(np.int64)
    return DispatchPlan(order=order, token=order // k,
                        local_expert=(expert % experts_per_rank).astype(np.int32),
                        send_counts=send_counts)


def pack_plan(local_expert, experts_per_rank: int, align: int = 8):
    """Slots of received rows in the masked layout ``[experts_per_rank, m_max, ...]``.

    Returns ``(counts int32 [experts_per_rank], slot int64 [R], m_max)``:
    row ``i`` goes to flat row ``slot[i] = e_i * m_max + (rows of e_i before i)``;
    ``m_max`` is the largest count rounded up to ``align`` (at least ``align``).
    """
    e = np.asarray(local_expert, dtype=np.int64)
    counts = np.bincount(e, minlength=experts_per_rank)
    if counts.size > experts_per_rank or (e.size and e.min() < 0):
        raise ValueError("local expert id out of range")
    m_max = max(align, -(-int(counts.max(initial=0)) // align) * align)
    order = np.argsort(e, kind="stable")
    starts = np.cumsum(counts) - counts
    pos = np.empty_like(e)
    pos[order] = np.arange(e.size) - starts[e[order]]
    return counts.astype(np.int32), e * m_max + pos, m_max


def combine(y_sorted, order, topk_w, xp):
    """``out[t] = sum_j topk_w[t, j] * y_sorted[row of pair t*k+j]``.

    ``y_sorted``: float32 ``[P, H]`` expert outputs in the dispatch order;
    ``order``: :attr:`DispatchPlan.order` (host); ``topk_w``: ``[T, k]``
    (``xp`` array).  The k terms are summed in order j = 0, 1, ...
    """
    t, k = topk_w.shape
    inv = np.empty_like(order)
    inv[order] = np.arange(order.size)
    gathered = y_sorted[xp.asarray(inv.reshape(t, k))]          # [T, k, H]
    return (gathered * topk_w[:, :, None]).sum(axis=1)


# ----------------------------------------------------------------------------
# Device helpers (CuPy imported lazily: this module imports without a GPU)
# ----------------------------------------------------------------------------

def _bf16():
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


_KERNELS: dict = {}

_HASH_PREAMBLE = r"""
__device__ __forceinline__ unsigned long long cugemm8_tp_mix(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
"""

_HASH_BODY = r"""
const long long r = (long long)i / cols;
const long long c = (long long)i - r * cols;
const unsigned long long idx = (unsigned long long)((row0 + r) * full_cols + col0 + c);
const unsigned long long h = cugemm8_tp_mix(seed ^ cugemm8_tp_mix(idx));
const float u1 = (float)((h >> 40) + 1ull) * 5.9604644775390625e-08f;       /* (0, 1] */
const float u2 = (float)((h >> 16) & 0xFFFFFFull) * 5.9604644775390625e-08f; /* [0, 1) */
out = scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
"""

_SPIN_SRC = r"""
extern "C" __global__ void cugemm8_tp_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"""


def _hash_kernel():
    if "hash" not in _KERNELS:
        import cupy
        _KERNELS["hash"] = cupy.ElementwiseKernel(
            "uint64 seed, int64 full_cols, int64 row0, int64 col0, int64 cols, float32 scale",
            "float32 out", _HASH_BODY, "cugemm8_tp_hashed_normal", preamble=_HASH_PREAMBLE)
    return _KERNELS["hash"]


def hashed_normal(seed: int, full_cols: int, rows: int, cols: int, *, row0: int = 0,
                  col0: int = 0, scale: float = 1.0, out=None):
    """float32 ``[rows, cols]`` block at ``(row0, col0)`` of a virtual
    ``[*, full_cols]`` matrix of N(0, scale^2) values that depend only on
    ``(seed, row, column)``: any rank can build any slice, bit-identical."""
    import cupy
    if out is None:
        out = cupy.empty((rows, cols), dtype=cupy.float32)
    assert out.shape == (rows, cols) and out.dtype == cupy.float32
    _hash_kernel()(np.uint64(seed), np.int64(full_cols), np.int64(row0), np.int64(col0),
                   np.int64(cols), np.float32(scale), out)
    return out


def spin(seconds: float) -> None:
    """Keep the current stream busy for ``seconds`` (one thread sleeping on the
    global timer), so launches queued behind it run back to back."""
    import cupy
    if "spin" not in _KERNELS:
        _KERNELS["spin"] = cupy.RawKernel(_SPIN_SRC, "cugemm8_tp_spin")
    _KERNELS["spin"]((1,), (1,), (np.uint64(max(0, int(seconds * 1e9))),))


def to_f64(x):
    import cupy
    if x.dtype == cupy.float64:
        return x
    return x.astype(cupy.float32).astype(cupy.float64)


def record_failure(failures: list, what: str, exc: Exception) -> None:
    """Print ``exc``'s traceback and record ``"{what}: {type}: {message}"``;
    the run goes on (every rank keeps to the NCCL protocol) and reports the
    failures at the end."""
    traceback.print_exc()
    failures.append(f"{what}: {type(exc).__name__}: {exc}")


def rel_l2(got, ref) -> float:
    """||got - ref|| / ||ref|| in float64."""
    import cupy
    g, r = to_f64(got), to_f64(ref)
    den = float(cupy.linalg.norm(r))
    num = float(cupy.linalg.norm(g - r))
    return num / den if den else (0.0 if num == 0 else float("inf"))


def exchange_counts(comm, nccl, send_counts, rank: int) -> np.ndarray:
    """All-to-all of one int64 per peer: returns how many rows each peer sends here."""
    import cupy
    n = len(send_counts)
    sc = cupy.asarray(np.asarray(send_counts, dtype=np.int64))
    rc = cupy.zeros(n, dtype=cupy.int64)
    rc[rank:rank + 1] = sc[rank:rank + 1]
    if n > 1:
        s = stream_ptr()
        nccl.groupStart()
        try:
            for peer in range(n):
                if peer == rank:
                    continue
                comm.send(sc.data.ptr + 8 * peer, 1, nccl.NCCL_INT64, peer, s)
                comm.recv(rc.data.ptr + 8 * peer, 1, nccl.NCCL_INT64, peer, s)
        finally:
            nccl.groupEnd()
    return rc.get().astype(np.int64)


def all_to_all_rows(comm, nccl, src, send_counts, dst, recv_counts, rank: int) -> None:
    """Send rows ``src[offsets(send_counts)[d]:][:send_counts[d]]`` to rank ``d``
    and receive rank ``s``'s rows into ``dst[offsets(recv_counts)[s]:]``.

    ``src`` and ``dst`` are C-contiguous with equal row shape and dtype; the
    rank's own rows are copied on the device; the rest is one NCCL group of
    send / recv calls (zero-row transfers skipped on both sides, which agree
    because the counts were exchanged first)."""
    import cupy
    assert src.flags.c_contiguous and dst.flags.c_contiguous and src.dtype == dst.dtype
    assert src.shape[1:] == dst.shape[1:]
    per_row = int(np.prod(src.shape[1:], dtype=np.int64))
    row_bytes = per_row * src.itemsize
    soff, roff = offsets(send_counts), offsets(recv_counts)
    own = int(send_counts[rank])
    assert own == int(recv_counts[rank])
    if own:
        s0, r0 = int(soff[rank]), int(roff[rank])
        dst_bytes = dst.reshape(dst.shape[0], -1).view(cupy.uint8)
        src_bytes = src.reshape(src.shape[0], -1).view(cupy.uint8)
        dst_bytes[r0:r0 + own] = src_bytes[s0:s0 + own]
    peers = [p for p in range(len(send_counts)) if p != rank
             and (int(send_counts[p]) or int(recv_counts[p]))]
    if not peers:
        return
    dtype = nccl_type(nccl, src.dtype)
    s = stream_ptr()
    nccl.groupStart()
    try:
        for peer in peers:
            if int(send_counts[peer]):
                comm.send(src.data.ptr + int(soff[peer]) * row_bytes,
                          int(send_counts[peer]) * per_row, dtype, peer, s)
            if int(recv_counts[peer]):
                comm.recv(dst.data.ptr + int(roff[peer]) * row_bytes,
                          int(recv_counts[peer]) * per_row, dtype, peer, s)
    finally:
        nccl.groupEnd()


def time_on_stream(fn, *, reps: int = 20, warmup: int = 3, sync_ranks=None):
    """CUDA-event timing of ``fn(mid_event)`` on the current stream.

    ``fn`` gets an Event to record at its midpoint (or None during warm-up).
    After warm-up (and ``sync_ranks()``, e.g. :func:`barrier`), a spin kernel
    holds the stream while all repetitions are queued, so host launch
    overhead does not leak into the GPU timeline.  Returns a list of
    ``(start->mid, mid->end, start->end)`` in microseconds per repetition.
    """
    import cupy
    stream = cupy.cuda.get_current_stream()
    for _ in range(max(1, warmup)):
        fn(None)
    stream.synchronize()
    t0 = time.perf_counter()
    fn(None)                                   # host enqueue time of one call
    host_s = time.perf_counter() - t0
    stream.synchronize()
    if sync_ranks is not None:
        sync_ranks()
    events = [(cupy.cuda.Event(), cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]
    spin(min(2.0, 0.005 + 3.0 * reps * host_s))
    for start, mid, end in events:
        start.record()
        fn(mid)
        end.record()
    events[-1][2].synchronize()
    el = cupy.cuda.get_elapsed_time
    return [(el(s, m) * 1e3, el(m, e) * 1e3, el(s, e) * 1e3) for s, m, e in events]


def median(values) -> float:
    v = sorted(values)
    n = len(v)
    return float("nan") if not n else (v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2]))


# ----------------------------------------------------------------------------
# Tensor-parallel MLP
# ----------------------------------------------------------------------------

def tp_weight_slices(rank: int, n_ranks: int, *, seed: int = 0, inter: int | None = None,
                     hidden: int | None = None):
    """BF16 ``(W1_r [2*inter/n, hidden] = [gate_r; up_r], W2_r [hidden, inter/n])``
    of rank ``rank``; ``(0, 1)`` gives the whole W1 ``[gate; up]`` and W2."""
    import cupy
    inter = DENSE_INTER if inter is None else inter
    hidden = HIDDEN if hidden is None else hidden
    ir = tp_split(n_ranks, inter)
    s1, s2 = seed_of(seed, "tp-w1"), seed_of(seed, "tp-w2")
    w1 = cupy.empty((2 * ir, hidden), dtype=cupy.float32)
    hashed_normal(s1, hidden, ir, hidden, row0=rank * ir, scale=hidden ** -0.5, out=w1[:ir])
    hashed_normal(s1, hidden, ir, hidden, row0=inter + rank * ir, scale=hidden ** -0.5,
                  out=w1[ir:])
    w2 = hashed_normal(s2, inter, hidden, ir, col0=rank * ir, scale=inter ** -0.5)
    bf16 = _bf16()
    return w1.astype(bf16), w2.astype(bf16)


def tp_activations(tokens: int, *, seed: int = 0, hidden: int | None = None):
    """BF16 ``[tokens, hidden]`` input, identical on every rank."""
    hidden = HIDDEN if hidden is None else hidden
    return hashed_normal(seed_of(seed, "tp-x", tokens), hidden, tokens, hidden).astype(_bf16())


def mlp_reference_f64(x, w1, w2):
    """float64 layer on the unquantised BF16 weights (``w1 = [gate; up]``)."""
    import cupy
    i = w1.shape[0] // 2
    gate_up = to_f64(x) @ to_f64(w1).T
    g, u = gate_up[:, :i], gate_up[:, i:]
    h = g / (1.0 + cupy.exp(-g)) * u
    return h @ to_f64(w2).T


def _tp_fingerprint(w1q, w2q):
    """(scales float32 [L], payload byte sums int64 [2]) of a rank's weights."""
    import cupy
    scales = cupy.concatenate([w1q[1].ravel(), w2q[1].ravel()])
    sums = cupy.stack([w1q[0].sum(dtype=cupy.uint64), w2q[0].sum(dtype=cupy.uint64)])
    return scales, sums.astype(cupy.int64)


def _tp_slice_checks(n: int, ir: int, full, all_scales, all_sums, inter: int) -> list[str]:
    """Rank 0: slicing then quantising == quantising then slicing, for every
    rank's slice; and every rank's scales and byte sums match those slices."""
    import cupy
    import cugemm8
    w1, w2 = full["w1"], full["w2"]
    (b1, s1), (b2, s2) = full["w1q"], full["w2q"]
    nb, ib = ir // BLOCK, inter // BLOCK
    problems = []
    for r in range(n):
        pieces = ((r * ir, (r + 1) * ir), (inter + r * ir, inter + (r + 1) * ir))
        for lo, hi in pieces:
            qb, qs = cugemm8.per_block_cast_to_fp8(w1[lo:hi])
            if not (bool(cupy.array_equal(qb, b1[lo:hi]))
                    and bool(cupy.array_equal(qs, s1[lo // BLOCK:hi // BLOCK]))):
                problems.append(f"W1 rows [{lo}, {hi}) quantised alone differ from the full W1's")
        c0, c1 = r * ir, (r + 1) * ir
        qb, qs = cugemm8.per_block_cast_to_fp8(w2[:, c0:c1])
        if not (bool(cupy.array_equal(qb, b2[:, c0:c1]))
                and bool(cupy.array_equal(qs, s2[:, c0 // BLOCK:c1 // BLOCK]))):
            problems.append(f"W2 columns [{c0}, {c1}) quantised alone differ from the full W2's")
        want_scales = cupy.concatenate([s1[r * nb:(r + 1) * nb].ravel(),
                                        s1[ib + r * nb:ib + (r + 1) * nb].ravel(),
                                        s2[:, r * nb:(r + 1) * nb].ravel()])
        if not bool(cupy.array_equal(all_scales[r], want_scales)):
            problems.append(f"rank {r}'s weight scales differ from the full weights' slice")
        want_sums = [int(b1[r * ir:(r + 1) * ir].sum(dtype=cupy.uint64))
                     + int(b1[inter + r * ir:inter + (r + 1) * ir].sum(dtype=cupy.uint64)),
                     int(b2[:, c0:c1].sum(dtype=cupy.uint64))]
        got_sums = [int(v) for v in all_sums[r].get()]
        if got_sums != want_sums:
            problems.append(f"rank {r}'s payload byte sums {got_sums} != full slice's {want_sums}")
    return problems


def run_tp(rank: int, n: int, comm, nccl, opts: dict, say) -> list[str]:
    """The tensor-parallel MLP part; returns failure messages (rank 0 checks)."""
    import cupy
    import cugemm8
    failures = []
    ir = tp_split(n)
    seed = opts["seed"]
    w1, w2 = tp_weight_slices(rank, n, seed=seed)
    w1q, w2q = cugemm8.per_block_cast_to_fp8(w1), cugemm8.per_block_cast_to_fp8(w2)
    del w1, w2
    scales, sums = _tp_fingerprint(w1q, w2q)
    all_scales, all_sums = all_gather(comm, nccl, scales, n), all_gather(comm, nccl, sums, n)
    full = None
    if rank == 0:
        say(f"tp-mlp: intermediate {DENSE_INTER} / {n} GPUs = {ir} = {ir // BLOCK} x {BLOCK} "
            f"per rank: slice boundaries on 128-multiples")
        try:
            w1f, w2f = tp_weight_slices(0, 1, seed=seed)
            full = {"w1": w1f, "w2": w2f, "w1q": cugemm8.per_block_cast_to_fp8(w1f),
                    "w2q": cugemm8.per_block_cast_to_fp8(w2f)}
            problems = _tp_slice_checks(n, ir, full, all_scales, all_sums, DENSE_INTER)
            failures += [f"tp-mlp: {p}" for p in problems]
            say("tp-mlp: quantised slices == slices of the quantised full weights, on every rank: "
                + ("ok" if not problems else f"FAILED ({len(problems)}: {problems[0]})"))
        except Exception as exc:         # keep the NCCL protocol going; report at the end
            record_failure(failures, "tp-mlp setup on rank 0", exc)
            full = None
    for tokens in opts["tokens"]:
        x = tp_activations(tokens, seed=seed)
        out = mlp_forward(x, w1q, w2q, comm=comm)
        finite = bool(cupy.isfinite(out).all())
        if not finite:
            failures.append(f"tp-mlp tokens={tokens}: non-finite output on rank {rank}")
        line = (f"tp-mlp tokens={tokens}: W1_r {list(w1q[0].shape)} W2_r {list(w2q[0].shape)} "
                f"-> out {list(out.shape)} fp32, |out| = {float(cupy.linalg.norm(out)):.4e}")
        if rank == 0 and full is not None:
            try:
                single = mlp_forward(x, full["w1q"], full["w2q"])
                e1 = rel_l2(out, single)
                e64 = rel_l2(out, mlp_reference_f64(x, full["w1"], full["w2"]))
                ok1, ok64 = e1 < TP_TOL_VS_SINGLE, e64 < TP_TOL_VS_F64
                if not ok1:
                    failures.append(f"tp-mlp tokens={tokens}: vs 1-GPU layer {e1:.3e} >= {TP_TOL_VS_SINGLE}")
                if not ok64:
                    failures.append(f"tp-mlp tokens={tokens}: vs float64 {e64:.3e} >= {TP_TOL_VS_F64}")
                line += (f"; rel L2 vs 1-GPU layer {e1:.2e} (< {TP_TOL_VS_SINGLE:g}) "
                         f"{'ok' if ok1 else 'FAILED'}, vs float64 unquantised {e64:.2e} "
                         f"(< {TP_TOL_VS_F64:g}) {'ok' if ok64 else 'FAILED'}")
            except Exception as exc:
                record_failure(failures, f"tp-mlp tokens={tokens} check", exc)
        say(line + ("" if finite else " NON-FINITE"))
        if "overlap" in opts["parts"]:
            failures += check_overlap(x, w1q, w2q, out, comm, opts, say)
        if not opts["check_only"]:
            times = time_on_stream(
                lambda mid: mlp_forward(x, w1q, w2q, comm=comm, mid_event=mid),
                reps=20, warmup=3, sync_ranks=(lambda: barrier(comm, nccl)) if comm else None)
            layer = median([t[2] for t in times])
            flops = 2.0 * tokens * HIDDEN * 3 * DENSE_INTER / n
            say(f"tp-mlp tokens={tokens}: layer {layer:.1f} us (GEMMs + quantisation "
                f"{median([t[0] for t in times]):.1f} us, all-reduce "
                f"{median([t[1] for t in times]):.1f} us), {flops / layer / 1e6:.1f} TFLOPS per GPU")
    return failures


def check_overlap(x, w1q, w2q, plain, comm, opts: dict, say) -> list[str]:
    """Every rank: the chunked layer with each chunk's all-reduce on the
    communication stream (and ``opts["reserve_sms"]`` SMs left free) is
    bit-identical to the same chunks reduced on the compute stream, and
    within ``TP_TOL_VS_SINGLE`` of the unchunked layer ``plain``."""
    import cupy
    from cugemm8.parallel import mlp_forward_overlapped, plan_chunks
    tokens, chunks, reserve = x.shape[0], opts["chunks"], opts["reserve_sms"]
    try:
        over = mlp_forward_overlapped(x, w1q, w2q, comm=comm, chunks=chunks, reserve=reserve)
        serial = mlp_forward_overlapped(x, w1q, w2q, comm=comm, chunks=chunks, reserve=reserve, overlap=False)
        same = bool(cupy.array_equal(over.view(cupy.uint32), serial.view(cupy.uint32)))
        err = rel_l2(over, plain)
    except Exception as exc:
        failures = []
        record_failure(failures, f"tp-overlap tokens={tokens}", exc)
        return failures
    ok = same and err < TP_TOL_VS_SINGLE
    say(f"tp-overlap tokens={tokens}: chunks {plan_chunks(tokens, chunks)}, {reserve} SMs reserved: "
        f"overlapped == serial chunks {'bit for bit' if same else 'NO'}, rel L2 vs unchunked layer "
        f"{err:.2e} (< {TP_TOL_VS_SINGLE:g}) {'ok' if ok else 'FAILED'}")
    return [] if ok else [f"tp-overlap tokens={tokens}: bit-identical {same}, rel L2 {err:.3e}"]


# ----------------------------------------------------------------------------
# Expert-parallel MoE step
# ----------------------------------------------------------------------------

def ep_expert_weights(rank: int, experts_per_rank: int, *, seed: int = 0,
                      hidden: int | None = None, inter: int | None = None):
    """Quantised weights of the rank's experts: ``((b1, sfb1), (b2, sfb2))`` with
    W1 ``[E_local, 2*inter, hidden]`` (``[gate; up]``) and W2 ``[E_local, hidden, inter]``."""
    import cupy
    hidden = HIDDEN if hidden is None else hidden
    inter = EXPERT_INTER if inter is None else inter
    import cugemm8
    bf16 = _bf16()
    w1 = cupy.empty((experts_per_rank, 2 * inter, hidden), dtype=cupy.float32)
    w2 = cupy.empty((experts_per_rank, hidden, inter), dtype=cupy.float32)
    for j in range(experts_per_rank):
        e = rank * experts_per_rank + j
        hashed_normal(seed_of(seed, "ep-w1", e), hidden, 2 * inter, hidden,
                      scale=hidden ** -0.5, out=w1[j])
        hashed_normal(seed_of(seed, "ep-w2", e), inter, hidden, inter,
                      scale=inter ** -0.5, out=w2[j])
    w1q = cugemm8.per_block_cast_to_fp8(w1.astype(bf16))
    del w1
    w2q = cugemm8.per_block_cast_to_fp8(w2.astype(bf16))
    return w1q, w2q


def _row_layout(hidden: int):
    kb = -(-hidden // BLOCK)
    return kb, hidden + 4 * kb + 4          # payload bytes | fp32 scales | int32 local expert


def experts_masked(a, sfa, local_expert_host, w1q, w2q, experts_per_rank: int):
    """The owner's side: rows ``a`` uint8 ``[R, H]`` with scales ``sfa`` float32
    ``[R, kb]`` for local experts ``local_expert_host`` -> BF16 ``[R, H]``,
    through the masked layout ``[E_local, m_max, H]`` and two masked GEMMs."""
    import cupy
    import cugemm8
    bf16 = _bf16()
    r, hidden = a.shape
    el = experts_per_rank
    inter = w2q[0].shape[2]
    counts, slot, m_max = pack_plan(local_expert_host, el)
    slot_d = cupy.asarray(slot)
    kb = sfa.shape[1]
    a_m = cupy.zeros((el, m_max, hidden), dtype=cupy.uint8)
    a_m.reshape(el * m_max, hidden)[slot_d] = a
    s_m = cupy.zeros((el, m_max, kb), dtype=cupy.float32)
    s_m.reshape(el * m_max, kb)[slot_d] = sfa
    s_m = cugemm8.get_col_major_tma_aligned_tensor(s_m)
    masked_m = cupy.asarray(counts, dtype=cupy.int32)
    expected_m = max(1, -(-r // el))
    gate_up = cupy.zeros((el, m_max, 2 * inter), dtype=bf16)
    cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a_m, s_m), w1q, gate_up, masked_m, expected_m)
    h = silu_mul(gate_up)                                # [E_local, m_max, inter]
    y = cupy.zeros((el, m_max, hidden), dtype=bf16)
    cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked(cugemm8.per_token_cast_to_fp8(h), w2q, y,
                                                  masked_m, expected_m)
    rows = y.reshape(el * m_max, hidden).view(cupy.uint16)[slot_d]
    return rows.view(bf16), counts, m_max


def moe_forward_ep(x, topk_ids, topk_w, w1q, w2q, comm, nccl, rank: int, n: int,
                   experts_per_rank: int):
    """One expert-parallel MoE step for this rank's tokens ``x`` BF16 ``[T, H]``
    routed by ``topk_ids`` (host int ``[T, k]``) with weights ``topk_w``
    (device float32 ``[T, k]``).  Returns ``(out float32 [T, H], info dict)``."""
    import cupy
    import cugemm8
    bf16 = _bf16()
    t, hidden = x.shape
    kb, row_bytes = _row_layout(hidden)
    plan = dispatch_plan(topk_ids, n, experts_per_rank)
    p = plan.order.size
    a, sfa = cugemm8.per_token_cast_to_fp8(x)
    tok = cupy.asarray(plan.token)
    send = cupy.empty((p, row_bytes), dtype=cupy.uint8)
    send[:, :hidden] = a[tok]
    send[:, hidden:hidden + 4 * kb] = cupy.ascontiguousarray(sfa[tok]).view(cupy.uint8)
    send[:, hidden + 4 * kb:] = cupy.asarray(plan.local_expert.reshape(p, 1)).view(cupy.uint8)
    # 1) counts, 2) rows (one NCCL group each)
    recv_counts = exchange_counts(comm, nccl, plan.send_counts, rank)
    r = int(recv_counts.sum())
    recv = cupy.empty((r, row_bytes), dtype=cupy.uint8)
    all_to_all_rows(comm, nccl, send, plan.send_counts, recv, recv_counts, rank)
    if r:
        a_r = recv[:, :hidden]
        s_r = cupy.ascontiguousarray(recv[:, hidden:hidden + 4 * kb]).view(cupy.float32)
        e_r = cupy.ascontiguousarray(recv[:, hidden + 4 * kb:]).view(cupy.int32).reshape(r)
        y_recv, counts, m_max = experts_masked(a_r, s_r, e_r.get(), w1q, w2q, experts_per_rank)
        y_recv = cupy.ascontiguousarray(y_recv)
    else:
        y_recv, counts, m_max = cupy.empty((0, hidden), dtype=bf16), [0] * experts_per_rank, 0
    # 3) results back to the token owners, in the order they were sent
    y_back = cupy.empty((p, hidden), dtype=bf16)
    all_to_all_rows(comm, nccl, y_recv, recv_counts, y_back, plan.send_counts, rank)
    out = combine(y_back.astype(cupy.float32), plan.order, topk_w, cupy)
    info = {"sent": plan.send_counts.tolist(), "received": recv_counts.tolist(),
            "per_expert": [int(c) for c in counts], "m_max": m_max}
    return out, info


def moe_reference(x_all, ids_all, w_all, w1q_all, w2q_all):
    """Rank 0: every token's expert outputs with the plain GEMM, one expert at a
    time, combined like :func:`combine` (k terms summed in order j)."""
    import cupy
    import cugemm8
    bf16 = _bf16()
    t, k = ids_all.shape
    hidden = x_all.shape[1]
    inter = w2q_all[0].shape[2]
    ys = cupy.zeros((t, k, hidden), dtype=cupy.float32)
    x_bits = x_all.view(cupy.uint16)
    for e in range(w1q_all[0].shape[0]):
        ts, js = np.nonzero(ids_all == e)
        if ts.size == 0:
            continue
        ts_d, js_d = cupy.asarray(ts), cupy.asarray(js)
        xe = x_bits[ts_d].view(bf16)
        gate_up = cupy.empty((ts.size, 2 * inter), dtype=bf16)
        cugemm8.gemm_fp8_fp8_bf16_nt(cugemm8.per_token_cast_to_fp8(xe),
                                     (w1q_all[0][e], w1q_all[1][e]), gate_up)
        h = silu_mul(gate_up)
        y = cupy.empty((ts.size, hidden), dtype=bf16)
        cugemm8.gemm_fp8_fp8_bf16_nt(cugemm8.per_token_cast_to_fp8(h),
                                     (w2q_all[0][e], w2q_all[1][e]), y)
        ys.reshape(t * k, hidden)[ts_d * k + js_d] = y.astype(cupy.float32)
    return (ys * w_all[:, :, None]).sum(axis=1)


def run_ep(rank: int, n: int, comm, nccl, opts: dict, say) -> list[str]:
    """The expert-parallel MoE parts ("ep": the dynamic step, "decode": the
    graph-captured decode step); returns failure messages (rank 0 checks)."""
    import cupy
    failures = []
    el, seed = opts["experts_per_rank"], opts["seed"]
    n_exp = n * el
    w1q, w2q = ep_expert_weights(rank, el, seed=seed)
    # Everyone's quantised experts on every rank (rank 0 uses them for the check).
    w1q_all = tuple(all_gather(comm, nccl, z, n).reshape((n_exp,) + z.shape[1:]) for z in w1q)
    w2q_all = tuple(all_gather(comm, nccl, z, n).reshape((n_exp,) + z.shape[1:]) for z in w2q)
    for tokens in opts["tokens"]:
        x = hashed_normal(seed_of(seed, "ep-x", tokens, rank), HIDDEN, tokens, HIDDEN).astype(_bf16())
        ids, w = route(tokens, n_exp, TOP_K, np.random.default_rng(seed_of(seed, "route", tokens, rank)))
        w_d = cupy.asarray(w)
        x_all = all_gather(comm, nccl, x, n).reshape(n * tokens, HIDDEN)
        ids_all = all_gather(comm, nccl, cupy.asarray(ids), n).reshape(n * tokens, TOP_K).get()
        w_all = all_gather(comm, nccl, w_d, n).reshape(n * tokens, TOP_K)
        ref = []

        def check(what: str, out, line: str) -> str:
            out_all = all_gather(comm, nccl, out, n).reshape(n * tokens, HIDDEN)
            if rank != 0:
                return line
            try:
                if not ref:
                    ref.append(moe_reference(x_all, ids_all, w_all, w1q_all, w2q_all))
                err = rel_l2(out_all, ref[0])
                rows_err = cupy.linalg.norm(out_all - ref[0], axis=1) / cupy.linalg.norm(ref[0], axis=1)
                ok = err < EP_TOL and bool(cupy.isfinite(out_all).all())
                if not ok:
                    failures.append(f"{what} tokens={tokens}: rel L2 vs per-expert GEMMs {err:.3e} >= {EP_TOL}")
                return (line + f"; all {n * tokens} tokens vs per-expert plain GEMMs on rank 0: rel L2 "
                        f"{err:.2e} (worst token {float(rows_err.max()):.2e}) (< {EP_TOL:g}) "
                        f"{'ok' if ok else 'FAILED'}")
            except Exception as exc:
                record_failure(failures, f"{what} tokens={tokens} check", exc)
                return line

        if "ep" in opts["parts"]:
            out, info = moe_forward_ep(x, ids, w_d, w1q, w2q, comm, nccl, rank, n, el)
            say(check("ep-moe", out,
                      f"ep-moe tokens={tokens}/rank, {el} experts/rank, top-{TOP_K}: sent {info['sent']}, "
                      f"received {info['received']} rows, masked layout [{el}, {info['m_max']}, {HIDDEN}] "
                      f"with masked_m {info['per_expert']}"))
            if not opts["check_only"]:
                samples = []
                for _ in range(6):
                    if comm is not None:
                        barrier(comm, nccl)
                    t0 = time.perf_counter()
                    moe_forward_ep(x, ids, w_d, w1q, w2q, comm, nccl, rank, n, el)
                    cupy.cuda.get_current_stream().synchronize()
                    samples.append((time.perf_counter() - t0) * 1e6)
                say(f"ep-moe tokens={tokens}/rank: {median(samples[1:]):.0f} us per step "
                    f"(host-timed, median of 5; includes the count exchange's host sync)")
        if "decode" in opts["parts"]:
            failures += run_decode_step(rank, n, comm, nccl, opts, say, x, ids, w, ids_all, w1q, w2q, check)
    return failures


def run_decode_step(rank: int, n: int, comm, nccl, opts: dict, say, x, ids, w, ids_all, w1q, w2q,
                    check) -> list[str]:
    """The graph-captured decode step (cugemm8.parallel.EPMoEDecodeStep) on
    the same tokens: capacities from the gathered routing, capture, replay,
    check (``check``), and with timing the replay time per step."""
    import cupy
    from cugemm8.parallel import EPMoEDecodeStep, expert_load_from_ids, plan_decode_capacity
    failures = []
    tokens, el = x.shape[0], opts["experts_per_rank"]
    # NOTES: no try here: another rank may already sit in the graph's NCCL
    # calls, so a failure must end this rank (run_ranks then stops the others).
    load = expert_load_from_ids(ids_all, n * el)          # rows each expert receives this step
    cap = plan_decode_capacity(tokens, TOP_K, n, el, expert_load=load, rank=rank)
    step = EPMoEDecodeStep(w1q, w2q, cap, rank=rank, comm=comm)
    step.load(x, ids, w)
    step.capture()
    cupy.cuda.get_current_stream().synchronize()
    step.replay()
    step.graph_stream.synchronize()
    drops = step.drop_counts()
    out = step.out.copy()
    line = (f"ep-decode tokens={tokens}/rank (CUDA graph replay): slots/peer {cap.slots_per_peer}, "
            f"m_max {cap.m_max}, expected_m {cap.expected_m}, drops {drops}")
    if any(drops.values()):
        failures.append(f"ep-decode tokens={tokens}: rows dropped with lossless capacities: {drops}")
    say(check("ep-decode", out, line))
    if not opts["check_only"]:
        gs = step.graph_stream
        if comm is not None:
            barrier(comm, nccl)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        reps = 20
        start.record(gs)
        for _ in range(reps):
            step.replay()
        end.record(gs)
        end.synchronize()
        say(f"ep-decode tokens={tokens}/rank: {cupy.cuda.get_elapsed_time(start, end) * 1e3 / reps:.0f} us "
            f"per step (graph replays back to back, mean of {reps})")
    return failures


def _example_rank(rank: int, n: int, comm, nccl, opts: dict, say) -> dict:
    if opts.get("num_sms"):
        import cugemm8
        cugemm8.set_num_sms(int(opts["num_sms"]))
    failures = []
    if "tp" in opts["parts"]:
        failures += run_tp(rank, n, comm, nccl, opts, say)
    if {"ep", "decode"} & set(opts["parts"]):
        failures += run_ep(rank, n, comm, nccl, opts, say)
    return {"ok": not failures, "failures": failures}


def main(argv=None) -> int:
    multicast_off()
    p = argparse.ArgumentParser(
        description="Tensor-parallel FP8 MLP and expert-parallel MoE step with cugemm8 and "
                    "cupy.cuda.nccl, one process per GPU (DeepSeek-V3 sizes).")
    p.add_argument("--tokens", type=parse_tokens, default=parse_tokens("64,1024"),
                   help="comma-separated token counts: the TP batch, and the tokens per rank "
                        "of the MoE step (default 64,1024: decode-like and prefill-like)")
    p.add_argument("--check-only", action="store_true",
                   help="run the correctness checks only (no timing)")
    p.add_argument("--num-sms", type=int, default=None,
                   help="cugemm8.set_num_sms(N) on every GPU (default: all SMs)")
    p.add_argument("--experts-per-rank", type=int, default=8,
                   help="routed experts held by each GPU in the MoE step (default 8)")
    p.add_argument("--parts", default=",".join(PARTS),
                   help="comma-separated parts to run: tp (the TP MLP), overlap (its chunked form with "
                        "the all-reduce under the next chunk's GEMMs), ep (the MoE step), decode (the "
                        "CUDA-graph-captured MoE decode step); default: all")
    p.add_argument("--chunks", type=int, default=2,
                   help="token chunks of the overlapped TP layer (default 2)")
    p.add_argument("--reserve-sms", type=int, default=8,
                   help="SMs left to NCCL while the overlapped TP layer runs (default 8)")
    p.add_argument("--nprocs", type=int, default=None,
                   help="number of GPUs / processes (default: every visible GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds before the run is stopped (default 1800)")
    args = p.parse_args(argv)
    parts = {s.strip() for s in args.parts.split(",") if s.strip()}
    if not parts or parts - set(PARTS):
        p.error(f"--parts must name some of {','.join(PARTS)}, got {args.parts!r}")
    if args.chunks < 1 or args.reserve_sms < 0:
        p.error("--chunks must be >= 1 and --reserve-sms >= 0")
    if args.num_sms is not None and args.num_sms < 1:
        p.error("--num-sms must be >= 1")
    if args.experts_per_rank < 1:
        p.error("--experts-per-rank must be >= 1")

    count, why = visible_gpus()
    if count == 0:
        print(f"tensor_parallel: no GPU: {why}", flush=True)
        return 2
    n = count if args.nprocs is None else args.nprocs
    if not 1 <= n <= count:
        p.error(f"--nprocs {n}: {count} GPU(s) visible")
    if {"tp", "overlap"} & parts:
        parts.add("tp")
        try:
            tp_split(n)
        except ValueError as exc:
            print(f"tensor_parallel: {exc}", flush=True)
            return 1
    if n * args.experts_per_rank < TOP_K and {"ep", "decode"} & parts:
        p.error(f"the MoE step needs at least {TOP_K} experts in total")
    opts = {"tokens": args.tokens, "check_only": args.check_only, "num_sms": args.num_sms,
            "experts_per_rank": args.experts_per_rank, "parts": sorted(parts), "seed": args.seed,
            "chunks": args.chunks, "reserve_sms": args.reserve_sms}
    print(f"tensor_parallel: {n} process(es), one per GPU; parts {','.join(sorted(parts))}; "
          f"tokens {args.tokens}; " + ", ".join(f"{k}={v}" for k, v in MULTICAST_OFF_ENV.items()),
          flush=True)
    results, error = run_ranks(_example_rank, n, opts, timeout_s=args.timeout)
    failures = [] if error is None else [error]
    for r in sorted(results):
        failures += results[r].get("failures", [])
    if failures:
        print("tensor_parallel: FAILED\n  " + "\n  ".join(failures), flush=True)
        return 1
    print(f"tensor_parallel: PASS on {n} GPU(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
