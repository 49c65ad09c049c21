"""CPU tests of the public API's surface: type hints on every public function
(and the ``py.typed`` marker), :func:`cugemm8.get_gemm_config` without a GPU,
the one contiguous-layout convention shared by
:func:`cugemm8.make_contiguous_layout` and
:func:`cugemm8.reference.make_m_indices`, and the ``cugemm8.reference``
package's names and imports."""
from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import inspect
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import cugemm8
from cugemm8 import _config, _device
from cugemm8 import reference as R

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------
# Type hints
# ----------------------------------------------------------------------------

def _public_functions():
    """(qualified name, function) for every public function: cugemm8.__all__,
    the public functions of cugemm8.reference and of cugemm8.interop."""
    out = []
    for name in cugemm8.__all__:
        obj = getattr(cugemm8, name)
        if inspect.isfunction(obj):
            out.append((f"cugemm8.{name}", obj))
    for name, obj in vars(R).items():
        if not name.startswith("_") and inspect.isfunction(obj):
            out.append((f"cugemm8.reference.{name}", obj))
    for name, obj in vars(cugemm8.interop).items():
        if (not name.startswith("_") and inspect.isfunction(obj)
                and obj.__module__ == "cugemm8.interop"):
            out.append((f"cugemm8.interop.{name}", obj))
    return out


PUBLIC = _public_functions()


def test_the_public_functions_are_found():
    names = {q for q, _ in PUBLIC}
    assert len(PUBLIC) >= 40
    for q in ("cugemm8.gemm_fp8_fp8_bf16_nt", "cugemm8.get_gemm_config", "cugemm8.make_contiguous_layout",
              "cugemm8.reference.make_m_indices", "cugemm8.reference.error_bound",
              "cugemm8.interop.to_cupy", "cugemm8.interop.per_token_cast_to_fp8_jax"):
        assert q in names


def _type_checking_imports(module) -> set[str]:
    """Names bound by the ``if TYPE_CHECKING:`` imports of ``module``'s source."""
    tree = ast.parse(inspect.getsource(module))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in ast.walk(node):
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
    return names


