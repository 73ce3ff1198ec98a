#!/usr/bin/env bash
# The CUDA test run, for a machine with one or more GPUs and no internet.
#
#   scripts/gpu_tests.sh [PHASE ...]     PHASE: kernels sampler engine nccl (default: all four)
#
# kernels: the Triton kernels compiled for the GPU against their torch twins, gpu-marked tests
#          included (tests/test_kernels_*.py; a new gpu-marked test goes into a phase's file list).
# sampler: the TP strategy tests with CUDA tensors (TPSAMPLE_TEST_DEVICE=cuda; the gloo ranks
#          share GPU 0), which puts the Sampler on its CUDA paths (fused kernels included), and
#          the CUDA-vs-CPU sampler tests (graphs and launch-list replays included); then the
#          ops' GPU tests (CUDA-graph capture, inductor).
# engine:  the engine tests; tpsample.LLM picks CUDA when there is one GPU per rank, so TP=1 runs
#          on the GPU, and TP=2 runs on two GPUs over NCCL when the machine has them.
# nccl:    every strategy over NCCL, one rank per GPU (tests/test_nccl.py); only with 2+ GPUs.
#
# Appends to $OUT/gpu_tests.log (everything, one line per test) and $OUT/summary.txt (one line per
# phase: name, exit code, seconds), and writes $OUT/junit_<phase>.xml. Missing optional packages
# (xgrammar, hypothesis) skip the tests that need them. Exit code: 0 when every phase that ran
# passed, else 1; 3 if pytest is absent. A phase has PHASE_TIMEOUT seconds (default 280);
# PYTEST_WORKERS=N runs a phase's tests in N processes (pytest-xdist; they share the GPU).
# scripts/gpu_run.sh runs these phases inside its device calls.
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
LOG="$OUT/gpu_tests.log"
SUMMARY="$OUT/summary.txt"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # keep NVLink multicast off
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}     # CPU references in the tests (conftest defaults to 1 thread)
unset TRITON_INTERPRET
PY=${PYTHON:-python3}
PHASE_TIMEOUT=${PHASE_TIMEOUT:-280}
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(kernels sampler engine nccl)

{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) gpu_tests.sh ${phases[*]}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "nvidia-smi: not found"
  "$PY" - <<'EOF'
import importlib, sys
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpus", torch.cuda.device_count())
for name in ("triton", "transformers", "safetensors", "xgrammar", "hypothesis", "pytest", "rich"):
    try:
        print(f"{name} {getattr(importlib.import_module(name), '__version__', '?')}")
    except Exception as e:  # absent or broken: the tests that need it skip
        print(f"{name} absent ({type(e).__name__})")
EOF
} 2>&1 | tee -a "$LOG"

if ! "$PY" -c "import pytest" 2>/dev/null; then
  echo "pytest is not installed here: carry its wheel (pip install --no-index --find-links DIR pytest)" | tee -a "$LOG"
  exit 3
fi
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$NGPU" -lt 1 ]; then
  echo "no CUDA device: nothing to run" | tee -a "$LOG"
  exit 3
fi
IGNORE=()
"$PY" -c "import hypothesis" 2>/dev/null || IGNORE+=(--ignore=tests/test_property_vocab_split.py)
XDIST=()
if [ -n "${PYTEST_WORKERS:-}" ] && "$PY" -c "import xdist" 2>/dev/null; then XDIST=(-n "$PYTEST_WORKERS"); fi

failed=0
run_phase() {   # name, then pytest arguments
  local name=$1; shift
  local start=$SECONDS
  echo "== phase $name: pytest $*" | tee -a "$LOG"
  timeout "$PHASE_TIMEOUT" "$PY" -m pytest -v -rs -p no:cacheprovider --junitxml="$OUT/junit_$name.xml" \
      ${XDIST[@]+"${XDIST[@]}"} ${IGNORE[@]+"${IGNORE[@]}"} "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && echo "phase $name: timed out after ${PHASE_TIMEOUT}s" | tee -a "$LOG"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && failed=1          # 5: nothing collected (all skipped)
  echo "$name rc=$rc seconds=$((SECONDS - start))" >> "$SUMMARY"
}

for phase in "${phases[@]}"; do
  case "$phase" in
    kernels) run_phase kernels tests/test_kernels_rng.py tests/test_kernels_stats.py tests/test_kernels_sample.py \
                 tests/test_kernels_step_ops.py tests/test_kernels_penalties.py tests/test_kernels_shard.py tests/test_kernels_shard_band.py \
                 tests/test_kernels_kept.py \
                 tests/test_attention_kernels.py \
                 -m "gpu or not gpu" ;;
    sampler) export TPSAMPLE_TEST_DEVICE=cuda
             run_phase sampler tests/test_tp_strategies.py tests/test_sampler_cuda.py -m "gpu or not gpu"
             run_phase ops tests/test_ops.py -m gpu
             unset TPSAMPLE_TEST_DEVICE ;;
    engine)  run_phase engine tests/test_engine_generate.py tests/test_engine_tp.py tests/test_engine_structured.py \
                 tests/test_engine_scheduler.py tests/test_engine_gpu.py tests/test_engine_memory.py -m "gpu or not gpu" ;;
    nccl)    if [ "$NGPU" -ge 2 ]; then
               run_phase nccl tests/test_nccl.py -m gpu
             else
               echo "== phase nccl: skipped (1 GPU)" | tee -a "$LOG"; echo "nccl skipped (1 GPU)" >> "$SUMMARY"
             fi ;;
    *) echo "unknown phase $phase (kernels, sampler, engine, nccl)" | tee -a "$LOG"; exit 2 ;;
  esac
done
echo "== summary" | tee -a "$LOG"
tee -a "$LOG" < "$SUMMARY"
exit $failed
