#!/usr/bin/env bash
# One device call: the CUDA sampler tests and the engine-view comparison (FlashInfer when carried).
set -uo pipefail
OUT=${OUT:-.out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=$PYTHONPATH:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp
fi
timeout 100 python3 -m pytest -q -m "gpu or not gpu" tests/test_sampler_cuda.py tests/test_kernels_step_ops.py \
    -p no:cacheprovider > "$OUT/pytest_gpu.log" 2>&1; echo "pytest rc=$?"; tail -3 "$OUT/pytest_gpu.log"
timeout 120 python3 -m tpsample.cli bench sampler --compare --rows 256 1024 --vocab 151936 --steps 20 \
    > "$OUT/compare.log" 2>&1; echo "compare rc=$?"; grep -v "^{" "$OUT/compare.log" | tail -22; grep "^{" "$OUT/compare.log"
