"""The hist pass of top-p rows without top-k (hist_kernel, grid rows x splits), in two modes.

- Mass and list (BINS off; stage LIST rows, right after the select kernel): each split's exact
  int64 mass of the eligible entries (the row's S is their sum) and the columns of x >= the
  select kernel's guessed bound appended to the row's list with their x (lists.py), which
  the list kernel then resolves. Per entry: a compare and a predicated claim for the list, the
  division by T, the exact exponential and its int64 conversion; no histogram.
- Bins (BINS on; stage BINS rows, the ones the list did not settle): an exact count histogram
  of the entries in [lo, m] over NBH bins uniform in value (`bracket.bin_of`), then the
  row's last program to arrive makes the row's bracket (`bracket.bracket_row`), so no
  bracket kernel is launched: each program's atomics precede its arrival (a block barrier, then
  an acq_rel atomic on the row's arrival count, which the list kernel zeroed), and the last one
  reads the histogram through L2 after its own arrival.

PTX (compiled for CUDA): the atomics and the list's stores are per-lane predicated PTX
(`tlutil.count_where`, `claim_where`, `store_where`, `claim_slots`), and x / T takes no division
where `fast_division_ok` holds; the interpreter runs `tl.atomic_add` and `div_rn`.
"""
import triton
import triton.language as tl

from ..tlutil import (
    NEG_INF,
    chunk_bounds,
    count_where,
    div_by,
    div_t,
    kept_mass,
    key_to_float,
    store_pair_where,
)
from .bracket import bin_of, bracket_row
from .lists import list_claim, list_group
from .state import BINS as BINS_STAGE
from .state import LIST


@triton.jit
def fast_division_ok(t, m, t_lo):
    """Whether the hist pass of a row may divide by T with `tlutil.div_by` (x * y and two FMAs)
    instead of `div_t`: T in [2**-20, 2**20], 2**-50 <= |m| <= 2**78, and min-p's t_lo off or
    |t_lo| >= 2**-70. Then every x gives the same mass and the same `l >= t_lo` as IEEE x / T:
    2**-100 <= |x| <= 2**100 and x = 0 divide exactly; a smaller |x| gives |l| < 2**-79 either
    way, which leaves l - m at -m (|l| < ulp(m) / 4) and l on the same side of t_lo; a larger
    finite |x| is negative (x / T <= m), and x / T < -2**80 is below m - 32 (mass 0) and below
    any finite t_lo (>= m + log(min_p) > -2**79); the fast result is then -2**80 or less, or NaN
    (which fails every test, as -inf does), so its mass is 0 too. The bins and the list may
    differ for such rows' extreme entries: they only choose which entries are examined, and
    every decision is certified exactly."""
    am = tl.abs(m)
    return ((t >= 9.5367431640625e-07) & (t <= 1048576.0) & (am >= 8.881784197001252e-16)
            & (am <= 3.022314549036573e+23) & ((t_lo == NEG_INF) | (tl.abs(t_lo) >= 8.470329472543003e-22)))


@triton.jit
def _hist_span(x_ptr, row_off, start, end, t, y, row, m, lo, inv, t_lo, scale, hrow, xf, ids_ptr, cand_n,
               BLOCK: tl.constexpr, NBH: tl.constexpr, EXACT_EXP: tl.constexpr, LCAP: tl.constexpr,
               LG: tl.constexpr, PTX: tl.constexpr, FAST: tl.constexpr, PACK: tl.constexpr, BINS: tl.constexpr):
    """Columns [start, end) of a row: BINS off, their mass (int64) and their x >= xf listed, the
    columns in the id list and the x (fp32 bits) at the same slots of the row's `hrow` words
    (the list's slots claimed first and written last, so the step's work hides the atomics'
    round trip); BINS on, their bins counted in `hrow` (mass 0). FAST: x / T by `div_by` with
    y = 1 / T."""
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
        xc = xr.to(tl.float32)
        if not BINS:
            sel, slot = list_claim(xc, xf, goffs ^ list_group(s, LG), row, cand_n, LG, PTX, PACK)
        if FAST:
            l = div_by(xc, t, y)
        else:
            l = div_t(xc, t)     # a NaN x stays NaN: every test below fails for it
        xr = xr_next
        if BINS:
            count_where(hrow, bin_of(l, lo, inv, NBH), l >= lo, PTX)
        else:
            s_lane += kept_mass(l, l >= t_lo, m, scale, EXACT_EXP)
            store_pair_where(ids_ptr + row.to(tl.int64) * LCAP, hrow, slot, cols, xc.to(tl.int32, bitcast=True),
                             sel & (slot < LCAP), PTX)
    return tl.sum(s_lane, axis=0)


