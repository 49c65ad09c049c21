"""Multi-GPU FP8 layers over NCCL: an expert-parallel MoE decode step that
runs without host synchronisation (CUDA-graph capturable), and a
tensor-parallel MLP whose all-reduce overlaps the next chunk's GEMMs.

One process per GPU (:mod:`cugemm8.launch`), NCCL through ``cupy.cuda.nccl``,
every kernel on CuPy's current stream.

**Expert-parallel decode step** (:class:`EPMoEDecodeStep`).  Rank ``r`` of
``n`` holds experts ``r*E .. r*E+E-1`` (``E = experts_per_rank``) and
``T`` token slots per step, each routed to ``top_k`` experts.  Every buffer
has a fixed size chosen up front (:class:`DecodeCapacity`), so the step has
the same launches and the same NCCL calls every time and captures into one
CUDA graph:

1. quantise the tokens (``per_token_cast_to_fp8``, 1x128 scales);
2. *dispatch plan* (one CTA per destination rank): pair ``q = t*top_k + j``
   with expert ``e >= 0`` goes to rank ``d = e // E``, slot
   ``p`` = the number of earlier pairs (in ``q`` order) for ``d``; pairs past
   ``slots_per_peer`` are dropped and counted; ``e < 0`` means no expert;
3. *pack*: each pair's row (FP8 payload | FP32 scales | int32 local expert)
   into slot ``d*slots_per_peer + p`` of the send buffer (its own rows
   straight into the receive buffer);
4. one NCCL group: every peer's row count and its whole block of
   ``slots_per_peer`` rows (fixed sizes; the count says how many are real);
5. *unpack plan* (one CTA per local expert): received row ``(s, i)``,
   ``i < count[s]``, goes to row ``q`` of its expert in the masked layout,
   ``q`` = the number of earlier rows (source-major order) for that expert;
   rows past ``m_max`` are dropped and counted; ``masked_m[e]`` = rows kept;
6. *unpack*: rows into ``a [E, m_max, H]`` and scales into the MN-major
   TMA-aligned ``sfa`` the GEMM reads;
7. ``m_grouped_gemm_fp8_fp8_bf16_nt_masked`` for W1 (gate and up),
   SiLU-mul on the valid rows, quantisation, the masked GEMM for W2
   (``masked_m`` read on the device, ``expected_m`` a host hint);
8. each received row's BF16 result back into its slot, one NCCL group back
   to the sources (own rows written in place);
9. *combine*: ``out[t] = sum_j w[t, j] * y[t, j]`` in FP32, ``j`` in order,
   dropped pairs adding nothing.

With one rank every transfer is a self-transfer: written in place, or
through NCCL's send / recv to self (``self_copy=False``), so one GPU runs
and captures the whole step.

**Tensor-parallel MLP** (:func:`mlp_forward`, :func:`mlp_forward_overlapped`).
``out = all_reduce_sum(W2_r @ (silu(W1gate_r @ x) * (W1up_r @ x)))``; the
overlapped form splits the tokens into chunks; chunk ``i``'s all-reduce runs
on a communication stream (ordered by CUDA events) while the compute stream
runs chunk ``i+1``'s quantisation and GEMMs, with ``set_num_sms(total -
reserve_sms)`` leaving SMs to NCCL's kernels.  Chunks along tokens read the
weights once per chunk, so the overlap can only pay where the GEMMs are
compute bound (``benches/bench_tp.py --overlap`` measures it).

The host-side planning (:func:`plan_decode_capacity`,
:func:`expected_m_from_routing`, :func:`plan_chunks`) and NumPy models of
the device plans (:func:`dispatch_slots_reference`,
:func:`expert_rows_reference`) need no GPU.  The small kernels here use no
Hopper feature; CuPy compiles them for the current device (``RawModule``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import numbers
from typing import Any, Iterator

import numpy as np

from . import launch as _launch_mod

BLOCK = 128                 # 1x128 activation scales, 128x128 weight scales


def _check_int(name: str, value, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name}={value} must be {rng}")
    return value


# ----------------------------------------------------------------------------
# Host-side planning (NumPy only)
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DecodeCapacity:
    """Fixed sizes of an expert-parallel decode step (see :func:`plan_decode_capacity`).

    tokens: token slots per rank per step (``T``).
    top_k: experts per token.
    n_ranks: ranks (GPUs) sharing the experts.
    experts_per_rank: experts held by each rank (``E``).
    slots_per_peer: rows a rank can send to each rank per step (``S``).
    m_max: rows per local expert in the masked layout.
    expected_m: the masked GEMMs' configuration hint (typical rows per expert).
    """
    tokens: int
    top_k: int
    n_ranks: int
    experts_per_rank: int
    slots_per_peer: int
    m_max: int
    expected_m: int

    @property
    def num_experts(self) -> int:
        return self.n_ranks * self.experts_per_rank

    @property
    def worst_slots_per_peer(self) -> int:
        """Rows one rank can route to one rank: every token, to at most
        ``min(top_k, E)`` of its experts (a token picks an expert once)."""
        return self.tokens * min(self.top_k, self.experts_per_rank)

    @property
    def worst_m_max(self) -> int:
        """Rows one expert can receive: one per token of every rank."""
        return self.n_ranks * self.tokens

    @property
    def lossless(self) -> bool:
        """True when no routing can overflow the buffers (nothing is ever dropped)."""
        return self.slots_per_peer >= self.worst_slots_per_peer and self.m_max >= self.worst_m_max


def expert_load_from_ids(topk_ids, num_experts: int) -> np.ndarray:
    """Rows per expert of a routing: int64 ``[num_experts]`` counts of the ids
    in ``topk_ids`` (any shape, host ints; negative ids mean "no expert" and
    are skipped).  Raises ValueError for an id ``>= num_experts``,
    TypeError for non-integer ids."""
    num_experts = _check_int("num_experts", num_experts, 1)
    ids = np.asarray(topk_ids)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"topk_ids must hold integers, got dtype {ids.dtype}")
    ids = ids.reshape(-1).astype(np.int64)
    if ids.size and ids.max() >= num_experts:
        raise ValueError(f"topk_ids holds expert {int(ids.max())}; there are {num_experts} experts")
    return np.bincount(ids[ids >= 0], minlength=num_experts).astype(np.int64)


def expected_m_from_routing(expert_load, n_ranks: int, experts_per_rank: int, rank: int | None = None) -> int:
    """The masked GEMMs' ``expected_m`` from routing statistics.

    Args:
        expert_load: rows per expert per step, ``[n_ranks * experts_per_rank]``
            (e.g. :func:`expert_load_from_ids` of a recent step's routing of
            all ranks, or a running mean); non-negative numbers.
        n_ranks, experts_per_rank: the sharding (expert ``e`` on rank
            ``e // experts_per_rank``).
        rank: whose experts; None: the busiest rank's value (one
            configuration for every rank).

    Returns:
        ``max(1, ceil(mean load of the rank's experts))``.

    Raises:
        TypeError: a non-int size or rank.
        ValueError: a wrong length, a negative or non-finite load, a rank out of range.
    """
    n_ranks = _check_int("n_ranks", n_ranks, 1)
    experts_per_rank = _check_int("experts_per_rank", experts_per_rank, 1)
    load = np.asarray(expert_load, dtype=np.float64).reshape(-1)
    if load.size != n_ranks * experts_per_rank:
        raise ValueError(f"expert_load has {load.size} entries; {n_ranks} ranks x {experts_per_rank} "
                         f"experts need {n_ranks * experts_per_rank}")
    if not np.all(np.isfinite(load)) or np.any(load < 0):
        raise ValueError("expert_load must hold finite non-negative counts")
    means = load.reshape(n_ranks, experts_per_rank).mean(axis=1)
    if rank is not None:
        rank = _check_int("rank", rank, 0, n_ranks - 1)
        mean = means[rank]
    else:
        mean = means.max()
    return max(1, int(np.ceil(mean - 1e-9)))


def plan_decode_capacity(tokens: int, top_k: int, n_ranks: int, experts_per_rank: int, *,
                         expert_load=None, slots_per_peer: int | None = None, m_max: int | None = None,
                         rank: int | None = None) -> DecodeCapacity:
    """Buffer sizes of an expert-parallel decode step.

    Defaults are lossless: ``slots_per_peer = tokens * min(top_k,
    experts_per_rank)`` and ``m_max = n_ranks * tokens``, the most any
    routing can send, so nothing is ever dropped.  Smaller values (e.g.
    ``m_max`` a margin above the largest observed ``expert_load``) shrink
    the buffers, the GEMMs' padding and, for ``slots_per_peer``, the fixed
    NCCL transfers; rows past them are dropped and counted on the device
    (:meth:`EPMoEDecodeStep.drop_counts`).

    ``expected_m``: :func:`expected_m_from_routing` of ``expert_load`` for
    ``rank`` when given, else the uniform-routing mean
    ``ceil(tokens * top_k / experts_per_rank)``; clamped to ``[1, m_max]``.

    Raises:
        TypeError: a size that is not an int.
        ValueError: a size ``< 1``; ``top_k`` above the number of experts;
            ``slots_per_peer`` or ``m_max`` above the lossless value; a bad
            ``expert_load`` (see :func:`expected_m_from_routing`).
    """
    tokens = _check_int("tokens", tokens, 1)
    top_k = _check_int("top_k", top_k, 1)
    n_ranks = _check_int("n_ranks", n_ranks, 1)
    experts_per_rank = _check_int("experts_per_rank", experts_per_rank, 1)
    if top_k > n_ranks * experts_per_rank:
        raise ValueError(f"top_k={top_k} exceeds the {n_ranks * experts_per_rank} experts")
    worst_s, worst_m = tokens * min(top_k, experts_per_rank), n_ranks * tokens
    s = worst_s if slots_per_peer is None else _check_int("slots_per_peer", slots_per_peer, 1, worst_s)
    m = worst_m if m_max is None else _check_int("m_max", m_max, 1, worst_m)
    if expert_load is not None:
        em = expected_m_from_routing(expert_load, n_ranks, experts_per_rank, rank)
    else:
        em = -(-tokens * top_k // experts_per_rank)
    return DecodeCapacity(tokens=tokens, top_k=top_k, n_ranks=n_ranks, experts_per_rank=experts_per_rank,
                          slots_per_peer=s, m_max=m, expected_m=max(1, min(em, m)))


def plan_chunks(tokens: int, chunks: int, *, align: int = BLOCK) -> list[tuple[int, int]]:
    """Token ranges ``[(start, stop), ...]`` of a chunked layer.

    The ``ceil(tokens / align)`` blocks of ``align`` rows are shared out as
    evenly as possible over ``min(chunks, blocks)`` chunks (earlier chunks
    never larger), so every boundary but the end is a multiple of ``align``
    (whole GEMM tiles) and the ranges cover ``[0, tokens)`` in order.
    ``tokens == 0`` gives ``[]``.

    Raises:
        TypeError: a non-int argument.
        ValueError: ``tokens < 0``, ``chunks < 1`` or ``align < 1``.
    """
    tokens = _check_int("tokens", tokens, 0)
    chunks = _check_int("chunks", chunks, 1)
    align = _check_int("align", align, 1)
    blocks = -(-tokens // align)
    c = min(chunks, blocks)
    edges = [min(tokens, (i * blocks // c) * align) for i in range(c)] + [tokens]
    return [(edges[i], edges[i + 1]) for i in range(c)]


def dispatch_slots_reference(topk_ids, n_ranks: int, experts_per_rank: int, slots_per_peer: int):
    """NumPy model of the step's dispatch plan (the kernel must agree exactly).

    ``topk_ids``: int ``[T, top_k]`` global expert ids (``< 0``: none).
    Returns ``(pair_slot int32 [T*top_k], send_counts int32 [n_ranks],
    dropped, invalid)``: pair ``q`` (row-major) goes to slot
    ``d*slots_per_peer + p`` or -1; ``dropped`` pairs exceeded
    ``slots_per_peer``; ``invalid`` ids were ``>= n_ranks * experts_per_rank``
    (skipped).
    """
    ids = np.asarray(topk_ids).reshape(-1).astype(np.int64)
    num_experts = n_ranks * experts_per_rank
    ok = (ids >= 0) & (ids < num_experts)
    dest = np.where(ok, ids // experts_per_rank, -1)
    pair_slot = np.full(ids.size, -1, np.int32)
    send_counts = np.zeros(n_ranks, np.int32)
    dropped = 0
    for d in range(n_ranks):
        qs = np.nonzero(dest == d)[0]
        keep = qs[:slots_per_peer]
        pair_slot[keep] = d * slots_per_peer + np.arange(keep.size)
        send_counts[d] = keep.size
        dropped += qs.size - keep.size
    return pair_slot, send_counts, int(dropped), int((ids >= num_experts).sum())


def expert_rows_reference(recv_expert, recv_counts, experts_per_rank: int, m_max: int):
    """NumPy model of the step's unpack plan (the kernel must agree exactly).

    ``recv_expert``: int ``[n_ranks * S]``, the local expert stored in each
    received slot (slot ``s*S + i`` from source ``s``; entries at ``i >=
    recv_counts[s]`` are ignored); ``recv_counts``: int ``[n_ranks]``.
    Returns ``(slot_row int32 [n_ranks * S], masked_m int32
    [experts_per_rank], dropped, invalid)``: slot -> row ``e * m_max + q``
    of the masked layout or -1; ``dropped`` rows exceeded ``m_max``;
    ``invalid`` rows named no local expert.
    """
    le = np.asarray(recv_expert).reshape(-1).astype(np.int64)
    counts = np.asarray(recv_counts).reshape(-1).astype(np.int64)
    s = le.size // counts.size
    valid = (np.arange(le.size) % s) < np.clip(counts, 0, s)[np.arange(le.size) // s]
    slot_row = np.full(le.size, -1, np.int32)
    masked_m = np.zeros(experts_per_rank, np.int32)
    dropped = 0
    for e in range(experts_per_rank):
        rows = np.nonzero(valid & (le == e))[0]
        keep = rows[:m_max]
        slot_row[keep] = e * m_max + np.arange(keep.size)
        masked_m[e] = keep.size
        dropped += rows.size - keep.size
    invalid = int((valid & ((le < 0) | (le >= experts_per_rank))).sum())
    return slot_row, masked_m, int(dropped), invalid


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------

KERNEL_SOURCE = r"""
// cugemm8.parallel: dispatch, packing, SiLU-mul and combine kernels (plain CUDA, any arch).

__device__ __forceinline__ float bf16_to_f32(unsigned short b) {
    return __uint_as_float((unsigned int)b << 16);
}

__device__ __forceinline__ unsigned short f32_to_bf16_rn(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);   // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                                   // round to nearest even
    return (unsigned short)(u >> 16);
}

// Inclusive prefix sum of v over the block (blockDim.x a multiple of 32, at
// most 1024; every thread calls it); total gets the block's sum.
__device__ __forceinline__ int block_scan_incl(int v, int* warp_sums, int& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    #pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    if (lane == 31) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int w = lane < num_warps ? warp_sums[lane] : 0;
        #pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < num_warps) warp_sums[lane] = w;
    }
    __syncthreads();
    const int incl = v + (warp > 0 ? warp_sums[warp - 1] : 0);
    total = warp_sums[num_warps - 1];
    __syncthreads();            // warp_sums is rewritten by the next call
    return incl;
}

