"""The rows a sampling path takes, as one bundle (`SampleArgs`).

Every path that samples a block of rows (`run.sample_batch`, the kernels' `fastpath`, the torch
`pipeline`, the vocab-parallel rounds) takes the same eight values: the logits rows, where their
columns sit in the vocabulary, the rows' parameters, the reducer, and the optional grammar mask,
draft distributions, memory meter and in-place flag. They travel together as one `SampleArgs`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

import torch

from ..state.rowbatch import RowBatch


@dataclass(frozen=True)
class SampleArgs:
    """x: [rows, cols] logits (any float dtype) holding global columns [col_start, col_start +
    cols); batch: the rows' parameters and state; red: the reducer (`LocalRows` for full rows,
    a shard reducer under vocab parallelism); bitmask: optional int32 [rows, words] grammar mask;
    draft_probs: optional [rows, cols] draft distributions; meter: optional memory meter;
    inplace: x may serve as the working buffer (an fp32 x then ends up holding the processed
    rows)."""
    x: torch.Tensor
    col_start: int
    batch: RowBatch
    red: Any
    bitmask: Optional[torch.Tensor] = None
    draft_probs: Optional[torch.Tensor] = None
    meter: Any = None
    inplace: bool = False

    def rows(self, idx: torch.Tensor, batch: RowBatch) -> "SampleArgs":
        """The rows `idx` (device indices) with their own batch, as copies (so in place)."""
        pick = lambda t: None if t is None else t.to(self.x.device).index_select(0, idx)  # noqa: E731
        return replace(self, x=self.x.index_select(0, idx), batch=batch, bitmask=pick(self.bitmask),
                       draft_probs=pick(self.draft_probs), inplace=True)
