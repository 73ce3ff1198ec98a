"""Runs `sample_rows` a few times on one case, for a hardware profiler to attach to.

    CASE=topp ROWS=256 ncu --kernel-name regex:round_kernel ... python scripts/ncu_step.py
CASE is one of scripts/tune_kernels.py's cases; the calls run after a warm-up that compiles
every kernel, between `cudaProfilerStart` / `Stop` (so `ncu --profile-from-start off` sees only
them)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from tune_kernels import args_for

from tpsample.kernels.dispatch import sample_rows


def main():
    case, rows = os.environ.get("CASE", "topp"), int(os.environ.get("ROWS", "256"))
    a = args_for(case, rows, 151936, torch.Generator("cuda").manual_seed(1))
    for _ in range(3):
        sample_rows(*a)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(int(os.environ.get("CALLS", "2"))):
        sample_rows(*a)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
