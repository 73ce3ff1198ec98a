"""`tpsample bench sampler`: strategies x TP x rows x vocab, per rank.

Each TP size runs its ranks as local processes: with `--device cuda` and at least TP GPUs, one
GPU per rank over NCCL (NVLink multicast off); otherwise gloo (on one GPU, ranks share it).
TP = 1 runs in this process. Every rank uses the same torch thread count (`--threads`).
Per case and rank: wall time per step (plan + sample, synchronised; median of --steps after one
warm-up step, two under auto, whose first step measures; the strategies of a shape take turns
step by step, so they see the same machine), the sampler's peak memory above its inputs, bytes sent + received, the
collectives the strategy issued (rounds) and the rows that took vocab_parallel's exact top-p
path. Prints a table (sized to the terminal), an `auto` table (its choice next to the three
fixed strategies' times), saves a plot, and ends with one JSON line.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time

import torch

from ..parallel import names
from .workloads import WORKLOADS

STRATEGIES = names.REPORT_ORDER


def make_logits(kind: str, rows: int, vocab: int, seed: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "randn":
        return (torch.randn(rows, vocab, generator=g) * 3).to(device)
    base = -1.1 * torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
    out = torch.stack([(base + 0.1 * torch.randn(vocab, generator=g))[torch.randperm(vocab, generator=g)]
                       for _ in range(rows)])
    return out.to(device)


class _Case:
    """One strategy at one shape on this rank: its sampler, shard and timings."""

    def __init__(self, group, case, device, logits_kind):
        import tpsample
        self.strategy, self.workload, self.rows, self.vocab = case
        self.s = s = tpsample.Sampler(self.vocab, max_num_reqs=self.rows, strategy=self.strategy, group=group,
                                      seed=1, device=device)
        start, end = tpsample.vocab_shard(self.vocab, s.tp_size, s.rank)
        self.ids = [f"r{i}" for i in range(self.rows)]
        for i, r in enumerate(self.ids):
            s.add_request(r, tpsample.SamplingParams(seed=i, max_tokens=10**6, **WORKLOADS[self.workload](i)), [1])
        self.local = make_logits(logits_kind, self.rows, self.vocab, 1000, device)[:, start:end].contiguous()
        self.cuda = torch.device(device).type == "cuda"
        self.times, self.exact = [], 0

    def step(self, timed: bool) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.s.sample(self.local, self.s.plan(self.ids))
        if self.cuda:
            torch.cuda.synchronize()
        if timed:
            self.times.append(time.perf_counter() - t0)
            self.exact += self.s.last_stats.exact_rows

    def result(self) -> dict:
        s, st = self.s, self.s.last_stats
        s.profile_memory = self.cuda              # one more step for the allocator's peak (syncs)
        if self.cuda:
            self.step(False)
        return {"strategy": self.strategy, "workload": self.workload, "resolved": st.strategy, "rows": self.rows,
                "vocab": self.vocab, "ms": 1e3 * statistics.median(self.times), "peak_bytes": s.last_stats.peak_bytes,
                "bytes": st.bytes_sent + st.bytes_received, "rounds": st.num_rounds,
                "collectives": st.num_collectives, "exact_rows": self.exact,
                "exact_rows_of": self.rows * len(self.times), "shard_bytes": st.local_logits_bytes,
                "calibration_s": s.auto.calibration_s}


def _shape(group, cases, steps, device, logits_kind) -> list[dict]:
    """The strategies of one shape, their steps interleaved so that they see the same machine."""
    runs = [_Case(group, c, device, logits_kind) for c in cases]
    for run in runs:                              # auto: measures in its first step, runs its choice next
        for _ in range(2 if run.strategy == "auto" else 1):
            run.step(False)
    for _ in range(steps):
        for run in runs:
            run.step(True)
    return [run.result() for run in runs]


def _rank_worker(group, cases, steps, device, logits_kind, threads, progress=None):
    torch.set_num_threads(threads)
    if device == "cuda":
        rank = 0 if group is None else torch.distributed.get_rank(group)
        nccl = group is not None and torch.distributed.get_backend(group) == "nccl"
        device = f"cuda:{rank if nccl else 0}"
        torch.cuda.set_device(device)
    shapes: dict = {}
    for c in cases:
        shapes.setdefault(c[1:], []).append(c)
    out = []
    for shape_cases in shapes.values():
        out += _shape(group, shape_cases, steps, device, logits_kind)
        if progress is not None and (group is None or torch.distributed.get_rank(group) == 0):
            progress.put(len(shape_cases))
    return out


def _launch(tp, cases, args, progress):
    """Per-rank results for one TP size (NCCL when there is a GPU per rank)."""
    from ..parallel.launch import spawn_ranks
    if tp == 1:
        return [_rank_worker(None, cases, args.steps, args.device, args.logits, args.threads, progress)], "none"
    nccl = args.device == "cuda" and torch.cuda.device_count() >= tp
    if nccl:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    backend = "nccl" if nccl else "gloo"
    return spawn_ranks(_rank_worker, tp, cases, args.steps, args.device, args.logits, args.threads, progress,
                       backend=backend, timeout_s=1800), backend


def run(args) -> list[dict]:
    import multiprocessing as mp
    import queue as queues

    from rich.progress import Progress
    cases = [(s, w, r, v) for w in args.workload for v in args.vocab for r in args.rows for s in args.strategies]
    results = []
    queue = mp.get_context("spawn").Manager().Queue()

    def launch(box, tp):
        box["out"] = _launch(tp, cases, args, queue)

    with Progress(transient=True) as bar:
        task = bar.add_task("sampler bench", total=len(cases) * len(args.tp))
        for tp in args.tp:
            box = {}
            worker = threading.Thread(target=launch, args=(box, tp), daemon=True)
            worker.start()
            while worker.is_alive() or not queue.empty():
                try:
                    bar.advance(task, queue.get(timeout=0.2))
                except queues.Empty:
                    continue
            worker.join()
            if "out" not in box:
                raise RuntimeError(f"bench at TP={tp} failed (see the rank error above)")
            per_rank, backend = box["out"]
            results += _merge(tp, backend, cases, per_rank)
    return results


def _merge(tp, backend, cases, per_rank) -> list[dict]:
    rows = []
    for i in range(len(cases)):
        row = dict(per_rank[0][i])
        row.update(tp=tp, backend=backend,
                   ms_per_rank=[r[i]["ms"] for r in per_rank], ms=max(r[i]["ms"] for r in per_rank),
                   peak_bytes_per_rank=[r[i]["peak_bytes"] for r in per_rank],
                   peak_bytes=max(r[i]["peak_bytes"] for r in per_rank),
                   bytes_per_rank=[r[i]["bytes"] for r in per_rank], bytes=max(r[i]["bytes"] for r in per_rank))
        rows.append(row)
    return rows


def _check(args) -> None:
    """CLI mistakes: one line on stderr, exit 2, before any work."""
    bad = [f"--{n} values must be >= 1" for n, v in (("tp", args.tp), ("rows", args.rows), ("vocab", args.vocab))
           if min(v) < 1]
    if args.steps < 1 or args.threads < 1:
        bad.append("--steps and --threads must be >= 1")
    if any(t > v for t in args.tp for v in args.vocab):
        bad.append("--tp must not exceed --vocab")
    if args.device == "cuda" and not torch.cuda.is_available():
        bad.append("--device cuda: no CUDA device")
    if bad:
        print(f"tpsample bench sampler: {bad[0]}", file=sys.stderr)
        raise SystemExit(2)


def main(args) -> None:
    if getattr(args, "compare", False):
        from . import compare
        compare.main(args)
        return
    _check(args)
    from rich.console import Console
    results = run(args)
    console = Console()                   # sized to the terminal
    console.print(_table(results, args))
    auto = _auto_table(results)
    if auto is not None:
        console.print(auto)
    if args.plot:
        plot(results, args.plot)
        print(f"plot: {args.plot}")
    print(json.dumps({"bench": "sampler", "device": args.device, "logits": args.logits, "threads": args.threads,
                      "results": results}))


def _table(results, args):
    from rich.table import Table
    table = Table(title=f"tpsample bench sampler ({args.device}, {args.logits} logits, fp32, "
                        f"{args.threads} thread(s)/rank; per rank: ms, peak MiB, KiB moved)")
    for col in ("tp", "backend", "rows", "vocab", "workload", "strategy", "ms", "ms/rank", "peak MiB/rank",
                "KiB/rank", "rounds", "exact rows"):
        table.add_column(col, justify="right")
    for r in results:
        name = r["strategy"] if r["strategy"] != "auto" else f"auto->{r['resolved']}"
        table.add_row(str(r["tp"]), r["backend"], str(r["rows"]), str(r["vocab"]), r["workload"], name,
                      f"{r['ms']:.2f}", " ".join(f"{x:.1f}" for x in r["ms_per_rank"]),
                      " ".join(f"{x / 2**20:.1f}" for x in r["peak_bytes_per_rank"]),
                      " ".join(f"{x / 1024:.0f}" for x in r["bytes_per_rank"]), str(r["rounds"]),
                      f"{r['exact_rows']}/{r['exact_rows_of']}")
    return table


def _auto_table(results):
    """auto's choice next to the three fixed strategies' measured times, per shape: the fixed run
    of the chosen strategy, and auto's own run of it, each against the fastest fixed strategy."""
    from rich.table import Table
    shapes = {}
    for r in results:
        shapes.setdefault((r["tp"], r["workload"], r["rows"], r["vocab"]), {})[r["strategy"]] = r
    shapes = {k: v for k, v in shapes.items() if len(v) == 4 and k[0] > 1}
    if not shapes:
        return None
    table = Table(title="auto: its choice next to every fixed strategy (ms per step, slowest rank)")
    for col in ("tp", "workload", "rows", "vocab", "replicated", "batch_sharded", "vocab_parallel", "auto ->",
                "auto ms", "chosen / fastest", "auto / fastest"):
        table.add_column(col, justify="right")
    for (tp, w, rows, vocab), v in sorted(shapes.items()):
        fixed = {s: v[s]["ms"] for s in STRATEGIES[:3]}
        choice, best = v["auto"]["resolved"], min(fixed.values())
        table.add_row(str(tp), w, str(rows), str(vocab), *(f"{fixed[s]:.2f}" for s in STRATEGIES[:3]), choice,
                      f"{v['auto']['ms']:.2f}", f"{fixed[choice] / best:.2f}", f"{v['auto']['ms'] / best:.2f}")
    return table


def plot(results: list[dict], path: str) -> None:
    """Per-rank peak sampler memory and bytes moved against TP per strategy (`plots.plot_tp`)."""
    from .plots import plot_tp

    plot_tp(results, path)
