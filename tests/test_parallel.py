"""CPU tests of the multi-GPU plumbing (issue 24): no GPU needed.

* :mod:`cugemm8.launch`: the launcher's arguments, each rank's environment
  (rank, world size, device, unique-id file, NVLink multicast off), failure
  and timeout handling, run end to end on scripts that never touch a GPU;
  the rank settings and the unique-id file.
* :mod:`cugemm8.parallel`: capacity, ``expected_m`` and chunk planning; the
  NumPy models of the decode step's device plans, and a NumPy simulation of
  the whole multi-rank decode step built from them (dispatch, fixed-slot
  exchange, masked layout, return, combine) against ``sum_j w W_e x``;
  argument errors raised before any device work.
* ``compile``-marked: the step's kernels build with NVRTC (no GPU).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from cugemm8 import launch as L
from cugemm8 import parallel as P

ROOT = Path(__file__).resolve().parent.parent

_ENV_PROBE = """\
import os, sys, time
keys = ["CUGEMM8_RANK", "CUGEMM8_WORLD_SIZE", "CUGEMM8_DEVICE", "CUGEMM8_NCCL_ID_FILE",
        "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"]
# one write per line: the ranks share the pipe (and PYTHONUNBUFFERED would split a print)
sys.stdout.write(" ".join(["PROBE", *[os.environ.get(k, "-") for k in keys], "|", *sys.argv[1:]]) + "\\n")
sys.stdout.flush()
rank = int(os.environ["CUGEMM8_RANK"])
if sys.argv[1:2] == ["fail"] and rank == 1:
    sys.exit(3)
if sys.argv[1:2] in (["fail"], ["sleep"]):
    time.sleep(60)
