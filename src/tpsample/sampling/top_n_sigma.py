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

Under a vocab split: one max all-reduce of (M, -m) per row, then the three integers summed over
the parts (an all-reduce, or inside vocab-parallel's summary round); on full rows no
communication.
"""
from __future__ import annotations

import torch

from ..numerics import NEG_INF, row_chunks, sigma_bits


def top_n_sigma_threshold(l: torch.Tensor, n_sigma: torch.Tensor, red, vocab_size: int) -> torch.Tensor:
    """[rows] fp32: M - n_sigma * sigma for rows with n_sigma > 0, else -inf (module docstring)."""
    ends = row_ends(l, red, vocab_size)
    return threshold(ends, red.sum(local_sums(l, ends, vocab_size)), n_sigma.to(l.device))


def row_sigma(l: torch.Tensor, red, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([rows] M, [rows] sigma), float64: the row's largest finite value (-inf: none) and the
    deviation of its finite values on the fixed-point grid (module docstring)."""
    ends = row_ends(l, red, vocab_size)
    return ends.top, deviation(ends, red.sum(local_sums(l, ends, vocab_size)))


class Ends:
    """A row's largest and smallest finite values (float64; -inf / +inf: none) and the grid's
    scale 2**(B - e) (2**e the smallest power of two above their distance)."""

    def __init__(self, top: torch.Tensor, low: torch.Tensor, vocab_size: int):
        self.top, self.low = top, low
        self.some = top > NEG_INF
        exponent = torch.frexp(torch.where(self.some, top - low, torch.zeros_like(top))).exponent
        self.scale = torch.ldexp(torch.ones_like(top), sigma_bits(vocab_size) - exponent)


def row_ends(l: torch.Tensor, red, vocab_size: int) -> Ends:
    """One max reduction of (M, -m) per row over the columns held."""
    rows, dev = l.shape[0], l.device
    local = torch.full((rows, 2), NEG_INF, device=dev)
    for s, t in row_chunks(rows, l.shape[1], dev):
        if l.shape[1]:
            fin = torch.isfinite(l[s:t])
            local[s:t, 0] = torch.where(fin, l[s:t], NEG_INF).amax(dim=1)
            local[s:t, 1] = torch.where(fin, -l[s:t], NEG_INF).amax(dim=1)
    ends = red.max(local)
    return Ends(ends[:, 0].double(), -ends[:, 1].double(), vocab_size)


def local_sums(l: torch.Tensor, ends: Ends, vocab_size: int) -> torch.Tensor:
    """[rows, 3] int64 (count, sum q, sum q**2) of the finite values held, q on the row's grid."""
    rows, dev = l.shape[0], l.device
    sums = torch.zeros((rows, 3), dtype=torch.int64, device=dev)
    for s, t in row_chunks(rows, l.shape[1], dev):
        x = l[s:t]
        fin = torch.isfinite(x)
        d = (torch.where(ends.some[s:t], ends.top[s:t], 0).unsqueeze(1) - x.double()) * ends.scale[s:t].unsqueeze(1)
        q = torch.where(fin, torch.floor(d), 0).to(torch.int64)
        sums[s:t] = torch.stack([fin.sum(dim=1), q.sum(dim=1), (q * q).sum(dim=1)], dim=1)
    return sums


def deviation(ends: Ends, sums: torch.Tensor) -> torch.Tensor:
    """[rows] float64 sigma from the row's exact sums (all parts added)."""
    n = sums[:, 0].clamp(min=1).double()
    mean = sums[:, 1].double() / n
    var = torch.clamp(sums[:, 2].double() / n - mean * mean, min=0.0)
    return torch.sqrt(var) / ends.scale


def threshold(ends: Ends, sums: torch.Tensor, n_sigma: torch.Tensor) -> torch.Tensor:
    """[rows] fp32 M - n_sigma * sigma where n_sigma > 0 and the row has a finite value, else -inf."""
    thr = (ends.top - n_sigma.double() * deviation(ends, sums)).float()
    return torch.where(ends.some & (n_sigma > 0), thr, torch.full_like(thr, NEG_INF))
