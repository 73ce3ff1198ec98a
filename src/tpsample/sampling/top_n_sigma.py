"""top-n-sigma (step 7 of docs/semantics.md): keep `l >= max(l) - n * sigma`, sigma the standard
deviation of the row's finite values after the temperature, from exact integer sums.

The row's statistics must not depend on how it is split or summed, so sigma comes from integers:
with M and m the row's largest and smallest finite values, R = M - m (float64) and 2**e the
smallest power of two above R (`frexp`), each finite value becomes q_i = floor((M - l_i) * 2**(B - e))
in [0, 2**B) with B = `sigma_bits(V)`, so V values' sum of squares fits in int64. The sums
(count, sum q, sum q**2) are exact and order-independent; then, in float64,
var = S2 / n - (S1 / n)**2 (at least 0), sigma = sqrt(var) * 2**(e - B) and the threshold is
M - n_sigma * sigma rounded to fp32. So sigma is that of the values rounded down to a grid of
2**(e - B): at most one grid step from the exact deviation. Rows without a finite value, and
rows with n_sigma <= 0, keep everything (threshold -inf).

Under a vocab split: one max all-reduce of (M, -m) per row, then one sum all-reduce of the three
integers; on full rows no communication.
"""
from __future__ import annotations

import math

import torch

from ..numerics import NEG_INF, row_chunks


def sigma_bits(vocab_size: int) -> int:
    """B: V values below 2**B have a sum of squares below 2**62."""
    return (62 - max(1, math.ceil(math.log2(max(vocab_size, 1))))) // 2


def top_n_sigma_threshold(l: torch.Tensor, n_sigma: torch.Tensor, red, vocab_size: int) -> torch.Tensor:
    """[rows] fp32: M - n_sigma * sigma for rows with n_sigma > 0, else -inf (module docstring)."""
    top, sigma = row_sigma(l, red, vocab_size)
    n_sigma = n_sigma.to(l.device)
    thr = (top - n_sigma.double() * sigma).float()
    return torch.where((top > NEG_INF) & (n_sigma > 0), thr, torch.full_like(thr, NEG_INF))


def row_sigma(l: torch.Tensor, red, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([rows] M, [rows] sigma), float64: the row's largest finite value (-inf: none) and the
    deviation of its finite values on the fixed-point grid (module docstring)."""
    rows, dev = l.shape[0], l.device
    hi = torch.full((rows,), NEG_INF, device=dev)
    neg_lo = torch.full((rows,), NEG_INF, device=dev)
    for s, t in row_chunks(rows, l.shape[1], dev):
        fin = torch.isfinite(l[s:t])
        hi[s:t] = torch.where(fin, l[s:t], NEG_INF).amax(dim=1) if l.shape[1] else NEG_INF
        neg_lo[s:t] = torch.where(fin, -l[s:t], NEG_INF).amax(dim=1) if l.shape[1] else NEG_INF
    ends = red.max(torch.stack([hi, neg_lo], dim=1))                     # [rows, 2]
    top, low = ends[:, 0].double(), -ends[:, 1].double()
    some = top > NEG_INF
    exponent = torch.frexp(torch.where(some, top - low, torch.zeros_like(top))).exponent
    scale = torch.ldexp(torch.ones_like(top), sigma_bits(vocab_size) - exponent)      # 2**(B - e)
    sums = torch.zeros((rows, 3), dtype=torch.int64, device=dev)
    for s, t in row_chunks(rows, l.shape[1], dev):
        x = l[s:t]
        fin = torch.isfinite(x)
        d = (torch.where(some[s:t], top[s:t], 0).unsqueeze(1) - x.double()) * scale[s:t].unsqueeze(1)
        q = torch.where(fin, torch.floor(d), 0).to(torch.int64)
        sums[s:t] = torch.stack([fin.sum(dim=1), q.sum(dim=1), (q * q).sum(dim=1)], dim=1)
    sums = red.sum(sums)
    n = sums[:, 0].clamp(min=1).double()
    mean = sums[:, 1].double() / n
    var = torch.clamp(sums[:, 2].double() / n - mean * mean, min=0.0)
    return top, torch.sqrt(var) / scale
