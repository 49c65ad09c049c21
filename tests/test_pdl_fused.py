"""CPU tests of programmatic dependent launch (PDL) and the fused bf16-in
path of ``gemm_fp8`` (issue 19): the opt-in switch, the packing of kernel
parameters for ``cuLaunchKernelEx``, the fused path's workspace rules and
launch order, and the griddepcontrol instructions in every kernel's PTX.

No GPU: arrays are CuPy headers over fake addresses (tests/test_validation.py
``fake``), kernels and tensor-map encoding are stubbed, and nothing is
launched.  The GPU side (bit-identical results, capture and replay) is
tests/test_pdl_fused_gpu.py.
"""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import cugemm8
from cugemm8 import _config, _launch, gemm as _gemm, quant as _quant
from tests.test_validation import Recorder, _FakeDevice, fake

BF16 = np.dtype(ml_dtypes.bfloat16)
cupy = pytest.importorskip("cupy")


@pytest.fixture(autouse=True)
def pdl_off():
    cugemm8.set_pdl(False)
    yield
    cugemm8.set_pdl(False)


# ---------------------------------------------------------------- the switch

def test_set_pdl_takes_a_bool_only():
    assert cugemm8.get_pdl() is False
    cugemm8.set_pdl(True)
    assert cugemm8.get_pdl() is True
    cugemm8.set_pdl(np.bool_(False))
    assert cugemm8.get_pdl() is False
    for bad in (1, 0, "yes", None, 1.0):
        with pytest.raises(TypeError, match="bool"):
            cugemm8.set_pdl(bad)
    assert cugemm8.get_pdl() is False


# ---------------------------------------------------------------- cuLaunchKernelEx packing

class _FakeKern:
    class kernel:
        ptr = 0x1234

    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, shared_mem=0):
        self.calls.append((grid, block, args, shared_mem))


def test_launcher_uses_cupy_without_pdl_and_packs_every_parameter_for_pdl():
    pytest.importorskip("cuda.bindings")
    tmap = np.frombuffer(bytes(range(128)), dtype=np.dtype((np.void, 128)))[0]
    arr = fake((64,), np.uint8)
    args = (np.uint32(7), np.uint32(0xFFFFFFFF), np.uint64(0xDEADBEEF00), np.int64(-5),
            np.float32(1.5), tmap, arr)
    kern = _FakeKern()
    launcher = _launch.Launcher(kern, (132,), (384,), args, 1000)
    launcher()                                    # PDL off: CuPy's launcher, arguments as given
    assert kern.calls == [((132,), (384,), args, 1000)]
    ex = _launch._ExLaunch(launcher)              # what a PDL call builds (not launched here)
    want = [a.tobytes() for a in args[:-1]] + [np.uint64(arr.data.ptr).tobytes()]
    for i, w in enumerate(want):
        addr = int(ex.ptrs[i])
        off = addr - ex.buf.ctypes.data
        assert addr % 128 == 0
        assert ex.buf[off:off + len(w)].tobytes() == w
    assert ex.params == ex.ptrs.ctypes.data
    cfg = ex._config(0)
    assert (cfg.gridDimX, cfg.blockDimX, cfg.sharedMemBytes) == (132, 384, 1000)
    assert cfg.numAttrs == 1
    d = _launch._tma._driver()
    assert cfg.attrs[0].id == d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert cfg.attrs[0].value.programmaticStreamSerializationAllowed == 1


def test_launcher_rejects_an_unknown_argument_type():
    pytest.importorskip("cuda.bindings")
    with pytest.raises(TypeError, match="unsupported kernel argument"):
        _launch._ExLaunch(_launch.Launcher(_FakeKern(), (1,), (1,), (object(),)))


# ---------------------------------------------------------------- workspace

def test_workspace_bytes_layout():
    # payload m x k_pad, then (at a 256-byte boundary) float32 [kb, m_pad]
    assert cugemm8.gemm_fp8_workspace_bytes(1, 7168) == 7168 + 56 * 4 * 4
    assert cugemm8.gemm_fp8_workspace_bytes(3, 1000) == 3072 + 8 * 4 * 4   # 3*1008 -> 3072
    assert cugemm8.gemm_fp8_workspace_bytes(0, 128) == 0
    with pytest.raises(TypeError, match="m must be an int"):
        cugemm8.gemm_fp8_workspace_bytes(1.0, 128)
    with pytest.raises(ValueError, match="k must be >= 0"):
        cugemm8.gemm_fp8_workspace_bytes(1, -1)


@pytest.fixture()
def no_launch(monkeypatch):
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    launched = []
    monkeypatch.setattr(_quant, "_launch_per_token", lambda *a, **k: launched.append("a"))
    monkeypatch.setattr(_quant, "_launch_per_block", lambda *a, **k: launched.append("b"))

    def stop(*a, **k):
        raise AssertionError("validation must fail before the configuration is chosen")
    monkeypatch.setattr(_gemm, "_select", stop)
    return launched


