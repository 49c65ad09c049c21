#!/usr/bin/env bash
# Profile forced GEMM configurations with Nsight Compute on the H200
# (clock control off: the device tool's GPU reads counters that way).
#   OUT=dir bash tools/perf/ncu_configs.sh M N K "256x128 s3" "256x128 s3 c2A" [deepgemm] ...
# (KIND=contiguous NGROUPS=G: that grouped GEMM, M rows per group; forced_gemm.py.
#  Not GROUPS: bash keeps its own GROUPS array and drops an assignment to it.)
# ("deepgemm": DeepGEMM's kernel on the same operands, its tree on PYTHONPATH.)
# Writes $OUT/ncu_[KIND_gG_]MxNxK.txt (the sections below for every launch) and prints
# the headline counters.
set -u
m=$1 n=$2 k=$3; shift 3
out=${OUT:-.}/ncu_${KIND:-normal}${NGROUPS:+_g$NGROUPS}_${m}x${n}x${k}.txt
RUNS=1 ncu --clock-control none -k regex:fp8_gemm \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section InstructionStats \
  --metrics sm__cycles_elapsed.max,smsp__inst_executed.sum,lts__t_sectors_op_read.sum,dram__bytes_read.sum \
  python3 tools/perf/forced_gemm.py "$m" "$n" "$k" "$@" > "$out" 2>&1
grep -E "calc_diff|fp8_gemm_1d2d_kernel|sm90_fp8_gemm|sm__cycles_elapsed.max|smsp__inst_executed.sum|lts__t_sectors_op_read|SM Frequency|Duration|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Compute \(SM\) Throughput|L2 Hit|Issue Slots Busy|Warp Cycles Per Issued|No Eligible" "$out" \
  | sed 's/  */ /g' | cut -c1-140
