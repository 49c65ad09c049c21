"""CPU tests of tools/perf/warp_mma_probe.py's variant selection (``--only``)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("cupy")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "perf"))
import warp_mma_probe as wp  # noqa: E402


def test_only_keeps_the_matching_labels_in_sweep_order():
    every = wp.variants(7168, 2)
    assert wp.select_variants(7168, 2) == every == wp.select_variants(7168, 2, "")
    kept = wp.select_variants(7168, 2, r"^wm (14x1|4x1) r1 u2$")
    assert [wp.label(v) for v in kept] == ["wm 4x1 r1 u2", "wm 14x1 r1 u2"]
    assert every.index(kept[0]) < every.index(kept[1])          # the sweep's own order
    assert len(wp.select_variants(7168, 1, r" u2$")) < len(wp.variants(7168, 1))   # the u4 / u8 forms dropped


def test_only_that_matches_nothing_selects_nothing():
    assert wp.select_variants(512, 1, r"^wm 14x1 ") == []       # K = 512: 4 K blocks, no 14-way split


def test_a_bad_pattern_is_an_error():
    with pytest.raises(re.error):
        wp.select_variants(7168, 1, "(")
