#!/usr/bin/env bash
# One GPU machine's worth of validation and measurement (used with the one-GPU H200 machine):
# kernel correctness at full size, the TP strategy tests on CUDA tensors (ranks share the GPU
# over gloo), the sampler and kernel benchmarks. Logs go to $OUT (or ./gpu_out).
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
part=${1:-all}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"; } 2>&1 | tee "$OUT/env.txt"
if [ "$part" = all ] || [ "$part" = check ]; then
  timeout 240 python3 -m tpsample.kernels.gpu_check 2>&1 | tee "$OUT/gpu_check.txt"
  TPSAMPLE_TEST_DEVICE=cuda timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_tp_strategies.py 2>&1 | tee "$OUT/tp_cuda.txt"
fi
if [ "$part" = all ] || [ "$part" = bench ]; then
  timeout 300 python3 -m tpsample.cli bench sampler --device cuda --tp 1 2 4 --rows 256 --vocab 151936 \
      --steps 5 --plot "$OUT/bench_sampler_cuda.png" 2>&1 | tee "$OUT/bench_sampler_cuda.txt"
  timeout 400 python3 -m tpsample.cli bench kernels ${KERNEL_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_kernels.txt"
fi
