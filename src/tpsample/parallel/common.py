"""What every strategy shares: sampling the rows of some requests and packing the results.

`sample_requests` builds the RowBatch of the given requests' rows from the per-slot state, runs
the sampling path (kernels or torch pipeline), and returns the packed per-request block (see
`sampling.assembly.assemble`) plus per-row logprobs padded to the plan's logprobs width, all on
the logits' device. The strategies differ only in which rows and columns a rank holds, the
reducer they pass, and how results travel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from ..sampling.assembly import RequestRows, assemble
from ..sampling.output import LogprobsOutput
from ..sampling.rows_in import SampleArgs
from ..sampling.run import sample_batch
from ..state.store import RequestStore
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
    store: RequestStore
    vocab_size: int
    col_start: int                     # this rank's vocab shard
    col_end: int
    comm: Collectives
    meter: MemoryMeter = field(default_factory=MemoryMeter)
    draft_probs: Optional[torch.Tensor] = None   # [rows, V_r], rows in logits_order
    inplace: bool = False              # the caller lets the sampler overwrite fp32 local logits
    exact_rows: int = 0                # rows that took vocab-parallel's exact top-p path this step

    @property
    def rank(self) -> int:
        return self.comm.group.rank


@dataclass
class StepResult:
    block: torch.Tensor                        # [num_reqs, max_rows + 4] int64, batch order
    logprobs: Optional[LogprobsOutput] = None  # rows in batch order


def sample_requests(x: torch.Tensor, col_start: int, plan: SamplingPlan, ctx: StepContext,
                    req_indices: Optional[np.ndarray], red, bitmask: Optional[torch.Tensor],
                    draft_probs: Optional[torch.Tensor], inplace: bool = False, sample_fn=sample_batch):
    """(block [len(reqs), max_rows + 4] int64, logprobs tuple or None) for these requests (all when None).

    sample_fn: how the rows are sampled (`run.sample_batch`'s signature)."""
    view = plan.rows_view(req_indices)
    dev = x.device
    b = ctx.store.row_batch(view, dev)
    args = SampleArgs(x, col_start, b, red, bitmask, draft_probs, ctx.meter, inplace)
    res = sample_fn(args, lambda rows: ctx.store.row_batch(view.subset(rows), dev))
    ctx.exact_rows += res.exact_rows
    layout = None
    if plan.has_drafts:
        rows_per_req = plan.rows_per_req if req_indices is None else plan.rows_per_req[req_indices]
        layout = RequestRows.build(rows_per_req, plan.max_rows, dev)
    if layout is None and res.block is not None:      # the kernels packed it already
        block = res.block
    else:
        block = assemble(res.emitted, res.accepted, res.fallback, res.num_nans, layout, plan.max_rows)
    lp = None
    if plan.logprobs_width > 0:
        lp = pad_logprobs(res, view.num_rows, plan.logprobs_width, dev)
    return block, lp


def pad_logprobs(res, num_rows: int, width: int, device):
    if res.lp_ids is not None and res.lp_ids.shape[1] == width:
        return res.lp_ids, res.lp_vals, res.lp_ranks
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


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x
    out = x.new_zeros((rows, *x.shape[1:]))
    out[: x.shape[0]] = x
    return out
