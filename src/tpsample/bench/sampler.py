"""`tpsample bench sampler`: strategies x TP x feature classes x rows x vocab x logits, per rank.

Each TP size runs its ranks as local processes: with `--device cuda` and at least TP GPUs, one
GPU per rank over NCCL (NVLink multicast off); otherwise gloo, and with `--device cuda` on fewer
GPUs every rank computes its shard on GPU 0 (a fair measure of one rank's device work; the
collectives then go through host memory, so their wall time is not NCCL's). TP = 1 runs in this
process. Samplers run with `auto_graph=False`: every step is the eager per-rank work.

Per case and rank, the strategies of a shape taking turns step by step (so they see the same
machine): ms, the wall time per step (plan + sample, synchronised; median of --steps after a
warm-up step, two under auto, whose first step measures); device us, the profiler's device time
per step less the events of collectives (copies between host and device, NCCL kernels; CUDA
only); the sampler's peak memory above its inputs (CUDA: the allocator's peak in one more step;
CPU: counted); bytes sent + received; the collectives the strategy issued in a step; and the rows
that took vocab_parallel's exact top-p path (`last_stats.exact_rows`, summed over the timed
steps). Prints two tables, writes the plot and the JSON (`--out`, rewritten after
every TP size), and ends with one JSON line. The tables: per case the slowest rank's figures
(`tp_table`, its device time also as a ratio to TP = 1), and auto's choice beside the three fixed
strategies' times (`auto_table`).
"""
from __future__ import annotations

import functools
import os
import statistics
import threading
import time

import torch

from ..parallel.names import REPORT_ORDER as STRATEGIES
from ..term import table
from .report import cell, device_us, finish, host_copy_or_nccl, is_cuda, metadata, print_table, sync, write
from .workloads import WORKLOADS

DEVICE_STEPS = 3          # profiled steps per case (every rank the same ones)


