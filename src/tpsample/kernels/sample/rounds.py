"""The streaming passes after the scan of `sample_rows`, and the drain; what each row does is its stage.

round_kernel, grid (rows, splits), one read of the row split, by stage:
- COLLECT: append every eligible entry whose key lies in the window [klo, khi] to the row's
  candidate list (key, column) through an atomic counter (order does not matter: the finish
  sorts).
- HIST: over eligible entries inside the window only (blocks without one skip all work):
  their count and mass, count and mass strictly above each pivot key, and a count histogram
  of (key - klo) >> shift, which places the next pivots.
- DRAW: argmax of l + g over kept entries (key >= tkey), ties -> lowest column; the noise is
  computed only in blocks where an entry's bound (see scan's may_win) reaches the best so far.
- BRACKET: the bracket's candidates, and the mass and winner of the entries above it
  (bracket.py); nothing when the bracket holds more than CAP entries.
- LEAN: the columns of x >= the row's x bound, listed (lists.py).
Loads run one block ahead (software prefetch).
Eligible means l > -inf and key >= tkey. Keys are `order_key(l)`, so key order is value order.

drain_kernel, grid (rows,), finishes in one launch every row the first round left searching: one
program per row runs the row's remaining rounds back to back (each split's pass of `round_body`,
then `finish.finish_body`) until the row is DONE, so `sample_rows` never has to ask the host
whether another round is needed: no device-to-host read, no synchronisation, and the launch
sequence is fixed (CUDA-graph capturable). Rows already DONE return at once. A row's later
rounds read the row once per pass from one program, which is slower than the multi-program
rounds for a single row but needs no host round trip; only rows whose candidates overflowed or
whose top-p bracket did not certify (large top-k, pathological ties) get here.
"""
import triton
import triton.language as tl

from ..tlutil import (
    BIG_ID32,
    KEY_POS_INF,
    NEG_INF,
    argmax_pair,
    div_t,
    gumbel_from_bits,
    key_to_float,
    mass,
    may_win,
    order_key,
    pair_max,
    uniform_bits,
)
from .bracket import collect_bracket
from .finish import finish_body
from .lists import lean_collect
from .scan import BRACKET, COLLECT, DONE, DRAW, HIST, LEAN, PHASE_TOPP, append_candidates, fp32_nonan


@triton.jit
def _collect(x_ptr, row_off, t, start, end, row, tkey, klo, khi, cand_key, cand_id, cand_n,
             CAP: tl.constexpr, BLOCK: tl.constexpr):
    w_lo = key_to_float(tl.maximum(klo, tkey))
    inf_key = tl.full((), KEY_POS_INF, tl.int64)
    w_hi = key_to_float(tl.minimum(khi + 1, inf_key))     # key <= khi <=> l < v(khi + 1)
    no_hi = khi >= inf_key
    offs = tl.arange(0, BLOCK)
    xr = tl.load(x_ptr + row_off + start + offs, mask=start + offs < end, other=NEG_INF)
    for s in range(start, end, BLOCK):
        cols = s + offs
        xr_next = tl.load(x_ptr + row_off + cols + BLOCK, mask=cols + BLOCK < end, other=NEG_INF)
        l = div_t(fp32_nonan(xr), t)
        xr = xr_next
        sel = (l >= w_lo) & tl.where(no_hi, l >= NEG_INF, l < w_hi)     # klo <= key <= khi, as value bounds
        append_candidates(sel, l, cols, row, cand_key, cand_id, cand_n, CAP)


