"""CPU tests of the 1D1D GEMMs (FP32 out): configuration rules and
selection, every rejection path of ``cugemm8.fp8_gemm_nt`` (FP32 ``d``) and
``cugemm8.k_grouped_fp8_gemm_nt_contiguous`` on fake device arrays (as
tests/test_validation.py: nothing is ever launched), and (``-m compile``)
NVRTC builds of the kernel's instantiations for sm_90a without a GPU: no
spills, QGMMA present, no flush-to-zero arithmetic.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import cugemm8
from cugemm8 import _config_1d1d as C1, gemm_1d1d as G1

cupy = pytest.importorskip("cupy")

from tests.test_validation import fake  # noqa: E402


# ---------------------------------------------------------------- configuration

def test_smem_formula_and_stages():
    # stages * (BM*128 + BN*128 + align(BM*4, 128) + align(BN*4, 128)) + 256
    assert C1.smem_size(128, 128, 6) == 6 * (16384 + 16384 + 512 + 512) + 256
    assert C1.smem_size(256, 96, 4) == 4 * (32768 + 12288 + 1024 + 384) + 256
    assert C1.smem_size(128, 8, 1) == 16384 + 1024 + 512 + 128 + 256
    assert C1.max_stages(128, 128) == 6 and C1.max_stages(256, 128) == 4
    assert C1.max_stages(128, 192) == 5


@pytest.mark.parametrize("fields,reason", [
    (dict(block_m=64), "block_m"), (dict(block_n=12), "multiple of 8"), (dict(block_m=256, block_n=144), "register"), (dict(block_m=128, block_n=176), "register"),
    (dict(num_stages=2), "num_stages"), (dict(num_stages=17), "num_stages"), (dict(num_sms=0), "num_sms"),
])
def test_is_legal_rejects(fields, reason):
    f = dict(block_m=128, block_n=128, num_stages=4, num_sms=132, **{})
    f.update(fields)
    cfg = C1.make_config(f["block_m"], f["block_n"], f["num_stages"], f["num_sms"])
    ok, why = C1.is_legal(cfg)
    assert not ok and reason in why, why


def test_is_legal_smem_and_grid():
    cfg = C1.make_config(128, 128, 7, 132)            # 7 stages do not fit
    assert not C1.is_legal(cfg)[0]
    cfg = C1.make_config(128, 128, 6, 132)
    assert C1.is_legal(cfg) == (True, "ok")
    assert not C1.is_legal(cfg, available_sms=100)[0]
    assert str(cfg) == "128x128 s6 sms132"


@settings(max_examples=300, deadline=None, derandomize=True)
@given(m=st.integers(0, 40000), n=st.integers(1, 5000).map(lambda v: 8 * v), k=st.integers(0, 70000),
       g=st.integers(1, 64), sms=st.integers(1, 132), with_c=st.booleans(), tma=st.booleans())
def test_selection_is_legal_and_deterministic(m, n, k, g, sms, with_c, tma):
    cfg = C1.select_config(m, n, k, num_groups=g, num_sms=sms, with_c=with_c, tma_store=tma)
    assert C1.is_legal(cfg, available_sms=sms) == (True, "ok")
    assert cfg.tma_store == (tma and C1.tma_store_ok(cfg.block_n))   # TMA wherever the call and the tile allow it
    assert cfg.num_stages == C1.max_stages(cfg.block_m, cfg.block_n, tma_store=cfg.tma_store)   # the deepest pipeline
    tiles = g * -(-max(m, 1) // cfg.block_m) * -(-max(n, 8) // cfg.block_n)
    assert cfg.num_sms == min(sms, tiles)
    C1._rank.cache_clear()
    assert C1.select_config(m, n, k, num_groups=g, num_sms=sms, with_c=with_c, tma_store=tma) == cfg


def test_selection_rejects_bad_arguments():
    with pytest.raises(ValueError, match="m, n, k"):
        C1.select_config(-1, 8, 128)
    with pytest.raises(TypeError, match="k"):
        C1.select_config(8, 8, 128.0)
    with pytest.raises(ValueError, match="num_groups"):
        C1.select_config(8, 8, 128, num_groups=0)


def test_wgrad_shapes_pick_wide_tiles():
    for m, n, k in ((7168, 2048, 4096), (2112, 7168, 4096), (4096, 7168, 8192)):
        cfg = C1.select_config(m, n, k)
        assert cfg.block_m * cfg.block_n >= 128 * 128 and cfg.num_sms == 132, cfg


# ---------------------------------------------------------------- validation

class ReachedLaunch(Exception):
    pass


@pytest.fixture(autouse=True)
def no_device(monkeypatch):
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)

    def stop(*args, **kwargs):
        raise ReachedLaunch()
    monkeypatch.setattr(G1, "get_gemm_1d1d_config", stop)


def args(m=64, n=256, k=512):
    kb = -(-k // 128)
    return dict(a=fake((m, k), np.uint8), sfa=fake((m, kb), np.float32), b=fake((n, k), np.uint8),
                sfb=fake((n, kb), np.float32), d=fake((m, n), np.float32))


def call(a, sfa, b, sfb, d, c=None):
    cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d, c=c)


def test_valid_calls_reach_the_launch():
    x = args()
    with pytest.raises(ReachedLaunch):
        call(**x)
    with pytest.raises(ReachedLaunch):
        call(**x, c=x["d"])                                    # in place
    with pytest.raises(ReachedLaunch):
        call(**x, c=fake((64, 256), np.float32))               # separate c
    x = args(m=1, n=8, k=16)
    with pytest.raises(ReachedLaunch):
        call(**x)
    x = args(k=400_000)                                        # no K limit (unlike the 1D2D kernel)
    with pytest.raises(ReachedLaunch):
        call(**x)


@pytest.mark.parametrize("change,exc,match", [
    (dict(a=fake((64, 512), np.int8)), TypeError, "e4m3fn"),
    (dict(sfa=fake((64, 4), np.float16)), TypeError, "float32"),
    (dict(sfa=fake((64, 3), np.float32)), ValueError, r"sfa.*shape"),
    (dict(sfb=fake((2, 4), np.float32)), ValueError, r"sfb.*shape"),       # a 1D2D sfb with an FP32 d
    (dict(b=fake((256, 256), np.uint8)), ValueError, "k differs"),
    (dict(d=fake((64, 256), np.float64)), TypeError, "float32"),
    (dict(d=fake((64, 255), np.float32)), ValueError, "shape"),
    (dict(d=fake((64, 256), np.float32, strides=(2048, 4))), ValueError, "C-contiguous"),
    (dict(d=fake((64, 256), np.float32, offset=4)), ValueError, "8-byte"),
    (dict(a=fake((64, 512), np.uint8, strides=(520, 1))), ValueError, "multiple of 16"),
])
def test_rejections(change, exc, match):
    x = args()
    x.update(change)
    with pytest.raises(exc, match=match):
        call(**x)


def test_k_and_n_rules():
    x = args(k=520)
    with pytest.raises(ValueError, match="multiple of 16"):
        call(**x)
    x = args(n=100)
    with pytest.raises(ValueError, match="n = 100"):
        call(**x)


def test_c_rules():
    x = args()
    with pytest.raises(ValueError, match="shape"):
        call(**x, c=fake((64, 128), np.float32))
    with pytest.raises(TypeError, match="float32"):
        call(**x, c=fake((64, 256), np.float16))
    with pytest.raises(ValueError, match="overlaps d"):
        call(**x, c=cupy.ndarray((64, 256), np.float32, memptr=x["d"].data + 32))


def test_d_must_not_alias_an_input():
    x = args()
    x["d"] = cupy.ndarray((64, 256), np.float32, memptr=x["b"].data)
    with pytest.raises(ValueError, match="overlaps"):
        call(**x)


def test_bf16_d_with_c_is_refused():
    x = args()
    x["d"] = fake((64, 256), np.dtype("bfloat16"))
    with pytest.raises(ValueError, match="c"):
        call(**x, c=fake((64, 256), np.float32))


def kargs(ks=(128, 0, 256), m=64, n=256):
    kt = sum(ks)
    return dict(a=fake((m, kt), np.uint8), sfa=fake((m, kt // 128), np.float32), b=fake((n, kt), np.uint8),
                sfb=fake((n, kt // 128), np.float32), d=fake((len(ks), m, n), np.float32))


def kcall(ks, a, sfa, b, sfb, d, ks_tensor=None, c=None):
    cugemm8.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, ks_tensor, c=c)


def test_k_grouped_valid_calls():
    ks = [128, 0, 256]
    for kt, c in ((None, None), (fake((3,), np.int32), None)):
        x = kargs(ks)
        with pytest.raises(ReachedLaunch):
            kcall(ks, **x, ks_tensor=kt, c=c)
    x = kargs(ks)
    with pytest.raises(ReachedLaunch):
        kcall(ks, **x, c=x["d"])
    with pytest.raises(ReachedLaunch):
        kcall(np.array(ks), **kargs(ks))                        # an integer array works too


@pytest.mark.parametrize("ks,exc,match", [
    ([128, 100], ValueError, "multiple of 128"), ([128, -128], ValueError, "non-negative"),
    ([], ValueError, "at least one"), ("128", TypeError, "list, tuple"), ([128.0], TypeError, "integer"),
    (5, TypeError, "list, tuple"), ({128: 1, 0: 2}, TypeError, "list, tuple"),
])
def test_k_grouped_ks_rules(ks, exc, match):
    x = kargs((128, 128))
    with pytest.raises(exc, match=match):
        kcall(ks, **x)


def test_k_grouped_shape_rules():
    ks = [128, 0, 256]
    x = kargs(ks)
    with pytest.raises(ValueError, match="sum"):
        kcall([128, 128, 256], **x)
    x = kargs(ks)
    x["d"] = fake((2, 64, 256), np.float32)
    with pytest.raises(ValueError, match="shape"):
        kcall(ks, **x)
    x = kargs(ks)
    with pytest.raises(ValueError, match="ks_tensor"):
        kcall(ks, **x, ks_tensor=fake((2,), np.int32))
    with pytest.raises(TypeError, match="ks_tensor"):
        kcall(ks, **kargs(ks), ks_tensor=fake((3,), np.int64))


# ---------------------------------------------------------------- compile

# (n, bm, bn, stages, gemm type, groups, TMA epilogue)
COMPILE = [(2048, 128, 128, 6, 0, 1, False), (7168, 256, 128, 4, 0, 1, False), (7168, 128, 160, 6, 0, 1, False),
           (7168, 256, 112, 4, 0, 1, False), (2048, 128, 64, 8, 0, 1, False), (1000, 128, 136, 5, 0, 1, False),
           (7168, 256, 128, 4, 3, 4, False), (2048, 256, 96, 4, 3, 8, False), (1000, 128, 8, 12, 3, 3, False),
           (7168, 128, 160, 5, 0, 1, True), (2048, 128, 128, 5, 0, 1, True), (1000, 128, 96, 6, 3, 3, True),
           (7168, 256, 128, 3, 0, 1, True), (520, 128, 64, 7, 0, 1, True)]


def _bench_picks():
    """The instantiations the ops pick for benches/bench_training.py's shapes
    (wgrad of the six DeepSeek-V3 linear layers at 4096 tokens, DeepGEMM's
    k-grouped sizes), as (n, bm, bn, stages, gemm type, groups, TMA epilogue),
    in place (``c = d``) and with ``c`` another array (the register epilogue)."""
    from cugemm8._shapes import DEEPSEEK_NK
    picks = set()
    for tma in (True, False):
        for n_out, k_in in DEEPSEEK_NK[:6]:
            c = C1.select_config(n_out, k_in, 4096, with_c=True, tma_store=tma)
            picks.add((k_in, c.block_m, c.block_n, c.num_stages, 0, 1, c.tma_store))
        for g, m, n, k in ((4, 4096, 7168, 8192), (4, 7168, 2048, 8192), (8, 4096, 7168, 4096),
                           (8, 7168, 2048, 4096), (16, 4096, 7168, 2048), (16, 7168, 2048, 2048)):
            c = C1.select_config(m, n, g * k, num_groups=g, with_c=True, tma_store=tma)
            picks.add((n, c.block_m, c.block_n, c.num_stages, 3, g, c.tma_store))
    return sorted(picks)


@pytest.mark.compile
def test_kernels_compile_without_spills():
    from tests.test_kernel_compile import compile_report
    todo = sorted(set(COMPILE) | set(_bench_picks()))
    names = [f"cugemm8::fp8_gemm_1d1d_kernel<{n}, {bm}, {bn}, {s}, {t}, {g}, {str(tma).lower()}>"
             for n, bm, bn, s, t, g, tma in todo]
    for n, bm, bn, s, t, g, tma in todo:
        assert C1.is_legal(C1.make_config(bm, bn, s, 132, tma))[0], (bm, bn, s, tma)
    rep = compile_report(G1._HEADER, names)
    assert len(rep.resources) == len(names)
    for r in rep.resources.values():
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, r
    assert not rep.warnings, rep.warnings
    if rep.sass is not None:            # compile_report: SASS when ptxas and cuobjdump are found
        assert "QGMMA" in rep.sass or "HGMMA" in rep.sass
        assert not re.findall(r"\bF(?:ADD|MUL|FMA)\S*\.FTZ\b", rep.sass)
        _check_k_loop_forms(rep.sass)


_NAME_ARGS = re.compile(r"fp8_gemm_1d1d_kernelI" + r"Lj(\d+)E" * 6 + r"Lb([01])E")


def _check_k_loop_forms(sass: str) -> None:
    """The K loop's form per kernel (fp8_gemm_1d1d.cuh): BLOCK_M = 128 with
    BLOCK_N <= 128 pipelines its WGMMAs in chunks of 8, 2 and 1 K blocks
    (44 QGMMAs, 11 waits; the first ten wait with the next block's group in
    flight: ``WARPGROUP.DEPBAR.LE gsb0, 0x1``), the other tiles issue one K
    block (per sub-tile) at a time.  In every kernel ptxas waits once per
    K block's four k32 WGMMAs (a wait per WGMMA is its serialisation,
    C7514); benches/RESULTS.md v0.18 measured the pipelined form."""
    from tests.test_kernel_compile import wgmma_waits
    kernels = list(wgmma_waits(sass, _NAME_ARGS))
    assert kernels
    for name, args, qgmma, waits, overlapped in kernels:
        bm, bn = int(args.group(2)), int(args.group(3))
        pipelined = bm == 128 and bn <= C1.PIPELINE_MAX_BLOCK_N
        assert len(waits) * 4 == len(qgmma), f"{name}: {len(waits)} waits for {len(qgmma)} WGMMAs"
        assert len(qgmma) == (44 if pipelined else 4 * bm // 128), f"{name}: {len(qgmma)} WGMMAs"
        assert overlapped == pipelined, name


def test_k_bound_and_names_in_messages():
    with pytest.raises(ValueError, match="2\\^31 - 128"):
        call(**args(m=1, n=8, k=2 ** 31))
    x = args()
    x["d"] = cupy.ndarray((64, 256), np.float32, memptr=x["sfa"].data)
    with pytest.raises(ValueError, match="^d overlaps"):
        call(**x)


def test_an_exact_view_of_d_as_c_is_in_place():
    x = args()
    for view in (x["d"][...], x["d"].view(), cupy.ndarray(x["d"].shape, np.float32, memptr=x["d"].data)):
        with pytest.raises(ReachedLaunch):
            call(**x, c=view)
    ks = [128, 0, 256]
    x = kargs(ks)
    with pytest.raises(ReachedLaunch):
        kcall(ks, **x, c=x["d"][...])
