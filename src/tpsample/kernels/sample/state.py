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
  (lists.py), which settles most rows (DONE); the others take BINS.
- BINS: the bins pass, whose last program a row makes its bracket (bracket.py): BRACKET
  or LEAN.
- BRACKET: the bracket's third pass (its candidates collected) and their resolution; a row
  whose bracket does not certify starts HIST.
- LEAN: a BINS row with few entries from the bracket up: its third pass only lists columns
  and a per-row step resolves them (lists.py); a row that does not certify starts HIST.
All decisions use exact integers (counts, int64 masses) or keys, so the result is the threshold
of the definition no matter how the search went.

Also here: the exact searches over a row's candidate keys (`max_key_with_count`,
`min_key_mass_below`, `min_key_mass_few`), and the host side of the state, the `Workspace`
(one allocation per launch shape, every field written before it is read).
"""
import math

import torch
import triton
import triton.language as tl

from ..config import KernelConfig
from ..tlutil import BIG_ID32, KEY_NEG_INF, argmax_pair, claim_where, gumbel, key_to_float, order_key, store_where

GREEDY, PLAIN, FILTER = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
DONE, COLLECT, DRAW, HIST, BRACKET, LEAN, BINS, LIST = (
    tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3), tl.constexpr(4), tl.constexpr(5),
    tl.constexpr(6), tl.constexpr(7))
PHASE_TOPP, FAST, FIRST = tl.constexpr(2), tl.constexpr(4), tl.constexpr(8)
# int32s between two rows' candidate counters: one 128-byte line each, so the appends of
# different rows never queue on one line (measured on an H200 with one atomic per step: no
# difference either way; kept for the lean pass's one atomic per listed entry)
CN = tl.constexpr(32)
# keys the search for v* settles at once, pairwise (`min_key_mass_few`), and the int32
# words of its scratch (2 * FEW + 1 int64 words) at the start of a row's hist words
SEARCH_FEW = 32
SCRATCH_WORDS = 4 * SEARCH_FEW + 2
FEW = tl.constexpr(SEARCH_FEW)
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
def bisection_steps(d):
    """The halvings that take an integer interval of size d >= 1 down to 1: d's bit length (exact
    through float64 for d < 2**53), as int32; 33, the full key range's count, when d < 1."""
    e = (d.to(tl.float64).to(tl.int64, bitcast=True) >> 52) & 0x7FF
    return tl.where(d >= 1, e - 1022, 33).to(tl.int32)


@triton.jit
def max_key_with_count(keys, valid, k):
    """Largest key kappa with #(valid keys >= kappa) >= k, by bisection (keys int64 in [0, 2**32);
    the caller ensures at least k valid keys). The search starts from the valid keys' own range
    and takes only the steps it needs (the same kappa as over [0, 2**32): it is the k-th largest
    key), else from the whole range."""
    kmin = tl.min(tl.where(valid, keys, 1 << 32), axis=0)
    kmax = tl.max(tl.where(valid, keys, -1), axis=0)
    narrow = (k >= 1) & (tl.sum(valid.to(tl.int32), axis=0) >= k)
    lo = tl.where(narrow, kmin, 0)
    hi = tl.where(narrow, kmax + 1, 1 << 32)
    for _ in range(bisection_steps(hi - lo)):    # a fixed count: a reduction inside a while loop raced on Triton 3.6
        mid = (lo + hi) >> 1
        ok = tl.sum((valid & (keys >= mid)).to(tl.int32), axis=0) >= k
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return lo


@triton.jit
def min_key_mass_below(keys, e, base, target, lo, hi):
    """Smallest kappa in (lo, hi] with float64(base + sum(e where keys > kappa)) < target, by
    bisection; the caller ensures it holds at hi and fails at lo (masses int64, exact sums). It
    takes the bit length of hi - lo steps (a bracket's candidates span a few bins: ~15 instead of
    the full key range's 33), after which lo + 1 == hi."""
    for _ in range(bisection_steps(hi - lo)):
        mid = (lo + hi) >> 1
        ok = (base + tl.sum(tl.where(keys > mid, e, 0), axis=0)).to(tl.float64) < target
        hi = tl.where(ok, mid, hi)
        lo = tl.where(ok, lo, mid)
    return hi


