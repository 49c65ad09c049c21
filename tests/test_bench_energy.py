"""CPU tests of benches/bench_energy.py's host logic (fake CuPy and NVML)."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benches"))
bench_energy = pytest.importorskip("bench_energy")


def fake_cp(elapsed_ms: float = 1000.0):
    class Event:
        done = True

        def record(self):
            pass

        def synchronize(self):
            pass

    cuda = types.SimpleNamespace(Event=Event, runtime=types.SimpleNamespace(deviceSynchronize=lambda: None),
                                 get_elapsed_time=lambda a, b: elapsed_ms)
    return types.SimpleNamespace(cuda=cuda)


class FrozenCounter:
    """An energy counter that did not tick during the loop (coarse NVML updates, a short --seconds)."""
    handle = object()

    def energy_mj(self):
        return 123456

    def sm_mhz(self):
        return 1500


def test_a_counter_that_did_not_advance_gives_no_energy_reading():
    out = bench_energy.sustained(fake_cp(), lambda: None, 0.0, FrozenCounter())
    assert "j" not in out and "watts" not in out, out          # not 0 J per GEMM (the table divides by it)
    assert out["us"] > 0


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--rounds", "-1"]])
def test_no_rounds_is_refused(argv):
    """With no round, the medians would read rs[0] of an empty list (IndexError after all the set-up)."""
    with pytest.raises(SystemExit) as exc:
        bench_energy.main(argv)
    assert exc.value.code == 2
