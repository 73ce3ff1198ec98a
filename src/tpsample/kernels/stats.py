"""Row statistics without a [R, V] temporary: max / argmax, log-sum-exp, top-n, counts above.

stats_kernel, grid (rows, splits): over a split of the transformed row l (fp32(x), / T where
T != 0, < threshold -> -inf, NaN -> -inf): the max and its lowest column; with LSE an online
sum of exp(l - running max) in fp32; with TOP a sorted top-n list (NP slots, a power of two >= n) (value desc, column asc),
merged only when a block holds an entry beating the current n-th; with CNT the count of
entries > a per-row value (with TOK: the value of l at a per-row global token id).
combine_kernel, grid (rows,): merges the splits (sum-exp in fp64).
"""
import triton
import triton.language as tl

from .tlutil import (
    BIG_ID32,
    NEG_INF,
    argmax_pair,
    chunk_bounds,
    div_t,
    fexp,
    load_x,
    pair_max,
)


@triton.jit
def load_transformed(x_ptr, row_off, cols, mask, t, thr, HAS_T: tl.constexpr, HAS_THR: tl.constexpr):
    l = load_x(x_ptr, row_off, cols, mask)
    if HAS_T:
        l = div_t(l, tl.where(t == 0.0, 1.0, t))
    if HAS_THR:
        l = tl.where(l < thr, NEG_INF, l)
    return l


@triton.jit
def _best_alive(v, ids, alive):
    """(value, id) of the best alive entry (value desc, id asc); id BIG_ID32 when none."""
    mx = tl.max(tl.where(alive, v, NEG_INF), axis=0)
    return mx, tl.min(tl.where(alive & (v == mx), ids, BIG_ID32), axis=0)


@triton.jit
def merge_top(lv, li, v, ids, cand, n, NP: tl.constexpr):
    """Top-n of (list lv/li, sorted) and the candidate entries of a block, sorted again."""
    slot = tl.arange(0, NP)
    alive_l = li != BIG_ID32
    nv = tl.full((NP,), NEG_INF, tl.float32)
    ni = tl.full((NP,), BIG_ID32, tl.int32)
    for j in range(n):
        v1, i1 = _best_alive(lv, li, alive_l)
        v2, i2 = _best_alive(v, ids, cand)
        bv, bi = pair_max(v1, i1, v2, i2)
        nv = tl.where(slot == j, bv, nv)
        ni = tl.where(slot == j, bi, ni)
        alive_l = alive_l & (li != bi)
        cand = cand & (ids != bi)
    return nv, ni


