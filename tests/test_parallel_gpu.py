"""GPU tests of the multi-GPU machinery on ONE GPU (issue 24), world size 1.

* the launcher with one rank (a one-rank NCCL communicator);
* the expert-parallel decode step: its device plans equal the NumPy models
  exactly, its output is within 1e-2 of per-expert plain GEMMs
  (``examples/tensor_parallel.py``'s ``moe_reference``), its CUDA-graph
  replays on new inputs are bit-identical to eager runs, with self traffic
  written in place and sent through NCCL to itself; tight capacities drop
  and count rows as the models say;
* the token-chunked TP layer: overlapped (all-reduce on the communication
  stream, SMs reserved) bit-identical to the same chunks reduced on the
  compute stream and to the plain layer run chunk by chunk, within 1e-2 of
  the unchunked layer; the SM reservation restored afterwards;
* ``silu_mul`` bit-identical to the FP32 formula in CuPy.

Parts that need NCCL skip with the reason when CuPy cannot load it.
Several GPUs: tests/test_multi_gpu.py.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cugemm8
from cugemm8 import launch as L
from cugemm8 import parallel as P
from tests.test_multi_gpu import _load_example

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
EP_TOL = 1e-2


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


@pytest.fixture(scope="module")
def ex():
    return _load_example()


@pytest.fixture(scope="module")
def comm1(cp):
    """A one-rank NCCL communicator on the current device."""
    try:
        L.import_nccl()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    ctx = L.init_process(rank=0, world_size=1, device=cp.cuda.runtime.getDevice(), use_stream=False)
    yield ctx.comm
    ctx.close()


def _sync(cp):
    cp.cuda.Device().synchronize()


def _bits_equal(cp, a, b) -> bool:
    return a.shape == b.shape and bool(cp.array_equal(a.view(cp.uint32), b.view(cp.uint32)))


# ----------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------

def test_launch_one_rank(comm1):
    proc = subprocess.run([sys.executable, "-m", "cugemm8.launch", "--nproc", "1", "--timeout", "300",
                           str(ROOT / "tests" / "launch_probe.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "[rank 0/1]" in proc.stdout and "all-reduce 1 (want 1) ok" in proc.stdout, proc.stdout


# ----------------------------------------------------------------------------
# Expert-parallel decode step, one rank
# ----------------------------------------------------------------------------

E, TOKENS, TOP_K = 6, 40, 4


@pytest.fixture(scope="module")
def experts(ex):
    """Quantised DeepSeek-V3-sized experts (H 7168, I 2048), E of them."""
    return ex.ep_expert_weights(0, E, seed=11)


def _inputs(cp, ex, rng, t, *, skew=False):
    x = ex.hashed_normal(int(rng.integers(1 << 62)), ex.HIDDEN, t, ex.HIDDEN).astype(cp.dtype("bfloat16"))
    ids = np.stack([rng.permutation(E)[:TOP_K] for _ in range(t)]).astype(np.int32)
    if skew:
        ids[:, 0] = 0                                       # everyone wants expert 0
    ids[1, 2] = -1                                          # "no expert" choices
    ids[t - 1, 0] = -1
    w = rng.random((t, TOP_K)).astype(np.float32)
    return x, ids, w


def _check_out(cp, ex, out, x, ids, w, experts, what):
    t = x.shape[0]
    ref = ex.moe_reference(x, ids, cp.asarray(w), *experts)
    err = ex.rel_l2(out[:t], ref)
    assert err < EP_TOL, f"{what}: rel L2 vs per-expert plain GEMMs {err:.3e}"
    assert bool(cp.all(out[t:] == 0)), f"{what}: empty token slots must give zeros"


def _recv_experts(cp, step):
    off = step.expert_offset
    return cp.ascontiguousarray(step.recv[:, off:off + 4]).view(cp.int32).ravel().get()


def test_decode_plans_match_models_and_reference(cp, ex, experts, rng):
    cap = P.plan_decode_capacity(TOKENS, TOP_K, 1, E)
    step = P.EPMoEDecodeStep(*experts, cap)
    x, ids, w = _inputs(cp, ex, rng, TOKENS)
    step.load(x, ids, w)
    out = step.run()
    _sync(cp)
    pair_slot, send_counts, dropped, invalid = P.dispatch_slots_reference(ids, 1, E, cap.slots_per_peer)
    np.testing.assert_array_equal(step.pair_slot.get(), pair_slot)
    np.testing.assert_array_equal(step.send_counts.get(), send_counts)
    np.testing.assert_array_equal(step.recv_counts.get(), send_counts)       # self: received == sent
    slot_row, masked_m, dropped2, invalid2 = P.expert_rows_reference(
        _recv_experts(cp, step), send_counts, E, cap.m_max)
    np.testing.assert_array_equal(step.slot_row.get(), slot_row)
    np.testing.assert_array_equal(step.masked_m.get(), masked_m)
    assert dropped == invalid == dropped2 == invalid2 == 0
    assert step.drop_counts() == {"send_overflow": 0, "expert_overflow": 0, "invalid": 0}
    assert masked_m.sum() == (ids >= 0).sum()
    _check_out(cp, ex, out, x, ids, w, experts, "eager step")


@pytest.mark.parametrize("self_copy", [True, False], ids=["self-in-place", "self-through-nccl"])
def test_decode_graph_replay(cp, ex, experts, rng, request, self_copy):
    comm = None if self_copy else request.getfixturevalue("comm1")
    cap = P.plan_decode_capacity(TOKENS, TOP_K, 1, E)
    step = P.EPMoEDecodeStep(*experts, cap, comm=comm, self_copy=self_copy)
    x, ids, w = _inputs(cp, ex, rng, TOKENS)
    step.load(x, ids, w)
    step.capture()
    for t in (TOKENS, 29):                                   # new contents; then fewer tokens than slots
        x, ids, w = _inputs(cp, ex, rng, t)
        step.load(x, ids, w)
        _sync(cp)
        step.replay()
        step.graph_stream.synchronize()
        got = step.out.copy()
        _sync(cp)
        step.run()                                           # the same inputs, eagerly
        _sync(cp)
        assert _bits_equal(cp, got, step.out), f"t={t}: graph replay differs from the eager step"
        _check_out(cp, ex, got, x, ids, w, experts, f"replay t={t}")
        assert step.drop_counts() == {"send_overflow": 0, "expert_overflow": 0, "invalid": 0}


def test_decode_drops_are_counted(cp, ex, experts, rng):
    """Tight capacities: the device drops and counts exactly what the models
    say, and the dropped pairs add nothing to the output."""
    slots, m_max = 100, 24
    cap = P.plan_decode_capacity(TOKENS, TOP_K, 1, E, slots_per_peer=slots, m_max=m_max)
    step = P.EPMoEDecodeStep(*experts, cap)
    x, ids, w = _inputs(cp, ex, rng, TOKENS, skew=True)
    ids[5, 3] = E + 2                                        # past the last expert: skipped, counted
    step.load(x, ids, w)
    step.capture()
    _sync(cp)
    step.replay()
    step.graph_stream.synchronize()
    pair_slot, send_counts, send_drop, invalid = P.dispatch_slots_reference(ids, 1, E, slots)
    slot_row, _, expert_drop, _ = P.expert_rows_reference(_recv_experts(cp, step), send_counts, E, m_max)
    assert send_drop > 0 and expert_drop > 0 and invalid == 1
    assert step.drop_counts() == {"send_overflow": send_drop, "expert_overflow": expert_drop, "invalid": 1}
    kept = (pair_slot >= 0) & (slot_row[np.maximum(pair_slot, 0)] >= 0)
    effective = np.where(kept.reshape(ids.shape), ids, -1)
    _check_out(cp, ex, step.out, x, effective, w, experts, "tight capacities")


# ----------------------------------------------------------------------------
# Chunked, overlapped TP layer; SM reservation
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tp_layer(ex):
    w1, w2 = ex.tp_weight_slices(0, 1, seed=3, inter=2048)
    return cugemm8.per_block_cast_to_fp8(w1), cugemm8.per_block_cast_to_fp8(w2)


@pytest.mark.parametrize("use_comm", [False, True], ids=["no-comm", "one-rank-nccl"])
@pytest.mark.parametrize("tokens,chunks", [(384, 3), (300, 2)])
def test_overlapped_layer_equals_plain(cp, ex, tp_layer, request, use_comm, tokens, chunks):
    comm = request.getfixturevalue("comm1") if use_comm else None
    w1q, w2q = tp_layer
    x = ex.tp_activations(tokens, seed=5)
    reserve = 8
    before = cugemm8.get_num_sms()
    plain = P.mlp_forward(x, w1q, w2q, comm=comm)
    over = P.mlp_forward_overlapped(x, w1q, w2q, comm=comm, chunks=chunks, reserve=reserve)
    serial = P.mlp_forward_overlapped(x, w1q, w2q, comm=comm, chunks=chunks, reserve=reserve, overlap=False)
    with P.reserve_sms(reserve):
        by_chunk = cp.concatenate([P.mlp_forward(x[r0:r1], w1q, w2q)
                                   for r0, r1 in P.plan_chunks(tokens, chunks)])
    _sync(cp)
    assert cugemm8.get_num_sms() == before, "the SM reservation was not restored"
    assert _bits_equal(cp, over, serial), "overlapped chunks differ from serial chunks"
    assert _bits_equal(cp, over, by_chunk), "chunked layer differs from the plain layer run chunk by chunk"
    err = ex.rel_l2(over, plain)
    assert err < 1e-2, f"chunked vs unchunked layer: rel L2 {err:.3e}"
    if comm is not None:
        assert _bits_equal(cp, plain, P.mlp_forward(x, w1q, w2q)), "a one-rank all-reduce must be the identity"


def test_reserve_sms_is_restored(cp):
    from cugemm8 import _device
    total = _device.device_info()["num_sms"]
    cugemm8.set_num_sms(total - 3)
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with P.reserve_sms(10) as sms:
                assert sms == total - 10 == cugemm8.get_num_sms()
                raise RuntimeError("inside")
        assert cugemm8.get_num_sms() == total - 3
        with pytest.raises(ValueError, match="leave at least one"):
            with P.reserve_sms(total):
                pass
        assert cugemm8.get_num_sms() == total - 3
    finally:
        cugemm8.set_num_sms(total)


def test_silu_mul_matches_the_fp32_formula(cp, rng):
    bf16 = cp.dtype("bfloat16")
    gate_up = cp.asarray(rng.standard_normal((3, 50, 192)).astype(np.float32) * 4).astype(bf16)
    g = gate_up[..., :96].astype(cp.float32)
    u = gate_up[..., 96:].astype(cp.float32)
    want = (g / (1.0 + cp.exp(-g)) * u).astype(bf16)
    got = P.silu_mul(gate_up)
    assert bool(cp.array_equal(got.view(cp.uint16), want.view(cp.uint16)))
    out = cp.full((3, 50, 96), 7.0, dtype=np.float32).astype(bf16)
    masked_m = cp.asarray(np.array([50, 0, 17], np.int32))
    P.silu_mul(gate_up, out=out, masked_m=masked_m)
    for grp, m in enumerate((50, 0, 17)):
        assert bool(cp.array_equal(out[grp, :m].view(cp.uint16), want[grp, :m].view(cp.uint16)))
        assert bool(cp.all(out[grp, m:].astype(cp.float32) == 7.0)), "rows past masked_m must stay untouched"
    with pytest.raises(ValueError, match="must have shape"):
        P.silu_mul(gate_up, out=out[:, :10])
