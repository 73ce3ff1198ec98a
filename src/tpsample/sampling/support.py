"""The kept support of each row (for RL trainers' sampling masks): what the row could have
sampled, returned compactly instead of a `[rows, V]` mask.

Per row that asks (`SamplingParams.kept_support = cap`): the bounds of the kept set in the row
after the temperature (`threshold <= v <= upper`, v finite: steps 7-9 give the threshold, XTC the
upper bound), how many tokens it holds, and its `cap` most probable tokens (value desc, ties ->
lower id). A greedy row's support is its token (bounds: the row max). On a vocab shard each part
sends its count, its max and its top-cap (value, id) list in one gather; the union's first cap
entries are the row's, since each part's list holds its share of them.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..numerics import NEG_INF
from .logprobs import local_top_n, sort_value_desc_id_asc


def kept_support(l: torch.Tensor, bounds: Optional[tuple], emitted: torch.Tensor, b, col_start: int, red) -> tuple:
    """(ids [rows, cap] int64, count [rows] int64, threshold [rows] fp32, upper [rows] fp32) for rows
    l ([rows, cols] after the draw's masking: dropped tokens are -inf); bounds: (threshold, upper)
    from the draw, None when no row was sampled. Rows that did not ask: count -1, ids -1."""
    n, dev = l.shape[0], l.device
    cap = b.kept_cap_max
    top_v, top_i = local_top_n(l, cap, col_start)
    count = (l > NEG_INF).sum(dim=1)
    row_max = l.amax(dim=1) if l.shape[1] else torch.full((n,), NEG_INF, device=dev)
    packed = torch.cat([torch.stack([count.double(), row_max.double()], dim=1), top_v.double(), top_i.double()], dim=1)
    parts = red.gather(packed)                                        # [rows, parts, 2 + 2 cap]
    count = parts[:, :, 0].sum(dim=1).to(torch.int64)
    top = parts[:, :, 1].amax(dim=1).float()
    vals, ids = sort_value_desc_id_asc(parts[:, :, 2: 2 + cap].reshape(n, -1).float(),
                                       parts[:, :, 2 + cap:].reshape(n, -1).to(torch.int64))
    vals, ids = vals[:, :cap], ids[:, :cap]
    ids = torch.where(vals > NEG_INF, ids, torch.full_like(ids, -1))
    thr, upper = bounds if bounds is not None else (torch.full((n,), NEG_INF, device=dev),
                                                     torch.full((n,), float("inf"), device=dev))
    greedy = b.greedy.to(dev)
    if n and (b.host.temperature == 0).any():                        # greedy rows: their token
        if cap:
            one = torch.full_like(ids, -1)
            one[:, 0] = emitted
            ids = torch.where(greedy.unsqueeze(1), one, ids)
        count = torch.where(greedy, torch.isfinite(top).to(torch.int64), count)
        thr, upper = torch.where(greedy, top, thr), torch.where(greedy, top, upper)
    want = b.column("kept_cap").to(dev)
    ids = ids.masked_fill(torch.arange(cap, device=dev).unsqueeze(0) >= want.unsqueeze(1), -1)
    asks = want >= 0
    return (ids, torch.where(asks, count, -1), torch.where(asks, thr, NEG_INF),
            torch.where(asks, upper, float("inf")))
