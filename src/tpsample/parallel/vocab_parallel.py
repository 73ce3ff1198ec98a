"""Vocab-parallel strategy: exact sampling from the shards; no rank ever holds a full row.

Contract: in: this rank's `[rows, V_r]` shard in batch order. The single pipeline runs on the
shard with `ShardReducer`, whose reductions are collectives over O(rows x (TP x small)) values:
max and integer sums (all-reduce), candidate lists (all-gather), (value, id) winners. out:
identical `SamplerOutput` on every rank; the same tokens as every other strategy, because each
reduction is order-independent. Never imports model or engine code.
"""
from __future__ import annotations

import torch

from ..sampling.output import LogprobsOutput
from ..sampling.reducer import LocalRows, best_of_parts
from .collectives import Collectives
from .common import StepContext, StepResult, sample_requests
from .plan import SamplingPlan


class ShardReducer:
    """Row reductions across the TP group for rows split by vocabulary."""

    def __init__(self, comm: Collectives):
        self.comm = comm
        self.num_parts = comm.size

    def max(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(x, "max")

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(x, "sum")

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_gather(x).permute(1, 0, 2)   # [rows, tp, c]

    def argmax_pair(self, values: torch.Tensor, ids: torch.Tensor):
        packed = torch.stack([values.double(), ids.double()], dim=1)   # ids < 2**53: exact
        parts = self.gather(packed)                      # [rows, tp, 2]
        return best_of_parts(parts[:, :, 0].to(values.dtype), parts[:, :, 1].to(torch.int64))


class VocabParallel:
    name = "vocab_parallel"

    def sample(self, x: torch.Tensor, plan: SamplingPlan, ctx: StepContext):
        # at TP=1 the shard is the full row: the full-row path (and its kernels) applies
        red = ShardReducer(ctx.comm) if ctx.comm.size > 1 else LocalRows()
        block, lp = sample_requests(x, ctx.col_start, plan, ctx, None, red,
                                    plan.grammar_bitmask, ctx.draft_probs, inplace=ctx.inplace)
        return StepResult(block, None if lp is None else LogprobsOutput(*lp))
