"""CPU tests of tools/perf/cluster_timeline.py: its instrumentation points
still exist once in cuda_src/ (a kernel edit that moves one breaks the
probe here, not on the device), and its analysis of the records, on
synthetic launches whose drift, merge candidates and per-SM rates are
known."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cupy")
_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT / "tools" / "perf"))
import cluster_timeline as ct  # noqa: E402

G0 = 1_800_000_000_000_000_000          # %globaltimer: ns since the epoch
NUM_KB = 16


def _launch(sm_of_cta, rate_of_sm, *, tiles=5, kb_ns=900, step=32, seed=0):
    """The record buffer of one launch: CTA c runs on SM sm_of_cta[c]; the
    two CTAs of a cluster (c, c ^ 1) read one A tile, every CTA its own
    n-block (so no two CTAs share a B tile); each SM takes rate_of_sm[sm] ns
    a tile; the timer steps by `step` ns; clock64 runs at 1.5 GHz."""
    rng = np.random.default_rng(seed)
    r = np.zeros((len(sm_of_cta), ct.MAX_TILES, ct.RECORDS, ct.SLOT), np.uint64)
    for c, sm in enumerate(sm_of_cta):
        clk0 = int(rng.integers(10**6, 10**9))
        for t in range(tiles):
            r[c, t, 0, 0] = ((c // 2 + 4 * t) << 32) | c
            r[c, t, 0, 1] = (sm << 32) | 1
            for kb in range(NUM_KB):
                ns = 100_000 + t * rate_of_sm[sm] + kb * kb_ns + int(rng.integers(0, 20))
                r[c, t, 1 + kb, 0] = G0 + ns // step * step
                r[c, t, 1 + kb, 1] = clk0 + int(ns * 1.5)
            end = 100_000 + t * rate_of_sm[sm] + NUM_KB * kb_ns
            r[c, t, ct.MATH0, 0] = G0 + end + 500
            r[c, t, ct.MATH0, 1] = clk0 + int((end + 500) * 1.5)
            r[c, t, ct.MATH1, 0] = r[c, t, ct.MATH1, 1] = int(0.05 * NUM_KB * kb_ns * 1.5)
            r[c, t, ct.MATH2, 0] = clk0 + int((end + 1500) * 1.5)
            r[c, t, ct.MATH2, 1] = clk0 + int((end + 400) * 1.5)
    return r.reshape(-1)


def test_instrumentation_points_are_found_once():
    """make_tree raises unless every replacement's text occurs exactly once
    in the kernel sources (the same check variant_sweep.py runs)."""
    from cugemm8 import _jit
    from variant_sweep import make_tree
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for math in (True, False):
            tree = make_tree(_jit.cuda_src_dir(), {"replace": ct.cugemm8_replacements(0x7F00_0000_0000, math)},
                             Path(tmp) / f"probe{int(math)}")
            text = (tree / "fp8_gemm_1d2d.cuh").read_text()
            assert "%globaltimer" in text and "%smid" in text
            assert ("probe_wait" in text) == math


def test_deepgemm_replacements_apply_to_a_matching_header():
    """Each DeepGEMM insertion point must occur once; a header without them
    is refused with the point named."""
    header = "".join(old for old, _ in ct.deepgemm_replacements(1))
    out = header
    for old, new in ct.deepgemm_replacements(0x1000):
        out = ct._replace_once(out, old, new, "header")
    assert out.count("0x1000ull") >= 5
    with pytest.raises(ValueError, match="not found once"):
        ct._replace_once("nothing here", ct.deepgemm_replacements(1)[0][0], "", "header")


def test_events_keep_nanoseconds_of_an_epoch_timer():
    """The timer counts from the epoch (~1.8e18 ns): a float64 conversion
    before subtracting would round it to 256 ns (v0.36's first call)."""
    ev, step = ct.events(_launch([0, 1, 2, 3], {s: 20_000 for s in range(4)}), NUM_KB)
    assert step == 32.0
    d = np.diff(ev["t"][(ev["cta"] == 0) & (ev["tile"] == 0)])
    assert np.all(np.abs(d - 900) <= 64)


def test_summary_sees_drift_rates_and_math_times():
    sms = [0, 1, 2, 3, 4, 5, 6, 7]
    rates = {s: 20_000 + 200 * (s // 2) for s in sms}         # a cluster's two SMs alike
    ev, _ = ct.events(_launch(sms, rates), NUM_KB)
    s = ct.summarise(ev, NUM_KB, True)
    spread = float(np.std(list(rates.values()))) / 1e3
    assert s["rate_sd"] == pytest.approx(spread, rel=0.05)
    assert s["rate_corr"] > 0.9                               # each CTA keeps its rate
    assert s["tile"] == pytest.approx(np.median(list(rates.values())) / 1e3, rel=0.02)
    assert s["kb"] == pytest.approx(0.9, abs=0.07)
    assert s["B<1000"] == 0.0                                 # no two CTAs read one B tile
    assert s["pair"] < 0.1                                    # a cluster in lock-step
    assert s["wait0"] == pytest.approx(0.05, rel=0.15)
    assert s["epi"] == pytest.approx(1.0, abs=0.1)
    assert s["wg_skew"] == pytest.approx(-0.1, abs=0.07)
    sd = s["start_sd_by_tile"]
    assert sd == sorted(sd)                                   # the drift grows tile by tile


def test_rates_that_follow_the_sm_correlate_by_sm_not_by_cta():
    rates = {s: 20_000 + 150 * s for s in range(8)}
    placements = [list(np.random.default_rng(10 + i).permutation(8)) for i in range(3)]
    evs = [ct.events(_launch(p, rates, seed=i), NUM_KB)[0] for i, p in enumerate(placements)]
    c = ct.launch_correlations(evs)
    assert c["by_sm"] > 0.99
    assert c["by_cta"] < 0.5
