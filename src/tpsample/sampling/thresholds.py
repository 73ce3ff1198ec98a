"""Filters as thresholds (steps 7-9 of docs/semantics.md), in torch, on full rows or a shard.

Every filter keeps a top set of the row, so it is a per-row threshold `thr`: kept = l >= thr.
Thresholds are computed from partial results over the local columns and a reducer, and they are
mathematically defined quantities, so any exact way to compute them gives the same value:
- min-p: max(l) + log(min_p).
- top-k: the k-th largest value (the union of every part's local top-k holds the global top-k).
- top-p: masses are exact fixed-point integers, e_i = trunc(exp(l_i - m) * 2**shift) in int64,
  so sums are order-independent. The threshold is v* = the smallest kept value with
  sum(e_j : l_j > v*) < p * S (S = total kept mass; p * S in float64). Three exact ways to
  find it, cheapest first:
  1. From top-k candidates (no communication): when every kept token is among the gathered
     top-k candidates (kept values all lie strictly above the candidates' completeness bound),
     the masses, their sum and v* follow from the candidates alone.
  2. From top-64 candidates per part (one gather): each part sends its top-64 values, masses
     and total mass; if the crossing of p * S happens strictly above every part's 64th value,
     nothing unseen can change it (the certificate).
  3. Otherwise an exact radix search over the order-preserving key of fp32: 4 passes of
     256-bin (mass, count) integer histograms, all-reduced.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..numerics import (
    NEG_INF,
    fixed_point_masses,
    kept_mask,
    key_to_float,
    mass_shift,
    order_key,
    row_chunks,
    temperature_divisor,
)
from .keys import shard_passes

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


def local_top_values(l: torch.Tensor, c: int, rows=None, temperature=None) -> torch.Tensor:
    """[rows, c] largest local values, descending, -inf padded (a kernel where `keys.shard_passes`
    gives one: no topk workspace, no row chunks). temperature [rows] (only without `rows`): the
    values of l / T (T = 0 divides by 1), for an l the temperature was not applied to."""
    passes = shard_passes(l)
    if passes is not None and 0 < c <= passes.MAX_TOP:
        x = l if rows is None else l.index_select(0, rows)
        return passes.top_values(x, c, temperature).to(torch.float32 if temperature is not None else l.dtype)
    n = l.shape[0] if rows is None else rows.numel()
    out = torch.full((n, c), NEG_INF, dtype=l.dtype, device=l.device)
    k = min(c, l.shape[1])
    # row chunks: topk's workspace on CUDA grows with rows x cols
    for s, t in row_chunks(n, l.shape[1], l.device) if k > 0 else ():
        x = l[s:t] if rows is None else l.index_select(0, rows[s:t])
        out[s:t, :k] = torch.topk(x, k, dim=1).values
    if temperature is not None:
        out = out.float().div_(temperature_divisor(temperature, l.device).unsqueeze(1))
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
