"""Launchers for the paged attention kernels (`kernels/attention.py`) and the numpy helpers that
lay out their work. Everything a launcher needs is already on the device, so decode launches
can be captured in a CUDA graph (the grid depends only on the batch size and `num_splits`).
"""
from __future__ import annotations

import numpy as np
import torch

from tpsample.kernels.attention import LOG2E, compiled

from .launcher import cdiv, next_pow2

DECODE_BLOCK_N = 64
PREFILL_BLOCK_M = 64
PREFILL_BLOCK_N = 64
MAX_SPLITS = 16


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def num_decode_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Splits per sequence: enough programs for about two waves, a power of two, at most one per
    `DECODE_BLOCK_N` keys of the longest possible context."""
    want = max(1, (2 * num_sms) // max(1, num_seqs * num_kv_heads))
    cap = min(MAX_SPLITS, next_pow2(cdiv(max_seq_len, DECODE_BLOCK_N)))
    return min(next_pow2(want), max(1, cap))


def prefill_tiles(query_lens: np.ndarray, block_m: int = PREFILL_BLOCK_M) -> tuple[np.ndarray, np.ndarray]:
    """(sequence, first query) of every query tile, as int32 arrays, without a Python loop per token."""
    tiles = -(-query_lens.astype(np.int64) // block_m)                  # [S]
    seq = np.repeat(np.arange(len(query_lens), dtype=np.int32), tiles)
    first = np.cumsum(tiles) - tiles
    start = (np.arange(int(tiles.sum())) - np.repeat(first, tiles)) * block_m
    return seq, start.astype(np.int32)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, *, page: int, scale: float, num_splits: int,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """q [S, Hq, D] (one query per sequence, at position seq_len - 1); caches [slots, Hkv, D];
    block_tables [S, max_pages] int32; seq_lens [S] int32 (0 = padding row, output 0) -> [S, Hq, D]."""
    num_seqs, num_heads, dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    d_pad = next_pow2(dim)
    out = torch.empty_like(q) if out is None else out
    k = compiled()
    if num_splits == 1:
        part_m = part_l = part_acc = out          # unused
    else:
        part_m = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(num_seqs, num_heads, num_splits, d_pad, dtype=torch.float32, device=q.device)
    k.decode_split[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_m, part_l, part_acc, scale * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1), G=group, G_PAD=max(16, next_pow2(group)), D=dim,
        D_PAD=d_pad, PAGE=page, BLOCK_N=DECODE_BLOCK_N, NUM_SPLITS=num_splits, PRECISION=_precision(q.dtype),
        num_warps=4)
    if num_splits > 1:
        k.decode_reduce[(num_seqs, num_heads)](out, part_m, part_l, part_acc, out.stride(0), out.stride(1),
                                               D=dim, D_PAD=d_pad, NUM_SPLITS=num_splits, num_warps=4)
    return out


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor, cu_query_lens: torch.Tensor, tile_seq: torch.Tensor,
                  tile_start: torch.Tensor, *, page: int, scale: float, block_m: int = PREFILL_BLOCK_M,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, Hq, D], sequences one after another (cu_query_lens [S + 1] int32 their starts); the
    K/V of the new tokens are already in the cache; tiles from `prefill_tiles` -> [T, Hq, D]."""
    num_tokens, num_heads, dim = q.shape
    group = num_heads // k_cache.shape[1]
    out = torch.empty_like(q) if out is None else out
    num_tiles = tile_seq.shape[0]
    if num_tiles == 0:
        return out
    compiled().prefill[(num_tiles, num_heads)](
        q, k_cache, v_cache, block_tables, seq_lens, cu_query_lens, tile_seq, tile_start, out, scale * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1), G=group, D=dim, D_PAD=next_pow2(dim), PAGE=page,
        BLOCK_M=block_m, BLOCK_N=PREFILL_BLOCK_N, PRECISION=_precision(q.dtype), num_warps=4, num_stages=2)
    return out
