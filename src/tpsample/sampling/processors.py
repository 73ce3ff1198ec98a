"""Column-local logits processors: DESIGN.md section 2, steps 2-6.

Each works in place on `l` ([rows, cols] fp32), which holds global columns
`[col_start, col_start + cols)` of the rows: a full row (col_start = 0) or a vocab shard. Sparse
per-row token lists are filtered to the column range, so the same code serves every strategy.
None of them communicates.
"""
from __future__ import annotations

from typing import Optional

import torch

from .batch import SparseRows

NEG_INF = float("-inf")


def _local(pairs: Optional[SparseRows], col_start: int, cols: int, device):
    """The pairs whose token falls in [col_start, col_start + cols), as local column indices."""
    if pairs is None:
        return None
    keep = (pairs.tokens >= col_start) & (pairs.tokens < col_start + cols)
    rows = pairs.rows[keep].to(device)
    local = (pairs.tokens[keep] - col_start).to(device)
    values = None if pairs.values is None else pairs.values[keep].to(device)
    return rows, local, values


def apply_bitmask(l: torch.Tensor, bitmask: torch.Tensor, col_start: int) -> None:
    """Packed int32 grammar bitmask [rows, ceil(V/32)], bit = 1 allowed: other tokens -> -inf."""
    cols = l.shape[1]
    ids = torch.arange(col_start, col_start + cols, device=l.device)
    words = bitmask.to(l.device).index_select(1, ids // 32)           # [rows, cols] int32
    allowed = ((words >> (ids % 32).to(torch.int32)) & 1).bool()
    l.masked_fill_(~allowed, NEG_INF)


def apply_allowed(l: torch.Tensor, allowed: Optional[SparseRows], col_start: int) -> None:
    """Rows with an allowed list: every other token -> -inf."""
    loc = _local(allowed, col_start, l.shape[1], l.device)
    if loc is None:
        return
    restricted = torch.unique(allowed.rows).to(l.device)
    keep = torch.zeros((restricted.numel(), l.shape[1]), dtype=torch.bool, device=l.device)
    pos = torch.searchsorted(restricted, loc[0])
    keep[pos, loc[1]] = True
    sub = l.index_select(0, restricted).masked_fill_(~keep, NEG_INF)
    l.index_copy_(0, restricted, sub)


def apply_bias(l: torch.Tensor, bias: Optional[SparseRows], col_start: int) -> None:
    loc = _local(bias, col_start, l.shape[1], l.device)
    if loc is not None:
        l.index_put_((loc[0], loc[1]), loc[2], accumulate=True)


def apply_banned(l: torch.Tensor, banned: Optional[SparseRows], col_start: int) -> None:
    """min_tokens stop ids / EOS and bad-word final tokens -> -inf."""
    loc = _local(banned, col_start, l.shape[1], l.device)
    if loc is not None:
        l[loc[0], loc[1]] = NEG_INF


def apply_penalties(l: torch.Tensor, seen: Optional[SparseRows], out_counts: Optional[SparseRows],
                    rep: torch.Tensor, freq: torch.Tensor, pres: torch.Tensor, col_start: int) -> None:
    """Repetition on seen tokens (l > 0: l / r, else l * r), then frequency and presence on outputs."""
    loc = _local(seen, col_start, l.shape[1], l.device)
    if loc is not None:
        rows, cols, _ = loc
        v = l[rows, cols]
        r = rep.to(l.device)[rows]
        l[rows, cols] = torch.where(v > 0, v / r, v * r)
    loc = _local(out_counts, col_start, l.shape[1], l.device)
    if loc is not None:
        rows, cols, counts = loc
        v = l[rows, cols]
        v = v - freq.to(l.device)[rows] * counts
        v = v - pres.to(l.device)[rows] * (counts > 0).float()
        l[rows, cols] = v


def apply_temperature(l: torch.Tensor, temperature: torch.Tensor) -> None:
    """l / T for sampled rows; greedy rows (T == 0) stay as they are."""
    t = temperature.to(l.device)
    t = torch.where(t == 0, torch.ones_like(t), t)
    l.div_(t.unsqueeze(1))


def mask_nans(l: torch.Tensor, chunks) -> torch.Tensor:
    """NaN -> -inf in place, chunk by chunk; returns the per-row NaN counts [rows] int64."""
    counts = torch.zeros(l.shape[0], dtype=torch.int64, device=l.device)
    for s, t in chunks:
        nan_mask = torch.isnan(l[s:t])
        counts[s:t] = nan_mask.sum(dim=1)
        l[s:t].masked_fill_(nan_mask, NEG_INF)
    return counts


def apply_token_processors(l: torch.Tensor, b, col_start: int) -> None:
    """Steps 3-5 in order: allowed ids, logit bias, banned ids (min_tokens, bad words), penalties."""
    apply_allowed(l, b.allowed, col_start)
    apply_bias(l, b.bias, col_start)
    apply_banned(l, b.banned, col_start)
    apply_penalties(l, b.seen, b.out_counts, b.rep, b.freq, b.pres, col_start)
