"""Top-p without top-k when the list does not settle the row: the bracket method (stage BINS;
docs/kernels.md, "How `sample_rows` works" 5). After the scan (m = max(l), the block maxima)
and the hist pass (the row's exact int64 mass S):

- select (every such row): a range [lo, m] that must hold v*: the dropped entries carry more
  than (1 - p) of S and there are at most V of them, so v* >= m + log((1 - p) * S_lo / V) with
  S_lo <= S / 2**shift the sum of exp(b - m) over the block maxima b (1 with min-p, where S
  counts only entries >= t1); lo is that bound less a margin, never below t1.
- the bins pass (`lists.hist_kernel` with BINS): an exact count histogram of [lo, m] over NBH
  bins uniform in value, bin(l) = min(floor((l - lo) * inv), NBH - 1) in fp32 (monotone in l);
  its last program a row makes `bracket_row`: bounds of the mass above each bin (count x exp of
  its edges, with margins) against p * S give the bins that surely hold kept entries and those
  that surely do not; v* lies in the bins between (the bracket), whose count is exact. Few
  entries from the bracket up: stage LEAN (lists.py); else BRACKET.
- round (pass 3, `collect_bracket`): the bracket's entries become candidates; entries above it,
  all kept, give their exact mass and their Gumbel winner.
- finish (`resolve_bracket`): v* from the candidates' exact masses, certified exactly:
  float64(mass above the bracket) < p * S <= float64(that + the candidates' mass); the token is
  the better of the winner above and the kept candidates' Gumbel argmax.
A bracket of more than CAP entries is first narrowed around the bin where v* is estimated
(`narrow_bracket`); one that still holds more, or does not certify, starts the exact search
(stage HIST, counted in `fallbacks`). Every decision is on exact integers or keys.
"""
import triton
import triton.language as tl

from ..tlutil import (
    BIG_ID32,
    NEG_INF,
    argmax_pair,
    div_t,
    fexp,
    gumbel_from_bits,
    kept_mass,
    key_to_float,
    mass,
    may_win,
    min_key_mass_below,
    pair_max,
    uniform_bits,
)
from .scan import BRACKET, DONE, append_candidates, draw_candidates, start_search
from .scan import LEAN as LEAN_STAGE


@triton.jit
def range_for_top_p(m, t1, p, s_all, minp, ncols):
    """(lo, inv): the bracket's value range [lo, m] (see the module docstring) and NBH / width
    (the caller multiplies by NBH). s_all: a lower bound of the row's sum of exp(l - m), within
    the fast exp's ulps (the block maxima's sum)."""
    s_lo = tl.where(minp, 1.0, tl.maximum(s_all * 0.999, 1.0))
    lo = m + tl.log(s_lo * (1.0 - p) * 0.999 / ncols.to(tl.float32)) - 1e-3
    lo = tl.maximum(lo, t1)
    width = tl.maximum(m - lo, 1e-30)
    return lo, 1.0 / width


@triton.jit
def bin_of(l, lo, inv, NBH: tl.constexpr):
    """Bin of entries l >= lo (other lanes: garbage, callers mask them)."""
    return tl.minimum((l - lo) * (inv * NBH), NBH - 1.0).to(tl.int32)