@triton.jit
def min_key_mass_few(keys, e, base, target, lo, hi, n_lo, scratch, FEW: tl.constexpr, PTX: tl.constexpr):
    """`min_key_mass_below`'s kappa (the same value) in fewer reductions, for keys int64 in
    [0, 2**32) with -1 for a non-candidate (e 0 there) and none above hi; n_lo = #(keys > lo).
    It bisects only while more than FEW keys lie in (lo, hi] (a count beside each step's mass),
    then settles kappa among those keys at once: kappa is the smallest of them, c, with
    float64(f(c)) < target, f(c) = f(hi) + the mass of those above c (the largest one passes, as
    f(hi) does; there is one, as f(hi) < target <= f(lo)). They are gathered in `scratch`
    (2 * FEW + 1 int64 words of the program's, free once every warp has passed the caller's last
    reduction) through a counter there (`claim_where` and `store_where`, PTX as there: Triton's
    own scattered int64 stores took the list kernel from 153 to 220 registers a thread). Rows
    whose candidates crowd one key range (ties) bisect to lo + 1 == hi as before."""
    f_hi = base
    n_hi = tl.zeros((), tl.int32)
    for _ in range(bisection_steps(hi - lo)):    # a fixed count (see `max_key_with_count`)
        if n_lo - n_hi > FEW:
            mid = (lo + hi) >> 1
            above = keys > mid
            f = base + tl.sum(tl.where(above, e, 0), axis=0)
            n = tl.sum(above.to(tl.int32), axis=0)
            ok = f.to(tl.float64) < target
            hi = tl.where(ok, mid, hi)
            f_hi = tl.where(ok, f, f_hi)
            n_hi = tl.where(ok, n, n_hi)
            lo = tl.where(ok, lo, mid)
            n_lo = tl.where(ok, n_lo, n)
    thr = hi
    if hi - lo > 1:
        n = n_lo - n_hi
        inb = (keys > lo) & (keys <= hi)
        counter = (scratch + 2 * FEW).to(tl.pointer_type(tl.int32))
        tl.store(counter, 0)
        tl.debug_barrier()       # (and every warp is past the caller's reads of the scratch)
        pos = claim_where(counter + tl.zeros_like(inb.to(tl.int32)), inb, PTX)
        store_where(scratch, pos, keys, inb, PTX)
        store_where(scratch + FEW, pos, e, inb, PTX)
        tl.debug_barrier()
        j = tl.arange(0, FEW)
        cj = tl.load(scratch + j, mask=j < n, other=-1)
        ej = tl.load(scratch + FEW + j, mask=j < n, other=0)
        f = f_hi + tl.sum(tl.where(cj[None, :] > cj[:, None], ej[None, :], 0), axis=1)
        good = (j < n) & (f.to(tl.float64) < target)
        thr = tl.min(tl.where(good, cj, hi), axis=0)
    return thr


class Workspace:
    """Per-call buffers carved from one allocation (one allocator call, no memsets: every field
    is written before it is read). Fields are [rows] unless noted; see the module docstring."""

    def __init__(self, rows: int, splits: int, nblk: int, cfg: KernelConfig, dev):
        f32, i32, i64 = torch.float32, torch.int32, torch.int64
        n = rows * splits
        fields = [("raw_v", n, f32), ("raw_i", n, i32), ("max", n, f32), ("best_v", n, f32), ("best_i", n, i32),
                  ("nans", n, i32), ("bmax", (rows, nblk), f32),
                  ("stage", rows, i32), ("flags", rows, i32),
                  ("raw", rows, i32), ("m", rows, f32), ("t1", rows, f32), ("tkey", rows, i64), ("klo", rows, i64),
                  ("khi", rows, i64), ("shift", rows, i32), ("cabove", rows, i64), ("mabove", rows, i64),
                  ("S", rows, i64), ("piv", (rows, cfg.pivots), i64), ("cand_key", (rows, cfg.cap), i64),
                  ("cand_id", (rows, cfg.cap), i32), ("cand_n", rows * CN_STRIDE, i32), ("p_cnt", n, i64),
                  ("p_mass", n, i64),
                  ("p_cgt", (n, cfg.pivots), i64), ("p_mgt", (n, cfg.pivots), i64), ("p_hist", (n, cfg.bins), i32),
                  ("pending", 1, i32), ("hlo", rows, f32), ("hinv", rows, f32), ("hist", (rows, hist_width(cfg)), i32),
                  ("bfirst", rows, i32), ("blast", rows, i32), ("bcount", rows, i32), ("lean_l", rows, f32),
                  ("xf", rows, f32), ("arrive", rows, i32), ("top_bin", rows, i32), ("top_mass", rows, i64),
                  ("sig_lo", n, f32), ("sig_hi", n, f32), ("sig_sums", (n, 3), i64), ("sig_top", rows, f32),
                  ("sig_scale", rows, torch.float64)]
        sizes = [math.prod(sh if isinstance(sh, tuple) else (sh,)) * dt.itemsize for _, sh, dt in fields]
        offsets, total = [], 0
        for b in sizes:
            offsets.append(total)
            total += (b + 255) // 256 * 256          # 256-byte aligned views: no re-specialisation
        self.buffer = torch.empty(total, dtype=torch.uint8, device=dev)
        for (name, shape, dt), off, b in zip(fields, offsets, sizes):
            setattr(self, name, self.buffer[off:off + b].view(dt).view(shape))
        self.cand_ids = self.cand_key.view(i32)       # a LEAN row's column list: [rows, 2 * cap] int32
        self.nbytes = total

    def state(self, token, valid):
        return (self.stage, self.flags, token, valid, self.raw, self.m, self.t1, self.tkey,
                self.klo, self.khi, self.shift, self.cabove, self.mabove, self.S, self.piv)


def hist_width(cfg: KernelConfig) -> int:
    """int32 words a row of the workspace's `hist`: the top-p list's x (2 * cap, until the list
    kernel has read them; then the first SCRATCH_WORDS are its search's scratch), then the
    bracket's bins (hist_bins). Even, so a row's words start 8-byte aligned."""
    return max(cfg.hist_bins, 2 * cfg.cap, SCRATCH_WORDS)