@triton.jit
def _hist(x_ptr, row_off, t, start, end, tkey, klo, khi, shift, piv, m, scale, one, with_mass,
          P: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr, EXACT_EXP: tl.constexpr):
    cnt = tl.zeros((), tl.int64)
    msum = tl.zeros((), tl.int64)
    cgt = tl.zeros((P,), tl.int64)
    mgt = tl.zeros((P,), tl.int64)
    hist = tl.zeros((NB,), tl.int32)
    offs = tl.arange(0, BLOCK)
    xr = tl.load(x_ptr + row_off + start + offs, mask=start + offs < end, other=NEG_INF)
    for s in range(start, end, BLOCK):
        cols = s + offs
        xr_next = tl.load(x_ptr + row_off + cols + BLOCK, mask=cols + BLOCK < end, other=NEG_INF)
        l = div_t(fp32_nonan(xr), t)
        xr = xr_next
        key = order_key(l).to(tl.int64)
        win = (l > NEG_INF) & (key >= tkey) & (key >= klo) & (key <= khi)
        if tl.sum(win.to(tl.int32), axis=0) > 0:
            e = tl.zeros((BLOCK,), tl.int64)
            if with_mass:
                e = tl.where(win, mass(l, m, scale, one, EXACT_EXP), 0)
            cnt += tl.sum(win.to(tl.int64), axis=0)
            msum += tl.sum(e, axis=0)
            gt = win[:, None] & (key[:, None] > piv[None, :])
            cgt += tl.sum(gt.to(tl.int64), axis=0)
            mgt += tl.sum(tl.where(gt, e[:, None], 0), axis=0)
            b = tl.minimum((key - klo) >> shift, NB - 1).to(tl.int32)
            # masked lanes land in bin 0 and are taken out again (no `mask=`: Triton 3.6 safe)
            nout = BLOCK - tl.sum(win.to(tl.int32), axis=0)
            hist += tl.histogram(tl.where(win, b, 0), NB) - tl.where(tl.arange(0, NB) == 0, nout, 0)
    return cnt, msum, cgt, mgt, hist


@triton.jit
def _draw(x_ptr, row_off, t, start, end, tkey, k0, k1, col_offset, BLOCK: tl.constexpr):
    best_v = tl.full((), NEG_INF, tl.float32)
    best_i = tl.full((), BIG_ID32, tl.int32)
    t_lo = key_to_float(tkey)
    offs = tl.arange(0, BLOCK)
    xr = tl.load(x_ptr + row_off + start + offs, mask=start + offs < end, other=NEG_INF)
    for s in range(start, end, BLOCK):
        cols = s + offs
        xr_next = tl.load(x_ptr + row_off + cols + BLOCK, mask=cols + BLOCK < end, other=NEG_INF)
        l = div_t(fp32_nonan(xr), t)
        xr = xr_next
        kept = l >= t_lo                  # key >= tkey, as a value bound (tkey > key(-inf))
        if tl.max(kept.to(tl.int32), axis=0) > 0:
            u = uniform_bits(k0, k1, cols + col_offset)
            cand = kept & may_win(l, u, best_v)      # only these can beat the best so far
            if tl.max(cand.to(tl.int32), axis=0) > 0:
                v, i = argmax_pair(tl.where(cand, l + gumbel_from_bits(u), NEG_INF), cols)
                best_v, best_i = pair_max(best_v, best_i, v, i)
    return best_v, best_i


@triton.jit
def _bracket_pass(row, part, x_ptr, row_off, t, start, end, key0_ptr, key1_ptr, col_offset, scale, m,
                  st_hlo, st_hinv, st_first, st_last, st_count, cand_key, cand_id, cand_n, p_best_v, p_best_i, p_cnt,
                  BLOCK: tl.constexpr, CAP: tl.constexpr, NBH: tl.constexpr, EXACT_EXP: tl.constexpr):
    if tl.load(st_count + row) <= CAP:
        k0 = tl.load(key0_ptr + row).to(tl.uint32)
        k1 = tl.load(key1_ptr + row).to(tl.uint32)
        m_above, v, i = collect_bracket(x_ptr, row_off, t, start, end, row, tl.load(st_hlo + row),
                                        tl.load(st_hinv + row), tl.load(st_first + row), tl.load(st_last + row), m,
                                        scale, k0, k1, col_offset, cand_key, cand_id, cand_n, CAP, BLOCK, NBH,
                                        EXACT_EXP)
        tl.store(p_cnt + part, m_above)
        tl.store(p_best_v + part, v)
        tl.store(p_best_i + part, i)


