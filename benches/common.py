"""Timing helpers shared by the benchmarks: L2 flush, CUDA-event timing, CUPTI
kernel times and spans, the copy ceiling, and the cuBLASLt blockwise-FP8
baseline through PyTorch.

Method (docs/benchmarks.md "Method"): kernel time only, CUDA events
around each launch, median of many repetitions, a 256 MB write before each
repetition so every launch starts with a cold L2, warm-up calls first (they
include the JIT compile), inputs built once outside the timed loop.

Nothing here asserts: failures become report fields.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time

import cupy as cp

FLUSH_BYTES = 256 << 20          # > the H200's 60 MB L2
COPY_BYTES = 2 << 30             # copy-ceiling buffer
BASELINE_REL_LIMIT = 1e-2        # baseline marked 'wrong' above this relative error


# ----------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------

class L2Flush:
    """Overwrites ``nbytes`` of device memory on the current stream when called."""

    def __init__(self, nbytes: int = FLUSH_BYTES):
        self.buf = cp.empty(nbytes, dtype=cp.uint8)
        self.value = 0

    def __call__(self) -> None:
        # 1..255, never 0: CuPy fills with 0 by a memset, under another name
        # than its fill kernel, and kernel_times tells flushes apart by name.
        self.value = self.value % 255 + 1
        self.buf.fill(self.value)


def make_flush(kind: str = "write"):
    """The L2 flush a bench uses before each repetition: ``'write'``
    (:class:`L2Flush`, the default, DeepGEMM's method: L2 left full of dirty
    lines) or ``'read'`` (a 256 MB read leaving clean lines, closer to a
    decode step in a model: ``cugemm8 tune --flush read``'s, from
    :func:`cugemm8.cli.make_l2_flush`).  Measured on the H200
    (benches/RESULTS.md v0.16): the swap-AB decode kernel at 1x4096x7168
    takes 12.42 us after a write and 10.30 after a read, the 1D2D pick 12.38
    and 12.29."""
    if kind not in ("write", "read"):
        raise ValueError(f"flush must be 'write' or 'read', got {kind!r}")
    if kind == "write":
        return L2Flush()
    from cugemm8.cli import make_l2_flush
    return make_l2_flush(cp, FLUSH_BYTES, kind="read")


@dataclasses.dataclass
class Timing:
    """Kernel times in microseconds over the repetitions."""
    samples: list

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how noisy the repetitions were."""
        s = sorted(self.samples)
        lo, hi = s[len(s) // 10], s[min(len(s) - 1, (len(s) * 9) // 10)]
        return (hi - lo) / self.median if self.median > 0 else float("nan")


def time_calls(fns, *, reps: int, warmup: int, flush) -> Timing:
    """Time a sequence of launches per repetition.

    Each repetition: ``flush()``, then every ``fn`` of ``fns`` between its own
    pair of CUDA events; the repetition's time is the sum of those intervals
    (launch gaps between the calls are not counted).  One callable times a
    single kernel; several time a per-group loop.
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    cp.cuda.get_current_stream().synchronize()
    events = [[(cp.cuda.Event(), cp.cuda.Event()) for _ in fns] for _ in range(reps)]
    for rep in events:
        if flush is not None:
            flush()
        for fn, (start, end) in zip(fns, rep):
            start.record()
            fn()
            end.record()
    events[-1][-1][1].synchronize()
    samples = [sum(cp.cuda.get_elapsed_time(s, e) for s, e in rep) * 1e3 for rep in events]
    return Timing(samples)


def time_call(fn, *, reps: int, warmup: int, flush) -> Timing:
    return time_calls([fn], reps=reps, warmup=warmup, flush=flush)


def kernel_times(fns, *, reps: int, flush) -> Timing | None:
    """GPU kernel durations per repetition from CUPTI, through ``torch.profiler``.

    DeepGEMM's ``bench_kineto`` method, which its published figures (the
    anchors in docs/benchmarks.md) use: each repetition is ``flush()`` then
    every ``fn``; its time is the summed duration of every GPU activity
    (kernels and memsets, e.g. cuBLAS's workspace memset) between two
    flushes, launch latency excluded.  The flush's own activities are
    identified by their names, taken from profiling ``flush()`` alone.
    CUDA-event times (:func:`time_calls`) also count the GPU's launch latency
    of each kernel, about 3 µs on the H200 (benches/RESULTS.md, v0.4).

    Returns None when torch (with CUDA) is not importable or nothing was
    recorded.
    """
    reps_seen = _profiled_reps(fns, reps=reps, flush=flush)
    if reps_seen is None:
        return None
    samples = [total for total in (sum(dur for _, dur in acts) for acts in reps_seen) if total]
    return Timing(samples) if samples else None


def kernel_spans(fns, *, reps: int, flush) -> Timing | None:
    """GPU time spans per repetition from CUPTI, through ``torch.profiler``.

    Profiled like :func:`kernel_times` (each repetition ``flush()`` then
    every ``fn``; the flush's activities told apart by name), but a
    repetition's value is the span, in µs, from the start of its first
    non-flush GPU activity to the end of its last one: gaps between kernels
    count (the dependent-launch latency that PDL hides) and kernels that
    overlap count once.  So that host time between launches is not measured
    as GPU gaps, the GPU is first held by a spin kernel long enough for the
    host to enqueue every repetition (5 ms + 3 x the host time of an
    unprofiled repetition per repetition, at most 2 s, as
    examples/tensor_parallel.py's ``time_on_stream``); when that kernel
    cannot be built the repetitions run unheld.

    Returns None when torch (with CUDA) is not importable or nothing was
    recorded.
    """
    if load_torch()[0] is None or flush is None:
        return None
    cp.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    flush()
    for fn in fns:
        fn()
    host_s = time.perf_counter() - t0
    reps_seen = _profiled_reps(fns, reps=reps, flush=flush, hold_s=min(2.0, 0.005 + 3.0 * reps * host_s))
    if reps_seen is None:
        return None
    samples = [max(start + dur for start, dur in acts) - min(start for start, _ in acts)
               for acts in reps_seen if acts]
    return Timing(samples) if samples else None


_hold_state: dict = {}


def _hold_gpu():
    """``spin(seconds)`` of examples/tensor_parallel.py (one thread sleeping on
    the global timer keeps the current stream busy), loaded from its file and
    built on first use; None when it cannot be loaded, built or run."""
    if "spin" not in _hold_state:
        import importlib.util
        from pathlib import Path
        try:
            path = Path(__file__).resolve().parent.parent / "examples" / "tensor_parallel.py"
            spec = importlib.util.spec_from_file_location("_cugemm8_example_tp", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            mod.spin(0.0)
            _hold_state["spin"] = mod.spin
        except Exception:  # no example file or no NVRTC: measure unheld
            _hold_state["spin"] = None
    return _hold_state["spin"]


def kernel_times_alternating(named_fns: dict, *, reps: int, flush) -> dict | None:
    """CUPTI kernel times of several callables measured in one profiled
    sequence, alternating: repetition ``r`` runs ``flush()`` then one
    callable, for each callable in turn, in an order rotated by ``r`` (for
    two, A B, B A, A B, ...), so that the GPU's clock drift over the run
    and the position after another library's kernel weigh on each callable
    alike.  A value is the summed duration of the activities between two
    flushes, as in :func:`kernel_times`.

    Returns ``{name: Timing}`` (``reps`` samples each), or None when torch
    (with CUDA) is not importable or nothing was recorded.
    """
    names = list(named_fns)
    order = [names[(r + i) % len(names)] for r in range(reps) for i in range(len(names))]
    slots = _profiled_slots([[named_fns[name]] for name in order], flush=flush)
    if slots is None or len(slots) != len(order):
        return None
    samples: dict = {name: [] for name in names}
    for name, acts in zip(order, slots):
        total = sum(dur for _, dur in acts)
        if total:
            samples[name].append(total)
    if not all(samples.values()):
        return None
    return {name: Timing(v) for name, v in samples.items()}


def _profiled_reps(fns, *, reps: int, flush, hold_s: float = 0.0):
    """The GPU activities of ``reps`` repetitions of ``flush()`` then every
    ``fn``: :func:`_profiled_slots` with the same callables in every slot."""
    return _profiled_slots([fns] * reps, flush=flush, hold_s=hold_s)


def _profiled_slots(slots, *, flush, hold_s: float = 0.0):
    """The GPU activities of one ``flush()`` then every callable of the slot,
    for each slot of ``slots`` in turn, profiled with CUPTI through
    ``torch.profiler``: per slot the list of ``(start_us, duration_us)`` of
    each activity after its flush, the flush's own activities (named as when
    profiling ``flush()`` alone) left out.  With ``hold_s`` the GPU is first
    held that many seconds (:func:`_hold_gpu`).  None when torch (with CUDA)
    is not importable, ``flush`` is None or the flush recorded nothing."""
    torch, _ = load_torch()
    if torch is None or flush is None:
        return None
    import warnings

    from torch.profiler import ProfilerActivity, profile
    # torch warns once that a profiler "clears events at the end of each cycle"; harmless here.
    warnings.filterwarnings("ignore", message=".*Profiler clears events", category=UserWarning)

    def gpu_events(prof):
        out = []
        for e in prof.events():
            dev = getattr(e, "device_type", None)
            if dev is not None and str(dev).endswith("CUDA"):
                out.append((e.time_range.start, e.time_range.elapsed_us(), e.name))
        return sorted(out)

    hold = _hold_gpu() if hold_s > 0 else None     # built before anything is profiled
    cp.cuda.runtime.deviceSynchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        flush()
        cp.cuda.runtime.deviceSynchronize()
    flush_names = {name for _, _, name in gpu_events(prof)}
    if not flush_names:
        return None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if hold is not None:              # before the first flush: in no repetition
            hold(hold_s)
        for fns in slots:
            flush()
            for fn in fns:
                fn()
        cp.cuda.runtime.deviceSynchronize()
    reps_seen, current = [], None
    for start, dur, name in gpu_events(prof):
        if name in flush_names:
            if current is not None:
                reps_seen.append(current)
            current = []
        elif current is not None:
            current.append((start, dur))
    if current is not None:
        reps_seen.append(current)
    return reps_seen


def _time_copy(nbytes: int, reps: int) -> Timing:
    src = cp.empty(nbytes, dtype=cp.uint8)
    dst = cp.empty(nbytes, dtype=cp.uint8)
    src.fill(1)
    return time_call(lambda: dst.data.copy_from_device_async(src.data, nbytes),
                     reps=reps, warmup=2, flush=None)


def copy_bandwidth_gbps(nbytes: int = COPY_BYTES, reps: int = 10) -> float:
    """Device-to-device copy rate in GB/s (cudaMemcpyAsync of ``nbytes``),
    counting bytes read + written."""
    t = _time_copy(nbytes, reps)
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / t.median / 1e3


def geomean(values) -> float:
    vals = [v for v in values if v is not None and v == v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")


def rel_error(got, ref) -> float:
    """Relative Frobenius error ||got - ref|| / ||ref|| in float64."""
    got = got.astype(cp.float64)
    den = float(cp.linalg.norm(ref))
    return float(cp.linalg.norm(got - ref)) / den if den else float(cp.linalg.norm(got))


# ----------------------------------------------------------------------------
# cuBLASLt blockwise FP8 through PyTorch
# ----------------------------------------------------------------------------

_torch_state: dict = {}


def load_torch():
    """(torch, api) where api is 'F.scaled_mm' (v2) or 'torch._scaled_mm' (v1),
    or (None, reason) when no usable torch is importable."""
    if "result" in _torch_state:
        return _torch_state["result"]
    try:
        import torch
        import torch.nn.functional as F
        if not torch.cuda.is_available():
            result = (None, "torch sees no CUDA device")
        elif hasattr(F, "scaled_mm") and hasattr(F, "ScalingType") \
                and hasattr(F.ScalingType, "BlockWise1x128"):
            result = (torch, "F.scaled_mm")
        elif hasattr(torch, "_scaled_mm"):
            result = (torch, "torch._scaled_mm")
        else:
            result = (None, f"torch {torch.__version__} has no scaled_mm")
    except Exception as exc:  # ImportError or a broken CUDA install
        result = (None, f"torch not importable ({type(exc).__name__}: {exc})")
    _torch_state["result"] = result
    return result


def torch_version() -> str:
    torch, api = load_torch()
    return f"torch {torch.__version__} ({api})" if torch is not None else api


def _rows4_fp8_operand(torch, x, sf):
    """An FP8 operand ``x`` uint8 [rows, k] with 1x128 scales ``sf`` [rows, kb]
    as torch views cuBLASLt's blockwise path reads: ``x`` as float8_e4m3fn
    rows (copied into a buffer of rows rounded up to 4 when rows % 4 != 0
    or it is not contiguous) and ``sf`` as [rows_pad, kb] with strides (1,
    rows_pad) (rows contiguous, zeros in the padding).  Returns (t_x,
    t_sf, CuPy buffers the views alias)."""
    rows, k = x.shape
    kb = sf.shape[1]
    rows_pad = -(-rows // 4) * 4
    if rows % 4 or not x.flags.c_contiguous:
        buf = cp.zeros((rows_pad, k), dtype=cp.uint8)
        buf[:rows] = x
    else:
        buf = x
    s = cp.zeros((kb, rows_pad), dtype=cp.float32)
    s[:, :rows] = sf.T
    return torch.from_dlpack(buf).view(torch.float8_e4m3fn), torch.from_dlpack(s).t(), [buf, s]


def torch_blockwise_gemm(a, sfa, b, sfb):
    """A no-argument callable computing ``(A * SFA) (B * SFB)^T`` in bf16 with
    cuBLASLt's blockwise FP8 path, on the SAME bytes as cugemm8.

    Arguments are CuPy arrays: ``a`` uint8 [m, k] (e4m3 bits, rows contiguous),
    ``sfa`` float32 [m, kb] (any layout), ``b`` uint8 [n, k], ``sfb`` float32
    [nb, kb].  The callable returns the torch bf16 output [m_pad, n]
    (m_pad = m rounded up to 4; rows >= m are padding).

    Layout (docs/benchmarks.md; torch 2.11 `_scaled_mm` v1 misreads an unpadded scale pitch):
    * A is shared through DLPack (copied to an m_pad-row buffer only when
      m % 4 != 0) and viewed as float8_e4m3fn;
    * ``scale_a`` [m_pad, kb] token-contiguous (strides (1, m_pad));
    * ``mat_b`` = B^T, a column-major [k, n] view of B's bytes;
    * v2 ``F.scaled_mm``: ``scale_b`` = P^T where P is float32
      [nb, round_up(kb, 4)] holding sfb (zeros in the pitch padding): shape
      [round_up(kb, 4), nb], strides (1, round_up(kb, 4)) - the shape v2
      demands and the pitch cuBLASLt reads;
    * v1 ``torch._scaled_mm``: ``scale_b`` = sfb^T [kb, nb], strides (1, kb);
      silently wrong when kb % 4 != 0 (A1) - the caller's check catches it.
    The scale tensors and padded copies are built here, once.

    Raises RuntimeError (with the reason) when torch is unusable.
    """
    torch, api = load_torch()
    if torch is None:
        raise RuntimeError(api)
    kb, nb = sfa.shape[1], sfb.shape[0]
    kb_pad = -(-kb // 4) * 4
    fp8 = torch.float8_e4m3fn
    # A and its scales [m_pad, kb], strides (1, m_pad); keep: the CuPy buffers the torch views alias
    t_a, t_sa, keep = _rows4_fp8_operand(torch, a, sfa)
    t_b = torch.from_dlpack(cp.ascontiguousarray(b)).view(fp8).t()   # [k, n] column-major
    if api == "F.scaled_mm":
        F = torch.nn.functional
        sb = cp.zeros((nb, kb_pad), dtype=cp.float32)
        sb[:, :kb] = sfb
        keep.append(sb)
        t_sb = torch.from_dlpack(sb).t()                   # [kb_pad, nb], strides (1, kb_pad)
        recipe_a, recipe_b = F.ScalingType.BlockWise1x128, F.ScalingType.BlockWise128x128

        def run():
            return F.scaled_mm(t_a, t_b, t_sa, recipe_a, t_sb, recipe_b, output_dtype=torch.bfloat16)
    else:
        sb = cp.ascontiguousarray(sfb)
        keep.append(sb)
        t_sb = torch.from_dlpack(sb).t()                   # [kb, nb], strides (1, kb)

        def run():
            return torch._scaled_mm(t_a, t_b, t_sa, t_sb, out_dtype=torch.bfloat16)
    run.keep = keep
    return run


def torch_blockwise_1x128_gemm(a, sfa, b, sfb):
    """cuBLASLt's blockwise FP8 GEMM with 1x128 scales on both operands (the
    1D1D recipe: the training backward's weight gradient), BF16 out, on the
    SAME bytes as cugemm8's ``fp8_gemm_nt``: ``a`` uint8 [m, k], ``sfa``
    float32 [m, kb], ``b`` uint8 [n, k], ``sfb`` float32 [n, kb] (CuPy, any
    scale layout).  torch's v2 ``F.scaled_mm`` only (``ScalingType.BlockWise1x128``
    for both); each scale is passed as its operand's rows-contiguous
    [rows_pad4, kb] view (strides (1, rows_pad4)), the layout
    :func:`torch_blockwise_gemm` uses for A's.  cuBLASLt writes BF16 only
    here, so its output is compared with cugemm8's FP32 one at BF16
    precision.  Raises RuntimeError when torch or the v2 API is unusable."""
    torch, api = load_torch()
    if torch is None:
        raise RuntimeError(api)
    if api != "F.scaled_mm":
        raise RuntimeError(f"needs torch's v2 F.scaled_mm (found {api})")
    F = torch.nn.functional
    t_a, t_sa, keep_a = _rows4_fp8_operand(torch, a, sfa)     # [m_pad, k]; scales [m_pad, kb]
    t_b, t_sb, keep_b = _rows4_fp8_operand(torch, b, sfb)     # [n_pad, k]; scales [n_pad, kb]
    t_b = t_b.t()                                              # [k, n_pad] column-major
    keep = keep_a + keep_b
    r = F.ScalingType.BlockWise1x128

    def run():
        return F.scaled_mm(t_a, t_b, t_sa, r, t_sb, r, output_dtype=torch.bfloat16)
    run.keep = keep
    return run


def torch_to_f64(t, rows: int):
    """float64 CuPy copy of the first ``rows`` rows of a torch bf16 tensor."""
    return cp.from_dlpack(t[:rows].float().contiguous()).astype(cp.float64)


def release_memory() -> None:
    """Return cached device memory of CuPy (and torch, if loaded)."""
    cp.get_default_memory_pool().free_all_blocks()
    torch, _ = _torch_state.get("result", (None, None))
    if torch is not None:
        torch.cuda.empty_cache()


def parse_nk(parser, text: str) -> list:
    """The (N, K) pairs of a ``--nk`` option, written ``NxK`` and separated
    by commas (``'2112x7168,7168x2048'``); ``parser.error`` (exit 2) for
    anything else: no pair, or a pair that is not two positive integers."""
    try:
        pairs = [tuple(int(v) for v in pair.lower().split("x")) for pair in text.split(",") if pair]
    except ValueError:
        pairs = []
    if not pairs or any(len(pair) != 2 or min(pair) < 1 for pair in pairs):
        parser.error(f"--nk: NxK pairs of positive integers separated by commas, e.g. '2112x7168,7168x2048', "
                     f"got {text!r}")
    return pairs


def compile_kernels(jobs, header_of) -> dict:
    """Build every kernel of ``jobs`` ({name expression: dynamic shared
    memory bytes}) before timing, 16 at a time (NVRTC releases the GIL), into
    CuPy's cache: ``header_of(name)`` gives each one's header.  Returns
    {name: error text} for the ones that failed (the others are built)."""
    from concurrent.futures import ThreadPoolExecutor

    from cugemm8 import _jit
    failed = {}

    def build(item):
        name, smem = item
        try:
            _jit.get_kernel(header_of(name), name, max_dynamic_smem=smem)
        except Exception as exc:          # reported, not raised: a sweep goes on
            failed[name] = f"{type(exc).__name__}: {exc}"[:200]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(build, jobs.items()))
    return failed


def add_run_args(parser, ms_default, *, ms_help: str = "M values", dg_help: str = "time DeepGEMM beside") -> None:
    """The options every same-run bench shares: ``--ms``, ``--reps``,
    ``--passes``, ``--deepgemm`` and ``--json``."""
    parser.add_argument("--ms", default=",".join(map(str, ms_default)), help=ms_help)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--deepgemm", action="store_true", help=dg_help)
    parser.add_argument("--json", default=None, metavar="OUT")
