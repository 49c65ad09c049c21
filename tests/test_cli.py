"""CPU tests of the ``cugemm8`` command line and of its data / reference
helpers (which benches/bench_gemm.py shares), plus the benchmark's report
path re-rendered from a saved JSON (no GPU)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cugemm8 import cli, reference
from tests.conftest import gpu_skip_reason

REPO = Path(__file__).resolve().parent.parent


def _run(*args, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "cugemm8", *args], capture_output=True,
                          text=True, env=env, timeout=300, cwd=str(REPO))


# ----------------------------------------------------------------------------
# The command line without a GPU
# ----------------------------------------------------------------------------

@pytest.mark.skipif(gpu_skip_reason() is None, reason="a Hopper GPU is usable here")
def test_check_without_gpu_exits_2_with_one_line():
    for args in ((), ("check",), ("--quick",)):
        res = _run(*args)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        lines = res.stdout.splitlines()
        assert len(lines) == 1, res.stdout
        assert lines[0].startswith("cugemm8: no usable Hopper GPU: ")
        assert len(lines[0]) > len("cugemm8: no usable Hopper GPU: ")


def test_info_works_and_names_what_is_missing():
    res = _run("info")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for key in ("cugemm8", "python", "cupy", "CUDA runtime", "NVRTC", "kernel cache",
                "compile sm_90a", "run kernels"):
        assert any(line.startswith(key) for line in out.splitlines()), (key, out)
    run_line = next(line for line in out.splitlines() if line.startswith("run kernels"))
    if gpu_skip_reason() is not None:
        assert "no: " in run_line and len(run_line.split("no: ", 1)[1]) > 3, run_line
    else:
        assert run_line.split()[-1] == "yes"


def test_info_reports_cache_dir(tmp_path):
    (tmp_path / "x.cubin").write_bytes(b"0" * 2048)
    res = _run("info", env_extra={"CUPY_CACHE_DIR": str(tmp_path)})
    assert res.returncode == 0
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("kernel cache"))
    assert str(tmp_path) in line and "CUPY_CACHE_DIR" in line and "1 files" in line


@pytest.mark.parametrize("argv", [["--help"], ["check", "--help"], ["info", "--help"],
                                  ["warmup", "--help"], ["configs", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: cugemm8" in out


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("cugemm8 ")


def test_import_is_cheap():
    code = "import sys, cugemm8.cli; print('cupy' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.stdout.strip() == "False", res.stderr


# ----------------------------------------------------------------------------
# warmup
# ----------------------------------------------------------------------------

def _shapes_file(tmp_path, shapes):
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps(shapes))
    return str(path)


def test_load_shapes_validates(tmp_path):
    good = _shapes_file(tmp_path, [{"kind": "masked", "m": 256, "n": 7168, "k": 2048, "num_groups": 4},
                                   {"m": 64, "n": 2112, "k": 7168}])
    assert cli.load_shapes(good) == [cli.Shape("masked", 256, 7168, 2048, 4),
                                     cli.Shape("normal", 64, 2112, 7168, 1)]
    # m = 0 is a legal GEMM (nothing launches), so warmup accepts it too
    assert cli.load_shapes(_shapes_file(tmp_path, [{"m": 0, "n": 8, "k": 16}]))[0].m == 0
    for bad in ({"kind": "dense", "m": 1, "n": 8, "k": 16}, {"m": 1, "n": 8},
                {"m": -1, "n": 8, "k": 16}, {"m": 1, "n": 7, "k": 16}, {"m": 1, "n": 8, "k": 100},
                {"m": 1, "n": 8, "k": 16, "num_groups": 0},
                {"m": 1, "n": 8, "k": 16, "extra": 1}, [1, 2]):
        with pytest.raises(ValueError):
            cli.load_shapes(_shapes_file(tmp_path, [bad]))
    with pytest.raises(ValueError):
        cli.load_shapes(str(tmp_path / "missing.json"))


def test_plan_warmup_dedupes_kernels():
    shapes = [cli.Shape("normal", m, 7168, 2048) for m in (4096, 4000)]
    jobs, errors = cli.plan_warmup(shapes, 132)
    assert not errors and len(jobs) == 1 and len(jobs[0].shapes) == 2
    jobs, errors = cli.plan_warmup([cli.Shape("normal", 64, 7168, 2047)], 132)
    assert isinstance(jobs, list)


def test_plan_warmup_adds_the_one_kernel_forms():
    """A normal shape with few rows also needs the kernels that quantise
    float activations themselves (gemm_fp8's one-kernel form), where the
    library would take that form: by x's dtype and the pick's BLOCK_N.
    (24576 x 3072: B of 75 MB, past the warp-MMA rule's 48 MiB.)"""
    from cugemm8 import _config, gemm, quant
    jobs, errors = cli.plan_warmup([cli.Shape("normal", 4, 24576, 3072)], 132)
    pick = _config.select_config("normal", 4, 24576, 3072, num_sms=132)
    names = {j.name for j in jobs}
    assert not errors and gemm._kernel_name(pick, 24576, 3072, 0, 1) in names
    for dtype, item in (("bfloat16", 2), ("float16", 2), ("float32", 4)):
        twin = _config.quant_a_config(pick, 3072, item, num_sms=132)
        assert gemm._kernel_name(twin, 24576, 3072, 0, 1, dtype) in names
        assert 4 <= quant.one_kernel_max_m(twin.block_n, item)
    assert len(jobs) == 4 and all(j.header is None for j in jobs)
    # narrow picks (BLOCK_N 32) and more rows: the FP8 kernel alone
    for shape in (cli.Shape("normal", 16, 2112, 7168), cli.Shape("normal", 64, 24576, 1536)):
        jobs, errors = cli.plan_warmup([shape], 132)
        pick = _config.select_config("normal", shape.m, shape.n, shape.k, num_sms=132)
        assert not errors and [j.name for j in jobs] == [gemm._kernel_name(pick, shape.n, shape.k, 0, 1)]
    # a warp-MMA pick with its one-kernel forms for 16-bit x at one row
    # (float32 x: the quantiser and the GEMM), and the persistent pick a
    # reduced SM budget runs instead (no one-kernel form at BLOCK_N 32)
    jobs, errors = cli.plan_warmup([cli.Shape("normal", 1, 2112, 7168)], 132)
    picks = [_config.select_config("normal", 1, 2112, 7168, num_sms=132, warp_mma=w) for w in (True, False)]
    assert picks[0].warp_mma and not picks[1].warp_mma
    want = [gemm._kernel_name(picks[0], 2112, 7168, 0, 1)]
    want += [gemm._kernel_name(picks[0], 2112, 7168, 0, 1, dt) for dt in ("bfloat16", "float16")]
    want += [gemm._kernel_name(picks[1], 2112, 7168, 0, 1)]
    assert not errors and [j.name for j in jobs] == want
    assert want[1].endswith(", 3>") and want[2].endswith(", 2>")
    # at 4 rows the warp-MMA pick's form would give a warp 16 groups: none
    jobs, errors = cli.plan_warmup([cli.Shape("normal", 4, 2112, 7168)], 132)
    assert not errors and len(jobs) == 2


def test_warmup_bad_file_exits_2(tmp_path, capsys):
    assert cli.main(["warmup", "--shapes", str(tmp_path / "nope.json"), "--compile-only"]) == 2


@pytest.mark.compile
def test_warmup_compile_only_one_shape(tmp_path, capsys, monkeypatch):
    """--compile-only writes one disk-cache entry per kernel; a second run
    finds it there (no GPU; the prebuilt-cache tests are in test_prebuilt_cache.py)."""
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "cache"))
    path = _shapes_file(tmp_path, [{"kind": "normal", "m": 128, "n": 7168, "k": 2048}])
    rc = cli.main(["warmup", "--shapes", path, "--compile-only", "--no-quant"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "1 of 1 kernels written to" in out and "compiled, " in out and "KiB cubin" in out
    assert len(list((tmp_path / "cache" / "cugemm8").glob("*.cubin"))) == 1
    assert cli.main(["warmup", "--shapes", path, "--compile-only", "--no-quant"]) == 0
    assert "cached, " in capsys.readouterr().out


def test_warmup_compile_only_needs_the_disk_cache(tmp_path, monkeypatch, capsys):
    from cugemm8 import _env
    monkeypatch.setattr(_env, "DISABLE_CACHE", True)
    path = _shapes_file(tmp_path, [{"m": 64, "n": 2112, "k": 7168}])
    if cli.nvrtc_reason() is not None:
        pytest.skip("no NVRTC here: --compile-only stops before the cache check")
    assert cli.main(["warmup", "--shapes", path, "--compile-only"]) == 2
    assert "writes the disk cache" in capsys.readouterr().err


def test_warmup_check_cache_reports_misses(tmp_path, monkeypatch, capsys):
    """--check-cache compiles nothing and needs no GPU: an empty cache is all misses (exit 1)."""
    pytest.importorskip("cupy")
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "cache"))
    path = _shapes_file(tmp_path, [{"m": 64, "n": 2112, "k": 7168}])
    assert cli.main(["warmup", "--shapes", path, "--check-cache", "--num-sms", "132"]) == 1
    out = capsys.readouterr().out
    assert "0 of 29 kernels" in out and "MISS: no entry for this kernel" in out   # 1 GEMM + 28 quantisers
    assert "NVRTC " in out and "CuPy " in out