@triton.jit
def round_body(row, split, x_ptr, stride, ncols, t_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
               st_stage, st_flags, st_m, st_tkey, st_klo, st_khi, st_shift, st_piv,
               cand_key, cand_id, cand_n, p_best_v, p_best_i, p_cnt, p_mass, p_cgt, p_mgt, p_hist,
               st_hlo, st_hinv, st_first, st_last, st_count, st_xf, ids_ptr,
               NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
               P: tl.constexpr, NB: tl.constexpr, EXACT_EXP: tl.constexpr, STAGES: tl.constexpr,
               NBH: tl.constexpr, LCAP: tl.constexpr, LEAN_BLOCK: tl.constexpr,
               LG: tl.constexpr):
    """One split's pass of one row, by the row's stage (nothing for DONE rows)."""
    stage = tl.load(st_stage + row)
    if stage != 0:
        part = row * NSPLIT + split
        start = split * CHUNK
        end = tl.minimum(start + CHUNK, ncols)
        row_off = row.to(tl.int64) * stride
        t = tl.load(t_ptr + row)
        tkey = tl.load(st_tkey + row)
        flags = tl.load(st_flags + row)
        m = tl.load(st_m + row)
        if ((STAGES & 1) != 0) & (stage == COLLECT):
            _collect(x_ptr, row_off, t, start, end, row, tkey, tl.load(st_klo + row), tl.load(st_khi + row),
                     cand_key, cand_id, cand_n, CAP, BLOCK)
        if ((STAGES & 2) != 0) & (stage == DRAW):
            k0 = tl.load(key0_ptr + row).to(tl.uint32)
            k1 = tl.load(key1_ptr + row).to(tl.uint32)
            v, i = _draw(x_ptr, row_off, t, start, end, tkey, k0, k1, col_offset, BLOCK)
            tl.store(p_best_v + part, v)
            tl.store(p_best_i + part, i)
        if ((STAGES & 4) != 0) & (stage == HIST):
            piv = tl.load(st_piv + row * P + tl.arange(0, P))
            cnt, msum, cgt, mgt, hist = _hist(x_ptr, row_off, t, start, end, tkey, tl.load(st_klo + row),
                                              tl.load(st_khi + row), tl.load(st_shift + row), piv, m,
                                              scale, one, (flags & PHASE_TOPP) != 0, P, NB, BLOCK, EXACT_EXP)
            tl.store(p_cnt + part, cnt)
            tl.store(p_mass + part, msum)
            tl.store(p_cgt + part * P + tl.arange(0, P), cgt)
            tl.store(p_mgt + part * P + tl.arange(0, P), mgt)
            tl.store(p_hist + part * NB + tl.arange(0, NB), hist)
        if ((STAGES & 8) != 0) & (stage == BRACKET):
            _bracket_pass(row, part, x_ptr, row_off, t, start, end, key0_ptr, key1_ptr, col_offset, scale, m,
                          st_hlo, st_hinv, st_first, st_last, st_count, cand_key, cand_id, cand_n, p_best_v, p_best_i,
                          p_cnt, BLOCK, CAP, NBH, EXACT_EXP)
        if ((STAGES & 8) != 0) & (stage == LEAN):
            lean_collect(x_ptr, row_off, start, end, row, tl.load(st_xf + row), ids_ptr, cand_n, LEAN_BLOCK, LCAP,
                         LG)


