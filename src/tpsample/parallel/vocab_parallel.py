"""Vocab-parallel strategy: exact sampling from the shards; no rank ever holds a full row.

Contract: in: this rank's `[rows, V_r]` shard in batch order. At TP > 1 the round pipeline
(`parallel.vocab.split_rows`) samples the shard: one packed gather of per-row summaries when a filter
needs it, one of the winners, one more for logprobs; each is O(rows x TP x small) values through
`ShardReducer`. Steps with draft rows (spec decode) take the general pipeline on the shard, whose
reductions are more, smaller collectives. out: identical `SamplerOutput` on every rank; the same
tokens as every other strategy, because each reduction is order-independent. At TP = 1 the shard
is the full row and the full-row path (and its kernels) applies. Never imports model or engine code.
"""
from __future__ import annotations

import torch

from ..sampling.output import LogprobsOutput
from ..sampling.reducer import LocalRows, best_of_parts
from .collectives import Collectives
from .common import StepContext, StepResult, sample_requests
from .plan import SamplingPlan
from .vocab.split_rows import sample_split


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


def _split_batch(a, batch_of):
    """`run.sample_batch`'s signature over the round pipeline (no drafts here)."""
    return sample_split(a)


class VocabParallel:
    name = "vocab_parallel"

    def sample(self, x: torch.Tensor, plan: SamplingPlan, ctx: StepContext):
        if ctx.comm.size == 1:       # the shard is the full row: the full-row path (and its kernels)
            red, fn = LocalRows(), None
        else:
            red = ShardReducer(ctx.comm)
            fn = None if (plan.has_drafts or ctx.draft_probs is not None) else _split_batch
        kw = {} if fn is None else {"sample_fn": fn}
        block, lp = sample_requests(x, ctx.col_start, plan, ctx, None, red,
                                    plan.grammar_bitmask, ctx.draft_probs, inplace=ctx.inplace, **kw)
        return StepResult(block, None if lp is None else LogprobsOutput(*lp))