// Every thread of the block calls it with its item (mine: 1 when the item is
// in this CTA's bucket): the bucket's items are numbered in thread order after
// the base earlier ones; item p gets out[idx] = first + p, or -1 when p >=
// capacity (counted in dropped).  Returns the call's item count, to add to base.
__device__ __forceinline__ int place_in_bucket(int mine, int base, int capacity, int first, int* out,
                                               int idx, int* warp_sums, int& dropped) {
    int total;
    const int p = base + block_scan_incl(mine, warp_sums, total) - mine;
    if (mine) {
        if (p < capacity) {
            out[idx] = first + p;
        } else {
            out[idx] = -1;
            ++dropped;
        }
    }
    return total;
}

// One CTA per destination rank d.  Pair q = t * top_k + j with expert e in
// [0, num_experts) and e / experts_per_rank == d gets slot d * slots_per_peer + p,
// p = number of earlier such pairs; p >= slots_per_peer is dropped.
extern "C" __global__ void cugemm8_ep_dispatch_plan(
        const int* __restrict__ topk_ids,       // [num_pairs]
        int num_pairs, int experts_per_rank, int num_ranks, int slots_per_peer,
        int* __restrict__ pair_slot,            // [num_pairs] out: slot or -1
        int* __restrict__ send_counts,          // [num_ranks] out
        int* __restrict__ stats) {              // [3]: += dropped (slots), -, invalid ids
    __shared__ int warp_sums[32];
    const int d = blockIdx.x;
    const int num_experts = experts_per_rank * num_ranks;
    int base = 0, dropped = 0, invalid = 0;
    for (int start = 0; start < num_pairs; start += blockDim.x) {
        const int q = start + threadIdx.x;
        const int e = q < num_pairs ? topk_ids[q] : -1;
        const bool ok = e >= 0 && e < num_experts;
        const int mine = (ok && e / experts_per_rank == d) ? 1 : 0;
        base += place_in_bucket(mine, base, slots_per_peer, d * slots_per_peer, pair_slot, q, warp_sums, dropped);
        if (d == 0 && q < num_pairs && !ok) {
            pair_slot[q] = -1;
            invalid += e >= num_experts ? 1 : 0;
        }
    }
    if (threadIdx.x == 0) send_counts[d] = min(base, slots_per_peer);
    if (dropped) atomicAdd(&stats[0], dropped);
    if (invalid) atomicAdd(&stats[2], invalid);
}

