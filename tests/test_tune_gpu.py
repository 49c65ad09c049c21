"""Tuned configurations on the GPU (issue 23): a tuned file changes the
configuration the ops launch and the results stay equal to the reference
(poisoned outputs, guard rows); a corrupt file costs nothing but a warning;
``cugemm8 tune`` end to end on a few shapes of every kind."""
from __future__ import annotations

import json

import pytest

import cugemm8
from cugemm8 import _config, _tuned, gemm as G
from tests.gpu_helpers import check_against, guards_intact, make_operands, poisoned_out, reference_and_bound

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


@pytest.fixture
def tuned_file(tmp_path, monkeypatch):
    path = tmp_path / "tuned.json"
    monkeypatch.setenv(_tuned.ENV_VAR, str(path))
    G.reload_tuned_configs()
    yield path
    monkeypatch.delenv(_tuned.ENV_VAR)
    G.reload_tuned_configs()


def _launched(monkeypatch):
    """Record the config of every GEMM launch prepared from now on."""
    seen = []
    real = G._prepare_launch

    def spy(cfg, *args, **kw):
        seen.append(cfg)
        return real(cfg, *args, **kw)
    monkeypatch.setattr(G, "_prepare_launch", spy)
    return seen


@pytest.mark.parametrize("m, n, k, alt", [(64, 2112, 7168, (64, 48, 12, 1)), (8, 7168, 2048, (64, 64, 12, 1)),
                                          (100, 4096, 7168, (128, 32, 9, 2)), (3, 520, 1040, (64, 24, 8, 1))])
def test_a_tuned_entry_changes_the_launched_config_and_results_stay_right(cp, rng, tuned_file, monkeypatch,
                                                                          m, n, k, alt):
    num_sms = cugemm8.get_num_sms()
    heur = _config.select_config("normal", m, n, k, num_sms=num_sms)
    bm, bn, stages, splits = alt
    from cugemm8 import _tune
    tuned = _tune.forced_config("normal", m, n, k, 1, bm, bn, stages, num_sms, splits=splits)
    assert tuned is not None and str(tuned) != str(heur), (str(tuned), str(heur))
    env = _tuned.environment(num_sms)
    _tuned.write_entries([_tuned.entry_for("normal", m, n, k, 1, env, tuned)], tuned_file)
    G.reload_tuned_configs()
    assert cugemm8.get_gemm_config("normal", m, n, k) == tuned
    assert cugemm8.get_gemm_config("normal", m, n, k, num_sms=num_sms) == heur    # the heuristic, given num_sms
    seen = _launched(monkeypatch)
    a, sfa, b, sfb = make_operands(cp, rng, m, n, k)
    ref, bound = reference_and_bound(cp, a, sfa, b, sfb)
    out, full = poisoned_out(cp, m, n)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    assert seen and seen[-1] == tuned
    check_against(cp, out, ref, bound, what=f"tuned {tuned}")
    assert guards_intact(cp, full, m, n)


def test_an_entry_of_another_environment_is_ignored_on_the_gpu(cp, rng, tuned_file, monkeypatch):
    m, n, k = 64, 2112, 7168
    num_sms = cugemm8.get_num_sms()
    from cugemm8 import _tune
    other = _tune.forced_config("normal", m, n, k, 1, 64, 48, 12, num_sms)
    env = dict(_tuned.environment(num_sms), sources="0" * 64)
    _tuned.write_entries([_tuned.entry_for("normal", m, n, k, 1, env, other)], tuned_file)
    G.reload_tuned_configs()
    seen = _launched(monkeypatch)
    a, sfa, b, sfb = make_operands(cp, rng, m, n, k)
    out, _ = poisoned_out(cp, m, n)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    assert seen[-1] == _config.select_config("normal", m, n, k, num_sms=num_sms)


def test_a_corrupt_tuned_file_warns_and_the_op_stays_right(cp, rng, tuned_file):
    m, n, k = 48, 576, 7168
    tuned_file.write_text('{"format": 1, "entries": [{"env": ')      # a truncated write
    with pytest.warns(RuntimeWarning, match="tuned configurations file"):
        G.reload_tuned_configs()
        a, sfa, b, sfb = make_operands(cp, rng, m, n, k)
        ref, bound = reference_and_bound(cp, a, sfa, b, sfb)
        out, full = poisoned_out(cp, m, n)
        cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    check_against(cp, out, ref, bound, what="corrupt tuned file")
    assert guards_intact(cp, full, m, n)


