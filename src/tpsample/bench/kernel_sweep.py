"""`tpsample bench kernels --sweep`: the launch-shape sweep of `sample_rows` over `KernelConfig`.

For each size, logit shape and sampling configuration, and each variant that applies to it: the
device time of the sampling kernels per call (torch.profiler; the host-side conversions of the
entry point are left out) and of each kernel, whether the variant gives the default's tokens,
and how many top-p rows the list kernel settled, how many the lean pass settled and how many
fell back to the exact search. A variant sets only `KernelConfig` fields (`force` turns a method
off, to weigh what it saves). Prints a table per case, then one JSON line.
"""
from __future__ import annotations

import itertools
import json

import torch

from ..kernels.launcher import KernelConfig, fallback_counter, lean_counter, listed_counter
from .kernels import make_logits, params
from .measure import kernel_us

KERNELS = ("scan_kernel", "select_kernel", "hist_kernel", "list_kernel", "round_kernel", "finish_kernel",
           "drain_kernel")
TOP_P = frozenset({"topp0.9"})
FILTERS = frozenset({"topk50_topp0.9", "topp0.9", "minp0.05"})
VARIANTS = {   # name: (config, the sampling configurations it applies to; None: every one)
    "default": (KernelConfig(), None),
    "no_lean": (KernelConfig(force={"bracket"}), TOP_P),       # the bracket's collect instead of the lean pass
    "unpacked": (KernelConfig(force={"unpacked"}), TOP_P),     # one atomic per listed entry
    "room2048": (KernelConfig(list_room=2048), TOP_P),
    "room1536": (KernelConfig(list_room=1536), TOP_P),
    "lw4": (KernelConfig(list_warps=4), TOP_P),
    "lw16": (KernelConfig(list_warps=16), TOP_P),
    "lg8": (KernelConfig(list_groups=8), TOP_P),
    "lb1024": (KernelConfig(lean_block=1024), TOP_P),
    "fc256": (KernelConfig(lean_read_cols=256), TOP_P),
    "hb2048_w8": (KernelConfig(hist_block=2048, hist_warps=8), TOP_P),
    "nbh4096": (KernelConfig(hist_bins=4096), TOP_P),
    "all1024": (KernelConfig(bracket_all=1024), TOP_P),
    "b64": (KernelConfig(block=64), FILTERS),
    "nw2": (KernelConfig(num_warps=2), FILTERS),
    "scan2048": (KernelConfig(scan_cols=2048), FILTERS),
    "plain1024": (KernelConfig(plain_scan_cols=1024), frozenset({"greedy"})),
    "plain256": (KernelConfig(plain_scan_cols=256), frozenset({"greedy"})),
    "draw256": (KernelConfig(draw_scan_cols=256), frozenset({"temperature"})),
    "draw512": (KernelConfig(draw_scan_cols=512), frozenset({"temperature"})),
}


def sweep_case(rows: int, vocab: int, dtype, shape: str, config: str, names: list, iters: int, dev) -> list:
    from ..kernels.sample import hints_from_params, sample_rows
    x = make_logits(shape, rows, vocab, dtype, dev)
    t, k, p, lmp = params(config, rows, dev)
    gen = torch.Generator(device=dev).manual_seed(rows)
    key0, key1 = (torch.randint(0, 2**32, (rows,), dtype=torch.int64, device=dev, generator=gen) for _ in range(2))
    hints = hints_from_params(t, k, p, lmp, vocab)
    want = sample_rows(x, t, k, p, lmp, key0, key1, hints=hints)[0]
    counters = (listed_counter(dev), lean_counter(dev), fallback_counter(dev))
    out = []
    for name in names:
        cfg, applies = VARIANTS[name]
        if applies is not None and config not in applies:
            continue
        before = [int(c.item()) for c in counters]
        got = sample_rows(x, t, k, p, lmp, key0, key1, hints=hints, cfg=cfg)[0]
        paths = [int(c.item()) - b for c, b in zip(counters, before)]
        kernels = kernel_us(lambda cfg=cfg: sample_rows(x, t, k, p, lmp, key0, key1, hints=hints, cfg=cfg), iters,
                            dev, KERNELS)
        out.append({"rows": rows, "vocab": vocab, "shape": shape, "config": config, "variant": name,
                    "device_us": round(sum(kernels.values()), 1), "same_tokens": bool(torch.equal(got, want)),
                    "listed_rows": paths[0], "lean_rows": paths[1], "fallback_rows": paths[2], "kernels": kernels})
    return out


def run_sweep(args) -> list:
    """The sweep over args.rows x args.vocab x args.dtypes x args.shapes x args.configs (logprob
    configurations left out: no `sample_rows` call) for the variants named by args.sweep (all
    when none is named)."""
    from .kernels import DTYPES
    if args.quick:
        args.rows, args.vocab, args.dtypes = [1, 256], [151936], ["fp32"]
    names = list(args.sweep or VARIANTS)
    configs = [c for c in args.configs if c in FILTERS or c in ("greedy", "temperature")]
    out = []
    for rows, vocab, dt, shape, config in itertools.product(args.rows, args.vocab, args.dtypes, args.shapes, configs):
        got = sweep_case(rows, vocab, DTYPES[dt], shape, config, names, args.iters, args.device)
        print_case(got)
        out.extend(dict(r, dtype=dt) for r in got)
    print(json.dumps({"bench": "kernel_sweep", "device": torch.cuda.get_device_name(args.device), "results": out}))
    return out


def print_case(results: list) -> None:
    """One line per variant: device time, token check, paths, and the kernels that took longest."""
    if not results:
        return
    r0 = results[0]
    print(f"{r0['rows']} x {r0['vocab']} {r0['shape']} {r0['config']}")
    for r in results:
        top = ", ".join(f"{k} {v}" for k, v in list(r["kernels"].items())[:3])
        same = "" if r["same_tokens"] else " (TOKENS DIFFER)"
        print(f"  {r['variant']:10s} {r['device_us']:9.1f} us{same}  listed/lean/fallback "
              f"{r['listed_rows']}/{r['lean_rows']}/{r['fallback_rows']}  {top}", flush=True)
