"""The per-row step after each round of `sample_rows` (grid (rows,)); the stages: launch.py.

- after DRAW: combine the splits' (value, column) winners; no kept entry -> the guard token.
- after COLLECT: more than CAP candidates -> start the exact search. Else sort the candidate keys
  and resolve exactly: with FAST everything (top-k's k-th largest, then top-p's v* over the kept
  candidates, then the Gumbel argmax over the candidates left); otherwise the threshold the
  search was after, carrying on to the next search or to DRAW.
- after HIST: move the window between the pivots that bracket the target (exact counts and
  masses), then collect it if it is small, else place the next pivots.
- after BRACKET: resolve v* from the bracket's candidates and draw (bracket.py); a
  bracket still over CAP entries once narrowed, or one that does not certify, starts the exact
  search (HIST).
- after LEAN: the same from the listed columns (lists.py).
Every row that starts the exact search from COLLECT, BRACKET or LEAN is counted in `fallbacks`.
Rows still not DONE bump `pending`, which tells the host whether to run another round.
"""
import triton
import triton.language as tl

from ..tlutil import (
    BIG_ID32,
    NEG_INF,
    argmax_pair,
    key_to_float,
    mass,
    max_key_with_count,
    min_key_mass_below,
    order_key,
)
from .bracket import resolve_bracket, settle
from .lists import after_lean
from .scan import (
    BRACKET,
    CN,
    COLLECT,
    DONE,
    DRAW,
    FAST,
    FIRST,
    HIST,
    LEAN,
    PHASE_TOPP,
    draw_candidates,
    eligible_key,
    start_search,
    window_shift,
    zero_counters,
)


@triton.jit
def _after_top_k(row, thr, m, p, st_flags, st_tkey, st_klo, st_khi, st_shift, st_cabove, st_mabove,
                 st_piv, P: tl.constexpr, NB: tl.constexpr):
    """top-k (and min-p) settled at key thr: the next stage, a top-p search or the draw."""
    tkey = tl.maximum(thr, eligible_key(NEG_INF))
    stage = tl.full((), DRAW, tl.int32)
    if (p < 1.0) & (m < float("inf")):
        stage = start_search(row, True, tkey, m, st_flags, st_tkey, st_klo, st_khi, st_shift,
                             st_cabove, st_mabove, st_piv, P, NB)
    else:
        tl.store(st_tkey + row, tkey)
    return stage


@triton.jit
def _resolve(row, n, k, p, flags, m, t1, raw, klo, khi, cabove, mabove, S_row, key0_ptr, key1_ptr, col_offset,
             scale, one, st_flags, st_token, st_valid, st_tkey, st_klo, st_khi, st_shift, st_cabove, st_mabove,
             st_piv, cand_key, cand_id, p_mass, NSPLIT: tl.constexpr, CAP: tl.constexpr, SIZE: tl.constexpr,
             P: tl.constexpr, NB: tl.constexpr, EXACT_EXP: tl.constexpr, KEPT: tl.constexpr):
    idx = tl.arange(0, SIZE)
    valid = idx < n
    keys = tl.load(cand_key + row.to(tl.int64) * CAP + idx, mask=valid, other=-1)
    t1key = tl.where(t1 > NEG_INF, order_key(t1).to(tl.int64), 0)
    stage = tl.full((), DONE, tl.int32)
    if (flags & FAST) != 0:
        thr = t1key
        if (k > 0) & (k <= n):
            thr = tl.maximum(thr, max_key_with_count(keys, valid, k))
        if (p < 1.0) & (m < float("inf")):
            e = tl.where(valid & (keys >= thr), mass(key_to_float(keys), m, scale, one, EXACT_EXP), 0)
            S = tl.sum(e, axis=0)           # FAST rows have top-k: their kept set is among the candidates
            target = p.to(tl.float64) * S.to(tl.float64)
            thr = min_key_mass_below(keys, e, tl.zeros((), tl.int64), target, thr - 1,
                                     tl.full((), 0xFFFFFFFF, tl.int64))
        kept = valid & (keys >= thr)
        bv, bi = draw_candidates(keys, kept, valid, idx, row, key0_ptr, key1_ptr, col_offset, cand_id, CAP)
        found = bv > NEG_INF
        tl.store(st_token + row, tl.where(found, bi, raw).to(tl.int64) + col_offset)
        tl.store(st_valid + row, found)
        if KEPT:    # the row's kept set, for the kept pass (kept.py)
            tl.store(st_tkey + row, thr)
    elif (flags & PHASE_TOPP) == 0:
        kappa = max_key_with_count(keys, valid, k - cabove)
        stage = _after_top_k(row, tl.maximum(kappa, t1key), m, p, st_flags, st_tkey, st_klo, st_khi, st_shift,
                             st_cabove, st_mabove, st_piv, P, NB)
    else:
        e = tl.where(valid, mass(key_to_float(keys), m, scale, one, EXACT_EXP), 0)
        target = p.to(tl.float64) * S_row.to(tl.float64)
        thr = min_key_mass_below(keys, e, mabove, target, klo - 1, khi)
        tl.store(st_tkey + row, thr)
        stage = tl.full((), DRAW, tl.int32)
    return stage


