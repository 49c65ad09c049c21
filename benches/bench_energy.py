"""Energy per GEMM under sustained load, beside DeepGEMM (issue 20; one GPU call).

    python benches/bench_energy.py [--ms 4096] [--seconds 1.0] [--rounds 2] [--deepgemm]
                                   [--configs "256x128 s3 c2,..."] [--nk 2112x7168,...]
                                   [--variants PLAN.json:NAME,...] [--json OUT]

At M = 4096 both libraries run against the H200's power cap, so the clock a
kernel is allowed and the joules it spends per GEMM decide its speed more
than its cycle count at a fixed clock.  For each normal DeepSeek-V3 shape
(M x the six (N, K) pairs) this runs each library's GEMM back to back for
``--seconds`` (no L2 flush: a sustained loop, as in a prefill), alternating
the libraries ``--rounds`` times (A B A B: drift and heating hit both), and
reports per library the median over rounds of

* µs per GEMM (GPU time between CUDA events recorded inside the loop,
  after its first 0.3 s, divided by the calls between them);
* mean power (W): NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
  millijoules, through ``cuda.bindings.nvml``), polled while the loop runs,
  between two of its updates at least ``--seconds`` apart, over the host
  time between them (see ``sustained``: a window with arbitrary ends was
  off by up to one counter step, about 100 ms of energy, at each end);
* J per GEMM (mean power x µs per GEMM), TFLOPS, TFLOPS per watt
  (= 2 m n k per joule / 1e12), and the SM clock (NVML, sampled every 20 ms
  while the loop runs, median);
* what held the clock down: NVML's clock-event reasons
  (``nvmlDeviceGetCurrentClocksEventReasons``, sampled with the clock) as
  the share of samples each reason was set in (``SWpow`` the software power
  cap, ``HWslow`` hardware slowdown, ``brake`` the power brake, ``SWtherm`` /
  ``HWtherm`` thermal), and the GPU temperature (median, °C).  A kernel that
  runs at a lower clock than another at lower mean power is held by
  something other than the power cap's average.

``--configs`` adds forced cugemm8 configurations ('BMxBN sS [w1] [c2|c2B|k2|k4]',
``c2`` multicasting A; each with the largest legal grid, skipped where
illegal) as further entries of the alternation, e.g. to decide a multicast
on energy and sustained time rather than on one cold-L2 reading.
``--variants`` adds kernel *source variants* of
``tools/perf/variant_sweep.py`` plans (``PLAN.json:NAME``: the plan's
replacements applied to a copy of ``cuda_src/``): each runs the pick and
every ``--configs`` entry compiled from its tree, named ``+NAME`` in the
table, in the same alternation (a kernel change decided on sustained loops
and joules, as issue 20 asks).  The variants launch through the prepared
launch path of ``--configs``, the plain ``cugemm8`` row through the public
call: to compare like with like, give the pick's config in ``--configs``
too.
Every library's output is checked against the float64 reference first;
only a variant its plan marks ``"unchecked": true`` (a probe whose results
are knowingly wrong, e.g. the K loop without its WGMMAs) runs whatever its
check says, labelled so in the JSON's status.  A
device without NVML's energy counter (or without ``cuda.bindings.nvml``)
gets times only.  DeepGEMM (``--deepgemm``) needs its tree on PYTHONPATH
(``../shared/anchors/README.md``).  Reports; never asserts.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(1, str(_HERE.parent))

import common  # noqa: E402
from cugemm8._shapes import DEEPSEEK_NK  # noqa: E402
from cugemm8.cli import Shape, bf16_to_f64, calc_diff, make_operands, poisoned_out, print_table, reference  # noqa: E402

CHECK_LIMIT = 1e-3


class Nvml:
    """The current CUDA device's NVML handle (matched by PCI bus id), or a
    reason why there is none."""

    def __init__(self, cp):
        self.handle, self.reason = None, None
        try:
            from cuda.bindings import nvml
            nvml.init_v2()
            self.nvml = nvml
            self.handle = nvml.device_get_handle_by_pci_bus_id_v2(cp.cuda.Device().pci_bus_id)
            self.energy_mj()
        except Exception as exc:         # no NVML, or no energy counter on this device
            self.handle, self.reason = None, f"{type(exc).__name__}: {exc}"

    def energy_mj(self) -> int:
        return self.nvml.device_get_total_energy_consumption(self.handle)

    def sm_mhz(self) -> int:
        return self.nvml.device_get_clock_info(self.handle, self.nvml.ClockType.CLOCK_SM)

    def reasons(self) -> int | None:
        """The clock-event reasons' bitmask now, or None where NVML has none."""
        try:
            return int(self.nvml.device_get_current_clocks_event_reasons(self.handle))
        except Exception:
            return None

    def temperature(self) -> int | None:
        """GPU temperature in °C, or None; the first failure's reason is kept
        in ``temperature_error`` (reported in the JSON)."""
        try:
            t = self.nvml.device_get_temperature_v(self.handle, self.nvml.TemperatureSensors.GPU)
            return int(getattr(t, "temperature", t))     # an nvmlTemperature_v1_t or a plain int
        except Exception as exc:
            if getattr(self, "temperature_error", None) is None:
                self.temperature_error = f"{type(exc).__name__}: {exc}"
            return None


