"""`tpsample bench kernels`: the fused Triton kernels against torch and FlashInfer.

Matrix: rows x vocab x dtype x logit shape (randn x 3; a peaked Zipf-like row) x configuration
(greedy; temperature; top-k 50 + top-p 0.9, also with top-n-sigma 1, with the kept pass of
every row (a kept support's count and bounds) and with XTC (threshold 0.1, every coin up),
whose costs are those rows' differences; top-p 0.9; min-p 0.05; logprobs 5). Per case: the
median of CUDA-event timings after warm-up (host launch time included, as a caller sees it),
the extra memory (allocator peak minus the baseline with the inputs allocated, plus the
kernels' cached workspace), and GB/s of one read of the logits against a device copy
bandwidth measured in the same run. Anchors in the same run: plain torch argmax (greedy), a
torch sort-based top-k/top-p sampler (the usual engine path), and FlashInfer's
`top_k_top_p_sampling_from_logits` when importable. Prints a table, then one JSON line.
With `--sweep`, the launch-shape sweep instead (`run_sweep`): per case and `VARIANTS` entry (a
`KernelConfig` that applies to some configurations), the device time of the sampling kernels
and of each kernel, whether the variant gives the default's tokens, and how many top-p rows the
list kernel, the lean pass and the exact search settled.
"""
from __future__ import annotations

import functools
import itertools
import json
import statistics

import torch

from ..kernels.launcher import KernelConfig, fallback_counter, lean_counter, listed_counter
from ..term import table
from .report import copy_bandwidth, finish, kernel_us, profiled_us
from .report import print_table as print_whole

CONFIGS = {   # name: (temperature, top_k, top_p, min_p, logprobs)
    "greedy": (0.0, 0, 1.0, 0.0, 0),
    "temperature": (0.8, 0, 1.0, 0.0, 0),
    "topk50_topp0.9": (0.8, 50, 0.9, 0.0, 0),
    "topk50_topp0.9_nsigma1": (0.8, 50, 0.9, 0.0, 0),
    "topk50_topp0.9_kept": (0.8, 50, 0.9, 0.0, 0),
    "topk50_topp0.9_xtc0.1": (0.8, 50, 0.9, 0.0, 0),
    "topp0.9": (0.8, 0, 0.9, 0.0, 0),
    "minp0.05": (0.8, 0, 1.0, 0.05, 0),
    "logprobs5": (0.8, 0, 1.0, 0.0, 5),
}
N_SIGMA = {"topk50_topp0.9_nsigma1": 1.0}     # configurations with top-n-sigma: n
KEPT = {"topk50_topp0.9_kept": None, "topk50_topp0.9_xtc0.1": 0.1}     # with the kept pass: XTC's threshold
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def make_logits(shape: str, rows: int, vocab: int, dtype, device) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(rows * 7 + vocab)
    if shape == "randn":
        return (torch.randn(rows, vocab, generator=gen, device=device) * 3).to(dtype)
    ranks = torch.argsort(torch.rand(rows, vocab, generator=gen, device=device), dim=1).float() + 1
    return (-1.1 * torch.log(ranks) + 8.0).to(dtype)


def params(config: str, rows: int, device):
    t, k, p, mp, _ = CONFIGS[config]
    f = torch.full
    return (f((rows,), t, device=device), f((rows,), k, dtype=torch.int32, device=device),
            f((rows,), p, device=device), f((rows,), float(torch.log(torch.tensor(mp))), device=device))


def torch_sort_sample(x, t, k, p):
    """The common engine path: sort, mask top-k and top-p on the sorted row, softmax, draw."""
    l = x.float() / t.unsqueeze(1)
    srt, idx = torch.sort(l, dim=1, descending=False)
    kk = (l.shape[1] - k.long()).clamp(0, l.shape[1] - 1).unsqueeze(1)
    srt = srt.masked_fill(srt < srt.gather(1, kk), float("-inf"))
    probs = srt.softmax(dim=1)
    cum = probs.cumsum(dim=1)
    srt = srt.masked_fill(cum <= (1 - p).unsqueeze(1), float("-inf"))
    srt[:, -1] = srt[:, -1].clamp(min=-1e30)
    l = torch.empty_like(srt).scatter_(1, idx, srt)
    q = torch.empty_like(l).exponential_()
    return (l.softmax(dim=1) / q).argmax(dim=1)


