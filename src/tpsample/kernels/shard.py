"""Partial statistics of a vocab shard [R, V_r] for the vocab-parallel strategy.

Each kernel is a local reduction over this rank's columns, grid (rows, splits); the host sums
(or argmax-combines) the splits, and the strategy combines ranks with collectives. The row
transform is l = fp32(x) / T (T == 0 or no T: fp32(x)), NaN -> -inf; kept = l >= thr, l > -inf.
- mass_kernel: sum of e = trunc(exp(l - m) * 2**shift) over kept entries (m the global max).
- digit_kernel: 256-bin (count, mass) histogram of the digit (key >> low) & 255 of the kept
  entries whose key agrees with `prefix` above bit low + 8 (low = 24 - 8 * level): one level of
  the exact radix search for top-p's v* (masses) or top-k's k-th largest (counts).
- gumbel_kernel: argmax over kept of l + g(key0, key1, global id), ties -> lowest id.
"""
import triton
import triton.language as tl

from .rng_triton import gumbel
from .stats import load_transformed
from .tlutil import NEG_INF, argmax_pair, chunk_bounds, mass, order_key, pair_max


@triton.jit
def mass_kernel(x_ptr, stride, ncols, t_ptr, m_ptr, thr_ptr, scale, one, out_ptr,
                NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, HAS_T: tl.constexpr,
                EXACT_EXP: tl.constexpr):
    row = tl.program_id(0)
    start, end = chunk_bounds(ncols, CHUNK)
    row_off = row.to(tl.int64) * stride
    t = tl.load(t_ptr + row) if HAS_T else 1.0
    m = tl.load(m_ptr + row)
    thr = tl.load(thr_ptr + row)
    acc = tl.zeros((), tl.int64)
    for s in range(start, end, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        l = load_transformed(x_ptr, row_off, cols, cols < end, t, 0.0, HAS_T, False)
        acc += tl.sum(tl.where(l >= thr, mass(l, m, scale, one, EXACT_EXP), 0), axis=0)
    tl.store(out_ptr + row * NSPLIT + tl.program_id(1), acc)


@triton.jit
def digit_kernel(x_ptr, stride, ncols, t_ptr, m_ptr, thr_ptr, prefix_ptr, low, scale, one, cnt_ptr, mass_ptr,
                 NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, HAS_T: tl.constexpr,
                 WITH_MASS: tl.constexpr, EXACT_EXP: tl.constexpr):
    row = tl.program_id(0)
    part = row * NSPLIT + tl.program_id(1)
    start, end = chunk_bounds(ncols, CHUNK)
    row_off = row.to(tl.int64) * stride
    t = tl.load(t_ptr + row) if HAS_T else 1.0
    m = tl.load(m_ptr + row)
    thr = tl.load(thr_ptr + row)
    top = tl.load(prefix_ptr + row) >> (low + 8)
    bins = tl.arange(0, 256)
    hc = tl.zeros((256,), tl.int64)
    hm = tl.zeros((256,), tl.int64)
    for s in range(start, end, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        l = load_transformed(x_ptr, row_off, cols, cols < end, t, 0.0, HAS_T, False)
        key = order_key(l).to(tl.int64)
        inside = (l >= thr) & (l > NEG_INF) & ((key >> (low + 8)) == top)
        if tl.sum(inside.to(tl.int32), axis=0) > 0:
            hit = inside[:, None] & (((key >> low) & 255)[:, None] == bins[None, :])
            hc += tl.sum(hit.to(tl.int64), axis=0)
            if WITH_MASS:
                e = mass(l, m, scale, one, EXACT_EXP)
                hm += tl.sum(tl.where(hit, e[:, None], 0), axis=0)
    tl.store(cnt_ptr + part * 256 + bins, hc)
    tl.store(mass_ptr + part * 256 + bins, hm)


@triton.jit(do_not_specialize=["col_offset"])
def gumbel_kernel(x_ptr, stride, ncols, t_ptr, thr_ptr, key0_ptr, key1_ptr, col_offset, v_ptr, i_ptr,
                  NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, HAS_T: tl.constexpr):
    row = tl.program_id(0)
    part = row * NSPLIT + tl.program_id(1)
    start, end = chunk_bounds(ncols, CHUNK)
    row_off = row.to(tl.int64) * stride
    t = tl.load(t_ptr + row) if HAS_T else 1.0
    thr = tl.load(thr_ptr + row)
    k0 = tl.load(key0_ptr + row).to(tl.uint32)
    k1 = tl.load(key1_ptr + row).to(tl.uint32)
    best_v = tl.full((), NEG_INF, tl.float32)
    best_i = tl.zeros((), tl.int32) + start        # nothing kept: (-inf, first column)
    for s in range(start, end, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        l = load_transformed(x_ptr, row_off, cols, cols < end, t, 0.0, HAS_T, False)
        kept = (l >= thr) & (l > NEG_INF)
        if tl.sum(kept.to(tl.int32), axis=0) > 0:
            score = tl.where(kept, l + gumbel(k0, k1, cols + col_offset), NEG_INF)
            v, i = argmax_pair(score, cols)
            best_v, best_i = pair_max(best_v, best_i, v, i)
    tl.store(v_ptr + part, best_v)
    tl.store(i_ptr + part, best_i)
