#!/usr/bin/env bash
# One device call: the sampler and engine on CUDA (tests), the engine-view sampler comparison
# (FlashInfer too when its wheels are carried in .whl/), and the 1.5B-shape engine bench against
# transformers. Parts: all (default) | tests | compare | engine. Logs under $OUT (or ./.out).
set -uo pipefail
OUT=${OUT:-.out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=$PYTHONPATH:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp
fi
part=${1:-all}
if [ "$part" = all ] || [ "$part" = tests ]; then
timeout 170 python3 -m pytest -q -m "gpu or not gpu" tests/test_sampler_cuda.py tests/test_engine_gpu.py \
    tests/test_kernels_step_ops.py -p no:cacheprovider > "$OUT/pytest_gpu.log" 2>&1
echo "pytest rc=$?"; tail -4 "$OUT/pytest_gpu.log"
fi
if [ "$part" = all ] || [ "$part" = compare ]; then
timeout 240 python3 -m tpsample.cli bench sampler --compare --rows 256 1024 --vocab 151936 --steps 20 \
    > "$OUT/compare.log" 2>&1; echo "compare rc=$?"; grep -v "^{" "$OUT/compare.log" | tail -24
fi
if [ "$part" = all ] || [ "$part" = engine ]; then
timeout 180 python3 -m tpsample.cli bench engine --device cuda --preset qwen2-1.5b \
    --strategies replicated,vocab_parallel > "$OUT/engine.log" 2>&1; echo "engine rc=$?"; tail -25 "$OUT/engine.log"
fi
