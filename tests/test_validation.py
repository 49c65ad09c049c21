"""Every rejection path of the public GEMM ops, on the CPU.

CuPy arrays are built over fake (never dereferenced) device addresses, so
the validation, which only reads shapes, strides, dtypes, devices and
addresses, runs without a GPU.  The config selection is replaced by a stub
that raises ``ReachedLaunch``: a valid call gets that far, which proves it was
not rejected, and nothing ever reaches a GPU (also on machines that have one).
"""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

import cugemm8
import cugemm8.gemm

BASE = 1 << 32            # fake, 2^20-aligned device addresses
_next = [BASE]
BF16 = np.dtype(ml_dtypes.bfloat16)


def fake(shape, dtype, *, strides=None, offset=0, device_id=0):
    """A CuPy array header over fake device memory (nothing is allocated)."""
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    if strides is None:
        strides, acc = [], dtype.itemsize
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= max(n, 1)
    span = sum((n - 1) * abs(s) for n, s in zip(shape, strides) if n) + dtype.itemsize + offset + 64
    base = _next[0]
    _next[0] += ((span >> 20) + 2) << 20
    mem = cupy.cuda.memory.UnownedMemory(base, span, None, device_id=device_id)
    return cupy.ndarray(shape, dtype, memptr=cupy.cuda.MemoryPointer(mem, offset), strides=tuple(strides))


class ReachedLaunch(Exception):
    """Raised in place of the config selection: validation accepted the call."""


@pytest.fixture(autouse=True)
def no_device(monkeypatch):
    # The arrays point at fake addresses: nothing may ever reach a GPU, also
    # on a machine that has one.  Validation ends where the config is chosen.
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)

    def stop(*args, **kwargs):
        raise ReachedLaunch()
    monkeypatch.setattr(cugemm8.gemm, "_select", stop)


def normal_args(m=64, n=256, k=512):
    kb, nb = -(-k // 128), -(-n // 128)
    return dict(a=fake((m, k), np.uint8), sfa=fake((m, kb), np.float32),
                b=fake((n, k), np.uint8), sfb=fake((nb, kb), np.float32), out=fake((m, n), BF16))


def call_normal(a, sfa, b, sfb, out):
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)


def expect_valid(fn, *args, **kw):
    with pytest.raises(ReachedLaunch):
        fn(*args, **kw)


# ---------------------------------------------------------------- normal GEMM

def test_valid_normal_call_reaches_the_launch():
    expect_valid(call_normal, **normal_args())


@pytest.mark.parametrize("m,n,k", [(1, 8, 16), (133, 7168, 7232), (4096, 576, 7168), (7, 24, 1040)])
def test_valid_awkward_shapes(m, n, k):
    expect_valid(call_normal, **normal_args(m, n, k))


def test_m_zero_returns_without_launching():
    call_normal(**normal_args(m=0))      # returns before choosing a config


def test_padded_row_strides_and_token_major_sfa_are_accepted():
    args = normal_args(64, 256, 512)
    args["a"] = fake((64, 512), np.uint8, strides=(512 + 16, 1))
    args["b"] = fake((256, 512), np.uint8, strides=(512 + 32, 1))
    args["sfa"] = fake((64, 4), np.float32, strides=(4, 4 * 64))
    args["out"] = fake((64, 256), BF16, strides=(2 * (256 + 8), 2))
    expect_valid(call_normal, **args)


def test_float8_view_is_accepted():
    args = normal_args()
    args["a"] = args["a"].view(ml_dtypes.float8_e4m3fn)
    expect_valid(call_normal, **args)