@triton.jit
def bracket(hist_ptr, row, lo, inv, m, target, scale, top_bin, top_mass, ALL: tl.constexpr, NBH: tl.constexpr,
            HW: tl.constexpr, CAP: tl.constexpr):
    """(first bin, last bin, count, upward): the candidates are the entries of bins first..last; bins
    below `first` hold only dropped entries; entries of bins above `last` are all kept (their
    mass and winner come from the collect pass). v* lies in the bins that neither surely hold a
    kept entry nor surely none; when every entry from `first` up numbers at most ALL, last is
    the top bin (no entry above: the finish resolves everything from the candidates), else the
    last bin that may hold v*. count: the candidates' number. target = float64(p) * S (int mass
    units, 2**shift per unit of exp). The row's counts are its first NBH words (of HW a row).
    top_mass: the exact mass of the entries in the bins above top_bin (the list kernel's, from
    the listed entries; 0 with top_bin NBH - 1), which replaces those bins' bounds: the
    bounds' width then comes from the bins below the list's reach only.

    ALL is small (KernelConfig.bracket_all): the finish then resolves ~100 bracket candidates
    instead of the ~1,000 entries from the bracket up (a finish about half as long); the collect
    pass costs the same either way.

    A bracket of more than CAP entries is narrowed (`narrow_bracket`) to at most CAP entries
    around the bin where v* is estimated to lie: the finish's certificate is exact either way."""
    b = tl.arange(0, NBH)
    h = tl.load(hist_ptr + row.to(tl.int64) * HW + b, cache_modifier=".cg")     # other SMs' atomics
    w = 1.0 / (inv * NBH)
    tol = 4e-7 * tl.maximum(tl.abs(m), tl.abs(lo)) + 1e-30
    bf = b.to(tl.float32)
    bot = tl.maximum(lo + (bf - 0.01) * w - tol, lo)
    top = tl.minimum(lo + (bf + 1.01) * w + tol, m)
    e_lo = tl.maximum(fexp(bot - m, False).to(tl.float64) * (1.0 - 1e-5) - 1e-13, 0.0) * scale
    e_hi = fexp(top - m, False).to(tl.float64) * (1.0 + 1e-5) * scale
    below_top = b <= top_bin
    lo_mass = tl.where(below_top, h.to(tl.float64) * e_lo, 0.0)
    hi_mass = tl.where(below_top, h.to(tl.float64) * e_hi, 0.0)
    exact_top = top_mass.to(tl.float64)
    above_lo = exact_top + (tl.sum(lo_mass, axis=0) - tl.cumsum(lo_mass, 0))     # mass strictly above bin b
    above_hi = exact_top + (tl.sum(hi_mass, axis=0) - tl.cumsum(hi_mass, 0))     # (for b below top_bin)
    kept_sure = (h > 0) & (above_hi * (1.0 + 1e-9) < target)        # its top entry is kept
    dropped_sure = above_lo >= target * (1.0 + 1e-9)                 # none of its entries is kept
    last = tl.minimum(tl.min(tl.where(kept_sure, b, NBH - 1), axis=0), NBH - 1)
    first = tl.max(tl.where(dropped_sure, b, -1), axis=0) + 1
    count = tl.sum(tl.where((b >= first) & (b <= last), h, 0), axis=0)
    if count > CAP:
        first, last, count = narrow_bracket(h, b, bf, lo, w, m, scale, target, first, last, top_bin, exact_top, CAP)
    upward = tl.sum(tl.where(b >= first, h, 0), axis=0)
    if upward <= ALL:
        last = NBH - 1
        count = upward
    return first, last, count, upward


@triton.jit
def narrow_bracket(h, b, bf, lo, w, m, scale, target, first, last, top_bin, exact_top, CAP: tl.constexpr):
    """(first, last, count) of a window of the bracket [first, last] that holds at most CAP
    entries (unless v*'s estimated bin alone holds more): the bins from the estimated bin c
    down and up, at most CAP / 2 entries each way. c is where the mass above, estimated with
    every entry at its bin's middle, falls under the target. On a flat row that keeps many
    entries (Zipf-like logits at T 1 / top-p 0.95 keep ~47,000 of 151,936) the bounds' width
    over all the kept mass spans many bins while the estimate misses v* by far less than one.
    A choice only: the entries above the window are massed exactly, those in it are the
    candidates, and the finish certifies float64(mass above) < p * S <= float64(that + the
    candidates' mass), else the row takes the exact search as before."""
    mid = fexp(lo + (bf + 0.5) * w - m, False).to(tl.float64) * scale
    est = tl.where(b <= top_bin, h.to(tl.float64) * mid, 0.0)
    est_above = exact_top + (tl.sum(est, axis=0) - tl.cumsum(est, 0))
    c = tl.min(tl.where((est_above < target) & (b >= first) & (b <= last), b, last), axis=0)
    cum = tl.cumsum(h, 0)                                  # entries in bins <= b
    at_c = tl.sum(tl.where(b == c, cum, 0), axis=0)
    below_c = at_c - tl.sum(tl.where(b == c, h, 0), axis=0)
    half = CAP // 2
    wlo = tl.min(tl.where((b >= first) & (b <= c) & (at_c - (cum - h) <= half), b, c), axis=0)
    whi = tl.max(tl.where((b >= c) & (b <= last) & (cum - below_c <= half), b, c), axis=0)
    return wlo, whi, tl.sum(tl.where((b >= wlo) & (b <= whi), h, 0), axis=0)


@triton.jit
def target_of(p, p_mass, row, NSPLIT: tl.constexpr):
    """float64(p) * S, S the exact int64 mass of the row's eligible entries (summed over splits)."""
    S = tl.sum(tl.load(p_mass + row * NSPLIT + tl.arange(0, NSPLIT), cache_modifier=".cg"), axis=0)
    return p.to(tl.float64) * S.to(tl.float64)


