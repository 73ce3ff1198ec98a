"""The penalty kernel: repetition, frequency and presence (step 5 of the semantics) in one launch,
reading the per-slot output history that `step_ops.append_history` keeps ascending.

`apply_penalties_(l, col_start, rows, slots, seq, prompt_table, prompt_width, f32_table, columns)` updates l [rows, cols] fp32 in
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

from .launcher import Launcher

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
