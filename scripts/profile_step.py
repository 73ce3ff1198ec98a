"""Where one sampling call's host time goes, per case of `bench sampler --compare` (CUDA).

For each case (256 x 151,936): median host us of plan(), sample() and reading the tokens;
the CUDA launches and aten ops per call (torch profiler); and the top Python functions by own
time (cProfile), eager and replayed from a CUDA graph (in-place cases sample stale buffers when replayed:
the host cost is the same).
    python scripts/profile_step.py [rows [case ...]] > profile.txt
BRIEF=1 leaves out the CPU events and the cProfile tables (timings and per-kernel device time only).
AUTO_GRAPH=0 turns the sampler's automatic graph replay off, so the eager calls are eager.
"""
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from collections import Counter

import torch

from tpsample.bench.compare import CASES, case_sampler

BRIEF = os.environ.get("BRIEF") == "1"


def timed(fn, n=30):
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out)


def launches(fn, n=5):
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    cpu, gpu, gpu_us = Counter(), Counter(), Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            gpu[e.name[:70]] += 1
            gpu_us[e.name[:70]] += e.device_time_total
        else:
            cpu[e.name[:70]] += 1
    print(f"  kernels per call: {sum(gpu.values()) / n:.1f}, device us per call {sum(gpu_us.values()) / n:.0f}")
    for name, c in gpu.most_common(40):
        print(f"    {c / n:5.1f} {gpu_us[name] / n:7.1f} us  {name}")
    if BRIEF:
        return
    print(f"  cpu events per call: {sum(cpu.values()) / n:.1f}")
    for name, c in cpu.most_common(45):
        print(f"    {c / n:5.1f}  {name}")


def hot(fn, n=50):
    if BRIEF:
        return
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(30)
    st.sort_stats("cumulative").print_stats(45)
    print("\n".join("  " + line for line in s.getvalue().splitlines() if line.strip()))


def main():
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    wanted = set(sys.argv[2:])
    vocab = 151936
    x = torch.randn(rows, vocab, device="cuda", generator=torch.Generator("cuda").manual_seed(rows)) * 3
    for case in CASES:
        if wanted and case.name not in wanted:
            continue
        s, ids = case_sampler(case, rows, vocab, x.device)
        if os.environ.get("AUTO_GRAPH") == "0":
            s.auto_graph = None
        work = x.clone()

        def full():
            out = s.sample(work, s.plan(ids))
            out.token_lists()
            if out.logprobs is not None:
                out.logprobs.token_ids  # noqa: B018
        for _ in range(5):
            full()
        plan = s.plan(ids)
        print(f"=== {case.name} ({rows} rows)")
        print(f"  plan() host us {timed(lambda: s.plan(ids)):.0f}")
        outs = []
        print(f"  sample() host us {timed(lambda: outs.append(s.sample(work, plan))):.0f}")
        print(f"  full call us {timed(full):.0f}")
        launches(full)
        hot(full)
        step = s.capture(s.plan(ids), work, reserve_tokens=400)
        rep = []
        print(f"  replay() host us {timed(lambda: rep.append(step.replay())):.0f}")
        print(f"  replay+tokens us {timed(lambda: step.replay().token_lists()):.0f}")
        launches(lambda: step.replay().token_lists())
        hot(lambda: step.replay().token_lists())
        sys.stdout.flush()


if __name__ == "__main__":
    main()
