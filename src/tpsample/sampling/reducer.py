"""Row reducers: how per-row partial results over a column range become row-wide results.

The sampling pipeline never knows whether it holds a full row or a vocab shard. It reduces
through one of these:
- `LocalRows`: the row is whole on this rank; every reduction is the identity.
- `tpsample.parallel.strategies.ShardReducer`: the row is split by vocabulary across the TP
  group; reductions are collectives (max, exact integer sums, gathers of small per-part lists).
Every reduction used is order-independent (max, integer sums, concatenation followed by a
total-order sort), or, for float sums, only feeds logprob values (tolerance 1e-5), so every
strategy and TP size yields the same tokens bitwise.

`Packet` is how the vocab-parallel rounds (`rounds/`) talk: mixed-dtype per-row fields packed
into one int32 buffer and gathered with one `red.gather`, each field handed back as
`[parts, *shape]` in its own dtype. Floats travel as their bits, so nothing is rounded; fields are
padded to an even number of words so 64-bit fields view back in place. `best_part` picks the
winning part of (value, id) candidates the way every draw does: largest value, ties -> lowest id.
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
    """Row-wise best (value, id) over [rows, parts] candidates (`best_part`)."""
    win = best_part(values.t(), ids.t())
    return take(values.t(), win), take(ids.t(), win)


_WIDE = (torch.int64, torch.float64)


class Packet:
    def __init__(self):
        self._fields: list[tuple[torch.dtype, tuple, int]] = []   # dtype, shape, words
        self._words: list[torch.Tensor] = []

    def add(self, t: torch.Tensor) -> int:
        """Queue a field; returns its index in the gathered list."""
        t = t.contiguous()
        if t.dtype == torch.float32:
            w = t.view(torch.int32)
        elif t.dtype in _WIDE or t.dtype == torch.int32:
            w = t.view(torch.int32) if t.numel() else t.new_zeros(0, dtype=torch.int32)
        else:
            raise TypeError(f"cannot pack {t.dtype}")
        w = w.reshape(-1)
        if w.numel() % 2:
            w = torch.cat([w, w.new_zeros(1)])
        self._fields.append((t.dtype, tuple(t.shape), w.numel()))
        self._words.append(w)
        return len(self._fields) - 1

    def gather(self, red) -> list[torch.Tensor]:
        """One collective; field i comes back as [parts, *shape_i] in its dtype."""
        flat = torch.cat(self._words) if self._words else torch.zeros(0, dtype=torch.int32)
        parts = red.gather(flat.unsqueeze(0))[0]                      # [parts, words]
        out, off = [], 0
        for dtype, shape, n in self._fields:
            w = parts[:, off:off + n]
            off += n
            width = 2 if dtype in _WIDE else 1
            count = 1
            for s in shape:
                count *= s
            w = w[:, : count * width]
            if dtype in _WIDE:
                w = w.contiguous().view(dtype)
            elif dtype == torch.float32:
                w = w.contiguous().view(torch.float32)
            out.append(w.reshape(parts.shape[0], *shape))
        return out


def best_part(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Index along dim 0 of the best (value, id) per position: largest value, ties -> lowest id.

    values [parts, ...] float (no NaN), ids [parts, ...] int. Ties of value and id (empty
    candidates) go to the first part, the same on every rank."""
    best = values.amax(dim=0, keepdim=True)
    big = torch.iinfo(torch.int64).max
    key = torch.where(values == best, ids.to(torch.int64), torch.full_like(ids, big, dtype=torch.int64))
    return key.argmin(dim=0)


def take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[index[...], ...] along dim 0: the chosen part's entry per position."""
    return x.gather(0, index.unsqueeze(0)).squeeze(0)
