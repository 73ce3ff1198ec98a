"""Per-row state of the `sample_rows` pipeline: stages, flags, and how an exact search starts.

A row moves through stages, each one streaming pass (round_kernel) plus one per-row step
(finish_kernel), until DONE:
- COLLECT: the candidates {eligible, klo <= key <= khi} are gathered; with FAST the window holds
  every token that can be kept, so the finish resolves top-k, top-p and the draw from them.
- HIST: the general exact search. The target threshold (top-k's k-th largest key, or top-p's
  smallest key kappa* with float64(mass of keys > kappa*) < p * S) lies in the key window
  [klo, khi]; count and mass strictly above khi are carried exactly (cabove, mabove). Each pass
  measures the exact count and mass above P pivot keys, which shrinks the window to the span
  between two pivots, and a histogram of the window that places the next pivots at count
  quantiles. Once the window holds <= CAP entries it is collected and resolved exactly.
- DRAW: the masked Gumbel argmax over {key >= tkey}.
- LIST: top-p without top-k: the hist pass (its mass and its list), then the list kernel
  (sample_list.py), which settles most rows (DONE); the others take BINS.
- BINS: the bins pass, whose last program a row makes its bracket (sample_bracket.py): BRACKET
  or LEAN.
- BRACKET: the bracket's third pass (its candidates collected) and their resolution; a row
  whose bracket does not certify starts HIST.
- LEAN: a BINS row with few entries from the bracket up: its third pass only lists columns
  and a per-row step resolves them (sample_lean.py); a row that does not certify starts HIST.
All decisions use exact integers (counts, int64 masses) or keys, so the result is the threshold
of the definition no matter how the search went.
"""
import triton
import triton.language as tl

from .rng_triton import gumbel
from .tlutil import BIG_ID32, KEY_NEG_INF, argmax_pair, key_to_float, order_key

GREEDY, PLAIN, FILTER = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
DONE, COLLECT, DRAW, HIST, BRACKET, LEAN, BINS, LIST = (
    tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3), tl.constexpr(4), tl.constexpr(5),
    tl.constexpr(6), tl.constexpr(7))
PHASE_TOPP, FAST, FIRST = tl.constexpr(2), tl.constexpr(4), tl.constexpr(8)
# int32s between two rows' candidate counters: one 128-byte line each, so the appends of
# different rows never queue on one line (measured on an H200 with one atomic per step: no
# difference either way; kept for the lean pass's one atomic per listed entry)
CN = tl.constexpr(32)


@triton.jit
def zero_counters(cand_n, row):
    """All of the row's counters to 0: the candidates' (word 0) and the lean list's groups
    (`sample_bracket.list_columns`)."""
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
