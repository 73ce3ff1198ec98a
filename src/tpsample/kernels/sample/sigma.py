"""top-n-sigma in `sample_rows` (docs/semantics.md step 7), for batches where some row asks:
the same fixed-point statistics as `tpsample.sampling.top_n_sigma`, so the same threshold bit
for bit.

The scan keeps each split's largest and smallest finite x of a top-n-sigma row (no extra
read); `sigma_sums_kernel` (rows x splits, the one extra launch) combines them into the row's
ends M and m of l = x / T and sums its split of the row exactly on their grid: (count, sum q,
sum q**2) with q = floor((M - l) * 2**(B - e)) in int64, 2**e the smallest power of two above
M - m and B = `mass_shift(V) // 2` (`numerics.sigma_bits`). The select kernel adds the splits'
integers (order-independent) and takes `sigma_threshold`, which it combines with min-p's t1:
the threshold the other filters then start from. A batch without such a row compiles none of
this and launches nothing more.
"""
import triton
import triton.language as tl

from ..tlutil import NEG_INF, chunk_bounds, div_t, opaque_f64

POS_INF = tl.constexpr(float("inf"))


@triton.jit
def finite(v):
    return (v > NEG_INF) & (v < POS_INF)


@triton.jit
def finite_ends(xrow, ncols, t):
    """(largest, smallest) finite l = x / T of the whole row, by one program: only for rows where
    some finite x / T overflows, so that the scan's x extremes do not give l's."""
    hi = tl.full((), NEG_INF, tl.float32)
    lo = tl.full((), POS_INF, tl.float32)
    offs = tl.arange(0, 1024)
    for s in range(0, ncols, 1024):
        l = div_t(tl.load(xrow + s + offs, mask=s + offs < ncols, other=NEG_INF).to(tl.float32), t)
        fin = finite(l)
        hi = tl.maximum(hi, tl.max(tl.where(fin, l, NEG_INF), axis=0))
        lo = tl.minimum(lo, tl.min(tl.where(fin, l, POS_INF), axis=0))
    return hi, lo


@triton.jit
def grid_scale(top, low, B: tl.constexpr):
    """2**(B - e) in float64, e = frexp(M - m).exponent (0 when M = m, as torch.frexp)."""
    r = top - low
    bits = r.to(tl.int64, bitcast=True)
    e = tl.where(r > 0.0, ((bits >> 52) & 0x7FF) - 1022, 0)
    return ((B - e + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit(do_not_specialize=["ncols"])
def sigma_sums_kernel(x_ptr, stride, ncols, t_ptr, nsig_ptr, lo_ptr, hi_ptr, sums_ptr, top_ptr, scale_ptr,
                      NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, B: tl.constexpr):
    """This split's (count, sum q, sum q**2) of a top-n-sigma row (zeros for other rows); the
    first split also stores the row's M (fp32, -inf: no finite value) and grid scale."""
    row = tl.program_id(0)
    part = row * NSPLIT + tl.program_id(1)
    t = tl.load(t_ptr + row)
    cnt = tl.zeros((), tl.int64)
    s1 = tl.zeros((), tl.int64)
    s2 = tl.zeros((), tl.int64)
    if (tl.load(nsig_ptr + row) > 0.0) & (t != 0.0):
        parts = row * NSPLIT + tl.arange(0, NSPLIT)
        hi = tl.max(tl.load(hi_ptr + parts), axis=0)
        lo = tl.min(tl.load(lo_ptr + parts), axis=0)
        xrow = x_ptr + row.to(tl.int64) * stride
        top, low = div_t(hi, t), div_t(lo, t)
        if (hi > NEG_INF) & ~(finite(top) & finite(low)):
            top, low = finite_ends(xrow, ncols, t)
        some = top > NEG_INF
        top64 = tl.where(some, top, 0.0).to(tl.float64)
        scale = grid_scale(top64, tl.where(some, low, 0.0).to(tl.float64), B)
        start, end = chunk_bounds(ncols, CHUNK)
        offs = tl.arange(0, BLOCK)
        for s in range(start, end, BLOCK):
            cols = s + offs
            l = div_t(tl.load(xrow + cols, mask=cols < end, other=NEG_INF).to(tl.float32), t)
            fin = finite(l)          # NaN fails both tests
            d = (top64 - l.to(tl.float64)) * scale
            q = tl.where(fin, tl.floor(d), 0.0).to(tl.int64)
            cnt += tl.sum(fin.to(tl.int64), axis=0)
            s1 += tl.sum(q, axis=0)
            s2 += tl.sum(q * q, axis=0)
        if tl.program_id(1) == 0:
            tl.store(top_ptr + row, tl.where(some, top, NEG_INF))
            tl.store(scale_ptr + row, scale)
    tl.store(sums_ptr + part * 3, cnt)
    tl.store(sums_ptr + part * 3 + 1, s1)
    tl.store(sums_ptr + part * 3 + 2, s2)


@triton.jit
def sigma_threshold(row, n_sigma, sums_ptr, top_ptr, scale_ptr, NSPLIT: tl.constexpr, PTX: tl.constexpr):
    """M - n_sigma * sigma rounded to fp32 (-inf for a row without a finite value), in the
    float64 operations of `top_n_sigma.deviation` and `threshold`, each rounded on its own
    (`opaque_f64`: no fused multiply-add; float64 division and square root round correctly
    on CUDA)."""
    parts = (row * NSPLIT + tl.arange(0, NSPLIT)) * 3
    n = tl.maximum(tl.sum(tl.load(sums_ptr + parts), axis=0), 1).to(tl.float64)
    mean = tl.sum(tl.load(sums_ptr + parts + 1), axis=0).to(tl.float64) / n
    ex2 = tl.sum(tl.load(sums_ptr + parts + 2), axis=0).to(tl.float64) / n
    var = tl.maximum(ex2 - opaque_f64(mean * mean, PTX), 0.0)
    sigma = tl.sqrt(var) / tl.load(scale_ptr + row)
    top = tl.load(top_ptr + row)
    thr = (top.to(tl.float64) - opaque_f64(n_sigma.to(tl.float64) * sigma, PTX)).to(tl.float32)
    return tl.where(top > NEG_INF, thr, NEG_INF)
