"""The main job's own GPU helpers (cugemm8.cli._data: the cuRAND-free
generator and the cuBLAS-free float64 product) and the main job itself, on
the GPU.  The slim cuda12 / cuda13 extras ship neither cuRAND nor cuBLAS, so
`python -m cugemm8` must not need them (tests/test_cli.py checks the source
on any machine; these tests run the kernels)."""
from __future__ import annotations

import numpy as np
import pytest

from cugemm8 import cli
from cugemm8.cli import _data

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (37, 45, 70), (64, 2112, 128), (130, 33, 513)])
def test_matmul_nt_matches_the_float64_product(cp, m, n, k):
    rs = np.random.default_rng(m * 1000 + n + k)
    x, y = rs.standard_normal((m, k)), rs.standard_normal((n, k))
    got = _data.matmul_nt(cp.asarray(x), cp.asarray(y), cp)
    np.testing.assert_allclose(cp.asnumpy(got), x @ y.T, rtol=1e-12, atol=1e-12 * k)
    # a strided operand (a column slice) and accumulation into an out
    xs = cp.asarray(np.concatenate([x, x], axis=1))[:, k // 2:k // 2 + k]
    out = cp.ones((m, n))
    _data.matmul_nt(xs, cp.asarray(y), cp, out=out, accumulate=True)
    want = np.concatenate([x, x], axis=1)[:, k // 2:k // 2 + k] @ y.T + 1
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-12, atol=1e-12 * k)


def test_rng_is_seeded_and_normal(cp):
    a = _data.Rng(cp, 5).standard_normal((1 << 20,))
    b = _data.Rng(cp, 5).standard_normal((1 << 20,))
    c = _data.Rng(cp, 6).standard_normal((1 << 20,))
    assert a.dtype == cp.float32 and bool(cp.all(a == b)) and not bool(cp.all(a == c))
    h = cp.asnumpy(a).astype(np.float64)
    assert abs(h.mean()) < 5e-3 and abs(h.std() - 1) < 5e-3 and np.isfinite(h).all()
    assert abs((np.abs(h) < 1).mean() - 0.6827) < 3e-3
    r = _data.Rng(cp, 1)
    first, second = r.standard_normal((8,)), r.standard_normal((8,))
    assert not bool(cp.all(first == second))         # each draw is a new stream
    u = cp.asnumpy(r.randint(-3, 4, (1 << 16,)))
    assert u.dtype == np.int32 and u.min() == -3 and u.max() == 3
    counts = np.bincount(u + 3)
    assert counts.min() > 0.9 * counts.mean()


def test_operands_on_the_gpu_give_the_reference_the_numpy_path_gives(cp):
    shape = cli.Shape("normal", 70, 256, 384)
    ops = cli.make_operands(shape, cp, seed=3)
    ref, bound = cli.reference(ops, shape, cp, bound=True)
    host = {key: cp.asnumpy(v) if hasattr(v, "get") else v for key, v in ops.items()}
    ref_h, bound_h = cli.reference(host, shape, np, bound=True)
    np.testing.assert_allclose(cp.asnumpy(ref), ref_h, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(cp.asnumpy(bound), bound_h, rtol=1e-9, atol=1e-12)


def test_main_job_quick_passes():
    assert cli.main(["check", "--quick", "--reps", "2"]) == 0
