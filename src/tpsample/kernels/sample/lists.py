"""Top-p without top-k from lists of columns (docs/kernels.md, "How `sample_rows` works" 5):
the hist pass builds each row's guessed list, the list kernel resolves it; the lean pass (stage
LEAN) lists the columns of the rows the bracket narrows.

- hist_kernel (rows x splits), BINS off (stage LIST rows): each split's exact int64 mass of the
  eligible entries (the row's S is their sum) and the column of every x >= the select kernel's
  bound xf appended to the row's list with its x. BINS on (stage BINS rows, those the list left):
  an exact count histogram of [lo, m] over NBH bins (`bracket.bin_of`); the row's last program
  to arrive (a block barrier, then an acq_rel atomic on the row's arrival count, which the list
  kernel zeroed) makes the row's bracket (`bracket.bracket_row`), so no bracket kernel runs.
  Compiled for CUDA its atomics and stores are per-lane PTX (`tlutil.count_where`,
  `claim_where`, `store_where`, `claim_slots`) and x / T takes no division where
  `fast_division_ok` holds; the interpreter runs `tl.atomic_add` and `div_rn`.
- list_kernel (a program a row): an unlisted entry has x < xf, so l = div_rn(x, T) <= Lx =
  div_rn(xf, T) (IEEE division is monotone): the listed entries with l > Lx are exactly the
  row's entries above Lx. Their exact masses settle the row when float64(sum) >= p * S (every
  entry at or below Lx then has that much mass above it and is dropped): v* is the smallest key
  kappa among them with float64(mass of keys > kappa) < p * S (`tlutil.min_key_mass_few`), the
  token the Gumbel argmax over the listed entries with key >= kappa. Other rows (a list that
  overflowed or holds less than p of the mass) take BINS; settled rows count in `listed`.
- lean pass: a BINS row whose entries from the bracket's first possible bin up number at most
  LCAP gets L (at or below every entry of that bin) and xf (div_rn(x, T) >= L => x >= xf);
  `lean_collect` (pass 3) lists the columns of x >= xf, `after_lean` (the finish's step) keeps
  those with l >= L, exactly the row's upper set {l >= L}, and resolves the bracket's candidates
  among them (`bracket.resolve_keys`); an overflow or a bracket that does not certify starts
  HIST (counted in `fallbacks`), settled rows count in `leans`.
Nothing is estimated: lists only choose which entries are examined. List layout: a lane appends
through one of LG counters of the row's line (`cand_n`), so the lanes of one instruction do not
queue on one address; group g's i-th entry takes slot i * LG + g, readers skip the holes
(`list_slot_valid`), and a group past LCAP / LG counts without storing, an overflow for the
readers (`list_depth`).
"""
import triton
import triton.language as tl

from ..tlutil import (
    BIG_ID32,
    FEW,
    NEG_INF,
    argmax_pair,
    chunk_bounds,
    claim_slots,
    claim_where,
    count_where,
    div_by,
    div_t,
    gumbel,
    gumbel_from_bits,
    kept_mass,
    key_to_float,
    mass,
    min_key_mass_few,
    order_key,
    pair_max,
    store_pair_where,
    store_where,
    uniform_bits,
)
from .bracket import bin_of, bracket_row, resolve_keys, settle, target_of
from .scan import BINS, CN, DONE, LIST, fp32_nonan, zero_counters
from .scan import BINS as BINS_STAGE


@triton.jit
def list_group(cols, LG: tl.constexpr):
    """A mix of the bits of `cols` into [0, LG): over any 32 consecutive lanes of a block (whatever
    the register layout) it takes LG different values (LG <= 32). It is linear over XOR, so for
    a step s whose bits are apart from the lane position's, list_group(s + offs) =
    list_group(s) ^ list_group(offs)."""
    return (cols ^ (cols >> 2) ^ (cols >> 3) ^ (cols >> 5)) & (LG - 1)


@triton.jit
def list_columns(xr, xf, cols, g, row, ids_ptr, cand_n, LCAP: tl.constexpr, LG: tl.constexpr):
    """Append the columns of x >= xf (NaN compares false) to the row's list, one atomic per
    listed entry (order does not matter), through counter g (the callers take
    `list_group(offs) ^ list_group(step)`)."""
    sel, slot = list_claim(xr, xf, g, row, cand_n, LG, False, False)
    list_store(sel, slot, cols, row, ids_ptr, LCAP, False)


