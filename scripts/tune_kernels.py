"""Launch-shape sweep of `sample_rows` on a GPU: device time per call for KernelConfig variants.

For each case and size and each variant that applies to it: the device time of the sampling
kernels per call (torch profiler; the host-side parameter conversions of this low-level entry
point are left out) and of each kernel, with a check that every variant gives the default's
tokens, and how many top-p rows the list kernel settled, how many the lean pass settled, and how
many fell back to the exact search.
    [CASES=topp,minp] [SKIP=b1024,p64] [VARIANTS=default,draw_w4c512] [TOKENS=f.pt] [ZIPF=1] python scripts/tune_kernels.py [rows ...]
Prints a table per size and ends with one JSON line. TOKENS=f.pt saves the default's tokens per
case and size (torch.save), to compare two versions of the code run one after the other. ZIPF=1:
Zipf-like rows (log of a Zipf law over a random permutation) instead of randn * 3."""
import json
import os
import sys

import torch

from tpsample import noise
from tpsample.kernels.config import KernelConfig, fallback_counter, lean_counter, listed_counter
from tpsample.kernels.dispatch import sample_rows

CASES = {   # temperature, top_k, top_p, min_p
    "greedy": (0.0, 0, 1.0, 0.0),
    "temperature": (0.8, 0, 1.0, 0.0),
    "topk_topp": (0.8, 50, 0.9, 0.0),
    "topp": (0.8, 0, 0.9, 0.0),
    "minp": (0.8, 0, 1.0, 0.05),
    "topp_minp": (0.7, 0, 0.9, 0.05),
    "topp95": (1.0, 0, 0.95, 0.0),
}
F = {"topp", "topk_topp", "minp", "topp_minp", "topp95"}
P = {"topp", "topp_minp", "topp95"}
VARIANTS = {
    "default": (KernelConfig(), None),
    "no_lean": (KernelConfig(lean=False), P),
    # the guessed list aiming at fewer entries a row; the list kernel's warps
    "room2048": (KernelConfig(list_room=2048), P),
    "room1536": (KernelConfig(list_room=1536), P),
    "lw4": (KernelConfig(list_warps=4), P),
    "lw8": (KernelConfig(list_warps=8), P),
    "lw16": (KernelConfig(list_warps=16), P),
    # the list kernel's registers a thread (maxnreg; the default 128, which lw4 / lw8 keep)
    "lr_none": (KernelConfig(list_regs=None), P),
    "lr96": (KernelConfig(list_regs=96), P),
    "lw16_lr64": (KernelConfig(list_warps=16, list_regs=64), P),
    # the hist pass's registers a thread (maxnreg), so more of its programs share a SM
    "hr64": (KernelConfig(hist_regs=64), P),
    "hr64_w8": (KernelConfig(hist_regs=64, hist_warps=8, hist_block=2048), P),
    "hr56": (KernelConfig(hist_regs=56), P),
    # the list's appends through 8 counters a row
    "lg8": (KernelConfig(list_groups=8), P),
    "lb1024": (KernelConfig(lean_block=1024), P),
    "nopack": (KernelConfig(list_pack=False), P),     # the list's slots claimed one atomic per entry
    "rw1": (KernelConfig(row_warps=1), F),
    "rw2": (KernelConfig(row_warps=2), F),
    "rw8": (KernelConfig(row_warps=8), F),
    "rw1_fc256": (KernelConfig(row_warps=1, lean_read_cols=256), P),
    "rw2_fc512": (KernelConfig(row_warps=2, lean_read_cols=512), P),
    "b256_p16": (KernelConfig(filter_block=256, filter_programs_per_sm=16), F),
    "scan8": (KernelConfig(scan_warps=8), {"temperature", "greedy"}),
    # the plain scan's per-step "may any entry win?" reduction inside one or two warps
    "scan1": (KernelConfig(scan_warps=1), {"temperature"}),
    "scan2": (KernelConfig(scan_warps=2), {"temperature"}),
    "scan1_c256": (KernelConfig(scan_warps=1, plain_scan_cols=256), {"temperature"}),
    "scan2_c1024": (KernelConfig(scan_warps=2, plain_scan_cols=1024), {"temperature"}),
    "plain_p32": (KernelConfig(programs_per_sm=32), {"temperature", "greedy"}),
    "draw_w4c512": (KernelConfig(draw_scan_warps=4, draw_scan_cols=512), {"temperature"}),    # the earlier shape
    "draw_c512": (KernelConfig(draw_scan_cols=512), {"temperature"}),      # one warp, 16 entries a lane
    "draw_c128": (KernelConfig(draw_scan_cols=128), {"temperature"}),
    "draw_w2c512": (KernelConfig(draw_scan_warps=2, draw_scan_cols=512), {"temperature"}),
}
SKIP = [v for v in os.environ.get("SKIP", "").split(",") if v]     # SKIP=b1024,scan8: leave these out
ONLY = [c for c in os.environ.get("CASES", "").split(",") if c]     # CASES=topp,minp: only these
PICK = [v for v in os.environ.get("VARIANTS", "").split(",") if v]  # VARIANTS=default,draw_w4c512: only these
OURS = ("scan_kernel", "select_kernel", "hist_kernel", "list_kernel", "bracket_kernel", "round_kernel",
        "finish_kernel", "drain_kernel")      # (bracket_kernel: the code before the list kernel)