# NVML clock-event reason bits (nvml.h, nvmlClocksEventReason*) by short name.
REASONS = (("SWpow", 0x4), ("HWslow", 0x8), ("SWtherm", 0x20), ("HWtherm", 0x40), ("brake", 0x80),
           ("board", 0x200), ("rel", 0x400))


def reasons_text(shares: dict) -> str:
    """'SWpow 95%' style text of the reasons set in any sample."""
    return " ".join(f"{k} {v * 100:.0f}%" for k, v in shares.items() if v > 0) or "none"


# The sustained loop is issued in chunks of about CHUNK_S of GPU work, each
# followed by an event, with LEAD_S of work in flight: the host stays free to
# poll NVML while the GPU never runs dry.  (With 8 chunks of 2 ms in flight,
# the first version ran dry about ten times a second, once per update of the
# energy counter: some NVML call stalls the host for longer than that, and
# the GPU idled 2-4 % of the loop; benches/RESULTS.md v0.37.)  WARM_S of the loop runs
# before the window opens (the clock and the power controller settle, and the
# window never starts on the first kernels).  EDGE_WAIT_S: how long past
# ``seconds`` to wait for the energy counter's closing update before giving
# no energy reading.  SAMPLE_S: clock / reason / temperature sampling period.
CHUNK_S, LEAD_S, WARM_S, EDGE_WAIT_S, SAMPLE_S = 0.002, 0.1, 0.3, 1.0, 0.02


class _Pump:
    """Keeps ``fn`` running back to back on the GPU in chunks of ``chunk``
    calls, each followed by a recorded event, with at most ``depth`` chunks
    in flight; ``top_up`` is called between the host's NVML polls."""

    def __init__(self, cp, fn, chunk: int, depth: int):
        self.cp, self.fn, self.chunk, self.depth = cp, fn, chunk, depth
        self.events: list = []     # one per chunk, in issue order
        self.done = 0              # events[:done] are known complete
        self.starved = 0           # top-ups that found nothing in flight (the GPU may have idled)

    def completed(self) -> int:
        """How many chunks are complete now (events[:n])."""
        while self.done < len(self.events) and self.events[self.done].done:
            self.done += 1
        return self.done

    def top_up(self) -> None:
        if self.events and self.completed() == len(self.events):
            self.starved += 1
        while len(self.events) - self.done < self.depth:
            for _ in range(self.chunk):
                self.fn()
            ev = self.cp.cuda.Event()
            ev.record()
            self.events.append(ev)

    def us_per_call(self, first: int, last: int) -> float:
        """µs per call between the ends of chunks ``first`` and ``last`` (GPU time)."""
        self.events[last].synchronize()
        calls = (last - first) * self.chunk
        return self.cp.cuda.get_elapsed_time(self.events[first], self.events[last]) * 1e3 / calls


