"""Host side of the row statistics (stats.py) and of the vocab-parallel partials (shard.py)."""
from __future__ import annotations

import math

import torch

from .config import DEFAULT, KernelConfig, _pow2, num_splits
from .launcher import Launcher, stream_scratch

_LAUNCHERS: dict = {}


def _launcher(kernel) -> Launcher:
    got = _LAUNCHERS.get(kernel)
    if got is None:
        got = _LAUNCHERS[kernel] = Launcher(kernel)
    return got


def split_shape(x, cfg: KernelConfig):
    rows, cols = x.shape
    splits = num_splits(rows, cols, x.device, cfg)
    chunk = max(cfg.block, math.ceil(math.ceil(cols / splits) / cfg.block) * cfg.block)
    return rows, cols, splits, chunk


def _f32(v, rows, dev):
    return v.to(dev, torch.float32).contiguous() if v is not None else torch.zeros(rows, dtype=torch.float32, device=dev)


def launch_stats(x, temperature, threshold, values, n: int, lse: bool, col_offset: int, cfg: KernelConfig,
                 tokens=None):
    """(max [R], argmax global id [R], lse [R] | None, top_v [R, n], top_i [R, n], count [R] | None).
    tokens: global ids [R] int64 whose transformed values take the place of `values`."""
    from .stats import combine_kernel, stats_kernel
    if x.stride(1) != 1:
        raise ValueError("x must have unit column stride")
    rows, cols, splits, chunk = split_shape(x, cfg)
    dev = x.device
    np_ = _pow2(n)
    f32, i64 = torch.float32, torch.int64
    p_max, p_arg, p_sm, p_ss, p_tv, p_ti, p_cnt = stream_scratch(
        dev, ("stats", rows, splits, np_), lambda: _partials(rows * splits, np_, dev))
    dummy = p_ss          # an fp32 pointer for the arguments a variant does not read
    t = dummy if temperature is None else temperature.to(dev, f32).contiguous()
    thr = dummy if threshold is None else threshold.to(dev, f32).contiguous()
    counted = values is not None or tokens is not None
    if tokens is not None:      # read with its stride (a column of the results block): no copy
        val = tokens.to(dev, i64)
    else:
        val = dummy if values is None else values.to(dev, f32).contiguous()
    _launcher(stats_kernel)((rows, splits), x, x.stride(0), cols, t, thr, val, val.stride(0) if val.dim() else 0, n,
                            p_max, p_arg, p_sm, p_ss, p_tv, p_ti, p_cnt, col_offset, NSPLIT=splits, CHUNK=chunk,
                            BLOCK=cfg.block, HAS_T=temperature is not None, HAS_THR=threshold is not None, LSE=lse,
                            NP=np_, TOP=n > 0, CNT=counted, TOK=tokens is not None, num_warps=cfg.num_warps)
    out_max, out_arg = torch.empty(rows, dtype=f32, device=dev), torch.empty(rows, dtype=i64, device=dev)
    out_lse = torch.empty(rows, dtype=f32, device=dev)
    out_v = torch.empty((rows, n), dtype=f32, device=dev)
    out_i = torch.empty((rows, n), dtype=i64, device=dev)
    out_cnt = torch.empty(rows, dtype=i64, device=dev)
    _launcher(combine_kernel)((rows,), n, col_offset, p_max, p_arg, p_sm, p_ss, p_tv, p_ti, p_cnt, out_max, out_arg,
                              out_lse, out_v, out_i, out_cnt, NSPLIT=splits, LSE=lse, NP=np_, TOP=n > 0,
                              CNT=counted, num_warps=4)
    return (out_max, out_arg, out_lse if lse else None, out_v, out_i, out_cnt if counted else None)


def _partials(parts: int, np_: int, dev) -> tuple:
    """The per-split partials of `launch_stats` (scratch: combined within the call)."""
    f32, i32 = torch.float32, torch.int32
    return (torch.empty(parts, dtype=f32, device=dev), torch.empty(parts, dtype=i32, device=dev),
            torch.empty(parts, dtype=f32, device=dev), torch.empty(parts, dtype=f32, device=dev),
            torch.empty(parts * np_, dtype=f32, device=dev), torch.empty(parts * np_, dtype=i32, device=dev),
            torch.empty(parts, dtype=torch.int64, device=dev))


def launch_gumbel(x, temperature, thr, key0, key1, col_offset: int, cfg: KernelConfig = DEFAULT):
    """The vocab-parallel Gumbel winner of the shard x (see shard.py); the splits are combined here."""
    from .shard import gumbel_kernel
    if x.stride(1) != 1:
        raise ValueError("x must have unit column stride")
    rows, cols, splits, chunk = split_shape(x, cfg)
    dev = x.device
    t = _f32(temperature, rows, dev)
    thr = _f32(thr, rows, dev)
    common = {"NSPLIT": splits, "CHUNK": chunk, "BLOCK": cfg.block, "HAS_T": temperature is not None,
              "num_warps": cfg.num_warps}
    grid = (rows, splits)
    v = torch.empty(rows * splits, dtype=torch.float32, device=dev)
    i = torch.empty(rows * splits, dtype=torch.int32, device=dev)
    _launcher(gumbel_kernel)(grid, x, x.stride(0), cols, t, thr, key0.to(dev, torch.int64).contiguous(),
                        key1.to(dev, torch.int64).contiguous(), col_offset,
                        v, i, **common)
    v, i = v.view(rows, splits), i.view(rows, splits).to(torch.int64)
    best = v.max(dim=1).values
    ids = torch.where(v == best.unsqueeze(1), i, torch.full_like(i, 2**62)).min(dim=1).values
    return best, ids + col_offset