BAD_NORMAL = [
    # (description, mutation, exception, message fragment)
    ("lhs not a pair", lambda d: d.update(lhs_override=(d["a"],)), TypeError, "pair"),
    ("host a", lambda d: d.update(a=np.zeros((64, 512), np.uint8)), TypeError, "NumPy"),
    ("list a", lambda d: d.update(a=[[0]]), TypeError, "cupy.ndarray"),
    ("fp16 a", lambda d: d.update(a=fake((64, 256), np.float16)), TypeError, "uint8"),
    ("3-D a", lambda d: d.update(a=fake((1, 64, 512), np.uint8)), ValueError, "2-D"),
    ("column-major a", lambda d: d.update(a=fake((64, 512), np.uint8, strides=(1, 64))), ValueError, "K-major"),
    ("row stride 8", lambda d: d.update(a=fake((64, 512), np.uint8, strides=(520, 1))), ValueError, "multiple of 16"),
    ("misaligned a", lambda d: d.update(a=fake((64, 512), np.uint8, offset=1)), ValueError, "16-byte aligned"),
    ("k mismatch", lambda d: d.update(b=fake((256, 384), np.uint8)), ValueError, "k differs"),
    ("k % 16", lambda d: d.update(a=fake((64, 520), np.uint8, strides=(528, 1)),
                                  b=fake((256, 520), np.uint8, strides=(528, 1))), ValueError, "multiple of 16"),
    ("n % 8", lambda d: d.update(b=fake((252, 512), np.uint8)), ValueError, "multiple of 8"),
    ("sfa f16", lambda d: d.update(sfa=fake((64, 4), np.float16)), TypeError, "float32"),
    ("sfa shape", lambda d: d.update(sfa=fake((64, 5), np.float32)), ValueError, "sfa"),
    ("sfa transposed shape", lambda d: d.update(sfa=fake((4, 64), np.float32)), ValueError, "sfa"),
    ("sfb shape", lambda d: d.update(sfb=fake((4, 2), np.float32)), ValueError, "sfb"),
    ("sfb f64", lambda d: d.update(sfb=fake((2, 4), np.float64)), TypeError, "float32"),
    ("out f32", lambda d: d.update(out=fake((64, 256), np.float32)), TypeError, "bfloat16"),
    ("out shape", lambda d: d.update(out=fake((64, 128), BF16)), ValueError, "out"),
    ("out column-major", lambda d: d.update(out=fake((64, 256), BF16, strides=(2, 128))), ValueError, "contiguous last"),
    ("out misaligned", lambda d: d.update(out=fake((64, 256), BF16, offset=2)), ValueError, "16-byte aligned"),
    ("out row stride", lambda d: d.update(out=fake((64, 256), BF16, strides=(2 * 260, 2))), ValueError, "multiple of 16"),
    ("out row stride 2^33", lambda d: d.update(out=fake((64, 256), BF16, strides=(2 ** 33, 2))), ValueError, "2\\^33"),
    ("wrong device", lambda d: d.update(b=fake((256, 512), np.uint8, device_id=1)), ValueError, "device"),
    ("broadcast rows", lambda d: d.update(a=fake((64, 512), np.uint8, strides=(0, 1))), ValueError, "positive multiple"),
    ("reversed rows", lambda d: d.update(a=fake((64, 512), np.uint8, strides=(-512, 1), offset=63 * 512)),
     ValueError, "positive multiple"),
    ("stride 2^40", lambda d: d.update(b=fake((2, 512), np.uint8, strides=(2 ** 40, 1)),
                                       sfb=fake((1, 4), np.float32), out=fake((64, 2), BF16)), ValueError, "2\\^40"),
    ("out broadcast", lambda d: d.update(out=fake((64, 256), BF16, strides=(0, 2))), ValueError, "positive multiple"),
    ("int8 a", lambda d: d.update(a=fake((64, 512), np.int8)), TypeError, "uint8"),
    ("float8_e5m2 a", lambda d: d.update(a=fake((64, 512), np.uint8).view(ml_dtypes.float8_e5m2)), TypeError, "e4m3fn"),
]


@pytest.mark.parametrize("desc,mutate,exc,frag", BAD_NORMAL, ids=[c[0] for c in BAD_NORMAL])
def test_normal_rejections(desc, mutate, exc, frag):
    d = normal_args()
    mutate(d)
    lhs = d.pop("lhs_override", None) or (d["a"], d["sfa"])
    with pytest.raises(exc, match=frag):
        cugemm8.gemm_fp8_fp8_bf16_nt(lhs, (d["b"], d["sfb"]), d["out"])


def test_out_aliasing_an_input_is_rejected():
    a = fake((64, 512), np.uint8)
    # out shares a's memory
    out = cupy.ndarray((64, 256), BF16, memptr=a.data)
    with pytest.raises(ValueError, match="overlaps a"):
        call_normal(a, fake((64, 4), np.float32), fake((256, 512), np.uint8), fake((2, 4), np.float32), out)


# ---------------------------------------------------------------- grouped GEMMs

def contiguous_args(m=256, g=3, n=256, k=512):
    kb, nb = -(-k // 128), -(-n // 128)
    return dict(a=fake((m, k), np.uint8), sfa=fake((m, kb), np.float32), b=fake((g, n, k), np.uint8),
                sfb=fake((g, nb, kb), np.float32), out=fake((m, n), BF16), m_indices=fake((m,), np.int32))


def call_contiguous(a, sfa, b, sfb, out, m_indices):
    cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (b, sfb), out, m_indices)


