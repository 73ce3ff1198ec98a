"""`auto`: pick a strategy per step from a cost model (rows, vocab, TP, features, device).

Estimated step time of strategy s = collectives(s) * latency + bytes(s) / bandwidth
                                   + elements(s) / throughput
- replicated: 1 all-gather of [R, V_r] (each rank receives (TP-1)/TP of R x V x 4 bytes) and
  every rank processes R x V elements.
- batch_sharded: 1 all-to-all (each rank receives about (TP-1)/TP of R/TP x V x 4 bytes), 1-3
  small gathers; each rank processes about R/TP x V elements (ceil by owner balance).
- vocab_parallel: no row moves, but a few small collectives (1 for the draw, +1 for top-k, +2 for
  top-p without top-k, +2 per logprob kind); each rank processes R x V/TP elements.
Constants are per device kind (gloo on CPU: slow small collectives; NCCL on GPU: fast links).
At TP=1 every strategy is the same computation and `replicated` (no collectives) is chosen.
See docs/auto.md for the measurements behind the constants.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CostConstants:
    latency_s: float          # one small collective
    bandwidth_Bps: float      # per-rank link bandwidth
    elems_per_s: float        # sampler throughput, elements of logits per second per rank


CPU_GLOO = CostConstants(latency_s=150e-6, bandwidth_Bps=2e9, elems_per_s=1.5e8)
GPU_NCCL = CostConstants(latency_s=25e-6, bandwidth_Bps=150e9, elems_per_s=4e11)


def vocab_parallel_collectives(top_k: bool, top_p: bool, min_p: bool, logprobs: bool) -> int:
    """Collectives of one vocab-parallel step (see sampling/pipeline.py and topp.py)."""
    n = 1                                # one gather: raw argmax, greedy and drawn winners, NaNs
    n += 1 if top_k else 0               # top-k candidates (a rare second round is not counted)
    n += 1 if (min_p and not top_k) else 0    # the row max (top-k candidates carry it otherwise)
    n += 2 if (top_p and not top_k) else 0    # max + candidates; with top-k, none
    n += 2 if logprobs else 0            # statistics gather + rank count, per logprob kind
    return n


def estimate(strategy: str, rows: int, vocab: int, tp: int, owner_rows: int, n_vp: int,
             c: CostConstants) -> float:
    row_bytes = vocab * 4
    if strategy == "replicated":
        return c.latency_s + rows * row_bytes * (tp - 1) / tp / c.bandwidth_Bps + rows * vocab / c.elems_per_s
    if strategy == "batch_sharded":
        moved = owner_rows * row_bytes * (tp - 1) / tp
        return 2 * c.latency_s + moved / c.bandwidth_Bps + owner_rows * vocab / c.elems_per_s
    if strategy == "vocab_parallel":
        return n_vp * c.latency_s + rows * math.ceil(vocab / tp) / c.elems_per_s
    raise ValueError(f"unknown strategy {strategy!r}")


def choose(rows: int, vocab: int, tp: int, owner_rows: int, *, top_k: bool, top_p: bool,
           min_p: bool, logprobs: bool, on_gpu: bool) -> str:
    """The strategy with the lowest estimated time (ties -> the less memory-hungry one)."""
    if tp == 1:
        return "replicated"
    c = GPU_NCCL if on_gpu else CPU_GLOO
    n_vp = vocab_parallel_collectives(top_k, top_p, min_p, logprobs)
    order = ["vocab_parallel", "batch_sharded", "replicated"]      # least memory first
    costs = {s: estimate(s, rows, vocab, tp, owner_rows, n_vp, c) for s in order}
    return min(order, key=lambda s: costs[s])
