"""Small per-step kernels around the sampling pipeline, one launch each where torch needs a chain
of tiny ops on the GPU.

Before the draw:
- `row_keys(seeds, positions, salt)`: the two 32-bit row keys of `tpsample.noise.row_keys`
  (same bits; uint32 arithmetic wraps as the torch version's 16-bit halves emulate).
- `prepare_rows(...)`: a step's per-row kernel inputs gathered from the per-slot tables (T,
  top-k, top-p, log(min-p)) and the draw's row keys from (seed, position); `prepare_given(...)`:
  the same inputs from parameters given per row (the stateless ops). One kernel, two modes.
- `prep_rows_(l, col_start, bitmask=None)`: one streaming pass over fp32 rows l [R, cols] (unit
  column stride; column j is global token col_start + j) before the token processors run, in
  place, in this order per entry v: NaN -> -inf, counted (step 1); with a grammar bitmask
  [R, ceil(V/32)] int32 (bit t % 32 of word t // 32 set = allowed), disallowed -> -inf (step 2).
  It returns per split of each row (nans [R, S] int32, best value [R, S] fp32, best global id
  [R, S] int64): the NaN count, and the largest value with the lowest id holding it (-inf and a
  sentinel id past V when the split holds no column), which `finalize_rows` reduces to the
  guard's token: the best grammar-allowed token of the raw row. S is a power of two. The torch
  version is `processors.mask_nans`, `processors.apply_bitmask` and `draw.local_argmax` in that
  order: three passes and, for the bitmask, [rows, cols] temporaries in row chunks.
- `mask_nans_(l)`: NaN -> -inf in place on fp32 rows, returning each row's NaN count (the torch
  version needs row chunks to bound its boolean temporaries: dozens of launches at 256 x 152k).
After the draw (the logprob rows are `kernels.stats.raw_logprobs`):
- `append_history(tokens, ordered, num_out, slots, sampled, num_sampled, ordered_flags)`: for each
  request i, its slot's rows of `tokens` (emission order) and `ordered` (the same tokens ascending)
  take `sampled[i, :num_sampled[i]]`, and `num_out[slot]` advances. Both tables are [slots, cap + 1]
  int32 (-1 past each slot's length; the last column is scratch); tokens past `cap` are dropped
  from both (the sampler sizes the tables first). The ascending copy is what the penalty kernel
  searches (counts by binary search), so no step sorts the history. With `ordered_flags` =
  (per-slot flags, mask), only slots whose flags meet the mask (the requests with penalties, the
  copy's only readers) keep it: the others skip the search and the moves, which grow with the
  history. Each new token goes into the ascending row after its equals: a binary search for the
  place, then the larger entries move up by one, a block at a time from the top (a barrier
  between the loads and the stores of each block, since the threads of the program share the
  row). The torch version (`tpsample.state.store.History.append` without a kernel) gives the
  same tables.
- `finalize_rows(...)`: the packed per-request block (token, 1, 0, NaN count, guard flag) of a
  step without drafts from the kernels' outputs (+inf winners flagged, the guard's token when
  given); `split_outputs(...)`: its columns as separate tensors (the ops' outputs). One kernel,
  two modes.
The torch versions stay the reference and the CPU path; tests compare them under the
interpreter. Must not import tpsample.sampling or tpsample.state.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..numerics import next_pow2
from .launcher import Launcher, cdiv
from .tlutil import fmix32

ROW_KEY1_SALT = tl.constexpr(0x68E31DA4)


@triton.jit
def keys_of(seed, pos, salt):
    """(key0, key1) uint32 of int64 seeds and positions: `tpsample.noise.row_keys`'s bits."""
    h = fmix32((seed & 0xFFFFFFFF).to(tl.uint32) ^ salt.to(tl.uint32))
    h = fmix32(h ^ ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h = fmix32(h ^ (pos & 0xFFFFFFFF).to(tl.uint32))
    k0 = fmix32(h ^ ((pos >> 32) & 0xFFFFFFFF).to(tl.uint32))
    return k0, fmix32(k0 ^ ROW_KEY1_SALT)


@triton.jit
def _row_keys_kernel(seed_ptr, pos_ptr, k0_ptr, k1_ptr, n, salt, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    k0, k1 = keys_of(tl.load(seed_ptr + offs, mask=ok, other=0), tl.load(pos_ptr + offs, mask=ok, other=0), salt)
    tl.store(k0_ptr + offs, k0.to(tl.int64), mask=ok)
    tl.store(k1_ptr + offs, k1.to(tl.int64), mask=ok)


_ROW_KEYS = Launcher(_row_keys_kernel)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(key0, key1) [n] int64 in [0, 2**32) from seeds [n] int64 and positions [n] int64."""
    n = seeds.shape[0]
    k0 = torch.empty(n, dtype=torch.int64, device=seeds.device)
    k1 = torch.empty_like(k0)
    if n:
        block = 256
        _ROW_KEYS((cdiv(n, block),), seeds.contiguous(), positions.contiguous(), k0, k1, n,
                  salt & 0xFFFFFFFF, BLOCK=block)
    return k0, k1


@triton.jit
def _mask_nans_kernel(l_ptr, stride, ncols, counts_ptr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    start = tl.program_id(1) * CHUNK
    base = l_ptr + row.to(tl.int64) * stride
    n = tl.zeros((), tl.int64)
    for s in range(start, start + CHUNK, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        ok = cols < ncols
        v = tl.load(base + cols, mask=ok, other=0.0)
        bad = (v != v) & ok
        n += tl.sum(bad.to(tl.int64), axis=0)
        tl.store(base + cols, tl.where(bad, float("-inf"), v), mask=bad)
    tl.atomic_add(counts_ptr + row, n)


_MASK_NANS = Launcher(_mask_nans_kernel)


def mask_nans_(l: torch.Tensor) -> torch.Tensor:
    """NaN -> -inf in place on l [rows, cols] fp32 (unit column stride); returns counts [rows] int64."""
    rows, cols = l.shape
    counts = torch.zeros(rows, dtype=torch.int64, device=l.device)
    if rows and cols:
        block = 1024
        chunk = block * max(1, cdiv(cdiv(cols, block), 8))
        _MASK_NANS((rows, cdiv(cols, chunk)), l, l.stride(0), cols, counts, CHUNK=chunk, BLOCK=block)
    return counts


@triton.jit
def _prepare_kernel(f32_ptr, f32_stride, i64_ptr, i64_stride, num_out_ptr, slot_ptr, off_ptr,
                    t_ptr, k_ptr, p_ptr, mp_ptr, seed_ptr, pos_ptr, n, ncols, salt,
                    t_out, k_out, p_out, lmp_out, k0_out, k1_out,
                    T: tl.constexpr, TOP_P: tl.constexpr, MIN_P: tl.constexpr, SEED: tl.constexpr,
                    TOP_K: tl.constexpr, PROMPT_LEN: tl.constexpr, GIVEN: tl.constexpr, BLOCK: tl.constexpr):
    """GIVEN: from the parameters given per row (t_ptr ... pos_ptr, ncols); else gathered from the
    slot tables (f32_ptr ... off_ptr, their columns T ... PROMPT_LEN). The other mode's arguments
    are None (constexpr: compiled out)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    if GIVEN:
        t = tl.load(t_ptr + offs, mask=ok, other=1.0)
        k = tl.load(k_ptr + offs, mask=ok, other=0)
        greedy = t == 0
        # as the Sampler stores a request: greedy rows have no filters; top-k <= 0 or >= V is off
        k = tl.where(greedy | (k <= 0) | (k >= ncols), 0, k)
        tl.store(t_out + offs, t, mask=ok)
        tl.store(k_out + offs, k.to(tl.int32), mask=ok)
        tl.store(p_out + offs, tl.where(greedy, 1.0, tl.load(p_ptr + offs, mask=ok, other=1.0)), mask=ok)
        tl.store(lmp_out + offs, tl.log(tl.where(greedy, 0.0, tl.load(mp_ptr + offs, mask=ok, other=1.0))), mask=ok)
        seed = tl.load(seed_ptr + offs, mask=ok, other=0)
        pos = tl.load(pos_ptr + offs, mask=ok, other=0)
    else:
        slot = tl.load(slot_ptr + offs, mask=ok, other=0)
        tl.store(t_out + offs, tl.load(f32_ptr + T * f32_stride + slot, mask=ok), mask=ok)
        tl.store(p_out + offs, tl.load(f32_ptr + TOP_P * f32_stride + slot, mask=ok), mask=ok)
        tl.store(lmp_out + offs, tl.log(tl.load(f32_ptr + MIN_P * f32_stride + slot, mask=ok, other=1.0)), mask=ok)
        tl.store(k_out + offs, tl.load(i64_ptr + TOP_K * i64_stride + slot, mask=ok).to(tl.int32), mask=ok)
        seed = tl.load(i64_ptr + SEED * i64_stride + slot, mask=ok, other=0)
        pos = tl.load(i64_ptr + PROMPT_LEN * i64_stride + slot, mask=ok, other=0) \
            + tl.load(num_out_ptr + slot, mask=ok, other=0) + tl.load(off_ptr + offs, mask=ok, other=0)
    k0, k1 = keys_of(seed, pos, salt)
    tl.store(k0_out + offs, k0.to(tl.int64), mask=ok)
    tl.store(k1_out + offs, k1.to(tl.int64), mask=ok)


_PREPARE = Launcher(_prepare_kernel)
_NO_COLUMNS = dict.fromkeys(("T", "TOP_P", "MIN_P", "SEED", "TOP_K", "PROMPT_LEN"), 0)    # (unread when GIVEN)


def prepare_given(temperature, top_k, top_p, min_p, seeds, positions, ncols: int, salt: int, out=None):
    """`prepare_rows` for parameters given per row ([n] fp32 T / top-p / min-p, int64 top-k /
    seeds / positions, as given: normalised here as the Sampler stores a request)."""
    n = temperature.shape[0]
    bufs = out if out is not None else row_buffers(n, temperature.device)
    if n:
        block = 256
        _PREPARE((cdiv(n, block),), None, None, None, None, None, None, None, temperature, top_k, top_p, min_p,
                 seeds, positions, n, ncols, salt & 0xFFFFFFFF, *bufs, **_NO_COLUMNS, GIVEN=True, BLOCK=block)
    return bufs


def row_buffers(n: int, dev) -> tuple:
    """Empty (temperature, top_k, top_p, log(min_p), key0, key1) [n] buffers for `prepare_rows`."""
    f32, i64 = torch.float32, torch.int64
    return (torch.empty(n, dtype=f32, device=dev), torch.empty(n, dtype=torch.int32, device=dev),
            torch.empty(n, dtype=f32, device=dev), torch.empty(n, dtype=f32, device=dev),
            torch.empty(n, dtype=i64, device=dev), torch.empty(n, dtype=i64, device=dev))


def prepare_rows(f32_table, i64_table, num_out, slots, offsets, salt: int, columns: dict, out=None):
    """(temperature fp32, top_k int32, top_p fp32, log(min_p) fp32, key0, key1 int64), each [n],
    for rows whose slots / draft offsets are given; tables are [params, slots] (state tables).
    out: buffers from `row_buffers(n)` to write into instead of new ones."""
    n = slots.shape[0]
    t, k, p, lmp, k0, k1 = out if out is not None else row_buffers(n, slots.device)
    if n:
        block = 256
        _PREPARE((cdiv(n, block),), f32_table, f32_table.stride(0), i64_table, i64_table.stride(0), num_out,
                 slots, offsets, None, None, None, None, None, None, n, None, salt & 0xFFFFFFFF, t, k, p, lmp, k0, k1,
                 **columns, GIVEN=False, BLOCK=block)
    return t, k, p, lmp, k0, k1


NO_ID = tl.constexpr(0x7FFFFFFFFFFFFFFF)
SPLITS = 8


@triton.jit
def _prep_kernel(l_ptr, stride, ncols, col_start, mask_ptr, mask_stride, nans_ptr, gv_ptr, gi_ptr,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr, NSPLIT: tl.constexpr, HAS_MASK: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    base = l_ptr + row.to(tl.int64) * stride
    n = tl.zeros((), tl.int32)
    best_v = tl.full((), float("-inf"), tl.float32)
    best_i = tl.full((), NO_ID, tl.int64)
    for s in range(split * CHUNK, split * CHUNK + CHUNK, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        ok = cols < ncols
        v = tl.load(base + cols, mask=ok, other=float("-inf"))
        bad = (v != v) & ok
        n += tl.sum(bad.to(tl.int32), axis=0)
        w = tl.where(bad, float("-inf"), v)
        if HAS_MASK:
            g = col_start + cols
            word = tl.load(mask_ptr + row.to(tl.int64) * mask_stride + g // 32, mask=ok, other=-1)
            w = tl.where(((word >> (g % 32)) & 1) != 0, w, float("-inf"))
        tl.store(base + cols, w, mask=ok & (bad | (w != v)))
        m = tl.max(w, axis=0)
        first = tl.min(tl.where(ok & (w == m), cols, ncols), axis=0)
        better = m > best_v
        best_i = tl.where(better, (col_start + first).to(tl.int64), best_i)
        best_v = tl.where(better, m, best_v)
    out = row * NSPLIT + split
    tl.store(nans_ptr + out, n)
    tl.store(gv_ptr + out, best_v)
    tl.store(gi_ptr + out, best_i)


_PREP = Launcher(_prep_kernel)


def prep_rows_(l: torch.Tensor, col_start: int, bitmask=None):
    """(nans [R, S] int32, best values [R, S] fp32, best ids [R, S] int64); `prep_rows_` in the module docstring."""
    rows, cols = l.shape
    dev = l.device
    nans = torch.empty((rows, SPLITS), dtype=torch.int32, device=dev)
    gv = torch.empty((rows, SPLITS), dtype=torch.float32, device=dev)
    gi = torch.empty((rows, SPLITS), dtype=torch.int64, device=dev)
    if rows:
        if l.dtype != torch.float32 or (cols and l.stride(1) != 1):
            raise ValueError("prep_rows_ takes fp32 rows with unit column stride")
        block = 1024
        chunk = block * max(1, cdiv(cdiv(cols, block), SPLITS))
        if bitmask is not None:
            bitmask = bitmask.to(dev, non_blocking=True)
        mask = bitmask if bitmask is not None else nans
        _PREP((rows, SPLITS), l, l.stride(0), cols, col_start, mask, mask.stride(0), nans, gv, gi,
              CHUNK=chunk, BLOCK=block, NSPLIT=SPLITS, HAS_MASK=bitmask is not None)
    return nans, gv, gi


@triton.jit
def _fallback(row, tok, valid_ptr, x_ptr, x_stride, ncols, col_offset):
    """No finite kept token: the kernel's guard, or a winner at +inf."""
    local = tl.minimum(tl.maximum(tok - col_offset, 0), ncols - 1)
    v = tl.load(x_ptr + row.to(tl.int64) * x_stride + local).to(tl.float32)
    return (tl.load(valid_ptr + row) == 0) | (v == float("inf"))


@triton.jit
def _finalize_kernel(tok_ptr, valid_ptr, x_ptr, x_stride, ncols, col_offset, nans_ptr, gv_ptr, gi_ptr, out_ptr,
                     fb_out, nans_out, ranks_out, NSPLIT: tl.constexpr, GSPLIT: tl.constexpr,
                     HAS_GUARD: tl.constexpr, SPLIT: tl.constexpr):
    """SPLIT: the block's columns as separate tensors (fb_out, nans_out, ranks_out) of full rows
    (col_offset 0, no guard); else the [R, 5] block at out_ptr. The other mode's arguments are
    None (constexpr: compiled out)."""
    row = tl.program_id(0)
    tok = tl.load(tok_ptr + row)
    if SPLIT:
        tl.store(fb_out + row, _fallback(row, tok, valid_ptr, x_ptr, x_stride, ncols, 0))
        tl.store(nans_out + row, tl.sum(tl.load(nans_ptr + row * NSPLIT + tl.arange(0, NSPLIT)).to(tl.int64), axis=0))
        tl.store(ranks_out + row, 0)
    else:
        fallback = _fallback(row, tok, valid_ptr, x_ptr, x_stride, ncols, col_offset)
        if HAS_GUARD:   # the largest value over the guard's parts, the lowest id holding it
            g = row * GSPLIT + tl.arange(0, GSPLIT)
            gvs = tl.load(gv_ptr + g)
            gvs = tl.where(gvs != gvs, float("-inf"), gvs)
            gv = tl.max(gvs, axis=0)
            gi = tl.min(tl.where(gvs == gv, tl.load(gi_ptr + g), 0x7FFFFFFFFFFFFFFF), axis=0)
            guard = tl.where(gv > float("-inf"), gi, 0)
            tok = tl.where(fallback, guard, tok)
        nans = tl.sum(tl.load(nans_ptr + row * NSPLIT + tl.arange(0, NSPLIT)).to(tl.int64), axis=0)
        base = out_ptr + row * 5
        tl.store(base, tok)
        tl.store(base + 1, 1)
        tl.store(base + 2, 0)
        tl.store(base + 3, nans)
        tl.store(base + 4, fallback.to(tl.int64))


_FINALIZE = Launcher(_finalize_kernel)


def split_outputs(tokens, valid, x, nans, out=None):
    """(fallback [R] bool, NaN counts [R] int64, zero ranks [R] int64) of full rows sampled by
    `sample_rows` (nans: its [R, splits] partials), as new tensors (or written into `out`):
    finalize_rows's columns."""
    rows, dev = tokens.shape[0], tokens.device
    if out is not None:
        fb, counts, ranks = out
    else:
        fb = torch.empty(rows, dtype=torch.bool, device=dev)
        counts = torch.empty(rows, dtype=torch.int64, device=dev)
        ranks = torch.empty(rows, dtype=torch.int64, device=dev)
    if rows:
        _FINALIZE((rows,), tokens, valid, x, x.stride(0), x.shape[1], None, nans, None, None, None, fb, counts, ranks,
                  NSPLIT=nans.shape[1], GSPLIT=1, HAS_GUARD=False, SPLIT=True)
    return fb, counts, ranks


def finalize_rows(tokens, valid, x, col_offset: int, nans, guard=None) -> torch.Tensor:
    """[R, 5] int64 (token, 1, 0, NaN count, guard flag): nans [R, splits] per-split counts;
    guard: optional (values, ids) [R] or [R, parts] (fp32, int64; parts a power of two): the
    best value of each part of the row and its lowest global id, taken (the best over the parts,
    lowest id among equals; token 0 when that is -inf) where the row had no finite kept token."""
    rows = tokens.shape[0]
    out = torch.empty((rows, 5), dtype=torch.int64, device=tokens.device)
    if rows:
        gv, gi = guard if guard is not None else (tokens, tokens)
        parts = gv.shape[1] if gv.dim() == 2 else 1
        nans = nans.contiguous()
        _FINALIZE((rows,), tokens, valid, x, x.stride(0), x.shape[1], col_offset, nans, gv.contiguous(),
                  gi.contiguous(), out, None, None, None, NSPLIT=nans.shape[1], GSPLIT=parts,
                  HAS_GUARD=guard is not None, SPLIT=False)
    return out


@triton.jit
def _upper_bound(row, n, q, steps):
    """The first index i in [0, n) with row[i] > q (row ascending over [0, n)); n if none."""
    lo = n * 0
    hi = n
    for _ in range(steps):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(row + mid, mask=active, other=0)
        right = v <= q
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    return lo


@triton.jit
def _append_kernel(tok_ptr, ord_ptr, stride, num_out_ptr, slot_ptr, new_ptr, new_stride, count_ptr, count_stride,
                   cap, steps, flags_ptr, WIDTH: tl.constexpr, BLOCK: tl.constexpr, MASK: tl.constexpr):
    i = tl.program_id(0)
    slot = tl.load(slot_ptr + i)
    start = tl.load(num_out_ptr + slot)
    keep = tl.full((), 1, tl.int64)       # non-zero: the slot keeps its ascending copy
    if MASK != 0:
        keep = tl.load(flags_ptr + slot) & MASK
    count = tl.load(count_ptr + i * count_stride)
    j = tl.arange(0, WIDTH)
    new = tl.load(new_ptr + i * new_stride + j, mask=j < count, other=-1)
    dst = start + j
    base = slot.to(tl.int64) * stride
    tl.store(tok_ptr + base + dst, new.to(tl.int32), mask=(j < count) & (dst < cap))
    tl.store(num_out_ptr + slot, start + count)
    row = ord_ptr + base
    b = tl.arange(0, BLOCK)
    for k in range(WIDTH):
        n = start + k
        if (k < count) & (n < cap) & (keep != 0):
            t = tl.load(new_ptr + i * new_stride + k).to(tl.int32)
            pos = _upper_bound(row, n, t, steps)
            for s in range(0, n - pos, BLOCK):          # entries [pos, n) move up by one, top block first
                idx = n - 1 - s - b
                m = idx >= pos
                v = tl.load(row + idx, mask=m)
                tl.debug_barrier()
                tl.store(row + idx + 1, v, mask=m)
                tl.debug_barrier()
            tl.store(row + pos, t)
            tl.debug_barrier()


_APPEND = Launcher(_append_kernel)


def append_history(tokens: torch.Tensor, ordered: torch.Tensor, num_out: torch.Tensor, slots: torch.Tensor,
                   sampled: torch.Tensor, num_sampled: torch.Tensor, ordered_flags=None) -> None:
    """tokens / ordered [slots, cap + 1] int32 and num_out [slots] int64 updated in place (see the
    module docstring); slots [n] int64, sampled [n, k] int64, num_sampled [n] int64 (any strides);
    ordered_flags: None (every slot keeps its ascending copy) or (flags [slots] int64, mask int):
    only slots with flags & mask do."""
    n = slots.shape[0]
    if n == 0:
        return
    if ordered.stride(0) != tokens.stride(0):
        raise ValueError("tokens and ordered must have the same row stride")
    cap = tokens.shape[1] - 1
    flags, mask = ordered_flags if ordered_flags is not None else (num_out, 0)    # MASK 0: flags never read
    if ordered_flags is not None and (mask == 0 or flags.dim() != 1 or flags.stride(0) != 1):
        raise ValueError("ordered_flags must be (contiguous [slots] flags, a non-zero mask)")
    _APPEND((n,), tokens, ordered, tokens.stride(0), num_out, slots, sampled, sampled.stride(0), num_sampled,
            num_sampled.stride(0), cap, max(1, cap).bit_length(), flags, WIDTH=next_pow2(max(1, sampled.shape[1])),
            BLOCK=256, MASK=mask)
