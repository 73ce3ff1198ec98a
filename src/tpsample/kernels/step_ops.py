"""Small per-step kernels that replace chains of tiny torch ops on the GPU (one launch each).

- `row_keys(seeds, positions, salt)`: the two 32-bit row keys of `tpsample.noise.row_keys`
  (same bits; uint32 arithmetic wraps as the torch version's 16-bit halves emulate).
- `prepare_rows(...)`: a step's per-row kernel inputs gathered from the per-slot tables (T,
  top-k, top-p, log(min-p)) and the draw's row keys from (seed, position), in one launch.
- `prepare_given(...)`: the same inputs from parameters given per row (the stateless ops).
- `split_outputs(...)`: finalize_rows's columns as separate tensors (the ops' outputs).
- `finalize_rows(...)`: the packed per-request block (token, 1, 0, NaN count, guard flag) of a
  step without drafts from the kernels' outputs (+inf winners flagged, the guard's token when
  given), in one launch.
- `mask_nans_(l)`: NaN -> -inf in place on fp32 rows, returning each row's NaN count (the torch
  version needs row chunks to bound its boolean temporaries: dozens of launches at 256 x 152k).
The torch versions stay the reference and the CPU path; tests compare them under the
interpreter. Must not import tpsample.sampling or tpsample.state.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launcher import Launcher, cdiv, next_pow2
from .rng_triton import fmix32

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
def _prepare_kernel(f32_ptr, f32_stride, i64_ptr, i64_stride, num_out_ptr, slot_ptr, off_ptr, n, salt,
                    t_out, k_out, p_out, lmp_out, k0_out, k1_out,
                    T: tl.constexpr, TOP_P: tl.constexpr, MIN_P: tl.constexpr, SEED: tl.constexpr,
                    TOP_K: tl.constexpr, PROMPT_LEN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
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


@triton.jit
def _prepare_given_kernel(t_ptr, k_ptr, p_ptr, mp_ptr, seed_ptr, pos_ptr, n, ncols, salt,
                          t_out, k_out, p_out, lmp_out, k0_out, k1_out, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    t = tl.load(t_ptr + offs, mask=ok, other=1.0)
    k = tl.load(k_ptr + offs, mask=ok, other=0)
    greedy = t == 0
    # as the Sampler stores a request: greedy rows have no filters; top-k <= 0 or >= V is off
    k = tl.where(greedy | (k <= 0) | (k >= ncols), 0, k)
    tl.store(t_out + offs, t, mask=ok)
    tl.store(k_out + offs, k.to(tl.int32), mask=ok)
    tl.store(p_out + offs, tl.where(greedy, 1.0, tl.load(p_ptr + offs, mask=ok, other=1.0)), mask=ok)
    tl.store(lmp_out + offs, tl.log(tl.where(greedy, 0.0, tl.load(mp_ptr + offs, mask=ok, other=1.0))), mask=ok)
    k0, k1 = keys_of(tl.load(seed_ptr + offs, mask=ok, other=0), tl.load(pos_ptr + offs, mask=ok, other=0), salt)
    tl.store(k0_out + offs, k0.to(tl.int64), mask=ok)
    tl.store(k1_out + offs, k1.to(tl.int64), mask=ok)


_PREPARE_GIVEN = Launcher(_prepare_given_kernel)


def prepare_given(temperature, top_k, top_p, min_p, seeds, positions, ncols: int, salt: int, out=None):
    """`prepare_rows` for parameters given per row ([n] fp32 T / top-p / min-p, int64 top-k /
    seeds / positions, as given: normalised here as the Sampler stores a request)."""
    n = temperature.shape[0]
    bufs = out if out is not None else row_buffers(n, temperature.device)
    if n:
        block = 256
        _PREPARE_GIVEN((cdiv(n, block),), temperature, top_k, top_p, min_p, seeds, positions, n, ncols,
                       salt & 0xFFFFFFFF, *bufs, BLOCK=block)
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
                 slots, offsets, n, salt & 0xFFFFFFFF, t, k, p, lmp, k0, k1, BLOCK=block, **columns)
    return t, k, p, lmp, k0, k1


@triton.jit
def _fallback(row, tok, valid_ptr, x_ptr, x_stride, ncols, col_offset):
    """No finite kept token: the kernel's guard, or a winner at +inf."""
    local = tl.minimum(tl.maximum(tok - col_offset, 0), ncols - 1)
    v = tl.load(x_ptr + row.to(tl.int64) * x_stride + local).to(tl.float32)
    return (tl.load(valid_ptr + row) == 0) | (v == float("inf"))