def test_quant_jobs_cover_every_quantiser():
    from cugemm8 import quant
    jobs = cli.quant_jobs()
    assert sorted(j.name for j in jobs) == sorted(quant.all_kernel_names())
    assert {j.header for j in jobs} == {quant._HEADER}


def test_text_shapes_files_and_presets(tmp_path):
    text = tmp_path / "shapes.txt"
    text.write_text("# kind m n k groups\n\nnormal 64 2112 7168\n  masked 256 7168 2048 4  # decode\n")
    assert cli.load_shapes(str(text)) == [cli.Shape("normal", 64, 2112, 7168, 1),
                                          cli.Shape("masked", 256, 7168, 2048, 4)]
    for bad in ("normal 64 2112", "dense 1 8 16", "normal 1 7 16", "normal x 8 16", "normal 1 8 16 1 1"):
        text.write_text(bad + "\n")
        with pytest.raises(ValueError, match=r"shapes\.txt:1"):
            cli.load_shapes(str(text))
    check = cli.load_shapes("@check")
    normal = [s for s in check if s.kind == "normal"]
    assert len(normal) == 4 * 7 and {(s.n, s.k) for s in normal} == set(cli.DEEPSEEK_NK)
    # check's contiguous group sizes vary in [0.7, 1.3] x 1024 rows, each padded to 128
    m_sums = [s.m for s in check if s.kind == "contiguous"]
    assert min(m_sums) == 4 * 768 and max(m_sums) == 4 * 1408 and all(m % 128 == 0 for m in m_sums)
    assert len(cli.load_shapes("@check-quick")) < len(check)