def test_valid_contiguous():
    expect_valid(call_contiguous, **contiguous_args())


BAD_CONTIGUOUS = [
    ("b 2-D", lambda d: d.update(b=fake((256, 512), np.uint8)), ValueError, "3-D"),
    ("sfb 2-D", lambda d: d.update(sfb=fake((2, 4), np.float32)), ValueError, "sfb"),
    ("m_indices int64", lambda d: d.update(m_indices=fake((256,), np.int64)), TypeError, "int32"),
    ("m_indices short", lambda d: d.update(m_indices=fake((128,), np.int32)), ValueError, "m_indices"),
    ("m_indices strided", lambda d: d.update(m_indices=fake((256,), np.int32, strides=(8,))), ValueError, "contiguous"),
    ("m_indices host", lambda d: d.update(m_indices=np.zeros(256, np.int32)), TypeError, "NumPy"),
    ("zero experts", lambda d: d.update(b=fake((0, 256, 512), np.uint8), sfb=fake((0, 2, 4), np.float32)),
     ValueError, "at least one expert"),
]


@pytest.mark.parametrize("desc,mutate,exc,frag", BAD_CONTIGUOUS, ids=[c[0] for c in BAD_CONTIGUOUS])
def test_contiguous_rejections(desc, mutate, exc, frag):
    d = contiguous_args()
    mutate(d)
    with pytest.raises(exc, match=frag):
        call_contiguous(**d)


def masked_args(g=4, m_max=200, n=256, k=512):
    kb, nb = -(-k // 128), -(-n // 128)
    return dict(a=fake((g, m_max, k), np.uint8), sfa=fake((g, m_max, kb), np.float32),
                b=fake((g, n, k), np.uint8), sfb=fake((g, nb, kb), np.float32),
                out=fake((g, m_max, n), BF16), masked_m=fake((g,), np.int32), expected_m=64)


def call_masked(a, sfa, b, sfb, out, masked_m, expected_m):
    cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sfa), (b, sfb), out, masked_m, expected_m)


def test_valid_masked():
    expect_valid(call_masked, **masked_args())


BAD_MASKED = [
    ("group mismatch", lambda d: d.update(b=fake((3, 256, 512), np.uint8)), ValueError, "groups"),
    ("expected_m float", lambda d: d.update(expected_m=64.0), TypeError, "expected_m"),
    ("expected_m zero", lambda d: d.update(expected_m=0), ValueError, "expected_m"),
    ("expected_m device array", lambda d: d.update(expected_m=fake((1,), np.int32)), TypeError, "expected_m"),
    ("masked_m shape", lambda d: d.update(masked_m=fake((3,), np.int32)), ValueError, "masked_m"),
    ("masked_m uint32", lambda d: d.update(masked_m=fake((4,), np.uint32)), TypeError, "int32"),
    ("out group stride", lambda d: d.update(out=fake((4, 200, 256), BF16, strides=(2 * 256 * 208, 512, 2))),
     ValueError, "group stride"),
    ("sfa 2-D", lambda d: d.update(sfa=fake((200, 4), np.float32)), ValueError, "sfa"),
]


@pytest.mark.parametrize("desc,mutate,exc,frag", BAD_MASKED, ids=[c[0] for c in BAD_MASKED])
def test_masked_rejections(desc, mutate, exc, frag):
    d = masked_args()
    mutate(d)
    with pytest.raises(exc, match=frag):
        call_masked(**d)


def test_set_num_sms_type_is_checked_before_the_device():
    with pytest.raises(TypeError, match="num_sms"):
        cugemm8.set_num_sms(1.5)
    with pytest.raises(TypeError, match="num_sms"):
        cugemm8.set_num_sms(True)
    with pytest.raises(TypeError, match="device_id"):
        cugemm8.set_num_sms(8, device_id="x")
    for bad in (0, -1):             # a ValueError on any machine, GPU or not
        with pytest.raises(ValueError, match=">= 1"):
            cugemm8.set_num_sms(bad)


def test_k_not_a_multiple_of_16_is_named_before_the_strides():
    # k = 24: the packed row stride (24 B) also breaks the TMA stride rule,
    # but the message must name k, which no copy can fix.
    d = normal_args(m=64, n=256, k=24)
    with pytest.raises(ValueError, match="k = 24; k must be a multiple of 16"):
        call_normal(**d)