@triton.jit
def _sum_parts(ptr, row, NSPLIT: tl.constexpr, W: tl.constexpr):
    """Sum over the splits of a [rows, NSPLIT, W] partial -> [W]."""
    off = (row * NSPLIT + tl.arange(0, NSPLIT))[:, None] * W + tl.arange(0, W)[None, :]
    return tl.sum(tl.load(ptr + off), axis=0)


@triton.jit
def _next_pivots(hist, klo, shift, lo, hi, n_new, P: tl.constexpr, NB: tl.constexpr):
    """P keys inside [lo, hi): even ones at count quantiles of the histogram bins (over the old
    window from klo, 2**shift keys a bin) that meet [lo, hi]; odd ones evenly spaced in keys."""
    b = tl.arange(0, NB).to(tl.int64)
    edge = klo + (b << shift)
    meet = (edge + (tl.full((), 1, tl.int64) << shift) - 1 >= lo) & (edge <= hi)
    h = tl.where(meet, hist, 0).to(tl.int64)
    desc = tl.sum(h, axis=0) - tl.cumsum(h, 0) + h
    j = tl.arange(0, P).to(tl.int64)
    want = (n_new * (j + 1)) // (P + 1)
    bj = tl.max(tl.where((desc[None, :] >= want[:, None]) & meet[None, :], b[None, :], -1), axis=1)
    q = klo + (bj << shift) - 1
    even = lo + ((hi - lo) * (j + 1)) // (P + 1)
    use_q = (j % 2 == 0) & (bj >= 0) & (q >= lo) & (q < hi)
    return tl.where(use_q, q, even)


