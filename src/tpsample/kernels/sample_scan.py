"""Pass 1 of `sample_rows` (the scan) and the per-row step that plans the rest (select).

scan_kernel, grid (rows, splits): one streaming read of each row split. Always: the raw argmax of
x (NaN as -inf). Also the NaN count of x. Greedy rows: nothing else. Plain rows (temperature only): the whole draw, the
Gumbel argmax of l = x / T. Filter rows: max(l); block maxima of l (blocks of BB columns) when
top-k or top-p is on; an online sum of exp(l - max) when top-p is on without top-k.

select_kernel, grid (rows,): combines the splits, finishes greedy and plain rows, and for filter
rows finds tau, a lower bound of the final threshold from the block maxima: the k-th largest
block maximum (k blocks each hold a value >= it), min-p's t1, and for top-p alone the largest
block maximum b whose block-maxima mass above b already reaches p * (an upper bound of S).
Every kept token has l >= tau, so the next pass collects {l >= tau} as candidates (stage
COLLECT); if the block maxima show that more than CAP tokens pass tau, the row takes the exact
general search instead (stage HIST). Rows with min-p only go straight to the masked draw (DRAW).
"""
import triton
import triton.language as tl

from .rng_triton import gumbel
from .sample_state import COLLECT, DONE, DRAW, FAST, FILTER, GREEDY, NEED_S, PLAIN, eligible_key, start_search
from .tlutil import BIG_ID32, NEG_INF, argmax_pair, chunk_bounds, div_t, fexp, key_to_float, \
    max_key_with_count, order_key, pair_max


@triton.jit
def row_flags(t, k, p, lmp, ncols):
    """(mode, top-k on, top-p on, min-p on) of a row from its parameters."""
    topk = (k > 0) & (k < ncols)
    topp = p < 1.0
    minp = lmp > NEG_INF
    mode = tl.where(t == 0.0, GREEDY, tl.where(topk | topp | minp, FILTER, PLAIN))
    return mode, topk, topp, minp


@triton.jit
def _load_count_nans(x_ptr, row_off, cols, mask):
    """(x upcast with NaN -> -inf, number of NaNs) for a block."""
    x = tl.load(x_ptr + row_off + cols, mask=mask, other=NEG_INF).to(tl.float32)
    nan = x != x
    return tl.where(nan, NEG_INF, x), tl.sum(tl.sum(nan.to(tl.int32), axis=1), axis=0)


