"""Row reducers: how per-row partial results over a column range become row-wide results.

The sampling pipeline never knows whether it holds a full row or a vocab shard. It reduces
through one of these:
- `LocalRows`: the row is whole on this rank; every reduction is the identity.
- `tpsample.parallel.strategies.ShardReducer`: the row is split by vocabulary across the TP
  group; reductions are collectives (max, exact integer sums, gathers of small per-part lists).
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

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, c] per part -> [rows, parts, c] (part order)."""
        return x.unsqueeze(1)

    def argmax_pair(self, values: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return values, ids


def combine_pairs(red, pairs: list[tuple[torch.Tensor, torch.Tensor]], extra: torch.Tensor | None = None):
    """Row-wide winners of several local (fp32 value, id) pairs with one int32 gather.

    Values travel as their fp32 bits, ids as int32 (V < 2**31), so nothing is rounded.
    extra: optional [rows] integer counts summed over parts in the same gather.
    Returns the list of (value, id) winners, and the summed extra (or None).
    """
    cols = [t for v, i in pairs for t in (v.float().view(torch.int32), i.to(torch.int32))]
    if extra is not None:
        cols.append(extra.to(torch.int32))
    parts = red.gather(torch.stack(cols, dim=1))                      # [rows, parts, 2k (+1)] int32
    out = []
    for k in range(len(pairs)):
        vals = parts[:, :, 2 * k].contiguous().view(torch.float32)
        out.append(best_of_parts(vals, parts[:, :, 2 * k + 1].to(torch.int64)))
    total = parts[:, :, -1].to(torch.int64).sum(dim=1) if extra is not None else None
    return out, total


def best_of_parts(values: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise best (value, id) over [rows, parts] candidates: largest value, ties -> lowest id."""
    best = values.max(dim=1).values
    big = torch.iinfo(torch.int64).max
    cand = ids.masked_fill(values != best.unsqueeze(1), big)
    # NaN never occurs here (the pipeline maps NaN to -inf), so `best` is comparable.
    return best, cand.min(dim=1).values
