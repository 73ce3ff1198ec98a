"""Per-row planning after the scan of `sample_rows` (select_kernel, grid (rows,)).

Combines the splits and finishes greedy and plain rows. For top-k rows (with or without top-p
and min-p) it finds tau, a lower bound of the final threshold from the block maxima: the k-th
largest block maximum (k blocks each hold a value >= it), and min-p's t1. Every kept token has
l >= tau, so the next pass collects {l >= tau} as candidates (stage COLLECT); if the block
maxima show that more than CAP tokens pass tau, the row takes the exact search instead (stage
HIST). Rows with top-p and no top-k are resolved from one list of columns (stage LIST,
lists.py): the guessed x bound of that list, and the value range of the bracket method
they take when the list does not settle them (bracket.py). Rows with min-p alone go
straight to the masked draw (DRAW).
"""
import triton
import triton.language as tl

from ..tlutil import (
    BIG_ID32,
    NEG_INF,
    argmax_pair,
    fexp,
    key_to_float,
    max_key_with_count,
    order_key,
    pair_max,
)
from .bracket import range_for_top_p, x_bound
from .scan import (
    COLLECT,
    DONE,
    DRAW,
    FAST,
    FILTER,
    GREEDY,
    LIST,
    PLAIN,
    eligible_key,
    fp32_nonan,
    row_flags,
    sigma_on,
    start_search,
    zero_counters,
)
from .sigma import sigma_threshold


@triton.jit
def _block_keys(bmax_ptr, row, nblk, NBP: tl.constexpr):
    b = tl.arange(0, NBP)
    bv = tl.load(bmax_ptr + row.to(tl.int64) * nblk + b, mask=b < nblk, other=NEG_INF)
    return bv, order_key(bv).to(tl.int64), b < nblk


@triton.jit
def kth_block_max(bmax_ptr, row, nblk, k, NBP: tl.constexpr):
    """The k-th largest block maximum (-inf when k > number of blocks)."""
    _, keys, valid = _block_keys(bmax_ptr, row, nblk, NBP)
    kappa = max_key_with_count(keys, valid, tl.minimum(k, nblk))
    return tl.where(k <= nblk, key_to_float(kappa), NEG_INF)


@triton.jit
def block_max_sum(bmax_ptr, row, nblk, m, NBP: tl.constexpr):
    """sum(exp(b - m)) over the row's block maxima b: at most the row's sum of exp(l - m) (the
    maxima are distinct entries; the fast exp's ulps are within range_for_top_p's margin)."""
    bv, _, _ = _block_keys(bmax_ptr, row, nblk, NBP)
    return tl.sum(tl.where(bv > NEG_INF, fexp(bv - m, False), 0.0), axis=0)


@triton.jit
def lower_bound_tau(bmax_ptr, row, nblk, k, t1, NBP: tl.constexpr):
    """For a top-k row: tau <= every kept value (k blocks each hold a value >= the k-th largest
    block maximum; min-p's t1), and a lower bound of how many entries reach it."""
    tau = tl.maximum(t1, kth_block_max(bmax_ptr, row, nblk, k, NBP))
    b = tl.arange(0, NBP)
    bv = tl.load(bmax_ptr + row.to(tl.int64) * nblk + b, mask=b < nblk, other=NEG_INF)
    return tau, tl.sum((bv >= tau).to(tl.int32), axis=0)


@triton.jit
def kth_block_max_near(bmax_ptr, row, nblk, k, lo, m, NBP: tl.constexpr, STEPS: tl.constexpr):
    """A value in [lo, m] at or below max(the k-th largest block maximum, lo) and within
    (m - lo) / 2**STEPS of it: STEPS bisections of the value range by the count of maxima at or
    above, instead of `kth_block_max`'s 33 over the keys (a long chain of one-row reductions),
    for a bound that is only a guess (a lower one lists a few entries more)."""
    bv, _, _ = _block_keys(bmax_ptr, row, nblk, NBP)
    a, z = lo, m        # count(maxima >= a) >= k unless a is lo; count(maxima >= z) < k unless z is m
    for _ in range(STEPS):
        mid = a + (z - a) * 0.5
        ok = tl.sum((bv >= mid).to(tl.int32), axis=0) >= k
        a = tl.where(ok, mid, a)
        z = tl.where(ok, z, mid)
    return a


@triton.jit
def list_bound(bmax_ptr, row, nblk, k, lo, m, t, NBP: tl.constexpr):
    """The x bound of the hist pass's guessed list for a top-p row (lists.py): that of the
    k-th largest block maximum, or of lo when higher, to within 1/4096 of the row's range
    (`kth_block_max_near`)."""
    return x_bound(kth_block_max_near(bmax_ptr, row, nblk, k, lo, m, NBP, 12), t)


