"""Top-p without top-k in three streaming passes: the bracket method (stage BRACKET).

Rows with top-p and no top-k (min-p allowed) used to start from block-maxima bounds that fail on
such rows (the block maxima hold less than p of the mass), collect the whole row and fall into
the one-program-per-row search. Here they take, after the scan (pass 1: m = max(l) and the
maximum of every block of BB columns):

- select: a range [lo, m] that must hold v*: every dropped entry is <= v*, they carry more than
  (1 - p) of S, and there are at most V of them, so exp(v* - m) > (1 - p) S / V, i.e.
  v* >= m + log((1 - p) * S_lo / V) with S_lo <= S/2**shift: the sum of exp(b - m) over the
  block maxima b, distinct entries of the row (1 with min-p, where S counts only entries >= t1).
  lo is that bound less a margin, and never below t1.
- hist_kernel (pass 2, rows x splits): the exact mass S of the eligible entries (int64, per
  split) and an exact count histogram of the entries in [lo, m] over NBH bins uniform in value,
  bin(l) = min(floor((l - lo) * inv), NBH - 1) in fp32 (monotone in l, so bins are value
  intervals); global atomics, only for entries in range.
- `bracket` (bracket_kernel, one program per row): from the counts, bounds of the mass above
  each bin (count x exp of the bin's edges, with margins) against the exact target p * S give
  the bins that surely hold kept entries and those that surely do not; v* lies in the bins
  between (the bracket), whose count is exact.
- round (pass 3, `collect_bracket`): the bracket's entries become candidates (key, column);
  entries above the bracket, all kept, give their exact mass and their Gumbel winner.
- finish (`resolve_bracket`): v* from the candidates' exact masses, certified exactly:
  float64(mass above the bracket) < p * S <= float64(that + the candidates' mass). The token
  is the better of the winner above the bracket and the kept candidates' Gumbel argmax.
A row whose bracket holds more than CAP entries, or does not certify, starts the exact search
(stage HIST) and is counted in `fallbacks`. Histograms and bounds only choose which entries are
examined; every decision is on exact integers or keys, so tokens equal the definition's.
"""
import triton
import triton.language as tl

from .rng_triton import gumbel_from_bits, uniform_bits
from .sample_scan import may_win
from .sample_state import (
    BRACKET,
    CN,
    DONE,
    LEAN,
    LISTED,
    append_candidates,
    draw_candidates,
    start_search,
    zero_counters,
)
from .tlutil import (
    BIG_ID32,
    NEG_INF,
    argmax_pair,
    claim_where,
    count_where,
    div_by,
    div_t,
    fexp,
    kept_mass,
    key_to_float,
    mass,
    min_key_mass_below,
    pair_max,
    store_where,
)


@triton.jit
def range_for_top_p(m, t1, p, s_all, minp, ncols):
    """(lo, inv): the bracket's value range [lo, m] (see the module docstring) and NBH / width
    (the caller multiplies by NBH). s_all: a lower bound of the row's sum of exp(l - m), within
    the fast exp's ulps (the block maxima's sum)."""
    s_lo = tl.where(minp, 1.0, tl.maximum(s_all * 0.999, 1.0))
    lo = m + tl.log(s_lo * (1.0 - p) * 0.999 / ncols.to(tl.float32)) - 1e-3
    lo = tl.maximum(lo, t1)
    width = tl.maximum(m - lo, 1e-30)
    return lo, 1.0 / width


@triton.jit
def bin_of(l, lo, inv, NBH: tl.constexpr):
    """Bin of entries l >= lo (other lanes: garbage, callers mask them)."""
    return tl.minimum((l - lo) * (inv * NBH), NBH - 1.0).to(tl.int32)


