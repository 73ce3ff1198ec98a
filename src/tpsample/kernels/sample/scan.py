"""Pass 1 of `sample_rows`, the scan (grid rows x splits): one streaming read of each row split.

Always the NaN count. Greedy rows: the argmax of x (NaN as -inf). Other rows need x's argmax
only for the guard, when every x / T is -inf (the row max is always kept otherwise): the select
kernel searches those rare rows itself, so the scan does not carry it. Plain
rows (temperature only): the whole draw, the Gumbel argmax of l = x / T; a block computes the
noise (two logs) only if some entry's cheap upper bound l + (-log W) reaches the best so far,
which after the first blocks is rare (the bound needs only W's bits). Filter rows: max(l); block
maxima of l (blocks of BB columns) when top-k or top-p is on (for top-p alone the select kernel
bounds S by them; an online sum of exp(l - max) here would slow the scan for a range only a
little narrower). Loads run one tile ahead (software prefetch) and per-lane
running winners are reduced once at the end, so the loop stays memory-bound.
"""
import triton
import triton.language as tl

from ..tlutil import (
    BIG_ID32,
    GOLDEN,
    KEY_NEG_INF,
    NEG_INF,
    argmax_pair,
    chunk_bounds,
    div_t,
    ex2_ftz,
    gumbel,
    gumbel_from_bits,
    key_to_float,
    opaque_u32,
    order_key,
    pair_max,
    uniform_bits_spread,
)

# A row's stages and flags (the state machine: `launch`'s docstring).
GREEDY, PLAIN, FILTER = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
DONE, COLLECT, DRAW, HIST, BRACKET, LEAN, BINS, LIST = (
    tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3), tl.constexpr(4), tl.constexpr(5),
    tl.constexpr(6), tl.constexpr(7))
PHASE_TOPP, FAST, FIRST = tl.constexpr(2), tl.constexpr(4), tl.constexpr(8)
# int32s between two rows' candidate counters: one 128-byte line each, so the appends of
# different rows never queue on one line
CN = tl.constexpr(32)
CN_STRIDE = CN.value         # int32s between two rows' candidate counters


@triton.jit
def zero_counters(cand_n, row):
    """All of the row's counters to 0: the candidates' (word 0) and the lean list's groups
    (`lists.list_columns`)."""
    tl.store(cand_n + row * CN + tl.arange(0, CN), tl.zeros((CN,), tl.int32))


@triton.jit
def window_shift(klo, khi, NB: tl.constexpr):
    """Smallest shift with (khi - klo) >> shift < NB."""
    shift = tl.zeros((), tl.int64)
    for _ in range(40):
        shift = tl.where(((khi - klo) >> shift) >= NB, shift + 1, shift)
    return shift


@triton.jit
def start_search(row, topp_phase, tkey, m, st_flags, st_tkey, st_klo, st_khi, st_shift,
                 st_cabove, st_mabove, st_piv, P: tl.constexpr, NB: tl.constexpr):
    """Set up HIST (returned; the caller stores the stage): window [tkey, key(m)] over entries
    with key >= tkey, first pivots at m - d for d in nats (0.5 ... 14.5), a prior for where
    top-k / top-p thresholds usually sit."""
    klo = tkey.to(tl.int64)
    khi = order_key(m).to(tl.int64)
    j = tl.arange(0, P).to(tl.float32)
    d = 0.5 + 0.25 * j * (j + 1.0)      # 0.5, 1, 2, 3.5, 5.5, 8, 11, 14.5 for P = 8
    piv = order_key(m - d).to(tl.int64)
    piv = tl.minimum(tl.maximum(piv, klo), khi)
    flags = tl.where(topp_phase, PHASE_TOPP | FIRST, 0)
    tl.store(st_flags + row, flags.to(tl.int32))
    tl.store(st_tkey + row, klo)
    tl.store(st_klo + row, klo)
    tl.store(st_khi + row, khi)
    tl.store(st_shift + row, window_shift(klo, khi, NB).to(tl.int32))
    tl.store(st_cabove + row, tl.zeros((), tl.int64))
    tl.store(st_mabove + row, tl.zeros((), tl.int64))
    tl.store(st_piv + row * P + tl.arange(0, P), piv)
    return tl.full((), HIST, tl.int32)