def _weights(n=256, k=512):
    return fake((n, k), np.uint8), fake((-(-n // 128), -(-k // 128)), np.float32)


@pytest.mark.parametrize("case", ["small", "dtype", "2d", "strided", "misaligned", "overlap_x",
                                  "overlap_out", "not_fused"])
def test_bad_workspace_is_named_before_any_launch(no_launch, case):
    m, n, k = 64, 256, 512
    x, out = fake((m, k), BF16), fake((m, n), BF16)
    need = cugemm8.gemm_fp8_workspace_bytes(m, k)
    ws = {"small": lambda: fake((need - 1,), np.uint8),
          "dtype": lambda: fake((need,), np.float32),
          "2d": lambda: fake((2, need), np.uint8),
          "strided": lambda: fake((need,), np.uint8, strides=(2,)),
          "misaligned": lambda: fake((need,), np.uint8, offset=8),
          "overlap_x": lambda: x.view(np.uint8).reshape(-1),
          "overlap_out": lambda: out.view(np.uint8).reshape(-1),
          "not_fused": lambda: fake((need,), np.uint8)}[case]()
    b = _weights(n, k) if case != "not_fused" else fake((n, k), BF16)
    err = TypeError if case == "dtype" else ValueError
    with pytest.raises(err, match="workspace"):
        cugemm8.gemm_fp8(x, b, out, workspace=ws)
    assert no_launch == []


def test_fused_path_under_capture_needs_a_workspace(no_launch, monkeypatch):
    """The two-kernel form (here: more rows than the one-kernel form takes)
    quantises into a workspace, which capture needs to be the caller's."""
    from cugemm8 import _checks
    monkeypatch.setattr(_checks, "capturing", lambda cupy: True)
    m = _config.QUANT_A_MAX_ROWS + 1
    x, out = fake((m, 512), BF16), fake((m, 256), BF16)
    with pytest.raises(ValueError, match="gemm_fp8_workspace_bytes"):
        cugemm8.gemm_fp8(x, _weights(), out)
    # with one, a K padding (k % 16 != 0) still needs a temporary: refused too
    with pytest.raises(ValueError, match="zero-pad"):
        cugemm8.gemm_fp8(fake((m, 500), BF16, strides=(1008, 2)), _weights(k=512), out,
                         workspace=fake((cugemm8.gemm_fp8_workspace_bytes(m, 500),), np.uint8))
    assert no_launch == []


# ---------------------------------------------------------------- launch order and arguments

class _ExRecorder:
    """Stands in for _launch._ExLaunch: records PDL launches."""
    log: list = []

    def __init__(self, launcher):
        self.launcher = launcher

    def __call__(self):
        _ExRecorder.log.append(("pdl", self.launcher.args))


def _stub_gemm_launches(monkeypatch):
    """Fake device, kernels and tensor maps: returns the Recorder."""
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    rec = Recorder()
    from cugemm8 import _device, _jit, _tma
    monkeypatch.setattr(_tma, "make_descriptor", rec.make_descriptor)
    monkeypatch.setattr(_jit, "get_kernel", rec.get_kernel)
    monkeypatch.setattr(_quant, "_device", _FakeDevice(_quant._device))
    monkeypatch.setattr(_device, "get_num_sms", lambda device_id=None: 132)
    return rec


@pytest.mark.parametrize("m,k", [(1, 7168), (64, 7168), (128, 1536), (5, 1000)])
def test_fused_path_quantises_into_the_workspace_then_launches_the_gemm_as_its_dependent(monkeypatch, m, k):
    n = 2112
    rec = _stub_gemm_launches(monkeypatch)
    monkeypatch.setattr(_quant, "ONE_KERNEL_MAX_M", {})          # the two-kernel form at every m
    monkeypatch.setattr(_gemm, "_select",
                        lambda kind, m_, n_, k_, g: _config.select_config(kind, m_, n_, k_, num_sms=132, warp_mma=False))
    order = []
    real_token = _quant._launch_per_token

    def token(x, a, sfa_buf, *args, **kw):
        order.append(("quant", x.shape, a.data.ptr, sfa_buf.data.ptr, sfa_buf.shape))
        launcher = real_token(x, a, sfa_buf, *args, **kw)
        return lambda: order.append(("quant launch", launcher.grid))
    monkeypatch.setattr(_quant, "_launch_per_token", token)
    _ExRecorder.log = order
    monkeypatch.setattr(_launch, "_ExLaunch", _ExRecorder)
    kp = -(-k // 16) * 16
    if kp != k:
        # the K padding copy runs on the GPU; here the input is already padded
        monkeypatch.setattr(_quant, "_pad_k", lambda name, x, cupy: fake(x.shape[:-1] + (kp,), BF16))
    x, out = fake((m, k), BF16), fake((m, n), BF16)
    ws = fake((cugemm8.gemm_fp8_workspace_bytes(m, k),), np.uint8)
    _gemm.clear_launch_cache()
    try:
        assert cugemm8.gemm_fp8(x, _weights(n, kp), out, workspace=ws) is out
        kb, m_pad = -(-kp // 128), -(-m // 4) * 4
        off = -(-(m * kp) // 256) * 256
        assert order[0] == ("quant", (m, kp), ws.data.ptr, ws.data.ptr + off, (1, kb, m_pad))
        assert order[1][0] == "quant launch"
        assert order[2][0] == "pdl"                       # the GEMM: always a programmatic dependent
        args = order[2][1]
        flags = _gemm.FLAG_B_EVICT_FIRST if _gemm.b_evict_first(m, _gemm._select("normal", m, n, kp, 1).block_m,
                                                                kp) else 0
        assert int(args[0]) == m and int(args[2]) == flags    # shape_m, flags
        a_map, sfa_map = rec.maps[0], rec.maps[2]
        assert a_map[1] == ws.data.ptr and sfa_map[1] == ws.data.ptr + off
        assert rec.launches == 0                          # nothing went through CuPy's launcher
    finally:
        _gemm.clear_launch_cache()


@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (8, 7168, 2048)])
def test_fused_path_lets_the_warp_mma_pick_read_b_before_its_wait(monkeypatch, m, n, k):
    """With the warp-MMA pick, the fused path's GEMM (a programmatic
    dependent of cugemm8's quantiser, which writes only the workspace) gets
    FLAG_B_BEFORE_WAIT; the persistent picks never do, and _prepare_launch
    refuses the flag for them (the FP8 op's own warp-MMA launch passes 0:
    test_validation.py::test_warp_mma_launch_arguments)."""
    _stub_gemm_launches(monkeypatch)
    monkeypatch.setattr(_quant, "ONE_KERNEL_MAX_M", {})
    f32 = np.dtype(np.float32)          # (16-bit x takes the warp-MMA pick's one-kernel form)
    for warp_mma in (True, False):
        monkeypatch.setattr(_gemm, "_select", lambda kind, m_, n_, k_, g, w=warp_mma: _config.select_config(
            kind, m_, n_, k_, num_sms=132, warp_mma=w))
        assert _gemm._select("normal", m, n, k, 1).warp_mma == warp_mma
        _ExRecorder.log = []
        monkeypatch.setattr(_launch, "_ExLaunch", _ExRecorder)
        x, out = fake((m, k), f32), fake((m, n), BF16)
        ws = fake((cugemm8.gemm_fp8_workspace_bytes(m, k),), np.uint8)
        _gemm.clear_launch_cache()
        try:
            cugemm8.gemm_fp8(x, _weights(n, k), out, workspace=ws)
            assert len(_ExRecorder.log) == 1                 # (the quantiser goes through CuPy's launcher)
            args = _ExRecorder.log[-1][1]
            if warp_mma:
                assert int(args[2]) == _gemm.FLAG_B_BEFORE_WAIT      # (shape_m, num_k_blocks, flags, ...)
            else:
                assert not int(args[2]) & _gemm.FLAG_B_BEFORE_WAIT
        finally:
            _gemm.clear_launch_cache()
    cfg = _config.select_config("normal", m, n, k, num_sms=132, warp_mma=False)
    with pytest.raises(ValueError, match="only the warp-MMA kernel"):
        _gemm._prepare_launch(cfg, "normal", n, k, 1, m, m, None, None, None, None, None, None, 1,
                              _gemm.FLAG_B_BEFORE_WAIT)


def test_fused_cache_key_keeps_the_pow2_scale_value(monkeypatch):
    from cugemm8 import _device
    monkeypatch.setattr(_device, "current_device_id", lambda: 0)
    monkeypatch.setattr(_device, "get_num_sms", lambda device_id=None: 132)
    x, out, ws = fake((8, 512), BF16), fake((8, 256), BF16), fake((4096,), np.uint8)
    b = _weights()
    assert _quant._fused_key(x, b, out, ws, True, _gemm) != _quant._fused_key(x, b, out, ws, 1, _gemm)
    assert _quant._fused_key(x, b, out, ws, False, _gemm) != _quant._fused_key(x, b, out, ws, 0, _gemm)
    assert _quant._fused_key(x, b, out, ws, True, _gemm) is not None


def test_fused_repeated_call_is_cached(monkeypatch):
    m, n, k = 8, 2112, 7168
    rec = _stub_gemm_launches(monkeypatch)
    monkeypatch.setattr(_quant, "ONE_KERNEL_MAX_M", {})          # the two-kernel form
    selected = []

    def select(kind, m_, n_, k_, g):
        selected.append(kind)
        return _config.select_config(kind, m_, n_, k_, num_sms=132, warp_mma=False)
    monkeypatch.setattr(_gemm, "_select", select)
    _ExRecorder.log = []
    monkeypatch.setattr(_launch, "_ExLaunch", _ExRecorder)
    x, out = fake((m, k), BF16), fake((m, n), BF16)
    b = _weights(n, k)
    ws = fake((cugemm8.gemm_fp8_workspace_bytes(m, k),), np.uint8)
    _gemm.clear_launch_cache()
    try:
        cugemm8.gemm_fp8(x, b, out, workspace=ws)
        cugemm8.gemm_fp8(x, b, out, workspace=ws)
        assert selected == ["normal"]                 # validated and configured once
        assert rec.launches == 2                      # the quantiser twice (CuPy launcher, PDL off)
        assert len(_ExRecorder.log) == 2              # the GEMM twice, as a dependent
        cugemm8.set_pdl(True)
        cugemm8.gemm_fp8(x, b, out, workspace=ws)     # now the quantiser is a dependent too
        assert rec.launches == 2 and len(_ExRecorder.log) == 4
    finally:
        _gemm.clear_launch_cache()


# ---------------------------------------------------------------- the one-kernel form

def _heuristic_select(monkeypatch):
    """``_gemm._select`` answered by the heuristic at 132 SMs without the
    warp-MMA kernel (the persistent picks, which a reduced SM budget runs and
    which have one-kernel forms; tests/test_warp_mma.py covers the warp-MMA
    picks' two-kernel path); returns the list of the calls made."""
    calls = []

    def select(kind, m_, n_, k_, g):
        calls.append((kind, m_, n_, k_))
        return _config.select_config(kind, m_, n_, k_, num_sms=132, warp_mma=False)
    monkeypatch.setattr(_gemm, "_select", select)
    return calls


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16), np.dtype(np.float32)], ids=str)
@pytest.mark.parametrize("m,n,k,pow2", [(1, 2112, 7168, False), (5, 4096, 1000, True), (8, 7168, 2048, False),
                                        (3, 32768, 512, False)])
def test_one_kernel_form_launches_the_gemm_on_x_itself(monkeypatch, dtype, m, n, k, pow2):
    """At few rows the GEMM quantises x itself: one launch, of the pick's
    quant_a twin named with x's dtype; tmap_a maps x (its own K, no swizzle,
    a box of m rows), tmap_sfa is empty, the pow2 flag is passed."""
    from cugemm8 import _jit
    monkeypatch.setattr(_quant, "ONE_KERNEL_MAX_M", {2: ((8, 8),), 4: ((8, 8),)})   # every pick, up to 8 rows
    rec = _stub_gemm_launches(monkeypatch)
    names = []
    monkeypatch.setattr(_jit, "get_kernel",
                        lambda header, name, **kw: names.append((name, kw)) or rec.get_kernel(header, name, **kw))
    _heuristic_select(monkeypatch)
    monkeypatch.setattr(_quant, "_launch_per_token", lambda *a, **kw: pytest.fail("no separate quantiser"))
    kp = -(-k // 16) * 16
    x, out = fake((m, k), dtype, strides=(kp * dtype.itemsize, dtype.itemsize)), fake((m, n), BF16)
    _gemm.clear_launch_cache()
    try:
        assert cugemm8.gemm_fp8(x, _weights(n, kp), out, pow2_scale=pow2) is out
        pick = _config.select_config("normal", m, n, kp, num_sms=132, warp_mma=False)
        cfg = _config.quant_a_config(pick, kp, dtype.itemsize)
        assert cfg is not None and rec.launches == 1
        (name, kw), = names
        assert name == _gemm._kernel_name(cfg, n, kp, 0, 1, dtype.name)
        assert kw["max_dynamic_smem"] == cfg.smem_bytes == _config.smem_size(
            64, pick.block_n, cfg.num_stages, kp, pick.num_k_splits, 1, quant_a=dtype.itemsize)
        x_map = rec.maps[0]
        tma_dtype = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}[dtype.name]
        assert x_map[:3] == (tma_dtype, x.data.ptr, (k, m, 1)) and x_map[4] == (128, m, 1)
        assert m == 1 or x_map[3][0] == x.strides[0]
        assert len(rec.maps) == 3                         # x, B, D: no SFA map
        assert int(rec.args[1]) == m                      # a_box_rows: x's box and its barrier's bytes
        flags = int(rec.args[2])
        assert bool(flags & _gemm.FLAG_A_POW2_SCALE) == pow2
        assert bool(flags & _gemm.FLAG_B_EVICT_FIRST) == _gemm.b_evict_first(m, 64, kp)
        assert rec.args[9] is _launch._tma.NULL_DESCRIPTOR  # tmap_sfa
    finally:
        _gemm.clear_launch_cache()


def test_one_kernel_form_rules(monkeypatch):
    """When the fused path takes the one-kernel form: x readable by TMA in
    place, a pick that has an in-kernel-quantising twin, and at most
    one_kernel_max_m rows for that pick's BLOCK_N (never more than the
    kernel's 8)."""
    _heuristic_select(monkeypatch)

    def one(x, n, k):
        return _quant._one_kernel_config(x, n, k, _gemm)
    # the rule, on the DeepSeek-V3 picks at M <= 8 (BLOCK_N 32, 192, 128, 56;
    # at 4096 x 7168 the swap-AB kernel's weight tile of 64, placed like 56)
    assert _quant.one_kernel_max_m(32, 2) == 0 and _quant.one_kernel_max_m(56, 2) == 4
    assert _quant.one_kernel_max_m(128, 2) == 8 and _quant.one_kernel_max_m(192, 4) == 4
    assert _quant.one_kernel_max_m(56, 4) == 2 and _quant.one_kernel_max_m(128, 1) == 0
    for (n, k), limits in {(2112, 7168): (0, 0), (4096, 7168): (4, 2), (24576, 1536): (8, 4),
                           (32768, 512): (8, 4), (7168, 2048): (4, 2), (7168, 16384): (0, 0)}.items():
        for dtype, limit in zip((BF16, np.dtype(np.float32)), limits):
            for m in range(1, 10):
                got = one(fake((m, k), dtype), n, k)
                assert (got is not None) == (m <= limit), (n, k, dtype, m, got)
    n, k = 24576, 1536
    assert one(fake((4, k), BF16, offset=8), n, k) is None                        # base not 16-byte aligned
    assert one(fake((4, k), BF16, strides=(2 * k + 2, 2)), n, k) is None          # row stride not a multiple of 16
    assert one(fake((4, k), BF16, strides=(4 * k, 4)), n, k) is None              # last dimension strided
    assert one(fake((4, k), BF16, strides=(0, 2)), n, k) is None                  # broadcast rows
    assert one(fake((4, k), BF16, strides=(-2 * k, 2), offset=6 * k), n, k) is None  # reversed rows
    assert one(fake((1, k), BF16, strides=(6, 2)), n, k) is not None              # one row: any row stride
    assert one(fake((4, 1000), BF16, strides=(2016, 2)), n, 1008) is not None     # K tail: TMA zero-fills it
    # forced everywhere: still the kernel's own limit, and no twin for two math warpgroups
    monkeypatch.setattr(_quant, "ONE_KERNEL_MAX_M", {2: ((8, 64),), 4: ((8, 64),)})
    assert one(fake((8, 7168), BF16), 2112, 7168) is not None
    assert one(fake((_config.QUANT_A_MAX_ROWS + 1, k), BF16), n, k) is None
    assert one(fake((_config.QUANT_A_MAX_ROWS + 1, k), np.float32), n, k) is None
    assert _config.select_config("normal", 1, 7168, 16384, num_sms=132).num_math_warpgroups == 2
    assert one(fake((1, 16384), BF16), 7168, 16384) is None


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16), np.dtype(np.float32)], ids=str)
@pytest.mark.parametrize("m,n,k,pow2", [(1, 2112, 7168, False), (1, 4096, 1000, True), (1, 7168, 2048, False),
                                        (8, 32768, 512, True), (2, 24576, 1536, False)])