@triton.jit
def bracket(hist_ptr, row, lo, inv, m, target, scale, ALL: tl.constexpr, NBH: tl.constexpr):
    """(first bin, last bin, count, upward): the candidates are the entries of bins first..last; bins
    below `first` hold only dropped entries; entries of bins above `last` are all kept (their
    mass and winner come from the collect pass). v* lies in the bins that neither surely hold a
    kept entry nor surely none; when every entry from `first` up numbers at most ALL, last is
    the top bin (no entry above: the finish resolves everything from the candidates), else the
    last bin that may hold v*. count: the candidates' number. target = float64(p) * S (int mass
    units, 2**shift per unit of exp).

    ALL is small (KernelConfig.bracket_all): the finish then resolves ~100 bracket candidates
    instead of the ~1,000 entries from the bracket up (21 -> 12 us at 256 x 151,936 on an H200);
    the collect pass costs the same either way."""
    b = tl.arange(0, NBH)
    h = tl.load(hist_ptr + row.to(tl.int64) * NBH + b)
    w = 1.0 / (inv * NBH)
    tol = 4e-7 * tl.maximum(tl.abs(m), tl.abs(lo)) + 1e-30
    bf = b.to(tl.float32)
    bot = tl.maximum(lo + (bf - 0.01) * w - tol, lo)
    top = tl.minimum(lo + (bf + 1.01) * w + tol, m)
    e_lo = tl.maximum(fexp(bot - m, False).to(tl.float64) * (1.0 - 1e-5) - 1e-13, 0.0) * scale
    e_hi = fexp(top - m, False).to(tl.float64) * (1.0 + 1e-5) * scale
    lo_mass = h.to(tl.float64) * e_lo
    hi_mass = h.to(tl.float64) * e_hi
    above_lo = tl.sum(lo_mass, axis=0) - tl.cumsum(lo_mass, 0)       # mass strictly above bin b
    above_hi = tl.sum(hi_mass, axis=0) - tl.cumsum(hi_mass, 0)
    kept_sure = (h > 0) & (above_hi * (1.0 + 1e-9) < target)        # its top entry is kept
    dropped_sure = above_lo >= target * (1.0 + 1e-9)                 # none of its entries is kept
    last = tl.minimum(tl.min(tl.where(kept_sure, b, NBH - 1), axis=0), NBH - 1)
    first = tl.max(tl.where(dropped_sure, b, -1), axis=0) + 1
    upward = tl.sum(tl.where(b >= first, h, 0), axis=0)
    count = tl.sum(tl.where((b >= first) & (b <= last), h, 0), axis=0)
    if upward <= ALL:
        last = NBH - 1
        count = upward
    return first, last, count, upward


@triton.jit
def target_of(p, p_mass, row, NSPLIT: tl.constexpr):
    """float64(p) * S, S the exact int64 mass of the row's eligible entries (summed over splits)."""
    S = tl.sum(tl.load(p_mass + row * NSPLIT + tl.arange(0, NSPLIT)), axis=0)
    return p.to(tl.float64) * S.to(tl.float64)


@triton.jit
def list_group(cols, LG: tl.constexpr):
    """A mix of the bits of `cols` into [0, LG): over any 32 consecutive lanes of a block (whatever
    the register layout) it takes LG different values (LG <= 32). It is linear over XOR, so for
    a step s whose bits are apart from the lane position's, list_group(s + offs) =
    list_group(s) ^ list_group(offs)."""
    return (cols ^ (cols >> 2) ^ (cols >> 3) ^ (cols >> 5)) & (LG - 1)


@triton.jit
def list_columns(xr, xf, cols, g, row, ids_ptr, cand_n, LCAP: tl.constexpr, LG: tl.constexpr):
    """Append the columns of x >= xf (NaN compares false) to the row's id list, one atomic per
    listed entry (order does not matter), through counter g (of LG, words CN / LG apart in the
    row's counter line; the callers take `list_group(offs) ^ list_group(step)`, so the lanes of
    one warp instruction append through different counters and their atomics do not queue on
    one address). Group g's i-th entry takes slot i * LG + g; past LCAP / LG a group counts, does
    not store (`list_depth` sees it)."""
    sel, pos = list_claim(xr, xf, g, row, cand_n, LG, False)
    list_store(sel, pos, g, cols, row, ids_ptr, LCAP, LG, False)


