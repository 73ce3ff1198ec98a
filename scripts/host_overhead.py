"""The host cost of a sampling call with the GPU taken out: the kernel path on CPU tensors with
every Triton launch replaced by a no-op after its launch key is computed (what the host pays
per launch minus the driver call). Per case of `bench sampler --compare`: median us of
plan() + sample() + reading the tokens, and with --profile the top functions by own time.
    python scripts/host_overhead.py [--rows 256] [--vocab 4096] [--profile]
Host work does not depend on the vocabulary (the kernels stream it on the device), so a small
vocabulary keeps the CPU's own torch ops out of the figure.
"""
import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"
os.environ["TPSAMPLE_KERNELS_ON_CPU"] = "1"

import torch  # noqa: E402

from tpsample.bench.compare import CASES, case_sampler  # noqa: E402
from tpsample.kernels import launcher  # noqa: E402


def stub_launches():
    """Launcher.__call__ computes its key as on a GPU, then returns (no interpreter run)."""
    def call(self, grid, *args, **constexprs):
        launcher.launch_key(args, constexprs, self.const_positions)
    launcher.Launcher.__call__ = call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    stub_launches()
    torch.set_num_threads(1)
    x = torch.randn(args.rows, args.vocab) * 3
    for case in CASES:
        s, ids = case_sampler(case, args.rows, args.vocab, prompt_len=min(case.prompt_len, 200))

        def call():
            out = s.sample(x, s.plan(ids))
            out.token_lists()
            if out.logprobs is not None:
                out.logprobs.token_ids  # noqa: B018

        for _ in range(5):
            call()
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e6)
        print(f"{case.name:24s} {statistics.median(times):8.0f} us")
        if args.profile:
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(50):
                call()
            pr.disable()
            pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
