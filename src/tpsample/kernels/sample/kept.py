"""The kept pass of `sample_rows` (kept_kernel, grid (selected rows,)): what each selected row
kept, and XTC's upper bound and draw, after the threshold passes have settled every row.

When asked (`launch.launch_sample`'s `kept`), the finish, drain and list kernels leave each
filter row's final threshold key in `st_tkey` (KEPT): the kept set is {l > -inf, key >= tkey}
on every path (the masked draw's key, and the key the candidates, the list or the bracket
settled). Plain rows keep every finite l; greedy rows read x itself (l = fp32(x)). One program
per selected row then reads the row:
1. count, the smallest and the largest kept l (`sampling.support`'s count, threshold and top);
2. with XTC, for sampled rows whose seeded coin came up (`sampling.xtc`): the kept mass S on the
   fixed-point grid relative to the largest kept l, then the count of kept entries whose mass
   e has float64(e) >= float64(xtc_threshold) * float64(S) and the smallest of them, v_min;
   with two or more, the row's upper bound is v_min and its token is drawn again: the Gumbel
   argmax over the kept entries with l <= v_min (ties -> lowest id), the same noise as the draw,
   in the same read as their count (what the row keeps then).
Each step is one read of the row; rows that are not selected are not read.
"""
import triton
import triton.language as tl

from ..tlutil import BIG_ID32, KEY_NEG_INF, NEG_INF, argmax_pair, div_t, gumbel, mass, order_key, pair_max
from .scan import fp32_nonan, row_flags, sigma_on
from .state import FILTER, GREEDY

POS_INF = tl.constexpr(float("inf"))


@triton.jit
def _row_l(xrow, cols, ncols, t):
    """l of the row's columns `cols`: fp32(x) / T (NaN -> -inf; a greedy row: fp32(x)), -inf past
    the row's end."""
    x = fp32_nonan(tl.load(xrow + cols, mask=cols < ncols, other=NEG_INF))
    return tl.where(t == 0.0, x, div_t(x, tl.where(t == 0.0, 1.0, t)))


@triton.jit
def _kept_extent(xrow, ncols, t, tkey, BLOCK: tl.constexpr):
    """(count, smallest, largest) of the kept l (key >= tkey, l > -inf); (0, +inf, -inf) if none."""
    cnt = tl.zeros((BLOCK,), tl.int64)
    lo = tl.full((BLOCK,), POS_INF, tl.float32)
    hi = tl.full((BLOCK,), NEG_INF, tl.float32)
    for s in range(0, ncols, BLOCK):
        l = _row_l(xrow, s + tl.arange(0, BLOCK), ncols, t)
        kept = (l > NEG_INF) & (order_key(l).to(tl.int64) >= tkey)
        cnt += kept.to(tl.int64)
        lo = tl.minimum(lo, tl.where(kept, l, POS_INF))
        hi = tl.maximum(hi, tl.where(kept, l, NEG_INF))
    return tl.sum(cnt, axis=0), tl.min(lo, axis=0), tl.max(hi, axis=0)


@triton.jit
def _kept_mass(xrow, ncols, t, tkey, top, scale, one, BLOCK: tl.constexpr, EXACT_EXP: tl.constexpr):
    """S: the exact int64 sum of the kept entries' masses relative to `top`."""
    total = tl.zeros((BLOCK,), tl.int64)
    for s in range(0, ncols, BLOCK):
        l = _row_l(xrow, s + tl.arange(0, BLOCK), ncols, t)
        kept = (l > NEG_INF) & (order_key(l).to(tl.int64) >= tkey)
        total += tl.where(kept, mass(l, top, scale, one, EXACT_EXP), 0)
    return tl.sum(total, axis=0)


