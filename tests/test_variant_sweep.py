"""CPU tests of tools/perf/variant_sweep.py's --sweep-json conversion (the
format benches/sweep_configs.py writes and tests/test_config.py reads)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("cupy")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "perf"))
import variant_sweep as vs  # noqa: E402


def _row(shape, cfg, variant, us, kernel_us=None, status="ok", kind="normal", g=1):
    m, n, k = (int(x) for x in shape.split("x")[-3:])
    return {"shape": shape, "kind": kind, "config": cfg.rsplit(" sms", 1)[0], "full_config": cfg,
            "variant": variant, "m": m, "n": n, "k": k, "g": g, "us": us, "kernel_us": kernel_us,
            "status": status}


def test_sweep_json_keeps_one_variant_full_names_and_kernel_times():
    rows = [_row("4096x7168x16384", "256x128 s3 sms132", "base", 670.0, 668.3),
            _row("4096x7168x16384", "256x128 s3 c2A sms132", "base", 658.0, 655.6),
            _row("4096x7168x16384", "256x128 s3 c2A sms132", "other", 600.0, 599.0),
            _row("4096x7168x8192", "256x128 s3 sms132", "base", 340.0),
            {"shape": "4096x7168x8192", "kind": "normal", "config": "999x1 s1", "variant": "base",
             "m": 4096, "n": 7168, "k": 8192, "g": 1, "status": "illegal"}]
    out = vs.sweep_json(rows, "base", 132, "note")
    assert out["num_sms"] == 132 and out["note"] == "note"
    by_label = {s["label"]: s for s in out["shapes"]}
    assert set(by_label) == {"4096x7168x16384", "4096x7168x8192"}
    s = by_label["4096x7168x16384"]
    assert (s["kind"], s["m"], s["n"], s["k"], s["g"]) == ("normal", 4096, 7168, 16384, 1)
    times = {r["config"]: (r["us"], r["timer"]) for r in s["rows"]}
    assert times == {"256x128 s3 sms132": (668.3, "cupti"), "256x128 s3 c2A sms132": (655.6, "cupti")}
    # no kernel time: the event time, so labelled; the illegal case is left out
    assert [(r["us"], r["timer"]) for r in by_label["4096x7168x8192"]["rows"]] == [(340.0, "events")]


def test_sweep_json_a_config_timed_twice_keeps_the_later_reading():
    rows = [_row("4096x7168x16384", "256x128 s3 sms132", "base", 1.0, 670.0),
            _row("4096x7168x16384", "256x128 s3 sms132", "base", 1.0, 668.0)]
    (shape,) = vs.sweep_json(rows, "base", 132, "")["shapes"]
    assert [r["us"] for r in shape["rows"]] == [668.0]


def test_sweep_json_contiguous_keeps_the_per_group_m():
    rows = [_row("4x8192x7168x2048", "128x192 s4 c2A sms132", "base", 1.0, 731.2, kind="contiguous", g=4)]
    rows[0]["m"] = 8192
    (shape,) = vs.sweep_json(rows, "base", 132, "")["shapes"]
    assert (shape["m"], shape["g"], shape["label"]) == (8192, 4, "4x8192x7168x2048")
