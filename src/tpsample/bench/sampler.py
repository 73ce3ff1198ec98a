"""`tpsample bench sampler`: strategies x TP x rows x vocab.

For each case: median step latency, per-rank sampler peak memory above the local logits
(CUDA: allocator peak; CPU: counted from buffer sizes), bytes sent + received per rank and the
number of collectives. Prints a table, saves a plot (memory and bytes vs TP per strategy) and
ends with one JSON line. Ranks run as local processes (gloo; on one GPU several ranks share it).
"""
from __future__ import annotations

import json
import statistics
import time

import torch

STRATEGIES = ("replicated", "batch_sharded", "vocab_parallel", "auto")


def add_args(p) -> None:
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--rows", type=int, nargs="+", default=[8, 64])
    p.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936])
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--plot", default="bench_sampler.png", help="where to save the plot ('' to skip)")
    p.add_argument("--compare", action="store_true",
                   help="one GPU: tpsample vs FlashInfer / torch sort / argmax on the same logits, "
                        "wall time per call as an engine sees it (uses --rows, first --vocab, --steps as iterations)")


def _case(sampler_cls, params_cls, group, strategy, rows, vocab, steps, device):
    from ..parallel.shard import vocab_shard
    s = sampler_cls(vocab, max_num_reqs=rows, strategy=strategy, group=group, seed=1, device=device)
    start, end = vocab_shard(vocab, s.tp_size, s.rank)
    ids = [f"r{i}" for i in range(rows)]
    for i, r in enumerate(ids):
        s.add_request(r, params_cls(temperature=0.8, top_k=50, top_p=0.9, seed=i, max_tokens=10**6), [1])
    gen = torch.Generator(device=device).manual_seed(1000 + s.rank)
    local = torch.randn(rows, end - start, generator=gen, device=device) * 3
    times, stats = [], None
    for step in range(steps + 1):
        plan = s.plan(ids)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        s.sample(local, plan)
        if device == "cuda":
            torch.cuda.synchronize()
        if step > 0:                          # step 0 warms up
            times.append(time.perf_counter() - t0)
        stats = s.last_stats
    return {"strategy": strategy, "resolved": stats.strategy, "rows": rows, "vocab": vocab,
            "ms": 1e3 * statistics.median(times), "peak_bytes": stats.peak_bytes,
            "bytes": stats.bytes_sent + stats.bytes_received, "collectives": stats.num_collectives,
            "shard_bytes": stats.local_logits_bytes}


def _rank_worker(group, cases, steps, device):
    import tpsample
    if device == "cuda":
        torch.cuda.set_device(0)
    return [_case(tpsample.Sampler, tpsample.SamplingParams, group, s, r, v, steps, device)
            for (s, r, v) in cases]


def run(args) -> list[dict]:
    from ..parallel.launch import spawn_ranks
    cases = [(s, r, v) for v in args.vocab for r in args.rows for s in args.strategies]
    results = []
    for tp in args.tp:
        if tp == 1:
            per_rank = [_rank_worker(None, cases, args.steps, args.device)]
        else:
            per_rank = spawn_ranks(_rank_worker, tp, cases, args.steps, args.device, timeout_s=1800)
        for i in range(len(cases)):
            row = dict(per_rank[0][i])
            row["tp"] = tp
            row["peak_bytes_per_rank"] = [r[i]["peak_bytes"] for r in per_rank]
            row["peak_bytes"] = max(row["peak_bytes_per_rank"])
            row["bytes"] = max(r[i]["bytes"] for r in per_rank)
            row["ms"] = max(r[i]["ms"] for r in per_rank)
            results.append(row)
    return results


def main(args) -> None:
    if getattr(args, "compare", False):
        from . import compare
        compare.main(args)
        return
    from rich.console import Console
    from rich.table import Table
    results = run(args)
    table = Table(title=f"tpsample bench sampler ({args.device}, top-k 50 + top-p 0.9 + T 0.8, fp32)")
    for col in ("tp", "rows", "vocab", "strategy", "ms", "peak MiB/rank", "shard MiB", "bytes KiB/rank", "colls"):
        table.add_column(col, justify="right")
    for r in results:
        name = r["strategy"] if r["strategy"] != "auto" else f"auto->{r['resolved']}"
        table.add_row(str(r["tp"]), str(r["rows"]), str(r["vocab"]), name, f"{r['ms']:.2f}",
                      f"{r['peak_bytes'] / 2**20:.2f}", f"{r['shard_bytes'] / 2**20:.2f}",
                      f"{r['bytes'] / 1024:.1f}", str(r["collectives"]))
    Console(width=140).print(table)
    if args.plot:
        plot(results, args.plot)
        print(f"plot: {args.plot}")
    print(json.dumps({"bench": "sampler", "device": args.device, "results": results}))


def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows, vocab = max(r["rows"] for r in results), max(r["vocab"] for r in results)
    sel = [r for r in results if r["rows"] == rows and r["vocab"] == vocab and r["strategy"] != "auto"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for strategy in sorted({r["strategy"] for r in sel}):
        pts = sorted((r["tp"], r["peak_bytes"] / 2**20, r["bytes"] / 2**20) for r in sel if r["strategy"] == strategy)
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=strategy)
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=strategy)
    axes[0].set(xlabel="TP", ylabel="sampler peak per rank (MiB)", title=f"memory, {rows} x {vocab}")
    axes[1].set(xlabel="TP", ylabel="bytes sent+received per rank (MiB)", title="communication")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