@triton.jit
def eligible_key(t1):
    """Smallest key an entry needs: key(t1), and above key(-inf) always (-inf is never kept)."""
    return tl.maximum(order_key(t1).to(tl.int64), KEY_NEG_INF + 1)


@triton.jit
def append_candidates(sel, l, cols, row, cand_key, cand_id, cand_n, CAP: tl.constexpr):
    """Append the block's selected entries (key, column) to the row's candidate list through its
    atomic counter (order does not matter: the finish sorts); entries past CAP are counted, not
    stored, so the finish sees the overflow."""
    nsel = tl.sum(sel.to(tl.int32), axis=0)
    if nsel > 0:
        base = tl.atomic_add(cand_n + row * CN, nsel, sem="relaxed")   # read after the kernel: no fence
        pos = base + tl.cumsum(sel.to(tl.int32), 0) - 1
        ok = sel & (pos < CAP)
        tl.store(cand_key + row.to(tl.int64) * CAP + pos, order_key(l).to(tl.int64), mask=ok)
        tl.store(cand_id + row.to(tl.int64) * CAP + pos, cols, mask=ok)


@triton.jit
def draw_candidates(keys, kept, valid, idx, row, key0_ptr, key1_ptr, col_offset, cand_id, CAP: tl.constexpr):
    """(value, column) of the Gumbel argmax over the kept candidates (keys are order keys of l;
    ties -> lowest column); (-inf, BIG_ID32) when none is kept."""
    ids = tl.load(cand_id + row.to(tl.int64) * CAP + idx, mask=valid, other=BIG_ID32)
    k0 = tl.load(key0_ptr + row).to(tl.uint32)
    k1 = tl.load(key1_ptr + row).to(tl.uint32)
    score = tl.where(kept, key_to_float(keys) + gumbel(k0, k1, ids + col_offset), float("-inf"))
    return argmax_pair(score, tl.where(kept, ids, BIG_ID32))



@triton.jit
def row_flags(t, k, p, lmp, sig, ncols):
    """(mode, top-k on, top-p on, min-p on) of a row from its parameters; sig: top-n-sigma on
    (`sigma_on`), which makes a sampled row a filter row as min-p does."""
    topk = (k > 0) & (k < ncols)
    topp = p < 1.0
    minp = lmp > NEG_INF
    mode = tl.where(t == 0.0, GREEDY, tl.where(topk | topp | minp | sig, FILTER, PLAIN))
    return mode, topk, topp, minp


@triton.jit
def sigma_on(nsig_ptr, row, SIGMA: tl.constexpr):
    """The row has top-n-sigma (n > 0); always False in a batch without such a row (SIGMA off:
    nsig_ptr is not read)."""
    if SIGMA:
        return tl.load(nsig_ptr + row) > 0.0
    else:
        return tl.zeros((), tl.int1)


LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def win_bound(best_v):
    """c2 of `may_win_fast` for the best so far: (best_v - M) * log2(e) in fp32, with the margin
    M = 2e-3 + 4e-6 * (2 |best_v| + 128), one scalar a step. -inf while nothing is found (every
    finite entry passes); NaN at best_v = +inf (nothing passes: a later column cannot beat it,
    ties keep the earlier)."""
    return (best_v - (2e-3 + 4e-6 * (2.0 * tl.abs(best_v) + 128.0))) * LOG2E


@triton.jit
def may_win_fast(la, u, c2, PTX: tl.constexpr):
    """`may_win` with the margin taken once a step: W' <= 2**(la * log2(e) - c2), c2 =
    `win_bound(best_v)`. False only where no l' within 3 ulp of la can win, as in `may_win`:
    where |la| <= |best_v| + 128, M is at least twice may_win's margin, which covers the fp32
    roundings of c2, of the FMA and of log2(e) and ex2's error too (each below 1e-6 * (|la| +
    |best_v| + M) in the exponent); where la > |best_v| + 128 the bound passes; where la <
    -(|best_v| + 128) no entry can win (its noise would need g > 127, and g <= 23). A flushed
    2**z (< 2**-126) leaves the test as it was, since W' is 0 or at least 2**-23. NaN la fails;
    x = -inf may pass (its bound is 0 = W' when u < 2**9): callers exclude it."""
    w_lo = ((u >> 9) | 0x3F800000).to(tl.float32, bitcast=True) - 1.0
    return w_lo <= ex2_ftz(tl.fma(la, LOG2E, -c2), PTX)