@triton.jit
def list_claim(xr, xf, g, row, cand_n, LG: tl.constexpr, PTX: tl.constexpr):
    """`list_columns`'s first half: (listed, slot index in its group) of each lane. A streaming
    pass does its other work before `list_store`, which waits for the atomics' return. PTX:
    `tlutil.claim_where`'s per-lane PTX (CUDA only)."""
    sel = xr.to(tl.float32) >= xf
    pos = claim_where(cand_n + row * CN + g * (CN // LG), sel, PTX)    # read after the kernel
    return sel, pos


@triton.jit
def list_store(sel, pos, g, cols, row, ids_ptr, LCAP: tl.constexpr, LG: tl.constexpr, PTX: tl.constexpr):
    """`list_columns`'s second half: the claimed slots take their columns."""
    store_where(ids_ptr + row.to(tl.int64) * LCAP, pos * LG + g, cols, sel & (pos < LCAP // LG), PTX)


@triton.jit
def list_depth(cand_n, row, LG: tl.constexpr):
    """The largest of the row's LG list counters: slots [0, depth * LG) hold the list, with
    holes (`list_slot_valid`); the list overflowed when depth > LCAP / LG."""
    if LG == 1:
        depth = tl.load(cand_n + row * CN)
    else:
        depth = tl.max(tl.load(cand_n + row * CN + tl.arange(0, LG) * (CN // LG)), axis=0)
    return depth


@triton.jit
def lean_fits(upward, LCAP: tl.constexpr, LG: tl.constexpr):
    """Whether a row with `upward` entries from the bracket's first bin up may take the lean
    pass: they fit LCAP less 1/16 (for the few the x bound lets in below L) and, with LG > 1
    counters, the fullest group is expected to fit its LCAP / LG less the same 1/16 (its mean
    plus 4 standard deviations of a Poisson count, plus 1)."""
    room = LCAP - LCAP // 16
    if LG == 1:
        fits = upward <= room
    else:
        mean = upward.to(tl.float32) / LG
        fits = mean + 4.0 * tl.sqrt(mean) + 1.0 <= room / LG
    return fits


@triton.jit
def list_slot_valid(cand_n, row, idx, LG: tl.constexpr):
    """Which list slots idx hold a listed column (group idx % LG has more than idx // LG)."""
    return (idx // LG) < tl.load(cand_n + row * CN + (idx % LG) * (CN // LG))


@triton.jit
def fast_division_ok(t, m, t_lo):
    """Whether the hist pass of a row may divide by T with `tlutil.div_by` (x * y and two FMAs)
    instead of `div_t`: T in [2**-20, 2**20], 2**-50 <= |m| <= 2**78, and min-p's t_lo off or
    |t_lo| >= 2**-70. Then every x gives the same mass and the same `l >= t_lo` as IEEE x / T:
    2**-100 <= |x| <= 2**100 and x = 0 divide exactly; a smaller |x| gives |l| < 2**-79 either
    way, which leaves l - m at -m (|l| < ulp(m) / 4) and l on the same side of t_lo; a larger
    finite |x| is negative (x / T <= m), and x / T < -2**80 is below m - 32 (mass 0) and below
    any finite t_lo (>= m + log(min_p) > -2**79); the fast result is then -2**80 or less, or NaN
    (which fails every test, as -inf does), so its mass is 0 too. The bins
    may differ for such rows' extreme entries: they only choose which entries the finish
    examines, and it certifies exactly (else the exact search)."""
    am = tl.abs(m)
    return ((t >= 9.5367431640625e-07) & (t <= 1048576.0) & (am >= 8.881784197001252e-16)
            & (am <= 3.022314549036573e+23) & ((t_lo == NEG_INF) | (tl.abs(t_lo) >= 8.470329472543003e-22)))


@triton.jit
def _hist_span(x_ptr, row_off, start, end, t, y, row, m, lo, inv, t_lo, scale, hrow, xf, ids_ptr, cand_n,
               BLOCK: tl.constexpr, NBH: tl.constexpr, EXACT_EXP: tl.constexpr, HIST_SKIP: tl.constexpr,
               LCAP: tl.constexpr, LG: tl.constexpr, PTX: tl.constexpr, FAST: tl.constexpr):
    """The hist pass over columns [start, end) of a row: its mass (int64), its bins counted, its
    columns x >= xf listed (LCAP > 0). FAST: x / T by `div_by` with y = 1 / T."""
    s_lane = tl.zeros((BLOCK,), tl.int64)     # per-lane sums, one reduction at the end
    offs = tl.arange(0, BLOCK)
    goffs = list_group(offs, LG)
    xr = tl.load(x_ptr + row_off + start + offs, mask=start + offs < end, other=NEG_INF)
    for s in range(start, end, BLOCK):
        cols = s + offs
        if s + 2 * BLOCK <= end:    # a whole next step: no mask (nor its -inf fill) per entry
            xr_next = tl.load(x_ptr + row_off + cols + BLOCK)
        else:
            xr_next = tl.load(x_ptr + row_off + cols + BLOCK, mask=cols + BLOCK < end, other=NEG_INF)
        if LCAP > 0:    # the list's slots are claimed first and written last: the step's
            g = goffs ^ list_group(s, LG)       # work hides the atomics' round trip
            sel, pos = list_claim(xr, xf, g, row, cand_n, LG, PTX)
        if FAST:
            l = div_by(xr.to(tl.float32), t, y)
        else:
            l = div_t(xr.to(tl.float32), t)     # a NaN x stays NaN: every test below fails for it
        xr = xr_next
        s_lane += kept_mass(l, l >= t_lo, m, scale, EXACT_EXP)
        inr = l >= lo
        if HIST_SKIP:
            if tl.sum(inr.to(tl.int32), axis=0) > 0:
                count_where(hrow, bin_of(l, lo, inv, NBH), inr, PTX)
        else:
            count_where(hrow, bin_of(l, lo, inv, NBH), inr, PTX)
        if LCAP > 0:
            list_store(sel, pos, g, cols, row, ids_ptr, LCAP, LG, PTX)
    return tl.sum(s_lane, axis=0)


@triton.jit(do_not_specialize=["col_offset"])
def hist_kernel(x_ptr, stride, ncols, t_ptr, scale, st_stage, st_m, st_tkey, st_hlo, st_hinv, hist_ptr,
                p_mass, st_xf, ids_ptr, cand_n, NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                NBH: tl.constexpr, EXACT_EXP: tl.constexpr, HIST_SKIP: tl.constexpr, LCAP: tl.constexpr,
                LG: tl.constexpr, PTX: tl.constexpr):
    """Pass 2 for BRACKET rows (others return at once): S per split, counts per bin. HIST_SKIP:
    test per block whether any entry is in range before the atomics (else masked atomics).
    LCAP > 0: also the lean pass's list for the select kernel's guessed bound st_xf (NaN: none;
    see "The guessed list" in sample_lean.py). PTX (compiled for CUDA): the atomics and the
    list's stores as per-lane predicated PTX (`tlutil.count_where`), and x / T without a
    division where `fast_division_ok` (the interpreter runs tl.atomic_add and div_rn)."""
    row = tl.program_id(0)
    if tl.load(st_stage + row) == BRACKET:
        part = row * NSPLIT + tl.program_id(1)
        start = tl.program_id(1) * CHUNK
        end = tl.minimum(start + CHUNK, ncols)
        row_off = row.to(tl.int64) * stride
        t = tl.load(t_ptr + row)
        m = tl.load(st_m + row)
        lo = tl.load(st_hlo + row)
        inv = tl.load(st_hinv + row)
        t_lo = key_to_float(tl.load(st_tkey + row))
        hrow = hist_ptr + row.to(tl.int64) * NBH
        xf = 0.0
        if LCAP > 0:
            xf = tl.load(st_xf + row)
        if PTX:
            y = tl.div_rn(1.0, t)
            if fast_division_ok(t, m, t_lo):
                total = _hist_span(x_ptr, row_off, start, end, t, y, row, m, lo, inv, t_lo, scale, hrow, xf, ids_ptr,
                                   cand_n, BLOCK, NBH, EXACT_EXP, HIST_SKIP, LCAP, LG, PTX, True)
            else:
                total = _hist_span(x_ptr, row_off, start, end, t, y, row, m, lo, inv, t_lo, scale, hrow, xf, ids_ptr,
                                   cand_n, BLOCK, NBH, EXACT_EXP, HIST_SKIP, LCAP, LG, PTX, False)
        else:
            total = _hist_span(x_ptr, row_off, start, end, t, t, row, m, lo, inv, t_lo, scale, hrow, xf, ids_ptr,
                               cand_n, BLOCK, NBH, EXACT_EXP, HIST_SKIP, LCAP, LG, PTX, False)   # (y unused)
        tl.store(p_mass + part, total)


@triton.jit
def lean_bound(lo, inv, first, m, t, NBH: tl.constexpr):
    """(L, xf) for a LEAN row: L <= every l of bin `first` (the bracket's own lower edge, less its
    margin); xf = `x_bound(L, T)`, so no entry with l >= L is missed (a few just below L may be
    listed; the finish drops them)."""
    w = 1.0 / (inv * NBH)
    tol = 4e-7 * tl.maximum(tl.abs(m), tl.abs(lo)) + 1e-30
    L = tl.maximum(lo + (first.to(tl.float32) - 0.01) * w - tol, lo)
    return L, x_bound(L, t)


@triton.jit
def x_bound(L, t):
    """xf with div_rn(x, T) >= L  =>  x >= xf: L * T less 2**-20 relative and 1e-30 (x < xf gives
    x / T below L by more than div_rn's half ulp)."""
    y = L * t
    return y - (tl.abs(y) * 9.5367431640625e-07 + 1e-30)


@triton.jit
def bracket_kernel(t_ptr, p_ptr, scale, st_stage, st_m, st_hlo, st_hinv, hist_ptr, p_mass, st_first, st_last,
                   st_count, st_lean_l, st_xf, cand_n, prelisted, NSPLIT: tl.constexpr, ALL: tl.constexpr,
                   NBH: tl.constexpr, CAP: tl.constexpr, LCAP: tl.constexpr, PRELIST: tl.constexpr,
                   LG: tl.constexpr):
    """The bracket of each BRACKET row, once (the collect programs and the finish read it). With
    LCAP > 0, a row whose entries from the bracket's first bin up fit LCAP (less 1/16 for the
    few that the x bound lets in below L) and whose candidates fit CAP becomes LEAN
    (sample_lean.py); LISTED instead (counted in `prelisted`) when PRELIST and the hist pass's
    list {x >= its bound} holds every x >= the row's xf and did not overflow. Every other
    BRACKET row's counters are zeroed for its third pass."""
    row = tl.program_id(0)
    if tl.load(st_stage + row) == BRACKET:
        if PRELIST:
            n_pre = list_depth(cand_n, row, LG)
            xf_pre = tl.load(st_xf + row)
            tl.debug_barrier()      # read before any warp rewrites them
        lo = tl.load(st_hlo + row)
        inv = tl.load(st_hinv + row)
        m = tl.load(st_m + row)
        first, last, count, upward = bracket(hist_ptr, row, lo, inv, m,
                                             target_of(tl.load(p_ptr + row), p_mass, row, NSPLIT), scale, ALL, NBH)
        tl.store(st_first + row, first)
        tl.store(st_last + row, last)
        tl.store(st_count + row, count)
        stage = tl.full((), BRACKET, tl.int32)
        if (LCAP > 0) & lean_fits(upward, LCAP, LG) & (count <= CAP):
            L, xf = lean_bound(lo, inv, first, m, tl.load(t_ptr + row), NBH)
            tl.store(st_lean_l + row, L)
            tl.store(st_xf + row, xf)
            stage = tl.full((), LEAN, tl.int32)
            if PRELIST:     # noqa: SIM102 - a compile-time (constexpr) test
                if (xf_pre <= xf) & (n_pre <= LCAP // LG):      # {x >= xf_pre} holds {x >= xf}
                    stage = tl.full((), LISTED, tl.int32)
                    tl.atomic_add(prelisted, 1)
            tl.store(st_stage + row, stage)
        if stage != LISTED:
            zero_counters(cand_n, row)


@triton.jit
def collect_bracket(x_ptr, row_off, t, start, end, row, lo, inv, first, last, m, scale, k0, k1, col_offset,
                    cand_key, cand_id, cand_n, CAP: tl.constexpr, BLOCK: tl.constexpr, NBH: tl.constexpr,
                    EXACT_EXP: tl.constexpr):
    """Pass 3 of a split: candidates of the bracket; (mass, Gumbel winner) of the entries above it."""
    m_above = tl.zeros((), tl.int64)
    best_v = tl.full((), NEG_INF, tl.float32)
    best_i = tl.full((), BIG_ID32, tl.int32)
    offs = tl.arange(0, BLOCK)
    xr = tl.load(x_ptr + row_off + start + offs, mask=start + offs < end, other=NEG_INF)
    for s in range(start, end, BLOCK):
        cols = s + offs
        xr_next = tl.load(x_ptr + row_off + cols + BLOCK, mask=cols + BLOCK < end, other=NEG_INF)
        l = div_t(xr.to(tl.float32), t)     # a NaN x stays NaN: every test below fails for it
        xr = xr_next
        inr = l >= lo
        b = bin_of(l, lo, inv, NBH)
        sel = inr & (b >= first) & (b <= last)
        above = inr & (b > last)
        append_candidates(sel, l, cols, row, cand_key, cand_id, cand_n, CAP)
        if tl.sum(above.to(tl.int32), axis=0) > 0:
            m_above += tl.sum(kept_mass(l, above, m, scale, EXACT_EXP), axis=0)
            u = uniform_bits(k0, k1, cols + col_offset)
            cand = above & may_win(l, u, best_v)      # only these can beat the best so far
            if tl.max(cand.to(tl.int32), axis=0) > 0:
                v, i = argmax_pair(tl.where(cand, l + gumbel_from_bits(u), NEG_INF), cols)
                best_v, best_i = pair_max(best_v, best_i, v, i)
    return m_above, best_v, best_i


@triton.jit
def resolve_keys(row, keys, valid, idx, n, target, m_above, av, ai, m, scale, one, key0_ptr, key1_ptr, col_offset,
                 cand_id, CAP: tl.constexpr, EXACT_EXP: tl.constexpr):
    """(certified, winner value, winner column) from n candidates (order keys `keys`, columns in
    cand_id) lying below entries of exact mass m_above, all kept, whose winner is (av, ai)."""
    e = tl.where(valid, mass(key_to_float(keys), m, scale, one, EXACT_EXP), 0)
    ok = (m_above.to(tl.float64) < target) & ((m_above + tl.sum(e, axis=0)).to(tl.float64) >= target) & (n > 0)
    kmin = tl.min(tl.where(valid, keys, 1 << 40), axis=0)
    kmax = tl.max(keys, axis=0)
    thr = min_key_mass_below(keys, e, m_above, target, kmin - 1, kmax)
    kept = valid & (keys >= thr)
    bv, bi = draw_candidates(keys, kept, valid, idx, row, key0_ptr, key1_ptr, col_offset, cand_id, CAP)
    v, i = pair_max(av, ai, bv, bi)
    return ok, v, i


@triton.jit
def settle(row, ok, v, i, raw, col_offset, tkey, m, st_token, st_valid, st_flags, st_tkey, st_klo, st_khi, st_shift,
           st_cabove, st_mabove, st_piv, fallbacks, P: tl.constexpr, NB: tl.constexpr):
    """The row's new stage after its bracket was resolved: DONE with its token (the winner
    (v, i), or the guard's `raw` when nothing was kept) when certified, else the exact search
    (HIST), counted in `fallbacks`."""
    stage = tl.full((), DONE, tl.int32)
    if ok:
        found = v > NEG_INF
        tl.store(st_token + row, tl.where(found, i, raw).to(tl.int64) + col_offset)
        tl.store(st_valid + row, found)
    else:
        tl.atomic_add(fallbacks, 1)
        stage = start_search(row, True, tkey, m, st_flags, st_tkey, st_klo, st_khi, st_shift, st_cabove,
                             st_mabove, st_piv, P, NB)
    return stage


@triton.jit
def resolve_bracket(row, n, p, m, scale, one, key0_ptr, key1_ptr, col_offset, cand_key, cand_id, p_mass, p_cnt,
                    p_best_v, p_best_i, NSPLIT: tl.constexpr, CAP: tl.constexpr, SIZE: tl.constexpr,
                    EXACT_EXP: tl.constexpr):
    """(certified, winner value, winner column) from the n <= SIZE candidates of the bracket."""
    parts = row * NSPLIT + tl.arange(0, NSPLIT)
    idx = tl.arange(0, SIZE)
    valid = idx < n
    keys = tl.load(cand_key + row.to(tl.int64) * CAP + idx, mask=valid, other=-1)
    av, ai = argmax_pair(tl.load(p_best_v + parts), tl.load(p_best_i + parts))
    m_above = tl.sum(tl.load(p_cnt + parts), axis=0)
    return resolve_keys(row, keys, valid, idx, n, target_of(p, p_mass, row, NSPLIT), m_above, av, ai, m, scale, one,
                        key0_ptr, key1_ptr, col_offset, cand_id, CAP, EXACT_EXP)
