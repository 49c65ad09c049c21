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
                                  ["warmup", "--help"]])
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


def test_warmup_bad_file_exits_2(tmp_path, capsys):
    assert cli.main(["warmup", "--shapes", str(tmp_path / "nope.json"), "--compile-only"]) == 2


@pytest.mark.compile
def test_warmup_compile_only_one_shape(tmp_path, capsys):
    path = _shapes_file(tmp_path, [{"kind": "normal", "m": 128, "n": 7168, "k": 2048}])
    rc = cli.main(["warmup", "--shapes", path, "--compile-only"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "1 kernels compiled" in out and "ok" in out and "regs" in out


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
    assert len(cli.check_shapes()) == 4 * 7 + 2 and len(cli.check_shapes(quick=True)) < 10


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
    monkeypatch.setattr(cli, "bench_script", lambda: tmp_path / "bench_gemm.py")
    assert cli.main(["bench"]) == 2
    assert "not here" in capsys.readouterr().out


def test_configs_prints_the_heuristic_table(tmp_path, capsys):
    assert cli.main(["configs"]) == 0
    out = capsys.readouterr().out
    assert "64x32 s16 k2" in out and "c2A" in out          # split K and the contiguous multicast
    shapes = _shapes_file(tmp_path, [{"m": 64, "n": 2112, "k": 7168}])
    assert cli.main(["configs", "--shapes", shapes, "--num-sms", "131"]) == 0
    assert "k2" not in capsys.readouterr().out            # 66 pairs (132 CTAs) no longer fit
    assert cli.main(["configs", "--shapes", str(tmp_path / "missing.json")]) == 2