def test_tune_end_to_end_writes_entries_the_ops_then_use(cp, rng, tuned_file, tmp_path, capsys, monkeypatch):
    from cugemm8.cli._main import main
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("normal 8 2112 7168\nnormal 256 7168 2048\ncontiguous 512 4096 2048 2\n"
                      "masked 32 2048 1024 4\n")
    report = tmp_path / "report.json"
    rc = main(["tune", "--shapes", str(shapes), "--budget-s", "120", "--rounds", "2", "--reps", "3",
               "--top", "3", "--split-k", "2", "--json", str(report)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "geomean gain over the heuristic" in out and f"wrote 4 entries to {tuned_file}" in out
    data = json.loads(report.read_text())
    assert len(data["shapes"]) == 4
    for s in data["shapes"]:
        assert s["timed"] >= 2 and s["tuned_us"] > 0
        assert all(not r["status"].startswith("wrong") for r in s["rows"]), s["rows"]
        assert s["tuned_us"] <= s["heuristic_us"] * 1.0 + 1e-9
    entries, problems = _tuned.read_file(tuned_file)
    assert len(entries) == 4 and not problems
    env = _tuned.environment(cugemm8.get_num_sms())
    assert all(e["env"] == {f: env[f] for f in _tuned.ENV_FIELDS} for e in entries)
    # The ops now launch the tuned pick, and the results are right.
    first = data["shapes"][0]
    seen = _launched(monkeypatch)
    m, n, k = 8, 2112, 7168
    a, sfa, b, sfb = make_operands(cp, rng, m, n, k)
    ref, bound = reference_and_bound(cp, a, sfa, b, sfb)
    o, full = poisoned_out(cp, m, n)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), o)
    assert str(seen[-1]) == first["tuned"]
    check_against(cp, o, ref, bound, what="after tune")
    assert guards_intact(cp, full, m, n)
    # `cugemm8 configs` shows the tuned picks as used here.
    assert main(["configs", "--shapes", str(shapes), "--num-sms", str(cugemm8.get_num_sms())]) == 0
    shown = capsys.readouterr().out
    assert "tuned configurations" in shown and "used" in shown


def test_tune_training_shapes_end_to_end(cp, rng, tuned_file, tmp_path, capsys, monkeypatch):
    """The training kinds: candidates checked without c, timed accumulating
    in place; the entries written are used by fp8_gemm_nt /
    k_grouped_fp8_gemm_nt_contiguous, whose results stay bit-identical to
    the heuristic's (every 1D1D tile promotes the same blocks in the same
    order)."""
    from cugemm8 import _config_1d1d, gemm_1d1d as G1
    from cugemm8.cli._main import main
    m, n, k = 576, 1024, 2048
    d_heur = cp.full((m, n), cp.nan, cp.float32)
    shapes = tmp_path / "shapes.txt"
    shapes.write_text(f"wgrad {m} {n} {k}\nk_grouped 512 768 {4 * 1024} 4\n")
    report = tmp_path / "report.json"
    rc = main(["tune", "--shapes", str(shapes), "--budget-s", "60", "--rounds", "2", "--reps", "3",
               "--top", "3", "--json", str(report)])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads(report.read_text())
    assert [s["kind"] for s in data["shapes"]] == ["wgrad", "k_grouped"]
    for s in data["shapes"]:
        assert s["timed"] >= 2 and all(not r["status"].startswith("wrong") for r in s["rows"]), s["rows"]
    entries, problems = _tuned.read_file(tuned_file)
    assert sorted(e["kind"] for e in entries) == ["k_grouped", "wgrad"] and not problems
    # the op launches the recorded pick, with the same bits as the heuristic's
    want = next(s["tuned"] for s in data["shapes"] if s["kind"] == "wgrad")
    x = cp.asarray(rng.standard_normal((k, m)).astype("float32"))
    y = cp.asarray(rng.standard_normal((k, n)).astype("float32"))
    qa = cugemm8.per_token_cast_to_fp8_t(x, mn_major=True)
    qb = cugemm8.per_token_cast_to_fp8_t(y, mn_major=True)
    assert str(G1.get_gemm_1d1d_config(m, n, k, with_c=True)) == want
    d_tuned = cp.full((m, n), cp.nan, cp.float32)
    cugemm8.fp8_gemm_nt(qa, qb, d_tuned)
    heur = _config_1d1d.select_config(m, n, k, num_sms=cugemm8.get_num_sms(), with_c=True)
    with G1._forced_config(heur):
        cugemm8.fp8_gemm_nt(qa, qb, d_heur)
    assert bool(cp.all(d_tuned.view(cp.uint32) == d_heur.view(cp.uint32)))
