"""One collective per round: mixed-dtype per-row fields packed into a single int32 buffer.

`Packet` collects tensors (fp32, int32, int64, fp64; any shape) as int32 words, gathers them with
one `red.gather` call and hands each field back as `[parts, *shape]` in its own dtype. Floats
travel as their bits, so nothing is rounded. Fields are padded to an even number of words so
64-bit fields can be viewed back in place.

`best_part` picks the winning part of (value, id) candidates the way every draw does: largest
value, ties -> lowest id.
"""
from __future__ import annotations

import torch

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
