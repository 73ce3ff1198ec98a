"""Sampler outputs, and the per-request assembly of per-row results (spec decode aware)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class LogprobsOutput:
    token_ids: torch.Tensor     # [rows, 1 + n] int64: column 0 the sampled token, then the top-n (-1 pad)
    logprobs: torch.Tensor      # [rows, 1 + n] fp32 (-inf pad)
    ranks: torch.Tensor         # [rows] int64: rank of the sampled token (1 = most likely)


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor   # [num_reqs, max_rows] int64, -1 = padding
    num_sampled: torch.Tensor         # [num_reqs] int64: tokens emitted this step
    num_rejected: torch.Tensor        # [num_reqs] int64: drafts rejected
    num_nans: torch.Tensor            # [num_reqs] int64: NaNs in the request's raw rows
    num_fallback: torch.Tensor        # [num_reqs] int64: rows where the guard chose the token
    logprobs: Optional[LogprobsOutput] = None   # rows in batch order, one per logits row

    def tokens(self, i: int) -> list[int]:
        """The tokens request i emitted this step."""
        return self.sampled_token_ids[i, : int(self.num_sampled[i])].tolist()


def assemble(emitted: torch.Tensor, accepted: torch.Tensor, fallback: torch.Tensor,
             num_nans: torch.Tensor, rows_per_req: list[int], max_rows: int) -> torch.Tensor:
    """Per-request packed block [num_reqs, max_rows + 4] int64 from per-row results.

    Rows come request by request (drafts first, bonus row last). A request emits its accepted
    draft tokens up to the first rejection, then that row's emitted token (the residual), or,
    if every draft is accepted, the bonus row's token. Columns: tokens (-1 pad), num_sampled,
    num_rejected, num_nans, num_fallback.
    """
    num_reqs = len(rows_per_req)
    out = torch.full((num_reqs, max_rows + 4), -1, dtype=torch.int64)
    emitted, accepted = emitted.cpu(), accepted.cpu()
    fallback, num_nans = fallback.cpu(), num_nans.cpu()
    if all(n == 1 for n in rows_per_req):        # no drafts: one row per request, no walk needed
        out[:, 0] = emitted
        out[:, max_rows] = 1
        out[:, max_rows + 1] = 0
        out[:, max_rows + 2] = num_nans
        out[:, max_rows + 3] = fallback.to(torch.int64)
        return out
    start = 0
    for r, n in enumerate(rows_per_req):
        acc = accepted[start:start + n - 1].tolist()
        k = next((j for j, a in enumerate(acc) if not a), n - 1)   # first rejected row, or bonus
        out[r, : k + 1] = emitted[start:start + k + 1]
        out[r, max_rows] = k + 1
        out[r, max_rows + 1] = (n - 1) - k
        out[r, max_rows + 2] = int(num_nans[start:start + n].sum())
        out[r, max_rows + 3] = int(fallback[start:start + k + 1].sum())   # rows that emitted a token
        start += n
    return out


def unpack(block: torch.Tensor, max_rows: int, logprobs: Optional[LogprobsOutput]) -> SamplerOutput:
    return SamplerOutput(
        sampled_token_ids=block[:, :max_rows].contiguous(),
        num_sampled=block[:, max_rows].contiguous(),
        num_rejected=block[:, max_rows + 1].contiguous(),
        num_nans=block[:, max_rows + 2].contiguous(),
        num_fallback=block[:, max_rows + 3].contiguous(),
        logprobs=logprobs,
    )
