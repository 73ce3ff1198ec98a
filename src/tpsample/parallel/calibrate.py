"""Measurements behind `auto`, on the real group and device (once per feature class).

- `measure_comm`: a tiny all-gather (latency) and a 1 MiB (CPU) / 16 MiB (GPU) all-gather and
  all-to-all per rank, with the reassembly copy the strategies do (bandwidths).
- `measure_class`: for one feature class, (1) each strategy's whole step on one row (of the real
  vocabulary on GPU, of at most SMALL_VOCAB columns on CPU), run for real on the group (every fixed cost: collectives, glue, sampling), and
  (2) seconds per logit element of the two local paths (the full-row path exactly as replicated
  and batch_sharded run it, kernels included; the round pipeline on a shard), from two timed
  sizes on synthetic rows with the class's parameters.
- `agree`: one all-reduce of the numbers (their mean over ranks), so every rank holds the same.
Timings take the minimum of a few calls after a warm-up: the least disturbed estimate on a busy
machine. It uses its own `Collectives`, so a step's statistics never include it.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..params import SamplingParams
from ..sampling.processors import PROCESSORS
from ..sampling.recipe import SampleArgs, sample_rows
from ..sampling.reducer import LocalRows
from ..sampling.rounds.rounds import ROUNDS
from ..state.rows import RowsView
from ..state.store import RequestStore
from .auto import CommCosts, Features, StepCosts, as_array, from_array
from .collectives import Collectives
from .names import FIXED
from .plan import build_plan
from .shard import vocab_shard
from .strategies import BY_NAME, Step

SMALL_VOCAB = 32768        # CPU intercepts: one row of up to this many columns (GPU: the real V)


def _timed(fn, device, reps: int) -> float:
    """Least seconds of fn() over reps calls, after one warm-up call."""
    return _timed_together([fn], device, reps)[0]


def _timed_together(fns, device, reps: int, comm: Collectives | None = None) -> list[float]:
    """Least seconds of each fn over reps rounds that call every fn once (after a warm-up round).
    comm: align the ranks before each call (one tiny all-reduce), as a real step starts."""
    best = [float("inf")] * len(fns)
    tiny = torch.zeros(1, device=device) if comm is not None else None
    for rep in range(reps + 1):
        for i, fn in enumerate(fns):
            if comm is not None:
                comm.all_reduce(tiny)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if rep:
                best[i] = min(best[i], time.perf_counter() - t0)
    return best


def measure_comm(comm: Collectives, device) -> CommCosts:
    tp = comm.size
    tiny = torch.zeros((1, 16), dtype=torch.int32, device=device)
    lat = _timed(lambda: comm.all_gather(tiny), device, 7)
    nbytes = (16 if device.type == "cuda" else 1) << 20
    rows = 16 * tp                                  # equal splits: every rank sends 16 rows to each
    cols = max(1, nbytes // (rows * 4))
    x = torch.zeros((rows, cols), device=device)

    def gather():
        parts = comm.all_gather(x)
        return torch.cat(list(parts.unbind(0)), dim=1)

    def exchange():
        out = torch.empty((16, tp * cols), device=device)
        return comm.exchange_rows(x, [16] * tp, out, [(r * cols, (r + 1) * cols) for r in range(tp)])

    t_g = _timed(gather, device, 2)
    t_a = _timed(exchange, device, 2)
    received_g = nbytes * (tp - 1)
    received_a = nbytes * (tp - 1) / tp
    return CommCosts(lat, received_g / max(t_g - lat, 1e-7), received_a / max(t_a - lat, 1e-7))


def class_params(f: Features) -> SamplingParams:
    """One request's parameters standing for the feature class."""
    if not f.sample:
        return SamplingParams(temperature=0.0, logprobs=f.logprobs - 1 if f.logprobs else None,
                              logprobs_mode="processed" if f.processed else "raw")
    return SamplingParams(temperature=0.8, top_k=f.k_max if f.k_max else -1,
                          top_p=0.9 if (f.top_p or f.top_p_k) else 1.0, min_p=0.05 if f.min_p else 0.0,
                          seed=7, logprobs=f.logprobs - 1 if f.logprobs else None,
                          logprobs_mode="processed" if f.processed else "raw")


