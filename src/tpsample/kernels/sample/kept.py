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
Each step is one read of the row; rows that are not selected are not read. A top-k / top-p
row's kept set is a few of the scan's blocks of BB columns: a read skips every step (TILE
blocks) and every block whose maximum l (the scan's, exact: division by T is monotone) has a key
below tkey, so it costs the row's block maxima and its kept blocks, not V entries; the noise is
drawn only in steps that keep an entry.
"""
import triton
import triton.language as tl

from ..tlutil import BIG_ID32, KEY_NEG_INF, NEG_INF, argmax_pair, div_t, gumbel, mass, order_key, pair_max
from .scan import FILTER, GREEDY, fp32_nonan, row_flags, sigma_on

POS_INF = tl.constexpr(float("inf"))


@triton.jit
def _live_blocks(bmax_row, s, nbm, tkey, TILE: tl.constexpr, BB: tl.constexpr):
    """Which of the TILE blocks of BB columns from column s may hold a kept entry: those whose
    largest l (the scan's block maxima, nbm of them: a top-k / top-p row's, 0 for other rows) has
    a key >= tkey; every block without a maximum."""
    b = s // BB + tl.arange(0, TILE)
    bm = tl.load(bmax_row + b, mask=b < nbm, other=POS_INF)
    return order_key(bm).to(tl.int64) >= tkey


@triton.jit
def _kept_l(xrow, bmax_row, cols, ncols, t, tkey, nbm, BB: tl.constexpr):
    """(l, kept) of the columns `cols` of one live step: l = fp32(x) / T (NaN -> -inf; a greedy
    row: fp32(x)), -inf past the row's end and in the blocks `_live_blocks` ruled out (not read);
    kept = l > -inf and key >= tkey."""
    live = order_key(tl.load(bmax_row + cols // BB, mask=cols // BB < nbm, other=POS_INF)).to(tl.int64) >= tkey
    x = fp32_nonan(tl.load(xrow + cols, mask=live & (cols < ncols), other=NEG_INF))
    l = tl.where(t == 0.0, x, div_t(x, tl.where(t == 0.0, 1.0, t)))
    return l, (l > NEG_INF) & (order_key(l).to(tl.int64) >= tkey)


@triton.jit
def _kept_extent(xrow, bmax_row, nbm, ncols, t, tkey, TILE: tl.constexpr, BB: tl.constexpr):
    """(count, smallest, largest) of the kept l (key >= tkey, l > -inf); (0, +inf, -inf) if none."""
    STEP: tl.constexpr = TILE * BB
    offs = tl.arange(0, STEP)
    cnt = tl.zeros((STEP,), tl.int64)
    lo = tl.full((STEP,), POS_INF, tl.float32)
    hi = tl.full((STEP,), NEG_INF, tl.float32)
    for s in range(0, ncols, STEP):
        if tl.max(_live_blocks(bmax_row, s, nbm, tkey, TILE, BB).to(tl.int32), axis=0) > 0:
            l, kept = _kept_l(xrow, bmax_row, s + offs, ncols, t, tkey, nbm, BB)
            cnt += kept.to(tl.int64)
            lo = tl.minimum(lo, tl.where(kept, l, POS_INF))
            hi = tl.maximum(hi, tl.where(kept, l, NEG_INF))
    return tl.sum(cnt, axis=0), tl.min(lo, axis=0), tl.max(hi, axis=0)


@triton.jit
def _kept_mass(xrow, bmax_row, nbm, ncols, t, tkey, top, scale, one, TILE: tl.constexpr,
               BB: tl.constexpr, EXACT_EXP: tl.constexpr):
    """S: the exact int64 sum of the kept entries' masses relative to `top`."""
    STEP: tl.constexpr = TILE * BB
    offs = tl.arange(0, STEP)
    total = tl.zeros((STEP,), tl.int64)
    for s in range(0, ncols, STEP):
        if tl.max(_live_blocks(bmax_row, s, nbm, tkey, TILE, BB).to(tl.int32), axis=0) > 0:
            l, kept = _kept_l(xrow, bmax_row, s + offs, ncols, t, tkey, nbm, BB)
            total += tl.where(kept, mass(l, top, scale, one, EXACT_EXP), 0)
    return tl.sum(total, axis=0)


@triton.jit
def _top_choices(xrow, bmax_row, nbm, ncols, t, tkey, top, target, scale, one, TILE: tl.constexpr,
                 BB: tl.constexpr, EXACT_EXP: tl.constexpr):
    """(count, smallest l) of the kept entries with float64(mass) >= target."""
    STEP: tl.constexpr = TILE * BB
    offs = tl.arange(0, STEP)
    cnt = tl.zeros((STEP,), tl.int64)
    lo = tl.full((STEP,), POS_INF, tl.float32)
    for s in range(0, ncols, STEP):
        if tl.max(_live_blocks(bmax_row, s, nbm, tkey, TILE, BB).to(tl.int32), axis=0) > 0:
            l, kept = _kept_l(xrow, bmax_row, s + offs, ncols, t, tkey, nbm, BB)
            top_choice = kept & (mass(l, top, scale, one, EXACT_EXP).to(tl.float64) >= target)
            cnt += top_choice.to(tl.int64)
            lo = tl.minimum(lo, tl.where(top_choice, l, POS_INF))
    return tl.sum(cnt, axis=0), tl.min(lo, axis=0)


@triton.jit
def _draw_below(xrow, bmax_row, nbm, ncols, t, tkey, upper, k0, k1, col_offset, TILE: tl.constexpr,
                BB: tl.constexpr):
    """(value, column) of the Gumbel argmax over the kept entries with l <= upper, and their
    count. The noise (a hash and two logarithms an entry) is drawn only in steps that keep one."""
    STEP: tl.constexpr = TILE * BB
    offs = tl.arange(0, STEP)
    best_v = tl.full((), NEG_INF, tl.float32)
    best_i = tl.full((), BIG_ID32, tl.int32)
    cnt = tl.zeros((STEP,), tl.int64)
    for s in range(0, ncols, STEP):
        if tl.max(_live_blocks(bmax_row, s, nbm, tkey, TILE, BB).to(tl.int32), axis=0) > 0:
            cols = s + offs
            l, kept = _kept_l(xrow, bmax_row, cols, ncols, t, tkey, nbm, BB)
            kept = kept & (l <= upper)
            cnt += kept.to(tl.int64)
            if tl.max(kept.to(tl.int32), axis=0) > 0:
                v, i = argmax_pair(tl.where(kept, l + gumbel(k0, k1, cols + col_offset), NEG_INF), cols)
                best_v, best_i = pair_max(best_v, best_i, v, i)
    return best_v, best_i, tl.sum(cnt, axis=0)


@triton.jit(do_not_specialize=["col_offset"])
def kept_kernel(x_ptr, stride, ncols, col_offset, rows_ptr, t_ptr, k_ptr, p_ptr, lmp_ptr, nsig_ptr, st_tkey,
                bmax_ptr, nblk, key0_ptr, key1_ptr, xthr_ptr, coin_ptr, scale, one, token_ptr, valid_ptr,
                count_ptr, low_ptr, top_ptr, upper_ptr, TILE: tl.constexpr, BB: tl.constexpr, SIGMA: tl.constexpr,
                XTC: tl.constexpr, EXACT_EXP: tl.constexpr):
    """One selected row (rows_ptr[program]): its kept count, smallest and largest kept l, and
    XTC's upper bound (+inf: none), with the token redrawn under it (module docstring)."""
    row = tl.load(rows_ptr + tl.program_id(0))
    t = tl.load(t_ptr + row)
    mode, topk, topp, _ = row_flags(t, tl.load(k_ptr + row), tl.load(p_ptr + row), tl.load(lmp_ptr + row),
                                    sigma_on(nsig_ptr, row, SIGMA), ncols)
    tkey = tl.where(mode == FILTER, tl.load(st_tkey + row), KEY_NEG_INF + 1)
    nbm = tl.where((mode == FILTER) & (topk | topp), nblk, 0)     # the scan kept this row's block maxima
    xrow = x_ptr + row.to(tl.int64) * stride
    brow = bmax_ptr + row.to(tl.int64) * nblk
    cnt, low, top = _kept_extent(xrow, brow, nbm, ncols, t, tkey, TILE, BB)
    upper = tl.full((), POS_INF, tl.float32)
    if XTC:
        if (tl.load(coin_ptr + row) != 0) & (mode != GREEDY) & (top > NEG_INF) & (top < POS_INF):
            total = _kept_mass(xrow, brow, nbm, ncols, t, tkey, top, scale, one, TILE, BB, EXACT_EXP)
            target = tl.load(xthr_ptr + row).to(tl.float64) * total.to(tl.float64)
            n_top, v_min = _top_choices(xrow, brow, nbm, ncols, t, tkey, top, target, scale, one, TILE,
                                        BB, EXACT_EXP)
            if n_top >= 2:      # v_min is now the largest kept value
                upper = v_min
                top = v_min
                v, i, cnt = _draw_below(xrow, brow, nbm, ncols, t, tkey, upper,
                                        tl.load(key0_ptr + row).to(tl.uint32), tl.load(key1_ptr + row).to(tl.uint32),
                                        col_offset, TILE, BB)
                tl.store(token_ptr + row, i.to(tl.int64) + col_offset)
                tl.store(valid_ptr + row, v > NEG_INF)
    tl.store(count_ptr + row, cnt)
    tl.store(low_ptr + row, tl.where(cnt > 0, low, NEG_INF))
    tl.store(top_ptr + row, top)
    tl.store(upper_ptr + row, upper)