@triton.jit
def acc_argmax(av, ai, v, ids):
    """Per-lane running (max, first id): lanes see increasing ids, so ties keep the earlier."""
    upd = (v > av) | (ai == BIG_ID32)
    return tl.where(upd, v, av), tl.where(upd, ids, ai)


@triton.jit
def nan_count(xrow, start, end, offs, nan_sum, STEP: tl.constexpr):
    """NaNs in columns [start, end) of the row. The pass keeps `nan_sum`, each lane's fp32 sum of
    its entries (one add an entry, where a count took three to four instructions with its
    predicate moves): a NaN entry makes it NaN for good. So does +inf meeting -inf (or a sum
    that overflowed meeting the other infinity), which is harmless: any NaN sum sends the split
    to a second read that counts exactly; a row without NaN, +inf or overflow never takes it."""
    n = tl.zeros((), tl.int32)
    if tl.max(tl.max((nan_sum != nan_sum).to(tl.int32), axis=1), axis=0) > 0:     # noqa: PLR0124
        for s in range(start, end, STEP):
            x = tl.load(xrow + s + offs, mask=s + offs < end, other=0.0).to(tl.float32)
            n += tl.sum(tl.sum((x != x).to(tl.int32), axis=1), axis=0)     # noqa: PLR0124
    return n


@triton.jit
def fp32_nonan(xr):
    x = xr.to(tl.float32)
    return tl.where(x == x, x, NEG_INF)        # noqa: PLR0124 - a NaN test


