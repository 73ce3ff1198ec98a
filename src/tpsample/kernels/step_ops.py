"""Small per-step kernels that replace chains of tiny torch ops on the GPU (one launch each).

- `row_keys(seeds, positions, salt)`: the two 32-bit row keys of `tpsample.noise.row_keys`
  (same bits; uint32 arithmetic wraps as the torch version's 16-bit halves emulate).
- `append_history(tokens, num_out, slots, sampled, num_sampled)`: each request's emitted tokens
  appended to its slot's history row, and its count advanced (`state.history.History.append`).
- `mask_nans_(l)`: NaN -> -inf in place on fp32 rows, returning each row's NaN count (the torch
  version needs row chunks to bound its boolean temporaries: dozens of launches at 256 x 152k).
The torch versions stay the reference and the CPU path; tests compare them under the
interpreter. Must not import tpsample.sampling or tpsample.state.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launcher import Launcher
from .rng_triton import fmix32

ROW_KEY1_SALT = tl.constexpr(0x68E31DA4)


@triton.jit
def _row_keys_kernel(seed_ptr, pos_ptr, k0_ptr, k1_ptr, n, salt, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    seed = tl.load(seed_ptr + offs, mask=ok, other=0)
    pos = tl.load(pos_ptr + offs, mask=ok, other=0)
    seed_lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    seed_hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    h = fmix32(seed_lo ^ salt.to(tl.uint32))
    h = fmix32(h ^ seed_hi)
    h = fmix32(h ^ (pos & 0xFFFFFFFF).to(tl.uint32))
    k0 = fmix32(h ^ ((pos >> 32) & 0xFFFFFFFF).to(tl.uint32))
    k1 = fmix32(k0 ^ ROW_KEY1_SALT)
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
        _ROW_KEYS((triton.cdiv(n, block),), seeds.contiguous(), positions.contiguous(), k0, k1, n,
                  salt & 0xFFFFFFFF, BLOCK=block)
    return k0, k1


@triton.jit
def _append_kernel(tok_ptr, tok_stride, num_out_ptr, slot_ptr, new_ptr, new_stride, count_ptr, count_stride,
                   cap, WIDTH: tl.constexpr):
    i = tl.program_id(0)
    slot = tl.load(slot_ptr + i)
    start = tl.load(num_out_ptr + slot)
    count = tl.load(count_ptr + i * count_stride)
    j = tl.arange(0, WIDTH)
    new = tl.load(new_ptr + i * new_stride + j, mask=j < count, other=-1)
    dst = start + j
    tl.store(tok_ptr + slot * tok_stride + dst, new.to(tl.int32), mask=(j < count) & (dst < cap))
    tl.store(num_out_ptr + slot, start + count)


_APPEND = Launcher(_append_kernel)


def append_history(tokens: torch.Tensor, num_out: torch.Tensor, slots: torch.Tensor,
                   sampled: torch.Tensor, num_sampled: torch.Tensor) -> None:
    """tokens [slots, cap + 1] int32, num_out [slots] int64 updated in place for requests
    i: tokens[slots[i], num_out .. +num_sampled[i]] = sampled[i, :num_sampled[i]]."""
    n = slots.shape[0]
    if n == 0:
        return
    width = triton.next_power_of_2(max(1, sampled.shape[1]))
    _APPEND((n,), tokens, tokens.stride(0), num_out, slots, sampled, sampled.stride(0), num_sampled,
            num_sampled.stride(0), tokens.shape[1] - 1, WIDTH=width)


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
        chunk = block * max(1, triton.cdiv(triton.cdiv(cols, block), 8))
        _MASK_NANS((rows, triton.cdiv(cols, chunk)), l, l.stride(0), cols, counts, CHUNK=chunk, BLOCK=block)
    return counts
