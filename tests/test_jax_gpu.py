"""JAX interop on the GPU: zero-copy DLPack both ways (FP8 via capsule
relabelling, BF16 natively), GEMMs on JAX arrays, and the MoE example."""
from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import cugemm8
from cugemm8 import interop
from tests import gpu_helpers as H

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU backend here")
    import cupy
    return cupy


def test_fp8_round_trip_is_zero_copy(cp):
    bits = np.arange(256, dtype=np.uint8)
    bits[(bits & 0x7F) == 0x7F] = 0
    x = jax.lax.bitcast_convert_type(jnp.asarray(bits), jnp.float8_e4m3fn)
    c = interop.to_cupy(x)
    assert c.dtype == np.uint8 and c.data.ptr == x.unsafe_buffer_pointer()
    np.testing.assert_array_equal(cp.asnumpy(c), bits)
    back = interop.to_jax(c, fp8=True)
    assert back.dtype == jnp.float8_e4m3fn and back.unsafe_buffer_pointer() == c.data.ptr
    np.testing.assert_array_equal(np.asarray(jax.lax.bitcast_convert_type(back, jnp.uint8)), bits)


def test_bf16_round_trip(cp):
    x = jnp.linspace(-3, 3, 1024, dtype=jnp.bfloat16).reshape(32, 32)
    c = interop.to_cupy(x)
    assert c.dtype.name == "bfloat16" and c.data.ptr == x.unsafe_buffer_pointer()
    y = interop.to_jax(c)
    assert bool(jnp.all(y == x))


def test_host_arrays_are_rejected(cp):
    with pytest.raises(TypeError, match="host"):
        interop.to_cupy(np.zeros(4, np.float32))
    cpu = jax.devices("cpu")[0] if jax.devices("cpu") else None
    if cpu is not None:
        with pytest.raises(TypeError, match="host memory"):
            interop.to_cupy(jax.device_put(jnp.zeros(4), cpu))


def test_gemm_on_jax_arrays_matches_cupy_bits(cp):
    rng = np.random.default_rng(1)
    m, n, k = 200, 1024, 1536
    a, b = H.random_fp8(cp, rng, (m, k)), H.random_fp8(cp, rng, (n, k))
    sfa, sfb = H.random_scales(cp, rng, (m, 12)), H.random_scales(cp, rng, (8, 12))
    out = cp.empty((m, n), cp.dtype("bfloat16"))
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    ja, jb = interop.to_jax(a, fp8=True), interop.to_jax(b, fp8=True)
    jsfa, jsfb = interop.to_jax(cp.ascontiguousarray(sfa)), interop.to_jax(sfb)
    jout = interop.gemm_fp8_fp8_bf16_nt_jax((ja, jsfa), (jb, jsfb))
    got = cp.asarray(np.asarray(jax.lax.bitcast_convert_type(jout, jnp.uint16)))
    assert bool(cp.all(got == out.view(cp.uint16)))


def test_moe_expert_example(cp):
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "jax_moe_expert.py"
    spec = importlib.util.spec_from_file_location("jax_moe_expert", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.run(tokens=128) < mod.TOLERANCE