@triton.jit
def _finalize_kernel(tok_ptr, valid_ptr, x_ptr, x_stride, ncols, col_offset, nans_ptr, gv_ptr, gi_ptr, out_ptr,
                     NSPLIT: tl.constexpr, GSPLIT: tl.constexpr, HAS_GUARD: tl.constexpr):
    row = tl.program_id(0)
    tok = tl.load(tok_ptr + row)
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


@triton.jit
def _outputs_kernel(tok_ptr, valid_ptr, x_ptr, x_stride, ncols, nans_ptr, fb_out, nans_out, ranks_out,
                    NSPLIT: tl.constexpr):
    row = tl.program_id(0)
    tok = tl.load(tok_ptr + row)
    tl.store(fb_out + row, _fallback(row, tok, valid_ptr, x_ptr, x_stride, ncols, 0))
    tl.store(nans_out + row, tl.sum(tl.load(nans_ptr + row * NSPLIT + tl.arange(0, NSPLIT)).to(tl.int64), axis=0))
    tl.store(ranks_out + row, 0)


_OUTPUTS = Launcher(_outputs_kernel)


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
        _OUTPUTS((rows,), tokens, valid, x, x.stride(0), x.shape[1], nans, fb, counts, ranks, NSPLIT=nans.shape[1])
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
                  gi.contiguous(), out, NSPLIT=nans.shape[1], GSPLIT=parts, HAS_GUARD=guard is not None)
    return out


@triton.jit
def _raw_logprobs_kernel(tok_ptr, tok_stride, x_ptr, x_stride, ncols, col_offset, lse_ptr, tv_ptr, ti_ptr, n, cnt_ptr,
                         i64_ptr, i64_stride, slot_ptr, ids_out, vals_out, ranks_out, width,
                         NUM_LP: tl.constexpr, PROCESSED: tl.constexpr, WP: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row)
    nlp = tl.load(i64_ptr + NUM_LP * i64_stride + slot)
    want = (nlp >= 0) & (tl.load(i64_ptr + PROCESSED * i64_stride + slot) == 0)
    tok = tl.load(tok_ptr + row * tok_stride)
    local = tl.minimum(tl.maximum(tok - col_offset, 0), ncols - 1)
    v = tl.load(x_ptr + row.to(tl.int64) * x_stride + local).to(tl.float32)
    v = tl.where(v != v, float("-inf"), v)
    lse = tl.load(lse_ptr + row).to(tl.float64)
    j = tl.arange(0, WP)
    top = (j >= 1) & (j <= n)
    ids = tl.where(j == 0, tok, tl.load(ti_ptr + row * n + (j - 1), mask=top, other=-1))
    vals = tl.where(j == 0, v, tl.load(tv_ptr + row * n + (j - 1), mask=top, other=float("-inf"))).to(tl.float64)
    lp = vals - lse
    lp = tl.where(lse == float("inf"), tl.where(vals == float("inf"), 0.0, float("-inf")), lp)
    lp = tl.where(ids >= 0, lp, float("-inf"))
    lp = tl.where(lse > float("-inf"), lp, float("-inf"))
    keep = (j <= nlp) & (j < WP + want.to(tl.int32) * 0)      # columns up to the row's n ...
    keep = tl.where(want, keep, j < 0)                          # ... of rows that want raw logprobs
    out = j < width
    tl.store(ids_out + row * width + j, tl.where(keep, ids, -1), mask=out)
    tl.store(vals_out + row * width + j, tl.where(keep, lp, float("-inf")).to(tl.float32), mask=out)
    tl.store(ranks_out + row, tl.where(want, tl.load(cnt_ptr + row) + 1, 0))


_RAW_LP = Launcher(_raw_logprobs_kernel)


def raw_logprobs(tokens, x, col_offset: int, lse, top_v, top_i, above, i64_table, slots, columns: dict, width: int,
                 out=None):
    """Logprob rows from one stats pass: (ids [R, width] int64, logprobs [R, width] fp32, ranks [R])
    (new tensors, or written into `out`).

    Column 0 the sampled token, then the top-n; rows that want no raw logprobs (per the slot
    tables) and columns past a row's n are (-1, -inf); values never NaN (see logprobs.py)."""
    rows, n = top_v.shape
    dev = tokens.device
    if out is not None:
        ids, vals, ranks = out
    else:
        ids = torch.empty((rows, width), dtype=torch.int64, device=dev)
        vals = torch.empty((rows, width), dtype=torch.float32, device=dev)
        ranks = torch.empty(rows, dtype=torch.int64, device=dev)
    if rows:
        _RAW_LP((rows,), tokens, tokens.stride(0), x, x.stride(0), x.shape[1], col_offset, lse, top_v.contiguous(),
                top_i.contiguous(), n, above, i64_table, i64_table.stride(0), slots, ids, vals, ranks, width,
                WP=next_pow2(width), **columns)
    return ids, vals, ranks