@triton.jit(do_not_specialize=["col_offset"])
def round_kernel(x_ptr, stride, ncols, t_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
                 st_stage, st_flags, st_m, st_tkey, st_klo, st_khi, st_shift, st_piv,
                 cand_key, cand_id, cand_n,
                 p_best_v, p_best_i, p_cnt, p_mass, p_cgt, p_mgt, p_hist, pending, st_hlo, st_hinv, st_first,
                 st_last, st_count, st_xf, ids_ptr,
                 NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
                 P: tl.constexpr, NB: tl.constexpr, EXACT_EXP: tl.constexpr, STAGES: tl.constexpr,
                 NBH: tl.constexpr, LCAP: tl.constexpr, LEAN_BLOCK: tl.constexpr, LG: tl.constexpr):
    """STAGES: bitmask of the stages compiled in (1 COLLECT, 2 DRAW, 4 HIST, 8 BRACKET and LEAN); the
    first round leaves HIST out (rows there wait a round), which keeps that variant's registers
    low."""
    row = tl.program_id(0)
    if (row == 0) & (tl.program_id(1) == 0):
        tl.store(pending, 0)             # finish_kernel counts the rows still searching
    round_body(row, tl.program_id(1), x_ptr, stride, ncols, t_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
               st_stage, st_flags, st_m, st_tkey, st_klo, st_khi, st_shift, st_piv,
               cand_key, cand_id, cand_n, p_best_v, p_best_i, p_cnt, p_mass, p_cgt, p_mgt, p_hist,
               st_hlo, st_hinv, st_first, st_last, st_count, st_xf, ids_ptr, NSPLIT, CHUNK, BLOCK, CAP, P, NB,
               EXACT_EXP, STAGES, NBH, LCAP, LEAN_BLOCK, LG)


@triton.jit(do_not_specialize=["col_offset"])
def drain_kernel(x_ptr, stride, ncols, t_ptr, k_ptr, p_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
                 st_stage, st_flags, st_token, st_valid, st_raw, st_m, st_t1, st_tkey, st_klo, st_khi, st_shift,
                 st_cabove, st_mabove, st_S, st_piv, cand_key, cand_id, cand_n,
                 p_best_v, p_best_i, p_cnt, p_mass, p_cgt, p_mgt, p_hist, st_hlo, st_hinv, st_first, st_last, st_count,
                 fallbacks, st_xf, st_lean_l, ids_ptr, leans,
                 NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
                 SMALL: tl.constexpr, P: tl.constexpr, NB: tl.constexpr, EXACT_EXP: tl.constexpr,
                 MAX_ROUNDS: tl.constexpr, NBH: tl.constexpr, KEPT: tl.constexpr):
    """Stages 1-4 only (COLLECT, DRAW, HIST): BRACKET and LEAN rows are settled by the first
    round's finish (DONE, or HIST when they fall back). KEPT: as `finish.finish_body`'s."""
    row = tl.program_id(0)
    stage = tl.load(st_stage + row)
    it = 0
    while (stage != DONE) & (it < MAX_ROUNDS):
        for split in range(NSPLIT):
            round_body(row, split, x_ptr, stride, ncols, t_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
                       st_stage, st_flags, st_m, st_tkey, st_klo, st_khi, st_shift, st_piv,
                       cand_key, cand_id, cand_n, p_best_v, p_best_i, p_cnt, p_mass, p_cgt, p_mgt, p_hist,
                       st_hlo, st_hinv, st_first, st_last, st_count, st_xf, ids_ptr, NSPLIT, CHUNK, BLOCK, CAP, P, NB,
                       EXACT_EXP, 7, NBH, 1, BLOCK, 1)
        tl.debug_barrier()
        stage = finish_body(row, ncols, k_ptr, p_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
                            st_stage, st_flags, st_token, st_valid, st_raw, st_m, st_t1, st_tkey, st_klo, st_khi,
                            st_shift, st_cabove, st_mabove, st_S, st_piv, cand_key, cand_id, cand_n,
                            p_best_v, p_best_i, p_cnt, p_mass, p_cgt, p_mgt, p_hist, st_count, fallbacks,
                            x_ptr, stride, t_ptr, st_hlo, st_hinv, st_last, st_lean_l, ids_ptr, leans,
                            NSPLIT, CAP, SMALL, P, NB, EXACT_EXP, 7, 1, 16, NBH, 1, KEPT)
        tl.debug_barrier()
        it += 1
    if stage != DONE:        # cannot happen (the search narrows every round); flag, never hang
        tl.store(st_token + row, tl.load(st_raw + row).to(tl.int64) + col_offset)
        tl.store(st_valid + row, False)