def measure_class(f: Features, vocab: int, comm: Collectives, device) -> StepCosts:
    """Intercepts of the three strategies and per-element costs of the two local paths."""
    small = vocab if device.type == "cuda" else min(vocab, SMALL_VOCAB)
    return StepCosts(small, _intercepts(f, small, comm, device), *_slopes(f, vocab, comm.size, device))


def _store(f: Features, vocab: int, n: int, device) -> RequestStore:
    store = RequestStore(vocab, n, None, PROCESSORS)
    for i in range(n):
        store.add(f"c{i}", class_params(f), [1, 2], 1000 + i)
    store.sync(device, 2)
    return store


def _intercepts(f: Features, small: int, comm: Collectives, device) -> tuple[float, float, float]:
    """Each strategy's real step (collectives included) for one row of `small` columns."""
    tp, rank = comm.size, comm.group.rank
    store = _store(f, small, 1, device)
    start, end = vocab_shard(small, tp, rank)
    x = torch.randn((1, end - start), generator=torch.Generator().manual_seed(rank)).to(device) * 3
    calls = []
    for name in FIXED:
        plan = build_plan(BY_NAME[name], tp, ["c0"], np.zeros(1, np.int64), np.zeros(1, np.int64),
                          np.zeros((1, 0), np.int64), f.logprobs, None, 0, small)
        calls.append(lambda p=plan: _strategy_step(x, p, Step(store, small, start, end, comm)))
    return tuple(_timed_together(calls, device, 2, comm))


def _strategy_step(x: torch.Tensor, plan, step: Step):
    """A strategy's step without the history append: before, the recipe, after."""
    strategy = plan.sharding
    return strategy.after(sample_rows(strategy.before(x, plan, step)), plan, step)


def _slopes(f: Features, vocab: int, tp: int, device) -> tuple[float, float]:
    """Seconds per element: the full-row path (cols = V) and the split path (cols = V / TP),
    from one row of cols / 16 and about `elems` elements of rows of the real width (per-element
    costs depend on the row length: a long row's temporaries leave the caches)."""
    gpu = device.type == "cuda"
    elems = 1 << (22 if gpu else 16)
    width = -(-vocab // tp)
    sizes = {}
    for name, cols in (("full", vocab), ("split", width)):
        sizes[name] = (max(1, cols // 16), cols, max(1, min(elems // cols, 512)))
    rows = max(r for _, _, r in sizes.values())
    store = _store(f, vocab, rows, device)
    logits = torch.randn((rows, vocab), generator=torch.Generator().manual_seed(3)).to(device) * 3

    def run(name, r, c):
        x = logits[:r, :c].contiguous()
        view = RowsView(np.arange(r), np.zeros(r, np.int64), np.full(r, -1, np.int64))
        b = store.row_batch(view, device)
        args = SampleArgs(x, 0, b, LocalRows())
        if name == "split":
            return lambda: sample_rows(args, backend=ROUNDS)
        return lambda: sample_rows(args)

    calls = [run(name, r, c) for name in ("full", "split") for r, c in ((1, sizes[name][0]), (sizes[name][2], sizes[name][1]))]
    t = _timed_together(calls, device, 2)          # interleaved: both paths see the same machine
    out = []
    for i, name in enumerate(("full", "split")):
        small, big, r = sizes[name]
        out.append(max((t[2 * i + 1] - t[2 * i]) / max(r * big - small, 1), 0.0))
    return tuple(out)


def agree(comm: Collectives, comm_costs: CommCosts, step: StepCosts, device) -> tuple[CommCosts, StepCosts]:
    """One all-reduce: every rank then holds the same numbers, the mean of the ranks' measurements
    (inverse bandwidths, so slow links weigh in)."""
    v = torch.tensor(as_array(comm_costs, step), dtype=torch.float64)
    if comm.group.backend == "nccl":
        v = v.to(device)
    return from_array((comm.all_reduce(v, "sum") / comm.size).cpu().numpy())