@triton.jit
def _hist_step(row, k, p, flags, m, t1, klo, khi, shift, cabove, mabove, S, piv, st_flags, st_tkey, st_klo, st_khi,
               st_shift, st_cabove, st_mabove, st_S, st_piv, p_cnt, p_mass, p_cgt, p_mgt, p_hist,
               NSPLIT: tl.constexpr, CAP: tl.constexpr, P: tl.constexpr, NB: tl.constexpr):
    parts = row * NSPLIT + tl.arange(0, NSPLIT)
    cnt = tl.sum(tl.load(p_cnt + parts), axis=0)
    topp = (flags & PHASE_TOPP) != 0
    if (flags & FIRST) != 0:
        S = mabove + tl.sum(tl.load(p_mass + parts), axis=0)
        tl.store(st_S + row, S)
    stage = tl.full((), HIST, tl.int32)
    if (~topp) & (cabove + cnt < k):        # fewer than k entries above -inf: top-k keeps all
        stage = _after_top_k(row, tl.where(t1 > NEG_INF, order_key(t1).to(tl.int64), 0), m, p, st_flags,
                             st_tkey, st_klo, st_khi, st_shift, st_cabove, st_mabove, st_piv, P, NB)
    else:
        G = cabove + _sum_parts(p_cgt, row, NSPLIT, P)          # entries with key > pivot
        F = mabove + _sum_parts(p_mgt, row, NSPLIT, P)          # their mass
        target = p.to(tl.float64) * S.to(tl.float64)
        up = tl.where(topp, F.to(tl.float64) >= target, G >= k)  # the threshold lies above the pivot
        inside = (piv >= klo) & (piv < khi)
        lo = tl.maximum(tl.max(tl.where(inside & up, piv + 1, klo), axis=0), klo)
        hi = tl.minimum(tl.min(tl.where(inside & ~up, piv, khi), axis=0), khi)
        at_lo = inside & up & (piv + 1 == lo)
        at_hi = inside & ~up & (piv == hi)
        g_lo = tl.where(tl.sum(at_lo.to(tl.int32), axis=0) > 0, tl.max(tl.where(at_lo, G, -1), axis=0), cabove + cnt)
        g_hi = tl.where(tl.sum(at_hi.to(tl.int32), axis=0) > 0, tl.max(tl.where(at_hi, G, -1), axis=0), cabove)
        f_hi = tl.where(tl.sum(at_hi.to(tl.int32), axis=0) > 0, tl.max(tl.where(at_hi, F, -1), axis=0), mabove)
        n_new = g_lo - g_hi
        tl.store(st_klo + row, lo)
        tl.store(st_khi + row, hi)
        tl.store(st_cabove + row, g_hi)
        tl.store(st_mabove + row, f_hi)
        tl.store(st_flags + row, flags & ~FIRST)
        if topp & ((n_new == 0) | (lo == hi)):   # kappa* = hi: nothing else in the window is kept
            tl.store(st_tkey + row, tl.where(n_new == 0, hi + 1, hi))
            stage = tl.full((), DRAW, tl.int32)
        elif lo == hi:                           # one key left: the k-th largest (ties at any count)
            stage = _after_top_k(row, tl.maximum(lo, tl.where(t1 > NEG_INF, order_key(t1).to(tl.int64), 0)), m, p,
                                 st_flags, st_tkey, st_klo, st_khi, st_shift, st_cabove, st_mabove, st_piv, P, NB)
        elif n_new <= CAP:
            stage = tl.full((), COLLECT, tl.int32)
        else:
            hist = _sum_parts(p_hist, row, NSPLIT, NB)
            tl.store(st_piv + row * P + tl.arange(0, P),
                     _next_pivots(hist, klo, shift.to(tl.int64), lo, hi, n_new, P, NB))
            tl.store(st_shift + row, window_shift(lo, hi, NB).to(tl.int32))
    return stage


@triton.jit
def _after_bracket(row, n, p, m, raw, tkey, scale, one, key0_ptr, key1_ptr, col_offset, st_flags, st_token, st_valid,
                   st_tkey, st_klo, st_khi, st_shift, st_cabove, st_mabove, st_piv, cand_key, cand_id, p_mass, p_cnt,
                   p_best_v, p_best_i, st_count, fallbacks, NSPLIT: tl.constexpr, CAP: tl.constexpr,
                   SMALL: tl.constexpr, P: tl.constexpr, NB: tl.constexpr, EXACT_EXP: tl.constexpr,
                   KEPT: tl.constexpr):
    count = tl.load(st_count + row)
    ok = count <= CAP
    v = tl.full((), NEG_INF, tl.float32)
    i = tl.full((), BIG_ID32, tl.int32)
    thr = tl.zeros((), tl.int64)
    if ok:
        if count <= SMALL:
            ok, v, i, thr = resolve_bracket(row, n, p, m, scale, one, key0_ptr, key1_ptr, col_offset, cand_key, cand_id,
                                       p_mass, p_cnt, p_best_v, p_best_i, NSPLIT, CAP, SMALL, EXACT_EXP)
        else:
            ok, v, i, thr = resolve_bracket(row, n, p, m, scale, one, key0_ptr, key1_ptr, col_offset, cand_key, cand_id,
                                       p_mass, p_cnt, p_best_v, p_best_i, NSPLIT, CAP, CAP, EXACT_EXP)
    return settle(row, ok, v, i, thr, raw, col_offset, tkey, m, st_token, st_valid, st_flags, st_tkey, st_klo,
                  st_khi, st_shift, st_cabove, st_mabove, st_piv, fallbacks, P, NB, KEPT)


