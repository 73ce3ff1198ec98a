"""Filters as thresholds: min-p, top-k, top-p (steps 7-9 of docs/semantics.md).

Every filter keeps a top set of the row, so it is a per-row threshold `thr`: kept = l >= thr.
Thresholds are computed from partial results over the local columns and a reducer, and they are
mathematically defined quantities, so any exact way to compute them gives the same value:
- min-p: max(l) + log(min_p).
- top-k: the k-th largest value (the union of every part's local top-k holds the global top-k).
- top-p: masses are exact fixed-point integers, e_i = trunc(exp(l_i - m) * 2**shift) in int64,
  so sums are order-independent. The threshold is v* = the smallest kept value with
  sum(e_j : l_j > v*) < p * S (S = total kept mass); see `topp.py`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..numerics import NEG_INF, fixed_point_masses, kept_mask, row_chunks

NUM_CANDIDATES = 64


@dataclass
class Candidates:
    """The sorted union of the parts' largest local values, complete above `bound`.

    values: [rows, U] fp32 descending (-inf padded); bound: [rows]: every value of the row that
    is strictly greater than `bound` is in `values` (-inf: the whole row is there).
    """
    values: torch.Tensor
    bound: torch.Tensor


def min_p_threshold(l: torch.Tensor, min_p: torch.Tensor, red, row_max=None) -> torch.Tensor:
    m = red.max(l.amax(dim=1)) if row_max is None else row_max
    return m + torch.log(min_p.to(l.device))


def local_top_values(l: torch.Tensor, c: int, rows=None) -> torch.Tensor:
    """[rows, c] largest local values, descending, -inf padded."""
    n = l.shape[0] if rows is None else rows.numel()
    out = torch.full((n, c), NEG_INF, dtype=l.dtype, device=l.device)
    k = min(c, l.shape[1])
    # row chunks: topk's workspace on CUDA grows with rows x cols
    for s, t in row_chunks(n, l.shape[1], l.device) if k > 0 else ():
        x = l[s:t] if rows is None else l.index_select(0, rows[s:t])
        out[s:t, :k] = torch.topk(x, k, dim=1).values
    return out


def _union(parts: torch.Tensor) -> Candidates:
    """[rows, parts, c] local top lists -> sorted union, complete above the largest c-th value."""
    bound = parts[:, :, -1].amax(dim=1)
    values = torch.sort(parts.reshape(parts.shape[0], -1), dim=1, descending=True).values
    return Candidates(values, bound)


def _kth(values: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    idx = (k - 1).clamp(min=0, max=values.shape[1] - 1).unsqueeze(1)
    return values.gather(1, idx).squeeze(1)


def top_k_threshold(l: torch.Tensor, top_k: torch.Tensor, k_max: int, red) -> tuple[torch.Tensor, Candidates]:
    """k-th largest value per row (-inf when off or when fewer than k values exist).

    Round 1 gathers each part's top-c1 with c1 about k/parts + 8 (not k + 1): the union's k-th
    value is exact when it is >= the largest c1-th value (every larger value is present, and the
    union is a subset of the row). Rows without that certificate gather each part's top-(k + 1)
    in a round 2 (rare), whose union always holds the global top-k. Returns the candidates too: they
    give the row max (min-p) and, often, everything top-p needs.
    """
    parts = red.num_parts
    # one value past k, so that the completeness bound usually lies strictly below the k-th
    # value and top-p can run on the candidates alone
    c_full = k_max + 1
    c1 = c_full if parts == 1 else min(c_full, -(-k_max // parts) + 8)
    k = top_k.to(l.device)
    cand = _union(red.gather(local_top_values(l, c1)))
    thr = _kth(cand.values, k)
    failed = (k > 0) & (thr < cand.bound)
    if c1 < c_full and bool(failed.any()):
        rows = failed.nonzero().squeeze(1)
        full = _union(red.gather(local_top_values(l, c_full, rows)))
        thr[rows] = _kth(full.values, k[rows])
        width = max(cand.values.shape[1], full.values.shape[1])
        values = torch.nn.functional.pad(cand.values, (0, width - cand.values.shape[1]), value=NEG_INF)
        values[rows] = torch.nn.functional.pad(full.values, (0, width - full.values.shape[1]), value=NEG_INF)
        bound = cand.bound.clone()
        bound[rows] = full.bound
        cand = Candidates(values, bound)
    return torch.where(k > 0, thr, torch.full_like(thr, NEG_INF)), cand


def masses(l: torch.Tensor, thr: torch.Tensor, m: torch.Tensor, shift: int) -> torch.Tensor:
    """Fixed-point masses of kept tokens: [rows, cols] int64, 0 for dropped tokens."""
    return fixed_point_masses(l, m, shift).masked_fill_(~kept_mask(l, thr), 0)