@triton.jit
def lean_fits(upward, LCAP: tl.constexpr, LG: tl.constexpr):
    """Whether a row with `upward` entries from the bracket's first bin up may take the lean
    pass: they fit LCAP less 1/16 (for the few the x bound lets in below L) and, with LG > 1
    counters, the fullest group is expected to fit its LCAP / LG less the same 1/16 (its mean
    plus 4 standard deviations of a Poisson count, plus 1)."""
    room = LCAP - LCAP // 16
    if LG == 1:
        fits = upward <= room
    else:
        mean = upward.to(tl.float32) / LG
        fits = mean + 4.0 * tl.sqrt(mean) + 1.0 <= room / LG
    return fits


@triton.jit
def lean_bound(lo, inv, first, m, t, NBH: tl.constexpr):
    """(L, xf) for a LEAN row: L <= every l of bin `first` (the bracket's own lower edge, less its
    margin); xf = `x_bound(L, T)`, so no entry with l >= L is missed (a few just below L may be
    listed; the finish drops them)."""
    w = 1.0 / (inv * NBH)
    tol = 4e-7 * tl.maximum(tl.abs(m), tl.abs(lo)) + 1e-30
    L = tl.maximum(lo + (first.to(tl.float32) - 0.01) * w - tol, lo)
    return L, x_bound(L, t)


@triton.jit
def x_bound(L, t):
    """xf with div_rn(x, T) >= L  =>  x >= xf: L * T less 2**-20 relative and 1e-30 (x < xf gives
    x / T below L by more than div_rn's half ulp)."""
    y = L * t
    return y - (tl.abs(y) * 9.5367431640625e-07 + 1e-30)


@triton.jit
def bracket_row(row, t, p, scale, m, lo, inv, hist_ptr, p_mass, st_stage, st_first, st_last, st_count, st_lean_l,
                st_xf, st_top_bin, st_top_mass, NSPLIT: tl.constexpr, ALL: tl.constexpr, NBH: tl.constexpr,
                HW: tl.constexpr, CAP: tl.constexpr, LCAP: tl.constexpr, LG: tl.constexpr, LEAN: tl.constexpr):
    """The bracket of a BINS row once its histogram is complete (the collect programs and the
    finish read it): stage LEAN (lists.py) when LEAN, its entries from the bracket's first
    bin up fit the list (`lean_fits`) and its candidates fit CAP, with L and the list's x bound;
    else BRACKET. Read through L2: other programs' atomics made the histogram."""
    first, last, count, upward = bracket(hist_ptr, row, lo, inv, m, target_of(p, p_mass, row, NSPLIT), scale,
                                         tl.load(st_top_bin + row), tl.load(st_top_mass + row), ALL, NBH, HW, CAP)
    tl.store(st_first + row, first)
    tl.store(st_last + row, last)
    tl.store(st_count + row, count)
    stage = tl.full((), BRACKET, tl.int32)
    if LEAN & lean_fits(upward, LCAP, LG) & (count <= CAP):
        L, xf = lean_bound(lo, inv, first, m, t, NBH)
        tl.store(st_lean_l + row, L)
        tl.store(st_xf + row, xf)
        stage = tl.full((), LEAN_STAGE, tl.int32)
    tl.store(st_stage + row, stage)


@triton.jit
def collect_bracket(x_ptr, row_off, t, start, end, row, lo, inv, first, last, m, scale, k0, k1, col_offset,
                    cand_key, cand_id, cand_n, CAP: tl.constexpr, BLOCK: tl.constexpr, NBH: tl.constexpr,
                    EXACT_EXP: tl.constexpr):
    """Pass 3 of a split: candidates of the bracket; (mass, Gumbel winner) of the entries above it."""
    m_above = tl.zeros((), tl.int64)
    best_v = tl.full((), NEG_INF, tl.float32)
    best_i = tl.full((), BIG_ID32, tl.int32)
    offs = tl.arange(0, BLOCK)
    xr = tl.load(x_ptr + row_off + start + offs, mask=start + offs < end, other=NEG_INF)
    for s in range(start, end, BLOCK):
        cols = s + offs
        xr_next = tl.load(x_ptr + row_off + cols + BLOCK, mask=cols + BLOCK < end, other=NEG_INF)
        l = div_t(xr.to(tl.float32), t)     # a NaN x stays NaN: every test below fails for it
        xr = xr_next
        inr = l >= lo
        b = bin_of(l, lo, inv, NBH)
        sel = inr & (b >= first) & (b <= last)
        above = inr & (b > last)
        append_candidates(sel, l, cols, row, cand_key, cand_id, cand_n, CAP)
        if tl.sum(above.to(tl.int32), axis=0) > 0:
            m_above += tl.sum(kept_mass(l, above, m, scale, EXACT_EXP), axis=0)
            u = uniform_bits(k0, k1, cols + col_offset)
            cand = above & may_win(l, u, best_v)      # only these can beat the best so far
            if tl.max(cand.to(tl.int32), axis=0) > 0:
                v, i = argmax_pair(tl.where(cand, l + gumbel_from_bits(u), NEG_INF), cols)
                best_v, best_i = pair_max(best_v, best_i, v, i)
    return m_above, best_v, best_i


