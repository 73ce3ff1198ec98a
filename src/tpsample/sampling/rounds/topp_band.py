"""top-p without top-k on split rows in the two rounds every step has (the "band" method).

The threshold v* (thresholds.py) needs S, the exact integer kept mass relative to the GLOBAL max M,
which no rank knows before the first gather. Instead of finding v* exactly, the band method
finds a value range [a, b) that must hold it and decides the draw around it:

Round 1 (inside the summary gather): each rank sends a histogram of fp64 masses relative to its
own max m_r, on a fixed grid of 1/8-nat bins (bin of x: floor(8 x)), NUM_BINS bins down from
its max plus one bin for everything below. After the gather every rank rescales the parts by
exp(m_r - M), bounds the exact integer masses above every bin edge (see `ETA` for the proof),
and takes b = the lowest edge whose mass above is certainly < p * S and a = the highest edge
whose mass above is certainly >= p * S. Tokens >= b are then kept, tokens < a dropped.

Round 2 (inside the winners gather): each rank sends exact integer masses over kept tokens (S_r,
A_r = mass of tokens >= b) and, for NUM_SUB sub-bins splitting [a, b), the sub-bin's exact mass;
and, over every kept token of [a, b) (each one's noise hashed), each sub-bin's best draw score
with that token's id, value and logprob-row value, and the sub-bin's max value.
The draw of tokens >= b is the ordinary draw with threshold max(thr, b). After the gather every
rank checks EXACTLY (integers, the float64 target of the semantics) that the crossing lies in
[a, b) and finds the crossing sub-bin j*: sub-bins above it are kept, below it dropped. The
winner is the best of the kept candidates (tokens >= b, sub-bins above j*) unless the best token
of sub-bin j* beats them and is not at j*'s max value (the max value of j* is always kept: v*
lies in j* and is a kept value, so j*'s largest value is >= v*); then the row is undecided and
takes the exact path (`failed`). Why this is the draw of the full row: the full row's winner is
the argmax of l + g over tokens >= v*. Tokens >= b and the sub-bins above j* are all >= v*,
tokens below j* all < v*, so the winner is either the best of the kept candidates or a token of
j* beating all of them, and that token is the best of j*: kept when its value is j*'s max.
Exactness therefore rests only on the exact round-2 check; the fp64 bounds decide how often
rows fail.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...noise import SALT_DRAW, gumbel_noise
from ...numerics import NEG_INF, fixed_point_masses, kept_mask, row_chunks
from ..keys import row_keys, shard_passes
from ..reducer import best_part, take

BIN_SCALE = 8.0          # bins of 1/8 nat on the grid floor(8 x) (a power of two: exact)
NUM_BINS = 128           # 16 nats below a part's max; a crossing further down takes the exact path
NUM_SUB = 32             # sub-bins of [a, b) in round 2
NO_ID = 2**31 - 1        # id of an empty sub-bin (int32, above every token id)
# Relative error bound of the round-1 mass estimates against the exact integer masses.
# Exact: e_i = trunc(exp32(fl32(x_i - M)) * 2**shift). With d = x_i - M <= 0:
#  - fl32(d) = d (1 + e1), |e1| <= 2**-24, so exp(fl32(d)) = exp(d) exp(d e1); only tokens with
#    d >= -(shift ln 2 + 1) can have e_i >= 1 (others have e_i = 0 and exp(d) 2**shift < 1), and
#    shift <= 61, so |d e1| <= 43.3 * 2**-24 < 2.6e-6;
#  - torch's fp32 exp is within 2 ulp (CPU: 1 ulp; CUDA expf: 2 ulp); 4 ulp = 4.8e-7 allowed;
#  - truncation loses less than 1 per token: at most V in total (an absolute term).
#  So exp(d) 2**shift (1 - 3.1e-6) - 1 <= e_i <= exp(d) 2**shift (1 + 3.1e-6).
# Estimates: exp32(fl32(x - m_r)) per token, off from exp(x - m_r) by the same two terms as above
# (|x - m_r| <= 43.3 where it matters: < 3.1e-6), summed in fp64 (at most 2**31 terms: relative
# 2**-22 worst case, far less in practice), the bin rounded to fp32 (2**-24), the fp64 rescale
# exp(m_r - M) and fp64 sums over parts and bins (a few 2**-52): below 3.4e-6 together.
# ETA = 8e-6 covers both (3.1e-6 + 3.4e-6) with margin; the target p * S in float64 adds
# 2**-52 relative, covered by TARGET_SLACK. (Only how often a bracket is found depends on ETA:
# round 2 checks the crossing exactly.)
ETA = 8e-6
TARGET_SLACK = 1e-15


def local_histogram(l: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Round 1: [n, NUM_BINS + 1] fp32 masses exp(x - m_r) per bin below this part's max m_r
    (bin j: floor(8 x) = floor(8 m_r) - j; the last bin holds everything further down).
    Where kernels run, `kernels.shard_band.band_histogram`: the same bins but the last, which
    may differ in its last bit (its docstring says why that cannot change a token)."""
    if (passes := _band_passes(l)) is not None:
        return passes.band_histogram(l, rows, NUM_BINS, BIN_SCALE)
    n = rows.numel()
    hist = torch.zeros((n, NUM_BINS + 1), dtype=torch.float64, device=l.device)
    for s, t in row_chunks(n, l.shape[1], l.device):
        x = l.index_select(0, rows[s:t])
        m = x.amax(dim=1) if x.shape[1] else torch.full((t - s,), NEG_INF, device=l.device)
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        top = torch.floor(m_safe * BIN_SCALE)
        j = (top.unsqueeze(1) - torch.floor(x * BIN_SCALE)).nan_to_num_(NUM_BINS, NUM_BINS, NUM_BINS)
        j = j.clamp_(0, NUM_BINS).to(torch.int64)
        mass = torch.exp(x - m_safe.unsqueeze(1)).nan_to_num_(0.0, 0.0, 0.0)
        hist[s:t].scatter_add_(1, j, mass.double())
    return hist.float()


