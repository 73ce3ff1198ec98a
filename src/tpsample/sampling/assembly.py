"""The per-request assembly of per-row results (spec decode aware), on the device.

`assemble` packs each request's emitted tokens and counts into one int64 block with tensor ops
(no loop over requests); `RequestRows` says where each request's rows are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


@dataclass(frozen=True)
class RequestRows:
    """Where each request's rows are: index [num_reqs, max_rows] int64 batch rows (0 padded),
    valid [num_reqs, max_rows] bool, num_rows [num_reqs] int64; all on the device."""
    index: torch.Tensor
    valid: torch.Tensor
    num_rows: torch.Tensor

    @staticmethod
    def build(rows_per_req: np.ndarray, max_rows: int, device) -> "RequestRows":
        start = np.cumsum(rows_per_req) - rows_per_req
        j = np.arange(max_rows)[None, :]
        valid = j < rows_per_req[:, None]
        index = np.where(valid, start[:, None] + j, 0)
        packed = torch.from_numpy(np.concatenate([index, valid, rows_per_req[:, None]], axis=1).astype(np.int64))
        if torch.device(device).type == "cuda":
            packed = packed.pin_memory()
        packed = packed.to(device, non_blocking=True)
        return RequestRows(packed[:, :max_rows], packed[:, max_rows:2 * max_rows].bool(), packed[:, -1])


def assemble(emitted: torch.Tensor, accepted: torch.Tensor, fallback: torch.Tensor, num_nans: torch.Tensor,
             layout: Optional[RequestRows], max_rows: int) -> torch.Tensor:
    """Per-request packed block [num_reqs, max_rows + 4] int64 (device) from per-row results.

    Rows come request by request (drafts first, bonus row last). A request emits its accepted
    draft tokens up to the first rejection, then that row's emitted token (the residual), or,
    if every draft is accepted, the bonus row's token. Columns: tokens (-1 pad), num_sampled,
    num_rejected, num_nans, num_fallback (rows that emitted a token through the guard).
    layout None: one row per request (no drafts in the step).
    """
    if layout is None:
        ones = torch.ones_like(emitted)
        return torch.stack([emitted, ones, ones - 1, num_nans, fallback.to(torch.int64)], dim=1)
    idx, valid = layout.index, layout.valid
    is_draft = torch.arange(max_rows, device=idx.device).unsqueeze(0) < (layout.num_rows - 1).unsqueeze(1)
    acc = accepted[idx] & is_draft
    k = torch.cumprod(acc.to(torch.int64), dim=1).sum(dim=1)         # leading accepted drafts
    emit = (torch.arange(max_rows, device=idx.device).unsqueeze(0) <= k.unsqueeze(1)) & valid
    tokens = torch.where(emit, emitted[idx], torch.full_like(idx, -1))
    nans = (num_nans[idx] * valid).sum(dim=1)
    fb = (fallback[idx] & emit).sum(dim=1)
    return torch.cat([tokens, torch.stack([k + 1, layout.num_rows - 1 - k, nans, fb], dim=1)], dim=1)