def test_every_name_of_the_old_module_is_still_importable():
    """cugemm8/cli.py became a package: what benches and tests imported from it stays."""
    old = ["DEEPSEEK_NK", "CHECK_MS", "BLOCK", "E4M3_MAX", "MIN_AMAX", "DIFF_LIMIT", "POISON_BITS",
           "_ceil_div", "Shape", "check_shapes", "e4m3_values", "encode_e4m3", "quantize_blocks",
           "random_quantized", "_group_sizes", "make_operands", "dequantize", "_ref_rows",
           "TC_MANTISSA_BITS", "MMA_K", "_ref_and_bound_rows", "_group_parts", "reference", "calc_diff",
           "bf16_to_f64", "gemm_flops", "gemm_bytes", "valid_rows", "poisoned_out", "gemm_call",
           "config_string", "time_us", "make_l2_flush", "CheckResult", "_one_line", "gpu_reason",
           "nvrtc_reason", "_check_values", "check_one", "_fmt", "CHECK_COLUMNS", "_check_row", "_numeric",
           "print_table", "_progress", "cmd_check", "_try", "_dist_version", "_cuda_version", "cache_dir",
           "_dir_usage", "_gpu_lines", "info_lines", "cmd_info", "bench_script", "cmd_bench", "load_shapes",
           "WarmupJob", "_positive_int", "plan_warmup", "_compile_only", "_load_on_gpu", "cmd_configs",
           "cmd_warmup", "SUBCOMMANDS", "build_parser", "main"]
    missing = [name for name in old if not hasattr(cli, name)]
    assert not missing, missing
    from cugemm8 import _shapes
    assert cli.DEEPSEEK_NK is _shapes.DEEPSEEK_NK and cli.Shape is _shapes.Shape
    assert len(cli.DEEPSEEK_NK) == 7 and (576, 7168) in cli.DEEPSEEK_NK


def test_python_m_cugemm8_cli_still_runs():
    res = subprocess.run([sys.executable, "-m", "cugemm8.cli", "--version"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=str(REPO))
    assert res.returncode == 0 and res.stdout.startswith("cugemm8 "), res.stderr


# ----------------------------------------------------------------------------
# Data and reference helpers (NumPy path; the GPU path runs the same code)
# ----------------------------------------------------------------------------

def test_encode_e4m3_matches_reference_encoder():
    rng = np.random.default_rng(1)
    table = cli.e4m3_values()[:127].astype(np.float64)
    mids = (table[1:] + table[:-1]) / 2
    x = np.concatenate([
        rng.standard_normal(20000) * 50, rng.uniform(-448, 448, 20000),
        mids, -mids, table, -table, 2.0 ** -np.arange(5, 14), [0.0, 448.0, -448.0, 447.9, 1e-30],
    ]).astype(np.float32)
    got = cli.encode_e4m3(x, np)
    want = reference.float_to_e4m3(x)
    np.testing.assert_array_equal(got, want)


def test_quantize_blocks_recipe():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((256, 384)) * 3).astype(np.float32)
    x[5, :128] = 0.0
    bits, scale = cli.quantize_blocks(x, 1, np)
    want_bits, want_scale = reference.per_token_cast_to_fp8(x)
    np.testing.assert_array_equal(scale, want_scale)
    np.testing.assert_array_equal(bits, want_bits)
    bits, scale = cli.quantize_blocks(x, 128, np)
    want_bits, want_scale = reference.per_block_cast_to_fp8(x)
    np.testing.assert_array_equal(scale, want_scale)
    np.testing.assert_array_equal(bits, want_bits)


