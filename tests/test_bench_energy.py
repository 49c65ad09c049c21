"""CPU tests of benches/bench_energy.py's host logic (fake CuPy and NVML)."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benches"))
bench_energy = pytest.importorskip("bench_energy")


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """One call per chunk, two chunks in flight: the fake GPU completes
    everything at once, so real-sized chunks would only make the tests slow."""
    monkeypatch.setattr(bench_energy, "CHUNK_S", 1e-9)
    monkeypatch.setattr(bench_energy, "LEAD_S", 1e-9)


class FakeGpu:
    """A fake CuPy whose GPU runs each call of ``fn`` in ``us`` µs of GPU
    time (events record it) and whose events are always complete."""

    def __init__(self, us: float = 100.0):
        self.t_us, self.us = 0.0, us
        gpu = self

        class Event:
            done = True

            def record(self):
                self.t = gpu.t_us

            def synchronize(self):
                pass

        self.cuda = types.SimpleNamespace(Event=Event, runtime=types.SimpleNamespace(deviceSynchronize=lambda: None),
                                          get_elapsed_time=lambda a, b: (b.t - a.t) / 1e3)

    def fn(self):
        self.t_us += self.us


class Clock:
    """Host time that advances ``step`` seconds at every reading."""

    def __init__(self, step: float = 2e-4):
        self.t, self.step = 0.0, step

    def __call__(self):
        self.t += self.step
        return self.t


class SteppedCounter:
    """NVML at a constant ``watts``, its energy counter updated every
    ``period`` s of host time (a step function, as on recent GPUs);
    ``reasons`` are returned in turn at each sample."""
    handle = object()

    def __init__(self, clock, watts: float = 700.0, period: float = 0.1, reasons=()):
        self.clock, self.watts, self.period, self.seq = clock, watts, period, list(reasons)

    def energy_mj(self):
        updates = int(self.clock.t / self.period)
        return int(updates * self.period * self.watts * 1e3)

    def sm_mhz(self):
        return 1500

    def reasons(self):
        return self.seq.pop(0) if self.seq else 0x4

    def temperature(self):
        return 61


class FrozenCounter(SteppedCounter):
    """An energy counter that never ticks."""

    def energy_mj(self):
        return 123456


@pytest.mark.parametrize("seconds", [0.25, 1.0])
def test_the_window_opens_and_closes_on_counter_updates(seconds):
    """At a constant power the aligned reading is that power (to the polling
    step), J per GEMM is power x GPU time per call, and the window lies
    between two updates at least ``seconds`` apart."""
    clock, gpu = Clock(), FakeGpu(us=100.0)
    nv = SteppedCounter(clock, watts=700.0, period=0.1)
    out = bench_energy.sustained(gpu, gpu.fn, seconds, nv, clock=clock)
    assert out["watts"] == pytest.approx(700.0, rel=2e-3), out
    assert out["us"] == pytest.approx(100.0)
    assert out["j"] == pytest.approx(out["watts"] * 100e-6)
    assert seconds <= out["window_s"] < seconds + 0.1 + 1e-3
    assert out["nvml_update_ms"] == pytest.approx(100.0, rel=1e-2)
    assert out["calls"] > 0 and out["mhz"] == 1500 and out["temp_c"] == 61


def test_the_unaligned_reading_is_off_by_up_to_a_counter_step():
    """The same loop read at arbitrary times (as this bench did before
    v0.37) misses or gains part of a step at each end; the aligned one does
    not.  Over many window phases the unaligned error reaches several
    per cent at 1 s, the aligned one stays under the polling step."""
    errs_aligned, errs_unaligned = [], []
    for phase in range(10):
        clock, gpu = Clock(), FakeGpu()
        # where in the counter's period the loop starts and ends (the old
        # loop's length was a number of calls, not a number of updates)
        clock.t = phase * 0.0137
        seconds = 1.0 + phase * 0.0091
        out = bench_energy.sustained(gpu, gpu.fn, seconds, SteppedCounter(clock, watts=700.0, period=0.1),
                                     clock=clock)
        errs_aligned.append(abs(out["watts"] / 700.0 - 1))
        errs_unaligned.append(abs(out["watts_unaligned"] / 700.0 - 1))
    assert max(errs_aligned) < 2e-3, errs_aligned
    assert max(errs_unaligned) > 0.03, errs_unaligned


def test_a_counter_that_does_not_advance_gives_no_energy_reading():
    clock, gpu = Clock(step=1e-3), FakeGpu()
    out = bench_energy.sustained(gpu, gpu.fn, 0.5, FrozenCounter(clock), clock=clock)
    assert "j" not in out and "watts" not in out and "watts_unaligned" not in out, out
    assert out["us"] == pytest.approx(100.0)      # times still come back
    assert clock.t < 0.3 + 0.5 + 2 * bench_energy.EDGE_WAIT_S + 0.1   # and it gave up


def test_without_nvml_the_loop_is_timed_only():
    clock, gpu = Clock(), FakeGpu(us=50.0)
    nv = types.SimpleNamespace(handle=None)
    out = bench_energy.sustained(gpu, gpu.fn, 0.2, nv, clock=clock)
    assert out["us"] == pytest.approx(50.0) and "watts" not in out and "mhz" not in out


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--rounds", "-1"]])
def test_no_rounds_is_refused(argv):
    """With no round, the medians would read rs[0] of an empty list (IndexError after all the set-up)."""
    with pytest.raises(SystemExit) as exc:
        bench_energy.main(argv)
    assert exc.value.code == 2


def test_clock_event_reasons_are_shares_of_the_samples():
    clock, gpu = Clock(step=1e-3), FakeGpu()
    nv = SteppedCounter(clock, reasons=[0x4, 0x4 | 0x8, 0x80, 0x1], period=0.05)
    out = bench_energy.sustained(gpu, gpu.fn, 0.2, nv, clock=clock)
    # samples every SAMPLE_S: the four listed reasons first, then SWpow alone
    r = out["reasons"]
    n = round(1 / r["HWslow"])
    assert n >= 4 and r["brake"] == pytest.approx(1 / n), r
    assert r["SWpow"] == pytest.approx((n - 2) / n) and r["SWtherm"] == 0, r
    assert bench_energy.reasons_text({"SWpow": 0.5, "HWslow": 0.25, "brake": 0.25, "SWtherm": 0}) == \
        "SWpow 50% HWslow 25% brake 25%"
    assert bench_energy.reasons_text({k: 0 for k, _ in bench_energy.REASONS}) == "none"


def test_power_spread_compares_the_two_estimators():
    runs = {"a": [{"watts": 700, "watts_unaligned": 660, "nvml_update_ms": 100},
                  {"watts": 707, "watts_unaligned": 726, "nvml_update_ms": 100}],
            "b": [{"watts": 700}]}      # one round: no spread
    spread = bench_energy.power_spread([{"runs": runs}])
    assert spread["aligned"] == pytest.approx(0.01) and spread["unaligned"] == pytest.approx(0.1)
    assert bench_energy.counter_update_ms([{"runs": runs}]) == 100


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


def test_chunks_are_sized_on_gpu_time_and_keep_lead_s_in_flight(monkeypatch):
    """With the real CHUNK_S / LEAD_S: a 100 µs kernel goes in chunks of 20
    calls (2 ms) with 50 chunks (100 ms) in flight, enough to ride out the
    host's NVML stalls, whatever the host's own launch time."""
    monkeypatch.setattr(bench_energy, "CHUNK_S", 0.002)
    monkeypatch.setattr(bench_energy, "LEAD_S", 0.1)
    clock, gpu = Clock(step=0.05), FakeGpu(us=100.0)
    out = bench_energy.sustained(gpu, gpu.fn, 0.1, types.SimpleNamespace(handle=None), clock=clock)
    assert out["lead_ms"] == pytest.approx(100.0)
    assert out["calls"] % 20 == 0 and out["us"] == pytest.approx(100.0)


class TimedGpu:
    """A fake GPU on the host's clock: a call launched at host time t runs
    from max(t, the previous call's end) for ``us`` µs; an event completes
    when the calls before it have.  Unlike FakeGpu its queue can run dry."""

    def __init__(self, clock, us: float):
        self.clock, self.us, self.end = clock, us, 0.0
        gpu = self

        class Event:
            def record(self):
                self.t = gpu.end

            @property
            def done(self):
                return gpu.clock.t >= self.t

            def synchronize(self):
                gpu.clock.t = max(gpu.clock.t, self.t)

        def sync():
            clock.t = max(clock.t, gpu.end)

        self.cuda = types.SimpleNamespace(Event=Event, runtime=types.SimpleNamespace(deviceSynchronize=sync),
                                          get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3)

    def fn(self):
        self.end = max(self.end, self.clock.t) + self.us * 1e-6


class StallingCounter(SteppedCounter):
    """A stepped counter whose read stalls the host ``stall`` s when an
    update has happened since the last read (NVML's energy read took 16-31
    ms on the H200, benches/RESULTS.md v0.37)."""

    def __init__(self, clock, stall: float, **kw):
        super().__init__(clock, **kw)
        self.stall, self.last = stall, None

    def energy_mj(self):
        e = super().energy_mj()
        if self.last is not None and e != self.last:
            self.clock.t += self.stall
            e = super().energy_mj()
        self.last = e
        return e


@pytest.mark.parametrize("lead_s, dry", [(0.016, True), (0.1, False)])
def test_a_short_lead_runs_dry_behind_nvml_stalls_and_inflates_the_time(monkeypatch, lead_s, dry):
    """With 16 ms in flight a 25 ms stall at each counter update idles the
    GPU, and the idle time lands in µs per call; with 100 ms it never runs
    dry, µs per call is the kernel's, and the timed chunks span the energy
    window (they completed between its two counter updates)."""
    monkeypatch.setattr(bench_energy, "CHUNK_S", 0.002)
    monkeypatch.setattr(bench_energy, "LEAD_S", lead_s)
    clock = Clock(step=1e-4)
    gpu = TimedGpu(clock, us=100.0)
    nv = StallingCounter(clock, stall=0.025, watts=700.0, period=0.1)
    out = bench_energy.sustained(gpu, gpu.fn, 0.5, nv, clock=clock)
    assert (out["starved"] > 0) == dry, out
    if dry:
        assert out["us"] > 105.0, out
    else:
        assert out["us"] == pytest.approx(100.0), out
        assert out["calls"] * 100e-6 == pytest.approx(out["window_s"], abs=0.03), out
        assert out["watts"] == pytest.approx(700.0, rel=0.02), out
    assert out["nvml_energy_call_max_ms"] >= 25.0
