"""What every strategy shares: turning requests into row specs and sampling a block of rows.

`sample_requests` runs the pipeline for the rows of the given requests and returns the packed
per-request block (see `sampling.output.assemble`) plus per-row logprobs padded to the plan's
logprobs width. The strategies differ only in which rows and columns a rank holds and in the
reducer they pass.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ..sampling.batch import RowSpec, build_row_batch
from ..sampling.output import assemble
from ..sampling.fastpath import sample_rows_split
from ..sampling.pipeline import sample_rows
from ..sampling.state import RequestState
from .collectives import Collectives
from .plan import SamplingPlan


class MemoryMeter:
    """Peak bytes of the sampler's own buffers in one step (CPU: counted from tensor sizes)."""

    def __init__(self):
        self.current = 0
        self.peak = 0

    def hold(self, nbytes: int) -> None:
        self.current += int(nbytes)
        self.peak = max(self.peak, self.current)

    def note(self, nbytes: int) -> None:
        self.peak = max(self.peak, self.current + int(nbytes))


@dataclass
class StepContext:
    requests: list[RequestState]       # per request of the plan, batch order
    vocab_size: int
    col_start: int                     # this rank's vocab shard
    col_end: int
    eos_token_id: Optional[int]
    comm: Collectives
    meter: MemoryMeter = field(default_factory=MemoryMeter)
    draft_probs: Optional[torch.Tensor] = None   # [rows, V_r], rows in logits_order
    inplace: bool = False              # the caller lets the sampler overwrite fp32 local logits

    @property
    def rank(self) -> int:
        return self.comm.group.rank


def row_specs(plan: SamplingPlan, requests: list[RequestState], req_indices) -> list[RowSpec]:
    specs = []
    for i in req_indices:
        drafts = plan.draft_token_ids[i]
        for j in range(plan.rows_per_req[i]):
            tok = drafts[j] if j < len(drafts) else -1
            specs.append(RowSpec(requests[i], j, tok, tuple(drafts[:j])))
    return specs


def sample_requests(x: torch.Tensor, col_start: int, plan: SamplingPlan, ctx: StepContext,
                    req_indices, red, bitmask: Optional[torch.Tensor],
                    draft_probs: Optional[torch.Tensor], inplace: bool = False):
    """(block [len(req_indices), max_rows + 4] int64, logprobs tuple or None) for these requests."""
    specs = row_specs(plan, ctx.requests, req_indices)
    res = sample_rows_split(x, col_start, specs, ctx.vocab_size, ctx.eos_token_id, red, bitmask,
                            draft_probs, ctx.meter, inplace)
    if res is None:
        b = build_row_batch(specs, ctx.vocab_size, ctx.eos_token_id)
        res = sample_rows(x, col_start, b, red, bitmask=bitmask, draft_probs=draft_probs, meter=ctx.meter,
                          inplace=inplace)
    rows_per_req = [plan.rows_per_req[i] for i in req_indices]
    block = assemble(res.emitted, res.accepted, res.fallback, res.num_nans, rows_per_req, plan.max_rows)
    lp = None
    if plan.logprobs_width > 0:
        lp = pad_logprobs(res, len(specs), plan.logprobs_width, x.device)
    return block, lp


def pad_logprobs(res, num_rows: int, width: int, device):
    ids = torch.full((num_rows, width), -1, dtype=torch.int64, device=device)
    vals = torch.full((num_rows, width), float("-inf"), device=device)
    ranks = torch.zeros(num_rows, dtype=torch.int64, device=device)
    if res.lp_ids is not None:
        w = res.lp_ids.shape[1]
        ids[:, :w], vals[:, :w], ranks[:] = res.lp_ids, res.lp_vals, res.lp_ranks
    return ids, vals, ranks


def pad_columns(x: torch.Tensor, width: int) -> torch.Tensor:
    if x.shape[1] == width:
        return x
    out = x.new_zeros((x.shape[0], width))
    out[:, : x.shape[1]] = x
    return out