@triton.jit(do_not_specialize=["col_offset", "val_offset"])
def stats_kernel(x_ptr, stride, ncols, t_ptr, thr_ptr, val_ptr, val_stride, n,
                 max_ptr, arg_ptr, sm_ptr, ss_ptr, top_v_ptr, top_i_ptr, cnt_ptr, val_offset,
                 NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, HAS_T: tl.constexpr,
                 HAS_THR: tl.constexpr, LSE: tl.constexpr, NP: tl.constexpr, TOP: tl.constexpr,
                 CNT: tl.constexpr, TOK: tl.constexpr):
    row = tl.program_id(0)
    part = row * NSPLIT + tl.program_id(1)
    start, end = chunk_bounds(ncols, CHUNK)
    row_off = row.to(tl.int64) * stride
    t = tl.load(t_ptr + row) if HAS_T else 1.0
    thr = tl.load(thr_ptr + row) if HAS_THR else NEG_INF
    val = 0.0
    if CNT:
        if TOK:     # val_ptr holds global token ids: the count is of entries above that token's value
            local = tl.minimum(tl.maximum(tl.load(val_ptr + row * val_stride) - val_offset, 0), ncols - 1)
            val = tl.max(load_transformed(x_ptr, row_off, local + tl.arange(0, 1), local + tl.arange(0, 1) < ncols,
                                          t, thr, HAS_T, HAS_THR), axis=0)
        else:
            val = tl.load(val_ptr + row * val_stride)
    mx = tl.full((), NEG_INF, tl.float32)
    arg = tl.full((), BIG_ID32, tl.int32)
    sm = tl.full((), NEG_INF, tl.float32)
    ss = tl.full((), 0.0, tl.float32)
    cnt = tl.zeros((), tl.int64)
    lv = tl.full((NP,), NEG_INF, tl.float32)
    li = tl.full((NP,), BIG_ID32, tl.int32)
    for s in range(start, end, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        l = load_transformed(x_ptr, row_off, cols, cols < end, t, thr, HAS_T, HAS_THR)
        v, i = argmax_pair(l, cols)
        mx, arg = pair_max(mx, arg, v, i)
        if LSE:
            new_m = tl.maximum(sm, v)
            ss = ss * tl.where(new_m == sm, 1.0, fexp(sm - new_m, False))
            ss += tl.sum(tl.where(l > NEG_INF, fexp(l - new_m, False), 0.0), axis=0)
            sm = new_m
        if CNT:
            cnt += tl.sum((l > val).to(tl.int64), axis=0)
        if TOP:
            wv = tl.min(tl.where(tl.arange(0, NP) == n - 1, lv, float("inf")), axis=0)
            wi = tl.max(tl.where(tl.arange(0, NP) == n - 1, li, -1), axis=0)
            cand = (cols < end) & ((l > wv) | ((l == wv) & (cols < wi)))
            if tl.sum(cand.to(tl.int32), axis=0) > 0:
                lv, li = merge_top(lv, li, l, cols, cand, n, NP)
    tl.store(max_ptr + part, mx)
    tl.store(arg_ptr + part, arg)
    if LSE:
        tl.store(sm_ptr + part, sm)
        tl.store(ss_ptr + part, ss)
    if CNT:
        tl.store(cnt_ptr + part, cnt)
    if TOP:
        tl.store(top_v_ptr + part * NP + tl.arange(0, NP), lv)
        tl.store(top_i_ptr + part * NP + tl.arange(0, NP), li)


@triton.jit(do_not_specialize=["col_offset"])
def combine_kernel(n, col_offset, max_ptr, arg_ptr, sm_ptr, ss_ptr, top_v_ptr, top_i_ptr, cnt_ptr,
                   out_max, out_arg, out_lse, out_v, out_i, out_cnt,
                   NSPLIT: tl.constexpr, LSE: tl.constexpr, NP: tl.constexpr, TOP: tl.constexpr,
                   CNT: tl.constexpr):
    row = tl.program_id(0)
    parts = row * NSPLIT + tl.arange(0, NSPLIT)
    mx, arg = argmax_pair(tl.load(max_ptr + parts), tl.load(arg_ptr + parts))
    tl.store(out_max + row, mx)
    tl.store(out_arg + row, arg.to(tl.int64) + col_offset)
    if LSE:
        sm = tl.load(sm_ptr + parts)
        w = tl.where(sm > NEG_INF, tl.load(ss_ptr + parts).to(tl.float64) * tl.exp((sm - mx).to(tl.float64)), 0.0)
        lse = tl.where(mx < float("inf"), mx.to(tl.float64) + tl.log(tl.sum(w, axis=0)), mx.to(tl.float64))
        tl.store(out_lse + row, tl.where(mx > NEG_INF, lse, NEG_INF).to(tl.float32))
    if CNT:
        tl.store(out_cnt + row, tl.sum(tl.load(cnt_ptr + parts), axis=0))
    if TOP:
        flat = (row * NSPLIT * NP + tl.arange(0, NSPLIT * NP))
        v = tl.load(top_v_ptr + flat)
        ids = tl.load(top_i_ptr + flat)
        lv, li = merge_top(tl.full((NP,), NEG_INF, tl.float32), tl.full((NP,), BIG_ID32, tl.int32),
                           v, ids, ids != BIG_ID32, n, NP)
        slot = tl.arange(0, NP)
        tl.store(out_v + row * n + slot, lv, mask=slot < n)
        tl.store(out_i + row * n + slot, tl.where(li == BIG_ID32, -1, li.to(tl.int64) + col_offset), mask=slot < n)