@dataclass
class Bracket:
    """Per band row: keep tokens >= b, drop tokens < a; `ok` False: no bracket (exact path)."""
    a: torch.Tensor        # [n] fp64
    b: torch.Tensor        # [n] fp64
    ok: torch.Tensor       # [n] bool
    m_safe: torch.Tensor   # [n] fp32 global max (0 where not finite): masses are relative to it

    def sub_scale(self) -> torch.Tensor:
        """[n] fp32 sub-bins per unit of value (0 where there is no bracket): the one formula
        every use of `_sub_bin` shares."""
        span = (self.b - self.a).clamp(min=2.0**-30)
        return torch.where(self.ok, NUM_SUB / span, torch.zeros_like(self.a)).float()


def bracket(part_max: torch.Tensor, hist: torch.Tensor, thr: torch.Tensor, top_p: torch.Tensor,
            shift: int, vocab_size: int) -> Bracket:
    """After round 1 (identical on every rank). part_max [P, n] fp32, hist [P, n, NUM_BINS + 1]."""
    n = part_max.shape[1]
    dev = part_max.device
    m = part_max.amax(dim=0)
    finite = torch.isfinite(m) & (m.abs() < 2.0**20)     # bin edges then exact in fp32
    ms = torch.where(finite, m, torch.zeros_like(m)).double()
    big_t = torch.floor(ms * BIN_SCALE)                                      # global top bin
    pm = part_max.double()
    t_r = torch.floor(torch.where(torch.isfinite(pm), pm, ms.expand_as(pm)) * BIN_SCALE)
    d_r = (big_t.unsqueeze(0) - t_r).clamp(0, NUM_BINS).to(torch.int64)      # [P, n]
    scale = torch.exp(torch.where(torch.isfinite(pm), pm - ms, torch.full_like(pm, NEG_INF)))
    nb = NUM_BINS + 1
    idx = (torch.arange(nb, device=dev).view(1, 1, nb) + d_r.unsqueeze(2)).clamp(max=NUM_BINS)
    h = torch.zeros((n, nb), dtype=torch.float64, device=dev)
    contrib = (hist.double() * scale.unsqueeze(2)).nan_to_num_(0.0, 0.0, 0.0)
    h.scatter_add_(1, idx.permute(1, 0, 2).reshape(n, -1), contrib.permute(1, 0, 2).reshape(n, -1))
    g = torch.arange(nb, device=dev, dtype=torch.float64)
    hi_edge = (big_t.unsqueeze(1) - g + 1) / BIN_SCALE                       # bin g: [lo, hi)
    lo_edge = torch.where(g < NUM_BINS, hi_edge - 1 / BIN_SCALE, torch.full_like(hi_edge, NEG_INF))
    t = thr.double().unsqueeze(1)
    lo = torch.where(lo_edge >= t, h, torch.zeros_like(h))                   # surely kept
    hi = torch.where(hi_edge <= t, torch.zeros_like(h), h)                   # possibly kept
    zero = torch.zeros((n, 1), dtype=torch.float64, device=dev)
    lc, uc = torch.cat([zero, lo.cumsum(1)], 1), torch.cat([zero, hi.cumsum(1)], 1)   # [n, nb + 1]
    unit = float(2**shift)
    s_lo = lc[:, -1] * (1 - ETA) * unit - vocab_size
    s_hi = uc[:, -1] * (1 + ETA) * unit
    p = top_p.double()
    t_lo, t_hi = p * s_lo * (1 - TARGET_SLACK), p * s_hi * (1 + TARGET_SLACK)
    above_hi = uc[:, :nb] * (1 + ETA) * unit           # mass of tokens >= edge g (bins < g)
    above_lo = lc[:, :nb] * (1 - ETA) * unit - vocab_size
    g_b = (above_hi < t_lo.unsqueeze(1)).sum(dim=1) - 1
    cond_a = above_lo >= t_hi.unsqueeze(1)
    g_a = cond_a.int().argmax(dim=1)
    ok = finite & cond_a.any(dim=1) & (g_a > g_b) & (t_lo > 0)
    b = (big_t - g_b + 1) / BIN_SCALE
    a = (big_t - g_a + 1) / BIN_SCALE
    inf = torch.full_like(b, float("inf"))
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return Bracket(torch.where(ok, a, inf), torch.where(ok, b, inf), ok, m_safe)