def sustained(cp, fn, seconds: float, nv: Nvml, *, clock=time.perf_counter) -> dict:
    """Run ``fn`` back to back for about ``seconds`` (after WARM_S): µs per
    call, J per call, mean W and the median SM clock sampled meanwhile.

    The energy window opens and closes on updates of NVML's energy counter,
    not at arbitrary times.  The counter advances in steps (about every
    100 ms on recent NVIDIA GPUs, and on A100/H100 from a power sensor that
    samples a quarter of the time: Yang, Adamek and Armour, "Accurate and
    Convenient Energy Measurements for GPUs", SC24, arXiv:2312.02741; the
    ML.ENERGY blog's "Thermally stable profiling" measured the same 100 ms),
    so a window with arbitrary ends misses or gains up to one step at each
    end: with 1 s loops, up to about 10 % of the energy.  This bench's
    earlier loops (n calls from an idle, synchronised GPU) read one kernel
    anywhere in a band up to 11 % wide from round to round at a steady time
    per GEMM (benches/RESULTS.md v0.37; most of that went with the
    continuous loop, the rest with the alignment).  Here the GPU runs
    ``fn`` throughout; the host polls the counter meanwhile, opens the
    window at the first change after WARM_S and closes it at the first
    change at least ``seconds`` later; the energy between two updates is
    that of the time between them (the host times of the two changes, a
    constant sensor lag cancelling).  µs per call is measured over the
    chunks that completed between the same two changes, and J per call =
    that mean power x µs per call.  The unaligned reading over the same loop
    (the counter read at the window's nominal start and end) is kept as
    ``watts_unaligned`` to show the difference.  A counter that does not
    change gives no energy reading; the loop still runs ``seconds`` (plus
    EDGE_WAIT_S waiting for it) and is timed."""
    fn()
    cp.cuda.runtime.deviceSynchronize()
    # The chunks are sized on GPU time per call (host launch time is not
    # what keeps the GPU busy).
    t0, e0, e1 = clock(), cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    for _ in range(10):
        fn()
    e1.record()
    e1.synchronize()
    per = cp.cuda.get_elapsed_time(e0, e1) / 1e3 / 10 or (clock() - t0) / 10
    chunk = max(1, int(CHUNK_S / max(per, 1e-7)))
    pump = _Pump(cp, fn, chunk, max(2, round(LEAD_S / (chunk * max(per, 1e-7)))))
    clocks, reasons, temps = [], [], []
    t_start = clock()
    while clock() - t_start < WARM_S:
        pump.top_up()
    first_chunk = len(pump.events)
    t_open = clock()
    pump.starved = 0                   # from here on, a dry queue would be inside the window
    host_gap = nvml_call = 0.0         # the longest host pause between top-ups, and NVML energy read
    out: dict = {}
    if nv.handle:
        e_nominal = prev = nv.energy_mj()
        nominal_end = None             # (host time, counter) at the first poll after t_open + seconds
        edges = []                     # (host time, counter, chunks complete) at each observed change
        next_sample = last_top_up = t_open
        while True:
            t_top = clock()
            host_gap = max(host_gap, t_top - last_top_up)
            pump.top_up()
            last_top_up = clock()
            e = nv.energy_mj()
            now = clock()
            nvml_call = max(nvml_call, now - last_top_up)
            if nominal_end is None and now - t_open >= seconds:
                nominal_end = (now, e)
            if e != prev:
                edges.append((now, e, pump.completed()))
                prev = e
                if len(edges) >= 2 and now - edges[0][0] >= seconds:
                    break
            if now >= next_sample:
                clocks.append(nv.sm_mhz())
                reasons.append(nv.reasons())
                temps.append(nv.temperature())
                next_sample = now + SAMPLE_S
            # A counter that does not move: give up EDGE_WAIT_S after the
            # window should have opened, or closed.
            if now - (edges[0][0] if edges else t_open) - seconds > EDGE_WAIT_S:
                break
        if len(edges) >= 2 and edges[-1][0] - edges[0][0] >= seconds:
            (ta, ea, ca), (tb, eb, cb) = edges[0], edges[-1]
            # the chunks complete at each change: events[ca - 1] .. events[cb - 1]
            first_chunk, last_chunk = max(ca - 1, 0), cb - 1
            out["watts"] = (eb - ea) / 1e3 / (tb - ta)
            out["window_s"] = tb - ta
            gaps = [b[0] - a[0] for a, b in zip(edges, edges[1:])]
            out["nvml_update_ms"] = statistics.median(gaps) * 1e3
        else:
            last_chunk = len(pump.events) - 1
        if nominal_end is not None and nominal_end[1] > e_nominal:
            out["watts_unaligned"] = (nominal_end[1] - e_nominal) / 1e3 / (nominal_end[0] - t_open)
    else:
        while clock() - t_open < seconds:
            pump.top_up()
        last_chunk = len(pump.events) - 1
    last_chunk = max(last_chunk, first_chunk + 1)
    while len(pump.events) <= last_chunk:      # a window shorter than two chunks
        pump.top_up()
    out["us"] = pump.us_per_call(first_chunk, last_chunk)
    out["calls"] = (last_chunk - first_chunk) * pump.chunk
    out["starved"] = pump.starved
    out["host_gap_max_ms"] = host_gap * 1e3
    out["nvml_energy_call_max_ms"] = nvml_call * 1e3
    out["lead_ms"] = pump.depth * pump.chunk * per * 1e3   # nominal: from the first 10 calls' GPU time
    cp.cuda.runtime.deviceSynchronize()
    if "watts" in out:
        out["j"] = out["watts"] * out["us"] * 1e-6
    if nv.handle:
        out["mhz"] = statistics.median(clocks) if clocks else None
        bits = [r for r in reasons if r is not None]
        if bits:
            out["reasons"] = {name: sum(1 for r in bits if r & bit) / len(bits) for name, bit in REASONS}
        t = [x for x in temps if x is not None]
        if t:
            out["temp_c"] = statistics.median(t)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ms", default="4096", help="M values")
    p.add_argument("--seconds", type=float, default=1.0, help="length of each sustained loop")
    p.add_argument("--rounds", type=_positive_int, default=2, help="alternations of the libraries per shape")
    p.add_argument("--deepgemm", action="store_true", help="time DeepGEMM's fp8_gemm_nt beside")
    p.add_argument("--configs", default="", help="forced cugemm8 configs to run too, comma-separated")
    p.add_argument("--nk", default="", help="only these (N, K) pairs, e.g. '2112x7168,7168x2048' (default: all six)")
    p.add_argument("--variants", default="",
                   help="kernel source variants to run too, 'PLAN.json:NAME,...' (tools/perf/variant_sweep.py plans)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    nk_pairs = common.parse_nk(p, args.nk) if args.nk else list(DEEPSEEK_NK[:6])
    from cugemm8 import _device
    reason = _device.gpu_unavailable_reason()
    if reason is not None:
        print(f"no usable Hopper GPU ({reason}): nothing to time")
        return 2
    import cupy as cp
    import cugemm8
    import sweep_configs
    from cugemm8 import gemm as G
    nv = Nvml(cp)
    variants = _variant_trees(args.variants)
    texts = [t.strip() for t in args.configs.split(",") if t.strip()]
    if nv.handle is None:
        print(f"no NVML energy counter ({nv.reason}): times only")
    dg = None
    if args.deepgemm:
        import deepgemm_anchor
        if deepgemm_anchor.load()[0] is None:
            print(deepgemm_anchor.load()[1])
        else:
            dg = deepgemm_anchor
    records, rows = [], []
    for m in (int(x) for x in args.ms.split(",") if x):
        for n, k in nk_pairs:
            shape = Shape("normal", m, n, k)
            ops = make_operands(shape, cp, seed=m + n + k)
            ref, _ = reference(ops, shape, cp)
            sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
            out = poisoned_out(shape, ops, cp)
            libs, status, probes = {}, {}, set()   # probes: the unchecked variants' library names

            def add(name, key, fn, got, ref=ref, unchecked=False):
                """Run ``fn`` once, check ``got()`` against the reference,
                and keep ``fn`` as library ``name`` if right, or if it is an
                ``unchecked`` probe variant (``status[key]``)."""
                fn()
                cp.cuda.runtime.deviceSynchronize()
                d = calc_diff(got(), ref, cp)
                status[key] = "ok" if d < CHECK_LIMIT else f"{'unchecked' if unchecked else 'FAIL'} {d:.1e}"
                if d < CHECK_LIMIT or unchecked:
                    libs[name] = fn
                    if unchecked:
                        probes.add(name)

            def ours(out=out, ops=ops, sfa=sfa):
                cugemm8.gemm_fp8_fp8_bf16_nt((ops["a"], sfa), (ops["b"], ops["sfb"]), out)
            add("cugemm8", "cugemm8", ours, lambda: bf16_to_f64(out, cp))
            pick = cugemm8.get_gemm_config("normal", m, n, k)
            for vname, ctx, unchecked in [("", None, False)] + variants:
                with (ctx() if ctx else contextlib.nullcontext()):
                    for text in ([None] if ctx else []) + texts:
                        cfg = pick if text is None else sweep_configs.parse_config(text, shape,
                                                                                     cugemm8.get_num_sms())
                        # '+NAME', not '[NAME]': rich would read brackets as markup and drop them.
                        suffix = f" +{vname}" if vname else ""
                        label = f"{cfg}{suffix}" if cfg is not None else f"{text}{suffix}"
                        if cfg is None:
                            status[label] = "not legal"
                            continue
                        o = poisoned_out(shape, ops, cp)
                        launch = G._prepare_launch(cfg, "normal", n, k, 1, m, m, ops["a"], sfa, ops["b"],
                                                   ops["sfb"], o, None, 1)
                        add(f"cugemm8 {label}", label, launch, lambda o=o: bf16_to_f64(o, cp), unchecked=unchecked)
            if dg is not None:
                try:
                    run = dg.gemm_nt(ops["a"], sfa, ops["b"], ops["sfb"])
                    add("deepgemm", "deepgemm", run, lambda: common.torch_to_f64(run.out, m))
                except Exception as exc:
                    status["deepgemm"] = f"error {type(exc).__name__}: {exc}"[:80]
            del ref
            runs = {name: [] for name in libs}
            for _ in range(args.rounds):
                for name, fn in libs.items():
                    runs[name].append(sustained(cp, fn, args.seconds, nv))
            flops = 2 * m * n * k
            med = {}
            for name, rs in runs.items():
                med[name] = {key: statistics.median(r[key] for r in rs)
                             for key in rs[0] if key != "reasons" and all(r.get(key) is not None for r in rs)}
                if all("reasons" in r for r in rs):   # mean over rounds of each round's share
                    med[name]["reasons"] = {key: statistics.mean(r["reasons"][key] for r in rs)
                                            for key, _ in REASONS}
            records.append({"m": m, "n": n, "k": k, "config": str(cugemm8.get_gemm_config("normal", m, n, k)),
                            "status": status, "probes": sorted(probes), "median": med, "runs": runs})
            for name, r in med.items():
                tf = flops / r["us"] / 1e6
                rows.append((f"{m}x{n}x{k}", name if name != "cugemm8" else f"cugemm8 ({records[-1]['config']})",
                             f"{r['us']:.1f}", f"{tf:.0f}",
                             f"{r['j'] * 1e3:.2f}" if "j" in r else "-",
                             f"{r['watts']:.0f}" if "watts" in r else "-",
                             f"{flops / r['j'] / 1e12:.2f}" if "j" in r else "-",
                             f"{r['mhz']:.0f}" if r.get("mhz") else "-",
                             reasons_text(r["reasons"]) if "reasons" in r else "-",
                             f"{r['temp_c']:.0f}" if "temp_c" in r else "-",
                             _ratio(med, name, "us", probes), _ratio(med, name, "j", probes)))
            common.release_memory()
    print_table(f"sustained loops of {args.seconds:g} s, {args.rounds} alternating rounds (medians)",
                ("shape", "library", "µs", "TFLOPS", "mJ / GEMM", "W", "TFLOPS / W", "SM MHz",
                 "clock held by", "°C", "time xDG", "energy xDG"), rows)
    for key, label in (("us", "time"), ("j", "energy")):
        x = [r["median"]["deepgemm"][key] / r["median"]["cugemm8"][key] for r in records
             if key in r["median"].get("deepgemm", {}) and key in r["median"].get("cugemm8", {})]
        if x:
            print(f"geomean DeepGEMM / cugemm8 {label}: {common.geomean(x):.3f} over {len(x)} "
                  f"(min {min(x):.3f}; > 1: cugemm8 {'faster' if key == 'us' else 'spends less'})")
    spread, update_ms = power_spread(records), counter_update_ms(records)
    if spread:
        print("power spread over rounds (max / min - 1, median over the entries): "
              + ", ".join(f"{k} {v * 100:.1f} %" for k, v in spread.items())
              + (f"; NVML energy counter updated every {update_ms:.0f} ms (median)" if update_ms else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": args.seconds, "rounds": args.rounds,
                                               "nvml": nv.reason or "ok",
                                               "temperature_error": getattr(nv, "temperature_error", None),
                                               "records": records}, indent=1))
    return 0


