"""The passes each rank runs over its own vocabulary shard under vocab_parallel, as Triton kernels.

Each entry point has the contract of a torch function of the sampling layer (same inputs, same
outputs, bit for bit; the torch function stays the reference and the CPU default):

- `front(x, col_start, copy=None)`: (NaN counts [R] int64, max [R] fp32, global id [R] int64 of
  its first occurrence) of fp32(x) with NaN as -inf: `processors.mask_nans` then
  `draw.local_argmax` on the working copy. copy: an fp32 [R, cols] buffer (x itself for an fp32
  x) that receives fp32(x) with NaN -> -inf in the same read, the front's working copy.
- `top_values(x, c, temperature=None)`: [R, c] fp32, the c largest values of l descending (-inf
  padded): `thresholds.local_top_values(l, c)`, with l = fp32(x) (NaN -> -inf) or, given
  temperature [R], l = fp32(x) / T where T > 0 (`processors.apply_temperature`'s rows: T = 0
  divides by 1). Zeros come back as +0.0 (torch.topk may give -0.0; they compare equal).
- `tie_counts(x, last, c, temperature=None)`: [R] int64, entries of l >= last beyond c, 0 where
  last is -inf: `summary._tie_counts(l, last, c)`.
- `gumbel_draw(x, thr, key0, key1, col_start, temperature=None)`: (value [R] fp32, global id [R]
  int64), the argmax over kept entries (l >= thr, l > -inf) of fp32(l + g(key0, key1, id)), ties
  to the lowest id, (-inf, col_start) with nothing kept: `draw.local_gumbel_draw`.

x: [R, cols] fp32 / bf16 / fp16, unit column stride, any row stride, read in its own dtype and
upcast per block (no fp32 copy unless `front` is asked for one). Column j is global token
col_start + j. A column range of a larger tensor is a view with the same row stride: the tile
[a, a + n) of a shard is `x[:, a:a + n]` with col_start + a, which is how a fused LM head would
summarise its tiles with these same passes (docs/kernels.md).

How: `front` and `gumbel_draw` stream each row in splits (grid rows x splits) and a
one-program-a-row kernel combines the splits' (value, id) pairs. The draw skips work twice:
a block whose best kept l cannot reach the best score so far with the largest possible noise
(g <= 22.9, from W >= 2**-33) hashes nothing, and inside a block the logs of g run only where
the TP = 1 scan's `may_win` test (the noise's bits alone) says an entry may win.
`top_values` (k = min(c, cols) values a row) never reads a whole row in one program: block
maxima of B columns (`_block_max_kernel`); L, the k-th largest of them, by a radix select
(`_kth_key`: the k blocks with the largest maxima hold k entries >= L, and fewer than k * B
entries are > L); the entries > L appended to the row's list (steps whose blocks all lie at or
below L are not read); the list padded with L up to k and sorted in one block, or, past
`sort_size(c)` entries, cut at its own k-th key first. B is the largest power of two up to 256
whose workspace ((k - 1) * B candidates and cols / B block maxima) stays within `WORKSPACE`
bytes a row (`block_size`). Division by T > 0 is monotone, so the selection runs on x and only
the c values are divided.
`tie_counts` is one counting read. Never imports the sampling layers.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..numerics import next_pow2
from .launcher import DEFAULT, KernelConfig, Launcher, cdiv, num_splits, split_shape, stream_scratch
from .tlutil import (
    BIG_ID32,
    NEG_INF,
    argmax_pair,
    chunk_bounds,
    div_t,
    gumbel_from_bits,
    key_to_float,
    may_win,
    order_key,
    pair_max,
    uniform_bits,
)

G_MAX = tl.constexpr(23.0)  # above every Gumbel value: g(W) <= -log(W) <= 33 log(2) < 22.88


@triton.jit
def load_l(x_ptr, row_off, cols, mask, t, HAS_T: tl.constexpr):
    """fp32(x) with NaN -> -inf (masked lanes -inf), divided by t when HAS_T (t > 0)."""
    x = tl.load(x_ptr + row_off + cols, mask=mask, other=NEG_INF).to(tl.float32)
    x = tl.where(x == x, x, NEG_INF)        # noqa: PLR0124 - a NaN test
    if HAS_T:
        x = div_t(x, t)
    return x


@triton.jit
def row_divisor(t_ptr, row, HAS_T: tl.constexpr):
    """The row's divisor: T, or 1 where T == 0 (greedy rows are not divided)."""
    if HAS_T:
        t = tl.load(t_ptr + row)
        return tl.where(t == 0.0, 1.0, t)
    else:
        return 1.0