def local_partials(l: torch.Tensor, lp_at, rows: torch.Tensor, thr: torch.Tensor, br: Bracket,
                   seeds: torch.Tensor, positions: torch.Tensor, col_start: int, shift: int,
                   with_counts: bool = False) -> dict:
    """Round 2: this part's exact masses and per-sub-bin draw candidates for the band rows.

    rows [n] band rows of l, thr [n] their thresholds before top-p, br their brackets. Returns
    per row: total (int64, the kept mass S_r), above (int64, the kept mass of tokens >= b),
    mass [n, NUM_SUB] (int64, the kept mass of each sub-bin of [a, b)), with `with_counts`
    count [n, NUM_SUB] (int32, kept tokens of each sub-bin), and over EVERY kept band token
    (noise is hashed for each; no list, so every sub-bin's candidate is complete), per sub-bin: score
    (fp32, the best draw score l + g), id (int32, its global id: ties -> lowest; NO_ID when
    empty), value (fp32, its l), top (fp32, the sub-bin's largest l) and, with lp_at, lp (its
    logprob-row value). lp_at: None, or lp_at(rows [n], ids [n, k]) -> [n, k] logprob-row values.
    Where kernels run, `kernels.shard_band.band_partials` gives the same fields bit for bit."""
    if (passes := _band_passes(l)) is not None:
        k0, k1 = row_keys(seeds, positions, SALT_DRAW)
        got = passes.band_partials(l, rows, thr, br.a.float(), br.b.float(), br.sub_scale(), br.m_safe, k0, k1,
                                   col_start, shift, NUM_SUB)
        return _with_lookups(l, lp_at, rows, col_start, got, with_counts)
    n, cols, dev = rows.numel(), l.shape[1], l.device
    k1 = NUM_SUB + 1                                   # the last sub-bin collects everything else
    total = torch.zeros(n, dtype=torch.int64, device=dev)
    above = torch.zeros(n, dtype=torch.int64, device=dev)
    mass = torch.zeros((n, k1), dtype=torch.int64, device=dev)
    count = torch.zeros((n, k1), dtype=torch.int32, device=dev)
    score = torch.full((n, k1), NEG_INF, device=dev)
    best_id = torch.full((n, k1), NO_ID, dtype=torch.int64, device=dev)
    top = torch.full((n, k1), NEG_INF, device=dev)
    a32, b32 = br.a.float(), br.b.float()             # exact: multiples of 1/8 below 2**21
    inv = br.sub_scale()
    ids = torch.arange(col_start, col_start + cols, device=dev)
    for s, t in row_chunks(n, cols, dev):
        x = l.index_select(0, rows[s:t])
        kept = kept_mask(x, thr[s:t])
        e = fixed_point_masses(x, br.m_safe[s:t], shift).masked_fill_(~kept, 0)
        total[s:t] = e.sum(dim=1)
        hi = x >= b32[s:t].unsqueeze(1)
        above[s:t] = (e * hi).sum(dim=1)
        inband = kept & ~hi & (x >= a32[s:t].unsqueeze(1))
        j = _sub_bin(x, b32[s:t], inv[s:t]).masked_fill_(~inband, NUM_SUB)
        mass[s:t].scatter_add_(1, j, e * inband)
        count[s:t].scatter_add_(1, j, inband.to(torch.int32))
        z = gumbel_noise(seeds[s:t], positions[s:t], ids).add_(x).masked_fill_(~inband, NEG_INF)
        score[s:t].scatter_reduce_(1, j, z, "amax")
        hit = inband & (z == score[s:t].gather(1, j))
        best_id[s:t].scatter_reduce_(1, j, torch.where(hit, ids, NO_ID), "amin")
        top[s:t].scatter_reduce_(1, j, x.masked_fill_(~inband, NEG_INF), "amax")
        del x, e, j, kept, hi, inband, z, hit
    got = {"total": total, "above": above, "mass": mass, "count": count, "score": score, "id": best_id, "top": top}
    return _with_lookups(l, lp_at, rows, col_start, {k: v[:, :NUM_SUB] if v.dim() == 2 else v for k, v in got.items()},
                         with_counts)


