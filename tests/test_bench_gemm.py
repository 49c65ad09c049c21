"""CPU tests of benches/bench_gemm.py's ``--deepgemm`` report path (DeepGEMM
timed in the same run: ratios, table, summary, JSON) and of
benches/deepgemm_anchor.py's host-side helpers (prewarm entries, the
contiguous layout rule, the reason when DeepGEMM is not usable).  No GPU,
no torch, no DeepGEMM."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benches"))
bench_gemm = pytest.importorskip("bench_gemm")
deepgemm_anchor = pytest.importorskip("deepgemm_anchor")


def _rows(dg: bool):
    """One row per --quick shape, cugemm8 timed by CUPTI (and events);
    with ``dg`` DeepGEMM too: faster on the first shape, failed on the
    last, slower elsewhere."""
    shapes = bench_gemm.bench_shapes(["normal", "contiguous", "masked"], True, False)
    rows = []
    for i, shape in enumerate(shapes):
        row = {"kind": shape.kind, "m": shape.m, "n": shape.n, "k": shape.k, "g": shape.num_groups,
               "label": shape.label(), "config": "128x112 s6", "check": "ok", "diff": 1e-5,
               "us": 12.0, "kus": 10.0, "spread": 0.02, "base_us": 14.0, "base_kus": 12.0, "base_status": "ok"}
        if dg:
            if i == len(shapes) - 1:
                row.update(dg_status="FAIL 3.1e-02", dg_diff=3.1e-2, dg_us=None, dg_kus=None)
            else:
                row.update(dg_status="ok", dg_diff=2e-5, dg_us=13.2, dg_kus=9.0 if i == 0 else 12.5,
                           dg_spread=0.3 if i == 1 else 0.01, alt_kus=10.0, dg_alt_kus=9.5 if i == 0 else 11.0)
        rows.append(bench_gemm.add_metrics(row, shape, None, shape.num_groups, 4300.0))
    return shapes, rows


def test_deepgemm_flag_parses():
    assert bench_gemm.parse_args([]).deepgemm is False
    args = bench_gemm.parse_args(["--deepgemm", "--kinds", "contiguous,masked"])
    assert args.deepgemm is True and args.kinds == ["contiguous", "masked"]


def test_energy_flag_hands_bench_energy_its_arguments():
    assert bench_gemm.parse_args([]).energy == 0
    args = bench_gemm.parse_args(["--energy", "3", "--deepgemm", "--json", "out/run.json"])
    assert bench_gemm.energy_argv(args) == ["--ms", "4096", "--rounds", "3", "--deepgemm",
                                            "--json", str(Path("out/run.energy.json"))]
    assert bench_gemm.energy_argv(bench_gemm.parse_args(["--energy", "1"])) == ["--ms", "4096", "--rounds", "1"]
    with pytest.raises(SystemExit):
        bench_gemm.parse_args(["--energy", "-1"])
    # bench_energy's own parser takes them; without a GPU it then says so and returns 2.
    from cugemm8 import _device
    if _device.gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present: bench_energy would run its loops")
    bench_energy = pytest.importorskip("bench_energy")
    assert bench_energy.main(bench_gemm.energy_argv(args)) == 2


def test_measured_ratios_are_like_timer_with_like():
    _, rows = _rows(dg=True)
    first, second, last = rows[0], rows[1], rows[-1]
    assert first["timer"] == "cupti" and first["dg_t_us"] == 9.0
    assert first["ratio_dg"] == pytest.approx(9.0 / 10.0)              # DeepGEMM faster: below 1
    assert second["ratio_dg"] == pytest.approx(12.5 / 10.0)
    assert first["ratio_dg_events"] == pytest.approx(13.2 / 12.0)
    assert first["dg_tflops"] == pytest.approx(first["flops"] / 9.0 / 1e6)
    assert last["ratio_dg"] is None and last["dg_tflops"] is None
    assert first["ratio_dg_alternating"] == pytest.approx(9.5 / 10.0)
    assert second["ratio_dg_alternating"] == pytest.approx(11.0 / 10.0)
    assert last["ratio_dg_alternating"] is None
    # events only (no CUPTI): events against events
    row = dict(kind="normal", m=64, n=2112, k=7168, g=1, label="x", us=12.0, dg_us=15.0, dg_status="ok")
    row = bench_gemm.add_metrics(row, bench_gemm.Shape("normal", 64, 2112, 7168), None, 1, 4300.0)
    assert row["timer"] == "events" and row["ratio_dg"] == pytest.approx(15.0 / 12.0)


def test_summary_counts_measured_shapes():
    _, rows = _rows(dg=True)
    summary = bench_gemm.summarize(rows)
    s = summary["all"]
    ratios = [r["ratio_dg"] for r in rows if r["ratio_dg"]]
    assert s["dg_shapes"] == len(rows) - 1 == len(ratios)
    assert s["dg_failures"] == 1
    assert s["min_vs_dg_same_run"] == pytest.approx(0.9)
    assert s["below_dg_same_run"] == 1 and s["below_target_same_run"] == 1     # 0.90; the 1.25s pass
    assert s["geomean_vs_dg_same_run"] == pytest.approx(float(np.exp(np.mean(np.log(ratios)))))
    assert summary["masked"]["dg_shapes"] == 0 and summary["masked"]["dg_failures"] == 1
    alt = [r["ratio_dg_alternating"] for r in rows if r["ratio_dg_alternating"]]
    assert s["geomean_vs_dg_alternating"] == pytest.approx(float(np.exp(np.mean(np.log(alt)))))
    assert s["min_vs_dg_alternating"] == pytest.approx(0.95)
    # without --deepgemm none of these keys appear
    _, plain = _rows(dg=False)
    assert not any(k.startswith("dg_") for k in bench_gemm.summarize(plain)["all"])


def test_report_shows_measured_columns_and_summary(capsys):
    _, rows = _rows(dg=True)
    meta = {"cugemm8": "0", "reps": 40, "flush_mb": 256, "deepgemm": "DeepGEMM 2.6.1 timed in this run (/x)"}
    bench_gemm.print_report(meta, rows, bench_gemm.summarize(rows))
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "DeepGEMM µs" in line)
    assert "×DeepGEMM" in header and "target TF" not in header and "DeepGEMM TF" not in header
    assert "DeepGEMM 2.6.1 timed in this run" in out and "> 1: cugemm8 faster" in out
    assert "FAIL 3.1e-02" in out and "DeepGEMM noisy" in out
    first = next(line for line in out.splitlines() if line.startswith("normal") and "64x2112x7168" in line)
    assert first.split()[-3:] == ["9.0", "0.90", "0.950"]          # DeepGEMM µs (CUPTI), ×DeepGEMM, ×DG alt
    assert "alternating the two" in out
    line = next(line for line in out.splitlines() if line.strip().startswith("all:"))
    assert "geomean ×DeepGEMM (same run)" in line and "min 0.90, 1 below 1.0" in line
    assert "alternating CUPTI" in line and "min 0.95" in line
    assert "DeepGEMM failed on 1" in line


def test_report_without_deepgemm_keeps_the_h200_figure(capsys):
    _, rows = _rows(dg=False)
    meta = {"deepgemm": "n/a: DeepGEMM not usable (ModuleNotFoundError: No module named 'deep_gemm')"}
    bench_gemm.print_report(meta, rows, bench_gemm.summarize(rows))
    out = capsys.readouterr().out
    assert "DeepGEMM TF" in out and "target TF" in out and "DeepGEMM µs" not in out
    assert "not measured in this run (n/a: DeepGEMM not usable" in out
    assert "(same run)" not in out


def test_json_round_trip_carries_the_deepgemm_fields(tmp_path, capsys):
    _, rows = _rows(dg=True)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"meta": {"deepgemm": "DeepGEMM 2.6.1 timed in this run"}, "rows": rows,
                                "summary": bench_gemm.summarize(rows)}))
    saved = json.loads(path.read_text())
    for key in ("dg_us", "dg_kus", "dg_status", "dg_diff", "dg_t_us", "dg_tflops", "ratio_dg", "ratio_dg_events",
                "alt_kus", "dg_alt_kus", "ratio_dg_alternating"):
        assert key in saved["rows"][0], key
    assert "geomean_vs_dg_same_run" in saved["summary"]["normal"]
    assert bench_gemm.main(["--from-json", str(path)]) == 0
    assert "DeepGEMM µs" in capsys.readouterr().out


def test_warm_specs_give_the_bench_shapes_to_prewarm():
    shapes, _ = _rows(dg=False)
    specs = [deepgemm_anchor.warm_spec(s) for s in bench_gemm.warm_specs(shapes)]
    assert specs[0] == ("normal", 64, 2112, 7168, 1, 64)
    assert ("contiguous", 4096, 7168, 2048, 8, 4096) in specs
    assert ("masked", 256, 7168, 2048, 4, 256) in specs                # expected_m = m_max
    with pytest.raises(ValueError):
        deepgemm_anchor.warm_spec(("k_grouped", 1, 2, 3, 4))


def test_contiguous_layout_rule():
    ok = np.repeat(np.arange(4, dtype=np.int32), 256)
    assert deepgemm_anchor.contiguous_layout_problem(ok, 128, 4) is None
    padded = np.full(512, -1, np.int32)
    padded[:100], padded[128:300] = 0, 1                 # each group on a 128-row boundary, padding after
    assert deepgemm_anchor.contiguous_layout_problem(padded, 128, 2) is None
    shifted = padded.copy()
    shifted[100:128] = 1                                   # group 1 starts inside group 0's block
    assert "multiple of 128" in deepgemm_anchor.contiguous_layout_problem(shifted, 128, 2)
    late = np.full(256, -1, np.int32)
    late[140:256] = 0                                      # a block whose first row is padding: skipped
    assert deepgemm_anchor.contiguous_layout_problem(late, 128, 1) is not None
    assert "[-1, 1)" in deepgemm_anchor.contiguous_layout_problem(padded, 128, 1)


def test_without_deepgemm_the_bench_says_why_and_goes_on(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)          # import deep_gemm -> ImportError
    monkeypatch.setattr(deepgemm_anchor, "_state", {})
    dg, note = bench_gemm.open_deepgemm(types.SimpleNamespace(deepgemm=True), [])
    assert dg is None and note.startswith("n/a: DeepGEMM not usable (")
    assert "going on without it" in capsys.readouterr().out
    assert bench_gemm.open_deepgemm(types.SimpleNamespace(deepgemm=False), []) == (None, None)
    assert deepgemm_anchor.open_for([(64, 2112, 7168)]) is None
    with pytest.raises(RuntimeError):
        deepgemm_anchor.grouped_masked(None, None, None, None, None, 1)


def test_a_deepgemm_error_becomes_the_row_status():
    def broken(*args, **kwargs):
        raise RuntimeError("Assertion error (csrc/apis/gemm.hpp:184): grouped_layout.is_contiguous()")
    dg = types.SimpleNamespace(gemm_nt=broken, grouped_contiguous=broken, grouped_masked=broken)
    shape = bench_gemm.Shape("masked", 256, 7168, 2048, 4)
    res = bench_gemm.measure_deepgemm(shape, {"a": 0, "sfa": 0, "b": 0, "sfb": 0, "masked_m": 0},
                                      None, None, None, dg, None)
    assert res["dg_status"].startswith("error: RuntimeError: Assertion error") and res["dg_us"] is None
    assert bench_gemm.measure_deepgemm(shape, {}, None, None, None, None, None) == {}


def test_alternating_kernel_times_rotate_the_order(monkeypatch):
    """common.kernel_times_alternating: repetition r runs the callables in
    an order rotated by r, one flush before each, and gives every slot's
    activities to the callable that ran in it (the profiler faked: each
    slot's single activity lasts the callable's own tag)."""
    common = pytest.importorskip("common")
    seen = []

    def fake_slots(slots, *, flush, hold_s=0.0):
        seen.extend(fns[0] for fns in slots)
        return [[(0.0, fns[0]())] for fns in slots]

    monkeypatch.setattr(common, "_profiled_slots", fake_slots)
    a, b, c = (lambda: 1.0), (lambda: 2.0), (lambda: 3.0)
    out = common.kernel_times_alternating({"a": a, "b": b}, reps=4, flush=object())
    assert seen == [a, b, b, a, a, b, b, a]
    assert out["a"].samples == [1.0] * 4 and out["b"].samples == [2.0] * 4
    seen.clear()
    out = common.kernel_times_alternating({"a": a, "b": b, "c": c}, reps=3, flush=object())
    assert seen == [a, b, c, b, c, a, c, a, b]
    assert out["c"].median == 3.0
    # a slot count that does not match (a flush not recorded): no result rather than misattributed times
    monkeypatch.setattr(common, "_profiled_slots", lambda slots, **_: [[(0.0, 1.0)]])
    assert common.kernel_times_alternating({"a": a, "b": b}, reps=2, flush=object()) is None


def test_alternating_times_name_each_library_and_keep_the_sequential_ones_on_failure(monkeypatch):
    """bench_gemm.alternating_times maps the alternating sequence's timings
    to cugemm8 (``alt_kus``) and DeepGEMM (``dg_alt_kus``) by name, so the
    ratio cannot come out inverted; a failure becomes ``alt_error``."""
    common = pytest.importorskip("common")
    ours, theirs = object(), object()
    seen = {}

    def fake(named_fns, *, reps, flush):
        seen.update(named_fns)
        return {"deepgemm": common.Timing([9.0, 9.0]), "cugemm8": common.Timing([10.0, 10.0])}

    monkeypatch.setattr(common, "kernel_times_alternating", fake)
    args = bench_gemm.parse_args(["--reps", "2"])
    out = bench_gemm.alternating_times(ours, theirs, args, flush=object())
    assert seen == {"cugemm8": ours, "deepgemm": theirs}
    assert out == {"alt_kus": 10.0, "dg_alt_kus": 9.0}

    def broken(named_fns, *, reps, flush):
        raise RuntimeError("profiler gone")

    monkeypatch.setattr(common, "kernel_times_alternating", broken)
    assert bench_gemm.alternating_times(ours, theirs, args, flush=object()) == {
        "alt_error": "RuntimeError: profiler gone"}