@triton.jit
def resolve_keys(row, keys, valid, idx, n, target, m_above, av, ai, m, scale, one, key0_ptr, key1_ptr, col_offset,
                 cand_id, CAP: tl.constexpr, EXACT_EXP: tl.constexpr):
    """(certified, winner value, winner column, threshold key) from n candidates (order keys
    `keys`, columns in cand_id) lying below entries of exact mass m_above, all kept, whose winner
    is (av, ai)."""
    e = tl.where(valid, mass(key_to_float(keys), m, scale, one, EXACT_EXP), 0)
    ok = (m_above.to(tl.float64) < target) & ((m_above + tl.sum(e, axis=0)).to(tl.float64) >= target) & (n > 0)
    kmin = tl.min(tl.where(valid, keys, 1 << 40), axis=0)
    kmax = tl.max(keys, axis=0)
    thr = min_key_mass_below(keys, e, m_above, target, kmin - 1, kmax)
    kept = valid & (keys >= thr)
    bv, bi = draw_candidates(keys, kept, valid, idx, row, key0_ptr, key1_ptr, col_offset, cand_id, CAP)
    v, i = pair_max(av, ai, bv, bi)
    return ok, v, i, thr


@triton.jit
def settle(row, ok, v, i, thr, raw, col_offset, tkey, m, st_token, st_valid, st_flags, st_tkey, st_klo, st_khi,
           st_shift, st_cabove, st_mabove, st_piv, fallbacks, P: tl.constexpr, NB: tl.constexpr, KEPT: tl.constexpr):
    """The row's new stage after its bracket was resolved: DONE with its token (the winner
    (v, i), or the guard's `raw` when nothing was kept) when certified, and with KEPT its
    threshold key `thr` in st_tkey (kept.py), else the exact search (HIST), counted in
    `fallbacks`."""
    stage = tl.full((), DONE, tl.int32)
    if ok:
        found = v > NEG_INF
        tl.store(st_token + row, tl.where(found, i, raw).to(tl.int64) + col_offset)
        tl.store(st_valid + row, found)
        if KEPT:
            tl.store(st_tkey + row, thr)
    else:
        tl.atomic_add(fallbacks, 1)
        stage = start_search(row, True, tkey, m, st_flags, st_tkey, st_klo, st_khi, st_shift, st_cabove,
                             st_mabove, st_piv, P, NB)
    return stage


@triton.jit
def resolve_bracket(row, n, p, m, scale, one, key0_ptr, key1_ptr, col_offset, cand_key, cand_id, p_mass, p_cnt,
                    p_best_v, p_best_i, NSPLIT: tl.constexpr, CAP: tl.constexpr, SIZE: tl.constexpr,
                    EXACT_EXP: tl.constexpr):
    """(certified, winner value, winner column, threshold key) from the n <= SIZE candidates of
    the bracket."""
    parts = row * NSPLIT + tl.arange(0, NSPLIT)
    idx = tl.arange(0, SIZE)
    valid = idx < n
    keys = tl.load(cand_key + row.to(tl.int64) * CAP + idx, mask=valid, other=-1)
    av, ai = argmax_pair(tl.load(p_best_v + parts), tl.load(p_best_i + parts))
    m_above = tl.sum(tl.load(p_cnt + parts), axis=0)
    return resolve_keys(row, keys, valid, idx, n, target_of(p, p_mass, row, NSPLIT), m_above, av, ai, m, scale, one,
                        key0_ptr, key1_ptr, col_offset, cand_id, CAP, EXACT_EXP)
