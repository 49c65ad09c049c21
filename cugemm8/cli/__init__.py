"""The ``cugemm8`` command line (also ``python -m cugemm8``).

One module per subcommand, plus what they share:

``check`` (the default; :mod:`.check`)
    Runs every DeepSeek-V3 normal-GEMM shape (M in 1, 64, 128, 4096) plus one
    contiguous and one masked grouped shape on random data, checks each result
    against a float64 reference of the dequantised operands, times it, prints
    a table and exits 1 if any shape fails (2 when no Hopper GPU is usable).
``info`` (:mod:`.info`)
    Versions, the GPU, the kernel cache and whether sm_90a kernels can be
    compiled and run here.  Works without a GPU; always exits 0.
``bench [...]`` (:mod:`.bench`)
    Forwards to ``benches/bench_gemm.py`` (present in a source checkout);
    exits 2 without a GPU (unless ``--from-json``), for a bad ``--from-json``
    file, or when ``--plot`` cannot plot.
``warmup --shapes FILE [--compile-only | --check-cache]`` (:mod:`.warmup`)
    Puts every kernel the shapes in FILE need (and the quantisers) in
    cugemm8's disk cache.  ``--compile-only`` needs no GPU and writes entries
    a GPU machine with the same CuPy and NVRTC loads without compiling (a
    prebuilt cache); ``--check-cache`` reports what is cached and why not.
``configs [--shapes FILE] [--num-sms N]`` (:mod:`.configs`)
    Prints the heuristic's kernel configuration (tile, stages, multicast,
    split K, grid, shared memory, waves) for the benchmark shapes or the
    shapes in FILE.  Pure Python: no GPU needed.

Shared: :mod:`cugemm8._shapes` (the DeepSeek-V3 table, :class:`Shape`, the
shapes-file parser), :mod:`._data` (test data, float64 references, running
and timing the ops), :mod:`._common` (probes, tables, progress).

Importing this package is cheap: CuPy and the GEMM code are imported inside
the functions that need them.  The data and reference helpers
(:func:`make_operands`, :func:`reference`, :func:`calc_diff`,
:func:`gemm_bytes`) work on NumPy as well as CuPy arrays (argument ``xp``);
``benches/`` uses them too (imported from here), so the benchmarks and the
check see the same data.
"""
from __future__ import annotations

from .._shapes import CHECK_MS, DEEPSEEK_NK, Shape, check_shapes, load_shapes
from ._common import (_ceil_div, _fmt, _numeric, _one_line, _positive_int, _progress, gpu_reason,
                      nvrtc_reason, print_table)
from ._data import (BLOCK, DIFF_LIMIT, E4M3_MAX, MIN_AMAX, MMA_K, POISON_BITS, TC_MANTISSA_BITS,
                    _group_parts, _group_sizes, Rng, matmul_nt, _ref_and_bound_rows, _ref_rows, bf16_to_f64,
                    calc_diff, config_string, dequantize, e4m3_values, encode_e4m3, gemm_bytes, gemm_bytes_1d1d,
                    gemm_call, gemm_flops, k_group_slices, make_l2_flush, make_operands, out_to_f64,
                    poisoned_out, quantize_blocks, random_quantized, reference, time_us, valid_rows)
from .check import CHECK_COLUMNS, CheckResult, _check_row, _check_values, check_one, cmd_check
from .info import _cuda_version, _dir_usage, _dist_version, _gpu_lines, _try, cache_dir, cmd_info, info_lines
from .bench import bench_script, cmd_bench
from .warmup import WarmupJob, _compile_only, _load_on_gpu, cmd_warmup, plan_warmup, quant_jobs
from .configs import cmd_configs
from ._main import SUBCOMMANDS, build_parser, main

__all__ = [
    "CHECK_COLUMNS", "CHECK_MS", "BLOCK", "CheckResult", "DEEPSEEK_NK", "DIFF_LIMIT", "E4M3_MAX",
    "MIN_AMAX", "MMA_K", "POISON_BITS", "SUBCOMMANDS", "Shape", "TC_MANTISSA_BITS", "WarmupJob",
    "bench_script", "bf16_to_f64", "build_parser", "cache_dir", "calc_diff", "check_one", "check_shapes",
    "cmd_bench", "cmd_check", "cmd_configs", "cmd_info", "cmd_warmup", "config_string", "dequantize",
    "e4m3_values", "encode_e4m3", "gemm_bytes", "gemm_bytes_1d1d", "gemm_call", "gemm_flops", "gpu_reason",
    "info_lines", "k_group_slices", "load_shapes", "main", "make_l2_flush", "make_operands", "nvrtc_reason",
    "out_to_f64", "plan_warmup", "poisoned_out",
    "print_table", "quant_jobs", "quantize_blocks", "random_quantized", "reference", "time_us", "valid_rows",
    # private helpers the benches and tests use
    "_ceil_div", "_check_row", "_check_values", "_compile_only", "_cuda_version", "_dir_usage",
    "_dist_version", "_fmt", "_gpu_lines", "_group_parts", "_group_sizes", "_load_on_gpu", "Rng", "matmul_nt",
    "_numeric", "_one_line", "_positive_int", "_progress", "_ref_and_bound_rows", "_ref_rows", "_try",
]
