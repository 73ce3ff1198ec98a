"""Filters as thresholds: DESIGN.md section 2, steps 7-9.

Every filter keeps a top set of the row, so it is a per-row threshold `thr`: kept = l >= thr.
Thresholds are computed from partial results over the local columns and a reducer, and they are
mathematically defined quantities, so any exact way to compute them gives the same value:
- min-p: max(l) + log(min_p).
- top-k: the k-th largest value (the union of every part's local top-k holds the global top-k).
- top-p: masses are exact fixed-point integers, e_i = trunc(exp(l_i - m) * 2**shift) in int64,
  so sums are order-independent. The threshold is v* = the smallest kept value with
  sum(e_j : l_j > v*) < p * S (S = total kept mass). It is found from candidates (each part's
  local top-c values) when a certificate shows nothing unseen can matter, else by an exact radix
  search over the order-preserving integer key of fp32 (4 passes of 8-bit digits).
"""
from __future__ import annotations

import math

import torch

NEG_INF = float("-inf")
NUM_CANDIDATES = 64
ROW_CHUNK_ELEMS = 1 << 17     # bound on [rows, cols] temporaries (~3 MiB at 22 B each)


def mass_shift(vocab_size: int) -> int:
    """Fixed-point bits so that a sum of vocab_size masses <= 1 fits in int64 with headroom."""
    return 62 - max(1, math.ceil(math.log2(vocab_size)))


def row_chunks(num_rows: int, cols: int):
    """Row ranges whose [rows, cols] temporaries stay under ROW_CHUNK_ELEMS elements."""
    step = max(1, ROW_CHUNK_ELEMS // max(cols, 1))
    for s in range(0, num_rows, step):
        yield s, min(num_rows, s + step)


def kept_mask(l: torch.Tensor, thr: torch.Tensor) -> torch.Tensor:
    return (l >= thr.unsqueeze(1)) & (l > NEG_INF)


def min_p_threshold(l: torch.Tensor, min_p: torch.Tensor, red) -> torch.Tensor:
    m = red.max(l.amax(dim=1))
    return m + torch.log(min_p.to(l.device))


def top_k_threshold(l: torch.Tensor, top_k: torch.Tensor, k_max: int, red) -> torch.Tensor:
    """k-th largest value per row (-inf when off or when fewer than k values exist)."""
    n, cols = l.shape
    c = min(k_max, cols)
    local = torch.full((n, k_max), NEG_INF, dtype=l.dtype, device=l.device)
    if c > 0:
        local[:, :c] = torch.topk(l, c, dim=1).values
    union = torch.sort(red.cat(local), dim=1, descending=True).values
    k = top_k.to(l.device)
    idx = (k - 1).clamp(min=0, max=union.shape[1] - 1).unsqueeze(1)
    thr = union.gather(1, idx).squeeze(1)
    return torch.where(k > 0, thr, torch.full_like(thr, NEG_INF))


def masses(l: torch.Tensor, thr: torch.Tensor, m: torch.Tensor, shift: int) -> torch.Tensor:
    """Fixed-point masses of kept tokens: [rows, cols] int64, 0 for dropped tokens."""
    d = l - m.unsqueeze(1)
    e = torch.where(l == m.unsqueeze(1), torch.ones_like(d), torch.exp(d))
    e = (e * float(2**shift)).to(torch.int64)
    return e.masked_fill_(~kept_mask(l, thr), 0)


def order_key(x: torch.Tensor) -> torch.Tensor:
    """Order-preserving map of fp32 to [0, 2**32) as int64 (larger float -> larger key)."""
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    neg = bits >= 0x80000000
    return torch.where(neg, (~bits) & 0xFFFFFFFF, bits ^ 0x80000000)


def key_to_float(key: torch.Tensor) -> torch.Tensor:
    neg = key < 0x80000000
    bits = torch.where(neg, (~key) & 0xFFFFFFFF, key ^ 0x80000000)
    bits = torch.where(bits >= 0x80000000, bits - (1 << 32), bits)
    return bits.to(torch.int32).view(torch.float32)


def top_p_threshold(l: torch.Tensor, thr: torch.Tensor, top_p: torch.Tensor, red,
                    vocab_size: int) -> torch.Tensor:
    """New threshold per row for rows with top_p < 1 (others keep `thr`)."""
    shift = mass_shift(vocab_size)
    kept = kept_mask(l, thr)
    m = red.max(l.masked_fill(~kept, NEG_INF).amax(dim=1))
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    c = min(NUM_CANDIDATES, l.shape[1])
    n = l.shape[0]
    total = torch.zeros(n, dtype=torch.int64, device=l.device)
    cand_v = torch.full((n, NUM_CANDIDATES), NEG_INF, device=l.device)
    cand_e = torch.zeros((n, NUM_CANDIDATES), dtype=torch.int64, device=l.device)
    for s, t in row_chunks(n, l.shape[1]):
        e = masses(l[s:t], thr[s:t], m_safe[s:t], shift)
        total[s:t] = e.sum(dim=1)
        v, i = torch.topk(l[s:t].masked_fill(~kept[s:t], NEG_INF), c, dim=1)
        cand_v[s:t, :c], cand_e[s:t, :c] = v, e.gather(1, i)
        del e
    # one gather: each part's candidates (value bits, masses) and its total mass
    packed = torch.cat([cand_v.view(torch.int32).to(torch.int64), cand_e, total.unsqueeze(1)], dim=1)
    parts = red.gather(packed)                                    # [rows, parts, 2c + 1]
    k = NUM_CANDIDATES
    part_v = parts[:, :, :k].to(torch.int32).view(torch.float32)   # [rows, parts, k]
    part_e = parts[:, :, k:2 * k]
    total = parts[:, :, -1].sum(dim=1)
    target = top_p.to(l.device).to(torch.float64) * total.to(torch.float64)
    # Everything strictly above the largest c-th local value is among the candidates.
    seen_above = part_v[:, :, -1].amax(dim=1)
    v_star, found = _threshold_from_candidates(part_v.reshape(n, -1), part_e.reshape(n, -1), target, seen_above)
    active = top_p.to(l.device) < 1
    need_search = active & ~found
    if bool(need_search.any()):
        rows = need_search.nonzero().squeeze(1)
        v_star[rows] = _radix_search(l[rows], thr[rows], m_safe[rows], target[rows], shift, red)
    # A row whose candidates say "everything is kept" keeps its old threshold.
    return torch.where(active, torch.maximum(v_star, thr), thr)


def _threshold_from_candidates(vals, es, target, seen_above):
    """v* from the sorted union of candidates, and whether the certificate holds."""
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


def _radix_search(l, thr, m, target, shift, red) -> torch.Tensor:
    """Exact v* by 4 passes of 256-bin (mass, count) histograms on the fp32 order key."""
    n = l.shape[0]
    prefix = torch.zeros(n, dtype=torch.int64, device=l.device)
    above = torch.zeros(n, dtype=torch.float64, device=l.device)
    for level in range(4):
        shift_bits = 24 - 8 * level
        hist_m = torch.zeros((n, 256), dtype=torch.int64, device=l.device)
        hist_c = torch.zeros((n, 256), dtype=torch.int64, device=l.device)
        for s, t in row_chunks(n, l.shape[1]):
            e = masses(l[s:t], thr[s:t], m[s:t], shift)
            key = order_key(l[s:t])
            inside = ((key >> (shift_bits + 8)) == (prefix[s:t] >> (shift_bits + 8)).unsqueeze(1))
            inside &= kept_mask(l[s:t], thr[s:t])
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