@triton.jit
def finish_body(row, ncols, k_ptr, p_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
                st_stage, st_flags, st_token, st_valid, st_raw, st_m, st_t1, st_tkey, st_klo, st_khi, st_shift,
                st_cabove, st_mabove, st_S, st_piv, cand_key, cand_id, cand_n,
                p_best_v, p_best_i, p_cnt, p_mass, p_cgt, p_mgt, p_hist, st_count, fallbacks,
                x_ptr, stride, t_ptr, st_hlo, st_hinv, st_last, st_lean_l, ids_ptr, leans,
                NSPLIT: tl.constexpr, CAP: tl.constexpr, SMALL: tl.constexpr, P: tl.constexpr,
                NB: tl.constexpr, EXACT_EXP: tl.constexpr, STAGES: tl.constexpr, LCAP: tl.constexpr,
                FC: tl.constexpr, NBH: tl.constexpr, LG: tl.constexpr, KEPT: tl.constexpr):
    """The row's step after a round; returns its new stage (DONE when its token is written;
    with KEPT, every filter row's final threshold key is then in st_tkey: kept.py)."""
    # Read all of the row's state, then a barrier, then write: warps run unsynchronised, and a
    # warp must never read a field another warp of this program has already rewritten.
    stage = tl.load(st_stage + row)
    k = tl.load(k_ptr + row)
    p = tl.load(p_ptr + row)
    flags = tl.load(st_flags + row)
    m = tl.load(st_m + row)
    t1 = tl.load(st_t1 + row)
    raw = tl.load(st_raw + row)
    klo = tl.load(st_klo + row)
    khi = tl.load(st_khi + row)
    shift = tl.load(st_shift + row)
    cabove = tl.load(st_cabove + row)
    mabove = tl.load(st_mabove + row)
    S = tl.load(st_S + row)
    n = tl.load(cand_n + row * CN)
    tkey = tl.load(st_tkey + row)
    piv = tl.load(st_piv + row * P + tl.arange(0, P))
    tl.debug_barrier()
    if stage == DRAW:
        parts = row * NSPLIT + tl.arange(0, NSPLIT)
        bv, bi = argmax_pair(tl.load(p_best_v + parts), tl.load(p_best_i + parts))
        valid = bv > NEG_INF
        tl.store(st_token + row, tl.where(valid, bi, raw).to(tl.int64) + col_offset)
        tl.store(st_valid + row, valid)
        stage = tl.full((), DONE, tl.int32)
    elif stage == COLLECT:
        tl.store(cand_n + row * CN, 0)
        if n > CAP:
            tl.atomic_add(fallbacks, 1)
            topk_on = (k > 0) & (k < ncols)
            tkey = tl.where(topk_on, eligible_key(NEG_INF), eligible_key(t1))
            stage = start_search(row, ~topk_on, tkey, m, st_flags, st_tkey, st_klo, st_khi,
                                 st_shift, st_cabove, st_mabove, st_piv, P, NB)
        elif n <= SMALL:
            stage = _resolve(row, n, k, p, flags, m, t1, raw, klo, khi, cabove, mabove, S, key0_ptr, key1_ptr,
                             col_offset, scale, one, st_flags, st_token, st_valid, st_tkey, st_klo, st_khi, st_shift,
                             st_cabove, st_mabove, st_piv, cand_key, cand_id, p_mass, NSPLIT, CAP, SMALL, P, NB,
                             EXACT_EXP, KEPT)
        else:
            stage = _resolve(row, n, k, p, flags, m, t1, raw, klo, khi, cabove, mabove, S, key0_ptr, key1_ptr,
                             col_offset, scale, one, st_flags, st_token, st_valid, st_tkey, st_klo, st_khi, st_shift,
                             st_cabove, st_mabove, st_piv, cand_key, cand_id, p_mass, NSPLIT, CAP, CAP, P, NB,
                             EXACT_EXP, KEPT)
    elif ((STAGES & 4) != 0) & (stage == HIST):     # (a HIST row waits when the round left HIST out)
        stage = _hist_step(row, k, p, flags, m, t1, klo, khi, shift, cabove, mabove, S, piv, st_flags, st_tkey,
                           st_klo, st_khi, st_shift, st_cabove, st_mabove, st_S, st_piv, p_cnt, p_mass, p_cgt,
                           p_mgt, p_hist, NSPLIT, CAP, P, NB)
    elif ((STAGES & 8) != 0) & (stage == BRACKET):
        tl.store(cand_n + row * CN, 0)
        stage = _after_bracket(row, n, p, m, raw, tkey, scale, one, key0_ptr, key1_ptr, col_offset, st_flags,
                               st_token, st_valid, st_tkey, st_klo, st_khi, st_shift, st_cabove, st_mabove, st_piv,
                               cand_key, cand_id, p_mass, p_cnt, p_best_v, p_best_i, st_count, fallbacks, NSPLIT, CAP,
                               SMALL, P, NB, EXACT_EXP, KEPT)
    elif ((STAGES & 8) != 0) & (stage == LEAN):
        stage = after_lean(row, cand_n, p, m, raw, tkey, x_ptr, stride, t_ptr, key0_ptr, key1_ptr, col_offset,
                           scale, one, st_flags, st_token, st_valid, st_tkey, st_klo, st_khi, st_shift, st_cabove,
                           st_mabove, st_piv, st_hlo, st_hinv, st_last, st_lean_l, ids_ptr, cand_id, p_mass,
                           fallbacks, leans, NSPLIT, CAP, SMALL, LCAP, FC, P, NB, NBH, EXACT_EXP, LG, KEPT)
        tl.debug_barrier()      # the list's counters are read before they are zeroed
        zero_counters(cand_n, row)
    tl.store(st_stage + row, stage)
    return stage