"""


def _run_launcher(tmp_path, *args, timeout=60):
    script = tmp_path / "probe.py"
    script.write_text(_ENV_PROBE)
    env = dict(os.environ, NCCL_NVLS_ENABLE="1")          # the launcher must override it
    cmd = [sys.executable, "-m", "cugemm8.launch", *[str(script) if a == "PROBE" else a for a in args]]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    rows = sorted(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("PROBE"))
    return proc, rows, time.monotonic() - t0


# ----------------------------------------------------------------------------
# The launcher
# ----------------------------------------------------------------------------

def test_launch_gives_every_rank_its_environment(tmp_path):
    proc, rows, _ = _run_launcher(tmp_path, "--nproc", "3", "PROBE", "--foo", "1")
    assert proc.returncode == 0, proc.stderr
    assert [r[:3] for r in rows] == [["0", "3", "0"], ["1", "3", "1"], ["2", "3", "2"]]
    id_files = {r[3] for r in rows}
    assert len(id_files) == 1 and id_files.pop().endswith("nccl_id.json")
    assert all(r[4:7] == ["0", "1", "1"] for r in rows)                # multicast off, overriding the parent
    assert all(r[8:] == ["--foo", "1"] for r in rows)                   # the script's own arguments
    assert not Path(rows[0][3]).parent.exists()                         # the temporary folder is gone


def test_launch_devices_and_one_rank(tmp_path):
    proc, rows, _ = _run_launcher(tmp_path, "--nproc", "2", "--devices", "3,1", "PROBE")
    assert proc.returncode == 0, proc.stderr
    assert [r[:3] for r in rows] == [["0", "2", "3"], ["1", "2", "1"]]
    proc, rows, _ = _run_launcher(tmp_path, "--nproc", "1", "PROBE")
    assert proc.returncode == 0 and [r[:3] for r in rows] == [["0", "1", "0"]]


def test_launch_module_mode(tmp_path):
    (tmp_path / "probe_mod.py").write_text(_ENV_PROBE)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "cugemm8.launch", "--nproc", "2", "-m", "probe_mod", "x"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("PROBE")) == ["0", "1"]


def test_launch_failure_stops_the_other_ranks(tmp_path):
    proc, rows, seconds = _run_launcher(tmp_path, "--nproc", "3", "PROBE", "fail")
    assert proc.returncode == 3
    assert seconds < 30                                 # the sleeping ranks were stopped
    assert "rank 1 exited with code 3" in proc.stderr


def test_launch_timeout(tmp_path):
    proc, _, seconds = _run_launcher(tmp_path, "--nproc", "2", "--timeout", "1", "PROBE", "sleep")
    assert proc.returncode == L.EXIT_TIMEOUT and seconds < 30
    assert "timed out" in proc.stderr


@pytest.mark.parametrize("argv,message", [
    (["--nproc", "0", "x.py"], "--nproc 0 must be >= 1"),
    (["--nproc", "2", "--devices", "0", "x.py"], "--devices names 1 device(s) for --nproc 2"),
    (["--nproc", "2", "--devices", "0,0", "x.py"], "distinct"),
    (["--nproc", "2", "--devices", "a", "x.py"], "comma-separated ints"),
    (["--nproc", "2", "--timeout", "0", "x.py"], "--timeout must be > 0"),
    (["--nproc", "2"], "required: script"),
])
def test_launcher_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        L.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_launch_function_errors():
    with pytest.raises(ValueError, match="nproc=0"):
        L.launch(["x"], 0)
    with pytest.raises(TypeError, match="nproc must be an int"):
        L.launch(["x"], True)
    with pytest.raises(ValueError, match="command is empty"):
        L.launch([], 1)
    with pytest.raises(ValueError, match="one per rank"):
        L.launch(["x"], 2, devices=[1, 1])
    with pytest.raises(ValueError, match="n=2 ranks"):
        L.run_ranks(print, 2, {}, timeout_s=1, devices=[0])


def test_child_env_overrides_the_parent():
    env = L.child_env({"NCCL_NVLS_ENABLE": "1", "KEEP": "x", "CUGEMM8_RANK": "9"},
                      rank=1, world_size=4, device=5, id_file="/tmp/id")
    assert env["KEEP"] == "x"
    assert {k: env[k] for k in (L.ENV_RANK, L.ENV_WORLD_SIZE, L.ENV_DEVICE, L.ENV_NCCL_ID_FILE)} == {
        "CUGEMM8_RANK": "1", "CUGEMM8_WORLD_SIZE": "4", "CUGEMM8_DEVICE": "5", "CUGEMM8_NCCL_ID_FILE": "/tmp/id"}
    assert all(env[k] == v for k, v in L.MULTICAST_OFF_ENV.items())


# ----------------------------------------------------------------------------
# Rank settings and the unique-id file
# ----------------------------------------------------------------------------

@pytest.fixture
def clean_env(monkeypatch):
    for k in (L.ENV_RANK, L.ENV_WORLD_SIZE, L.ENV_DEVICE, L.ENV_NCCL_ID_FILE):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_rank_settings_from_arguments_and_environment(clean_env):
    assert L.resolve_rank_settings() == (0, 1, 0, None)                 # one process, no launcher
    clean_env.setenv(L.ENV_RANK, "2")
    clean_env.setenv(L.ENV_WORLD_SIZE, "4")
    clean_env.setenv(L.ENV_NCCL_ID_FILE, "/tmp/x.json")
    assert L.resolve_rank_settings() == (2, 4, 2, "/tmp/x.json")        # device defaults to the rank
    clean_env.setenv(L.ENV_DEVICE, "0")
    assert L.resolve_rank_settings() == (2, 4, 0, "/tmp/x.json")
    assert L.resolve_rank_settings(rank=1, device=3, id_file="/tmp/y") == (1, 4, 3, "/tmp/y")


@pytest.mark.parametrize("env,kwargs,err,message", [
    ({"CUGEMM8_RANK": "one"}, {}, ValueError, "CUGEMM8_RANK='one' is not an int"),
    ({}, {"rank": 2, "world_size": 2, "id_file": "f"}, ValueError, r"rank=2 must be in \[0, 2\)"),
    ({}, {"world_size": 0}, ValueError, "world_size=0 must be >= 1"),
    ({}, {"device": -1}, ValueError, "device=-1 must be >= 0"),
    ({}, {"world_size": 2}, ValueError, "needs an NCCL unique-id file"),
    ({}, {"rank": 1.0}, TypeError, "rank must be an int"),
    ({}, {"id_file": 3}, TypeError, "id_file must be a path"),
])
def test_rank_settings_errors(clean_env, env, kwargs, err, message):
    for k, v in env.items():
        clean_env.setenv(k, v)
    with pytest.raises(err, match=message):
        L.resolve_rank_settings(**kwargs)


def test_unique_id_file_round_trip(tmp_path):
    uid = tuple(((i * 37) % 256) - 128 for i in range(L.NCCL_UNIQUE_ID_BYTES))   # signed chars, as CuPy gives
    path = str(tmp_path / "id.json")
    L.write_unique_id(path, uid, 3)
    assert L.read_unique_id(path, 3) == uid
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]           # atomic: no temporary left
    with pytest.raises(ValueError, match="written for world size 3, this process has 2"):
        L.read_unique_id(path, 2)
    with pytest.raises(ValueError, match="128"):
        L.write_unique_id(path, uid[:5], 3)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not an NCCL unique-id file"):
        L.read_unique_id(str(tmp_path / "bad.json"), 3)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="is rank 0 running"):
        L.read_unique_id(str(tmp_path / "missing.json"), 3, timeout_s=0.2)
    assert time.monotonic() - t0 < 5


def test_nccl_type_names_the_dtype():
    class FakeNccl:
        NCCL_FLOAT32, NCCL_BFLOAT16 = 7, 9
    import ml_dtypes
    assert L.nccl_type(FakeNccl, np.float32) == 7
    assert L.nccl_type(FakeNccl, ml_dtypes.bfloat16) == 9
    with pytest.raises(ValueError, match="complex64 has no NCCL type"):
        L.nccl_type(FakeNccl, np.complex64)


def test_multicast_off(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    with pytest.raises(RuntimeError, match="NVLink multicast must stay off"):
        L.check_multicast_off()
    L.multicast_off()
    L.check_multicast_off()


# ----------------------------------------------------------------------------
# Planning
# ----------------------------------------------------------------------------

def test_capacity_defaults_are_lossless():
    cap = P.plan_decode_capacity(64, 8, 4, 16)
    assert (cap.slots_per_peer, cap.m_max) == (64 * 8, 4 * 64)
    assert cap.expected_m == 32 and cap.lossless and cap.num_experts == 64        # 64 * 8 / 16
    cap = P.plan_decode_capacity(10, 4, 2, 3)
    assert cap.slots_per_peer == 10 * 3                                          # a token picks <= 3 of 3
    assert cap.expected_m == 14 and cap.m_max == 20                              # ceil(10 * 4 / 3)
    assert P.plan_decode_capacity(10, 4, 2, 3, m_max=12).expected_m == 12        # clamped to m_max
    cap = P.plan_decode_capacity(64, 8, 4, 16, slots_per_peer=100, m_max=40)
    assert (cap.slots_per_peer, cap.m_max, cap.lossless) == (100, 40, False)


def test_expected_m_from_routing():
    rng = np.random.default_rng(1)
    ids = np.stack([rng.permutation(8)[:2] for _ in range(30)])                  # 30 tokens, top-2 of 8
    ids[3, 1] = -1                                                               # "no expert"
    load = P.expert_load_from_ids(ids, 8)
    assert load.sum() == 59 and load.dtype == np.int64
    np.testing.assert_array_equal(load, np.bincount(ids[ids >= 0], minlength=8))
    per_rank = [int(np.ceil(load[r * 4:(r + 1) * 4].mean())) for r in range(2)]
    assert [P.expected_m_from_routing(load, 2, 4, r) for r in range(2)] == per_rank
    assert P.expected_m_from_routing(load, 2, 4) == max(per_rank)
    assert P.expected_m_from_routing(np.zeros(8), 2, 4) == 1
    assert P.expected_m_from_routing([4.0, 4.0], 1, 2) == 4                      # no rounding up of exact means
    cap = P.plan_decode_capacity(30, 2, 2, 4, expert_load=load, rank=1)
    assert cap.expected_m == per_rank[1]
    with pytest.raises(ValueError, match="expert 8; there are 8 experts"):
        P.expert_load_from_ids([[8]], 8)
    with pytest.raises(TypeError, match="integers"):
        P.expert_load_from_ids([[0.5]], 8)
    with pytest.raises(ValueError, match="9 entries"):
        P.expected_m_from_routing(np.ones(9), 2, 4)
    with pytest.raises(ValueError, match="non-negative"):
        P.expected_m_from_routing(-np.ones(8), 2, 4)
    with pytest.raises(ValueError, match=r"rank=2 must be \[0, 1\]"):
        P.expected_m_from_routing(np.ones(8), 2, 4, rank=2)


@pytest.mark.parametrize("kwargs,err,message", [
    ({"tokens": 0}, ValueError, "tokens=0 must be >= 1"),
    ({"top_k": 9}, ValueError, "top_k=9 exceeds the 8 experts"),
    ({"n_ranks": 1.5}, TypeError, "n_ranks must be an int"),
    ({"slots_per_peer": 0}, ValueError, r"slots_per_peer=0 must be \[1, 16\]"),
    ({"m_max": 17}, ValueError, r"m_max=17 must be \[1, 16\]"),
    ({"experts_per_rank": True}, TypeError, "experts_per_rank must be an int"),
])
def test_capacity_errors(kwargs, err, message):
    args = {"tokens": 8, "top_k": 2, "n_ranks": 2, "experts_per_rank": 4} | kwargs
    with pytest.raises(err, match=message):
        P.plan_decode_capacity(args.pop("tokens"), args.pop("top_k"), args.pop("n_ranks"),
                               args.pop("experts_per_rank"), **args)


@pytest.mark.parametrize("tokens", [0, 1, 64, 127, 128, 129, 384, 1000, 1024, 4097])
@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("align", [1, 64, 128])
def test_plan_chunks_covers_the_tokens_on_aligned_boundaries(tokens, chunks, align):
    ranges = P.plan_chunks(tokens, chunks, align=align)
    blocks = -(-tokens // align)
    assert len(ranges) == min(chunks, blocks)
    assert [r[0] for r in ranges[1:]] == [r[1] for r in ranges[:-1]]               # contiguous, in order
    if ranges:
        assert ranges[0][0] == 0 and ranges[-1][1] == tokens
    assert all(r0 < r1 and r0 % align == 0 for r0, r1 in ranges)
    sizes = [-(-(r1 - r0) // align) for r0, r1 in ranges]
    assert max(sizes, default=0) - min(sizes, default=0) <= 1                      # balanced in blocks


def test_plan_chunks_examples_and_errors():
    assert P.plan_chunks(1024, 2) == [(0, 512), (512, 1024)]
    assert P.plan_chunks(384, 3) == [(0, 128), (128, 256), (256, 384)]
    assert P.plan_chunks(64, 2) == [(0, 64)]                 # one block: no second chunk
    assert P.plan_chunks(300, 2) == [(0, 128), (128, 300)]
    with pytest.raises(ValueError, match="chunks=0 must be >= 1"):
        P.plan_chunks(10, 0)
    with pytest.raises(ValueError, match="tokens=-1"):
        P.plan_chunks(-1, 2)
    with pytest.raises(TypeError, match="align must be an int"):
        P.plan_chunks(10, 2, align=1.0)


# ----------------------------------------------------------------------------
# The decode step's plans, and the step simulated with NumPy
# ----------------------------------------------------------------------------

def test_dispatch_model_example():
    ids = np.array([[0, 3], [2, -1], [5, 1], [3, 9]])       # 2 ranks x 3 experts; 9 is invalid
    pair_slot, counts, dropped, invalid = P.dispatch_slots_reference(ids, 2, 3, 2)
    # rank 0 (experts 0-2) gets pairs 0, 2, 5 (slots 0, 1, dropped); rank 1 pairs 1, 4, 6 (slots 2, 3, dropped)
    np.testing.assert_array_equal(pair_slot, [0, 2, 1, -1, 3, -1, -1, -1])
    np.testing.assert_array_equal(counts, [2, 2])
    assert (dropped, invalid) == (2, 1)


def test_unpack_model_example():
    # 2 sources x 3 slots; source 0 sent 2 rows, source 1 sent 3; slot (0, 2) holds stale data
    recv_expert = np.array([1, 0, 1, 1, 7, 1])
    slot_row, masked_m, dropped, invalid = P.expert_rows_reference(recv_expert, [2, 3], 2, 2)
    np.testing.assert_array_equal(slot_row, [2, 0, -1, 3, -1, -1])
    np.testing.assert_array_equal(masked_m, [1, 2])
    assert (dropped, invalid) == (1, 1)


def _simulate_step(xs, routes, weights, n, e, slots, m_max):
    """The decode step for every rank with NumPy, built from the models:
    returns (outputs per rank, total drops)."""
    h = xs[0].shape[1]
    plans = [P.dispatch_slots_reference(ids, n, e, slots) for ids, _ in routes]
    k = routes[0][0].shape[1]
    sends = []
    for r, (ids, _) in enumerate(routes):
        pair_slot = plans[r][0]
        rows = np.full((n * slots, h), np.nan)                         # unsent slots hold garbage
        le = np.full(n * slots, -5)
        for q in np.nonzero(pair_slot >= 0)[0]:
            rows[pair_slot[q]] = xs[r][q // k]
            le[pair_slot[q]] = ids.reshape(-1)[q] % e
        sends.append((rows, le))
    drops = sum(p[2] for p in plans)
    back = [np.full((n * slots, h), np.nan) for _ in range(n)]
    for d in range(n):
        blk = slice(0, slots)
        recv_rows = np.concatenate([sends[s][0][d * slots:(d + 1) * slots][blk] for s in range(n)])
        recv_le = np.concatenate([sends[s][1][d * slots:(d + 1) * slots][blk] for s in range(n)])
        recv_counts = [plans[s][1][d] for s in range(n)]
        slot_row, masked_m, dropped, invalid = P.expert_rows_reference(recv_le, recv_counts, e, m_max)
        drops += dropped
        assert invalid == 0
        a_m = np.full((e * m_max, h), np.nan)
        a_m[slot_row[slot_row >= 0]] = recv_rows[slot_row >= 0]
        y = np.full_like(a_m, np.nan)
        for j in range(e):                                          # the masked GEMM: valid rows only
            lo = j * m_max
            y[lo:lo + masked_m[j]] = a_m[lo:lo + masked_m[j]] @ weights[d * e + j].T
        for s in range(n):
            for i in range(recv_counts[s]):
                row = slot_row[s * slots + i]
                back[s][d * slots + i] = y[row] if row >= 0 else 0.0
    outs = []
    for r, (ids, w) in enumerate(routes):
        pair_slot = plans[r][0].reshape(ids.shape)
        out = np.zeros_like(xs[r])
        for t in range(ids.shape[0]):
            for j in range(k):
                if pair_slot[t, j] >= 0:
                    out[t] += w[t, j] * back[r][pair_slot[t, j]]
        outs.append(out)
    return outs, drops


@pytest.mark.parametrize("n,e,k,tokens", [(1, 4, 2, 5), (2, 3, 2, 7), (3, 4, 3, 9), (4, 2, 4, 3)])
def test_decode_step_simulation_lossless(n, e, k, tokens):
    """With the default capacities the step computes ``sum_j w[t, j] W_e x_t``
    for every token of every rank (tokens with "no expert" choices included)."""
    rng = np.random.default_rng(n * 100 + e)
    h = 8
    weights = rng.standard_normal((n * e, h, h))
    xs = [rng.standard_normal((tokens, h)) for _ in range(n)]
    routes = []
    for _ in range(n):
        ids = np.stack([rng.permutation(n * e)[:k] for _ in range(tokens)])
        ids[0, -1] = -1
        routes.append((ids, rng.random((tokens, k))))
    cap = P.plan_decode_capacity(tokens, k, n, e)
    outs, drops = _simulate_step(xs, routes, weights, n, e, cap.slots_per_peer, cap.m_max)
    assert drops == 0
    for r, (ids, w) in enumerate(routes):
        want = np.stack([sum(w[t, j] * weights[ids[t, j]] @ xs[r][t] for j in range(k) if ids[t, j] >= 0)
                         for t in range(tokens)])
        np.testing.assert_allclose(outs[r], want, rtol=1e-12, atol=1e-12)


def test_decode_step_simulation_counts_drops():
    """Every rank routes every token to expert 0: tight capacities drop rows,
    and the dropped pairs add nothing."""
    n, e, k, tokens, h = 2, 2, 2, 6, 4
    rng = np.random.default_rng(5)
    weights = rng.standard_normal((n * e, h, h))
    xs = [rng.standard_normal((tokens, h)) for _ in range(n)]
    routes = [(np.tile([0, 3], (tokens, 1)), np.ones((tokens, k))) for _ in range(n)]
    outs, drops = _simulate_step(xs, routes, weights, n, e, slots=4, m_max=5)
    # per source: 6 pairs to rank 0 and 6 to rank 1, 4 slots each -> 2 + 2 dropped per source;
    # expert 0 receives 4 + 4 rows, keeps 5 -> 3 dropped; expert 3 (rank 1, local 1) likewise
    assert drops == 2 * 4 + 2 * 3
    assert np.allclose(outs[0][:4], xs[0][:4] @ weights[0].T + xs[0][:4] @ weights[3].T)
    assert np.allclose(outs[0][4:], 0) and np.allclose(outs[1][1:4], 0)   # source 1 kept 1 row per expert
    assert np.allclose(outs[1][0], xs[1][0] @ weights[0].T + xs[1][0] @ weights[3].T)


# ----------------------------------------------------------------------------
# Argument errors before any device work
# ----------------------------------------------------------------------------

def test_layer_argument_errors():
    x = np.zeros((4, 16), np.float32)
    with pytest.raises(ValueError, match="chunks=0"):
        P.mlp_forward_overlapped(x, None, None, chunks=0)
    with pytest.raises(ValueError, match="reserve=-1"):
        P.mlp_forward_overlapped(x, None, None, reserve=-1)
    with pytest.raises(TypeError, match="x is a NumPy"):
        P.mlp_forward_overlapped(x, None, None)
    with pytest.raises(TypeError, match="x is a NumPy"):
        P.mlp_forward(x, None, None)
    with pytest.raises(TypeError, match="gate_up is a NumPy"):
        P.silu_mul(x)
    with pytest.raises(ValueError, match="count=-1"):
        with P.reserve_sms(-1):
            pass
    cap = P.plan_decode_capacity(4, 2, 1, 2)
    with pytest.raises(TypeError, match="capacity must be a DecodeCapacity"):
        P.EPMoEDecodeStep(None, None, {"tokens": 4})
    with pytest.raises(TypeError, match="w1q must be a"):
        P.EPMoEDecodeStep(None, None, cap)
    with pytest.raises(TypeError, match=r"w1q\[0\] is a NumPy"):
        P.EPMoEDecodeStep((np.zeros((2, 32, 16), np.uint8), None), (None, None), cap)


def test_row_layout():
    kb, off, row = P._row_layout(7168)
    assert (kb, off, row) == (56, 7168 + 224, 7408) and row % 16 == 0 and row >= off + 4
    assert P._row_layout(16) == (1, 20, 32)


@pytest.mark.compile
def test_step_kernels_compile():
    from cugemm8 import _jit
    ptx, log, _ = _jit._nvrtc_compile(P.KERNEL_SOURCE, ("-arch=compute_90", "-std=c++17"), [], "ptx")
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    for name in P.KERNEL_NAMES:
        assert f".entry {name}(" in ptx, name
    assert ".local" not in ptx                      # no local memory (no spills, no stack arrays)
    assert "warning" not in log.lower(), log


def test_launch_module_docs_name_every_variable():
    doc = L.__doc__
    for name in (L.ENV_RANK, L.ENV_WORLD_SIZE, L.ENV_DEVICE, L.ENV_NCCL_ID_FILE, *L.MULTICAST_OFF_ENV):
        assert name.split("_")[0] in doc and name[:20] in doc.replace("``\n``", ""), name
    assert textwrap.dedent("python -m cugemm8.launch --nproc N") in doc
