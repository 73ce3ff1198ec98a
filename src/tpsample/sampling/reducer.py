"""Row reducers: how per-row partial results over a column range become row-wide results.

The sampling pipeline never knows whether it holds a full row or a vocab shard. It reduces
through one of these:
- `LocalRows`: the row is whole on this rank; every reduction is the identity.
- `tpsample.parallel.vocab_parallel.ShardReducer`: the row is split by vocabulary across the TP
  group; reductions are collectives (max, exact integer sums, concatenations).
Every reduction used is order-independent (max, integer sums, concatenation followed by a
total-order sort), or, for float sums, only feeds logprob values (tolerance 1e-5), so every
strategy and TP size yields the same tokens bitwise.
"""
from __future__ import annotations

import torch


class LocalRows:
    """Reductions for rows held whole by this rank."""

    num_parts = 1

    def max(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def cat(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate [rows, c] parts of all ranks along dim 1 (rank order)."""
        return x

    def argmax_pair(self, values: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return values, ids


def best_of_parts(values: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise best (value, id) over [rows, parts] candidates: largest value, ties -> lowest id."""
    best = values.max(dim=1).values
    big = torch.iinfo(torch.int64).max
    cand = ids.masked_fill(values != best.unsqueeze(1), big)
    # NaN never occurs here (the pipeline maps NaN to -inf), so `best` is comparable.
    return best, cand.min(dim=1).values