@pytest.mark.parametrize("qualname,func", PUBLIC, ids=[q for q, _ in PUBLIC])
def test_public_function_is_fully_annotated(qualname, func):
    sig = inspect.signature(func)
    missing = [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
    assert not missing, f"{qualname}: parameters without a type hint: {missing}"
    assert sig.return_annotation is not inspect.Signature.empty, f"{qualname}: no return type hint"
    # Postponed (from __future__ import annotations): strings, never
    # evaluated at run time, so cupy / jax / numpy.typing cost nothing.
    annotations = [p.annotation for p in sig.parameters.values()] + [sig.return_annotation]
    assert all(isinstance(a, str) for a in annotations), f"{qualname}: evaluated annotations"
    # Every name an annotation uses exists for a type checker: in the
    # module's globals, the builtins, or its `if TYPE_CHECKING:` imports.
    module = sys.modules[func.__module__]
    known = set(vars(module)) | set(vars(builtins)) | _type_checking_imports(module)
    for text in annotations:
        used = {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}
        assert used <= known, f"{qualname}: annotation {text!r} uses unknown names {used - known}"


def test_py_typed_marker():
    assert (ROOT / "cugemm8" / "py.typed").is_file()


def _pyproject():
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_wheel_contains_the_reference_package_and_py_typed():
    setuptools_cfg = _pyproject().get("tool", {}).get("setuptools", {})
    packages = setuptools_cfg.get("packages", [])
    if isinstance(packages, list):            # an explicit list: every subpackage must be in it
        subpackages = sorted("cugemm8." + p.parent.relative_to(ROOT / "cugemm8").as_posix().replace("/", ".")
                             for p in (ROOT / "cugemm8").glob("*/**/__init__.py"))
        assert not set(subpackages) - set(packages), f"missing from packages: {subpackages}"
    assert "py.typed" in setuptools_cfg.get("package-data", {}).get("cugemm8", [])


# ----------------------------------------------------------------------------
# get_gemm_config on a CPU
# ----------------------------------------------------------------------------

@pytest.fixture
def no_device(monkeypatch):
    """Make every device lookup fail as on a machine without a GPU, and count
    the attempts."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise _device.DeviceError("no CUDA device visible (test)")

    monkeypatch.setattr(_device, "get_num_sms", refuse)
    monkeypatch.setattr(_device, "current_device_id", refuse)
    monkeypatch.setattr(_device, "import_cupy", refuse)
    return calls


@pytest.mark.parametrize("kind,g,m,n,k", _config.BENCHMARK_CASES[::3])
@pytest.mark.parametrize("num_sms", [132, 78])
def test_get_gemm_config_with_num_sms_needs_no_gpu(no_device, kind, g, m, n, k, num_sms):
    cfg = cugemm8.get_gemm_config(kind, m, n, k, g, num_sms=num_sms)
    assert cfg == _config.select_config(kind, m, n, k, num_groups=g, num_sms=num_sms)
    # (the warp-MMA kernel's num_sms counts its CTAs, several per SM)
    assert isinstance(cfg, cugemm8.GemmConfig) and (cfg.num_sms <= num_sms or cfg.warp_mma)
    assert cugemm8.get_gemm_config(kind, m, n, k, g, num_sms) == cfg     # positional too
    assert not no_device


def test_gemm_config_is_a_public_frozen_dataclass():
    cfg = cugemm8.get_gemm_config("normal", 64, 2112, 7168, num_sms=132)
    assert cugemm8.GemmConfig is _config.GemmConfig and dataclasses.is_dataclass(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_sms = 1
    doc = inspect.getdoc(cugemm8.GemmConfig)
    for field in dataclasses.fields(cugemm8.GemmConfig):
        assert f"{field.name}:" in doc, f"GemmConfig's docstring does not describe {field.name}"
    assert hash(cfg) == hash(dataclasses.replace(cfg))


def test_get_gemm_config_without_num_sms_uses_the_device(monkeypatch):
    monkeypatch.setattr(_device, "require_hopper", lambda device_id=None: 0)
    monkeypatch.setattr(_device, "get_num_sms", lambda device_id=None: 78)
    assert cugemm8.get_gemm_config("normal", 4096, 7168, 2048) == \
        _config.select_config("normal", 4096, 7168, 2048, num_sms=78)
    assert cugemm8.get_gemm_config("normal", 1, 2112, 7168).warp_mma          # a 78-SM device
    # a set_num_sms budget below the device's SM count keeps the persistent kernels
    monkeypatch.setattr(_device, "_device_info", lambda device_id: {"num_sms": 132})
    monkeypatch.setitem(_device._num_sms_override, 0, 78)
    assert cugemm8.get_gemm_config("normal", 1, 2112, 7168) == \
        _config.select_config("normal", 1, 2112, 7168, num_sms=78, warp_mma=False)


def test_get_gemm_config_without_num_sms_or_gpu_raises_device_error(no_device):
    with pytest.raises(cugemm8.DeviceError):
        cugemm8.get_gemm_config("normal", 64, 2112, 7168)
    assert len(no_device) == 1


BAD_ARGS = [
    (("dense", 64, 128, 128), {}, ValueError, "kind"),
    (("normal", -1, 128, 128), {}, ValueError, r"\bm\b"),
    (("normal", 64, 12, 128), {}, ValueError, r"\bn\b"),
    (("normal", 64, 128, 0), {}, ValueError, r"\bk\b"),
    (("normal", 64, 128, 382464 + 16), {}, ValueError, r"\bk\b"),
    (("masked", 64, 128, 128), {"num_groups": 0}, ValueError, "num_groups"),
    (("normal", 64, 128, 128), {"num_groups": 2}, ValueError, "num_groups"),
    (("normal", 64.0, 128, 128), {}, TypeError, r"\bm\b"),
    (("normal", 64, 128, 128), {"num_groups": True}, TypeError, "num_groups"),
]


@pytest.mark.parametrize("args,kwargs,exc,match", BAD_ARGS)
@pytest.mark.parametrize("num_sms", [None, 132])
def test_get_gemm_config_errors_match_select_config(no_device, args, kwargs, exc, match, num_sms):
    """The heuristic's own errors, whether or not ``num_sms`` is given, and
    never a DeviceError for a bad argument."""
    with pytest.raises(exc, match=match) as want:
        _config.select_config(*args, **kwargs, num_sms=132)
    with pytest.raises(exc, match=match) as got:
        cugemm8.get_gemm_config(*args, **kwargs, num_sms=num_sms)
    assert str(got.value) == str(want.value)
    assert not no_device


@pytest.mark.parametrize("num_sms,exc", [(0, ValueError), (-4, ValueError), (True, TypeError),
                                         (132.0, TypeError), ("132", TypeError)])
def test_get_gemm_config_checks_num_sms(no_device, num_sms, exc):
    with pytest.raises(exc, match="num_sms"):
        cugemm8.get_gemm_config("normal", 64, 2112, 7168, num_sms=num_sms)


# ----------------------------------------------------------------------------
# The contiguous layout: one helper, one convention
# ----------------------------------------------------------------------------

@pytest.fixture
def host_cupy(monkeypatch):
    """A stand-in device: ``import_cupy`` returns a namespace whose asarray
    copies to a NumPy array (recording the call), and the device lookup
    succeeds."""
    copies = []

    def asarray(x):
        copies.append(x)
        return np.array(x, copy=True)

    monkeypatch.setattr(_device, "import_cupy", lambda: types.SimpleNamespace(asarray=asarray))
    monkeypatch.setattr(_device, "current_device_id", lambda: 0)
    return copies


LAYOUTS = [[], [0], [0, 0], [1], [128], [129], [3, 0, 130], [100, 60], [5, 0, 130, 1],
           list(range(0, 900, 97)), np.array([7, 300, 0, 256], dtype=np.int32), range(4)]


@pytest.mark.parametrize("sizes", LAYOUTS, ids=str)
@pytest.mark.parametrize("alignment", [128, 256])
def test_make_contiguous_layout_is_make_m_indices_on_the_device(host_cupy, sizes, alignment):
    mi, off = cugemm8.make_contiguous_layout(sizes, alignment=alignment)
    ref_mi, ref_off = R.make_m_indices(sizes, alignment=alignment)
    assert len(host_cupy) == 1 and host_cupy[0].dtype == np.int32      # only m_indices goes to the GPU
    assert mi.dtype == ref_mi.dtype == np.int32
    np.testing.assert_array_equal(mi, ref_mi)
    assert isinstance(off, np.ndarray) and off.dtype == ref_off.dtype == np.int64
    g = len(list(sizes))
    assert off.shape == ref_off.shape == (g + 1,)
    np.testing.assert_array_equal(off, ref_off)
    # The convention: expert e owns rows off[e]:off[e+1], its tokens first.
    assert off[0] == 0 and off[-1] == mi.size and np.all(off % alignment == 0)
    for e, s in enumerate(list(sizes)):
        assert np.all(mi[off[e]:off[e] + s] == e) and np.all(mi[off[e] + s:off[e + 1]] == -1)


def test_contiguous_layout_default_alignment_is_the_kernels():
    assert cugemm8.get_m_alignment_for_contiguous_layout() == R.BLOCK_K == 128
    assert inspect.signature(cugemm8.make_contiguous_layout).parameters["alignment"].default == 128
    assert inspect.signature(R.make_m_indices).parameters["alignment"].default == 128


@pytest.mark.parametrize("bad,exc,match", [
    ([1.7], TypeError, "ints"), (["5"], TypeError, "ints"), ([True, 2], TypeError, "ints"),
    (5, TypeError, "sequence of ints"), ({0: 100}, TypeError, "sequence of ints"),
    ({1, 2}, TypeError, "sequence of ints"), ("12", TypeError, "sequence of ints"),
    ([-1], ValueError, "non-negative"), ([2 ** 31], ValueError, "2\\^31 - 1 rows"),
])
def test_both_helpers_reject_the_same_sizes_before_any_device_work(no_device, bad, exc, match):
    with pytest.raises(exc, match=match):
        R.make_m_indices(bad)
    with pytest.raises(exc, match=match):
        cugemm8.make_contiguous_layout(bad)
    assert not no_device


@pytest.mark.parametrize("alignment", [64, 100, 0, -128, 128.0, True])
def test_device_layout_alignment_is_a_multiple_of_128(no_device, alignment):
    with pytest.raises(ValueError, match="alignment"):
        cugemm8.make_contiguous_layout([3, 5], alignment=alignment)
    assert not no_device


def test_host_layout_takes_any_positive_alignment():
    mi, off = R.make_m_indices([5, 4], alignment=4)
    assert mi.tolist() == [0, 0, 0, 0, 0, -1, -1, -1, 1, 1, 1, 1] and off.tolist() == [0, 8, 12]


def test_make_contiguous_layout_without_gpu_raises_device_error(no_device):
    with pytest.raises(cugemm8.DeviceError):
        cugemm8.make_contiguous_layout([3, 5])


# ----------------------------------------------------------------------------
# The cugemm8.reference package
# ----------------------------------------------------------------------------

#: Every top-level function and public constant of the single-module
#: cugemm8/reference.py before it became a package: all still importable as
#: cugemm8.reference.<name>.
SINGLE_MODULE_NAMES = (
    "E4M3_MAX", "BLOCK_K", "MMA_K", "TENSOR_CORE_MANTISSA_BITS", "MIN_AMAX_FLOOR",
    "_ceil_div", "_as_bits", "_to_float32", "_as_scales", "_round_to_bits", "_e4m3_exponent",
    "_check_pair_lhs", "_check_pair_rhs", "_check_gemm_2d", "e4m3_to_float", "float_to_e4m3",
    "check_quant_options", "_scale_from_amax", "_ceil_pow2", "per_token_cast_to_fp8",
    "per_block_cast_to_fp8", "dequantize_lhs", "dequantize_rhs", "ref_gemm_nt",
    "ref_gemm_contiguous", "masked_valid_rows", "ref_gemm_masked", "_hopper_k32_step",
    "tensor_core_partial_sums", "_fp32_scale_products", "promoted_accumulation_model",
    "_fma_f32", "unpromoted_accumulation_model", "error_bound", "round_to_bf16", "calc_diff",
    "bf16_ulp_error", "max_rel_error_rows", "block_varied_normal", "make_m_indices",
)


def test_reference_keeps_the_single_module_names():
    missing = [n for n in SINGLE_MODULE_NAMES if not hasattr(R, n)]
    assert not missing
    assert R.__all__ == [
        "E4M3_MAX", "BLOCK_K", "MMA_K", "TENSOR_CORE_MANTISSA_BITS", "e4m3_to_float",
        "float_to_e4m3", "per_token_cast_to_fp8", "per_block_cast_to_fp8", "dequantize_lhs",
        "dequantize_rhs", "ref_gemm_nt", "ref_gemm_contiguous", "ref_gemm_masked",
        "masked_valid_rows", "tensor_core_partial_sums", "promoted_accumulation_model",
        "unpromoted_accumulation_model", "error_bound", "round_to_bf16", "calc_diff",
        "bf16_ulp_error", "max_rel_error_rows", "block_varied_normal", "make_m_indices",
        # the backward (training) half, issue 21: cugemm8/reference/training.py
        "per_token_cast_to_fp8_t", "cast_transpose_block_fp8", "ref_gemm_1d1d", "ref_k_grouped_gemm",
        "promoted_accumulation_model_1d1d", "error_bound_1d1d", "ref_linear_backward"]
    assert (R.E4M3_MAX, R.BLOCK_K, R.MMA_K, R.TENSOR_CORE_MANTISSA_BITS) == (448.0, 128, 32, 13)
    # Each name is the submodule's object, not a copy.
    from cugemm8.reference import bound, gemm, promotion, quant
    assert R.error_bound is bound.error_bound and R.ref_gemm_nt is gemm.ref_gemm_nt
    assert R.per_token_cast_to_fp8 is quant.per_token_cast_to_fp8
    assert R._fma_f32 is promotion._fma_f32
    # The GPU quantisers validate their options with the reference's function.
    assert cugemm8.quant.check_quant_options is R.check_quant_options


REFERENCE_FILES = sorted((ROOT / "cugemm8" / "reference").glob("*.py"))
ALLOWED_IMPORTS = {"__future__", "math", "numbers", "typing", "collections", "numpy", "ml_dtypes"}


@pytest.mark.parametrize("path", REFERENCE_FILES, ids=lambda p: p.name)
def test_reference_imports_only_numpy_and_ml_dtypes(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:                  # relative: inside the package
                assert node.level == 1, f"{path.name} imports from outside cugemm8.reference"
                continue
            roots = {node.module.split(".")[0]}
        else:
            continue
        assert roots <= ALLOWED_IMPORTS, f"{path.name} imports {roots - ALLOWED_IMPORTS}"


def test_reference_imports_without_cupy():
    # `import cupy` fails in the child (as without CuPy), and is never attempted.
    code = ("import sys\nsys.modules['cupy'] = None\n"
            "import cugemm8.reference as R\n"
            "a, s = R.per_token_cast_to_fp8([[1.0, 2.0]])\n"
            "assert R.ref_gemm_nt(a, s, a, s).shape == (1, 1)\n"
            "mods = [m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupy_backends', 'jax')]\n"
            "assert sys.modules['cupy'] is None and mods == ['cupy'], mods\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_reference_submodules_import_on_their_own():
    for name in ("quant", "gemm", "layout", "promotion", "bound", "metrics", "data"):
        mod = importlib.import_module(f"cugemm8.reference.{name}")
        assert mod.__doc__ and all(hasattr(mod, n) for n in mod.__all__)
        assert set(mod.__all__) - {"check_quant_options", "MIN_AMAX_FLOOR"} <= set(R.__all__)