def _variant_trees(text: str) -> list:
    """[(name, context factory, unchecked)] for 'PLAN.json:NAME,...': each
    variant's ``cuda_src/`` copy (tools/perf/variant_sweep.py's make_tree, in
    a temporary directory kept for the process), the context that points the
    JIT at it while launches are prepared, and whether its plan marks it
    ``unchecked``."""
    out = []
    if not text.strip():
        return out
    import atexit
    import shutil
    import tempfile
    sys.path.insert(2, str(_HERE.parent / "tools" / "perf"))
    from cugemm8 import _jit
    from variant_sweep import make_tree, variant
    root = Path(tempfile.mkdtemp(prefix="cugemm8_energy_variant_"))
    atexit.register(shutil.rmtree, root, True)
    for i, item in enumerate(t.strip() for t in text.split(",") if t.strip()):
        plan, _, name = item.rpartition(":")
        if not plan or not name:
            raise SystemExit(f"--variants: want PLAN.json:NAME, got {item!r}")
        if any(name == n for n, _, _ in out):
            raise SystemExit(f"--variants: the name {name!r} is given twice (the table labels rows by name)")
        spec = json.loads(Path(plan).read_text())["variants"][name]
        tree = make_tree(_jit.cuda_src_dir(), spec, root / f"{i}_{name}")
        out.append((name, lambda tree=tree, spec=spec: variant(tree, spec), bool(spec.get("unchecked", False))))
    return out