@triton.jit
def _top_choices(xrow, ncols, t, tkey, top, target, scale, one, BLOCK: tl.constexpr, EXACT_EXP: tl.constexpr):
    """(count, smallest l) of the kept entries with float64(mass) >= target."""
    cnt = tl.zeros((BLOCK,), tl.int64)
    lo = tl.full((BLOCK,), POS_INF, tl.float32)
    for s in range(0, ncols, BLOCK):
        l = _row_l(xrow, s + tl.arange(0, BLOCK), ncols, t)
        kept = (l > NEG_INF) & (order_key(l).to(tl.int64) >= tkey)
        top_choice = kept & (mass(l, top, scale, one, EXACT_EXP).to(tl.float64) >= target)
        cnt += top_choice.to(tl.int64)
        lo = tl.minimum(lo, tl.where(top_choice, l, POS_INF))
    return tl.sum(cnt, axis=0), tl.min(lo, axis=0)


@triton.jit
def _draw_below(xrow, ncols, t, tkey, upper, k0, k1, col_offset, BLOCK: tl.constexpr):
    """(value, column) of the Gumbel argmax over the kept entries with l <= upper, and their count."""
    best_v = tl.full((), NEG_INF, tl.float32)
    best_i = tl.full((), BIG_ID32, tl.int32)
    cnt = tl.zeros((BLOCK,), tl.int64)
    for s in range(0, ncols, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        l = _row_l(xrow, cols, ncols, t)
        kept = (l > NEG_INF) & (order_key(l).to(tl.int64) >= tkey) & (l <= upper)
        cnt += kept.to(tl.int64)
        v, i = argmax_pair(tl.where(kept, l + gumbel(k0, k1, cols + col_offset), NEG_INF), cols)
        best_v, best_i = pair_max(best_v, best_i, v, i)
    return best_v, best_i, tl.sum(cnt, axis=0)


@triton.jit(do_not_specialize=["col_offset"])
def kept_kernel(x_ptr, stride, ncols, col_offset, rows_ptr, t_ptr, k_ptr, p_ptr, lmp_ptr, nsig_ptr, st_tkey,
                key0_ptr, key1_ptr, xthr_ptr, coin_ptr, scale, one, token_ptr, valid_ptr,
                count_ptr, low_ptr, top_ptr, upper_ptr, BLOCK: tl.constexpr, SIGMA: tl.constexpr,
                XTC: tl.constexpr, EXACT_EXP: tl.constexpr):
    """One selected row (rows_ptr[program]): its kept count, smallest and largest kept l, and
    XTC's upper bound (+inf: none), with the token redrawn under it (module docstring)."""
    row = tl.load(rows_ptr + tl.program_id(0))
    t = tl.load(t_ptr + row)
    mode, _, _, _ = row_flags(t, tl.load(k_ptr + row), tl.load(p_ptr + row), tl.load(lmp_ptr + row),
                              sigma_on(nsig_ptr, row, SIGMA), ncols)
    tkey = tl.where(mode == FILTER, tl.load(st_tkey + row), KEY_NEG_INF + 1)
    xrow = x_ptr + row.to(tl.int64) * stride
    cnt, low, top = _kept_extent(xrow, ncols, t, tkey, BLOCK)
    upper = tl.full((), POS_INF, tl.float32)
    if XTC:
        if (tl.load(coin_ptr + row) != 0) & (mode != GREEDY) & (top > NEG_INF) & (top < POS_INF):
            total = _kept_mass(xrow, ncols, t, tkey, top, scale, one, BLOCK, EXACT_EXP)
            target = tl.load(xthr_ptr + row).to(tl.float64) * total.to(tl.float64)
            n_top, v_min = _top_choices(xrow, ncols, t, tkey, top, target, scale, one, BLOCK, EXACT_EXP)
            if n_top >= 2:      # v_min is now the largest kept value
                upper = v_min
                top = v_min
                v, i, cnt = _draw_below(xrow, ncols, t, tkey, upper, tl.load(key0_ptr + row).to(tl.uint32),
                                   tl.load(key1_ptr + row).to(tl.uint32), col_offset, BLOCK)
                tl.store(token_ptr + row, i.to(tl.int64) + col_offset)
                tl.store(valid_ptr + row, v > NEG_INF)
    tl.store(count_ptr + row, cnt)
    tl.store(low_ptr + row, tl.where(cnt > 0, low, NEG_INF))
    tl.store(top_ptr + row, top)
    tl.store(upper_ptr + row, upper)
