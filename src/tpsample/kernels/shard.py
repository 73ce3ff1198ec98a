"""The passes each rank runs over its own vocabulary shard under vocab_parallel, as Triton kernels.

Each entry point has the contract of a torch function of the sampling layer (same inputs, same
outputs, bit for bit; the torch function stays the reference and the CPU default):

- `front(x, col_start, copy=None)`: (NaN counts [R] int64, max [R] fp32, global id [R] int64 of
  its first occurrence) of fp32(x) with NaN as -inf: `processors.mask_nans` then
  `draw.local_argmax` on the working copy. copy: an fp32 [R, cols] buffer (x itself for an fp32
  x) that receives fp32(x) with NaN -> -inf in the same read, the front's working copy.
Round 1's summary passes are `kernels.shard_summary`:
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
`top_values` (in `shard_summary`) bounds the c largest values from the blocks' maxima, lists the
entries above the bound and sorts them (its docstring and docs/kernels.md give the method).
`tie_counts` is one counting read.
Never imports the sampling layers; `shard_summary` imports this module's row helpers.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .config import DEFAULT, KernelConfig
from .launcher import Launcher
from .sample.scan import may_win
from .stats import split_shape
from .tlutil import (
    BIG_ID32,
    NEG_INF,
    argmax_pair,
    chunk_bounds,
    div_t,
    gumbel_from_bits,
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
    rows, cols, splits, chunk = split_shape(x, cfg)
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
    rows, cols, splits, chunk = split_shape(x, cfg)
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