def test_k_beyond_the_limit_is_a_value_error_before_the_device():
    from cugemm8 import _config
    k = (_config.max_k() // 16 + 1) * 16
    with pytest.raises(ValueError, match=f"k = {k} exceeds"):
        call_normal(**normal_args(m=64, n=256, k=k))


def test_gemm_fp8_checks_the_gemm_rules_before_quantising(monkeypatch):
    from cugemm8 import quant
    launched = []
    monkeypatch.setattr(quant, "_launch_per_token", lambda *a, **k: launched.append("a"))
    monkeypatch.setattr(quant, "_launch_per_block", lambda *a, **k: launched.append("b"))
    a, b = fake((64, 512), BF16), fake((256, 256), BF16)
    with pytest.raises(ValueError, match="k differs"):
        cugemm8.gemm_fp8(a, b)
    # two float operands must have the same k (padding is for float vs quantised pairs)
    with pytest.raises(ValueError, match="k differs"):
        cugemm8.gemm_fp8(fake((64, 1000), BF16), fake((256, 1008), BF16))
    with pytest.raises(ValueError, match="k differs"):
        cugemm8.gemm_fp8(fake((64, 1001), BF16), fake((256, 1000), BF16))
    # an out whose rows overlap is rejected also when n % 8 != 0 (written by a copy)
    with pytest.raises(ValueError, match="overlap"):
        cugemm8.gemm_fp8(a, fake((12, 512), BF16), out=fake((64, 12), BF16, strides=(0, 2)))
    # a quantised b keeps the GEMM's n % 8 rule (float weights are padded instead)
    with pytest.raises(ValueError, match="multiple of 8"):
        cugemm8.gemm_fp8(a, (fake((12, 512), np.uint8), fake((1, 4), np.float32)))
    # a quantised a keeps the k % 16 rule
    with pytest.raises(ValueError, match="multiple of 16"):
        cugemm8.gemm_fp8((fake((64, 520), np.uint8, strides=(528, 1)), fake((64, 5), np.float32)), b)
    b = fake((256, 512), BF16)
    with pytest.raises(TypeError, match="bfloat16"):
        cugemm8.gemm_fp8(a, b, out=fake((64, 256), np.float32))
    with pytest.raises(ValueError, match="out"):
        cugemm8.gemm_fp8(a, b, out=fake((64, 128), BF16))
    with pytest.raises(TypeError, match="NumPy"):
        cugemm8.gemm_fp8(a, b, out=np.zeros((64, 256), BF16))
    with pytest.raises(ValueError, match="2-D"):
        cugemm8.gemm_fp8(fake((2, 64, 512), BF16), b)
    # a quantised pair with a bad payload or scale: rejected before `a` is cast
    with pytest.raises(TypeError, match="b payload"):
        cugemm8.gemm_fp8(a, (fake((256, 512), np.int8), fake((2, 4), np.float32)))
    with pytest.raises(ValueError, match="sfb"):
        cugemm8.gemm_fp8(a, (fake((256, 512), np.uint8), fake((2, 5), np.float32)))
    with pytest.raises(ValueError, match="sfa"):
        cugemm8.gemm_fp8((fake((64, 512), np.uint8), fake((64, 3), np.float32)), b)
    assert launched == []


# ---------------------------------------------------------------- launch arguments

class Recorder:
    """Stands in for the compiled kernel and the tensor-map encoder."""

    def __init__(self):
        self.maps, self.args, self.launches = [], None, 0

    def make_descriptor(self, dtype, address, dims, strides, box, **kw):
        self.maps.append((dtype, address, tuple(dims), tuple(strides), tuple(box)))
        return np.zeros((), np.dtype((np.void, 128)))

    def get_kernel(self, header, name, **kw):
        self.kernel = (header, name)

        def kernel(grid, block, args, shared_mem=0):
            self.args, self.launch = args, (grid, block, shared_mem)
            self.launches += 1
        return kernel


@pytest.fixture()
def recorder(monkeypatch):
    """The persistent kernels' launches (the heuristic at 132 SMs without the
    warp-MMA kernel: test_warp_mma_launch_arguments has its own)."""
    from cugemm8 import _config, _device, _jit, _tma
    rec = Recorder()
    monkeypatch.setattr(_tma, "make_descriptor", rec.make_descriptor)
    monkeypatch.setattr(_jit, "get_kernel", rec.get_kernel)
    monkeypatch.setattr(cugemm8.gemm, "_select",
                        lambda kind, m, n, k, g: _config.select_config(kind, m, n, k, num_groups=g, num_sms=132,
                                                                       warp_mma=False))
    monkeypatch.setattr(_device, "get_num_sms", lambda device_id=None: 132)
    cugemm8.gemm.clear_launch_cache()
    yield rec
    cugemm8.gemm.clear_launch_cache()     # stub launchers must not outlive the stubs


def mn_major_sfa(shape):
    """A fake SFA in the kernel's MN-major, TMA-aligned layout (no conversion)."""
    *g, m, kb = shape
    m_pad = -(-m // 4) * 4
    buf = fake(tuple(g) + (kb, m_pad), np.float32)
    view = buf[..., :m]
    return view.transpose(0, 2, 1) if g else view.T


def test_masked_single_row_groups_use_the_group_stride(recorder):
    """m_max == 1 with a sliced out: the row-by-row store path must step by
    out's real group stride (a reviewer found it stepping by one packed row)."""
    d = masked_args(g=4, m_max=1)
    d["sfa"] = mn_major_sfa((4, 1, 4))
    big = fake((4, 64, 256), BF16)
    d["out"] = big[:, :1, :]
    call_masked(**d)
    ld_d = int(recorder.args[6])     # (shape_m, a_box_rows, flags, sfb, layout, d_ptr, ld_d, maps...)
    assert ld_d * 2 == d["out"].strides[0]
    d_map = recorder.maps[-1]
    assert d_map[0] == "bf16" and d_map[3] == (d["out"].strides[0], d["out"].strides[0])


def test_sfa_broadcast_over_groups_is_copied_not_misread(recorder):
    d = masked_args(g=4, m_max=200)
    s = fake((1, 4, 200), np.float32).transpose(0, 2, 1)         # MN-major [1, 200, 4]
    d["sfa"] = cupy.lib.stride_tricks.as_strided(s, (4, 200, 4), (0,) + s.strides[1:])
    from cugemm8.layout import is_tma_aligned_mn_major
    assert not is_tma_aligned_mn_major(d["sfa"])


def test_out_overlapping_itself_is_rejected():
    d = masked_args(g=4, m_max=200)
    d["out"] = fake((4, 200, 256), BF16, strides=(200 * 16, 16, 2))
    with pytest.raises(ValueError, match="overlap|group stride"):
        call_masked(**d)
    a = normal_args()
    a["out"] = fake((64, 256), BF16, strides=(16, 2))
    with pytest.raises(ValueError, match="overlap"):
        call_normal(**a)


def test_normal_descriptors_keep_strides_legal(recorder):
    """A legal, huge out row stride must not produce an illegal synthetic
    group stride for the (extent-1) group dimension."""
    a = normal_args(512, 256, 512)
    a["sfa"] = mn_major_sfa((512, 4))
    a["out"] = fake((512, 256), BF16, strides=(2 ** 32, 2))     # 512 rows: 2^41 B in all
    call_normal(**a)
    for dtype, _, dims, strides, _ in recorder.maps:
        assert all(0 < s < 2 ** 40 and s % 16 == 0 for s in strides), (dtype, strides)


@pytest.mark.parametrize("bad", [[1.7], ["5"], [True, 2]])
def test_contiguous_layout_sizes_must_be_ints(bad):
    with pytest.raises(TypeError, match="ints"):
        cugemm8.make_contiguous_layout(bad)


@pytest.mark.parametrize("bad", [5, None, "12", {0: 100, 1: 200}, {100, 200}])
def test_contiguous_layout_sizes_must_be_a_sequence(bad):
    with pytest.raises(TypeError, match="sequence of ints"):
        cugemm8.make_contiguous_layout(bad)


@pytest.mark.parametrize("sizes", [[2 ** 31], [2 ** 40], [2 ** 30, 2 ** 30]])
def test_contiguous_layout_total_fits_int32_rows(sizes):
    # Rejected from the sizes alone, before any host array is built.
    with pytest.raises(ValueError, match="2\\^31 - 1 rows"):
        cugemm8.make_contiguous_layout(sizes)


@pytest.mark.parametrize("alignment", [64, 100, 0, -128])
def test_contiguous_layout_alignment_rule(alignment):
    with pytest.raises(ValueError, match="multiple of 128"):
        cugemm8.make_contiguous_layout([3, 5], alignment=alignment)


# ---------------------------------------------------------------- repeated calls

def test_repeated_call_reuses_the_launcher(recorder, monkeypatch):
    """An identical second call launches without validating or encoding again."""
    a = normal_args(64, 256, 512)
    a["sfa"] = mn_major_sfa((64, 4))
    call_normal(**a)
    maps = len(recorder.maps)
    calls = []
    monkeypatch.setattr(cugemm8.gemm, "_unpack", lambda *x: calls.append(x))
    call_normal(**a)
    assert recorder.launches == 2 and len(recorder.maps) == maps and calls == []


def test_changed_arguments_are_validated_again(recorder):
    """Same addresses, different shape or strides: the slow path runs and rejects."""
    a = normal_args(64, 256, 512)
    a["sfa"] = mn_major_sfa((64, 4))
    call_normal(**a)
    bad = dict(a, out=a["out"][:, :128])          # same address, wrong shape
    with pytest.raises(ValueError, match="out must have shape"):
        call_normal(**bad)
    bad = dict(a, b=a["b"][:, :256])              # same address, k differs from a
    with pytest.raises(ValueError, match="k differs"):
        call_normal(**bad)
    assert recorder.launches == 1


def test_launch_cache_key_covers_device_sms_and_extras(monkeypatch):
    from cugemm8 import _device, gemm
    a = normal_args(64, 256, 512)
    lhs, rhs = (a["a"], a["sfa"]), (a["b"], a["sfb"])
    monkeypatch.setattr(_device, "get_num_sms", lambda device_id=None: 132)
    k1 = gemm._fast_key("normal", lhs, rhs, a["out"])
    monkeypatch.setattr(_device, "get_num_sms", lambda device_id=None: 100)
    assert gemm._fast_key("normal", lhs, rhs, a["out"]) != k1
    assert gemm._fast_key("masked", lhs, rhs, a["out"], a["sfb"], 5) != \
        gemm._fast_key("masked", lhs, rhs, a["out"], a["sfb"], 6)
    assert gemm._fast_key("normal", "junk", rhs, a["out"]) is None


def test_calls_with_converted_scales_are_not_cached():
    from cugemm8 import gemm
    gemm.clear_launch_cache()
    gemm._remember(("k",), lambda: None, converted=True)
    assert ("k",) not in gemm._fast
    gemm._remember(("k",), lambda: None, converted=False)
    assert ("k",) in gemm._fast
    gemm.clear_launch_cache()
    assert not gemm._fast


def test_cached_call_still_rejects_an_array_on_another_device(recorder):
    a = normal_args(64, 256, 512)
    a["sfa"] = mn_major_sfa((64, 4))
    call_normal(**a)
    b = a["b"]
    mem = cupy.cuda.memory.UnownedMemory(b.data.ptr, b.nbytes, None, device_id=1)
    a["b"] = cupy.ndarray(b.shape, b.dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))
    with pytest.raises(ValueError, match="device"):
        call_normal(**a)
    assert recorder.launches == 1


def test_cached_call_still_rejects_a_non_pair_operand(recorder):
    a = normal_args(64, 256, 512)
    a["sfa"] = mn_major_sfa((64, 4))
    call_normal(**a)
    with pytest.raises(TypeError, match="pair"):
        cugemm8.gemm_fp8_fp8_bf16_nt(iter((a["a"], a["sfa"])), (a["b"], a["sfb"]), a["out"])
    assert recorder.launches == 1


def test_misaligned_int32_layouts_are_rejected():
    d = masked_args()
    d["masked_m"] = fake((64,), np.uint8)[2:2 + 4 * 4].view(np.int32)
    with pytest.raises(ValueError, match="masked_m base address .* 4-byte aligned"):
        call_masked(**d)


def test_masked_single_row_huge_group_stride_is_rejected():
    d = masked_args(g=2, m_max=1)
    d["out"] = fake((2, 1, 256), BF16, strides=(2 ** 33, 512, 2))
    with pytest.raises(ValueError, match="group stride"):
        call_masked(**d)


def test_sfa_with_a_huge_stride_is_not_taken_as_tma_ready():
    from cugemm8.layout import is_tma_aligned_mn_major
    sfa = fake((2, 64, 4), np.float32, strides=(2 ** 40, 4, 256))
    assert not is_tma_aligned_mn_major(sfa)


def test_forced_config_restores_the_heuristic_and_empties_the_cache():
    from cugemm8 import gemm
    heuristic = gemm._select
    gemm._fast[("stale",)] = lambda: None
    with pytest.raises(KeyError):
        with gemm._forced_config("forced"):
            assert gemm._select("normal", 1, 8, 16, 1) == "forced" and not gemm._fast
            gemm._fast[("inside",)] = lambda: None
            raise KeyError
    assert gemm._select is heuristic and not gemm._fast


# ---------------------------------------------------------------- A box rows (decode)

@pytest.mark.parametrize("m", [1, 7, 63, 64, 65, 4096])
def test_a_box_covers_only_the_rows_that_exist(recorder, m):
    """A normal GEMM with fewer rows than one tile loads an A box of m rows
    (and an SFA box of m rounded up to 4), never zero-filled rows past m; the
    kernel gets the same count to expect per stage."""
    from cugemm8 import _config
    d = normal_args(m=m, n=2112, k=7168)
    d["sfa"] = mn_major_sfa((m, 56))
    call_normal(**d)
    want = min(m, _config.select_config("normal", m, 2112, 7168, num_sms=132, warp_mma=False).block_m)
    a_map, sfa_map = recorder.maps[0], recorder.maps[2]
    assert a_map[0] == "u8" and a_map[4] == (128, want, 1)
    assert sfa_map[0] == "f32" and sfa_map[4] == (-(-want // 4) * 4, 1, 1)
    assert int(recorder.args[1]) == want


@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (5, 4096, 1040), (8, 32768, 512), (3, 8448, 112)])
def test_warp_mma_launch_arguments(recorder, monkeypatch, m, n, k):
    """The warp-MMA pick launches its own kernel with raw addresses and
    strides (no tensor map): rows, K blocks, A and its row stride, SFA and
    its K-block pitch, B and its row stride, SFB, D and its row stride, K; one
    CTA per block_n rows, 32 * splits * slabs threads, the reduction's
    shared memory."""
    from cugemm8 import _config, gemm
    monkeypatch.setattr(gemm, "_select", lambda kind, m_, n_, k_, g: _config.select_config(
        kind, m_, n_, k_, num_groups=g, num_sms=132))
    cfg = _config.select_config("normal", m, n, k, num_sms=132)
    assert cfg.warp_mma
    kb = -(-k // 128)
    d = normal_args(m=m, n=n, k=k)
    d["a"] = fake((m, k), np.uint8, strides=(k + 32, 1)) if m > 1 else d["a"]
    d["sfa"] = mn_major_sfa((m, kb))
    d["out"] = fake((m, n), BF16, strides=(2 * (n + 8), 2)) if m > 1 else d["out"]
    call_normal(**d)
    assert recorder.maps == [] and recorder.kernel[0] == "fp8_gemm_warp_mma.cuh"
    # (args[2], the kernel flags, is 0: only gemm_fp8's fused path sets kFlagBBeforeWait)
    args = [int(v) for v in recorder.args]
    a_row = k + 32 if m > 1 else k
    pitch = -(-m // 4) * 4           # mn_major_sfa's pitch, and _scale_pitch's value for one K block
    assert args == [m, kb, 0, d["a"].data.ptr, a_row, d["sfa"].data.ptr, pitch, d["b"].data.ptr, k,
                    d["sfb"].data.ptr, d["out"].data.ptr, n + 8 if m > 1 else n, k]      # (K_x: K)
    grid, block, smem = recorder.launch
    assert grid == (cfg.num_sms,) and cfg.num_sms == -(-n // cfg.block_n)
    assert block == (32 * cfg.num_k_splits * cfg.block_n // 16,) and smem == cfg.smem_bytes


def test_warp_mma_falls_back_for_strides_of_4_gib_and_checks_its_grid(recorder, monkeypatch):
    """Row strides the warp-MMA kernel's 32-bit arguments cannot hold (legal
    for the TMA kernels, up to 2^40 bytes) take the persistent pick, never a
    wrapped stride; a warp-MMA config whose grid does not cover n is
    refused before launch (a stale tuned entry, a config forced for another
    n)."""
    from cugemm8 import _config, _device, gemm
    monkeypatch.setattr(gemm, "_select", lambda kind, m_, n_, k_, g: _config.select_config(
        kind, m_, n_, k_, num_groups=g, num_sms=132))
    monkeypatch.setattr(_device, "current_device_id", lambda: 0)
    m, n, k = 2, 2112, 7168
    assert _config.select_config("normal", m, n, k, num_sms=132).warp_mma
    d = normal_args(m=m, n=n, k=k)
    d["a"] = fake((m, k), np.uint8, strides=(2 ** 32 + 16, 1))
    d["sfa"] = mn_major_sfa((m, 56))
    call_normal(**d)
    assert recorder.kernel[0] == "fp8_gemm_1d2d.cuh" and len(recorder.maps) == 4
    cfg = _config.select_config("normal", m, n, k, num_sms=132)
    bad = dataclasses.replace(cfg, num_sms=cfg.num_sms - 1)
    d = normal_args(m=m, n=n, k=k)
    with pytest.raises(ValueError, match="one CTA per"):
        gemm._prepare_launch(bad, "normal", n, k, 1, m, m, d["a"], mn_major_sfa((m, 56)), d["b"], d["sfb"],
                             d["out"], None, 1)


def test_masked_a_box_stays_inside_one_group(recorder):
    d = masked_args(g=4, m_max=8)
    d["sfa"] = mn_major_sfa((4, 8, 4))
    call_masked(**d)
    a_map = recorder.maps[0]
    assert a_map[2][1:] == (8, 4) and a_map[4] == (128, 8, 1)     # rows = m_max per group, box <= rows


# ---------------------------------------------------------------- CUDA-graph capture

@pytest.fixture
def under_capture(monkeypatch):
    from cugemm8 import _checks
    monkeypatch.setattr(_checks, "capturing", lambda cupy: True)


def test_capture_refuses_an_sfa_conversion(recorder, under_capture):
    d = normal_args(m=64, n=256, k=512)            # sfa row-major: needs a temporary
    with pytest.raises(ValueError, match="get_col_major_tma_aligned_tensor"):
        call_normal(**d)
    assert recorder.launches == 0


def test_capture_refuses_an_sfb_copy(recorder, under_capture):
    d = normal_args(m=64, n=256, k=512)
    d["sfa"] = mn_major_sfa((64, 4))
    d["sfb"] = fake((2, 4), np.float32, strides=(4, 8))          # Fortran order
    with pytest.raises(ValueError, match="ascontiguousarray"):
        call_normal(**d)
    assert recorder.launches == 0


def test_capture_accepts_the_kernels_own_layouts(recorder, under_capture):
    d = normal_args(m=64, n=256, k=512)
    d["sfa"] = mn_major_sfa((64, 4))
    call_normal(**d)
    assert recorder.launches == 1


def test_capture_refuses_grouped_conversions(recorder, under_capture):
    d = masked_args(g=4, m_max=200)                 # row-major 3-D sfa
    with pytest.raises(ValueError, match="capture"):
        call_masked(**d)
    d = contiguous_args()
    with pytest.raises(ValueError, match="capture"):
        call_contiguous(**d)
    assert recorder.launches == 0


def test_capture_refuses_gemm_fp8_on_float_inputs(under_capture, monkeypatch):
    from cugemm8 import quant
    launched = []
    monkeypatch.setattr(quant, "_launch_per_token", lambda *a, **k: launched.append("a"))
    monkeypatch.setattr(quant, "_launch_per_block", lambda *a, **k: launched.append("b"))
    with pytest.raises(ValueError, match="per_token_cast_to_fp8"):
        cugemm8.gemm_fp8(fake((64, 512), BF16), fake((256, 512), BF16))
    assert launched == []


def test_capture_refuses_quantiser_temporaries(under_capture, monkeypatch):
    from cugemm8 import quant
    launched = []
    monkeypatch.setattr(quant, "_launch_per_token", lambda *a, **k: launched.append("a"))
    monkeypatch.setattr(quant, "_device", _FakeDevice(quant._device))
    with pytest.raises(ValueError, match="zero-pad"):            # k % 16 != 0
        cugemm8.per_token_cast_to_fp8(fake((64, 500), BF16, strides=(1008, 2)))
    with pytest.raises(ValueError, match="copy"):                # rows not 16-byte aligned
        cugemm8.per_token_cast_to_fp8(fake((64, 512), BF16, strides=(1026, 2)))
    assert launched == []


class _FakeDevice:
    """cugemm8._device with the device queries answered without a GPU."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    @staticmethod
    def require_hopper(device_id=None):
        return 0

    @staticmethod
    def device_info(device_id=None):
        return {"num_sms": 132}


# ---------------------------------------------------------------- degenerate sizes

def test_n_zero_is_a_no_op(recorder):
    d = normal_args(m=64, n=0, k=512)
    call_normal(**d)
    assert recorder.launches == 0


def test_masked_with_no_groups_or_rows_is_a_no_op(recorder):
    for g, m_max in ((0, 64), (4, 0)):
        call_masked(**masked_args(g=g, m_max=m_max))
    assert recorder.launches == 0


def test_k_zero_passes_validation_for_every_op():
    # (the zero fill itself is a device write: tests/test_gemm_gpu.py)
    from cugemm8 import _config
    _config.check_n_k(256, 0, allow_empty=True)
    _config.check_n_k(0, 512, allow_empty=True)
    with pytest.raises(ValueError, match="k = 0"):
        _config.check_n_k(256, 0)
    with pytest.raises(ValueError, match="k = 8"):
        _config.check_n_k(256, 8, allow_empty=True)