@triton.jit
def raw_argmax(xrow, ncols):
    """First argmax of one row of x (NaN as -inf), one program: only for the guard's rare rows."""
    best_v = tl.full((), NEG_INF, tl.float32)
    best_i = tl.full((), 0, tl.int32)
    offs = tl.arange(0, 1024)
    for s in range(0, ncols, 1024):
        x = fp32_nonan(tl.load(xrow + s + offs, mask=s + offs < ncols, other=NEG_INF))
        v, i = argmax_pair(x, tl.where(s + offs < ncols, s + offs, BIG_ID32))
        best_v, best_i = pair_max(best_v, best_i, v, i)
    return tl.where(best_v > NEG_INF, best_i, 0).to(tl.int32)


@triton.jit(do_not_specialize=["col_offset"])
def select_kernel(x_ptr, stride, t_ptr, k_ptr, p_ptr, lmp_ptr, ncols, col_offset,
                  raw_v_ptr, raw_i_ptr, max_ptr, best_v_ptr, best_i_ptr, bmax_ptr, nblk,
                  st_stage, st_token, st_valid, st_raw, st_m, st_t1, st_flags, st_tkey, st_klo, st_khi,
                  st_shift, st_cabove, st_mabove, st_piv, cand_n, st_hlo, st_hinv, st_xf, list_k,
                  nsig_ptr, sig_sums, sig_top, sig_scale,
                  NSPLIT: tl.constexpr, NBP: tl.constexpr, CAP: tl.constexpr, P: tl.constexpr,
                  NB: tl.constexpr, SIGMA: tl.constexpr, PTX: tl.constexpr):
    row = tl.program_id(0)
    parts = row * NSPLIT + tl.arange(0, NSPLIT)
    raw_v, raw_i = argmax_pair(tl.load(raw_v_ptr + parts), tl.load(raw_i_ptr + parts))
    best_v, best_i = argmax_pair(tl.load(best_v_ptr + parts), tl.load(best_i_ptr + parts))
    m = tl.max(tl.load(max_ptr + parts), axis=0)
    k = tl.load(k_ptr + row)
    p = tl.load(p_ptr + row)
    lmp = tl.load(lmp_ptr + row)
    sig = sigma_on(nsig_ptr, row, SIGMA)
    mode, topk, topp, minp = row_flags(tl.load(t_ptr + row), k, p, lmp, sig, ncols)
    valid = tl.where(mode == GREEDY, raw_v > NEG_INF, tl.where(mode == PLAIN, best_v > NEG_INF, m > NEG_INF))
    # the guard's token is x's argmax; the scan has it only for greedy rows, and a row off
    # greedy needs it only when every x / T is -inf: x has no entry above -inf (then column 0)
    # or every x / T overflows to -inf (x near -FLT_MAX * T), which takes a search here
    raw_i = tl.where(mode == GREEDY, raw_i, 0)
    if (mode != GREEDY) & (~valid):
        raw_i = raw_argmax(x_ptr + row.to(tl.int64) * stride, ncols)
    tl.store(st_raw + row, raw_i)
    tl.store(st_m + row, m)
    zero_counters(cand_n, row)
    stage = tl.full((), DONE, tl.int32)
    token = raw_i
    if mode == PLAIN:
        token = tl.where(valid, best_i, raw_i)
    elif mode == FILTER:
        topp = topp & (m < float("inf"))
        t1 = tl.where(minp, m + lmp, NEG_INF)
        if SIGMA:
            if sig:             # top-n-sigma's threshold joins min-p's (sigma.py)
                t1 = tl.maximum(t1, sigma_threshold(row, tl.load(nsig_ptr + row), sig_sums, sig_top, sig_scale,
                                                    NSPLIT, PTX))
            minp = minp | sig   # a threshold below the max, as min-p's (range_for_top_p: S >= 1)
        tl.store(st_t1 + row, t1)
        tkey = eligible_key(t1)
        if valid:
            stage = tl.full((), DRAW, tl.int32)
            tl.store(st_tkey + row, tkey)
            if topp & ~topk:
                lo, inv = range_for_top_p(m, t1, p, block_max_sum(bmax_ptr, row, nblk, m, NBP), minp, ncols)
                tl.store(st_hlo + row, lo)
                tl.store(st_hinv + row, inv)
                tl.store(st_xf + row, list_bound(bmax_ptr, row, nblk, list_k, lo, m, tl.load(t_ptr + row), NBP))
                stage = tl.full((), LIST, tl.int32)
            elif topk:
                tau, n_lb = lower_bound_tau(bmax_ptr, row, nblk, k, t1, NBP)
                if n_lb <= CAP:
                    stage = tl.full((), COLLECT, tl.int32)
                    tl.store(st_flags + row, tl.full((), FAST, tl.int32))
                    tl.store(st_klo + row, tl.maximum(eligible_key(tau), tkey))
                    tl.store(st_khi + row, tl.full((), 0xFFFFFFFF, tl.int64))
                else:
                    stage = start_search(row, ~topk, tl.where(topk, eligible_key(NEG_INF), tkey), m,
                                         st_flags, st_tkey, st_klo, st_khi, st_shift, st_cabove, st_mabove,
                                         st_piv, P, NB)
    tl.store(st_stage + row, stage)
    tl.store(st_token + row, token.to(tl.int64) + col_offset)
    tl.store(st_valid + row, valid)
