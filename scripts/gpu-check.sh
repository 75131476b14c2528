#!/bin/bash
# The prepared GPU check (issues 12, 13, 24): on a machine with one NVIDIA GPU (sized for an H200:
# under 8 minutes in all, the sum of the steps' limits 180 + 75 + 60 + 25 + 45 + 50 + 40 s), build
# the CUDA binaries with `make CUDA=1` (hymoe, the parity tests, the MPI tests and the two
# benchmarks: every source file of the library compiles), run the CUDA parity tests (`make
# test-cuda`: the kernels, the fused kernels and the whole model against the CPU;
# `cuda_gemm_invariant`: the batch-invariant GEMM; `cuda_engine_tiers`: the engine with the prefix
# cache, with the file KV tier and under batch_invariant; `cuda_train`: the training pass and 20
# trainer steps), the GPU forward over 2 ranks against the CPU (`cuda_comm`: every device
# collective; `cuda_pp`: two pipeline stages; `cuda_tp`: tp = 2; `cuda_ep`: experts over ep, with
# LoRA adapters too; the ranks may share one GPU), the infer job on 2 ranks sharing the GPU at tp2
# and pp2 against one CPU rank (scripts/gpu-infer-check.sh), the GPU trainer against the CPU over
# 20 steps of a lora job and on 2 ranks sharing the GPU at tp2 and pp2 (scripts/gpu-lora-check.sh),
# the kernel benchmark (build/cuda/bench_cuda, fused kernels included) and the model benchmark
# (build/cuda/bench_cuda_model), and write a summary.
# Usage:
#   scripts/gpu-check.sh [OUT_DIR]      (default build/gpu-check)
# OUT_DIR receives summary.txt (the figures and verdicts) and one full log per step. Installs
# nothing (the build's packages must already be there). Exit 0 iff every step passed; a step
# past its time limit counts as failed and the next one still runs.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${1:-build/gpu-check}
mkdir -p "$out"
summary=$out/summary.txt
jobs=$(nproc 2>/dev/null || echo 4)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export BOOST_TEST_COLOR_OUTPUT=no
failed=0

note() { echo "$*" | tee -a "$summary"; }

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to OUT/NAME.log, note rc and time
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    [ "$rc" -ne 0 ] && failed=1
    note "== $name: rc $rc in $((SECONDS - t0)) s$([ "$rc" -eq 124 ] && echo " (timed out after $limit s)")"
    return "$rc"
}

: >"$summary"
note "gpu-check $(date -u +%FT%TZ) commit $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if command -v nvidia-smi >/dev/null; then
    note "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
else
    note "gpu: no nvidia-smi on this machine"
fi

step build 180 make -j"$jobs" CUDA=1 build/cuda/hymoe build/cuda/test_cuda build/cuda/bench_cuda \
    build/cuda/bench_cuda_model build/cuda/test_mpi
grep -E "warning:|error:|undefined reference|\*\*\*" "$out/build.log" | head -10 | tee -a "$summary"

step test-cuda 75 make --no-print-directory test-cuda NPROC="$jobs"
grep -E "FAILED|error:|^[0-9]+ passed, [0-9]+ failed" "$out/test-cuda.log" | head -20 |
    tee -a "$summary"

# the GPU forward over 2 ranks (they may share the GPU: comm:: then stages device collectives
# through host memory, as NCCL refuses two ranks on one GPU): collectives, pp, tp and ep
step cuda-mpi 60 mpirun -np 2 build/cuda/test_mpi --run_test=cuda_comm,cuda_pp,cuda_tp,cuda_ep \
    --log_level=message
grep -E "cuda_comm|cuda_pp|cuda_tp|cuda_ep|FAILED|error:" "$out/cuda-mpi.log" | head -12 |
    tee -a "$summary"

# the infer job on 2 ranks sharing the GPU (each takes half of job.device_memory) at tp2 and pp2
# against one CPU rank: tokens equal, log-probabilities within 1e-4
step infer 35 scripts/gpu-infer-check.sh "$out"
grep -E "^infer " "$out/infer.log" | tail -6 | tee -a "$summary"

# the GPU trainer against the CPU, loss by loss: 20 steps of a small lora run on one rank, then 5
# steps on 2 ranks sharing the GPU at tp2 and pp2
step lora 55 scripts/gpu-lora-check.sh "$out"
grep -E "^lora " "$out/lora.log" | tail -4 | tee -a "$summary"

step bench 40 build/cuda/bench_cuda
grep -vE "^$" "$out/bench.log" | head -40 | tee -a "$summary"

step bench-model 30 build/cuda/bench_cuda_model
grep -vE "^$" "$out/bench-model.log" | head -20 | tee -a "$summary"

note "gpu-check: $([ "$failed" -eq 0 ] && echo passed || echo FAILED)"
exit "$failed"
