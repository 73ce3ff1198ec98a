"""The per-slot output history on the device: its append, and the penalties that read it (one
launch each).

`append_history(tokens, ordered, num_out, slots, sampled, num_sampled, ordered_flags)`: for each
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

`apply_penalties_(l, col_start, rows, slots, seq, prompt_table, prompt_width, f32_table, columns)`
(step 5 of the semantics: repetition, frequency and presence) updates l [rows, cols] fp32 in
place (global columns `[col_start, col_start + cols)`), for each listed batch row r (slot s):
- seen(r) = the slot's distinct prompt tokens (row s of `prompt_table`: ascending, -1 padded at
  the end) plus the row's outputs: `seq[i]` (ascending, -1 padded at the front: `torch.sort`),
  or, for steps without drafts, the slot's row of the history kept ascending above (its first
  num_out[s] entries: no sort in the step);
- every distinct token t of seen(r) held here gets, from its value v:
  v1 = v / rep if v > 0 else v * rep  (IEEE division), then, when t occurs c > 0 times in
  the outputs, v2 = (v1 - freq * float(c)) - pres;  rep 1 / freq 0 / pres 0 leave v unchanged.
This equals the torch processors (`tpsample.sampling.processors.apply_penalties`) bit for bit:
each token is written once, from its original value, with the same fp32 operations (no fused
multiply-add: the launch turns fp fusion off). The counts come from binary searches on the
sorted outputs, so there is no [rows, V] count table and no temporary beyond the sorted rows.
Must not import tpsample.sampling or tpsample.state.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..numerics import next_pow2
from .launcher import Launcher


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


BIG = tl.constexpr(0x7FFFFFFFFFFFFFFF)


@triton.jit
def _bound(ptr, n, q, steps, RIGHT: tl.constexpr, PAD_HIGH: tl.constexpr):
    """Per query: the first index i in [0, n) of a sorted row with row[i] > q (RIGHT) or >= q;
    PAD_HIGH: -1 entries (padding at the end) count as larger than any query."""
    lo = tl.zeros(q.shape, tl.int64)
    hi = lo + n
    for _ in range(steps):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(ptr + mid, mask=active, other=0).to(tl.int64)
        if PAD_HIGH:
            v = tl.where(v < 0, BIG, v)
        right = (v <= q) if RIGHT else (v < q)
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    return lo


@triton.jit
def _penalize(base, t, ok, c, r, f, p):
    v = tl.load(base + t, mask=ok, other=0.0)
    v1 = tl.where(v > 0, tl.div_rn(v, tl.zeros_like(v) + r), v * r)
    v2 = (v1 - f * c.to(tl.float32)) - p
    tl.store(base + t, tl.where(c > 0, v2, v1), mask=ok)


@triton.jit
def _penalty_kernel(l_ptr, l_stride, cols, col_start, rows_ptr, slots_ptr, seq_ptr, seq_stride, width,
                    seq_steps, len_ptr, ps_ptr, ps_stride, ps_width, ps_steps, f32_ptr, f32_stride,
                    REP: tl.constexpr, FREQ: tl.constexpr, PRES: tl.constexpr, BY_SLOT: tl.constexpr,
                    BLOCK: tl.constexpr):
    i = tl.program_id(0)
    row = tl.load(rows_ptr + i)
    slot = tl.load(slots_ptr + i)
    r = tl.load(f32_ptr + REP * f32_stride + slot)
    f = tl.load(f32_ptr + FREQ * f32_stride + slot)
    p = tl.load(f32_ptr + PRES * f32_stride + slot)
    base = l_ptr + row.to(tl.int64) * l_stride - col_start
    if BY_SLOT:     # the slot's row of the ascending history: its first num_out entries
        seq = seq_ptr + slot.to(tl.int64) * seq_stride
        n = tl.minimum(tl.load(len_ptr + slot), width)
    else:           # the step's own sorted row (-1 padding first)
        seq = seq_ptr + i.to(tl.int64) * seq_stride
        n = width + 0 * slot
    ps = ps_ptr + slot.to(tl.int64) * ps_stride
    b = tl.program_id(1)          # one block of the prompt set, or (after those) of the outputs
    prompt_blocks = tl.cdiv(ps_width, BLOCK)
    if b < prompt_blocks:         # distinct prompt tokens (each once), counted in the outputs
        j = b * BLOCK + tl.arange(0, BLOCK)
        t = tl.load(ps + j, mask=j < ps_width, other=-1).to(tl.int64)
        ok = (t >= col_start) & (t < col_start + cols)
        c = _bound(seq, n, t, seq_steps, True, False) - _bound(seq, n, t, seq_steps, False, False)
        _penalize(base, t, ok, c, r, f, p)
    elif (b - prompt_blocks) * BLOCK < n:   # distinct outputs the prompt set lacks (first of each run)
        j = (b - prompt_blocks) * BLOCK + tl.arange(0, BLOCK)
        t = tl.load(seq + j, mask=j < n, other=-1)
        prev = tl.load(seq + j - 1, mask=(j > 0) & (j < n), other=-1)
        first = (t >= 0) & ((j == 0) | (prev != t))
        in_prompt = _bound(ps, ps_width, t, ps_steps, True, True) > _bound(ps, ps_width, t, ps_steps, False, True)
        ok = first & ~in_prompt & (t >= col_start) & (t < col_start + cols)
        c = _bound(seq, n, t, seq_steps, True, False) - j
        _penalize(base, t, ok, c, r, f, p)


_PENALTY = Launcher(_penalty_kernel)


def apply_penalties_(l: torch.Tensor, col_start: int, rows: torch.Tensor, slots: torch.Tensor, seq: torch.Tensor,
                     prompt_table, prompt_width: int, f32_table: torch.Tensor, columns: tuple[int, int, int],
                     lengths=None) -> None:
    """l [R, cols] fp32 (unit column stride) in place; rows / slots [m] int64; seq [m, W] int64
    sorted ascending per row, or with `lengths` [slots] int64: a [slots, W] table of each slot's
    outputs ascending in its first lengths[slot] entries (`History.ordered`), read by slot;
    prompt_table [slots, cap] int32 or None; f32_table [params, slots] fp32 with the (rep, freq,
    pres) columns. See the module docstring for the rule."""
    m = rows.shape[0]
    if m == 0 or l.shape[1] == 0:
        return
    if lengths is None:
        seq = seq.contiguous()
    elif seq.stride(1) != 1:
        raise ValueError("the ascending history table must have unit column stride")
    width = seq.shape[1] if lengths is None else seq.shape[1] - 1     # a history table's last column is scratch
    if prompt_table is None or prompt_width == 0:
        prompt_table, prompt_width = seq, 0          # any pointer: the prompt loop does not run
    rep, freq, pres = columns
    block = 256
    # a program per block of a row's prompt set and per block its outputs may fill: the token
    # blocks of a row are independent (each token is written once), so they run side by side
    grid = (m, -(-prompt_width // block) + max(1, -(-width // block)))
    _PENALTY(grid, l, l.stride(0), l.shape[1], col_start, rows, slots, seq, seq.stride(0), width,
             max(1, width).bit_length(), lengths if lengths is not None else rows, prompt_table,
             prompt_table.stride(0), prompt_width, max(1, prompt_width).bit_length(), f32_table, f32_table.stride(0),
             REP=rep, FREQ=freq, PRES=pres, BY_SLOT=lengths is not None, BLOCK=block, enable_fp_fusion=False)
