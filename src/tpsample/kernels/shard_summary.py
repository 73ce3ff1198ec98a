"""Round 1's summary passes over a rank's shard under vocab_parallel: `top_values` and
`tie_counts`. Contracts: `kernels.shard`'s docstring.

`top_values` (k = min(c, cols) values a row) runs in four launches, none of which reads a whole
row in one program:
1. block maxima (grid rows x splits): the max of fp32(x), NaN as -inf, of every block of B
   columns.
2. the bound (a program a row, on the block maxima only): L, the k-th largest block maximum,
   found by a radix select (`_kth_key`: histograms of bits 21-31, 10-20 and 0-9 of the order
   keys), or -inf when the row has fewer than k blocks. The k blocks with the largest maxima
   hold k entries >= L, so the top k values are all >= L; fewer than k blocks have a maximum
   > L, so fewer than k * B entries are > L (all of them, when the row has fewer than k blocks).
3. candidates (grid rows x splits): the entries > L, appended to the row's list of (k - 1) * B
   slots through an atomic counter (the list is sorted after, so its order does not matter); a
   step whose blocks all have their maximum <= L is not read.
4. the values (a program a row): with n candidates, the top k are the k largest candidates
   when n >= k, else the n candidates and L repeated k - n times (at least k entries are >= L).
   A list of at most `sort_size(c)` entries is sorted in one block; a longer one goes through
   `_kth_key` and the entries above its k-th key are listed, padded with it and sorted.
B is the largest power of two up to 256 whose workspace ((k - 1) * B candidates and cols / B
block maxima) stays within `WORKSPACE` bytes a row (`block_size`). Division by T > 0 is
monotone, so the selection runs on x and only the c values are divided.
`tie_counts` is one counting read.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..numerics import next_pow2
from .config import DEFAULT, KernelConfig, num_splits
from .launcher import Launcher, cdiv, stream_scratch
from .shard import check_shard, load_l, row_divisor
from .stats import split_shape
from .tlutil import NEG_INF, chunk_bounds, div_t, key_to_float, order_key

MAX_TOP = 2048              # the largest c of `top_values` (one sorted block of a program)
WORKSPACE = 64 * 1024       # bytes a row `top_values` aims to stay within (candidates and block maxima)
MAX_BLOCK = 256             # the largest block B of the block maxima


@triton.jit
def _key_hist(xrow, ncols, prefix, SHIFT: tl.constexpr, MATCH: tl.constexpr, DIG: tl.constexpr,
              BLOCK: tl.constexpr):
    """Histogram of digit (key >> SHIFT) % DIG over the row's entries whose key agrees with
    `prefix` from bit MATCH up (MATCH 32: every entry)."""
    hist = tl.zeros((DIG,), tl.int32)
    for s in range(0, ncols, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        ok = cols < ncols
        key = order_key(load_l(xrow, 0, cols, ok, 1.0, False))
        if MATCH < 32:
            ok = ok & ((key >> MATCH) == (prefix >> MATCH))
        # the others counted in bin 0 and taken out again (no `mask`: Triton 3.6 has none)
        digit = tl.where(ok, ((key >> SHIFT) & (DIG - 1)).to(tl.int32), 0)
        out = BLOCK - tl.sum(ok.to(tl.int32), axis=0)
        hist += tl.histogram(digit, DIG) - tl.where(tl.arange(0, DIG) == 0, out, 0)
    return hist


@triton.jit
def _pick_digit(hist, need, DIG: tl.constexpr):
    """(d, above): the largest digit d with at least `need` entries at digits >= d, and the
    entries at digits > d."""
    digits = tl.arange(0, DIG)
    at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    d = tl.max(tl.where(at_or_above >= need, digits, 0), axis=0)
    return d, tl.sum(tl.where(digits == d, at_or_above - hist, 0), axis=0)


@triton.jit
def _kth_key(xrow, ncols, k, BLOCK: tl.constexpr):
    """(key, above): the k-th largest order key of the row's ncols values (1 <= k <= ncols) and
    the number of entries strictly above it. Bits 21-31, then 10-20, then 0-9; `need` counts
    down the entries of the top k still to place at or below the digits fixed so far."""
    d, above = _pick_digit(_key_hist(xrow, ncols, 0, 21, 32, 2048, BLOCK), k, 2048)
    prefix = d.to(tl.uint32) << 21
    need = k - above
    d, above = _pick_digit(_key_hist(xrow, ncols, prefix, 10, 21, 2048, BLOCK), need, 2048)
    prefix = prefix | (d.to(tl.uint32) << 10)
    need -= above
    d, above = _pick_digit(_key_hist(xrow, ncols, prefix, 0, 10, 1024, BLOCK), need, 1024)
    return prefix | d.to(tl.uint32), k - (need - above)


@triton.jit
def _block_max_kernel(x_ptr, stride, ncols, bmax_ptr, nblocks, CHUNK: tl.constexpr, STEP: tl.constexpr,
                      B: tl.constexpr):
    row = tl.program_id(0)
    start, end = chunk_bounds(ncols, CHUNK)
    xrow = x_ptr + row.to(tl.int64) * stride
    brow = bmax_ptr + row.to(tl.int64) * nblocks
    sub = tl.arange(0, STEP // B)
    for s in range(start, end, STEP):
        cols = s + sub[:, None] * B + tl.arange(0, B)[None, :]
        m = tl.max(load_l(xrow, 0, cols, cols < end, 1.0, False), axis=1)
        tl.store(brow + s // B + sub, m, mask=s // B + sub < nblocks)


@triton.jit
def _bound_kernel(bmax_ptr, nblocks, k, bound_ptr, count_ptr, BOUNDED: tl.constexpr, BLOCK: tl.constexpr):
    """L (-inf unless BOUNDED: the row has at least k blocks) and a zero candidate count."""
    row = tl.program_id(0)
    if BOUNDED:
        key, _ = _kth_key(bmax_ptr + row.to(tl.int64) * nblocks, nblocks, k, BLOCK)
        tl.store(bound_ptr + row, key_to_float(key))
    else:
        tl.store(bound_ptr + row, NEG_INF)
    tl.store(count_ptr + row, 0)


@triton.jit
def _candidates_kernel(x_ptr, stride, ncols, bmax_ptr, nblocks, bound_ptr, cand_ptr, count_ptr, capacity,
                       CHUNK: tl.constexpr, STEP: tl.constexpr, B: tl.constexpr):
    row = tl.program_id(0)
    start, end = chunk_bounds(ncols, CHUNK)
    xrow = x_ptr + row.to(tl.int64) * stride
    brow = bmax_ptr + row.to(tl.int64) * nblocks
    crow = cand_ptr + row.to(tl.int64) * capacity
    bound = tl.load(bound_ptr + row)
    sub = tl.arange(0, STEP // B)
    for s in range(start, end, STEP):
        blocks = s // B + sub
        if tl.max(tl.load(brow + blocks, mask=blocks < nblocks, other=NEG_INF), axis=0) > bound:
            cols = s + tl.arange(0, STEP)
            x = load_l(xrow, 0, cols, cols < end, 1.0, False)
            sel = (x > bound).to(tl.int32)
            base = tl.atomic_add(count_ptr + row, tl.sum(sel, axis=0))
            tl.store(crow + base + tl.cumsum(sel, axis=0) - 1, x, mask=sel > 0)


@triton.jit
def _store_sorted(orow, slot, v, c, t, HAS_T: tl.constexpr):
    """Slots < c of v divided by t (HAS_T), zeros as +0.0, sorted descending (slot: v's indices)."""
    if HAS_T:
        v = div_t(v, t)
    v = tl.sort(tl.where(v == 0.0, 0.0, v), descending=True)
    tl.debug_barrier()                      # v may have been loaded from the out row
    tl.store(orow + slot, v, mask=slot < c)


@triton.jit
def _values_kernel(cand_ptr, capacity, count_ptr, bound_ptr, k, t_ptr, out_ptr, c, NP: tl.constexpr,
                   CP: tl.constexpr, BLOCK: tl.constexpr, HAS_T: tl.constexpr):
    row = tl.program_id(0)
    crow = cand_ptr + row.to(tl.int64) * capacity
    orow = out_ptr + row.to(tl.int64) * c
    t = row_divisor(t_ptr, row, HAS_T)
    n = tl.load(count_ptr + row)
    if n <= NP:                             # NP >= c >= k: room for the padding with L
        slot = tl.arange(0, NP)
        v = tl.load(crow + slot, mask=slot < n, other=NEG_INF)
        v = tl.where(slot < n, v, tl.where(slot < k, tl.load(bound_ptr + row), NEG_INF))
        _store_sorted(orow, slot, v, c, t, HAS_T)
    else:                                   # n > k: the k largest candidates
        kth, above = _kth_key(crow, n, k, BLOCK)
        listed = tl.zeros((), tl.int32)
        for s in range(0, n, BLOCK):
            cols = s + tl.arange(0, BLOCK)
            x = tl.load(crow + cols, mask=cols < n, other=NEG_INF)
            sel = (order_key(x) > kth) & (cols < n)
            tl.store(orow + listed + tl.cumsum(sel.to(tl.int32), axis=0) - 1, x, mask=sel)
            listed += tl.sum(sel.to(tl.int32), axis=0)
        tl.debug_barrier()                  # the list's stores, visible to every thread's load
        slot = tl.arange(0, CP)
        v = tl.load(orow + slot, mask=slot < above, other=NEG_INF)
        v = tl.where(slot < above, v, tl.where(slot < k, key_to_float(kth), NEG_INF))
        _store_sorted(orow, slot, v, c, t, HAS_T)


_BLOCK_MAX = Launcher(_block_max_kernel)
_BOUND = Launcher(_bound_kernel)
_CANDIDATES = Launcher(_candidates_kernel)
_VALUES = Launcher(_values_kernel)


def block_size(k: int, cols: int, most: int = MAX_BLOCK) -> int:
    """B: the largest power of two in [8, most] whose workspace a row, (k - 1) * B candidates and
    ceil(cols / B) block maxima in fp32, fits `WORKSPACE`; where none does, the one with the
    smallest workspace (large k on long rows)."""
    sizes = [1 << e for e in range(max(3, (most.bit_length() - 1)), 2, -1)]
    need = {b: 4 * ((k - 1) * b + cdiv(cols, b)) for b in sizes}
    return next((b for b in sizes if need[b] <= WORKSPACE), min(sizes, key=need.get))


def sort_size(c: int) -> int:
    """Candidates a row that the values kernel sorts in one block (more take the radix select):
    twice the next power of two of c (at least 128), or that power itself from 2,048 up."""
    cp = next_pow2(c)
    return cp if cp >= 2048 else max(128, 2 * cp)


def top_values(x: torch.Tensor, c: int, temperature: torch.Tensor | None = None, cfg: KernelConfig = DEFAULT):
    """[R, c] fp32, the c largest values of l per row, descending, -inf padded (module docstring)."""
    check_shard(x)
    if not 1 <= c <= MAX_TOP:
        raise ValueError(f"c (values per row) must be in [1, {MAX_TOP}], got {c}")
    rows, cols = x.shape
    out = torch.empty((rows, c), dtype=torch.float32, device=x.device)
    if not rows:
        return out
    dev, k = x.device, min(c, cols)
    b = block_size(k, cols, min(MAX_BLOCK, cfg.block))
    step = max(2 * b, 2 * cfg.block)        # at least two blocks a step
    splits = max(1, min(num_splits(rows, cols, dev, cfg), cdiv(cols, step)))
    chunk = cdiv(cdiv(cols, splits), step) * step
    nblocks, capacity = max(1, cdiv(cols, b)), max(1, (k - 1) * b)
    bmax, bound, count, cand = stream_scratch(dev, ("top_values", rows, nblocks, capacity), lambda: (
        torch.empty(rows * nblocks, dtype=torch.float32, device=dev), torch.empty(rows, dtype=torch.float32, device=dev),
        torch.empty(rows, dtype=torch.int32, device=dev), torch.empty(rows * capacity, dtype=torch.float32, device=dev)))
    t = temperature.to(dev, torch.float32).contiguous() if temperature is not None else out
    _BLOCK_MAX((rows, splits), x, x.stride(0), cols, bmax, nblocks, CHUNK=chunk, STEP=step, B=b,
               num_warps=cfg.num_warps)
    _BOUND((rows,), bmax, nblocks, k, bound, count, BOUNDED=0 < k <= cdiv(cols, b), BLOCK=1024, num_warps=4)
    _CANDIDATES((rows, splits), x, x.stride(0), cols, bmax, nblocks, bound, cand, count, capacity, CHUNK=chunk,
                STEP=step, B=b, num_warps=cfg.num_warps)
    _VALUES((rows,), cand, capacity, count, bound, k, t, out, c, NP=sort_size(c), CP=next_pow2(c), BLOCK=1024,
            HAS_T=temperature is not None, num_warps=4)
    return out


@triton.jit
def _ties_kernel(x_ptr, stride, ncols, t_ptr, last_ptr, n_ptr, NSPLIT: tl.constexpr, CHUNK: tl.constexpr,
                 BLOCK: tl.constexpr, HAS_T: tl.constexpr):
    row = tl.program_id(0)
    start, end = chunk_bounds(ncols, CHUNK)
    row_off = row.to(tl.int64) * stride
    t = row_divisor(t_ptr, row, HAS_T)
    last = tl.load(last_ptr + row)
    n = tl.zeros((), tl.int32)
    for s in range(start, end, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        ok = cols < end
        n += tl.sum((ok & (load_l(x_ptr, row_off, cols, ok, t, HAS_T) >= last)).to(tl.int32), axis=0)
    tl.store(n_ptr + row * NSPLIT + tl.program_id(1), n)


@triton.jit
def _ties_combine_kernel(n_ptr, last_ptr, c, out_ptr, NSPLIT: tl.constexpr):
    row = tl.program_id(0)
    ge = tl.sum(tl.load(n_ptr + row * NSPLIT + tl.arange(0, NSPLIT)).to(tl.int64), axis=0)
    beyond = tl.where(tl.load(last_ptr + row) > NEG_INF, ge - c, 0)
    tl.store(out_ptr + row, tl.maximum(beyond, 0))


_TIES = Launcher(_ties_kernel)
_TIES_COMBINE = Launcher(_ties_combine_kernel)


def tie_counts(x: torch.Tensor, last: torch.Tensor, c: int, temperature: torch.Tensor | None = None,
               cfg: KernelConfig = DEFAULT) -> torch.Tensor:
    """[R] int64: entries of l >= last beyond c, 0 where last is -inf (module docstring)."""
    check_shard(x)
    rows, cols, splits, chunk = split_shape(x, cfg)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows:
        last = last.to(x.device, torch.float32).contiguous()
        t = temperature.to(x.device, torch.float32).contiguous() if temperature is not None else last
        n = torch.empty(rows * splits, dtype=torch.int32, device=x.device)
        _TIES((rows, splits), x, x.stride(0), cols, t, last, n, NSPLIT=splits, CHUNK=chunk, BLOCK=cfg.block,
              HAS_T=temperature is not None, num_warps=cfg.num_warps)
        _TIES_COMBINE((rows,), n, last, c, out, NSPLIT=splits)
    return out