// One CTA per pair: its token's row (payload | scales | local expert) into its slot;
// slots of self_rank go to self_recv when that is given.
extern "C" __global__ void cugemm8_ep_pack_rows(
        const unsigned char* __restrict__ a, long long a_row_stride,          // [T, hidden] e4m3 bytes
        const float* __restrict__ sfa, long long sfa_stride_t, long long sfa_stride_k,
        const int* __restrict__ topk_ids, const int* __restrict__ pair_slot,
        int top_k, int hidden, int kb, int experts_per_rank, long long row_bytes,
        int self_rank, int slots_per_peer,
        unsigned char* __restrict__ send, unsigned char* __restrict__ self_recv) {
    const int q = blockIdx.x;
    const int slot = pair_slot[q];
    if (slot < 0) return;
    const int t = q / top_k;
    unsigned char* row = (self_recv != nullptr && slot / slots_per_peer == self_rank ? self_recv : send)
                         + (long long)slot * row_bytes;
    const uint4* src = reinterpret_cast<const uint4*>(a + t * a_row_stride);
    uint4* dst = reinterpret_cast<uint4*>(row);
    for (int i = threadIdx.x; i < hidden / 16; i += blockDim.x) dst[i] = src[i];
    float* sf = reinterpret_cast<float*>(row + hidden);
    for (int i = threadIdx.x; i < kb; i += blockDim.x) sf[i] = sfa[t * sfa_stride_t + i * sfa_stride_k];
    if (threadIdx.x == 0) *reinterpret_cast<int*>(row + hidden + 4 * kb) = topk_ids[q] % experts_per_rank;
}