def time_cuda(fn, iters: int, warmup: int, device):
    """(median ms, extra peak MiB) of fn() on the current CUDA stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    return statistics.median(times), peak


def device_time_us(fn, iters: int = 5) -> float:
    """Sum of the device time of every kernel fn() launches, per call (host gaps excluded)."""
    fn()
    return profiled_us(fn, iters, "cuda") / iters


def ours(config, x, t, k, p, lmp, key0, key1):
    from ..kernels import sample as dispatch
    if CONFIGS[config][4]:
        return lambda: dispatch.logprob_stats(x, temperature=t, n=CONFIGS[config][4])
    n_sigma = torch.full_like(t, N_SIGMA[config]) if config in N_SIGMA else None
    hints = dispatch.hints_from_params(t, k, p, lmp, x.shape[1], n_sigma)
    kept = None
    if config in KEPT:
        rows = torch.arange(x.shape[0], device=x.device)
        xtc = KEPT[config]
        kept = (dispatch.Kept(rows) if xtc is None else
                dispatch.Kept(rows, torch.full_like(t, xtc), torch.ones_like(t, dtype=torch.bool)))
    return lambda: dispatch.sample_rows(x, t, k, p, lmp, key0, key1, hints=hints, n_sigma=n_sigma, kept=kept)


@functools.cache
def flashinfer_sampling():
    """flashinfer.sampling, or None (said once) when it is absent or does not import."""
    try:
        import flashinfer.sampling as fs
    except Exception as e:  # noqa: BLE001 - absent or incompatible: skip the anchor
        print(f"flashinfer anchor skipped: {e!r}"[:160])
        return None
    return fs


def anchors(config, x, t, k, p):
    """name -> callable for the anchors that apply to this configuration."""
    out = {}
    if config == "greedy":
        out["torch_argmax"] = lambda: x.argmax(dim=1)
    elif config in ("topk50_topp0.9", "topp0.9", "temperature"):
        kk = torch.where(k > 0, k, torch.full_like(k, x.shape[1]))
        out["torch_sort"] = lambda: torch_sort_sample(x, t, kk, p)
        fs = flashinfer_sampling()
        if fs is not None:
            xf = x.float() / t.unsqueeze(1)
            out["flashinfer"] = lambda: fs.top_k_top_p_sampling_from_logits(xf, kk, p)
    elif config == "logprobs5":
        out["torch_log_softmax_topk"] = lambda: torch.log_softmax(x.float() / t.unsqueeze(1), dim=1).topk(5, dim=1)
    return out


def run_case(rows, vocab, dtype_name, shape, config, args, bw):
    dev = args.device
    x = make_logits(shape, rows, vocab, DTYPES[dtype_name], dev)
    t, k, p, lmp = params(config, rows, dev)
    key0 = torch.randint(0, 2**32, (rows,), dtype=torch.int64, device=dev)
    key1 = torch.randint(0, 2**32, (rows,), dtype=torch.int64, device=dev)
    results = []
    impls = {"triton": ours(config, x, t, k, p, lmp, key0, key1)}
    if not args.no_anchors:
        impls.update(anchors(config, x, t, k, p))
    read_gb = x.numel() * x.element_size() / 1e9
    for name, fn in impls.items():
        try:
            ms, mib = time_cuda(fn, args.iters, args.warmup, dev)
            if name == "triton" and not CONFIGS[config][4]:   # its workspace is cached across calls: count it
                from ..kernels.sample.launch import workspace_bytes
                mib += workspace_bytes(rows, vocab, KernelConfig(), dev) / 2**20
        except Exception as e:  # noqa: BLE001 - report and continue (an anchor may not support a case)
            results.append({"impl": name, "error": repr(e)[:200]})
            continue
        extra = {"device_us": round(device_time_us(fn), 1)} if args.gpu_time else {}
        results.append({"impl": name, "us": round(ms * 1e3, 1), **extra, "extra_mib": round(mib, 2),
                        "gbps": round(read_gb / (ms / 1e3), 1), "frac_of_copy_bw": round(read_gb / (ms / 1e3) / bw, 3)})
    base = {"rows": rows, "vocab": vocab, "dtype": dtype_name, "shape": shape, "config": config}
    del x
    return [dict(base, **r) for r in results]


def run_bench_kernels(args) -> list:
    if args.quick:
        args.rows, args.vocab, args.dtypes, args.gpu_time = [1, 256], [151936], ["fp32"], True
    if torch.device(args.device).type != "cuda":
        print(json.dumps({"error": "bench kernels needs a CUDA device"}))
        return []
    bw = copy_bandwidth(args.device) / 1e9
    out = []
    for case in itertools.product(args.rows, args.vocab, args.dtypes, args.shapes, args.configs):
        out.extend(run_case(*case, args, bw))
    print_table(out, bw)
    finish({"bench": "kernels", "copy_bw_gbps": round(bw, 1), "device": torch.cuda.get_device_name(args.device),
            "results": out}, getattr(args, "out", None), args.device)
    return out


def print_table(rows, bw) -> None:
    t = table(f"tpsample kernels (copy bandwidth {bw:.0f} GB/s)", ["rows", "vocab", "dtype", "shape", "config", "impl",
              "us", "device\nus", "extra\nMiB", "GB/s", "of\ncopy"], left=("dtype", "shape", "config", "impl"))
    for r in rows:
        t.add_row(*(str(r.get(k, "")) for k in ("rows", "vocab", "dtype", "shape", "config", "impl")),
                  str(r.get("us", r.get("error", ""))),
                  *(str(r.get(k, "")) for k in ("device_us", "extra_mib", "gbps", "frac_of_copy_bw")))
    print_whole(t)


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
    if args.quick:
        args.rows, args.vocab, args.dtypes = [1, 256], [151936], ["fp32"]
    names = list(args.sweep or VARIANTS)
    configs = [c for c in args.configs if c in FILTERS or c in ("greedy", "temperature")]
    out = []
    for rows, vocab, dt, shape, config in itertools.product(args.rows, args.vocab, args.dtypes, args.shapes, configs):
        got = sweep_case(rows, vocab, DTYPES[dt], shape, config, names, args.iters, args.device)
        print_case(got)
        out.extend(dict(r, dtype=dt) for r in got)
    finish({"bench": "kernel_sweep", "device": torch.cuda.get_device_name(args.device), "results": out},
           getattr(args, "out", None), args.device)
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
