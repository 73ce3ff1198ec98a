"""Round 1 of split-row sampling: each part's row summary, and the thresholds derived from it.

Every part sends, per row, its C = k_max + 1 largest local values (C = 1 without top-k: its
max); with top-k + top-p rows, how many of its values tie with its C-th value beyond the C sent;
for band rows (top-p without top-k, see topp_band.py) a mass histogram; with top-n-sigma rows,
its exact integer sums on the rows' fixed-point grids (`top_n_sigma`, whose ends came from one
max all-reduce before this round). From the gathered
summaries every rank derives the same thresholds (steps 7-9 of the semantics):
- the row max M (the union's largest value), min-p: M + log(min_p); top-n-sigma: M - n sigma;
- top-k: the k-th largest of the union. Each part's top-k is inside its top-(k + 1), so the union
  holds the global top-k and the k-th value is exact: no certificate, no second round;
- top-p with top-k: every kept token (l >= thr >= the k-th value >= every part's C-th value) is
  in the union, except tokens tied with a part's C-th value when thr equals it; those are
  counted (the tie counts), all have the value thr, and enter the walk as one entry of
  count x e(thr). So v* is exact from the summary alone.
Which rows need what is decided from host-side parameters only (`RowNeeds`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...numerics import NEG_INF, fixed_point_masses, kept_mask, mass_shift, row_chunks, temperature_divisor
from .. import top_n_sigma
from ..keys import shard_passes
from ..thresholds import local_top_values, masses, threshold_from_sorted
from . import topp_band


@dataclass(frozen=True)
class RowNeeds:
    """Host-side decisions for one batch (numpy, from the rows' parameters)."""
    k_max: int                 # largest top-k (0: none)
    num_top: int               # values per part in the summary (C)
    min_p: bool                # some row uses min-p
    ties: bool                 # some row uses top-k and top-p: send tie counts
    band: np.ndarray           # rows with top-p and no top-k: the band method
    summary: bool              # round 1 runs
    sigma: bool = False        # some row uses top-n-sigma: its integer sums travel in round 1

    @staticmethod
    def of(b, row_max: bool = False) -> "RowNeeds":
        """row_max: round 1 runs for sampled rows even without filters (their max is wanted)."""
        h = b.host
        sampled = h.temperature > 0
        top_p = sampled & (h.top_p < 1)
        topk_p = np.flatnonzero(top_p & (h.top_k > 0))
        band = np.flatnonzero(top_p & (h.top_k <= 0))
        k_max = int(h.top_k.max()) if b.num_rows else 0
        min_p = bool((sampled & (h.min_p > 0)).any())
        sigma = bool(h.uses("top_n_sigma").any())
        need = bool(sampled.any()) and (k_max > 0 or min_p or len(band) > 0 or sigma or row_max)
        return RowNeeds(k_max, k_max + 1 if k_max > 0 else 1, min_p, len(topk_p) > 0, band, need, sigma)


def add_local(packet, l: torch.Tensor, needs: RowNeeds, band_rows, sigma_ends=None, vocab_size: int = 0,
              temperature=None) -> dict:
    """Queue this part's summary; returns the packet's field indices by name. sigma_ends: the
    rows' `top_n_sigma.Ends` when some row uses top-n-sigma (its local sums join the round).
    temperature: l is the input row, step 6 still to apply (no band or top-n-sigma rows then)."""
    top = local_top_values(l, needs.num_top, temperature=temperature)      # [rows, C] descending
    fields = {"top": packet.add(top)}
    if sigma_ends is not None:
        fields["sigma"] = packet.add(top_n_sigma.local_sums(l, sigma_ends, vocab_size))
    if needs.ties:
        fields["ties"] = packet.add(_tie_counts(l, top[:, -1], needs.num_top, temperature))
    if band_rows is not None:
        fields["hist"] = packet.add(topp_band.local_histogram(l, band_rows))
    return fields


def _tie_counts(l: torch.Tensor, last: torch.Tensor, c: int, temperature=None) -> torch.Tensor:
    """Per row: local values equal to `last` (the C-th largest) beyond the C sent (of l / T when
    temperature is given)."""
    if (passes := shard_passes(l)) is not None:
        return passes.tie_counts(l, last, c, temperature)
    div = None if temperature is None else temperature_divisor(temperature, l.device).unsqueeze(1)
    ge = torch.zeros(l.shape[0], dtype=torch.int64, device=l.device)
    for s, t in row_chunks(l.shape[0], l.shape[1], l.device):
        x = l[s:t] if div is None else l[s:t] / div[s:t]
        ge[s:t] = (x >= last[s:t].unsqueeze(1)).sum(dim=1)
    return torch.where(last > NEG_INF, ge - c, torch.zeros_like(ge)).clamp_(min=0)


@dataclass
class Thresholds:
    thr: torch.Tensor                  # [rows] fp32, exact for every row but band rows (min-p only there)
    row_max: torch.Tensor              # [rows] fp32
    bracket: topp_band.Bracket | None  # band rows


def derive(got: list, fields: dict, b, needs: RowNeeds, band_rows, sigma_ends=None) -> Thresholds:
    """The thresholds from the gathered summaries (identical on every rank)."""
    top = got[fields["top"]]                                    # [P, rows, C]
    parts, rows, c = top.shape
    vals = torch.sort(top.permute(1, 0, 2).reshape(rows, parts * c), dim=1, descending=True).values
    row_max = vals[:, 0]
    dev = vals.device
    thr = torch.full((rows,), NEG_INF, device=dev)
    if needs.k_max > 0:
        k = b.top_k.to(dev)
        kth = vals.gather(1, (k - 1).clamp(min=0, max=vals.shape[1] - 1).unsqueeze(1)).squeeze(1)
        thr = torch.maximum(thr, torch.where(k > 0, kth, torch.full_like(kth, NEG_INF)))
    if needs.min_p:
        thr = torch.maximum(thr, row_max + torch.log(b.min_p.to(dev)))
    if sigma_ends is not None:
        sums = got[fields["sigma"]].sum(dim=0)                  # [rows, 3] int64: exact
        thr = torch.maximum(thr, top_n_sigma.threshold(sigma_ends, sums, b.top_n_sigma.to(dev)))
    if needs.ties:        # every row (a few values each), kept where top-k and top-p apply: no index upload
        last = top[:, :, -1]                                    # [P, rows]
        bound = last.amax(dim=0)
        missing = torch.where(last == bound, got[fields["ties"]], torch.zeros_like(got[fields["ties"]])).sum(dim=0)
        top_p = b.top_p.to(dev)
        v_star = _topp_from_union(vals, thr, top_p, bound, missing, mass_shift(b.vocab_size))
        use = (b.top_k.to(dev) > 0) & (top_p < 1) & (b.temperature.to(dev) > 0)
        thr = torch.where(use, torch.maximum(v_star, thr), thr)
    br = None
    if band_rows is not None:
        br = topp_band.bracket(top[:, band_rows, 0], got[fields["hist"]], thr[band_rows],
                               b.top_p.to(dev)[band_rows], mass_shift(b.vocab_size), b.vocab_size)
    return Thresholds(thr, row_max, br)


def _topp_from_union(vals, thr, top_p, bound, missing, shift) -> torch.Tensor:
    """v* from a union holding every kept token, plus `missing` unseen ties at the value thr."""
    m = vals[:, 0]
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = masses(vals, thr, m_safe, shift)
    tie = (missing > 0) & (thr == bound) & torch.isfinite(thr)
    tie_e = fixed_point_masses(thr.unsqueeze(1), m_safe, shift).squeeze(1) * missing
    vals = torch.cat([vals, torch.where(tie, thr, torch.full_like(thr, NEG_INF)).unsqueeze(1)], dim=1)
    e = torch.cat([e, torch.where(tie, tie_e, torch.zeros_like(tie_e)).unsqueeze(1)], dim=1)
    target = top_p.to(torch.float64) * e.sum(dim=1).to(torch.float64)
    kept_vals = vals.masked_fill(~kept_mask(vals, thr), NEG_INF)
    v_star, _ = threshold_from_sorted(kept_vals, e, target, torch.full_like(m, NEG_INF))
    return v_star
