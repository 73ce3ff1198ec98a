"""Replicated strategy (the baseline most engines run).

Contract: in: this rank's `[rows, V_r]` shard in batch order. One all-gather builds the full
`[rows, V]` logits on every rank, and every rank samples the whole batch with the single-rank
pipeline. out: identical `SamplerOutput` on every rank. Costs TP copies of the full logits.
"""
from __future__ import annotations

import torch

from ..sampling.output import LogprobsOutput
from ..sampling.reducer import LocalRows
from .common import StepContext, StepResult, pad_columns, sample_requests
from .plan import SamplingPlan
from .shard import vocab_shard


def gather_vocab(x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    """[rows, V_r] shards -> [rows, V] on every rank (shards may be uneven)."""
    tp = ctx.comm.size
    if tp == 1:
        return x
    widths = [e - s for s, e in (vocab_shard(ctx.vocab_size, tp, r) for r in range(tp))]
    parts = ctx.comm.all_gather(pad_columns(x, max(widths)))          # [tp, rows, V_r max]
    ctx.meter.hold(parts.numel() * parts.element_size())
    full = torch.cat([parts[r, :, : widths[r]] for r in range(tp)], dim=1)
    ctx.meter.hold(full.numel() * full.element_size())
    return full


class Replicated:
    name = "replicated"

    def sample(self, x: torch.Tensor, plan: SamplingPlan, ctx: StepContext):
        full = gather_vocab(x, ctx)
        probs = None if ctx.draft_probs is None else gather_vocab(ctx.draft_probs, ctx)
        block, lp = sample_requests(full, 0, plan, ctx, None, LocalRows(),
                                    plan.grammar_bitmask, probs, inplace=ctx.inplace or ctx.comm.size > 1)
        return StepResult(block, None if lp is None else LogprobsOutput(*lp))
