"""The kept support of each row (for RL trainers' sampling masks): what the row could have
sampled, returned compactly instead of a `[rows, V]` mask.

Per row that asks (`SamplingParams.kept_support = cap`): the bounds of the kept set in the row
after the temperature (`threshold <= v <= upper`, v finite: `threshold` is the smallest kept
value, -inf when nothing is kept; `upper` is XTC's bound, +inf without it), how many tokens it
holds, and its `cap` most probable tokens (value desc, ties -> lower id). The smallest kept value
is the threshold, rather than a filter's own number, because it depends on the kept set alone:
every backend, strategy and TP size gives it bit for bit. A greedy row's support is its token
(bounds: the row max). On a vocab shard each part sends its count, its max, its min and its
top-cap (value, id) list in one gather; the union's first cap entries are the row's, since each
part's list holds its share of them. The fused kernels give the count and the bounds from their
kept pass and the ids from `kept_ids`; both end in `asked_supports`.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..numerics import NEG_INF
from .logprobs import local_top_n, sort_value_desc_id_asc

POS_INF = float("inf")


def kept_support(l: torch.Tensor, bounds: Optional[tuple], emitted: torch.Tensor, b, col_start: int, red) -> tuple:
    """(ids [rows, cap] int64, count [rows] int64, threshold [rows] fp32, upper [rows] fp32) for rows
    l ([rows, cols] after the draw's masking: dropped tokens are -inf); bounds: (threshold, upper)
    from the draw (the upper bound is used), None when no row was sampled. Rows that did not ask:
    count -1, ids -1."""
    n, dev = l.shape[0], l.device
    cap = b.kept_cap_max
    top_v, top_i = local_top_n(l, cap, col_start)
    count = (l > NEG_INF).sum(dim=1)
    if l.shape[1]:
        ends = torch.stack([l.amax(dim=1), -torch.where(l > NEG_INF, l, POS_INF).amin(dim=1)], dim=1)
    else:
        ends = torch.full((n, 2), NEG_INF, device=dev)
    packed = torch.cat([count.double().unsqueeze(1), ends.double(), top_v.double(), top_i.double()], dim=1)
    parts = red.gather(packed)                                        # [rows, parts, 3 + 2 cap]
    count = parts[:, :, 0].sum(dim=1).to(torch.int64)
    top = parts[:, :, 1].amax(dim=1).float()
    low = (-parts[:, :, 2].amax(dim=1)).float()
    vals, ids = sort_value_desc_id_asc(parts[:, :, 3: 3 + cap].reshape(n, -1).float(),
                                       parts[:, :, 3 + cap:].reshape(n, -1).to(torch.int64))
    vals, ids = vals[:, :cap], ids[:, :cap]
    ids = torch.where(vals > NEG_INF, ids, torch.full_like(ids, -1))
    upper = bounds[1] if bounds is not None else torch.full((n,), POS_INF, device=dev)
    return asked_supports(ids, count, low, top, upper, emitted, b)


def kept_ids(l: torch.Tensor, low: torch.Tensor, upper: torch.Tensor, cap: int, col_start: int) -> torch.Tensor:
    """[rows, cap] int64: the cap most probable ids of full rows l (after the temperature) whose
    kept values are the finite ones in [low, upper] (value desc, ties -> lower id; -1 past the
    kept count)."""
    inside = (l >= low.unsqueeze(1)) & (l <= upper.unsqueeze(1)) & (l > NEG_INF)
    vals, ids = local_top_n(torch.where(inside, l, NEG_INF), cap, col_start)
    return torch.where(vals > NEG_INF, ids, torch.full_like(ids, -1))


def asked_supports(ids, count, low, top, upper, emitted: torch.Tensor, b) -> tuple:
    """The returned supports from each row's kept ids, count, smallest and largest kept values
    and XTC bound: a greedy row's is its token (bounds: the row max `top`); rows that did not
    ask get count -1, ids -1, bounds (-inf, +inf), and ids past a row's own cap are -1."""
    dev, cap = count.device, ids.shape[1]
    thr = torch.where(count > 0, low, NEG_INF)
    greedy = b.greedy.to(dev)
    if count.shape[0] and (b.host.temperature == 0).any():            # greedy rows: their token
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
            torch.where(asks, upper, POS_INF))