@triton.jit(do_not_specialize=["col_offset"])
def scan_kernel(x_ptr, stride, ncols, t_ptr, k_ptr, p_ptr, lmp_ptr, key0_ptr, key1_ptr, col_offset,
                raw_v_ptr, raw_i_ptr, max_ptr, best_v_ptr, best_i_ptr, se_m_ptr, se_s_ptr, nan_ptr, bmax_ptr,
                nblk, NSPLIT: tl.constexpr, CHUNK: tl.constexpr, TILE: tl.constexpr, BB: tl.constexpr,
                EXACT_EXP: tl.constexpr):
    row = tl.program_id(0)
    part = row * NSPLIT + tl.program_id(1)
    start, end = chunk_bounds(ncols, CHUNK)
    row_off = row.to(tl.int64) * stride
    t = tl.load(t_ptr + row)
    k = tl.load(k_ptr + row)
    p = tl.load(p_ptr + row)
    mode, topk, topp, minp = row_flags(t, k, p, tl.load(lmp_ptr + row), ncols)
    offs = tl.arange(0, TILE)[:, None] * BB + tl.arange(0, BB)[None, :]
    raw_v = tl.full((), NEG_INF, tl.float32)
    raw_i = tl.full((), BIG_ID32, tl.int32)
    best_v = tl.full((), NEG_INF, tl.float32)
    best_i = tl.full((), BIG_ID32, tl.int32)
    mx = tl.full((), NEG_INF, tl.float32)
    se_m = tl.full((), NEG_INF, tl.float32)
    se_s = tl.full((), 0.0, tl.float32)
    nans = tl.zeros((), tl.int32)
    if mode == GREEDY:
        for s in range(start, end, TILE * BB):
            cols = s + offs
            x, nn = _load_count_nans(x_ptr, row_off, cols, cols < end)
            nans += nn
            v, i = argmax_pair(x, cols)
            raw_v, raw_i = pair_max(raw_v, raw_i, v, i)
    elif mode == PLAIN:
        k0 = tl.load(key0_ptr + row).to(tl.uint32)
        k1 = tl.load(key1_ptr + row).to(tl.uint32)
        for s in range(start, end, TILE * BB):
            cols = s + offs
            x, nn = _load_count_nans(x_ptr, row_off, cols, cols < end)
            nans += nn
            v, i = argmax_pair(x, cols)
            raw_v, raw_i = pair_max(raw_v, raw_i, v, i)
            l = div_t(x, t)
            score = tl.where(l > NEG_INF, l + gumbel(k0, k1, cols + col_offset), NEG_INF)
            v, i = argmax_pair(score, cols)
            best_v, best_i = pair_max(best_v, best_i, v, i)
    else:
        need_se = topp & ~topk
        for s in range(start, end, TILE * BB):
            cols = s + offs
            x, nn = _load_count_nans(x_ptr, row_off, cols, cols < end)
            nans += nn
            v, i = argmax_pair(x, cols)
            raw_v, raw_i = pair_max(raw_v, raw_i, v, i)
            l = div_t(x, t)
            bm = tl.max(l, axis=1)
            tm = tl.max(bm, axis=0)
            mx = tl.maximum(mx, tm)
            if topk | topp:
                b = s // BB + tl.arange(0, TILE)
                tl.store(bmax_ptr + row.to(tl.int64) * nblk + b, bm, mask=b < nblk)
            if need_se:
                new_m = tl.maximum(se_m, tm)
                se_s = se_s * tl.where(new_m > NEG_INF, fexp(se_m - new_m, EXACT_EXP), 1.0)
                se_s += tl.sum(tl.sum(tl.where(l > NEG_INF, fexp(l - new_m, EXACT_EXP), 0.0), axis=1), axis=0)
                se_m = new_m
    tl.store(raw_v_ptr + part, raw_v)
    tl.store(raw_i_ptr + part, raw_i)
    tl.store(max_ptr + part, mx)
    tl.store(best_v_ptr + part, best_v)
    tl.store(best_i_ptr + part, best_i)
    tl.store(se_m_ptr + part, se_m)
    tl.store(se_s_ptr + part, se_s)
    tl.store(nan_ptr + part, nans)


@triton.jit
def _block_keys(bmax_ptr, row, nblk, NBP: tl.constexpr):
    b = tl.arange(0, NBP)
    bv = tl.load(bmax_ptr + row.to(tl.int64) * nblk + b, mask=b < nblk, other=NEG_INF)
    return bv, order_key(bv).to(tl.int64), b < nblk


@triton.jit
def kth_block_max(bmax_ptr, row, nblk, k, NBP: tl.constexpr):
    """The k-th largest block maximum (-inf when k > number of blocks)."""
    bv, keys, valid = _block_keys(bmax_ptr, row, nblk, NBP)
    kappa = max_key_with_count(keys, valid, tl.minimum(k, nblk))
    return tl.where(k <= nblk, key_to_float(kappa), NEG_INF)


@triton.jit
def top_p_block_bound(bmax_ptr, row, nblk, m, p, s_up, EXACT_EXP: tl.constexpr, NBP: tl.constexpr):
    """Largest block maximum b whose block maxima >= b carry mass >= p * s_up, else -inf.

    Masses are fp32 multiples of 2**shift with safety margins: a lower bound of the exact
    integer mass of the entries >= b against an upper bound of the target, so v* >= b."""
    bv, keys, valid = _block_keys(bmax_ptr, row, nblk, NBP)
    e_lo = tl.where(valid & (bv > NEG_INF), fexp(bv - m, EXACT_EXP) * 0.999999 - 1e-9, 0.0)
    want = p * s_up
    lo = tl.full((), -1, tl.int64)
    hi = tl.full((), 1 << 32, tl.int64)
    while hi - lo > 1:           # largest key whose mass at or above reaches `want`
        mid = (lo + hi) >> 1
        ok = tl.sum(tl.where(keys >= mid, e_lo, 0.0), axis=0) * 0.999 >= want
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return tl.where(lo >= 0, key_to_float(lo), NEG_INF)


