"""Multi-GPU use (issues 9 and 24): the tensor-parallel / expert-parallel
example over CuPy's NCCL bindings (its parts: the TP MLP, its overlapped
chunked form, the MoE step and the graph-captured MoE decode step), the
launcher with two ranks, and cugemm8's per-device state.

The GPU tests need two or more visible GPUs and are skipped with the reason
otherwise (tests/test_parallel_gpu.py runs the same machinery with one
rank).  ``test_ep_bookkeeping_cpu`` checks the example's dispatch /
packing / combine logic with NumPy, on any machine.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tensor_parallel.py"

from cugemm8.launch import MULTICAST_OFF_ENV, visible_gpus

_NUM_GPUS, _WHY = visible_gpus()
needs_two_gpus = pytest.mark.skipif(
    _NUM_GPUS < 2, reason=f"needs 2 or more GPUs; {_NUM_GPUS} visible" + (f" ({_WHY})" if _WHY else ""))


def _load_example():
    spec = importlib.util.spec_from_file_location("cugemm8_tensor_parallel_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------
# CPU: the example's host-side logic
# ----------------------------------------------------------------------------

def test_tp_split_rule():
    tp = _load_example()
    for n in (1, 2, 4, 8):
        assert tp.tp_split(n) == 18432 // n and (18432 // n) % 128 == 0
    for n in (5, 7, 16 * 9 * 2):
        with pytest.raises(ValueError, match="not a multiple of 128"):
            tp.tp_split(n)


@pytest.mark.parametrize("n_ranks,experts_per_rank,tokens", [(1, 4, 5), (3, 4, 37), (4, 2, 1)])
def test_ep_bookkeeping_cpu(n_ranks, experts_per_rank, tokens):
    """Simulate the expert-parallel step with NumPy: dispatch plan, the
    all-to-all offsets, the masked packing and the combine reproduce
    ``sum_j w[t, j] * W[e_tj] @ x_t`` for every token of every rank."""
    tp = _load_example()
    rng = np.random.default_rng(7)
    h, k = 16, tp.TOP_K
    n_exp = n_ranks * experts_per_rank
    weights = rng.standard_normal((n_exp, h, h))
    xs = [rng.standard_normal((tokens, h)) for _ in range(n_ranks)]
    routes = [tp.route(tokens, n_exp, k, rng) for _ in range(n_ranks)]
    plans = [tp.dispatch_plan(ids, n_ranks, experts_per_rank) for ids, _ in routes]
    for (ids, w), plan in zip(routes, plans):
        assert all(len(set(row)) == k for row in ids.tolist())
        np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)
        assert plan.send_counts.sum() == tokens * k
    send_rows = [xs[s][plans[s].token] for s in range(n_ranks)]
    send_ids = [plans[s].local_expert for s in range(n_ranks)]
    # all-to-all: rank d receives, in source order, each source's run for d
    recv_counts = [np.array([plans[s].send_counts[d] for s in range(n_ranks)]) for d in range(n_ranks)]
    y_recv = []
    for d in range(n_ranks):
        rows, eids = [], []
        for s in range(n_ranks):
            o, c = tp.offsets(plans[s].send_counts)[d], plans[s].send_counts[d]
            rows.append(send_rows[s][o:o + c])
            eids.append(send_ids[s][o:o + c])
        rows, eids = np.concatenate(rows), np.concatenate(eids)
        assert rows.shape[0] == recv_counts[d].sum()
        counts, slot, m_max = tp.pack_plan(eids, experts_per_rank)
        assert len(set(slot.tolist())) == slot.size and m_max % 8 == 0
        packed = np.full((experts_per_rank * m_max, h), np.nan)
        packed[slot] = rows
        out = np.full_like(packed, np.nan)
        for j in range(experts_per_rank):
            lo = j * m_max
            out[lo:lo + counts[j]] = packed[lo:lo + counts[j]] @ weights[d * experts_per_rank + j].T
        y_recv.append(out[slot])
    # back to the owners, at the offsets they sent from
    for s in range(n_ranks):
        y_back = np.empty((tokens * k, h))
        for d in range(n_ranks):
            so, c = tp.offsets(plans[s].send_counts)[d], plans[s].send_counts[d]
            ro = tp.offsets(recv_counts[d])[s]
            y_back[so:so + c] = y_recv[d][ro:ro + c]
        ids, w = routes[s]
        got = tp.combine(y_back, plans[s].order, w, np)
        want = np.stack([sum(w[t, j] * weights[ids[t, j]] @ xs[s][t] for j in range(k))
                         for t in range(tokens)])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)


# ----------------------------------------------------------------------------
# GPU: two or more GPUs
# ----------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.slow
@needs_two_gpus
def test_tensor_parallel_example_check_only():
    env = dict(os.environ)
    env.update(MULTICAST_OFF_ENV)
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--check-only"], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, (
        f"examples/tensor_parallel.py --check-only exited {proc.returncode}\n"
        f"--- stdout (tail) ---\n{proc.stdout[-8000:]}\n--- stderr (tail) ---\n{proc.stderr[-8000:]}")
    assert "PASS" in proc.stdout


@pytest.mark.gpu
@needs_two_gpus
def test_launch_two_ranks():
    """python -m cugemm8.launch --nproc 2: each rank on its own GPU, NVLink
    multicast off, an NCCL all-reduce over both (tests/launch_probe.py)."""
    proc = subprocess.run([sys.executable, "-m", "cugemm8.launch", "--nproc", "2", "--timeout", "300",
                           str(ROOT / "tests" / "launch_probe.py")],
                          cwd=str(ROOT), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    for r in range(2):
        assert f"[rank {r}/2] device {r}, multicast off True, all-reduce 3 (want 3) ok" in proc.stdout, proc.stdout


@pytest.mark.gpu
@needs_two_gpus
def test_per_device_state(rng):
    import cupy as cp

    import cugemm8
    from cugemm8 import _device
    from tests import gpu_helpers as H

    total1 = _device.device_info(1)["num_sms"]
    before0, before1 = cugemm8.get_num_sms(0), cugemm8.get_num_sms(1)
    try:
        # set_num_sms applies to the current device only
        with cp.cuda.Device(1):
            cugemm8.set_num_sms(total1 - 8)
            assert cugemm8.get_num_sms() == total1 - 8
        assert cugemm8.get_num_sms(0) == before0
        with cp.cuda.Device(0):
            assert cugemm8.get_num_sms() == before0
        assert cugemm8.get_num_sms(1) == total1 - 8

        # a GEMM on device 1 with arrays on device 1 (with the reduced SM budget)
        m, n, k = 256, 1024, 2048
        with cp.cuda.Device(1):
            a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
            out = cp.empty((m, n), cp.dtype("bfloat16"))
            cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
            assert out.device.id == 1
            ref, bound = H.reference_and_bound(cp, a, sfa, b, sfb)
            H.check_against(cp, out, ref, bound, what="gemm on device 1")
            q, s = cugemm8.per_token_cast_to_fp8(cp.ones((4, 256), dtype=cp.float32))
            assert q.device.id == 1 and s.device.id == 1

        # arrays from device 0 while device 1 is current: ValueError naming both devices
        with cp.cuda.Device(0):
            a0, sfa0, b0, sfb0 = H.make_operands(cp, rng, 64, 256, 512)
            out0 = cp.empty((64, 256), cp.dtype("bfloat16"))
            x0 = cp.ones((4, 256), dtype=cp.float32)
        with cp.cuda.Device(1):
            pattern = r"on device 0 but the current device is 1"
            with pytest.raises(ValueError, match=pattern):
                cugemm8.gemm_fp8_fp8_bf16_nt((a0, sfa0), (b0, sfb0), out0)
            a1 = cp.asarray(a0.get())
            sfa1 = cp.asarray(sfa0.get())
            out1 = cp.empty((64, 256), cp.dtype("bfloat16"))
            with pytest.raises(ValueError, match=r"b is on device 0 but the current device is 1"):
                cugemm8.gemm_fp8_fp8_bf16_nt((a1, sfa1), (b0, sfb0), out1)
            with pytest.raises(ValueError, match=pattern):
                cugemm8.per_token_cast_to_fp8(x0)
            with pytest.raises(ValueError, match=pattern):
                cugemm8.per_block_cast_to_fp8(x0)
    finally:
        with cp.cuda.Device(1):
            cugemm8.set_num_sms(before1)
