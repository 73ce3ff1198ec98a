#!/usr/bin/env bash
# The GPU run: the benchmarks against FlashInfer 0.7.4 and the GPU tests, for a machine with one
# H200 and no internet, in two device calls of at most 10 minutes each.
#
#   scripts/gpu_run.sh [--dry-run] PLAN | PHASE...
#
# PLAN bench (call 1, needs .whl/): flashinfer (built in the background while tp runs), tp, compare
# PLAN checks (call 2):             gpu-check, tests, engine, engine-tests
# PHASEs (each under its own time limit, all inside BUDGET_S seconds, default 570; a phase that
# no longer fits is skipped and says so):
#   flashinfer    FlashInfer's JIT modules (sampling, topk) built for sm_90a, 16 jobs  -> flashinfer_build.json
#   tp            bench sampler --tp 1 2 4 8 on the one GPU, 256 rows, every feature class,
#                 randn and Zipf-like logits, vocab_parallel and batch_sharded       -> tp.json
#   compare       bench sampler --compare, 32 / 256 / 1,024 rows x V 151,936, every case,
#                 21 timed calls, against FlashInfer (the status `flashinfer` wrote)  -> compare.json
#   gpu-check     every kernel against its torch reference at full size                -> tests.tgz
#   tests         scripts/gpu_tests.sh kernels, then sampler (with the ops' GPU tests)  -> tests.tgz
#   engine        bench engine --preset qwen2-1.5b at TP 1, each strategy, beside
#                 transformers' generate                                             -> engine.json
#   engine-tests  scripts/gpu_tests.sh engine                                         -> tests.tgz
# FI_CAP, TP_CAP (seconds, default 270 each) shorten the build's and the tp phase's limits when a
# call has less than the whole budget.
# Every phase's output goes to $OUT/run.log (JSON lines too; the terminal gets everything but
# them), its exit code and seconds to $OUT/summary.txt; at most 5 files come back per call.
# Plots are drawn here afterwards from the JSON:
#   python -m tpsample.bench.plots compare compare.json compare.png   (tp for tp.json)
#
# The two device calls (repository root; .whl/ holds copies of ../shared/wheels/
# apache_tvm_ffi-0.1.11-cp312-abi3-*.whl and flashinfer074_trim.tgz, about 31 MB):
#   1. command: bash scripts/gpu_run.sh bench     carry: [".whl"]   timeout_s: 600
#   2. command: bash scripts/gpu_run.sh checks    carry: []         timeout_s: 600
# Expected: bench ~8-9.5 min (the FlashInfer build, <= 270 s, beside tp, <= 270 s; then compare,
# ~3-4 min); checks ~7-9.5 min (gpu-check ~1, tests ~4-6, engine ~3; engine-tests if time is left).
set -uo pipefail
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT=${OUT:-gpu_out}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-570}
LOG="$OUT/run.log"
SUMMARY="$OUT/summary.txt"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-150}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1     # NVLink multicast off
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-16}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer_ws}
unset TRITON_INTERPRET TPSAMPLE_KERNELS_ON_CPU

case "${1:-}" in
  bench)  phases=(flashinfer tp compare) ;;
  checks) phases=(gpu-check tests engine engine-tests) ;;
  "")     echo "usage: scripts/gpu_run.sh [--dry-run] bench | checks | PHASE..." >&2; exit 2 ;;
  *)      phases=("$@") ;;
esac
END=$((SECONDS + BUDGET_S))
FI_PID=""
FI_STARTED=0
FAILED=0
TPS=("$PY" -m tpsample.cli)

say() { echo "$*" | tee -a "$LOG"; }
left() { echo $((END - SECONDS)); }

# run NAME CAP MIN CMD...: CMD under min(CAP, seconds left - 10); skipped when less than MIN is left
run() {
  local name=$1 cap=$2 min=$3; shift 3
  local limit=$(( $(left) - 10 )); [ "$limit" -gt "$cap" ] && limit=$cap
  if [ "$DRY" = 1 ]; then
    echo "phase $name: limit ${cap}s: $(printf '%q ' "$@")"; return 0
  fi
  if [ "$limit" -lt "$min" ]; then
    say "== phase $name: skipped, ${limit}s left (needs ${min}s)"; echo "$name skipped (no time left)" >> "$SUMMARY"
    return 0
  fi
  say "== phase $name (limit ${limit}s): $*"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG" | grep --line-buffered -v '^{'
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && say "phase $name: stopped at its limit (${limit}s)"
  [ "$rc" -ne 0 ] && FAILED=1
  echo "$name rc=$rc seconds=$((SECONDS - start))" >> "$SUMMARY"
}

