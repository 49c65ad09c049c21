"""``cugemm8 warmup --shapes FILE``: put every kernel the shapes need (and
the quantisers) in cugemm8's disk cache (``$CUPY_CACHE_DIR/cugemm8``), so
later processes load them without compiling.

* On a Hopper GPU: loads each kernel, compiling what the cache lacks.
* ``--compile-only``: no GPU needed (CuPy and NVRTC only).  Writes the same
  entries a GPU process would (:func:`cugemm8._jit.prebuild`), for the SM
  count given by ``--num-sms`` (default 132, an H200): a container build
  step can bake a cache that a GPU machine with the same CuPy version and
  NVRTC release loads as is.
* ``--check-cache``: compiles nothing; says for each kernel whether the
  cache has it and, when not, in which key part (CuPy, NVRTC, sources,
  options) the closest entry differs.  Exit 1 if any is missing.

The shapes file format is described in :mod:`cugemm8._shapes`.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import time

from .._shapes import Shape
from ._common import (_fmt, _one_line, _positive_int, _progress, gpu_reason, load_shapes_or_report, nvrtc_reason,
                      print_table)

#: SM count the configurations are chosen for without a GPU (an H200).
DEFAULT_NUM_SMS = 132


@dataclasses.dataclass
class WarmupJob:
    name: str            # kernel name expression
    config: str
    smem: int
    shapes: list
    header: str | None = None       # None: the GEMM header of `name` (cugemm8.gemm._header_of)


def _header(job: WarmupJob) -> str:
    if job.header is not None:
        return job.header
    from .. import gemm
    return gemm._header_of(job.name)


def plan_warmup(shapes: list[Shape], num_sms: int) -> tuple[list[WarmupJob], list[str]]:
    """Distinct GEMM kernels the shapes need, and one error line per bad shape.

    A training shape (``wgrad``, ``k_grouped``) needs the 1D1D kernels the ops
    pick without ``c`` and with ``c = d`` (the TMA epilogue), and with ``c``
    another array or ``d`` not 16-byte aligned (the register epilogue); the
    choices may differ.  A normal shape with few enough rows also needs the
    kernels that quantise bf16 / fp16 / fp32 activations themselves
    (``gemm_fp8``'s one-kernel form, :func:`cugemm8.quant.one_kernel_rows`).
    A decode shape whose pick is the warp-MMA kernel also gets the
    persistent pick a reduced SM budget (``set_num_sms``) runs."""
    from .. import _config, _config_1d1d, gemm, gemm_1d1d, quant
    jobs: dict[str, WarmupJob] = {}
    errors = []
    for s in shapes:
        try:
            if s.kind in ("wgrad", "k_grouped"):
                todo = []
                for with_c, tma in ((False, True), (True, True), (True, False), (False, False)):
                    cfg = _config_1d1d.select_config(s.m, s.n, s.k, num_groups=s.num_groups, num_sms=num_sms,
                                                     with_c=with_c, tma_store=tma)
                    gt = gemm_1d1d._GROUPED_K if s.kind == "k_grouped" else gemm_1d1d._NORMAL
                    todo.append((gemm_1d1d._kernel_name(cfg, s.n, gt, s.num_groups), cfg, gemm_1d1d._HEADER))
            else:
                # The pick on the whole device and under a reduced budget
                # (set_num_sms): they differ where the warp-MMA kernel,
                # which is not persistent, is the first.
                todo = []
                for warp_mma in (True, False):
                    cfg = _config.select_config(s.kind, s.m, s.n, s.k, num_groups=s.num_groups, num_sms=num_sms,
                                                warp_mma=warp_mma)
                    todo.append((gemm._kernel_name(cfg, s.n, s.k, gemm._GEMM_TYPE[s.kind], s.num_groups), cfg, None))
                    for dtype, item in (("bfloat16", 2), ("float16", 2), ("float32", 4)):
                        twin = (_config.quant_a_config(cfg, s.k, item, num_sms=num_sms)
                                if s.kind == "normal" else None)
                        if twin is not None and 1 <= s.m <= quant.one_kernel_rows(twin, item, s.k):
                            todo.append((gemm._kernel_name(twin, s.n, s.k, 0, 1, dtype), twin, f"{dtype} in"))
        except Exception as exc:
            errors.append(f"{s.kind} {s.label()}: {type(exc).__name__}: {exc}")
            continue
        for name, cfg, header in todo:
            if header is not None and header.endswith(" in"):           # gemm_fp8's one-kernel form
                label, header = f"{cfg} {header}", None
            else:
                label = f"1d1d {cfg}" if header is not None else str(cfg)   # the training kernel: another family
            job = jobs.setdefault(name, WarmupJob(name, label, cfg.smem_bytes, [], header=header))
            if f"{s.kind} {s.label()}" not in job.shapes:
                job.shapes.append(f"{s.kind} {s.label()}")
    return list(jobs.values()), errors


def quant_jobs() -> list[WarmupJob]:
    """The quantiser kernels (forward and transposing casts, every input
    dtype, with and without pow2 scales; the per-column transposing cast of
    16-bit inputs also in its one-round configuration)."""
    from .. import quant
    return [WarmupJob(quant.kernel_name(kind, dtype, pow2, cfg),
                      f"quant {kind} {dtype}{' pow2' if pow2 else ''}{f' {cfg.label()}' if cfg else ''}",
                      0, ["quantiser"], header=quant._HEADER)
            for kind, dtype, pow2, cfg in quant.launched_kernels()]


def _compile_only(job: WarmupJob) -> tuple[float, str]:
    """Compile ``job`` into the disk cache without a GPU: (seconds, detail)."""
    from .. import _jit
    res = _jit.prebuild(_header(job), job.name)
    return res.seconds, f"{res.status}, {res.size / 1024:.0f} KiB cubin"


def _load_on_gpu(job: WarmupJob, device_id: int = 0) -> tuple[float, str]:
    import cupy
    from .. import _jit
    t0 = time.perf_counter()
    with cupy.cuda.Device(device_id):   # worker threads start on device 0
        kern = _jit.get_kernel(_header(job), job.name, max_dynamic_smem=job.smem)
    dt = time.perf_counter() - t0
    return dt, f"{kern.num_regs} regs, {kern.local_size_bytes} B local"


def key_summary() -> str:
    """The machine-independent parts of this machine's cache keys (what a
    prebuilt cache must match): CuPy, NVRTC, the cuda_src hash."""
    import cupy
    from .. import _jit
    return f"CuPy {cupy.__version__}, NVRTC {_jit.nvrtc_release()}, cuda_src {_jit.source_hash()[:12]}"


def _run_jobs(jobs: list[WarmupJob], worker, max_workers: int, title: str) -> list[tuple]:
    """(job, seconds, detail, error) per job, in order, with a progress bar."""
    def run(job):
        try:
            dt, detail = worker(job)
            return job, dt, detail, None
        except Exception as exc:
            return job, float("nan"), "", _one_line(f"{type(exc).__name__}: {exc}")[:300]

    advance, close = _progress(len(jobs), title)
    outcomes: dict[int, tuple] = {}
    try:
        if len(jobs) > 1 and max_workers > 1:
            # NVRTC releases the GIL and _jit locks per kernel: builds run in parallel.
            from concurrent.futures import ThreadPoolExecutor, as_completed
            with ThreadPoolExecutor(max_workers=max_workers) as pool:
                futures = {pool.submit(run, job): i for i, job in enumerate(jobs)}
                for fut in as_completed(futures):
                    outcomes[futures[fut]] = out = fut.result()
                    advance(out[0].config, _progress_line(out))
        else:
            for i, job in enumerate(jobs):
                outcomes[i] = out = run(job)
                advance(job.config, _progress_line(out))
    finally:
        close()
    return [outcomes[i] for i in range(len(jobs))]


def _progress_line(outcome) -> str:
    job, dt, detail, err = outcome
    return f"{job.config}: {'FAILED: ' + err if err else detail} ({_fmt(dt, '.1f')} s)"


def _check_cache(shapes: list[Shape], args) -> int:
    """``--check-cache``: which kernels the disk cache has, and why not."""
    from .. import _jit
    try:
        importlib.import_module("cupy")
    except Exception as exc:
        print(f"cugemm8 warmup: CuPy is not importable ({_one_line(exc)})", file=sys.stderr)
        return 2
    num_sms = args.num_sms
    if not num_sms:
        from .. import _device
        num_sms = _device.get_num_sms() if gpu_reason() is None else DEFAULT_NUM_SMS
    jobs, errors = plan_warmup(shapes, num_sms)
    if not args.no_quant:
        jobs += quant_jobs()
    directory = _jit.cache_dir()
    rows, hits = [], 0
    for job in jobs:
        try:
            parts, _, hit = _jit.lookup(_header(job), job.name)
            status = "hit" if hit is not None else "MISS: " + _jit.explain_miss(directory, parts)
        except Exception as exc:
            hit, status = None, f"FAILED: {_one_line(f'{type(exc).__name__}: {exc}')[:300]}"
        hits += hit is not None
        rows.append((job.config, status, "; ".join(job.shapes)))
    title = (f"cugemm8 warmup --check-cache: {hits} of {len(jobs)} kernels in {directory} "
             f"(grid for {num_sms} SMs; keys here: {key_summary()})")
    print_table(title, ("config", "status", "shapes"), rows)
    for line in errors:
        print(f"cugemm8 warmup: bad shape: {line}", file=sys.stderr)
    return 0 if hits == len(jobs) and not errors else 1


def cmd_warmup(args) -> int:
    shapes = load_shapes_or_report(args.shapes, "warmup")
    if shapes is None:
        return 2
    if args.check_cache:
        return _check_cache(shapes, args)
    if args.compile_only:
        reason = nvrtc_reason()
        if reason is not None:
            print(f"cugemm8 warmup: cannot compile sm_90a kernels here: {reason}", file=sys.stderr)
            return 2
        from .. import _jit
        if not _jit.disk_cache_enabled():
            print("cugemm8 warmup: --compile-only writes the disk cache, but CUGEMM8_DISABLE_CACHE or "
                  "CUPY_CACHE_IN_MEMORY is set", file=sys.stderr)
            return 2
        num_sms = args.num_sms or DEFAULT_NUM_SMS
        worker = _compile_only
    else:
        reason = gpu_reason()
        if reason is not None:
            print(f"cugemm8 warmup: no usable Hopper GPU: {reason} "
                  "(use --compile-only to compile without one)", file=sys.stderr)
            return 2
        import cupy
        from .. import _device
        num_sms = args.num_sms or _device.get_num_sms()
        device_id = cupy.cuda.Device().id
        worker = lambda job: _load_on_gpu(job, device_id)   # noqa: E731
    jobs, errors = plan_warmup(shapes, num_sms)
    if not args.no_quant:
        jobs += quant_jobs()
    t0 = time.perf_counter()
    outcomes = _run_jobs(jobs, worker, args.jobs or min(len(jobs), os.cpu_count() or 1), "cugemm8 warmup")
    rows, failed = [], len(errors)
    for job, dt, detail, err in outcomes:
        failed += err is not None
        rows.append((job.config, _fmt(dt, ".2f"), "ok" if err is None else f"FAILED: {err}",
                     detail, "; ".join(job.shapes)))
    ok = sum(err is None for _, _, _, err in outcomes)
    from .. import _jit
    if args.compile_only:
        done = f"written to {_jit.cache_dir()} without a GPU ({key_summary()})"
    else:
        done = f"loaded on the GPU (cache {_jit.cache_dir()})"
    title = (f"cugemm8 warmup: {ok} of {len(jobs)} kernels {done} for {len(shapes)} shapes "
             f"in {time.perf_counter() - t0:.1f} s (grid for {num_sms} SMs)")
    print_table(title, ("config", "seconds", "status", "detail", "shapes"), rows)
    for line in errors:
        print(f"cugemm8 warmup: bad shape: {line}", file=sys.stderr)
    return 1 if failed else 0


SHAPES_HELP = ("FILE: a JSON list of {\"kind\": \"normal\"|\"contiguous\"|\"masked\"|\"wgrad\"|"
               "\"k_grouped\", \"m\", \"n\", \"k\", \"num_groups\"}, or text with one shape per line, "
               "'kind m n k [num_groups]' ('#' starts a comment); m is m_sum for contiguous and expected_m "
               "for masked; wgrad and k_grouped (the training GEMMs) give the FP32 output [m, n] (per "
               "group) and k tokens in all (a multiple of 128 for k_grouped).  Or a preset: @check / "
               "@check-quick (the shapes `cugemm8 check` (--quick) runs), @normal, @decode, @grouped.")


def register(sub) -> None:
    p = sub.add_parser(
        "warmup", help="compile the kernels a list of shapes needs into the disk cache",
        description="Put every kernel the shapes need, and the quantisers, in cugemm8's disk cache "
                    "($CUPY_CACHE_DIR/cugemm8): loaded (or compiled) on the GPU, or with --compile-only "
                    "compiled without a GPU into entries that a GPU machine with the same CuPy version and "
                    "NVRTC release loads without compiling.  " + SHAPES_HELP)
    p.add_argument("--shapes", required=True, metavar="FILE", help="shapes file or a preset (see above)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--compile-only", action="store_true",
                      help="compile with NVRTC into the disk cache, no GPU needed (a prebuilt cache)")
    mode.add_argument("--check-cache", action="store_true",
                      help="compile nothing: report which kernels the cache has and, for the others, "
                           "which key part (CuPy, NVRTC, sources, options) differs")
    p.add_argument("--num-sms", type=_positive_int, default=0,
                   help=f"SM count the configs are chosen for (default: the GPU's, or {DEFAULT_NUM_SMS}, "
                        "an H200, without one)")
    p.add_argument("--no-quant", action="store_true", help="leave out the quantiser kernels")
    p.add_argument("--jobs", type=_positive_int, default=0, help="parallel builds (default: CPUs)")
    p.set_defaults(func=cmd_warmup)
