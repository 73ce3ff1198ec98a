"""Paged attention in plain torch: write this step's K/V into the block cache, gather each
sequence's context back through its block table, run SDPA with a causal-by-position mask.

Correctness over speed. Sequences with short queries (decode and spec-decode rows) are padded
and batched into one SDPA call; each longer query (a prefill chunk) gets its own call, so no
padded temporary is larger than one chunk's scores.

`AttentionMetadata` is plain data built once per step by `build_attention_metadata` and passed
explicitly through the model's forward (no global forward context).
"""
from __future__ import annotations

from dataclasses import dataclass

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
class AttentionMetadata:
    slot_mapping: torch.Tensor | None  # [T] int64 flat cache slot of each new token; None = no cache
    seq_lens_per_token: torch.Tensor   # [T] int64 context length of each token's sequence
    groups: tuple[AttentionGroup, ...]


def build_attention_metadata(query_lens: list[int], seq_lens: list[int],
                             block_tables: list[list[int]] | None, block_size: int,
                             device: torch.device | str = "cpu") -> AttentionMetadata:
    """Metadata for a step whose tokens are laid out sequence by sequence.

    query_lens[s]: new tokens of sequence s this step; seq_lens[s]: its context length after the
    step (new tokens are its last query_lens[s] positions). block_tables None means no cache:
    every sequence must then be entirely new (seq_lens == query_lens).
    """
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    if block_tables is None:
        assert list(query_lens) == list(seq_lens), "without a KV cache every token must be new"
    small = [s for s, n in enumerate(query_lens) if n <= SMALL_QUERY]
    large = [[s] for s, n in enumerate(query_lens) if n > SMALL_QUERY]
    groups = tuple(_group(idx, query_lens, seq_lens, starts, block_tables, block_size, device)
                   for idx in ([small] if small else []) + large)
    slot_mapping = None
    if block_tables is not None:
        slots = []
        for s, (q, n) in enumerate(zip(query_lens, seq_lens)):
            table = block_tables[s]
            slots += [table[p // block_size] * block_size + p % block_size for p in range(n - q, n)]
        slot_mapping = torch.tensor(slots, dtype=torch.int64, device=device)
    lens = torch.tensor(seq_lens, dtype=torch.int64).repeat_interleave(torch.tensor(query_lens))
    return AttentionMetadata(slot_mapping, lens.to(device), groups)


def _group(seqs, query_lens, seq_lens, starts, block_tables, block_size, device) -> AttentionGroup:
    q_lens = torch.tensor([query_lens[s] for s in seqs], dtype=torch.int64)
    ctx = torch.tensor([seq_lens[s] for s in seqs], dtype=torch.int64)
    first = torch.tensor([starts[s] for s in seqs], dtype=torch.int64)
    i = torch.arange(int(q_lens.max()))
    valid = i[None, :] < q_lens[:, None]
    token_index = torch.where(valid, first[:, None] + i[None, :], 0)
    q_pos = ctx[:, None] - q_lens[:, None] + i[None, :]                      # [G, max_q]
    j = torch.arange(int(ctx.max()))
    mask = (j[None, None, :] <= q_pos[:, :, None]) | ((~valid)[:, :, None] & (j == 0))
    if block_tables is None:
        kv_index = torch.where(j[None, :] < ctx[:, None], first[:, None] + j[None, :], 0)
    else:
        num_blocks = (int(ctx.max()) + block_size - 1) // block_size
        table = torch.tensor([(block_tables[s] + [0] * num_blocks)[:num_blocks] for s in seqs],
                             dtype=torch.int64)
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

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """q [T, Hq, D]; k, v [T, Hkv, D] -> [T, Hq * D]."""
        if meta.slot_mapping is not None:
            assert self.kv_cache is not None, "metadata has cache slots but no KV cache is bound"
            k_cache, v_cache = self.kv_cache
            k_cache.index_copy_(0, meta.slot_mapping, k)
            v_cache.index_copy_(0, meta.slot_mapping, v)
            k, v = k_cache, v_cache
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
