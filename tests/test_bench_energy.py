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


class Sampled(FrozenCounter):
    """A device whose clock-event reasons change between samples and whose energy counter ticks."""

    def __init__(self, reasons):
        self.seq, self.e = list(reasons), 0

    def energy_mj(self):
        self.e += 500
        return self.e

    def reasons(self):
        return self.seq.pop(0) if self.seq else 0

    def temperature(self):
        return 61


def test_clock_event_reasons_are_shares_of_the_samples():
    cp = fake_cp()
    polls = iter([False, False, False, False, True])

    class Stop(cp.cuda.Event):
        @property
        def done(self):
            return next(polls)
    cp.cuda.Event = Stop
    out = bench_energy.sustained(cp, lambda: None, 0.0, Sampled([0x4, 0x4 | 0x8, 0x80, 0x1]))
    r = out["reasons"]
    assert r["SWpow"] == 0.5 and r["HWslow"] == 0.25 and r["brake"] == 0.25 and r["SWtherm"] == 0, r
    assert out["temp_c"] == 61 and out["mhz"] == 1500
    assert bench_energy.reasons_text(r) == "SWpow 50% HWslow 25% brake 25%"
    assert bench_energy.reasons_text({k: 0 for k, _ in bench_energy.REASONS}) == "none"


@pytest.mark.parametrize("value", [57, types.SimpleNamespace(temperature=57)])
def test_temperature_accepts_an_int_or_nvmls_structure(value):
    nv = bench_energy.Nvml.__new__(bench_energy.Nvml)
    nv.handle = object()
    nv.nvml = types.SimpleNamespace(device_get_temperature_v=lambda h, s: value,
                                    TemperatureSensors=types.SimpleNamespace(GPU=0))
    assert nv.temperature() == 57


def test_a_failing_temperature_keeps_its_first_reason():
    def boom(h, s):
        raise RuntimeError("no sensor")
    nv = bench_energy.Nvml.__new__(bench_energy.Nvml)
    nv.handle = object()
    nv.nvml = types.SimpleNamespace(device_get_temperature_v=boom, TemperatureSensors=types.SimpleNamespace(GPU=0))
    assert nv.temperature() is None and nv.temperature() is None
    assert nv.temperature_error == "RuntimeError: no sensor"


def test_variants_refuse_a_name_given_twice(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text('{"variants": {"u8": {}}, "cases": []}')
    with pytest.raises(SystemExit, match="given twice"):
        bench_energy._variant_trees(f"{plan}:u8,{plan}:u8")
    with pytest.raises(SystemExit, match="PLAN.json:NAME"):
        bench_energy._variant_trees("u8")
