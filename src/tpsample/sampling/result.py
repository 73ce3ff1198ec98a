"""RowResult: what sampling a block of rows produces, per row (before per-request assembly)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class RowResult:
    emitted: torch.Tensor              # [rows] int64
    accepted: torch.Tensor             # [rows] bool or 0/1 int64 (0 for rows without a draft)
    fallback: torch.Tensor             # [rows] bool: no finite kept token, guard used
    num_nans: torch.Tensor             # [rows] int64
    lp_ids: Optional[torch.Tensor] = None    # [rows, 1 + n] int64
    lp_vals: Optional[torch.Tensor] = None   # [rows, 1 + n] fp32
    lp_ranks: Optional[torch.Tensor] = None  # [rows] int64
    block: Optional[torch.Tensor] = None     # [rows, 5] packed (one row per request, no drafts):
                                             # emitted, num_nans and fallback are views into it
    exact_rows: int = 0                      # rows that needed the exact (extra-round) top-p path