@triton.jit
def hist_kernel(x_ptr, stride, ncols, t_ptr, p_ptr, scale, st_stage, st_m, st_tkey, st_hlo, st_hinv, hist_ptr,
                p_mass, st_xf, ids_ptr, cand_n, st_arrive, st_first, st_last, st_count, st_lean_l, st_top_bin,
                st_top_mass, NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, NBH: tl.constexpr,
                EXACT_EXP: tl.constexpr, LCAP: tl.constexpr, LG: tl.constexpr, PTX: tl.constexpr,
                PACK: tl.constexpr, BINS: tl.constexpr, ALL: tl.constexpr, CAP: tl.constexpr, LEAN: tl.constexpr,
                HW: tl.constexpr):
    """One split of each row in the mode's stage (LIST, or BINS with BINS; others return at
    once); see the module docstring. PACK (with PTX): the list's slots claimed by
    `tlutil.claim_slots` (BLOCK a multiple of 4 entries a thread). ALL, CAP, LEAN: the
    bracket's settings (`bracket_row`). hist_ptr: HW int32 words a row (HW >= NBH, LCAP): the
    listed x, then the bins."""
    row = tl.program_id(0)
    stage = tl.load(st_stage + row)
    if BINS:
        mine = stage == BINS_STAGE
    else:
        mine = stage == LIST
    if mine:
        start, end = chunk_bounds(ncols, CHUNK)
        row_off = row.to(tl.int64) * stride
        t = tl.load(t_ptr + row)
        m = tl.load(st_m + row)
        lo = tl.load(st_hlo + row)
        inv = tl.load(st_hinv + row)
        t_lo = key_to_float(tl.load(st_tkey + row))
        hrow = hist_ptr + row.to(tl.int64) * HW
        xf = tl.load(st_xf + row)
        if PTX:
            y = tl.div_rn(1.0, t)
            if fast_division_ok(t, m, t_lo):
                total = _hist_span(x_ptr, row_off, start, end, t, y, row, m, lo, inv, t_lo, scale, hrow, xf, ids_ptr,
                                   cand_n, BLOCK, NBH, EXACT_EXP, LCAP, LG, PTX, True, PACK, BINS)
            else:
                total = _hist_span(x_ptr, row_off, start, end, t, y, row, m, lo, inv, t_lo, scale, hrow, xf, ids_ptr,
                                   cand_n, BLOCK, NBH, EXACT_EXP, LCAP, LG, PTX, False, PACK, BINS)
        else:
            total = _hist_span(x_ptr, row_off, start, end, t, t, row, m, lo, inv, t_lo, scale, hrow, xf, ids_ptr,
                               cand_n, BLOCK, NBH, EXACT_EXP, LCAP, LG, PTX, False, False, BINS)   # (y unused)
        if BINS:
            tl.debug_barrier()      # every lane's atomics are issued before the arrival
            if tl.atomic_add(st_arrive + row, 1, sem="acq_rel") == NSPLIT - 1:
                bracket_row(row, t, tl.load(p_ptr + row), scale, m, lo, inv, hist_ptr, p_mass, st_stage, st_first,
                            st_last, st_count, st_lean_l, st_xf, st_top_bin, st_top_mass, NSPLIT, ALL, NBH, HW, CAP,
                            LCAP, LG, LEAN)
        else:
            tl.store(p_mass + row * NSPLIT + tl.program_id(1), total)
