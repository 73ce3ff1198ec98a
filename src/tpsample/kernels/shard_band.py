"""The top-p band method's two shard passes (`sampling.rounds.topp_band`) as Triton kernels.

Each entry point has the contract of a torch function of `topp_band` (same inputs, same outputs;
the torch function stays the reference and the CPU default). Both read the band rows of the
working fp32 rows l through their indices (no gathered copy):

- `band_histogram(l, rows, num_bins, bin_scale)`: [n, num_bins + 1] fp32, `local_histogram`.
  Per row, the masses exp(l - m) (m the row's max, 0 where not finite) summed in fp64 per bin
  j = clamp(floor(bin_scale m) - floor(bin_scale l), 0, num_bins) (the last bin: everything
  further down), each bin then rounded to fp32.
- `band_partials(l, rows, thr, a, b, inv, m, key0, key1, col_start, shift, num_sub)`:
  `local_partials`'s per-row fields before the value / logprob look-ups: total and above
  (int64), and per sub-bin of [a, b) mass (int64), count (int32), score (fp32), id (int32 global
  id, 0x7FFFFFFF when empty) and top (fp32).

Bits. The partials are exact: integer masses trunc(exp(l - m) 2**shift) (exp is libdevice's
`expf` on CUDA, as torch's), the draw score fp32(l + g) with the noise of `tlutil.gumbel`, and
max / min reductions, none of which depends on the order of the entries. The histogram's bins
0 .. num_bins - 1 are exact too, in any summation order: bin j holds entries with l - m in
(-(j + 1), -(j - 1)) / bin_scale, a range of masses within a factor e**(2 / bin_scale) < 2 (for
bin_scale >= 2), so every fp32 mass in it is a multiple of the same power of two 2**(E - 23) and
below 2**(E + 2), and any partial sum of fewer than 2**28 of them is exact in fp64. They are
summed with fp64 atomics (exact, so deterministic) after a first pass finds the row's max. The
last bin spans every magnitude below the grid: it is summed per split in a fixed tree and the
splits in order, so it is deterministic but may differ from torch's column-order sum in the last
fp64 bits, hence in rare cases by one fp32 ulp. Rows whose max is not finite have no bracket
(`topp_band.bracket` sets ok False), so their bins are not held to this. A last-bit difference
cannot change a token: every rank gathers the same histograms, the bracket only needs its
estimates within `topp_band.ETA` (far above an ulp), and round 2 checks the crossing exactly;
at most a row whose bracket sat on that edge takes the exact path, which gives the same token.
Under TRITON_INTERPRET=1, numpy's exp / log may differ from torch's CPU ones in the last ulp.

How: grid (rows, splits) with per-split partials and a one-program-a-row combine. The partials
pass sums the masses of every block, and only in blocks holding a band entry hashes the noise
and reduces per sub-bin through a [BLOCK, num_sub] one-hot (num_sub a power of two).
Never imports the sampling layers.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launcher import DEFAULT, KernelConfig, Launcher, interpreting, split_shape
from .tlutil import BIG_ID32, NEG_INF, fexp, gumbel


@triton.jit
def _row_off(rows_ptr, stride):
    return tl.load(rows_ptr + tl.program_id(0)).to(tl.int64) * stride


@triton.jit
def _max_kernel(l_ptr, stride, ncols, rows_ptr, out_ptr, NSPLIT: tl.constexpr, CHUNK: tl.constexpr,
                BLOCK: tl.constexpr):
    """The max of each split of the band rows."""
    row_off = _row_off(rows_ptr, stride)
    start = tl.program_id(1) * CHUNK
    end = tl.minimum(start + CHUNK, ncols)
    best = tl.full((BLOCK,), NEG_INF, tl.float32)
    for s in range(start, end, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        best = tl.maximum(best, tl.load(l_ptr + row_off + cols, mask=cols < end, other=NEG_INF))
    tl.store(out_ptr + tl.program_id(0) * NSPLIT + tl.program_id(1), tl.max(best, axis=0))


@triton.jit
def _hist_kernel(l_ptr, stride, ncols, rows_ptr, max_ptr, bins_ptr, tail_ptr, num_bins, bin_scale,
                 NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, EXACT_EXP: tl.constexpr):
    """Bins 0 .. num_bins - 1 by fp64 atomics (exact sums), the last bin per split."""
    i = tl.program_id(0)
    row_off = _row_off(rows_ptr, stride)
    m = tl.max(tl.load(max_ptr + i * NSPLIT + tl.arange(0, NSPLIT)), axis=0)
    m = tl.where(tl.abs(m) < float("inf"), m, 0.0)
    top = tl.floor(m * bin_scale)
    start = tl.program_id(1) * CHUNK
    end = tl.minimum(start + CHUNK, ncols)
    tail = tl.zeros((BLOCK,), tl.float64)
    for s in range(start, end, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        x = tl.load(l_ptr + row_off + cols, mask=cols < end, other=NEG_INF)
        jf = top - tl.floor(x * bin_scale)
        jf = tl.where(tl.abs(jf) < float("inf"), jf, num_bins)         # NaN, +-inf -> the last bin
        j = tl.minimum(tl.maximum(jf, 0.0), num_bins).to(tl.int32)
        e = fexp(x - m, EXACT_EXP)
        e = tl.where(tl.abs(e) < float("inf"), e, 0.0).to(tl.float64)  # NaN, inf -> 0
        main = j < num_bins
        tl.atomic_add(bins_ptr + i.to(tl.int64) * num_bins + j, e, mask=main & (cols < end), sem="relaxed")
        tail += tl.where(main, 0.0, e)
    tl.store(tail_ptr + i * NSPLIT + tl.program_id(1), tl.sum(tail, axis=0))


@triton.jit(do_not_specialize=["col_start"])
def _partials_kernel(l_ptr, stride, ncols, rows_ptr, thr_ptr, a_ptr, b_ptr, inv_ptr, m_ptr, key0_ptr, key1_ptr,
                     col_start, scale, tot_ptr, above_ptr, mass_ptr, count_ptr, score_ptr, id_ptr, top_ptr,
                     NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, NSUB: tl.constexpr,
                     EXACT_EXP: tl.constexpr):
    i = tl.program_id(0)
    part = i * NSPLIT + tl.program_id(1)
    row_off = _row_off(rows_ptr, stride)
    thr, a, b = tl.load(thr_ptr + i), tl.load(a_ptr + i), tl.load(b_ptr + i)
    inv, m = tl.load(inv_ptr + i), tl.load(m_ptr + i)
    k0 = tl.load(key0_ptr + i).to(tl.uint32)
    k1 = tl.load(key1_ptr + i).to(tl.uint32)
    start = tl.program_id(1) * CHUNK
    end = tl.minimum(start + CHUNK, ncols)
    sub = tl.arange(0, NSUB)
    total = tl.zeros((), tl.int64)
    above = tl.zeros((), tl.int64)
    mass = tl.zeros((NSUB,), tl.int64)
    count = tl.zeros((NSUB,), tl.int32)
    score = tl.full((NSUB,), NEG_INF, tl.float32)
    best = tl.full((NSUB,), BIG_ID32, tl.int32)
    top = tl.full((NSUB,), NEG_INF, tl.float32)
    for s in range(start, end, BLOCK):
        cols = s + tl.arange(0, BLOCK)
        x = tl.load(l_ptr + row_off + cols, mask=cols < end, other=NEG_INF)
        kept = (x >= thr) & (x > NEG_INF)
        e = (tl.where(kept, fexp(x - m, EXACT_EXP), 0.0) * scale).to(tl.int64)
        total += tl.sum(e, axis=0)
        hi = x >= b
        above += tl.sum(tl.where(hi, e, 0), axis=0)
        band = kept & (x < b) & (x >= a)
        if tl.max(band.to(tl.int32), axis=0) > 0:
            jf = tl.floor((b - x) * inv)
            jf = tl.where(tl.abs(jf) < float("inf"), jf, 0.0)
            j = tl.minimum(tl.maximum(jf, 0.0), NSUB - 1).to(tl.int32)
            hot = (tl.where(band, j, -1)[:, None] == sub[None, :])     # [BLOCK, NSUB]
            mass += tl.sum(tl.where(hot, e[:, None], 0), axis=0)
            count += tl.sum(hot.to(tl.int32), axis=0)
            top = tl.maximum(top, tl.max(tl.where(hot, x[:, None], NEG_INF), axis=0))
            ids = cols + col_start
            z = tl.where(band, x + gumbel(k0, k1, ids), NEG_INF)
            zs = tl.where(hot, z[:, None], NEG_INF)
            bz = tl.max(zs, axis=0)
            bi = tl.min(tl.where(hot & (zs == bz[None, :]), ids[:, None], BIG_ID32), axis=0)
            take = (bz > score) | ((bz == score) & (bi < best))
            score = tl.where(take, bz, score)
            best = tl.where(take, bi, best)
    tl.store(tot_ptr + part, total)
    tl.store(above_ptr + part, above)
    at = part * NSUB + sub
    tl.store(mass_ptr + at, mass)
    tl.store(count_ptr + at, count)
    tl.store(score_ptr + at, score)
    tl.store(id_ptr + at, best)
    tl.store(top_ptr + at, top)


@triton.jit
def _combine_partials_kernel(tot_ptr, above_ptr, mass_ptr, count_ptr, score_ptr, id_ptr, top_ptr,
                             o_tot, o_above, o_mass, o_count, o_score, o_id, o_top,
                             NSPLIT: tl.constexpr, NSUB: tl.constexpr):
    """The splits of a row: sums, the best (score, lowest id) and the max top per sub-bin."""
    i = tl.program_id(0)
    parts = i * NSPLIT + tl.arange(0, NSPLIT)
    sub = tl.arange(0, NSUB)
    at = parts[:, None] * NSUB + sub[None, :]
    tl.store(o_tot + i, tl.sum(tl.load(tot_ptr + parts), axis=0))
    tl.store(o_above + i, tl.sum(tl.load(above_ptr + parts), axis=0))
    out = i * NSUB + sub
    tl.store(o_mass + out, tl.sum(tl.load(mass_ptr + at), axis=0))
    tl.store(o_count + out, tl.sum(tl.load(count_ptr + at), axis=0))
    tl.store(o_top + out, tl.max(tl.load(top_ptr + at), axis=0))
    sc = tl.load(score_ptr + at)
    bz = tl.max(sc, axis=0)
    tl.store(o_score + out, bz)
    tl.store(o_id + out, tl.min(tl.where(sc == bz[None, :], tl.load(id_ptr + at), BIG_ID32), axis=0))


_MAX = Launcher(_max_kernel)
_HIST = Launcher(_hist_kernel)
_PARTIALS = Launcher(_partials_kernel)
_COMBINE = Launcher(_combine_partials_kernel)


def _check(l: torch.Tensor, rows: torch.Tensor) -> None:
    if l.dtype != torch.float32 or l.dim() != 2 or (l.shape[1] > 1 and l.stride(1) != 1):
        raise ValueError(f"l must be fp32 [rows, cols] with unit column stride, got {l.dtype} shape "
                         f"{tuple(l.shape)} strides {tuple(l.stride())}")
    if rows.dim() != 1:
        raise ValueError(f"rows must be a 1-D tensor of row indices, got shape {tuple(rows.shape)}")


def _exact_exp(l: torch.Tensor) -> bool:
    return l.is_cuda and not interpreting()


def band_histogram(l: torch.Tensor, rows: torch.Tensor, num_bins: int, bin_scale: float,
                   cfg: KernelConfig = DEFAULT) -> torch.Tensor:
    """[n, num_bins + 1] fp32: `topp_band.local_histogram(l, rows)` (see the module docstring)."""
    _check(l, rows)
    n, cols, dev = rows.numel(), l.shape[1], l.device
    if n == 0:
        return torch.zeros((0, num_bins + 1), dtype=torch.float32, device=dev)
    splits, chunk = split_shape(n, cols, dev, cfg)
    rows = rows.to(dev, torch.int64).contiguous()
    maxima = torch.empty(n * splits, dtype=torch.float32, device=dev)
    bins = torch.zeros((n, num_bins), dtype=torch.float64, device=dev)
    tail = torch.empty((n, splits), dtype=torch.float64, device=dev)
    shape = dict(NSPLIT=splits, CHUNK=chunk, BLOCK=cfg.block, num_warps=cfg.num_warps)
    _MAX((n, splits), l, l.stride(0), cols, rows, maxima, **shape)
    _HIST((n, splits), l, l.stride(0), cols, rows, maxima, bins, tail, num_bins, float(bin_scale),
          EXACT_EXP=_exact_exp(l), **shape)
    return torch.cat([bins, tail.sum(dim=1, keepdim=True)], dim=1).float()


def band_partials(l: torch.Tensor, rows: torch.Tensor, thr: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                  inv: torch.Tensor, m: torch.Tensor, key0: torch.Tensor, key1: torch.Tensor, col_start: int,
                  shift: int, num_sub: int, cfg: KernelConfig = DEFAULT) -> dict:
    """Per band row: total, above [n] int64; mass [n, num_sub] int64, count int32, score fp32,
    id int32 (global, 0x7FFFFFFF when empty), top fp32: `topp_band.local_partials`'s fields
    before the value and logprob look-ups. thr, a, b, inv (sub-bins per unit of value), m (the
    global max, 0 where not finite): [n] fp32; key0 / key1: [n] int64 draw keys
    (`noise.row_keys(seeds, positions, SALT_DRAW)`); num_sub a power of two."""
    _check(l, rows)
    if num_sub & (num_sub - 1):
        raise ValueError(f"num_sub must be a power of two, got {num_sub}")
    n, cols, dev = rows.numel(), l.shape[1], l.device
    i64, f32, i32 = torch.int64, torch.float32, torch.int32
    out = {"total": torch.empty(n, dtype=i64, device=dev), "above": torch.empty(n, dtype=i64, device=dev),
           "mass": torch.empty((n, num_sub), dtype=i64, device=dev),
           "count": torch.empty((n, num_sub), dtype=i32, device=dev),
           "score": torch.empty((n, num_sub), dtype=f32, device=dev),
           "id": torch.empty((n, num_sub), dtype=i32, device=dev),
           "top": torch.empty((n, num_sub), dtype=f32, device=dev)}
    if n == 0:
        return out
    splits, chunk = split_shape(n, cols, dev, cfg)
    parts = {k: torch.empty((n * splits,) + v.shape[1:], dtype=v.dtype, device=dev) for k, v in out.items()}
    per_row = [t.to(dev, f32).contiguous() for t in (thr, a, b, inv, m)]
    keys = [k.to(dev, i64).contiguous() for k in (key0, key1)]
    _PARTIALS((n, splits), l, l.stride(0), cols, rows.to(dev, i64).contiguous(), *per_row, *keys, col_start,
              float(2**shift), *parts.values(), NSPLIT=splits, CHUNK=chunk, BLOCK=cfg.block, NSUB=num_sub,
              EXACT_EXP=_exact_exp(l), num_warps=cfg.num_warps)
    _COMBINE((n,), *parts.values(), *out.values(), NSPLIT=splits, NSUB=num_sub)
    return out