def args_for(case, rows, vocab, gen):
    t, k, p, mp = CASES[case]
    if os.environ.get("ZIPF"):
        ranks = torch.argsort(torch.rand(rows, vocab, device="cuda", generator=gen), dim=1) + 1
        x = -1.1 * torch.log(ranks.float())
    else:
        x = torch.randn(rows, vocab, device="cuda", generator=gen) * 3
    dev = x.device
    lmp = float("-inf") if mp == 0 else float(torch.log(torch.tensor(mp)))
    k0, k1 = noise.row_keys(torch.arange(rows, device=dev) + 5, torch.arange(rows, device=dev), noise.SALT_DRAW)
    return (x, torch.full((rows,), t, device=dev), torch.full((rows,), k, dtype=torch.int32, device=dev),
            torch.full((rows,), p, device=dev), torch.full((rows,), lmp, device=dev), k0, k1)


def per_kernel(fn, n=10):
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.name in OURS:
            out[e.name] = out.get(e.name, 0.0) + e.device_time_total / n
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [32, 256, 1024]
    vocab = 151936
    results, tokens = [], {}
    for rows in sizes:
        print(f"=== {rows} rows x {vocab}")
        for ci, case in enumerate(CASES):
            if ONLY and case not in ONLY:
                continue
            a = args_for(case, rows, vocab, torch.Generator("cuda").manual_seed(rows * 10 + ci))
            want = sample_rows(*a)[0]
            tokens[f"{case}/{rows}"] = want.cpu()
            line, kernels = {}, {}
            for name, (cfg, cases) in VARIANTS.items():
                if (cases is not None and case not in cases) or name in SKIP or (PICK and name not in PICK):
                    continue
                counters = (listed_counter("cuda"), lean_counter("cuda"), fallback_counter("cuda"))
                before = [int(c.item()) for c in counters]
                got = sample_rows(*a, cfg=cfg)[0]
                paths = tuple(int(c.item()) - b for c, b in zip(counters, before))
                kernels[name] = per_kernel(lambda cfg=cfg: sample_rows(*a, cfg=cfg))
                kernels[name]["listed_rows, lean_rows, fallback_rows"] = paths
                line[name] = (round(sum(v for v in kernels[name].values() if isinstance(v, float)), 1),
                              bool(torch.equal(got, want)))
            best = min(line, key=lambda n: line[n][0])
            print(f"  {case:12s} " + "  ".join(f"{n}={v[0]:.0f}{'' if v[1] else '(DIFF)'}" for n, v in line.items()))
            for n in dict.fromkeys(("default", best)):
                print(f"    {n}: " + ", ".join(f"{k} {v}" for k, v in kernels[n].items()))
            results.append({"rows": rows, "case": case, "us": {n: v[0] for n, v in line.items()},
                            "same_tokens": {n: v[1] for n, v in line.items()}, "best": best, "kernels": kernels})
            sys.stdout.flush()
    if os.environ.get("TOKENS"):
        torch.save(tokens, os.environ["TOKENS"])
    print(json.dumps({"bench": "tune_kernels", "vocab": vocab, "results": results}))


if __name__ == "__main__":
    main()
