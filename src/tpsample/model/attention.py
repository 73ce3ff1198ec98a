"""Paged attention: the KV cache is read in place through block tables.

Two paths, one contract (`PagedAttention.forward`):
- kernel path (`meta.paged` set; the engine's GPU path): Triton kernels of
  `tpsample.model.kernels` read K/V pages straight from the cache; split-KV decode when every
  sequence has one query, a tiled causal kernel otherwise. GQA reads each K/V head once per group.
- torch path (`meta.groups`; the CPU path and the reference the kernels are tested against):
  gather each sequence's context through its block table, SDPA with a causal-by-position mask.
  Sequences with short queries (decode and spec-decode rows) are padded and batched into one
  SDPA call; each longer query (a prefill chunk) gets its own call, so no padded temporary is
  larger than one chunk's scores.

`AttentionMetadata` is plain data built once per step (numpy and tensor ops, no per-token Python)
and passed explicitly through the model's forward (no global forward context).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SMALL_QUERY = 16  # queries up to this length share one padded SDPA call


@dataclass(frozen=True)
class AttentionGroup:
    token_index: torch.Tensor  # [G, max_q] int64 index into the step's tokens (padding -> 0)
    token_valid: torch.Tensor  # [G, max_q] bool
    kv_index: torch.Tensor     # [G, max_kv] int64 flat cache slot (or step token without a cache)
    mask: torch.Tensor         # [G, 1, max_q, max_kv] bool, True = attend


@dataclass(frozen=True)
class PagedMetadata:
    """The kernel path's view of a step; all tensors on the device.

    Decode form (`cu_query_lens` None): one query per sequence, at position seq_len - 1; a row
    with seq_len 0 is padding (its output is 0). Its shapes depend only on the batch size, so a
    CUDA graph can hold it in persistent buffers.
    """
    block_tables: torch.Tensor             # [S, max_pages] int32 page ids
    seq_lens: torch.Tensor                 # [S] int32 context length after the step
    page_size: int
    max_seq_len: int                       # bound on seq_lens (sizes the RoPE table)
    num_splits: int = 1                    # decode: programs per (sequence, KV head)
    cu_query_lens: torch.Tensor | None = None  # [S + 1] int32 query starts; None = decode form
    tile_seq: torch.Tensor | None = None       # [tiles] int32 (prefill form)
    tile_start: torch.Tensor | None = None     # [tiles] int32 first query of each tile


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor | None        # [T] int64 flat cache slot of each new token; None = no cache
    seq_lens_per_token: torch.Tensor | None  # [T] context length of each token's sequence (dynamic RoPE)
    groups: tuple[AttentionGroup, ...] = ()  # torch path
    paged: PagedMetadata | None = None       # kernel path


def slot_mapping_np(query_lens: np.ndarray, seq_lens: np.ndarray, block_tables: np.ndarray,
                    block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions [T], slots [T]) of a step's new tokens, laid out sequence by sequence."""
    q = np.asarray(query_lens, dtype=np.int64)
    s = np.asarray(seq_lens, dtype=np.int64)
    num_tokens = int(q.sum())
    seq_of_token = np.repeat(np.arange(len(q)), q)
    first_token = np.cumsum(q) - q
    positions = np.arange(num_tokens) - first_token[seq_of_token] + (s - q)[seq_of_token]
    pages = np.asarray(block_tables)[seq_of_token, positions // block_size].astype(np.int64)
    return positions, pages * block_size + positions % block_size


def build_attention_metadata(query_lens, seq_lens, block_tables, block_size: int,
                             device: torch.device | str = "cpu") -> AttentionMetadata:
    """Torch-path metadata for a step whose tokens are laid out sequence by sequence.

    query_lens[s]: new tokens of sequence s this step; seq_lens[s]: its context length after the
    step (new tokens are its last query_lens[s] positions). block_tables: [S, max_pages] page ids,
    or None for no cache: every sequence must then be entirely new.
    """
    q_lens = np.asarray(query_lens, dtype=np.int64)
    s_lens = np.asarray(seq_lens, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(q_lens)])
    slot_mapping = None
    if block_tables is None:
        assert np.array_equal(q_lens, s_lens), "without a KV cache every token must be new"
    else:
        _, slots = slot_mapping_np(q_lens, s_lens, block_tables, block_size)
        slot_mapping = torch.from_numpy(slots).to(device)
    small = np.flatnonzero(q_lens <= SMALL_QUERY)
    large = np.flatnonzero(q_lens > SMALL_QUERY)
    index_sets = ([small] if len(small) else []) + [large[i:i + 1] for i in range(len(large))]
    groups = tuple(_group(idx, q_lens, s_lens, starts, block_tables, block_size, device) for idx in index_sets)
    lens = torch.from_numpy(np.repeat(s_lens, q_lens))
    return AttentionMetadata(slot_mapping, lens.to(device), groups)


