"""XTC, "exclude top choices" (after top-p in step 9 of docs/semantics.md): with probability
`xtc_probability`, when two or more kept tokens have probability >= `xtc_threshold`, every one
of them but the least probable is removed (llama.cpp's `xtc`).

Exact, so the same tokens go everywhere: the coin is u < xtc_probability with u keyed by (request
seed, position) on its own salt (`noise.SALT_XTC`): a seeded request draws the same coins at
every TP size and batch layout. Probabilities are the kept tokens' fixed-point masses
(`numerics.fixed_point_masses` relative to the row max, as top-p's): token i qualifies iff
float64(e_i) >= float64(threshold) * float64(S), S the exact integer sum of the kept masses. The
masses grow with the value, so the qualifying tokens are the kept ones with `l >= v_min`; XTC
makes `v_min` an upper bound (keep `l <= v_min`: tokens tied at `v_min` all stay), not a
threshold.

Under a vocab split: the row max (max all-reduce), the kept mass (integer sum all-reduce), then
one gather of each part's qualifying count and smallest qualifying value.
"""
from __future__ import annotations

import torch

from ..noise import SALT_XTC, uniform01
from ..numerics import NEG_INF, kept_mask, mass_shift, row_chunks
from .thresholds import masses

POS_INF = float("inf")


def xtc_upper_bound(l: torch.Tensor, thr: torch.Tensor, b, red) -> torch.Tensor:
    """[rows] fp32: v_min for rows whose coin came up and where two or more kept tokens qualify,
    else +inf. l: the rows after step 6, thr: the threshold of steps 7-9 (kept: l >= thr)."""
    rows, dev = l.shape[0], l.device
    shift = mass_shift(b.vocab_size)
    local_max = torch.full((rows,), NEG_INF, device=dev)
    for s, t in row_chunks(rows, l.shape[1], dev):
        local_max[s:t] = l[s:t].masked_fill(~kept_mask(l[s:t], thr[s:t]), NEG_INF).amax(dim=1) if l.shape[1] else NEG_INF
    top = red.max(local_max)
    top_safe = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = torch.zeros(rows, dtype=torch.int64, device=dev)
    for s, t in row_chunks(rows, l.shape[1], dev):
        total[s:t] = masses(l[s:t], thr[s:t], top_safe[s:t], shift).sum(dim=1)
    target = b.column("xtc_threshold").to(dev).double() * red.sum(total).double()
    part = torch.zeros((rows, 2), dtype=torch.float64, device=dev)       # (count, -smallest value)
    for s, t in row_chunks(rows, l.shape[1], dev):
        x = l[s:t]
        qual = (masses(x, thr[s:t], top_safe[s:t], shift).double() >= target[s:t].unsqueeze(1)) & kept_mask(x, thr[s:t])
        part[s:t, 0] = qual.sum(dim=1).double()
        part[s:t, 1] = torch.where(qual, -x, NEG_INF).amax(dim=1).double() if l.shape[1] else NEG_INF
    parts = red.gather(part)                                               # [rows, parts, 2]
    count, v_min = parts[:, :, 0].sum(dim=1), (-parts[:, :, 1].amax(dim=1)).float()
    coin = uniform01(b.seeds.to(dev), b.positions.to(dev), SALT_XTC) < b.column("xtc_probability").to(dev).double()
    return torch.where(coin & (count >= 2) & (top > NEG_INF), v_min, torch.full_like(v_min, POS_INF))