def _band_passes(l: torch.Tensor):
    """The shard kernels for the working rows l, or None (torch ops then)."""
    return shard_passes(l) if l.dtype == torch.float32 else None


def _with_lookups(l: torch.Tensor, lp_at, rows: torch.Tensor, col_start: int, got: dict, with_counts: bool) -> dict:
    """`local_partials`'s fields from the per-sub-bin reductions: each candidate's value (and
    logprob-row value) looked up by its id, the counts only when asked."""
    best_id = got["id"].to(torch.int64)
    cols = l.shape[1]
    found = best_id < NO_ID
    col = (best_id - col_start).clamp(0, max(cols - 1, 0))
    value = torch.where(found, l[rows.unsqueeze(1), col], torch.full_like(got["score"], NEG_INF))
    out = {"total": got["total"], "above": got["above"], "mass": got["mass"], "score": got["score"],
           "id": best_id.to(torch.int32), "value": value, "top": got["top"]}
    if with_counts:
        out["count"] = got["count"]
    if lp_at is not None:
        out["lp"] = lp_at(rows, best_id)
    return out


def _sub_bin(x: torch.Tensor, b32: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """Sub-bin of values in [a, b): floor((b - x) * NUM_SUB / (b - a)) in fp32, clamped to
    [0, NUM_SUB - 1]. Any fixed float formula will do: it is monotone in x and every rank
    evaluates it on the same inputs, so sub-bins are ordered by value on every part."""
    j = ((b32.unsqueeze(1) - x) * inv.unsqueeze(1)).floor_().nan_to_num_(0.0, 0.0, 0.0)
    return j.clamp_(0, NUM_SUB - 1).to(torch.int64)


@dataclass
class BandResult:
    value: torch.Tensor     # [n] winning draw score
    token: torch.Tensor     # [n] int64
    lp: torch.Tensor        # [n] logprob-row value of the winner (-inf when not tracked)
    failed: torch.Tensor    # [n] bool: undecided, take the exact path
    total: torch.Tensor     # [n] int64 exact kept mass S
    target: torch.Tensor    # [n] fp64 top_p * S
    j_star: torch.Tensor    # [n] int64 the crossing sub-bin
    above_j: torch.Tensor   # [n] int64 exact kept mass above sub-bin j* (tokens >= b included)


def resolve(parts: dict, certain: tuple, top_p: torch.Tensor, ok: torch.Tensor) -> BandResult:
    """After round 2 (identical on every rank). parts: the gathered `local_partials` fields
    [P, n, ...]; certain: (score, id, lp) of the draw over tokens >= b (already row-wide)."""
    total = parts["total"].sum(dim=0)
    cum = torch.cat([parts["above"].sum(dim=0).unsqueeze(1), parts["mass"].sum(dim=0)], dim=1).cumsum(dim=1)
    target = top_p.to(torch.float64) * total.to(torch.float64)
    cf = cum.to(torch.float64)
    tgt = target.unsqueeze(1)
    inside = ok & (cf[:, 0] < target) & (cf[:, -1] >= target)
    j_star = (cf[:, 1:] >= tgt).int().argmax(dim=1)                  # first sub-bin reaching p * S
    win = best_part(parts["score"], parts["id"])                      # per sub-bin, across parts
    score, tok = take(parts["score"], win), take(parts["id"], win).to(torch.int64)
    value = take(parts["value"], win)
    lp = take(parts["lp"], win) if "lp" in parts else torch.full_like(score, NEG_INF)
    top = parts["top"].amax(dim=0)
    k = torch.arange(score.shape[1], device=score.device).unsqueeze(0)
    above = k < j_star.unsqueeze(1)                                   # kept sub-bins
    cand_s = torch.cat([certain[0].unsqueeze(1), score.masked_fill(~above, NEG_INF)], dim=1)
    cand_i = torch.cat([certain[1].unsqueeze(1), tok.masked_fill(~above, NO_ID)], dim=1)
    cand_l = torch.cat([certain[2].unsqueeze(1), lp], dim=1)
    pick = best_part(cand_s.t(), cand_i.t())
    w_s, w_i = cand_s.gather(1, pick.unsqueeze(1)).squeeze(1), cand_i.gather(1, pick.unsqueeze(1)).squeeze(1)
    w_l = cand_l.gather(1, pick.unsqueeze(1)).squeeze(1)
    js = j_star.unsqueeze(1)
    s_s, s_i = score.gather(1, js).squeeze(1), tok.gather(1, js).squeeze(1)
    s_v, s_top, s_l = value.gather(1, js).squeeze(1), top.gather(1, js).squeeze(1), lp.gather(1, js).squeeze(1)
    star_wins = (s_s > w_s) | ((s_s == w_s) & (s_i < w_i))
    decided = s_v == s_top                                            # j*'s max value is always kept
    failed = ~inside | (star_wins & ~decided)
    use = star_wins & decided
    return BandResult(torch.where(use, s_s, w_s), torch.where(use, s_i, w_i), torch.where(use, s_l, w_l),
                      failed, total, target, j_star, cum.gather(1, j_star.unsqueeze(1)).squeeze(1))