install_flashinfer() {
  if ls .whl/apache_tvm_ffi*.whl .whl/flashinfer074_trim.tgz >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/apache_tvm_ffi*.whl && mkdir -p /tmp/fi && tar xzf .whl/flashinfer074_trim.tgz -C /tmp/fi \
      && export PYTHONPATH="$PYTHONPATH:/tmp/fi:/tmp/site" \
      && say "FlashInfer: $("$PY" -c 'import importlib.metadata as m; print(m.version("flashinfer-python"))' 2>&1)"
  else
    say "FlashInfer: .whl/ lacks apache_tvm_ffi*.whl or flashinfer074_trim.tgz: compare runs without it"
  fi
}

phase() {
  case "$1" in
    flashinfer)   # in the background: the next phases run while nvcc compiles
      FI_STARTED=1
      local fi_cap=${FI_CAP:-270}
      local fi_cmd=("$PY" -m tpsample.bench.flashinfer --timeout $(( $(left) < fi_cap ? $(left) : fi_cap ))
                    --out "$OUT/flashinfer_build.json")
      if [ "$DRY" = 1 ]; then echo "phase flashinfer (background): $(printf '%q ' "${fi_cmd[@]}")"; return; fi
      say "== phase flashinfer (background): ${fi_cmd[*]}"
      "${fi_cmd[@]}" >> "$LOG" 2>&1 &
      FI_PID=$! ;;
    tp)           run tp "${TP_CAP:-270}" 60 "${TPS[@]}" bench sampler --tp 1 2 4 8 --device cuda --rows 256 --vocab 151936 \
                      --workload classes --logits randn zipf --strategies vocab_parallel batch_sharded --steps 3 \
                      --plot '' --out "$OUT/tp.json" ;;
    compare)      if [ -n "$FI_PID" ]; then
                    say "== waiting for the FlashInfer build"; wait "$FI_PID"; FI_PID=""
                    echo "flashinfer $(tr '\n' ' ' < "$OUT/flashinfer_build.json" 2>/dev/null | tr -s ' ')" \
                      >> "$SUMMARY"
                  fi
                  local status=()
                  if [ -f "$OUT/flashinfer_build.json" ] || { [ "$DRY" = 1 ] && [ "$FI_STARTED" = 1 ]; }; then
                    status=(--flashinfer-status "$OUT/flashinfer_build.json")
                  fi
                  run compare 400 90 "${TPS[@]}" bench sampler --compare --rows 32 256 1024 --vocab 151936 \
                      --steps 21 ${status[@]+"${status[@]}"} --plot '' --out "$OUT/compare.json" ;;
    gpu-check)    run gpu-check 120 30 "$PY" tests/gpu_check.py ;;
    tests)        run tests-kernels 240 60 env OUT="$OUT/tests" PHASE_TIMEOUT=230 PYTEST_WORKERS=4 \
                      bash scripts/gpu_tests.sh kernels
                  run tests-sampler 240 60 env OUT="$OUT/tests" PHASE_TIMEOUT=200 PYTEST_WORKERS=4 \
                      bash scripts/gpu_tests.sh sampler ;;
    engine)       run engine 240 120 "${TPS[@]}" bench engine --preset qwen2-1.5b --device cuda \
                      --strategies replicated,batch_sharded,vocab_parallel,auto --out "$OUT/engine.json" ;;
    engine-tests) run engine-tests 300 60 env OUT="$OUT/tests" PHASE_TIMEOUT=290 \
                      bash scripts/gpu_tests.sh engine ;;     # one process: the engine sizes its cache from free memory
    *) echo "unknown phase $1 (flashinfer tp compare gpu-check tests engine engine-tests)" >&2; exit 2 ;;
  esac
}

if [ "$DRY" = 0 ]; then
  mkdir -p "$OUT" "$FLASHINFER_WORKSPACE_BASE"
  : > "$SUMMARY"
  { echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) gpu_run.sh ${phases[*]} (budget ${BUDGET_S}s)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    "$PY" -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'triton', triton.__version__)" 2>&1; } | tee -a "$LOG"
  case " ${phases[*]} " in *" flashinfer "*|*" compare "*) install_flashinfer ;; esac
fi
[ "$DRY" = 1 ] && echo "budget: ${BUDGET_S}s"
for p in "${phases[@]}"; do phase "$p"; done
if [ -n "$FI_PID" ]; then wait "$FI_PID"; fi
if [ "$DRY" = 0 ]; then
  if [ -d "$OUT/tests" ]; then tar czf "$OUT/tests.tgz" -C "$OUT" tests && rm -rf "$OUT/tests"; fi
  say "== summary ($((SECONDS))s)"; tee -a "$LOG" < "$SUMMARY"
fi
exit $FAILED
