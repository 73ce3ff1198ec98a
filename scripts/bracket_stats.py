"""Per-row statistics of the top-p bracket on a GPU (top-p 0.9 alone, randn * 3, T 0.8): the
bracket's first and last bins and its count (quantiles over the rows), how many rows have every
entry from the bracket up as candidates (the bracket then reaches the top bin), and per-kernel
device times, for a few launch settings.
    python scripts/bracket_stats.py [rows]
"""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from tune_kernels import args_for, per_kernel

from tpsample.kernels import launcher
from tpsample.kernels.config import KernelConfig
from tpsample.kernels.dispatch import sample_rows


def main():
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    a = args_for("topp", rows, 151936, torch.Generator("cuda").manual_seed(1))
    for name, cfg in (("default", KernelConfig()), ("all0", KernelConfig(bracket_all=0)),
                      ("p32", KernelConfig(programs_per_sm=32))):
        launcher._SCRATCH.clear()
        sample_rows(*a, cfg=cfg)
        torch.cuda.synchronize()
        ws = next(v for k, v in launcher._SCRATCH.items() if k[2][0] == "sample")
        q = lambda t: [round(float(v), 1) for v in torch.quantile(t.double(), torch.tensor([0, .1, .5, .9, 1.0], dtype=torch.float64, device=t.device))]
        top = int(cfg.hist_bins) - 1
        print(f"{name}: rows at the top bin {int((ws.blast == top).sum())} of {rows}; first {q(ws.bfirst)} "
              f"last {q(ws.blast)} count {q(ws.bcount)}")
        print("   ", per_kernel(lambda cfg=cfg: sample_rows(*a, cfg=cfg)))


if __name__ == "__main__":
    main()
