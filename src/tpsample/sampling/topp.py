"""top-p as an exact threshold (step 9 of docs/semantics.md).

v* = the smallest kept value with sum(e_j : l_j > v*) < p * S, with fixed-point integer masses
e (see filters.py), so v* is one well-defined number however the row is split. Three exact ways
to find it, cheapest first:
1. From top-k candidates (no communication): when every kept token is among the gathered top-k
   candidates (kept values all lie strictly above the candidates' completeness bound), the masses,
   their sum and v* follow from the candidates alone.
2. From top-64 candidates per part (one gather): each part sends its top-64 values, masses and
   total mass; if the crossing of p * S happens strictly above every part's 64th value, nothing
   unseen can change it (the certificate).
3. Otherwise an exact radix search over the order-preserving key of fp32: 4 passes of 256-bin
   (mass, count) integer histograms, all-reduced.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..numerics import NEG_INF, kept_mask, key_to_float, mass_shift, order_key, row_chunks
from .filters import NUM_CANDIDATES, Candidates, masses


def top_p_threshold(l: torch.Tensor, thr: torch.Tensor, top_p: torch.Tensor, red, vocab_size: int,
                    cand: Optional[Candidates] = None) -> torch.Tensor:
    """New threshold per row for rows with top_p < 1 (others keep `thr`)."""
    shift = mass_shift(vocab_size)
    active = top_p.to(l.device) < 1
    v_star = thr.clone()
    todo = active.clone()
    if cand is not None:
        inside = active & ((thr > cand.bound) | (cand.bound == NEG_INF))
        if bool(inside.any()):
            rows = inside.nonzero().squeeze(1)
            v_star[rows] = _from_complete_candidates(cand.values[rows], thr[rows], top_p[rows.cpu()].to(l.device), shift)
            todo &= ~inside
    if bool(todo.any()):
        rows = todo.nonzero().squeeze(1)
        v_star[rows] = _search(l, rows, thr[rows], top_p.to(l.device)[rows], red, shift)
    return torch.where(active, torch.maximum(v_star, thr), thr)


def _from_complete_candidates(values, thr, top_p, shift) -> torch.Tensor:
    """v* when `values` holds every kept token of each row."""
    m = values[:, 0]
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = masses(values, thr, m_safe, shift)
    target = top_p.to(torch.float64) * e.sum(dim=1).to(torch.float64)
    kept_vals = values.masked_fill(~kept_mask(values, thr), NEG_INF)
    v_star, _ = threshold_from_sorted(kept_vals, e, target, torch.full_like(m, NEG_INF))
    return v_star


def _search(l, rows, thr, top_p, red, shift) -> torch.Tensor:
    """Ways 2 and 3 for the given rows of l."""
    n = rows.numel()
    kept_max = torch.full((n,), NEG_INF, device=l.device)
    c = min(NUM_CANDIDATES, l.shape[1])
    total = torch.zeros(n, dtype=torch.int64, device=l.device)
    cand_v = torch.full((n, NUM_CANDIDATES), NEG_INF, device=l.device)
    for s, t in row_chunks(n, l.shape[1], l.device):
        x = l.index_select(0, rows[s:t])
        kept_max[s:t] = x.masked_fill(~kept_mask(x, thr[s:t]), NEG_INF).amax(dim=1)
    m = red.max(kept_max)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    for s, t in row_chunks(n, l.shape[1], l.device):
        x = l.index_select(0, rows[s:t])
        e = masses(x, thr[s:t], m_safe[s:t], shift)
        total[s:t] = e.sum(dim=1)
        cand_v[s:t, :c] = torch.topk(x.masked_fill(~kept_mask(x, thr[s:t]), NEG_INF), c, dim=1).values
        del e, x
    # one gather: each part's candidate values (as int bits) and its total mass; the masses of
    # candidates follow from their values and the global max, so they are not sent.
    packed = torch.cat([cand_v.view(torch.int32).to(torch.int64), total.unsqueeze(1)], dim=1)
    parts = red.gather(packed)                                       # [rows, parts, c + 1]
    part_v = parts[:, :, :NUM_CANDIDATES].to(torch.int32).view(torch.float32)
    total = parts[:, :, -1].sum(dim=1)
    target = top_p.to(torch.float64) * total.to(torch.float64)
    seen_above = part_v[:, :, -1].amax(dim=1)
    vals = part_v.reshape(n, -1)
    e = masses(vals, thr, m_safe, shift)
    v_star, found = threshold_from_sorted(vals, e, target, seen_above)
    if not bool(found.all()):
        bad = (~found).nonzero().squeeze(1)
        v_star[bad] = _radix_search(l, rows[bad], thr[bad], m_safe[bad], target[bad], shift, red)
    return v_star


def threshold_from_sorted(vals, es, target, seen_above):
    """v* from a union of candidates, and whether the certificate holds."""
    v, order = torch.sort(vals, dim=1, descending=True)
    e = es.gather(1, order)
    excl = torch.cumsum(e, dim=1) - e
    crossed = (excl.to(torch.float64) >= target.unsqueeze(1)) & (v > NEG_INF)
    has_cross = crossed.any(dim=1)
    j = torch.where(has_cross, crossed.int().argmax(dim=1), torch.zeros_like(has_cross, dtype=torch.int64))
    certified = has_cross & (v.gather(1, j.unsqueeze(1)).squeeze(1) > seen_above)
    prev = (j - 1).clamp(min=0).unsqueeze(1)
    v_star = v.gather(1, prev).squeeze(1)
    everything_seen = ~has_cross & (seen_above == NEG_INF)
    v_star = torch.where(everything_seen, torch.full_like(v_star, NEG_INF), v_star)
    return v_star, certified | everything_seen


def _radix_search(l, rows, thr, m, target, shift, red) -> torch.Tensor:
    """Exact v* by 4 passes of 256-bin (mass, count) histograms on the fp32 order key."""
    n = rows.numel()
    prefix = torch.zeros(n, dtype=torch.int64, device=l.device)
    above = torch.zeros(n, dtype=torch.float64, device=l.device)
    for level in range(4):
        shift_bits = 24 - 8 * level
        hist_m = torch.zeros((n, 256), dtype=torch.int64, device=l.device)
        hist_c = torch.zeros((n, 256), dtype=torch.int64, device=l.device)
        for s, t in row_chunks(n, l.shape[1], l.device):
            x = l.index_select(0, rows[s:t])
            e = masses(x, thr[s:t], m[s:t], shift)
            key = order_key(x)
            inside = ((key >> (shift_bits + 8)) == (prefix[s:t] >> (shift_bits + 8)).unsqueeze(1))
            inside &= kept_mask(x, thr[s:t])
            digit = (key >> shift_bits) & 0xFF
            hist_m[s:t].scatter_add_(1, digit, e * inside)
            hist_c[s:t].scatter_add_(1, digit, inside.to(torch.int64))
        both = red.sum(torch.cat([hist_m, hist_c], dim=1))
        hist_m, hist_c = both[:, :256], both[:, 256:]
        # mass strictly above each bin: bins above it (higher digits) plus `above`.
        rev = hist_m.flip(1)
        above_bin = (torch.cumsum(rev, 1) - rev).flip(1).to(torch.float64) + above.unsqueeze(1)
        ok = (hist_c > 0) & (above_bin < target.unsqueeze(1))
        # the lowest non-empty bin whose mass above is still below the target
        digits = torch.arange(256, device=l.device).expand(n, 256)
        pick = torch.where(ok, digits, torch.full_like(digits, 256)).min(dim=1).values.clamp(max=255)
        above = above_bin.gather(1, pick.unsqueeze(1)).squeeze(1)
        prefix = prefix | (pick << shift_bits)
    return key_to_float(prefix)