def power_spread(records: list) -> dict:
    """{'aligned': x, 'unaligned': y}: for each library entry of each shape
    with two or more rounds, max / min - 1 of its rounds' mean power, then
    the median over entries.  The same loop is measured both ways, so the
    two figures compare the estimators, not the kernels; and since a
    power-capped kernel's true mean power hardly moves between rounds, they
    measure the estimators' noise.  Unchecked probe variants (``probes``),
    which need not be power-capped, are left out."""
    out = {}
    for label, key in (("aligned", "watts"), ("unaligned", "watts_unaligned")):
        xs = []
        for r in records:
            for name, rs in r["runs"].items():
                w = [x[key] for x in rs if x.get(key)]
                if name not in r.get("probes", ()) and len(w) >= 2:
                    xs.append(max(w) / min(w) - 1)
        if xs:
            out[label] = statistics.median(xs)
    return out


def counter_update_ms(records: list) -> float | None:
    """The median over all rounds of the energy counter's median update interval (ms)."""
    xs = [x["nvml_update_ms"] for r in records for rs in r["runs"].values() for x in rs if "nvml_update_ms" in x]
    return statistics.median(xs) if xs else None


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _ratio(med: dict, name: str, key: str, probes=()) -> str:
    """DeepGEMM's figure over this cugemm8 entry's (> 1: cugemm8 ahead);
    none for an unchecked probe variant (in ``probes``)."""
    if (not name.startswith("cugemm8") or name in probes or key not in med.get("deepgemm", {})
            or key not in med[name]):
        return ""
    return f"{med['deepgemm'][key] / med[name][key]:.3f}"


if __name__ == "__main__":
    sys.exit(main())
