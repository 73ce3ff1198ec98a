"""One streaming pass over fp32 rows before the token processors run (steps 1, 2 and the guard).

`prep_rows_(l, col_start, bitmask=None)` on l [R, cols] fp32 (unit column stride; column j is
global token col_start + j), in place, in this order per entry v:
1. NaN -> -inf, counted (the row's NaN count, step 1);
2. with a grammar bitmask [R, ceil(V/32)] int32 (bit t % 32 of word t // 32 set = allowed):
   disallowed -> -inf (step 2);
and returns per split of each row (nans [R, S] int32, best value [R, S] fp32, best global id
[R, S] int64): the NaN count, and the largest value with the lowest id holding it (-inf and a
sentinel id past V when the split holds no column), which `step_ops.finalize_rows` reduces to
the guard's token: the best grammar-allowed token of the raw row. S is a power of two.
The torch version is `processors.mask_nans`, `processors.apply_bitmask` and `draw.local_argmax`
in that order: three passes and, for the bitmask, [rows, cols] temporaries in row chunks.
Must not import tpsample.sampling or tpsample.state.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launcher import Launcher, cdiv

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
    """(nans [R, S] int32, best values [R, S] fp32, best ids [R, S] int64); see the module docstring."""
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