@triton.jit
def lower_bound_tau(bmax_ptr, se_m_ptr, se_s_ptr, parts, row, nblk, m, k, p, topk, t1,
                    NBP: tl.constexpr, EXACT_EXP: tl.constexpr):
    """tau <= every kept value, and a lower bound of how many entries reach it."""
    tau = t1
    if topk:
        tau = tl.maximum(tau, kth_block_max(bmax_ptr, row, nblk, k, NBP))
    else:
        se_m = tl.load(se_m_ptr + parts)
        s_all = tl.sum(tl.where(se_m > NEG_INF, tl.load(se_s_ptr + parts) * fexp(se_m - m, EXACT_EXP), 0.0), axis=0)
        tau = tl.maximum(tau, top_p_block_bound(bmax_ptr, row, nblk, m, p, s_all * 1.004 + 1e-6, EXACT_EXP, NBP))
    b = tl.arange(0, NBP)
    bv = tl.load(bmax_ptr + row.to(tl.int64) * nblk + b, mask=b < nblk, other=NEG_INF)
    return tau, tl.sum((bv >= tau).to(tl.int32), axis=0)


@triton.jit
def select_kernel(t_ptr, k_ptr, p_ptr, lmp_ptr, ncols,
                  raw_v_ptr, raw_i_ptr, max_ptr, best_v_ptr, best_i_ptr, se_m_ptr, se_s_ptr, bmax_ptr, nblk,
                  st_stage, st_token, st_valid, st_raw, st_m, st_t1, st_flags, st_tkey, st_klo, st_khi,
                  st_shift, st_cabove, st_mabove, st_piv, cand_n,
                  NSPLIT: tl.constexpr, NBP: tl.constexpr, CAP: tl.constexpr, P: tl.constexpr,
                  NB: tl.constexpr, EXACT_EXP: tl.constexpr):
    row = tl.program_id(0)
    parts = row * NSPLIT + tl.arange(0, NSPLIT)
    raw_v, raw_i = argmax_pair(tl.load(raw_v_ptr + parts), tl.load(raw_i_ptr + parts))
    best_v, best_i = argmax_pair(tl.load(best_v_ptr + parts), tl.load(best_i_ptr + parts))
    m = tl.max(tl.load(max_ptr + parts), axis=0)
    k = tl.load(k_ptr + row)
    p = tl.load(p_ptr + row)
    lmp = tl.load(lmp_ptr + row)
    mode, topk, topp, minp = row_flags(tl.load(t_ptr + row), k, p, lmp, ncols)
    tl.store(st_raw + row, raw_i)
    tl.store(st_m + row, m)
    tl.store(cand_n + row, 0)
    stage = tl.full((), DONE, tl.int32)
    token = raw_i
    valid = raw_v > NEG_INF
    if mode == PLAIN:
        valid = best_v > NEG_INF
        token = tl.where(valid, best_i, raw_i)
    elif mode == FILTER:
        valid = m > NEG_INF
        topp = topp & (m < float("inf"))
        t1 = tl.where(minp, m + lmp, NEG_INF)
        tl.store(st_t1 + row, t1)
        tkey = eligible_key(t1)
        if valid:
            stage = tl.full((), DRAW, tl.int32)
            tl.store(st_tkey + row, tkey)
            if topk | topp:
                tau, n_lb = lower_bound_tau(bmax_ptr, se_m_ptr, se_s_ptr, parts, row, nblk, m, k, p, topk, t1,
                                            NBP, EXACT_EXP)
                if n_lb <= CAP:
                    stage = tl.full((), COLLECT, tl.int32)
                    tl.store(st_flags + row, tl.where(topp & ~topk, FAST | NEED_S, FAST).to(tl.int32))
                    tl.store(st_klo + row, tl.maximum(eligible_key(tau), tkey))
                    tl.store(st_khi + row, tl.full((), 0xFFFFFFFF, tl.int64))
                else:
                    stage = start_search(row, ~topk, tl.where(topk, eligible_key(NEG_INF), tkey), m,
                                         st_flags, st_tkey, st_klo, st_khi, st_shift, st_cabove, st_mabove,
                                         st_piv, P, NB)
    tl.store(st_stage + row, stage)
    tl.store(st_token + row, token.to(tl.int64))
    tl.store(st_valid + row, valid.to(tl.int32))
