"""Round 1's summary passes over a rank's shard under vocab_parallel: `top_values` (the radix
select) and `tie_counts`. Contracts and method: `kernels.shard`'s docstring."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..numerics import next_pow2
from .config import DEFAULT, KernelConfig
from .launcher import Launcher
from .shard import check_shard, load_l, row_divisor
from .stats import split_shape
from .tlutil import NEG_INF, chunk_bounds, div_t, key_to_float, order_key

MAX_TOP = 2048              # the largest c of `top_values` (one sorted block of a program)


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
def _top_kernel(x_ptr, stride, ncols, t_ptr, out_ptr, c, CP: tl.constexpr, BLOCK: tl.constexpr,
                HAS_T: tl.constexpr):
    row = tl.program_id(0)
    xrow = x_ptr + row.to(tl.int64) * stride
    orow = out_ptr + row.to(tl.int64) * c
    t = row_divisor(t_ptr, row, HAS_T)
    k = tl.minimum(c, ncols)
    slot = tl.arange(0, CP)
    if k > 0:
        # the k-th largest key: bits 21-31, then 10-20, then 0-9; `need` counts down the entries
        # of the top k still to place at or below the digits fixed so far
        d, above = _pick_digit(_key_hist(xrow, ncols, 0, 21, 32, 2048, BLOCK), k, 2048)
        prefix = d.to(tl.uint32) << 21
        need = k - above
        d, above = _pick_digit(_key_hist(xrow, ncols, prefix, 10, 21, 2048, BLOCK), need, 2048)
        prefix = prefix | (d.to(tl.uint32) << 10)
        need -= above
        d, above = _pick_digit(_key_hist(xrow, ncols, prefix, 0, 10, 1024, BLOCK), need, 1024)
        prefix = prefix | d.to(tl.uint32)
        need -= above
        n_above = k - need                  # entries strictly above the k-th key: listed below
        listed = tl.zeros((), tl.int32)
        for s in range(0, ncols, BLOCK):
            cols = s + tl.arange(0, BLOCK)
            x = load_l(xrow, 0, cols, cols < ncols, 1.0, False)
            sel = (order_key(x) > prefix) & (cols < ncols)
            at = listed + tl.cumsum(sel.to(tl.int32), axis=0) - 1
            tl.store(orow + at, x, mask=sel)
            listed += tl.sum(sel.to(tl.int32), axis=0)
        tl.debug_barrier()                  # the list's stores, visible to every thread's load
        kth = key_to_float(prefix)
        v = tl.load(orow + slot, mask=slot < n_above, other=NEG_INF)
        v = tl.where(slot < n_above, v, tl.where(slot < k, kth, NEG_INF))
        if HAS_T:
            v = div_t(v, t)
        v = tl.sort(v, descending=True)
        tl.debug_barrier()
        tl.store(orow + slot, v, mask=slot < c)
    else:
        tl.store(orow + slot, tl.full((CP,), NEG_INF, tl.float32), mask=slot < c)


_TOP = Launcher(_top_kernel)


def top_values(x: torch.Tensor, c: int, temperature: torch.Tensor | None = None, cfg: KernelConfig = DEFAULT):
    """[R, c] fp32, the c largest values of l per row, descending, -inf padded (module docstring)."""
    check_shard(x)
    if not 1 <= c <= MAX_TOP:
        raise ValueError(f"c (values per row) must be in [1, {MAX_TOP}], got {c}")
    rows, cols = x.shape
    out = torch.empty((rows, c), dtype=torch.float32, device=x.device)
    if rows:
        t = temperature.to(x.device, torch.float32).contiguous() if temperature is not None else out
        _TOP((rows,), x, x.stride(0), cols, t, out, c, CP=next_pow2(c), BLOCK=max(cfg.block, 1024),
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