def build_paged_metadata(query_lens, seq_lens, block_tables: np.ndarray, slots: np.ndarray, page_size: int,
                         max_seq_len: int, device, *, decode: bool = False, num_kv_heads: int = 1) -> AttentionMetadata:
    """Kernel-path metadata for an eager step. decode: every sequence has exactly one query (then
    the split-KV decode kernel runs). slots: [T] cache slot of each new token (`slot_mapping_np`)."""
    from tpsample.model.kernels import num_decode_splits, prefill_tiles

    def dev(a, dtype=torch.int32) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)

    q_lens = np.asarray(query_lens, dtype=np.int64)
    s_lens = np.asarray(seq_lens, dtype=np.int64)
    common = dict(block_tables=dev(block_tables), seq_lens=dev(s_lens), page_size=page_size, max_seq_len=max_seq_len)
    if decode:
        device = torch.device(device)
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        paged = PagedMetadata(**common, num_splits=num_decode_splits(len(s_lens), num_kv_heads, max_seq_len, num_sms))
    else:
        tile_seq, tile_start = prefill_tiles(q_lens)
        paged = PagedMetadata(**common, cu_query_lens=dev(np.concatenate([[0], np.cumsum(q_lens)])),
                              tile_seq=dev(tile_seq), tile_start=dev(tile_start))
    return AttentionMetadata(slot_mapping=dev(slots, torch.int64), seq_lens_per_token=dev(np.repeat(s_lens, q_lens)),
                             paged=paged)


def _group(seqs, query_lens, seq_lens, starts, block_tables, block_size, device) -> AttentionGroup:
    q_lens = torch.from_numpy(query_lens[seqs])
    ctx = torch.from_numpy(seq_lens[seqs])
    first = torch.from_numpy(starts[seqs])
    i = torch.arange(int(q_lens.max()))
    valid = i[None, :] < q_lens[:, None]
    token_index = torch.where(valid, first[:, None] + i[None, :], 0)
    q_pos = ctx[:, None] - q_lens[:, None] + i[None, :]                      # [G, max_q]
    j = torch.arange(int(ctx.max()))
    mask = (j[None, None, :] <= q_pos[:, :, None]) | ((~valid)[:, :, None] & (j == 0))
    if block_tables is None:
        kv_index = torch.where(j[None, :] < ctx[:, None], first[:, None] + j[None, :], 0)
    else:
        num_pages = (int(ctx.max()) + block_size - 1) // block_size
        table = torch.zeros(len(seqs), num_pages, dtype=torch.int64)
        width = min(num_pages, block_tables.shape[1])
        table[:, :width] = torch.from_numpy(block_tables[seqs, :width].astype(np.int64))
        kv_index = table[:, j // block_size] * block_size + j % block_size
        kv_index = torch.where(j[None, :] < ctx[:, None], kv_index, 0)
    return AttentionGroup(token_index.to(device), valid.to(device), kv_index.to(device),
                          mask.unsqueeze(1).to(device))


class PagedAttention(nn.Module):
    """softmax(q k^T * scale + causal mask) v over each sequence's cached context."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None  # 2 x [num_slots, Hkv, D]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
                stored: bool = False) -> torch.Tensor:
        """q [T, Hq, D]; k, v [T, Hkv, D] -> [T, Hq * D]. stored: k, v are already in the cache."""
        if meta.slot_mapping is not None:
            assert self.kv_cache is not None, "metadata has cache slots but no KV cache is bound"
            k_cache, v_cache = self.kv_cache
            if not stored:
                k_cache.index_copy_(0, meta.slot_mapping, k)
                v_cache.index_copy_(0, meta.slot_mapping, v)
            k, v = k_cache, v_cache
        if meta.paged is not None:
            return self._kernels(q, meta.paged).reshape(q.shape[0], -1)
        out = q.new_empty(q.shape)
        for g in meta.groups:
            qg = q[g.token_index].transpose(1, 2)                                # [G, Hq, max_q, D]
            kg, vg = k[g.kv_index].transpose(1, 2), v[g.kv_index].transpose(1, 2)  # [G, Hkv, max_kv, D]
            if self.num_kv_heads != self.num_heads:
                rep = self.num_heads // self.num_kv_heads
                kg, vg = kg.repeat_interleave(rep, dim=1), vg.repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, scale=self.scale)
            out[g.token_index[g.token_valid]] = o.transpose(1, 2)[g.token_valid]
        return out.reshape(q.shape[0], -1)

    def _kernels(self, q: torch.Tensor, paged: PagedMetadata) -> torch.Tensor:
        from tpsample.model.kernels import paged_decode, paged_prefill

        k_cache, v_cache = self.kv_cache
        if paged.cu_query_lens is None:
            return paged_decode(q, k_cache, v_cache, paged.block_tables, paged.seq_lens, page=paged.page_size,
                                scale=self.scale, num_splits=paged.num_splits)
        return paged_prefill(q, k_cache, v_cache, paged.block_tables, paged.seq_lens, paged.cu_query_lens,
                             paged.tile_seq, paged.tile_start, page=paged.page_size, scale=self.scale)
