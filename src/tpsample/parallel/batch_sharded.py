"""Batch-sharded strategy (the vLLM MRV2 design, PR #50465).

Contract: in: this rank's `[rows, V_r]` shard with rows in `plan.logits_order` (owner-sorted).
1. One all-to-all turns `[rows, V_r]` into `[rows_own, V]`: full rows of the requests this rank
   owns (owner = slot % TP); received `[TP, rows_own, V_r]` is laid side by side, vocab padding
   dropped.
2. The rank samples its own requests only (their grammar rows, drafts, penalties).
3. One packed int64 all-gather of (tokens, num_sampled, num_rejected, NaN and guard counts),
   padded to the largest shard, plus at most two gathers for logprobs; batch order restored.
A rank that owns nothing still joins every collective. out: identical on every rank.
"""
from __future__ import annotations

import torch

from ..sampling.output import LogprobsOutput, unpack
from ..sampling.reducer import LocalRows
from .common import StepContext, pad_columns, sample_requests
from .plan import SamplingPlan
from .shard import vocab_shard


def to_owned_rows(x: torch.Tensor, plan: SamplingPlan, ctx: StepContext) -> torch.Tensor:
    """All-to-all: [rows, V_r] (owner-sorted) -> [rows_own, V] full rows of owned requests."""
    tp, me = ctx.comm.size, ctx.rank
    if tp == 1:
        return x
    shards = [vocab_shard(ctx.vocab_size, tp, r) for r in range(tp)]
    width = max(e - s for s, e in shards)
    own = plan.rows_per_rank[me]
    recv = ctx.comm.all_to_all(pad_columns(x, width), list(plan.rows_per_rank), [own] * tp)
    ctx.meter.hold(recv.numel() * recv.element_size())
    recv = recv.view(tp, own, width)
    full = torch.cat([recv[r, :, : e - s] for r, (s, e) in enumerate(shards)], dim=1)
    ctx.meter.hold(full.numel() * full.element_size())
    return full


class BatchSharded:
    name = "batch_sharded"

    def sample(self, x: torch.Tensor, plan: SamplingPlan, ctx: StepContext):
        me, comm = ctx.rank, ctx.comm
        owned = plan.owned_reqs[me]
        full = to_owned_rows(x, plan, ctx)
        probs = None if ctx.draft_probs is None else to_owned_rows(ctx.draft_probs, plan, ctx)
        rows = plan.batch_rows(owned)
        mask = None
        if plan.grammar_bitmask is not None:
            mask = plan.grammar_bitmask[torch.tensor(rows, dtype=torch.int64)]
        block, lp = sample_requests(full, 0, plan, ctx, owned, LocalRows(), mask, probs,
                                    inplace=ctx.inplace or comm.size > 1)
        max_own = max(len(o) for o in plan.owned_reqs)
        gathered = comm.all_gather(_pad_rows(block, max_own).to(x.device)).cpu()
        out = torch.empty((plan.num_reqs, block.shape[1]), dtype=torch.int64)
        for r, reqs in enumerate(plan.owned_reqs):
            if reqs:
                out[list(reqs)] = gathered[r, : len(reqs)]
        logprobs = None if lp is None else self._gather_logprobs(lp, plan, ctx)
        return unpack(out, plan.max_rows, logprobs)

    def _gather_logprobs(self, lp, plan: SamplingPlan, ctx: StepContext) -> LogprobsOutput:
        ids, vals, ranks = lp
        max_rows_own = max(plan.rows_per_rank)
        ints = _pad_rows(torch.cat([ids, ranks.unsqueeze(1)], dim=1), max_rows_own)
        g_ints = ctx.comm.all_gather(ints).cpu()                       # [tp, max_rows_own, w + 1]
        g_vals = ctx.comm.all_gather(_pad_rows(vals, max_rows_own)).cpu()
        w = plan.logprobs_width
        out_ids = torch.empty((plan.num_rows, w), dtype=torch.int64)
        out_vals = torch.empty((plan.num_rows, w), dtype=torch.float32)
        out_ranks = torch.empty(plan.num_rows, dtype=torch.int64)
        for r, reqs in enumerate(plan.owned_reqs):
            rows = plan.batch_rows(reqs)
            if rows:
                n = len(rows)
                out_ids[rows], out_ranks[rows] = g_ints[r, :n, :w], g_ints[r, :n, w]
                out_vals[rows] = g_vals[r, :n]
        return LogprobsOutput(out_ids, out_vals, out_ranks)


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x
    out = x.new_zeros((rows, *x.shape[1:]))
    out[: x.shape[0]] = x
    return out