@triton.jit
def list_claim(xr, xf, g, row, cand_n, LG: tl.constexpr, PTX: tl.constexpr, PACK: tl.constexpr):
    """`list_columns`'s first half: (listed, slot) of each lane (slot = i * LG + g, i its place
    in group g). A streaming pass does its other work before `list_store`, which waits for the
    atomics' return. PTX: `tlutil.claim_where`'s per-lane PTX (CUDA only); PACK (with PTX): one
    atomic for every 4 entries of a thread, the group its lane's (`tlutil.claim_slots`; g
    unused)."""
    sel = xr.to(tl.float32) >= xf
    line = cand_n + row * CN
    if PACK:
        slot = claim_slots(line, sel.to(tl.int32), LG, CN // LG)
    else:
        slot = claim_where(line + g * (CN // LG), sel, PTX) * LG + g     # read after the kernel
    return sel, slot


@triton.jit
def list_store(sel, slot, cols, row, ids_ptr, LCAP: tl.constexpr, PTX: tl.constexpr):
    """`list_columns`'s second half: the claimed slots below LCAP take their columns."""
    store_where(ids_ptr + row.to(tl.int64) * LCAP, slot, cols, sel & (slot < LCAP), PTX)


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
def list_slot_valid(cand_n, row, idx, LG: tl.constexpr):
    """Which list slots idx hold a listed column (group idx % LG has more than idx // LG)."""
    return (idx // LG) < tl.load(cand_n + row * CN + (idx % LG) * (CN // LG))


@triton.jit
def resolve_list(row, t, p, m, t_lo, xf, scale, one, k0, k1, col_offset, p_mass, ids_ptr, vals_ptr, cand_n, lo, inv,
                 NSPLIT: tl.constexpr, LCAP: tl.constexpr, LG: tl.constexpr, EXACT_EXP: tl.constexpr,
                 NBH: tl.constexpr, PTX: tl.constexpr):
    """(settled, winner value, winner column, threshold key, top bin, top mass) of a row from its list (see the
    module docstring): the columns at ids_ptr's row, their x (fp32 bits) at the same slots of
    vals_ptr's. The whole list is held at once, LCAP slots over the program's lanes, and v* is
    searched between the keys of Lx (every kept entry is above it) and of m (the largest), the
    last FEW keys gathered in vals_ptr's first words once the x are read (PTX: through
    `tlutil.claim_where`'s per-lane atomic).

    For the bracket method of a row not settled here: the bins pass's bin of Lx (bins of
    [lo, m] as `bracket.bin_of`; -1 when Lx < lo) and the exact mass of the entries in
    the bins above it, which are all listed (bin(l) > bin(Lx) implies l > Lx); NBH - 1 and 0
    when the list overflowed."""
    idx = tl.arange(0, LCAP)
    cnt = tl.load(cand_n + row * CN + (idx % LG) * (CN // LG))      # each slot's group's count
    valid = (idx // LG) < cnt
    ids = tl.load(ids_ptr + row.to(tl.int64) * LCAP + idx, mask=valid, other=0)
    x = tl.load(vals_ptr + idx, mask=valid, other=0).to(tl.float32, bitcast=True)
    l = div_t(fp32_nonan(x), t)
    lx = div_t(xf, t)
    keep = valid & (l > lx) & (l >= t_lo)      # (a NaN xf: nothing listed, none kept)
    e = tl.where(keep, mass(l, m, scale, one, EXACT_EXP), 0)
    target = target_of(p, p_mass, row, NSPLIT)
    whole = tl.max(cnt, axis=0) <= LCAP // LG
    ok = whole & (tl.sum(e, axis=0).to(tl.float64) >= target)
    v = tl.full((), NEG_INF, tl.float32)
    i = tl.full((), BIG_ID32, tl.int32)
    thr = tl.zeros((), tl.int64)
    top_bin = tl.full((), NBH - 1, tl.int32)
    top_mass = tl.zeros((), tl.int64)
    if whole & ~ok:     # (only for the bracket: settled rows skip the reduction)
        top_bin = tl.where(lx >= lo, bin_of(lx, lo, inv, NBH), -1)
        top_mass = tl.sum(tl.where(keep & (l >= lo) & (bin_of(l, lo, inv, NBH) > top_bin), e, 0), axis=0)
    if ok:
        keys = tl.where(keep, order_key(l).to(tl.int64), -1)
        # f(key(Lx)) = the whole kept mass >= target; f(key(m)) = 0 < target; the list's x
        # (read above) leave their words free for the search's scratch
        thr = min_key_mass_few(keys, e, tl.zeros((), tl.int64), target, order_key(lx).to(tl.int64),
                               order_key(m).to(tl.int64), tl.sum(keep.to(tl.int32), axis=0),
                               vals_ptr.to(tl.pointer_type(tl.int64)), FEW, PTX)
        kept = keep & (keys >= thr)
        score = key_to_float(keys) + gumbel(k0, k1, ids + col_offset)
        v, i = argmax_pair(tl.where(kept, score, NEG_INF), tl.where(kept, ids, BIG_ID32))
    return ok, v, i, thr, top_bin, top_mass


@triton.jit(do_not_specialize=["col_offset"])
def list_kernel(t_ptr, p_ptr, key0_ptr, key1_ptr, col_offset, scale, one, st_stage, st_m, st_tkey,
                st_raw, st_token, st_valid, st_xf, p_mass, ids_ptr, cand_n, hist_ptr, st_arrive, listed,
                st_hlo, st_hinv, st_top_bin, st_top_mass, NSPLIT: tl.constexpr, LCAP: tl.constexpr, LG: tl.constexpr,
                NBH: tl.constexpr, HW: tl.constexpr, EXACT_EXP: tl.constexpr, PTX: tl.constexpr,
                KEPT: tl.constexpr):
    """Each LIST row (others return at once): its token from the list (DONE, counted in
    `listed`), else stage BINS with its histogram and its arrival count zeroed for the bins pass,
    and its top bin and top mass (`resolve_list`) for the bracket.
    The listed x are in the row's hist words (HW a row, the bins' later), so the row's logits
    are not read again; the row's counters are zeroed either way (the list is read first).
    KEPT: a settled row's threshold key goes to st_tkey (kept.py)."""
    tl.static_assert(4 * FEW + 2 <= HW)    # the search's scratch fits a row's words (`launch.hist_width`)
    row = tl.program_id(0)
    if tl.load(st_stage + row) == LIST:
        k0 = tl.load(key0_ptr + row).to(tl.uint32)
        k1 = tl.load(key1_ptr + row).to(tl.uint32)
        hrow = hist_ptr + row.to(tl.int64) * HW
        ok, v, i, thr, top_bin, top_mass = resolve_list(
            row, tl.load(t_ptr + row), tl.load(p_ptr + row), tl.load(st_m + row), key_to_float(tl.load(st_tkey + row)),
            tl.load(st_xf + row), scale, one, k0, k1, col_offset, p_mass, ids_ptr, hrow, cand_n,
            tl.load(st_hlo + row), tl.load(st_hinv + row), NSPLIT, LCAP, LG, EXACT_EXP, NBH, PTX)
        stage = tl.full((), BINS, tl.int32)
        if ok:
            found = v > NEG_INF
            tl.store(st_token + row, tl.where(found, i, tl.load(st_raw + row)).to(tl.int64) + col_offset)
            tl.store(st_valid + row, found)
            tl.atomic_add(listed, 1)
            stage = tl.full((), DONE, tl.int32)
            if KEPT:
                tl.store(st_tkey + row, thr)
        else:       # (every warp read the list's x before the reductions that decided ok)
            tl.store(hrow + tl.arange(0, NBH), tl.zeros((NBH,), tl.int32))
            tl.store(st_arrive + row, 0)
            tl.store(st_top_bin + row, top_bin)
            tl.store(st_top_mass + row, top_mass)
        tl.debug_barrier()      # every warp has read the list's counters before they are zeroed
        zero_counters(cand_n, row)
        tl.store(st_stage + row, stage)


@triton.jit
def lean_collect(x_ptr, row_off, start, end, row, xf, ids_ptr, cand_n, BLOCK: tl.constexpr, LCAP: tl.constexpr,
                 LG: tl.constexpr):
    """Pass 3 of a LEAN row's split [start, end): the columns of x >= xf, appended (order does
    not matter) with one atomic per listed entry (no prefix sum over a step's entries)."""
    xrow = x_ptr + row_off
    offs = tl.arange(0, BLOCK)
    goffs = list_group(offs, LG)
    xr = tl.load(xrow + start + offs, mask=start + offs < end, other=NEG_INF)
    for s in range(start, end, BLOCK):
        cols = s + offs
        xr_next = tl.load(xrow + cols + BLOCK, mask=cols + BLOCK < end, other=NEG_INF)
        list_columns(xr, xf, cols, goffs ^ list_group(s, LG), row, ids_ptr, cand_n, LCAP, LG)
        xr = xr_next


@triton.jit
def _slots_valid(idx, slots, cnt, cand_n, row, FC: tl.constexpr, LG: tl.constexpr):
    """Which of the slots idx (a chunk's, c + arange(FC) for c a multiple of FC) hold a listed
    column: `list_slot_valid`, with the counters of each lane's group read once (`cnt`) when
    every chunk's lanes fall in the same groups (FC a multiple of LG)."""
    if FC % LG == 0:
        ok = (idx < slots) & ((idx // LG) < cnt)
    else:
        ok = (idx < slots) & list_slot_valid(cand_n, row, idx, LG)
    return ok


@triton.jit
def _split_listed(row, slots, cand_n, xrow, t, L, lo, inv, last, m, scale, one, k0, k1, col_offset, ids_ptr,
                  cand_id, CAP: tl.constexpr, LCAP: tl.constexpr, FC: tl.constexpr, NBH: tl.constexpr,
                  EXACT_EXP: tl.constexpr, LG: tl.constexpr):
    """Over the list's first `slots` slots (the listed columns and the holes between groups):
    (mass, Gumbel winner) of the entries above the bracket, and the bracket's candidates'
    columns written to cand_id (their number returned; past CAP counted, not stored). The reads
    are pipelined: a chunk's x gather and the next chunk's ids load are issued before the
    chunk before them is worked on, so their latency hides behind that work."""
    m_above = tl.zeros((), tl.int64)
    best_v = tl.full((), NEG_INF, tl.float32)
    best_i = tl.full((), BIG_ID32, tl.int32)
    nb = tl.zeros((), tl.int32)
    lane = tl.arange(0, FC)
    ids_row = ids_ptr + row.to(tl.int64) * LCAP
    cnt = tl.load(cand_n + row * CN + (lane % LG) * (CN // LG))     # each lane's group's count
    valid = _slots_valid(lane, slots, cnt, cand_n, row, FC, LG)
    ids = tl.load(ids_row + lane, mask=valid, other=0)
    xv = tl.load(xrow + ids, mask=valid, other=NEG_INF)
    valid1 = _slots_valid(FC + lane, slots, cnt, cand_n, row, FC, LG)
    ids1 = tl.load(ids_row + FC + lane, mask=valid1, other=0)
    for c in range(0, slots, FC):
        valid2 = _slots_valid(c + 2 * FC + lane, slots, cnt, cand_n, row, FC, LG)
        ids2 = tl.load(ids_row + c + 2 * FC + lane, mask=valid2, other=0)
        xv1 = tl.load(xrow + ids1, mask=valid1, other=NEG_INF)
        l = div_t(fp32_nonan(xv), t)
        keep = valid & (l >= L) & (l > NEG_INF)
        above = keep & (bin_of(l, lo, inv, NBH) > last)
        inb = keep & ~above
        m_above += tl.sum(tl.where(above, mass(l, m, scale, one, EXACT_EXP), 0), axis=0)
        if tl.max(above.to(tl.int32), axis=0) > 0:     # (none when the bracket reaches the top bin)
            g = gumbel_from_bits(uniform_bits(k0, k1, ids + col_offset))
            v, i = argmax_pair(tl.where(above, l + g, NEG_INF), tl.where(above, ids, BIG_ID32))
            best_v, best_i = pair_max(best_v, best_i, v, i)
        pos = nb + tl.cumsum(inb.to(tl.int32), 0) - 1
        tl.store(cand_id + row.to(tl.int64) * CAP + pos, ids, mask=inb & (pos < CAP))
        nb += tl.sum(inb.to(tl.int32), axis=0)
        valid, ids, xv = valid1, ids1, xv1
        valid1, ids1 = valid2, ids2
    return m_above, best_v, best_i, nb


@triton.jit
def _resolve_listed(row, nb, xrow, t, target, m_above, av, ai, m, scale, one, key0_ptr, key1_ptr, col_offset,
                    cand_id, CAP: tl.constexpr, SIZE: tl.constexpr, EXACT_EXP: tl.constexpr):
    idx = tl.arange(0, SIZE)
    valid = idx < nb
    ids = tl.load(cand_id + row.to(tl.int64) * CAP + idx, mask=valid, other=0)
    l = div_t(fp32_nonan(tl.load(xrow + ids, mask=valid, other=NEG_INF)), t)
    keys = tl.where(valid, order_key(l).to(tl.int64), -1)
    return resolve_keys(row, keys, valid, idx, nb, target, m_above, av, ai, m, scale, one, key0_ptr, key1_ptr,
                        col_offset, cand_id, CAP, EXACT_EXP)


@triton.jit
def after_lean(row, cand_n, p, m, raw, tkey, x_ptr, stride, t_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
               st_flags, st_token, st_valid, st_tkey, st_klo, st_khi, st_shift, st_cabove, st_mabove, st_piv,
               st_hlo, st_hinv, st_last, st_lean_l, ids_ptr, cand_id, p_mass, fallbacks, leans,
               NSPLIT: tl.constexpr, CAP: tl.constexpr, SMALL: tl.constexpr, LCAP: tl.constexpr,
               FC: tl.constexpr, P: tl.constexpr, NB: tl.constexpr, NBH: tl.constexpr, EXACT_EXP: tl.constexpr,
               LG: tl.constexpr, KEPT: tl.constexpr):
    """The per-row step of a LEAN row (see the module docstring): its token, or the exact search;
    returns the new stage. The list's LG counters are still in cand_n (the caller zeroes them
    after this step)."""
    t = tl.load(t_ptr + row)
    xrow = x_ptr + row.to(tl.int64) * stride
    k0 = tl.load(key0_ptr + row).to(tl.uint32)
    k1 = tl.load(key1_ptr + row).to(tl.uint32)
    target = target_of(p, p_mass, row, NSPLIT)
    depth = list_depth(cand_n, row, LG)
    ok = depth <= LCAP // LG
    v = tl.full((), NEG_INF, tl.float32)
    i = tl.full((), BIG_ID32, tl.int32)
    thr = tl.zeros((), tl.int64)
    if ok:
        m_above, av, ai, nb = _split_listed(row, depth * LG, cand_n, xrow, t, tl.load(st_lean_l + row),
                                            tl.load(st_hlo + row), tl.load(st_hinv + row), tl.load(st_last + row),
                                            m, scale, one, k0, k1, col_offset, ids_ptr, cand_id, CAP, LCAP, FC,
                                            NBH, EXACT_EXP, LG)
        tl.debug_barrier()     # the candidates' columns are written before they are read
        ok = nb <= CAP
        if ok:
            if nb <= SMALL:
                ok, v, i, thr = _resolve_listed(row, nb, xrow, t, target, m_above, av, ai, m, scale, one, key0_ptr,
                                           key1_ptr, col_offset, cand_id, CAP, SMALL, EXACT_EXP)
            else:
                ok, v, i, thr = _resolve_listed(row, nb, xrow, t, target, m_above, av, ai, m, scale, one, key0_ptr,
                                           key1_ptr, col_offset, cand_id, CAP, CAP, EXACT_EXP)
    if ok:
        tl.atomic_add(leans, 1)
    return settle(row, ok, v, i, thr, raw, col_offset, tkey, m, st_token, st_valid, st_flags, st_tkey, st_klo,
                  st_khi, st_shift, st_cabove, st_mabove, st_piv, fallbacks, P, NB, KEPT)


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
