"""The per-slot output history on the device, appended in one launch per step.

`append_history(tokens, ordered, num_out, slots, sampled, num_sampled, ordered_flags)`: for each
request i, its slot's rows of `tokens` (emission order) and `ordered` (the same tokens ascending)
take `sampled[i, :num_sampled[i]]`, and `num_out[slot]` advances. Both tables are [slots, cap + 1]
int32 (-1 past each slot's length; the last column is scratch); tokens past `cap` are dropped
from both (the sampler sizes the tables first). The ascending copy is what the penalty kernel
searches (counts by binary search), so no step sorts the history. With `ordered_flags` =
(per-slot flags, mask), only slots whose flags meet the mask (the requests with penalties, the
copy's only readers) keep it: the others skip the search and the moves, which grow with the
history.

Each new token goes into the ascending row after its equals: a binary search for the place, then
the larger entries move up by one, a block at a time from the top (a barrier between the loads
and the stores of each block, since the threads of the program share the row).
The torch version (`tpsample.state.history.History.append` without a kernel) gives the same
tables. Must not import tpsample.sampling or tpsample.state.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launcher import Launcher, next_pow2


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
