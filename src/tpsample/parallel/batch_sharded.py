"""Batch-sharded strategy (the vLLM MRV2 design, PR #50465).

Contract: in: this rank's `[rows, V_r]` shard with rows in `plan.logits_order` (owner-sorted).
1. One all-to-all turns `[rows, V_r]` into `[rows_own, V]`: full rows of the requests this rank
   owns (owner = slot % TP); received `[TP, rows_own, V_r]` is laid side by side, vocab padding
   dropped.
2. The rank samples its own requests only (their grammar rows, drafts, penalties).
3. One packed int64 all-gather of (tokens, num_sampled, num_rejected, NaN and guard counts),
   padded to the largest shard, plus one more for logprobs (ids, ranks and fp32 bits packed);
   batch order is restored by one device gather. Nothing crosses to the host.
A rank that owns nothing still joins every collective. out: identical on every rank.
"""
from __future__ import annotations

import numpy as np
import torch

from ..sampling.output import LogprobsOutput
from ..sampling.reducer import LocalRows
from .common import StepContext, StepResult, pad_columns, pad_rows, sample_requests
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


def _index(values: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)).to(device, non_blocking=True)


def _lp_index(plan: SamplingPlan) -> np.ndarray:
    """[num_rows]: where each batch row's logprobs land in the gathered [tp x max_rows_own] block."""
    max_rows_own = max(plan.rows_per_rank)
    index = np.zeros(plan.num_rows, np.int64)
    for r, reqs in enumerate(plan.owned_reqs):
        rows = plan.batch_rows(reqs)
        index[rows] = r * max_rows_own + np.arange(len(rows))
    return index


class BatchSharded:
    name = "batch_sharded"

    def sample(self, x: torch.Tensor, plan: SamplingPlan, ctx: StepContext) -> StepResult:
        me, comm = ctx.rank, ctx.comm
        owned = plan.owned_reqs[me]
        full = to_owned_rows(x, plan, ctx)
        probs = None if ctx.draft_probs is None else to_owned_rows(ctx.draft_probs, plan, ctx)
        mask = None
        if plan.grammar_bitmask is not None:
            mask = plan.grammar_bitmask.index_select(0, _index(plan.batch_rows(owned), plan.grammar_bitmask.device))
        block, lp = sample_requests(full, 0, plan, ctx, owned, LocalRows(), mask, probs,
                                    inplace=ctx.inplace or comm.size > 1)
        max_own = max(len(o) for o in plan.owned_reqs)
        gathered = comm.all_gather(pad_rows(block, max_own))                   # [tp, max_own, w]
        out = gathered.reshape(-1, block.shape[1]).index_select(0, plan.device_array("gather", plan.gather_index,
                                                                                      block.device))
        logprobs = None if lp is None else self._gather_logprobs(lp, plan, ctx)
        return StepResult(out, logprobs)

    def _gather_logprobs(self, lp, plan: SamplingPlan, ctx: StepContext) -> LogprobsOutput:
        ids, vals, ranks = lp
        w = plan.logprobs_width
        max_rows_own = max(plan.rows_per_rank)
        packed = torch.cat([ids, ranks.unsqueeze(1), vals.view(torch.int32).to(torch.int64)], dim=1)
        g = ctx.comm.all_gather(pad_rows(packed, max_rows_own))                 # [tp, max_rows_own, 2w + 1]
        g = g.reshape(-1, 2 * w + 1).index_select(0, plan.device_array("lp_gather", _lp_index(plan), g.device))
        return LogprobsOutput(g[:, :w].contiguous(), g[:, w + 1:].to(torch.int32).view(torch.float32).contiguous(),
                              g[:, w].contiguous())