@triton.jit
def _front_kernel(x_ptr, stride, ncols, copy_ptr, copy_stride, nan_ptr, v_ptr, i_ptr,
                  NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, COPY: tl.constexpr):
    row = tl.program_id(0)
    part = row * NSPLIT + tl.program_id(1)
    start, end = chunk_bounds(ncols, CHUNK)
    xrow = x_ptr + row.to(tl.int64) * stride
    nans = tl.zeros((), tl.int32)
    best_v = tl.full((), NEG_INF, tl.float32)
    best_i = tl.full((), BIG_ID32, tl.int32)
    for s in range(start, end, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        ok = cols < end
        x = tl.load(xrow + cols, mask=ok, other=NEG_INF).to(tl.float32)
        bad = x != x                        # noqa: PLR0124 - a NaN test
        nans += tl.sum(bad.to(tl.int32), axis=0)
        w = tl.where(bad, NEG_INF, x)
        if COPY:
            tl.store(copy_ptr + row.to(tl.int64) * copy_stride + cols, w, mask=ok)
        v, i = argmax_pair(w, tl.where(ok, cols, BIG_ID32))
        best_v, best_i = pair_max(best_v, best_i, v, i)
    tl.store(nan_ptr + part, nans)
    tl.store(v_ptr + part, best_v)
    tl.store(i_ptr + part, best_i)


@triton.jit(do_not_specialize=["col_start"])
def _combine_kernel(v_ptr, i_ptr, nan_ptr, col_start, out_v, out_i, out_nans, NSPLIT: tl.constexpr,
                    NANS: tl.constexpr):
    """The splits' (value, local id) pairs of a row: the largest value, its lowest id (0 when no
    split found a column), as a global id; with NANS the splits' NaN counts summed."""
    row = tl.program_id(0)
    parts = row * NSPLIT + tl.arange(0, NSPLIT)
    v, i = argmax_pair(tl.load(v_ptr + parts), tl.load(i_ptr + parts))
    tl.store(out_v + row, v)
    tl.store(out_i + row, tl.where(i == BIG_ID32, 0, i).to(tl.int64) + col_start)
    if NANS:
        tl.store(out_nans + row, tl.sum(tl.load(nan_ptr + parts).to(tl.int64), axis=0))


_FRONT = Launcher(_front_kernel)
_COMBINE = Launcher(_combine_kernel)


def check_shard(x: torch.Tensor, name: str = "x") -> None:
    if x.dim() != 2 or (x.shape[1] > 1 and x.stride(1) != 1):
        raise ValueError(f"{name} must be a [rows, cols] tensor with unit column stride, got shape "
                         f"{tuple(x.shape)} strides {tuple(x.stride())}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"{name} must be fp32, bf16 or fp16, got {x.dtype}")


def _pairs(rows: int, splits: int, dev):
    return (torch.empty(rows * splits, dtype=torch.float32, device=dev),
            torch.empty(rows * splits, dtype=torch.int32, device=dev))


def front(x: torch.Tensor, col_start: int, copy: torch.Tensor | None = None, cfg: KernelConfig = DEFAULT):
    """(NaN counts [R] int64, max [R] fp32, global id [R] int64): see the module docstring."""
    check_shard(x)
    if copy is not None and (copy.dtype != torch.float32 or copy.shape != x.shape or copy.stride(1) != 1):
        raise ValueError(f"copy must be an fp32 {tuple(x.shape)} tensor with unit column stride")
    rows, cols = x.shape
    splits, chunk = split_shape(rows, cols, x.device, cfg)
    dev = x.device
    nans = torch.empty(rows, dtype=torch.int64, device=dev)
    best_v = torch.empty(rows, dtype=torch.float32, device=dev)
    best_i = torch.empty(rows, dtype=torch.int64, device=dev)
    if rows:
        v, i = _pairs(rows, splits, dev)
        n = torch.empty(rows * splits, dtype=torch.int32, device=dev)
        dst = copy if copy is not None else v
        _FRONT((rows, splits), x, x.stride(0), cols, dst, dst.stride(0) if copy is not None else 0, n, v, i,
               NSPLIT=splits, CHUNK=chunk, BLOCK=cfg.block, COPY=copy is not None, num_warps=cfg.num_warps)
        _COMBINE((rows,), v, i, n, col_start, best_v, best_i, nans, NSPLIT=splits, NANS=True)
    return nans, best_v, best_i


@triton.jit
def block_may_win(l_best, best_v):
    """False only where fp32(l + g) < best_v for every l <= l_best and every noise value g
    (g < G_MAX; the margin covers the fp32 rounding of the sum); best_v = -inf passes."""
    return l_best + (G_MAX + 1e-3 + 2e-6 * (tl.abs(l_best) + tl.abs(best_v))) >= best_v


@triton.jit(do_not_specialize=["col_start"])
def _gumbel_kernel(x_ptr, stride, ncols, t_ptr, thr_ptr, key0_ptr, key1_ptr, col_start, v_ptr, i_ptr,
                   NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, HAS_T: tl.constexpr):
    row = tl.program_id(0)
    part = row * NSPLIT + tl.program_id(1)
    start, end = chunk_bounds(ncols, CHUNK)
    row_off = row.to(tl.int64) * stride
    t = row_divisor(t_ptr, row, HAS_T)
    thr = tl.load(thr_ptr + row)
    k0 = tl.load(key0_ptr + row).to(tl.uint32)
    k1 = tl.load(key1_ptr + row).to(tl.uint32)
    best_v = tl.full((), NEG_INF, tl.float32)
    best_i = tl.full((), BIG_ID32, tl.int32)
    for s in range(start, end, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        l = load_l(x_ptr, row_off, cols, cols < end, t, HAS_T)
        kept = (l >= thr) & (l > NEG_INF)
        l_best = tl.max(tl.where(kept, l, NEG_INF), axis=0)
        if (l_best > NEG_INF) & block_may_win(l_best, best_v):
            u = uniform_bits(k0, k1, cols + col_start)
            cand = kept & may_win(l, u, best_v)
            if tl.max(cand.to(tl.int32), axis=0) > 0:
                v, i = argmax_pair(tl.where(cand, l + gumbel_from_bits(u), NEG_INF), cols)
                best_v, best_i = pair_max(best_v, best_i, v, i)
    tl.store(v_ptr + part, best_v)
    tl.store(i_ptr + part, best_i)


_GUMBEL = Launcher(_gumbel_kernel)


def gumbel_draw(x: torch.Tensor, thr: torch.Tensor, key0: torch.Tensor, key1: torch.Tensor, col_start: int,
                temperature: torch.Tensor | None = None, cfg: KernelConfig = DEFAULT):
    """(value [R] fp32, global id [R] int64): see the module docstring. key0 / key1: [R] int64
    holding uint32 row keys (`noise.row_keys`); thr [R] fp32 (-inf: every finite entry kept)."""
    check_shard(x)
    rows, cols = x.shape
    splits, chunk = split_shape(rows, cols, x.device, cfg)
    dev = x.device
    out_v = torch.empty(rows, dtype=torch.float32, device=dev)
    out_i = torch.empty(rows, dtype=torch.int64, device=dev)
    if rows:
        v, i = _pairs(rows, splits, dev)
        thr = thr.to(dev, torch.float32).contiguous()
        t = temperature.to(dev, torch.float32).contiguous() if temperature is not None else thr
        _GUMBEL((rows, splits), x, x.stride(0), cols, t, thr, key0.to(dev, torch.int64).contiguous(),
                key1.to(dev, torch.int64).contiguous(), col_start, v, i, NSPLIT=splits, CHUNK=chunk,
                BLOCK=cfg.block, HAS_T=temperature is not None, num_warps=cfg.num_warps)
        _COMBINE((rows,), v, i, v, col_start, out_v, out_i, out_i, NSPLIT=splits, NANS=False)
    return out_v, out_i


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
        top_slot = tl.arange(0, CP)           # its own names: a block of CP, not NP, entries
        top = tl.load(orow + top_slot, mask=top_slot < above, other=NEG_INF)
        top = tl.where(top_slot < above, top, tl.where(top_slot < k, key_to_float(kth), NEG_INF))
        _store_sorted(orow, top_slot, top, c, t, HAS_T)


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
    rows, cols = x.shape
    splits, chunk = split_shape(rows, cols, x.device, cfg)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows:
        last = last.to(x.device, torch.float32).contiguous()
        t = temperature.to(x.device, torch.float32).contiguous() if temperature is not None else last
        n = torch.empty(rows * splits, dtype=torch.int32, device=x.device)
        _TIES((rows, splits), x, x.stride(0), cols, t, last, n, NSPLIT=splits, CHUNK=chunk, BLOCK=cfg.block,
              HAS_T=temperature is not None, num_warps=cfg.num_warps)
        _TIES_COMBINE((rows,), n, last, c, out, NSPLIT=splits)
    return out