// One CTA per local expert e.  Received slot s (source s / S, index i < count)
// holding expert e gets row e * m_max + p, p = number of earlier such slots;
// p >= m_max is dropped.
extern "C" __global__ void cugemm8_ep_unpack_plan(
        const unsigned char* __restrict__ recv, long long row_bytes, int expert_offset,
        const int* __restrict__ recv_counts, int num_ranks, int slots_per_peer,
        int experts_per_rank, int m_max,
        int* __restrict__ slot_row,             // [num_ranks * S] out: row or -1
        int* __restrict__ masked_m,             // [experts_per_rank] out
        int* __restrict__ stats) {              // [3]: -, += dropped (m_max), invalid rows
    __shared__ int warp_sums[32];
    const int e = blockIdx.x;
    const int num_slots = num_ranks * slots_per_peer;
    int base = 0, dropped = 0, invalid = 0;
    for (int start = 0; start < num_slots; start += blockDim.x) {
        const int s = start + threadIdx.x;
        int le = -1;
        bool valid = false;
        if (s < num_slots) {
            const int src = s / slots_per_peer;
            const int cnt = min(max(recv_counts[src], 0), slots_per_peer);
            valid = s - src * slots_per_peer < cnt;
            if (valid) le = *reinterpret_cast<const int*>(recv + s * row_bytes + expert_offset);
        }
        const int mine = (valid && le == e) ? 1 : 0;
        base += place_in_bucket(mine, base, m_max, e * m_max, slot_row, s, warp_sums, dropped);
        if (e == 0 && s < num_slots && (!valid || le < 0 || le >= experts_per_rank)) {
            slot_row[s] = -1;
            invalid += valid ? 1 : 0;
        }
    }
    if (threadIdx.x == 0) masked_m[e] = min(base, m_max);
    if (dropped) atomicAdd(&stats[1], dropped);
    if (invalid) atomicAdd(&stats[2], invalid);
}

// One CTA per received slot: payload into a_m's row, scales into the MN-major sfa.
extern "C" __global__ void cugemm8_ep_unpack_rows(
        const unsigned char* __restrict__ recv, long long row_bytes, const int* __restrict__ slot_row,
        int hidden, int kb, int m_max, int m_pad,
        unsigned char* __restrict__ a_m,        // [E * m_max, hidden]
        float* __restrict__ sfa_m) {            // [E, kb, m_pad]
    const int s = blockIdx.x;
    const int r = slot_row[s];
    if (r < 0) return;
    const unsigned char* row = recv + s * row_bytes;
    const uint4* src = reinterpret_cast<const uint4*>(row);
    uint4* dst = reinterpret_cast<uint4*>(a_m + (long long)r * hidden);
    for (int i = threadIdx.x; i < hidden / 16; i += blockDim.x) dst[i] = src[i];
    const float* sf = reinterpret_cast<const float*>(row + hidden);
    const int e = r / m_max, p = r - e * m_max;
    for (int i = threadIdx.x; i < kb; i += blockDim.x) sfa_m[((long long)e * kb + i) * m_pad + p] = sf[i];
}

// One CTA per received slot that holds a row: its BF16 result (zeros when it
// was dropped) into the same slot of the return buffer (self_ret for self_rank's).
extern "C" __global__ void cugemm8_ep_return_rows(
        const unsigned short* __restrict__ y,   // [E * m_max, hidden] bf16
        const int* __restrict__ slot_row, const int* __restrict__ recv_counts,
        int slots_per_peer, int hidden, int self_rank,
        unsigned short* __restrict__ ret_send, unsigned short* __restrict__ self_ret) {
    const int s = blockIdx.x;
    const int src = s / slots_per_peer;
    if (s - src * slots_per_peer >= min(max(recv_counts[src], 0), slots_per_peer)) return;
    unsigned short* row = (self_ret != nullptr && src == self_rank ? self_ret : ret_send) + (long long)s * hidden;
    uint4* dst = reinterpret_cast<uint4*>(row);
    const int r = slot_row[s];
    if (r < 0) {
        for (int i = threadIdx.x; i < hidden / 8; i += blockDim.x) dst[i] = make_uint4(0u, 0u, 0u, 0u);
        return;
    }
    const uint4* srcp = reinterpret_cast<const uint4*>(y + (long long)r * hidden);
    for (int i = threadIdx.x; i < hidden / 8; i += blockDim.x) dst[i] = srcp[i];
}

// One CTA per token: out[t] = sum_j w[t, j] * ret[pair_slot[t, j]] in FP32, j in order.
extern "C" __global__ void cugemm8_ep_combine(
        const unsigned short* __restrict__ ret,  // [num_ranks * S, hidden] bf16
        const int* __restrict__ pair_slot, const float* __restrict__ topk_w,
        int top_k, int hidden, float* __restrict__ out) {   // [T, hidden]
    const int t = blockIdx.x;
    for (int h = threadIdx.x; h < hidden; h += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < top_k; ++j) {
            const int s = pair_slot[t * top_k + j];
            if (s >= 0)
                acc = __fadd_rn(acc, __fmul_rn(topk_w[t * top_k + j], bf16_to_f32(ret[(long long)s * hidden + h])));
        }
        out[(long long)t * hidden + h] = acc;
    }
}

