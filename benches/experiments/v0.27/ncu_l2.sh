#!/bin/bash
# The Nsight Compute part of the call behind ncu_l2_base.txt / ncu_l2_band16n.txt (the greps in those files are of its output).
set -u
tar xzf .anchors/deepgemm-54e2261-h200.tgz -C /tmp
export PYTHONPATH=/tmp/DeepGEMM:$PWD CUDA_HOME=/usr/local/cuda DG_JIT_CACHE_DIR=/tmp/dg_jit
export PATH=/usr/local/cuda/bin:$PATH
M="sm__cycles_elapsed.max,smsp__inst_executed.sum,lts__t_sectors_op_read.sum,dram__bytes_read.sum,lts__t_sectors_op_read_lookup_hit.sum,lts__t_sectors_op_read_lookup_miss.sum,regex:lts__t_sectors_srcunit_.*_op_read.sum,regex:lts__t_sectors_srcnode_.*_op_read.sum,regex:lts__t_requests_srcunit_tex_op_read.sum"
ncu --query-metrics --chip gh100 2>&1 | grep -E "^lts__t_(sectors|requests)_src" | head -60 > $OUT/lts_metrics.txt
RUNS=1 python3 tools/perf/forced_gemm.py 4096 7168 16384 deepgemm > /dev/null 2>&1
RUNS=1 ncu --clock-control none -k regex:fp8_gemm --metrics $M python3 tools/perf/forced_gemm.py 4096 7168 16384 "256x128 s3 c2A" "256x128 s3" deepgemm > $OUT/ncu_l2_base.txt 2>&1
RUNS=1 VARIANT=benches/experiments/v0.27/plan_band16n.json:band16n ncu --clock-control none -k regex:fp8_gemm --metrics $M python3 tools/perf/forced_gemm.py 4096 7168 16384 "256x128 s3 c2A" > $OUT/ncu_l2_band16n.txt 2>&1
