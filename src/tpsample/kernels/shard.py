"""The Gumbel draw over a vocab shard [R, V_r] for the vocab-parallel strategy.

gumbel_kernel: a local reduction over this rank's columns, grid (rows, splits): argmax over kept
of l + g(key0, key1, global id), ties -> lowest id, with l = fp32(x) / T (T == 0 or no T:
fp32(x)), NaN -> -inf, kept = l >= thr and l > -inf. The host argmax-combines the splits and the
strategy combines ranks with one gather of the winners.
"""
import triton
import triton.language as tl

from .rng_triton import gumbel
from .stats import load_transformed
from .tlutil import NEG_INF, argmax_pair, chunk_bounds, pair_max


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
