"""Top-p without top-k when few entries lie from the bracket up: the lean third pass (stage LEAN).

For rows the list kernel did not settle (sample_list.py), the bracket (sample_bracket.py)
bounds the bins that surely hold only dropped entries; when the entries from the first other
bin up number at most LCAP (twice CAP: the candidate key list's bytes, read as int32 ids), the
bins pass's `bracket_row` marks the row LEAN and stores
- L: a value at or below every entry of that bin, and
- xf: an x bound with div_rn(x, T) >= L  =>  x >= xf (so the pass never divides).

`lean_collect` (the round kernel's pass for LEAN rows, pass 3): appends the column of every
x >= xf to the row's id list through its atomic counter: one compare per entry, no division,
no exponential, no noise.

`after_lean` (the finish kernel's step for LEAN rows): reads the listed entries back (a
gather), keeps those with l = x / T >= L, which is exactly the upper set {l >= L} of the row; of
those, the entries of the bins above the bracket are all kept (exact int64 mass and Gumbel
winner here), the others are the bracket's candidates, resolved by
`sample_bracket.resolve_keys`: v* from exact masses,
certified by float64(mass above) < p * S <= float64(mass above + candidates' mass). A list that
overflowed, or a bracket that does not certify, starts the exact search (stage HIST) and is
counted in `fallbacks`. Rows resolved here are counted in `leans`.
"""
import triton
import triton.language as tl

from .rng_triton import gumbel_from_bits, uniform_bits
from .sample_bracket import bin_of, resolve_keys, settle, target_of
from .sample_list import list_columns, list_depth, list_group, list_slot_valid
from .sample_scan import fp32_nonan
from .sample_state import CN
from .tlutil import BIG_ID32, NEG_INF, argmax_pair, div_t, mass, order_key, pair_max


@triton.jit
def lean_collect(x_ptr, row_off, start, end, row, xf, ids_ptr, cand_n, BLOCK: tl.constexpr, LCAP: tl.constexpr,
                 LG: tl.constexpr):
    """Pass 3 of a LEAN row's split [start, end): the columns of x >= xf, appended (order does
    not matter) with one atomic per listed entry: no prefix sum over a step's entries, which
    measured slower (89 against 68 us at 256 x 151,936 on an H200)."""
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
               LG: tl.constexpr):
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
    if ok:
        m_above, av, ai, nb = _split_listed(row, depth * LG, cand_n, xrow, t, tl.load(st_lean_l + row),
                                            tl.load(st_hlo + row), tl.load(st_hinv + row), tl.load(st_last + row),
                                            m, scale, one, k0, k1, col_offset, ids_ptr, cand_id, CAP, LCAP, FC,
                                            NBH, EXACT_EXP, LG)
        tl.debug_barrier()     # the candidates' columns are written before they are read
        ok = nb <= CAP
        if ok:
            if nb <= SMALL:
                ok, v, i = _resolve_listed(row, nb, xrow, t, target, m_above, av, ai, m, scale, one, key0_ptr,
                                           key1_ptr, col_offset, cand_id, CAP, SMALL, EXACT_EXP)
            else:
                ok, v, i = _resolve_listed(row, nb, xrow, t, target, m_above, av, ai, m, scale, one, key0_ptr,
                                           key1_ptr, col_offset, cand_id, CAP, CAP, EXACT_EXP)
    if ok:
        tl.atomic_add(leans, 1)
    return settle(row, ok, v, i, raw, col_offset, tkey, m, st_token, st_valid, st_flags, st_tkey, st_klo, st_khi,
                  st_shift, st_cabove, st_mabove, st_piv, fallbacks, P, NB)