@triton.jit(do_not_specialize=["col_offset"])
def finish_kernel(ncols, k_ptr, p_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
                  st_stage, st_flags, st_token, st_valid, st_raw, st_m, st_t1, st_tkey, st_klo, st_khi, st_shift,
                  st_cabove, st_mabove, st_S, st_piv, cand_key, cand_id, cand_n,
                  p_best_v, p_best_i, p_cnt, p_mass, p_cgt, p_mgt, p_hist, pending, st_count, fallbacks,
                  x_ptr, stride, t_ptr, st_hlo, st_hinv, st_last, st_lean_l, ids_ptr, leans,
                  NSPLIT: tl.constexpr, CAP: tl.constexpr, SMALL: tl.constexpr, P: tl.constexpr,
                  NB: tl.constexpr, EXACT_EXP: tl.constexpr, STAGES: tl.constexpr, LCAP: tl.constexpr,
                  FC: tl.constexpr, NBH: tl.constexpr, LG: tl.constexpr, KEPT: tl.constexpr):
    row = tl.program_id(0)
    stage = finish_body(row, ncols, k_ptr, p_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
                        st_stage, st_flags, st_token, st_valid, st_raw, st_m, st_t1, st_tkey, st_klo, st_khi,
                        st_shift, st_cabove, st_mabove, st_S, st_piv, cand_key, cand_id, cand_n,
                        p_best_v, p_best_i, p_cnt, p_mass, p_cgt, p_mgt, p_hist, st_count, fallbacks,
                        x_ptr, stride, t_ptr, st_hlo, st_hinv, st_last, st_lean_l, ids_ptr, leans,
                        NSPLIT, CAP, SMALL, P, NB, EXACT_EXP, STAGES, LCAP, FC, NBH, LG, KEPT)
    if stage != DONE:
        tl.atomic_add(pending, 1)