def test_one_kernel_form_of_the_warp_mma_pick(monkeypatch, dtype, m, n, k, pow2):
    """The warp-MMA pick quantises 16-bit x itself up to one_kernel_rows:
    one launch of its own kernel named with x's dtype, on x's
    address and row stride (bytes), no scales (null, pitch 0), x's own K
    as the last argument, the pow2 flag and never FLAG_B_BEFORE_WAIT (its
    predecessor may write anything), no tensor map.  float32 x takes the
    quantiser and the GEMM (two kernels)."""
    from cugemm8 import _jit
    rec = _stub_gemm_launches(monkeypatch)
    monkeypatch.setattr(_gemm, "_select", lambda kind, m_, n_, k_, g: _config.select_config(
        kind, m_, n_, k_, num_sms=132))
    names = []
    monkeypatch.setattr(_jit, "get_kernel",
                        lambda header, name, **kw: names.append(name) or rec.get_kernel(header, name, **kw))
    kp = -(-k // 16) * 16
    cfg = _config.select_config("normal", m, n, kp, num_sms=132)
    assert cfg.warp_mma
    x, out = fake((m, k), dtype, strides=(kp * dtype.itemsize + 32, dtype.itemsize)), fake((m, n), BF16)
    w = _weights(n, kp)
    _gemm.clear_launch_cache()
    _ExRecorder.log = []
    monkeypatch.setattr(_launch, "_ExLaunch", _ExRecorder)
    try:
        if dtype.itemsize == 4:
            assert _quant._one_kernel_config(x, n, kp, _gemm) is None
            if k != kp:
                return                  # (the two-kernel form pads x with a CuPy copy first)
            monkeypatch.setattr(_quant, "_launch_per_token", lambda *a, **kw: (lambda: None))
            ws = fake((cugemm8.gemm_fp8_workspace_bytes(m, k),), np.uint8)
            cugemm8.gemm_fp8(x, w, out, pow2_scale=pow2, workspace=ws)
            assert names == [_gemm._kernel_name(cfg, n, kp, 0, 1)]          # the FP8 kernel, as PDL dependent
            assert len(_ExRecorder.log) == 1 and int(_ExRecorder.log[0][1][2]) == _gemm.FLAG_B_BEFORE_WAIT
            return
        twin = _quant._one_kernel_config(x, n, kp, _gemm)
        assert twin == _config.quant_a_config(cfg, kp, 2, num_sms=132) and twin.warp_mma
        assert twin.smem_bytes == _config.warp_mma_smem_size(8, cfg.block_n, cfg.num_k_splits, kp)
        monkeypatch.setattr(_quant, "_launch_per_token", lambda *a, **kw: pytest.fail("no separate quantiser"))
        assert cugemm8.gemm_fp8(x, w, out, pow2_scale=pow2) is out
        assert names == [_gemm._kernel_name(cfg, n, kp, 0, 1, dtype.name)]
        assert names[0].endswith(f", {_gemm.A_IN_CODES[dtype.name]}>")
        assert rec.maps == [] and rec.launches == 1 and _ExRecorder.log == []
        args = [int(v) for v in rec.args]
        row = x.strides[0] if m > 1 else kp * dtype.itemsize
        flags = _gemm.FLAG_A_POW2_SCALE if pow2 else 0
        assert args == [m, -(-kp // 128), flags, x.data.ptr, row, 0, 0, w[0].data.ptr, kp, w[1].data.ptr,
                        out.data.ptr, n, k]
        grid, block, smem = rec.launch
        assert grid == (cfg.num_sms,) and block == (_config.warp_mma_threads(cfg.block_n, cfg.num_k_splits),)
        assert smem == twin.smem_bytes
    finally:
        _gemm.clear_launch_cache()


def test_warp_mma_one_kernel_form_rules(monkeypatch):
    """Where the warp-MMA pick's one-kernel form does not apply: float32 x,
    a reduced SM budget (the persistent pick), x rows 4 GiB apart (the
    kernel's 32-bit stride), x not readable in place; and _prepare_launch
    refuses float32 x and FLAG_B_BEFORE_WAIT for the warp-MMA kernel's x
    form."""
    _stub_gemm_launches(monkeypatch)
    monkeypatch.setattr(_gemm, "_select", lambda kind, m_, n_, k_, g: _config.select_config(
        kind, m_, n_, k_, num_sms=132))
    n, k = 2112, 7168

    def one(x):
        return _quant._one_kernel_config(x, n, k, _gemm)
    assert one(fake((1, k), BF16)).warp_mma and one(fake((2, k), BF16)) is None
    assert one(fake((1, k), np.float32)) is None
    assert one(fake((1, k), BF16, strides=(2 ** 32, 2))).warp_mma                 # one row: its stride is unused
    assert one(fake((1, k), BF16, offset=8)) is None
    # the rows: at most 7 groups for the busiest warp with one slab per CTA
    # (WARP_MMA_ONE_KERNEL_MAX_GROUPS), 8 where the CTA's warps share them
    # (WARP_MMA_ONE_KERNEL_MAX_GROUPS_SHARED: 32768x512 and 24576x1536)
    want = {(2112, 7168): 1, (4096, 7168): 1, (7168, 2048): 1, (32768, 512): 8, (24576, 1536): 2}
    for (n_, k_), rows in want.items():
        twin = _config.quant_a_config(_config.select_config("normal", 1, n_, k_, num_sms=132), k_, 2, num_sms=132)
        assert _quant.one_kernel_rows(twin, 2, k_) == rows, (n_, k_)
        for m in range(1, 9):
            got = _quant._one_kernel_config(fake((m, k_), BF16), n_, k_, _gemm)
            assert (got is not None) == (m <= rows), (n_, k_, m)
    per_warp = _config.select_config("normal", 1, 2112, 7168, num_sms=132)       # one slab: its own 4 K blocks
    assert _config.warp_mma_quant_groups_per_warp(per_warp, 2, 7168) == 8
    shared = _config.select_config("normal", 1, 24576, 1536, num_sms=132)        # 4 slabs share 12 blocks
    # 36 groups handed out two at a time to 4 warps: warp 0 gets 4 pairs and 2 more
    assert _config.warp_mma_quant_groups_per_warp(shared, 3, 1536) == 10
    assert [_config.warp_mma_quant_groups_per_warp(shared, m, 512) for m in (1, 2, 5, 7)] == [2, 2, 6, 8]
    # a full round of 8 groups only where the CTA's warps share them
    assert _config.warp_mma_one_kernel_max_groups(per_warp) == 7
    assert _config.warp_mma_one_kernel_max_groups(shared) == 8
    # the kernel's 16-byte loads must not pass a row's end: rows of whole 16-byte pieces only
    assert _quant._one_kernel_config(fake((1, 1001), BF16), 2112, 1008, _gemm) is None
    assert _quant._one_kernel_config(fake((1, 1000), BF16), 2112, 1008, _gemm).warp_mma
    # weights whose rows are 4 GiB apart (legal for the TMA kernels): two kernels, not an error
    far = fake((n, k), np.uint8, strides=(2 ** 32, 1))
    assert _quant._one_kernel_config(fake((1, k), BF16), n, k, _gemm, far) is None
    assert _quant._one_kernel_config(fake((1, k), BF16), n, k, _gemm, fake((n, k), np.uint8)).warp_mma
    cfg = _config.select_config("normal", 1, n, k, num_sms=132)
    with pytest.raises(ValueError, match="16-bit activations only"):
        _gemm._kernel_name(cfg, n, k, 0, 1, "float32")
    with pytest.raises(ValueError, match="needs smem_bytes"):             # the FP8 config, not its twin
        _gemm._prepare_launch(cfg, "normal", n, k, 1, 4, 4, fake((4, k), BF16), None, fake((n, k), np.uint8),
                              None, fake((4, n), BF16), None, 1, 0, x_dtype="bfloat16")
    cfg = _config.quant_a_config(cfg, k, 2, num_sms=132)
    with pytest.raises(ValueError, match="whole 16-byte pieces"):           # a forced launch on a [1, 1001] x
        kp = 1008
        _gemm._prepare_launch(_config.quant_a_config(_config.select_config("normal", 1, n, kp, num_sms=132), kp, 2,
                                                     num_sms=132), "normal", n, kp, 1, 1, 1, fake((1, 1001), BF16),
                              None, fake((n, kp), np.uint8), None, fake((1, n), BF16), None, 1, 0, x_dtype="bfloat16")
    with pytest.raises(ValueError, match="takes no kernel flags but"):
        _gemm._prepare_launch(cfg, "normal", n, k, 1, 4, 4, fake((4, k), BF16), None, fake((n, k), np.uint8),
                              None, fake((4, n), BF16), None, 1, _gemm.FLAG_B_BEFORE_WAIT, x_dtype="bfloat16")
    # a reduced SM budget: the persistent pick at BLOCK_N 32 has no one-kernel form
    monkeypatch.setattr(_gemm, "_select", lambda kind, m_, n_, k_, g: _config.select_config(
        kind, m_, n_, k_, num_sms=132, warp_mma=False))
    assert one(fake((4, k), BF16)) is None


def test_quant_a_config():
    """The in-kernel-quantising twin keeps the tile, grid, split K and
    warpgroups (so the accumulation order, hence the bits); its stages (an
    8-row payload and an 8-row x slot instead of a 64-row A) are the most
    that fit, at most 16; it does not exist for BLOCK_M 128 / 256, two math
    warpgroups or multicast."""
    k = 7168
    for n, itemsize in ((2112, 2), (24576, 2), (32768, 4), (7168, 4)):
        kn = 2048 if n == 7168 else (1536 if n == 24576 else (512 if n == 32768 else k))
        pick = _config.select_config("normal", 8, n, kn, num_sms=132, warp_mma=False)
        twin = _config.quant_a_config(pick, kn, itemsize)
        assert (twin.block_m, twin.block_n, twin.num_k_splits, twin.num_sms, twin.num_math_warpgroups) == \
            (pick.block_m, pick.block_n, pick.num_k_splits, pick.num_sms, 1)
        assert twin.num_stages >= pick.num_stages
        assert twin.smem_bytes == _config.smem_size(64, pick.block_n, twin.num_stages, kn, pick.num_k_splits, 1,
                                                    quant_a=itemsize) <= _config.SMEM_LIMIT
        assert twin.num_stages == _config.MAX_STAGES or _config.smem_size(
            64, pick.block_n, twin.num_stages + 1, kn, pick.num_k_splits, 1, quant_a=itemsize) > _config.SMEM_LIMIT
    # the per-stage bytes: an 8-row payload, B, A's scales and 8 rows of x
    one = _config.smem_size(64, 32, 1, k, 1, 1, quant_a=2) - _config.smem_size(64, 32, 0, k, 1, 1, quant_a=2)
    assert one == 1024 + 32 * 128 + 256 + 2048
    assert _config.smem_size(64, 32, 0, k, 1, 1, quant_a=4) == _config.smem_size(64, 32, 0, k, 1, 1) + 128
    wide = _config.make_config("normal", 64, 192, 6, 1536, num_math_warpgroups=1, num_sms=128)
    limit = _config.smem_size(64, 192, 5, 1536, 1, 1, quant_a=2)
    assert _config.quant_a_config(wide, 1536, 2, smem_limit=limit).num_stages == 5
    for cfg in (_config.make_config("normal", 128, 64, 6, k, num_sms=112),
                _config.make_config("normal", 64, 64, 10, k, num_sms=112),
                _config.make_config("normal", 64, 64, 10, k, num_sms=112, num_multicast=2, num_math_warpgroups=1),
                _config.make_config("masked", 64, 64, 10, k, num_sms=112, num_math_warpgroups=1)):
        assert _config.quant_a_config(cfg, k, 2) is None, cfg


def test_swap_ab_quantises_x_only_with_a_token_tile_of_8():
    """A swap-AB config launched on float activations (only through its
    quant_a_config twin, token tile 8) is refused with a ValueError before
    any compile or descriptor, e.g. a tuned 16-token tile; quant_a_config
    gives such a pick no one-kernel form, so gemm_fp8 takes two kernels."""
    k = 7168
    cfg = _config.make_config("normal", 16, 64, 16, k, num_k_splits=2, num_sms=128, swap_ab=True)
    assert _config.quant_a_config(cfg, k, 2) is None
    with pytest.raises(ValueError, match="token tile of 8"):
        _gemm._prepare_launch(cfg, "normal", 4096, k, 1, 4, 4, None, None, None, None, None, None, 1,
                              x_dtype="bfloat16")
    with pytest.raises(ValueError, match="normal GEMM only"):
        _gemm._prepare_launch(_config.quant_a_config(dataclasses.replace(cfg, block_m=8), k, 2), "masked",
                              4096, k, 2, 4, 4, None, None, None, None, None, None, 2)


def test_one_kernel_form_captures_without_a_workspace_and_is_cached(monkeypatch):
    from cugemm8 import _checks
    rec = _stub_gemm_launches(monkeypatch)
    calls = _heuristic_select(monkeypatch)
    monkeypatch.setattr(_checks, "capturing", lambda cupy: True)
    m, n, k = 8, 24576, 1536
    x, out = fake((m, k), BF16), fake((m, n), BF16)
    b = _weights(n, k)
    _gemm.clear_launch_cache()
    try:
        cugemm8.gemm_fp8(x, b, out)                        # no temporary: no refusal under capture
        cugemm8.gemm_fp8(x, b, out)
        assert rec.launches == 2 and len(calls) == 1       # validated and configured once
        # a workspace changes nothing but the cache key
        cugemm8.gemm_fp8(x, b, out, workspace=fake((cugemm8.gemm_fp8_workspace_bytes(m, k),), np.uint8))
        assert rec.launches == 3 and len(calls) == 2
    finally:
        _gemm.clear_launch_cache()


# ---------------------------------------------------------------- the instructions

@pytest.mark.compile
def test_every_kernel_waits_before_it_lets_dependents_launch():
    from cugemm8 import _jit
    names = _quant.all_kernel_names()
    rep = _jit.compile_only("quant.cuh", names, sass=False)
    cfg = _config.select_config("normal", 8, 2112, 7168, num_sms=132, warp_mma=False)
    rep_g = _jit.compile_only("fp8_gemm_1d2d.cuh", [_gemm._kernel_name(cfg, 2112, 7168, 0, 1)], sass=False)
    wm = _config.select_config("normal", 8, 2112, 7168, num_sms=132)
    assert wm.warp_mma
    rep_w = _jit.compile_only("fp8_gemm_warp_mma.cuh", [_gemm._kernel_name(wm, 2112, 7168, 0, 1)], sass=False)
    for ptx, count in ((rep.ptx, len(names)), (rep_g.ptx, 1), (rep_w.ptx, 1)):
        for entry in ptx.split(".entry")[1:]:
            wait, trigger = entry.find("griddepcontrol.wait"), entry.find("griddepcontrol.launch_dependents")
            assert 0 <= wait < trigger, "griddepcontrol.wait must precede launch_dependents"
        assert ptx.count(".entry") == count