@functools.lru_cache(maxsize=4)
def _full_logits(kind: str, rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "randn":
        return torch.randn(rows, vocab, generator=g) * 3
    base = -1.1 * torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
    return torch.stack([(base + 0.1 * torch.randn(vocab, generator=g))[torch.randperm(vocab, generator=g)]
                        for _ in range(rows)])


def make_logits(kind: str, rows: int, vocab: int, seed: int, device) -> torch.Tensor:
    """[rows, vocab] fp32: randn x 3, or Zipf-like rows (logit -1.1 ln(rank) + noise, ranks shuffled)."""
    return _full_logits(kind, rows, vocab, seed).to(device)


class _Case:
    """One strategy at one shape on this rank: its sampler, shard, timings and counts."""

    def __init__(self, group, case, device):
        import tpsample
        self.strategy, self.workload, rows, self.vocab, self.logits = case
        work = WORKLOADS[self.workload]
        num_reqs = max(1, rows // (1 + work.num_drafts))
        self.s = s = tpsample.Sampler(self.vocab, max_num_reqs=num_reqs, max_num_logits_per_req=1 + work.num_drafts,
                                      strategy=self.strategy, group=group, seed=1, device=device, auto_graph=False)
        self.ids = [f"r{i}" for i in range(num_reqs)]
        for i, r in enumerate(self.ids):
            s.add_request(r, tpsample.SamplingParams(seed=i, max_tokens=10**6, **work.params(i)), [1])
        self.drafts = ([[(97 * i + 13 * j) % self.vocab for j in range(work.num_drafts)] for i in range(num_reqs)]
                       if work.num_drafts else None)
        self.rows = num_reqs * (1 + work.num_drafts)
        start, end = tpsample.vocab_shard(self.vocab, s.tp_size, s.rank)
        self.local = make_logits(self.logits, self.rows, self.vocab, 1000, device)[:, start:end].contiguous()
        self.device = device
        self.times, self.exact = [], 0

    def call(self):
        self.s.sample(self.local, self.s.plan(self.ids, draft_token_ids=self.drafts))
        return lambda: None

    def step(self, timed: bool) -> None:
        sync(self.device)
        t0 = time.perf_counter()
        self.call()
        sync(self.device)
        if timed:
            self.times.append(time.perf_counter() - t0)
            self.exact += self.s.last_stats.exact_rows

    def result(self, device_steps: int) -> dict:
        """Device time (every rank profiles the same steps), then one step for the allocator's peak."""
        dev_us = device_us(self.call, device_steps, self.device, exclude=host_copy_or_nccl)
        st = self.s.last_stats
        self.s.profile_memory = is_cuda(self.device)
        self.step(False)
        return {"strategy": self.strategy, "workload": self.workload, "logits": self.logits, "resolved": st.strategy,
                "rows": self.rows, "vocab": self.vocab, "ms": 1e3 * statistics.median(self.times),
                "device_us": None if dev_us is None else round(dev_us, 1),
                "peak_bytes": self.s.last_stats.peak_bytes, "bytes": st.bytes_sent + st.bytes_received,
                "rounds": st.num_rounds, "collectives": st.num_collectives, "exact_rows": self.exact,
                "exact_rows_of": self.rows * len(self.times), "shard_bytes": st.local_logits_bytes,
                "calibration_s": self.s.auto.calibration_s}


def _shape(group, cases, steps, device) -> list[dict]:
    """The strategies of one shape, their steps interleaved so that they see the same machine."""
    runs = [_Case(group, c, device) for c in cases]
    for run in runs:                              # auto: measures in its first step, runs its choice next
        for _ in range(2 if run.strategy == "auto" else 1):
            run.step(False)
    for _ in range(steps):
        for run in runs:
            run.step(True)
    return [run.result(DEVICE_STEPS) for run in runs]


def _rank_worker(group, cases, steps, device, threads, progress=None):
    torch.set_num_threads(threads)
    rank = 0 if group is None else torch.distributed.get_rank(group)
    if device == "cuda":
        nccl = group is not None and torch.distributed.get_backend(group) == "nccl"
        device = f"cuda:{rank if nccl else 0}"
        torch.cuda.set_device(device)
    shapes: dict = {}
    for c in cases:
        shapes.setdefault(c[1:], []).append(c)
    out = []
    for (workload, rows, vocab, logits), shape_cases in shapes.items():
        out += _shape(group, shape_cases, steps, device)
        if progress is not None and rank == 0:
            progress.put(f"{workload}, {logits} logits, {rows} x {vocab}")
    return out


def _launch(tp, cases, args, progress):
    """Per-rank results for one TP size (NCCL when there is a GPU per rank)."""
    from ..parallel.launch import spawn_ranks
    if tp == 1:
        return [_rank_worker(None, cases, args.steps, args.device, args.threads, progress)], "none"
    nccl = args.device == "cuda" and torch.cuda.device_count() >= tp
    if nccl:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    backend = "nccl" if nccl else "gloo"
    return spawn_ranks(_rank_worker, tp, cases, args.steps, args.device, args.threads, progress,
                       backend=backend, timeout_s=1800), backend


def cases_of(args) -> list[tuple]:
    """(strategy, workload, rows, vocab, logits) in run order: a shape's strategies together."""
    return [(s, w, r, v, k) for k in args.logits for w in args.workload for v in args.vocab for r in args.rows
            for s in args.strategies]


def run(args, report: dict | None = None) -> list[dict]:
    import multiprocessing as mp
    import queue as queues

    from .report import progress
    cases = cases_of(args)
    shapes = len({c[1:] for c in cases})
    results = []
    messages = mp.get_context("spawn").Manager().Queue()

    def launch(box, tp):
        box["out"] = _launch(tp, cases, args, messages)

    with progress("bench sampler", shapes * len(args.tp)) as step:
        for tp in args.tp:
            box = {}
            worker = threading.Thread(target=launch, args=(box, tp), daemon=True)
            worker.start()
            while worker.is_alive() or not messages.empty():
                try:
                    step(f"TP {tp}: {messages.get(timeout=0.2)} done")
                except queues.Empty:
                    continue
            worker.join()
            if "out" not in box:
                raise RuntimeError(f"bench at TP={tp} failed (see the rank error above)")
            per_rank, backend = box["out"]
            results += _merge(tp, backend, cases, per_rank)
            if report is not None and args.out:
                write({**report, "results": results, "complete": False}, args.out)
    return results


def _merge(tp, backend, cases, per_rank) -> list[dict]:
    rows = []
    for i in range(len(cases)):
        row = dict(per_rank[0][i])
        ranks = [r[i] for r in per_rank]
        row.update(tp=tp, backend=backend)
        for key in ("ms", "device_us", "peak_bytes", "bytes"):
            row[f"{key}_per_rank"] = [r[key] for r in ranks]
            row[key] = None if None in row[f"{key}_per_rank"] else max(row[f"{key}_per_rank"])
        row["bytes_per_row"] = row["bytes"] / row["rows"]
        row["peak_bytes_per_row"] = row["peak_bytes"] / row["rows"]
        rows.append(row)
    return rows


def _tp1_device_us(results: list[dict]) -> dict:
    """(workload, rows, vocab, logits) -> the smallest TP = 1 device time (every strategy is the
    same sampler at TP = 1)."""
    best: dict = {}
    for r in results:
        if r["tp"] == 1 and r.get("device_us") is not None:
            key = (r["workload"], r["rows"], r["vocab"], r["logits"])
            best[key] = min(best.get(key, float("inf")), r["device_us"])
    return best


def tp_table(results: list[dict], args):
    vocabs = sorted({r["vocab"] for r in results})
    one_vocab = len(vocabs) == 1
    title = (f"tpsample bench sampler ({args.device}, fp32, {args.threads} thread(s)/rank"
             + (f", V {vocabs[0]:,}" if one_vocab else "") + "; per step, slowest rank)")
    cols = ["tp", "strategy", "workload", "logits", "rows"] + ([] if one_vocab else ["vocab"]) + [
        "ms", "dev us", "x TP1", "colls", "B/row", "peak\nKiB/row", "exact\nrows"]
    t = table(title, cols, left=("strategy", "workload", "logits"))
    tp1 = _tp1_device_us(results)
    for r in results:
        name = r["strategy"] if r["strategy"] != "auto" else f"auto->{r['resolved']}"
        base = tp1.get((r["workload"], r["rows"], r["vocab"], r["logits"]))
        ratio = r["device_us"] / base if base and r.get("device_us") is not None else None
        t.add_row(str(r["tp"]), name, r["workload"], r["logits"], str(r["rows"]),
                  *([] if one_vocab else [str(r["vocab"])]), f"{r['ms']:.2f}", cell(r.get("device_us"), ".0f"),
                  cell(ratio, ".2f"), str(r["rounds"]), f"{r['bytes_per_row']:.0f}",
                  f"{r['peak_bytes_per_row'] / 1024:.1f}", f"{r['exact_rows']}/{r['exact_rows_of']}")
    return t


def auto_table(results: list[dict]):
    """auto's choice next to every fixed strategy's measured time, per shape: the fixed run of
    the chosen strategy, and auto's own run of it, each against the fastest fixed strategy."""
    shapes: dict = {}
    for r in results:
        shapes.setdefault((r["tp"], r["workload"], r["logits"], r["rows"], r["vocab"]), {})[r["strategy"]] = r
    shapes = {k: v for k, v in shapes.items() if len(v) == 4 and k[0] > 1}
    if not shapes:
        return None
    t = table("auto: its choice next to every fixed strategy (ms per step, slowest rank)",
              ["tp", "workload", "logits", "rows", "vocab", "repl.", "batch", "vocab\npar.", "auto ->", "auto\nms",
               "chosen /\nfastest", "auto /\nfastest"], left=("workload", "logits", "auto ->"))
    for (tp, w, kind, rows, vocab), v in sorted(shapes.items()):
        fixed = {s: v[s]["ms"] for s in STRATEGIES[:3]}
        choice, best = v["auto"]["resolved"], min(fixed.values())
        t.add_row(str(tp), w, kind, str(rows), str(vocab), *(f"{fixed[s]:.2f}" for s in STRATEGIES[:3]), choice,
                  f"{v['auto']['ms']:.2f}", f"{fixed[choice] / best:.2f}", f"{v['auto']['ms'] / best:.2f}")
    return t


def main(args) -> None:
    if getattr(args, "compare", False):
        from . import compare
        compare.main(args)
        return
    report = {"bench": "sampler", "device": args.device, "logits": list(args.logits), "threads": args.threads,
              "steps": args.steps, "meta": metadata(args.device)}
    results = run(args, report)
    print_table(tp_table(results, args))
    auto = auto_table(results)
    if auto is not None:
        print_table(auto)
    if args.plot:
        from .plots import plot_tp

        plot_tp(results, args.plot)
        print(f"plot: {args.plot}")
    finish({**report, "results": results, "complete": True}, args.out, args.device)