@triton.jit(do_not_specialize=["col_offset"])
def scan_kernel(x_ptr, stride, ncols, t_ptr, k_ptr, p_ptr, lmp_ptr, key0_ptr, key1_ptr, col_offset,
                raw_v_ptr, raw_i_ptr, max_ptr, best_v_ptr, best_i_ptr, nan_ptr, bmax_ptr,
                nblk, nsig_ptr, slo_ptr, shi_ptr, NSPLIT: tl.constexpr, CHUNK: tl.constexpr, TILE: tl.constexpr,
                BB: tl.constexpr, EXACT_EXP: tl.constexpr, MODES: tl.constexpr, PTX: tl.constexpr,
                SIGMA: tl.constexpr):
    """MODES: which row modes the batch holds (1 greedy, 2 plain, 4 filter); code for absent
    modes is not compiled, which keeps registers (and so occupancy) to what the batch needs.
    SIGMA: some row has top-n-sigma; its rows' splits also store their smallest and largest
    finite x (slo, shi: sigma.py), read in the same loop.
    PTX: compiled for CUDA (`ex2_ftz`'s inline PTX).
    The per-entry division l = x / T (IEEE, several instructions) stays out of the loop: maxima
    are taken over x and divided once (division by T > 0 is monotone), the skip test of plain
    rows uses la = x * (1 / T) with a margin (see `may_win`), and l itself is computed only in
    the blocks that may hold the winner."""
    row = tl.program_id(0)
    part = row * NSPLIT + tl.program_id(1)
    start, end = chunk_bounds(ncols, CHUNK)
    xrow = x_ptr + row.to(tl.int64) * stride
    t = tl.load(t_ptr + row)
    k = tl.load(k_ptr + row)
    p = tl.load(p_ptr + row)
    sig = sigma_on(nsig_ptr, row, SIGMA)
    mode, topk, topp, _ = row_flags(t, k, p, tl.load(lmp_ptr + row), sig, ncols)
    offs = tl.arange(0, TILE)[:, None] * BB + tl.arange(0, BB)[None, :]
    STEP: tl.constexpr = TILE * BB
    rv = tl.full((TILE, BB), NEG_INF, tl.float32)
    ri = tl.full((TILE, BB), BIG_ID32, tl.int32)
    nan_sum = tl.zeros((TILE, BB), tl.float32)     # NaN once a lane has seen a NaN (see nan_count)
    mxv = tl.full((TILE, BB), NEG_INF, tl.float32)
    shi = tl.full((TILE, BB), NEG_INF, tl.float32)     # SIGMA: finite extremes
    slo = tl.full((TILE, BB), float("inf"), tl.float32)
    best_v = tl.full((), NEG_INF, tl.float32)
    best_i = tl.full((), BIG_ID32, tl.int32)
    c2 = win_bound(best_v)
    spread = opaque_u32(offs.to(tl.uint32) * GOLDEN, PTX)   # + (step start + col_offset) * GOLDEN a step
    k0 = tl.load(key0_ptr + row).to(tl.uint32)
    k1 = tl.load(key1_ptr + row).to(tl.uint32)
    inv_t = tl.div_rn(1.0, tl.maximum(t, 1e-30))     # plain and filter rows: T > 0
    need_bmax = (mode == FILTER) & (topk | topp)
    xr = tl.load(xrow + start + offs, mask=start + offs < end, other=NEG_INF)
    for s in range(start, end, STEP):
        cols = s + offs
        if s + 2 * STEP <= end:     # a whole next step: no mask (nor its -inf fill) per entry
            xr_next = tl.load(xrow + cols + STEP)
        else:
            xr_next = tl.load(xrow + cols + STEP, mask=cols + STEP < end, other=NEG_INF)
        x = xr.to(tl.float32)
        nan_sum += x
        if (MODES & 5) != 0:      # greedy and filter rows take NaN as -inf; plain rows' tests fail on it
            x = tl.where(x == x, x, NEG_INF)             # noqa: PLR0124
        if (MODES & 1) != 0:   # noqa: SIM102 - a compile-time (constexpr) test
            if mode == GREEDY:
                rv, ri = acc_argmax(rv, ri, x, cols)
        if (MODES & 2) != 0:
            la = x * inv_t
        if (MODES & 4) != 0:   # noqa: SIM102 - a compile-time (constexpr) test
            if mode == FILTER:
                mxv = tl.maximum(mxv, x)
                if SIGMA:   # noqa: SIM102 - a compile-time (constexpr) test
                    if sig:
                        fin = (x > NEG_INF) & (x < float("inf"))
                        shi = tl.maximum(shi, tl.where(fin, x, NEG_INF))
                        slo = tl.minimum(slo, tl.where(fin, x, float("inf")))
        if (MODES & 2) != 0:   # noqa: SIM102 - a compile-time (constexpr) test
            if mode == PLAIN:
                u = uniform_bits_spread(k0, k1, spread + (s + col_offset).to(tl.uint32) * GOLDEN)
                cand = may_win_fast(la, u, c2, PTX)
                if tl.max(tl.max(cand.to(tl.int32), axis=1), axis=0) > 0:
                    cand = cand & (x > NEG_INF)         # NaN and -inf never win
                    l = div_t(x, t)
                    v, i = argmax_pair(tl.where(cand, l + gumbel_from_bits(u), NEG_INF), cols)
                    best_v, best_i = pair_max(best_v, best_i, v, i)
                    c2 = win_bound(best_v)
        if (MODES & 4) != 0:   # noqa: SIM102 - a compile-time (constexpr) test
            if need_bmax:
                bm = div_t(tl.max(x, axis=1), t)       # = max(x / T) per block: division is monotone
                b = s // BB + tl.arange(0, TILE)
                tl.store(bmax_ptr + row.to(tl.int64) * nblk + b, bm, mask=b < nblk)
        xr = xr_next
    raw_v, raw_i = argmax_pair(rv, ri)
    tl.store(raw_v_ptr + part, raw_v)
    tl.store(raw_i_ptr + part, raw_i)
    tl.store(max_ptr + part, div_t(tl.max(tl.max(mxv, axis=1), axis=0), t))
    tl.store(best_v_ptr + part, best_v)
    tl.store(best_i_ptr + part, best_i)
    tl.store(nan_ptr + part, nan_count(xrow, start, end, offs, nan_sum, STEP))
    if SIGMA:
        tl.store(shi_ptr + part, tl.max(tl.max(shi, axis=1), axis=0))
        tl.store(slo_ptr + part, tl.min(tl.min(slo, axis=1), axis=0))