@pytest.mark.parametrize("shape", [cli.Shape("normal", 5, 200, 384), cli.Shape("normal", 1, 576, 256)])
def test_normal_operands_and_reference(shape):
    ops = cli.make_operands(shape, np, seed=3)
    m, n, k = shape.m, shape.n, shape.k
    assert ops["a"].shape == (m, k) and ops["a"].dtype == np.uint8
    assert ops["sfa"].shape == (m, -(-k // 128)) and ops["sfa"].dtype == np.float32
    assert ops["b"].shape == (n, k) and ops["sfb"].shape == (-(-n // 128), -(-k // 128))
    assert not np.any((ops["a"] & 0x7F) == 0x7F) and not np.any((ops["b"] & 0x7F) == 0x7F)
    assert len(np.unique(ops["sfb"])) > 1                       # block-varied
    want = reference.ref_gemm_nt(ops["a"], ops["sfa"], ops["b"], ops["sfb"])
    ref, none = cli.reference(ops, shape, np)
    assert none is None
    np.testing.assert_allclose(ref, want, rtol=1e-12, atol=0)
    ref, bound = cli.reference(ops, shape, np, bound=True)       # summed per 32-K step
    np.testing.assert_allclose(ref, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())
    want_bound = reference.error_bound(ops["a"], ops["sfa"], ops["b"], ops["sfb"])
    np.testing.assert_allclose(bound, want_bound, rtol=1e-9, atol=0)
    # the bound admits the correctly promoted kernel model, rounded to BF16
    model = reference.promoted_accumulation_model(ops["a"], ops["sfa"], ops["b"], ops["sfb"])
    got = reference.round_to_bf16(model).astype(np.float64)
    assert np.all(np.abs(got - ref) <= bound)


def test_grouped_operands_and_references():
    shape = cli.Shape("contiguous", 100, 136, 256, 3)
    ops = cli.make_operands(shape, np, seed=4, vary=True)
    assert len(ops["sizes"]) == 3 and all(70 <= s <= 130 for s in ops["sizes"])
    assert ops["a"].shape[0] == len(ops["m_indices"]) and ops["a"].shape[0] % 128 == 0
    assert ops["valid"].sum() == sum(ops["sizes"])
    ref, _ = cli.reference(ops, shape, np)
    want = reference.ref_gemm_contiguous(ops["a"], ops["sfa"], ops["b"], ops["sfb"], ops["m_indices"])
    np.testing.assert_allclose(ref, want, rtol=1e-12, atol=0)
    ref_b, bound = cli.reference(ops, shape, np, bound=True)
    np.testing.assert_allclose(ref_b, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())
    e = 1
    rows = slice(ops["offsets"][e], ops["offsets"][e] + ops["sizes"][e])
    want_bound = reference.error_bound(ops["a"][rows], ops["sfa"][rows], ops["b"][e], ops["sfb"][e])
    np.testing.assert_allclose(bound[rows], want_bound, rtol=1e-9, atol=0)
    assert np.all(bound[~ops["valid"]] == 0)

    shape = cli.Shape("masked", 40, 64, 128, 3)
    ops = cli.make_operands(shape, np, seed=5, vary=True)
    assert ops["a"].shape == (3, 40, 128) and ops["sfa"].shape == (3, 40, 1)
    assert all(1 <= v <= 40 for v in ops["masked_host"])
    ref, _ = cli.reference(ops, shape, np)
    want = reference.ref_gemm_masked(ops["a"], ops["sfa"], ops["b"], ops["sfb"], ops["masked_m"])
    np.testing.assert_allclose(ref, want, rtol=1e-12, atol=0)
    assert cli.valid_rows(shape, ops) == sum(ops["masked_host"])


def test_metrics_helpers():
    x = np.linspace(-1, 1, 100)
    assert cli.calc_diff(x, x, np) == pytest.approx(0.0, abs=1e-15)
    assert cli.calc_diff(x, -x, np) == pytest.approx(2.0)
    assert cli.calc_diff(x, x, np) == pytest.approx(reference.calc_diff(x, x), abs=1e-15)
    bits = np.array([0x3F80, 0xC000, 0x7FC1], dtype=np.uint16)
    vals = cli.bf16_to_f64(bits.view(np.dtype("uint16")), np)
    assert vals[0] == 1.0 and vals[1] == -2.0 and np.isnan(vals[2])
    # A + B + D + SFA + SFB for 64 x 2112 x 7168
    assert cli.gemm_bytes(64, 2112, 7168) == 64 * 7168 + 2112 * 7168 + 64 * 2112 * 2 + 64 * 56 * 4 + 17 * 56 * 4
    assert len(cli.check_shapes()) == 4 * 7 + 2 + 6 + 1 and len(cli.check_shapes(quick=True)) < 10
    assert {s.kind for s in cli.check_shapes(quick=True)} == {"normal", "contiguous", "masked", "wgrad", "k_grouped"}
    # the training GEMMs: A + B (FP8) + FP32 D per group + 1x128 scales on both
    assert cli.gemm_bytes_1d1d(2112, 7168, 4096) == (2112 + 7168) * 4096 + 2112 * 7168 * 4 + (2112 + 7168) * 32 * 4


@pytest.mark.parametrize("shape", [cli.Shape("wgrad", 40, 72, 384), cli.Shape("wgrad", 3, 8, 1040)])
def test_training_operands_and_reference(shape):
    """The 1D1D kinds: 1x128 scales along K on both operands; the reference
    is cugemm8.reference.training's, and its bound admits the promoted
    kernel model (FP32 out)."""
    ops = cli.make_operands(shape, np, seed=6, vary=True)
    m, n, k = shape.m, shape.n, shape.k
    assert ops["a"].shape == (m, k) and ops["b"].shape == (n, k)
    assert ops["sfa"].shape == (m, -(-k // 128)) and ops["sfb"].shape == (n, -(-k // 128))
    from cugemm8.reference import training as RT
    want = RT.ref_gemm_1d1d(ops["a"], ops["sfa"], ops["b"], ops["sfb"])
    ref, _ = cli.reference(ops, shape, np)
    np.testing.assert_allclose(ref, want, rtol=1e-12, atol=0)
    ref, bound = cli.reference(ops, shape, np, bound=True)
    np.testing.assert_allclose(ref, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())
    model = RT.promoted_accumulation_model_1d1d(ops["a"], ops["sfa"], ops["b"], ops["sfb"], tensor_core="hopper")
    assert np.all(np.abs(model.astype(np.float64) - ref) <= bound)
    assert np.all(bound <= RT.error_bound_1d1d(ops["a"], ops["sfa"], ops["b"], ops["sfb"]) * 1.5 + 2.0 ** -140)


def test_k_grouped_operands_and_reference():
    shape = cli.Shape("k_grouped", 30, 64, 128 * 12, 4)
    ops = cli.make_operands(shape, np, seed=7, vary=True)
    ks = ops["ks"]
    assert len(ks) == 4 and sum(ks) == shape.k and all(v % 128 == 0 for v in ks) and ks[1] == 0
    assert ops["ks_tensor"].tolist() == ks
    from cugemm8.reference import training as RT
    ref, bound = cli.reference(ops, shape, np, bound=True)
    want = RT.ref_k_grouped_gemm(ops["a"], ops["sfa"], ops["b"], ops["sfb"], ks)
    np.testing.assert_allclose(ref, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())
    assert np.all(ref[1] == 0) and np.all(bound[1] == 0)
    assert cli.valid_rows(shape, ops) == 30


# ----------------------------------------------------------------------------
# bench: forwarding and the report / plot from a saved JSON
# ----------------------------------------------------------------------------

def _fake_results(path):
    sys.path.insert(0, str(REPO / "benches"))
    try:
        import bench_gemm
    finally:
        sys.path.pop(0)
    rows = []
    for i, shape in enumerate(bench_gemm.bench_shapes(["normal", "contiguous", "masked"], False, True)):
        row = {"kind": shape.kind, "m": shape.m, "n": shape.n, "k": shape.k, "g": shape.num_groups,
               "label": shape.label(), "config": "128x112 s6 c2A sms132", "check": "ok", "diff": 1e-5,
               "us": 10.0 + i, "spread": 0.02, "base_us": None if i % 5 == 0 else 12.0 + i,
               "base_status": "wrong (rel 5.6e+01)" if i % 5 == 0 else "ok"}
        if shape.kind == "contiguous":
            row.update(same_m_us=9.5 + i, same_m_config="256x128 s3 c2B sms132")
        rows.append(bench_gemm.add_metrics(row, shape, None, shape.num_groups, 4300.0))
    meta = {"cugemm8": "0.1.0", "device": "NVIDIA H200 (132 SMs)", "copy_gbps": 4300.0,
            "peak_tflops": 1979.0, "reps": 40, "flush_mb": 256, "baseline": "cuBLASLt blockwise via F.scaled_mm"}
    path.write_text(json.dumps({"meta": meta, "rows": rows, "summary": bench_gemm.summarize(rows)}))
    return rows


def test_bench_from_json_report(tmp_path, capsys):
    saved = tmp_path / "bench.json"
    rows = _fake_results(saved)
    assert cli.main(["bench", "--from-json", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "cugemm8 FP8 GEMM benchmark" in out and "geomean" in out
    assert "wrong (rel 5.6e+01)" in out and "contig/normal" in out
    anchored = [r for r in rows if r["anchor_tflops"]]
    assert len(anchored) == 18 + 4 + 6
    assert all(r["target_tflops"] == pytest.approx(1.1 * r["anchor_tflops"]) for r in anchored)


def test_bench_plot(tmp_path):
    pytest.importorskip("matplotlib")
    saved = tmp_path / "bench.json"
    _fake_results(saved)
    png = tmp_path / "bench.png"
    assert cli.main(["bench", "--from-json", str(saved), "--plot", str(png)]) == 0
    assert png.stat().st_size > 10000


def test_bench_help_forwarded(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    assert "--from-json" in capsys.readouterr().out


def test_bench_missing_script(monkeypatch, tmp_path, capsys):
    from cugemm8.cli import bench
    monkeypatch.setattr(bench, "bench_script", lambda: tmp_path / "bench_gemm.py")
    assert cli.main(["bench"]) == 2
    assert "not here" in capsys.readouterr().out


def _one_error_line(res, start):
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), res.stderr
    return lines[0]


@pytest.mark.skipif(gpu_skip_reason() is None, reason="a Hopper GPU is usable here")
def test_bench_without_gpu_exits_2_like_check():
    res = _run("bench", "--quick")
    assert res.returncode == 2, (res.stdout, res.stderr)
    _one_error_line(res, "cugemm8 bench: no usable Hopper GPU: ")


def test_bench_bad_from_json_is_one_line_exit_2(tmp_path):
    res = _run("bench", "--from-json", str(tmp_path / "missing.json"))
    assert res.returncode == 2
    assert "No such file" in _one_error_line(res, "cugemm8 bench: cannot read --from-json ")
    (tmp_path / "bad.json").write_text("{not json")
    res = _run("bench", "--from-json", str(tmp_path / "bad.json"))
    assert res.returncode == 2
    _one_error_line(res, "cugemm8 bench: --from-json ")
    (tmp_path / "other.json").write_text("[1, 2]")
    assert cli.main(["bench", "--from-json", str(tmp_path / "other.json")]) == 2
    # has meta and rows, but not a saved run's (a fresh user's trial crashed in bench_gemm.py)
    for text, words in (('{"meta": {}, "rows": [{"x": 1}]}', "row 0 lacks kind, m, n, k"),
                        ('{"meta": 5, "rows": 7}', "'rows' a list"),
                        ('{"meta": {}, "rows": []}', "no rows")):
        (tmp_path / "shaped.json").write_text(text)
        res = _run("bench", "--from-json", str(tmp_path / "shaped.json"))
        assert res.returncode == 2
        assert words in _one_error_line(res, "cugemm8 bench: --from-json ")


def test_bench_plot_without_matplotlib_exits_nonzero(tmp_path, monkeypatch, capsys):
    saved = tmp_path / "bench.json"
    _fake_results(saved)
    monkeypatch.setitem(sys.modules, "matplotlib", None)       # import matplotlib -> ImportError
    rc = cli.main(["bench", "--from-json", str(saved), "--plot", str(tmp_path / "b.png")])
    err = capsys.readouterr().err
    assert rc == 2 and "--plot needs matplotlib" in err, err
    assert not (tmp_path / "b.png").exists()
    assert cli.main(["bench", "--from-json", str(saved), "--plot", str(tmp_path / "no" / "b.png")]) == 2


def test_bench_plot_step_failure_exits_1(tmp_path, monkeypatch, capsys):
    """The plot step fails after the report (bench_gemm.main swallows an
    ImportError there; any other error would be a traceback): one line, exit 1."""
    pytest.importorskip("matplotlib")
    from cugemm8.cli import bench
    saved = tmp_path / "bench.json"
    _fake_results(saved)
    real_load = bench._load_module

    for error in (ImportError("no backend"), ValueError("no row has a time to plot")):
        def load(path, error=error):
            module = real_load(path)

            def broken(*args, **kwargs):
                raise error
            module.plot_results = broken
            return module
        monkeypatch.setattr(bench, "_load_module", load)
        rc = cli.main(["bench", "--from-json", str(saved), "--plot", str(tmp_path / "b.png")])
        captured = capsys.readouterr()
        assert rc == 1, captured
        assert f"cugemm8 bench: --plot {tmp_path / 'b.png'} failed: {type(error).__name__}" in captured.err
        assert "cugemm8 FP8 GEMM benchmark" in captured.out            # the report came first


def test_configs_prints_the_heuristic_table(tmp_path, capsys):
    assert cli.main(["configs"]) == 0
    out = capsys.readouterr().out
    assert "64x32 s16 w1 k2" in out and "c2A" in out       # split K (one warpgroup) and the contiguous multicast
    shapes = _shapes_file(tmp_path, [{"m": 64, "n": 2112, "k": 7168}])
    assert cli.main(["configs", "--shapes", shapes, "--num-sms", "131"]) == 0
    assert "k2" not in capsys.readouterr().out            # 66 pairs (132 CTAs) no longer fit
    assert cli.main(["configs", "--shapes", str(tmp_path / "missing.json")]) == 2


def test_main_job_data_and_references_need_neither_curand_nor_cublas():
    """The cuda12 / cuda13 extras bring NVRTC and the runtime only: the main
    job's GPU data generator and float64 product are cugemm8's own kernels
    (cli._data.Rng, matmul_nt), never cupy.random or the cuBLAS matmul."""
    import inspect
    import io
    import tokenize
    from cugemm8.cli import _data
    toks = tokenize.generate_tokens(io.StringIO(inspect.getsource(_data)).readline)
    code = " ".join(t.string for t in toks if t.type not in (tokenize.STRING, tokenize.COMMENT))
    assert "random . RandomState" not in code.replace("np . random . RandomState", "")
    assert "xp . random" not in code and "cupy . random" not in code
    assert code.count("@") == 1      # matmul_nt's NumPy branch only
    rs = _data.Rng(np, 3)
    x = rs.standard_normal((4, 6))
    assert x.dtype == np.float32 and x.shape == (4, 6)
    u = rs.randint(-3, 4, (50,))
    assert u.dtype == np.int32 and u.min() >= -3 and u.max() <= 3
    a, b = rng_arrays = (np.arange(12.0).reshape(3, 4), np.arange(8.0).reshape(2, 4))
    out = np.ones((3, 2))
    _data.matmul_nt(a, b, np, out=out, accumulate=True)
    assert np.array_equal(out, a @ b.T + 1) and rng_arrays


def test_the_gpu_random_and_matmul_kernels_compile():
    """Both kernels through NVRTC (no GPU needed): the matmul as written, the
    generator's hash body inside a minimal kernel."""
    pytest.importorskip("cupy")
    try:
        from cupy_backends.cuda.libs import nvrtc
        nvrtc.getVersion()
    except Exception as exc:
        pytest.skip(f"NVRTC unavailable: {exc}")
    from cugemm8.cli import _data
    body = ('extern "C" __global__ void f(unsigned long long key, float* out) {'
            ' long long i = threadIdx.x; float y; ' + _data.Rng._SRC +
            ' y = (float)(h[0] >> 40) + (float)(h[1] >> 40); out[i] = y; }')
    for name, src in (("matmul", _data._MATMUL_NT), ("rng", body)):
        prog = nvrtc.createProgram(src, f"{name}.cu", (), ())
        try:
            nvrtc.compileProgram(prog, ("-arch=compute_90",))
        except nvrtc.NVRTCError:
            raise AssertionError(f"{name}: {nvrtc.getProgramLog(prog)}") from None
        finally:
            nvrtc.destroyProgram(prog)


def test_shapes_file_edge_cases_are_named(tmp_path):
    """From a fresh user's trial: a JSON object, an empty file and an unknown
    preset each get their own message instead of the text-format one."""
    from cugemm8 import _shapes
    cases = (("obj.json", '{"not": "a list"}', "must be a list of objects"),
             ("empty.txt", "# nothing here\n", "lists no shapes"),
             ("empty.json", "[]", "lists no shapes"))
    for name, text, words in cases:
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=words):
            _shapes.load_shapes(str(tmp_path / name))
    with pytest.raises(ValueError, match="presets are @check, @check-quick"):
        _shapes.load_shapes("@nope")


def test_training_kinds_in_shapes_files(tmp_path, capsys):
    """wgrad and k_grouped shapes: parsed (k_grouped's k a multiple of 128,
    wgrad one group), planned by warmup as the 1D1D kernels the ops pick
    with and without c, shown by configs, skipped by tune with a note."""
    path = tmp_path / "train.txt"
    path.write_text("wgrad 7168 2048 4096\nk_grouped 4096 7168 32768 4\nnormal 64 2112 7168\n")
    shapes = cli.load_shapes(str(path))
    assert [s.kind for s in shapes] == ["wgrad", "k_grouped", "normal"]
    assert shapes[0].label() == "7168x2048x4096" and shapes[1].label() == "4x4096x7168x32768"
    for bad in ("k_grouped 4096 7168 1000 4\n", "wgrad 64 2048 4096 2\n"):
        (tmp_path / "bad.txt").write_text(bad)
        with pytest.raises(ValueError):
            cli.load_shapes(str(tmp_path / "bad.txt"))
    jobs, errors = cli.plan_warmup(shapes, 132)
    assert not errors
    headers = sorted({j.header or "" for j in jobs})
    assert headers == ["", "fp8_gemm_1d1d.cuh"], headers
    one_d = [j for j in jobs if j.header == "fp8_gemm_1d1d.cuh"]
    assert all("fp8_gemm_1d1d_kernel<" in j.name for j in one_d) and len(one_d) >= 2
    assert any(", 3, 4, " in j.name for j in one_d)                 # k-grouped, 4 groups
    assert cli.main(["configs", "--shapes", str(path)]) == 0
    out = capsys.readouterr().out
    assert "wgrad" in out and "k_grouped" in out and "128x160" in out


@pytest.mark.compile
def test_warmup_compile_only_training_shape(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "w.txt"
    path.write_text("wgrad 2112 7168 4096\n")
    rc = cli.main(["warmup", "--shapes", str(path), "--compile-only", "--no-quant"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert len(list((tmp_path / "cache" / "cugemm8").glob("*.cubin"))) >= 1


def test_check_values_on_an_empty_k_group():
    """An empty expert's D is 0 with a bound of 0: exact zeros pass (no 0 / 0),
    anything else there fails."""
    shape = cli.Shape("k_grouped", 30, 64, 128 * 12, 4)
    ops = cli.make_operands(shape, np, seed=7, vary=True)
    from cugemm8.reference import training as RT
    out = np.stack([RT.promoted_accumulation_model_1d1d(ops["a"][:, sl], ops["sfa"][:, kb], ops["b"][:, sl],
                                                        ops["sfb"][:, kb], tensor_core="hopper")
                    if ke else np.zeros((30, 64), np.float32)
                    for _, sl, kb, ke in cli.k_group_slices(ops["ks"])])
    res = cli.CheckResult(shape)
    cli._check_values(shape, ops, out, np, res)
    assert res.passed and res.max_err <= 1.0, res
    out[1, 3, 5] = 1e-30
    cli._check_values(shape, ops, out, np, res)
    assert not res.passed and res.max_err > 1e300



@pytest.mark.parametrize("shape", [cli.Shape("wgrad", 7168, 2048, 4096), cli.Shape("k_grouped", 4096, 7168, 8192, 4),
                                   cli.Shape("wgrad", 100, 264, 1040)])
def test_warmup_plans_every_1d1d_kernel_the_ops_launch(shape):
    """Each call form of a training shape (no c, c = d: the TMA epilogue; c
    another array, or d 8 but not 16-byte aligned: the register epilogue,
    another kernel) must find its kernel warmed."""
    from cugemm8 import gemm_1d1d as G1
    jobs, errors = cli.plan_warmup([shape], 132)
    assert not errors
    planned = {j.name for j in jobs}
    gt = G1._GROUPED_K if shape.kind == "k_grouped" else G1._NORMAL
    for with_c, tma in ((False, True), (True, True), (True, False), (False, False)):
        cfg = G1.get_gemm_1d1d_config(shape.m, shape.n, shape.k, num_groups=shape.num_groups, with_c=with_c,
                                      num_sms=132, tma_store=tma)
        assert G1._kernel_name(cfg, shape.n, gt, shape.num_groups) in planned, (with_c, tma, str(cfg))


def test_configs_training_table_shows_the_register_epilogue_pick(tmp_path, capsys):
    """c another array takes the register epilogue, another kernel than c = d's."""
    path = tmp_path / "train.txt"
    path.write_text("wgrad 7168 2048 4096\n")
    assert cli.main(["configs", "--shapes", str(path), "--num-sms", "132"]) == 0
    out = capsys.readouterr().out
    from cugemm8 import _config_1d1d as C1
    other = C1.select_config(7168, 2048, 4096, num_sms=132, with_c=True, tma_store=False)
    assert not other.tma_store and str(other) in out, out


def test_configs_shows_a_tuned_swap_ab_entry(tmp_path, capsys, monkeypatch):
    """A tuned swap-AB entry prints as its own config text (swap flag and K
    split included), not as a 1D2D label rebuilt from its fields."""
    from cugemm8 import _config, _tuned
    path = tmp_path / "tuned.json"
    monkeypatch.setenv(_tuned.ENV_VAR, str(path))
    _tuned.reload()
    try:
        cfg = _config.make_config("normal", 8, 64, 24, 7168, num_k_splits=2, num_sms=128, swap_ab=True)
        env = {f: "x" for f in _tuned.ENV_FIELDS}
        env["num_sms"] = 132
        _tuned.write_entries([_tuned.entry_for("normal", 8, 4096, 7168, 1, env, cfg, us=10.0)], path)
        shapes = _shapes_file(tmp_path, [{"m": 8, "n": 4096, "k": 7168}])
        assert cli.main(["configs", "--shapes", shapes, "--num-sms", "132"]) == 0
        out = capsys.readouterr().out
        assert "8x64 s24 swapAB k2 sms128" in out, out
    finally:
        monkeypatch.delenv(_tuned.ENV_VAR)
        _tuned.reload()


def test_tune_flush_option(capsys):
    """tune's --flush: write (default) or read, nothing else; the flush
    factory refuses another kind before touching the GPU; a tuned entry
    records the flush its times were taken after."""
    import cupy
    from cugemm8 import _config, _tune
    from cugemm8.cli import _data
    with pytest.raises(SystemExit) as exc:
        cli.main(["tune", "--shapes", "@decode", "--flush", "clean"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="'write' or 'read'"):
        _data.make_l2_flush(cupy, kind="dirty")
    cfg = _config.make_config("normal", 64, 32, 16, 7168, num_sms=128, num_math_warpgroups=1)
    env = {"gpu": "x", "sm_count": 132, "num_sms": 132, "driver": "x", "nvrtc": "x", "cupy": "x",
           "sources": "x", "cugemm8": "x"}
    m = _tune.Measured(cfg, samples=[12.0])
    e = _tune.record("normal", 8, 4096, 7168, 1, env, m, m, 5, flush="read")
    assert e["flush"] == "read"