// h = bf16(silu(gate) * up) over rows of gate_up [rows, 2 * inter]; with
// masked_m, rows r with r % m_max >= masked_m[r / m_max] are skipped.
extern "C" __global__ void cugemm8_silu_mul(
        const unsigned short* __restrict__ gate_up, long long rows, int inter,
        const int* __restrict__ masked_m, int m_max,
        unsigned short* __restrict__ h) {
    const long long total = rows * inter;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / inter;
        const int c = (int)(i - r * inter);
        if (masked_m != nullptr) {
            const long long grp = r / m_max;
            if (r - grp * m_max >= masked_m[grp]) continue;
        }
        const float g = bf16_to_f32(gate_up[r * 2 * inter + c]);
        const float u = bf16_to_f32(gate_up[r * 2 * inter + inter + c]);
        h[r * inter + c] = f32_to_bf16_rn(g / (1.0f + expf(-g)) * u);
    }
}
"""

KERNEL_NAMES = ("cugemm8_ep_dispatch_plan", "cugemm8_ep_pack_rows", "cugemm8_ep_unpack_plan",
                "cugemm8_ep_unpack_rows", "cugemm8_ep_return_rows", "cugemm8_ep_combine", "cugemm8_silu_mul")

_kernels: dict = {}


def _kernel(name: str):
    """``cupy.RawKernel`` ``name`` of :data:`KERNEL_SOURCE` on the current
    device (compiled by CuPy, cached on disk by CuPy and here per device)."""
    cupy = _cupy()
    dev = cupy.cuda.runtime.getDevice()
    kern = _kernels.get((dev, name))
    if kern is None:
        mod = _kernels.get((dev, None))
        if mod is None:
            mod = _kernels[(dev, None)] = cupy.RawModule(code=KERNEL_SOURCE, options=("-std=c++17",))
        kern = _kernels[(dev, name)] = mod.get_function(name)
    return kern


def _bf16():
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


def _cupy():
    from ._device import import_cupy
    return import_cupy()


def _check_array(name: str, x, dtype, ndim: int | None = None, shape: tuple | None = None,
                 contiguous: bool = True) -> None:
    cupy = _cupy()
    from ._checks import check_device_array
    check_device_array(name, x, cupy)
    if x.dtype != np.dtype(dtype):
        raise TypeError(f"{name} must be {np.dtype(dtype).name}, got {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {list(x.shape)}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(x.shape)}")
    if contiguous and not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (strides {x.strides})")


def silu_mul(gate_up, out=None, masked_m=None):
    """``bf16(silu(gate) * up)`` of ``gate_up = [gate | up]``, computed in FP32.

    Args:
        gate_up: bfloat16 ``[..., 2 * inter]``, C-contiguous.
        out: bfloat16 ``[..., inter]`` C-contiguous (allocated when None).
        masked_m: int32 ``[g]`` on the device, with ``gate_up`` 3-D
            ``[g, m_max, 2 * inter]``: only rows ``< masked_m[g]`` of group
            ``g`` are computed; the others of ``out`` are left untouched
            (read on the device: CUDA-graph friendly).

    Per element: ``g / (1 + exp(-g)) * u`` in FP32 (IEEE division, accurate
    ``expf``), rounded to BF16 to nearest even.  One kernel on the current
    stream, no temporaries (captures in a CUDA graph when ``out`` is given).

    Returns:
        ``out``.

    Raises:
        TypeError: not CuPy arrays, or wrong dtypes.
        ValueError: odd last dimension, shapes that do not match, not C-contiguous.
    """
    cupy = _cupy()
    _check_array("gate_up", gate_up, _bf16())
    if gate_up.ndim < 1 or gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dimension must be even (2 * inter), got shape {list(gate_up.shape)}")
    inter = gate_up.shape[-1] // 2
    shape = gate_up.shape[:-1] + (inter,)
    if masked_m is not None:
        if gate_up.ndim != 3:
            raise ValueError(f"with masked_m, gate_up must be 3-D [g, m_max, 2 * inter], got {list(gate_up.shape)}")
        _check_array("masked_m", masked_m, np.int32, shape=(gate_up.shape[0],))
    if out is None:
        out = cupy.empty(shape, dtype=_bf16())
    else:
        _check_array("out", out, _bf16(), shape=shape)
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    total = rows * inter
    if total == 0:
        return out
    m_max = gate_up.shape[1] if masked_m is not None else 1
    grid = int(min(-(-total // 256), 65536))
    _kernel("cugemm8_silu_mul")((grid,), (256,), (
        gate_up, np.int64(rows), np.int32(inter), masked_m if masked_m is not None else np.uint64(0),
        np.int32(m_max), out))
    return out


# ----------------------------------------------------------------------------
# SM reservation
# ----------------------------------------------------------------------------

@contextlib.contextmanager
def reserve_sms(count: int) -> Iterator[int]:
    """Within the block, cugemm8 kernels on the current device use all but
    ``count`` SMs (``cugemm8.set_num_sms(total - count)``), leaving them to
    kernels on other streams (NCCL's); the previous setting is restored on
    exit, also when the block raises.  Yields the SM count in force.

    Raises:
        TypeError: ``count`` not an int.
        ValueError: ``count`` outside ``[0, total - 1]``.
    """
    from . import _device
    count = _check_int("count", count, 0)
    dev = _device.current_device_id()
    total = _device.device_info(dev)["num_sms"]
    if count >= total:
        raise ValueError(f"count={count} must leave at least one of the {total} SMs")
    before = _device.get_num_sms(dev)
    _device.set_num_sms(total - count, dev)
    try:
        yield total - count
    finally:
        _device.set_num_sms(before, dev)


# ----------------------------------------------------------------------------
# Tensor-parallel MLP
# ----------------------------------------------------------------------------

def _mlp_shapes(x, w1q, w2q) -> tuple[int, int, int]:
    """``(tokens, inter_r, hidden)`` after checking the layer's operands."""
    _check_array("x", x, _bf16(), ndim=2)
    for name, w in (("w1q", w1q), ("w2q", w2q)):
        if not (isinstance(w, (tuple, list)) and len(w) == 2):
            raise TypeError(f"{name} must be a (b, sfb) pair from per_block_cast_to_fp8")
    t, hidden = x.shape
    two_i, h1 = w1q[0].shape
    h2, i2 = w2q[0].shape
    if h1 != hidden or h2 != hidden or two_i != 2 * i2:
        raise ValueError(f"x [T, H] = {list(x.shape)}, W1 [2*I, H] = {list(w1q[0].shape)} and "
                         f"W2 [H, I] = {list(w2q[0].shape)} do not fit together")
    return t, i2, hidden


def _mlp_partial(x, w1q, w2q, out):
    """``out`` (float32 rows) = this rank's partial layer output for ``x`` (no reduction)."""
    import cugemm8
    cupy = _cupy()
    t, i, hidden = x.shape[0], w2q[0].shape[1], w2q[0].shape[0]
    gate_up = cupy.empty((t, 2 * i), dtype=_bf16())
    cugemm8.gemm_fp8_fp8_bf16_nt(cugemm8.per_token_cast_to_fp8(x), w1q, gate_up)
    h = silu_mul(gate_up)
    y = cupy.empty((t, hidden), dtype=_bf16())
    cugemm8.gemm_fp8_fp8_bf16_nt(cugemm8.per_token_cast_to_fp8(h), w2q, y)
    out[...] = y


def _all_reduce(comm, out) -> None:
    nccl = _launch_mod.import_nccl()
    comm.allReduce(out.data.ptr, out.data.ptr, out.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                   _launch_mod.stream_ptr())


def mlp_forward(x, w1q, w2q, *, comm=None, mid_event=None):
    """One (tensor-parallel) FP8 MLP layer on the current device and stream.

    Args:
        x: bfloat16 ``[T, H]``, C-contiguous (the same on every rank).
        w1q: ``(b1, sfb1)`` from ``per_block_cast_to_fp8`` of this rank's
            ``[gate_r; up_r]`` ``[2*I_r, H]``.
        w2q: ``(b2, sfb2)`` of this rank's ``W2_r`` ``[H, I_r]``.
        comm: NCCL communicator of the ranks to sum over, or None (no sum).
        mid_event: a ``cupy.cuda.Event`` recorded after the GEMMs, before the all-reduce.

    Per-token quantisation of ``x``, the W1 GEMM, :func:`silu_mul`,
    quantisation, the W2 GEMM, the BF16 output cast to FP32 and, with
    ``comm``, an in-place FP32 ``allReduce(SUM)`` on the current stream.

    Returns:
        float32 ``[T, H]``.

    Raises:
        TypeError, ValueError: operands of the wrong kind, dtype or shape.
    """
    t, _, hidden = _mlp_shapes(x, w1q, w2q)
    out = _cupy().empty((t, hidden), dtype=np.float32)
    _mlp_partial(x, w1q, w2q, out)
    if mid_event is not None:
        mid_event.record()
    if comm is not None:
        _all_reduce(comm, out)
    return out


_comm_streams: dict = {}


def comm_stream():
    """A non-blocking CuPy stream for communication on the current device (one per device, made once)."""
    cupy = _cupy()
    dev = cupy.cuda.runtime.getDevice()
    s = _comm_streams.get(dev)
    if s is None:
        s = _comm_streams[dev] = cupy.cuda.Stream(non_blocking=True)
    return s


def mlp_forward_overlapped(x, w1q, w2q, *, comm=None, chunks: int = 2, align: int = BLOCK,
                           reserve: int = 0, overlap: bool = True, stream=None):
    """The layer of :func:`mlp_forward`, chunked along tokens, each chunk's
    all-reduce overlapping the next chunk's GEMMs.

    Args:
        x, w1q, w2q, comm: as :func:`mlp_forward`.
        chunks: at most this many token chunks (:func:`plan_chunks` with
            ``align``: boundaries on multiples of ``align`` rows).
        reserve: SMs left free for the communication kernels while the layer
            runs (:func:`reserve_sms`; restored on return).
        overlap: True: chunk ``i``'s all-reduce runs on ``stream`` (default
            :func:`comm_stream`), after an event recorded when its output is
            ready, while the current stream goes on with chunk ``i+1``; the
            current stream waits for the last all-reduce before returning.
            False: every all-reduce on the current stream (same chunks, no overlap).

    Results: every chunk is :func:`mlp_forward` of its rows (per-token
    quantisation acts on rows), so the output equals the unchunked layer's
    up to the GEMMs' configuration for the chunk's row count, and the
    overlapped and serial forms are bit-identical.  The output buffer is
    allocated on the current stream before any chunk and is the only memory
    the communication stream touches.

    Returns:
        float32 ``[T, H]``.

    Raises:
        TypeError: operands of the wrong kind or dtype, non-int ``chunks`` / ``reserve``.
        ValueError: shapes that do not fit, ``chunks < 1``, ``reserve`` not below the SM count.
    """
    chunks = _check_int("chunks", chunks, 1)
    reserve = _check_int("reserve", reserve, 0)
    t, _, hidden = _mlp_shapes(x, w1q, w2q)
    cupy = _cupy()
    ranges = plan_chunks(t, chunks, align=align)
    out = cupy.empty((t, hidden), dtype=np.float32)
    compute = cupy.cuda.get_current_stream()
    side = (stream if stream is not None else comm_stream()) if overlap and comm is not None else None
    with reserve_sms(reserve):
        for r0, r1 in ranges:
            _mlp_partial(x[r0:r1], w1q, w2q, out[r0:r1])
            if comm is None:
                continue
            if side is None:
                _all_reduce(comm, out[r0:r1])
                continue
            ready = cupy.cuda.Event(block=False, disable_timing=True, interprocess=False)
            ready.record(compute)
            side.wait_event(ready)
            with side:
                _all_reduce(comm, out[r0:r1])
        if side is not None and ranges:
            done = cupy.cuda.Event(block=False, disable_timing=True, interprocess=False)
            done.record(side)
            compute.wait_event(done)
    return out


# ----------------------------------------------------------------------------
# Expert-parallel decode step
# ----------------------------------------------------------------------------

def _row_layout(hidden: int) -> tuple[int, int, int]:
    """``(kb, expert_offset, row_bytes)`` of a dispatched row: ``hidden`` FP8
    bytes, ``kb`` FP32 scales, one int32 local expert, padded to 16 bytes."""
    kb = -(-hidden // BLOCK)
    off = hidden + 4 * kb
    return kb, off, -(-(off + 4) // 16) * 16


class EPMoEDecodeStep:
    """One rank's expert-parallel MoE decode step with fixed buffers (see the module docstring).

    Args:
        w1q: ``(b1, sfb1)`` of this rank's experts' ``[gate; up]``: uint8
            ``[E, 2*I, H]``, float32 ``[E, ceil(2I/128), ceil(H/128)]``
            (``per_block_cast_to_fp8`` of ``[E, 2*I, H]``).
        w2q: ``(b2, sfb2)``: uint8 ``[E, H, I]``, float32 ``[E, ceil(H/128), ceil(I/128)]``.
        capacity: :class:`DecodeCapacity` (``experts_per_rank == E``).
        rank: this process's rank in ``[0, capacity.n_ranks)``.
        comm: NCCL communicator over ``capacity.n_ranks`` ranks; may be None
            for one rank with ``self_copy``.
        self_copy: rows for this rank's own experts are written straight into
            the receive buffers (True) or sent to itself through NCCL (False).

    Requirements: ``H`` and ``I`` multiples of 16 (no quantiser padding), the
    arrays on the current device.

    Inputs live in the step's buffers: :meth:`load` copies ``x`` (bfloat16
    ``[t <= T, H]``), ``topk_ids`` (int ``[t, top_k]`` global expert ids,
    ``< 0`` for none) and ``topk_w`` (float ``[t, top_k]``) in, marking the
    token slots past ``t`` empty.  :meth:`run` runs a step eagerly;
    :meth:`capture` records one step into a CUDA graph that :meth:`replay`
    relaunches (with whatever the buffers hold then).  :attr:`out` (float32
    ``[T, H]``) holds the result; empty token slots get zeros.

    Raises (constructor):
        TypeError: weights not pairs of CuPy arrays of the dtypes above,
            ``capacity`` not a :class:`DecodeCapacity`, non-int ``rank``.
        ValueError: shapes that do not fit, ``H`` or ``I`` not a multiple of
            16, ``rank`` out of range, no ``comm`` where one is needed.
    """

    def __init__(self, w1q, w2q, capacity: DecodeCapacity, *, rank: int = 0, comm=None,
                 self_copy: bool = True) -> None:
        cupy = _cupy()
        if not isinstance(capacity, DecodeCapacity):
            raise TypeError(f"capacity must be a DecodeCapacity (plan_decode_capacity), "
                            f"got {type(capacity).__name__}")
        for name, w in (("w1q", w1q), ("w2q", w2q)):
            if not (isinstance(w, (tuple, list)) and len(w) == 2):
                raise TypeError(f"{name} must be a (b, sfb) pair from per_block_cast_to_fp8")
        _check_array("w1q[0]", w1q[0], np.uint8, ndim=3)
        _check_array("w2q[0]", w2q[0], np.uint8, ndim=3)
        e, two_i, hidden = w1q[0].shape
        inter = w2q[0].shape[2]
        if w2q[0].shape != (e, hidden, inter) or two_i != 2 * inter:
            raise ValueError(f"W1 [E, 2*I, H] = {list(w1q[0].shape)} and W2 [E, H, I] = "
                             f"{list(w2q[0].shape)} do not fit together")
        _check_array("w1q[1]", w1q[1], np.float32, shape=(e, -(-two_i // BLOCK), -(-hidden // BLOCK)),
                     contiguous=False)
        _check_array("w2q[1]", w2q[1], np.float32, shape=(e, -(-hidden // BLOCK), -(-inter // BLOCK)),
                     contiguous=False)
        if e != capacity.experts_per_rank:
            raise ValueError(f"the weights hold {e} experts; capacity.experts_per_rank is "
                             f"{capacity.experts_per_rank}")
        if hidden % 16 or inter % 16:
            raise ValueError(f"H={hidden} and I={inter} must be multiples of 16")
        n = capacity.n_ranks
        self.rank = _check_int("rank", rank, 0, n - 1)
        self.self_copy = bool(self_copy)
        if comm is None and (n > 1 or not self.self_copy):
            raise ValueError("comm is needed with more than one rank or with self_copy=False")
        self.comm, self.capacity = comm, capacity
        self.w1q, self.w2q = tuple(w1q), tuple(w2q)
        self.hidden, self.inter = hidden, inter
        self.kb, self.expert_offset, self.row_bytes = _row_layout(hidden)
        t, k, s, m_max = capacity.tokens, capacity.top_k, capacity.slots_per_peer, capacity.m_max
        from .layout import tma_aligned_size
        self.m_pad = tma_aligned_size(m_max)
        bf16 = _bf16()
        # Inputs.
        self.x = cupy.zeros((t, hidden), dtype=bf16)
        self.topk_ids = cupy.full((t, k), -1, dtype=np.int32)
        self.topk_w = cupy.zeros((t, k), dtype=np.float32)
        # Plans and counts.
        self.pair_slot = cupy.full(t * k, -1, dtype=np.int32)
        self.send_counts = cupy.zeros(n, dtype=np.int32)
        self.recv_counts = cupy.zeros(n, dtype=np.int32)
        self.slot_row = cupy.full(n * s, -1, dtype=np.int32)
        self.masked_m = cupy.zeros(e, dtype=np.int32)
        self.stats = cupy.zeros(3, dtype=np.int32)
        # Rows out and back.
        self.send = cupy.zeros((n * s, self.row_bytes), dtype=np.uint8)
        self.recv = cupy.zeros((n * s, self.row_bytes), dtype=np.uint8)
        self.ret_send = cupy.zeros((n * s, hidden), dtype=bf16)
        self.ret_recv = cupy.zeros((n * s, hidden), dtype=bf16)
        # The masked layout.
        self.a_m = cupy.zeros((e, m_max, hidden), dtype=np.uint8)
        self._sfa_buf = cupy.zeros((e, self.kb, self.m_pad), dtype=np.float32)
        self.sfa_m = self._sfa_buf[:, :, :m_max].transpose(0, 2, 1)       # [E, m_max, kb], MN-major
        self.gate_up = cupy.zeros((e, m_max, 2 * inter), dtype=bf16)
        self.h = cupy.zeros((e, m_max, inter), dtype=bf16)
        self.y = cupy.zeros((e, m_max, hidden), dtype=bf16)
        self.out = cupy.zeros((t, hidden), dtype=np.float32)
        self._graph = self._graph_stream = self._graph_pool = self._graph_keep = None

    # -- inputs ---------------------------------------------------------------

    def load(self, x, topk_ids, topk_w) -> None:
        """Copy a step's inputs into the buffers (on the current stream; outside a capture).

        Args:
            x: bfloat16 ``[t, H]`` CuPy array, ``t <= T``.
            topk_ids: int ``[t, top_k]`` global expert ids (``< 0``: none),
                NumPy or CuPy.
            topk_w: float ``[t, top_k]`` routing weights, NumPy or CuPy.

        Raises:
            TypeError: ``x`` not a bfloat16 CuPy array; non-integer ids.
            ValueError: shapes that do not match, ``t > T``.
        """
        cupy = _cupy()
        _check_array("x", x, _bf16(), ndim=2, contiguous=False)
        t, k = self.capacity.tokens, self.capacity.top_k
        rows = x.shape[0]
        if x.shape[1] != self.hidden or rows > t:
            raise ValueError(f"x must be [t <= {t}, {self.hidden}], got {list(x.shape)}")
        ids = cupy.asarray(topk_ids)
        w = cupy.asarray(topk_w)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"topk_ids must hold integers, got {ids.dtype}")
        if ids.shape != (rows, k) or w.shape != (rows, k):
            raise ValueError(f"topk_ids and topk_w must be [{rows}, {k}], got {list(ids.shape)} "
                             f"and {list(w.shape)}")
        self.x[:rows] = x
        self.x[rows:] = 0
        self.topk_ids[:rows] = ids.astype(np.int32)
        self.topk_ids[rows:] = -1
        self.topk_w[:rows] = w.astype(np.float32)
        self.topk_w[rows:] = 0

    # -- the step -------------------------------------------------------------

    def _group(self, ops) -> None:
        """One NCCL group of ``(kind, ptr, count, nccl_type, peer)`` send / recv calls."""
        nccl = _launch_mod.import_nccl()
        s = _launch_mod.stream_ptr()
        nccl.groupStart()
        try:
            for kind, ptr, count, dtype, peer in ops:
                getattr(self.comm, kind)(ptr, count, dtype, peer, s)
        finally:
            nccl.groupEnd()

    def _peers(self) -> list[int]:
        """Ranks this rank exchanges with through NCCL (itself too unless ``self_copy``)."""
        return [p for p in range(self.capacity.n_ranks) if p != self.rank or not self.self_copy]

    def _forward(self) -> tuple:
        """Queue one step on the current stream; returns the arrays it
        allocated (a captured graph must keep them alive)."""
        import cugemm8
        cupy = _cupy()
        cap = self.capacity
        n, t, k, s, e, m_max = (cap.n_ranks, cap.tokens, cap.top_k, cap.slots_per_peer,
                                cap.experts_per_rank, cap.m_max)
        stream = _launch_mod.stream_ptr()
        in_place = self.self_copy
        cupy.cuda.runtime.memsetAsync(self.stats.data.ptr, 0, self.stats.nbytes, stream)
        # 1-3. quantise, plan, pack.
        a, sfa = cugemm8.per_token_cast_to_fp8(self.x)
        _kernel("cugemm8_ep_dispatch_plan")((n,), (256,), (
            self.topk_ids, np.int32(t * k), np.int32(e), np.int32(n), np.int32(s),
            self.pair_slot, self.send_counts, self.stats))
        _kernel("cugemm8_ep_pack_rows")((t * k,), (128,), (
            a, np.int64(a.strides[0]), sfa, np.int64(sfa.strides[0] // 4), np.int64(sfa.strides[1] // 4),
            self.topk_ids, self.pair_slot, np.int32(k), np.int32(self.hidden), np.int32(self.kb), np.int32(e),
            np.int64(self.row_bytes), np.int32(self.rank), np.int32(s),
            self.send, self.recv if in_place else np.uint64(0)))
        # 4. counts and rows to every peer (one NCCL group; own rows are already in place).
        if in_place:
            cupy.cuda.runtime.memcpyAsync(self.recv_counts.data.ptr + 4 * self.rank,
                                          self.send_counts.data.ptr + 4 * self.rank, 4,
                                          cupy.cuda.runtime.memcpyDeviceToDevice, stream)
        peers = self._peers()
        if peers:
            nccl = _launch_mod.import_nccl()
            block = s * self.row_bytes
            ops = []
            for p in peers:
                ops += [("send", self.send_counts.data.ptr + 4 * p, 1, nccl.NCCL_INT32, p),
                        ("recv", self.recv_counts.data.ptr + 4 * p, 1, nccl.NCCL_INT32, p),
                        ("send", self.send.data.ptr + p * block, block, nccl.NCCL_UINT8, p),
                        ("recv", self.recv.data.ptr + p * block, block, nccl.NCCL_UINT8, p)]
            self._group(ops)
        # 5-6. the masked layout.
        _kernel("cugemm8_ep_unpack_plan")((e,), (256,), (
            self.recv, np.int64(self.row_bytes), np.int32(self.expert_offset), self.recv_counts, np.int32(n),
            np.int32(s), np.int32(e), np.int32(m_max), self.slot_row, self.masked_m, self.stats))
        _kernel("cugemm8_ep_unpack_rows")((n * s,), (128,), (
            self.recv, np.int64(self.row_bytes), self.slot_row, np.int32(self.hidden), np.int32(self.kb),
            np.int32(m_max), np.int32(self.m_pad), self.a_m, self._sfa_buf))
        # 7. the experts.
        em = cap.expected_m
        cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked((self.a_m, self.sfa_m), self.w1q, self.gate_up,
                                                      self.masked_m, em)
        silu_mul(self.gate_up, out=self.h, masked_m=self.masked_m)
        a2, sfa2 = cugemm8.per_token_cast_to_fp8(self.h)
        cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a2, sfa2), self.w2q, self.y, self.masked_m, em)
        # 8. results back to the slots they came from.
        _kernel("cugemm8_ep_return_rows")((n * s,), (128,), (
            self.y, self.slot_row, self.recv_counts, np.int32(s), np.int32(self.hidden), np.int32(self.rank),
            self.ret_send, self.ret_recv if in_place else np.uint64(0)))
        if peers:
            nccl = _launch_mod.import_nccl()
            block = s * self.hidden
            ops = []
            for p in peers:
                ops += [("send", self.ret_send.data.ptr + 2 * p * block, block, nccl.NCCL_BFLOAT16, p),
                        ("recv", self.ret_recv.data.ptr + 2 * p * block, block, nccl.NCCL_BFLOAT16, p)]
            self._group(ops)
        # 9. combine.
        _kernel("cugemm8_ep_combine")((t,), (256,), (
            self.ret_recv, self.pair_slot, self.topk_w, np.int32(k), np.int32(self.hidden), self.out))
        return (a, sfa, a2, sfa2)

    def run(self):
        """Queue one step on the current stream (no host synchronisation); returns :attr:`out`."""
        self._forward()
        return self.out

    def capture(self, stream=None) -> None:
        """Record one step into a CUDA graph for :meth:`replay`.

        Runs the step once eagerly first (compiles the kernels, caches the
        GEMMs' launches) and synchronises, then captures on ``stream``
        (default: a new non-blocking stream).  The quantisers' outputs are
        allocated during the capture from a memory pool of the step's own,
        kept for the graph's lifetime, so no replay writes memory CuPy has
        handed to other arrays.  Every rank must capture (and replay) in
        step: the graph holds the NCCL calls.
        """
        cupy = _cupy()
        self.run()
        cupy.cuda.get_current_stream().synchronize()
        stream = stream if stream is not None else cupy.cuda.Stream(non_blocking=True)
        pool = cupy.cuda.MemoryPool()
        with stream, cupy.cuda.using_allocator(pool.malloc):
            stream.begin_capture()
            try:
                keep = self._forward()
            except BaseException:
                with contextlib.suppress(Exception):
                    stream.end_capture()
                raise
            graph = stream.end_capture()
        self._graph, self._graph_stream, self._graph_pool, self._graph_keep = graph, stream, pool, keep

    def replay(self, stream=None):
        """Launch the captured step on ``stream`` (default: the capture's);
        returns :attr:`out`.  RuntimeError before :meth:`capture`."""
        if self._graph is None:
            raise RuntimeError("replay() needs capture() first")
        self._graph.launch(stream if stream is not None else self._graph_stream)
        return self.out

    @property
    def graph_stream(self) -> Any:
        """The stream the graph was captured on (None before :meth:`capture`)."""
        return self._graph_stream

    def drop_counts(self) -> dict:
        """The last step's ``{"send_overflow", "expert_overflow", "invalid"}``
        counts (pairs past ``slots_per_peer``, rows past ``m_max``, expert ids
        past the last expert); synchronises the device."""
        v = [int(c) for c in self.stats.get()]
        return {"send_overflow": v[0], "expert_overflow": v[1], "invalid": v[2]}
