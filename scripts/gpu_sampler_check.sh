#!/usr/bin/env bash
# One device call: sampler correctness on CUDA, then the engine-view comparison and a host profile.
# Writes logs under $OUT (set by the device tool) or ./.out.
set -uo pipefail
OUT=${OUT:-.out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
if [ -d .whl ]; then   # optional anchors (FlashInfer) carried as wheels
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=$PYTHONPATH:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp
    timeout 60 python3 -c "import flashinfer.sampling as fs; print('flashinfer', fs.__name__)" 2>&1 | tail -2
fi
# full-size kernel correctness (tokens vs the torch reference on the GPU)
timeout 240 python3 -m tpsample.kernels.gpu_check > "$OUT/gpu_check.log" 2>&1; echo "gpu_check rc=$?"; tail -3 "$OUT/gpu_check.log"
# sampler paths on CUDA
timeout 300 python3 -m pytest -q -m "gpu or not gpu" tests/test_sampler_cuda.py tests/test_kernels_step_ops.py \
    tests/test_kernels_sample.py tests/test_kernels_stats.py -p no:cacheprovider > "$OUT/pytest_gpu.log" 2>&1
echo "pytest rc=$?"; tail -3 "$OUT/pytest_gpu.log"
timeout 300 python3 -m tpsample.cli bench sampler --compare --rows 256 1024 --vocab 151936 --steps 20 \
    > "$OUT/compare.log" 2>&1; echo "compare rc=$?"; cat "$OUT/compare.log" | tail -40
timeout 120 python3 scripts/profile_sampler_host.py > "$OUT/profile.log" 2>&1; echo "profile rc=$?"; head -60 "$OUT/profile.log"
