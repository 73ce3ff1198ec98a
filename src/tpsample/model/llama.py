"""The Llama / Qwen2 family (GQA, RoPE, RMSNorm, SwiGLU, optional qkv bias, tied embeddings).

Reads as single-device code: tensor parallelism appears only through the layer classes, whose
local sizes the model reads back (`q_proj.out_features_local`). Module names mirror the HF
checkpoint so the loader maps tensors by name.
"""
from __future__ import annotations

import torch
from torch import nn

from tpsample.model.attention import AttentionMetadata, PagedAttention
from tpsample.model.config import ModelConfig
from tpsample.model.layers import RMSNorm, RotaryEmbedding, SiluAndMul
from tpsample.model.parallel_layers import (ColumnParallelLinear, ParallelLMHead, RowParallelLinear,
                                            TPGroup, VocabParallelEmbedding)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, group: TPGroup):
        super().__init__()
        d, hidden = cfg.head_dim, cfg.hidden_size
        self.head_dim = d
        self.q_proj = ColumnParallelLinear(hidden, cfg.num_heads * d, bias=cfg.qkv_bias, group=group, unit=d)
        self.k_proj = ColumnParallelLinear(hidden, cfg.num_kv_heads * d, bias=cfg.qkv_bias, group=group, unit=d)
        self.v_proj = ColumnParallelLinear(hidden, cfg.num_kv_heads * d, bias=cfg.qkv_bias, group=group, unit=d)
        self.o_proj = RowParallelLinear(cfg.num_heads * d, hidden, bias=cfg.o_bias, group=group, unit=d)
        self.num_heads = self.q_proj.out_features_local // d
        self.num_kv_heads = self.k_proj.out_features_local // d
        self.rotary_emb = RotaryEmbedding(d, cfg.rope, cfg.max_position_embeddings)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, d)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        q = self.q_proj(x).view(-1, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary_emb(positions, q, k, meta.seq_lens_per_token)
        return self.o_proj(self.attn(q, k, v, meta))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, group: TPGroup):
        super().__init__()
        h, i, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = ColumnParallelLinear(h, i, bias=b, group=group)
        self.up_proj = ColumnParallelLinear(h, i, bias=b, group=group)
        self.down_proj = RowParallelLinear(i, h, bias=b, group=group)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, group: TPGroup):
        super().__init__()
        self.self_attn = Attention(cfg, group)
        self.mlp = MLP(cfg, group)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        h = h + self.self_attn(positions, self.input_layernorm(h), meta)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig, group: TPGroup):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, group=group)
        self.layers = nn.ModuleList(DecoderLayer(cfg, group) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        h = self.embed_tokens(token_ids)
        for layer in self.layers:
            h = layer(positions, h, meta)
        return self.norm(h)


class CausalLM(nn.Module):
    """forward -> final hidden states [T, H]; compute_logits -> this rank's [rows, V_r] logits."""

    def __init__(self, cfg: ModelConfig, group: TPGroup):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg, group)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, group=group)
        if cfg.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """token_ids, positions [T] (sequence by sequence, as in `meta`) -> hidden [T, H]."""
        return self.model(token_ids, positions, meta)

    def compute_logits(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """hidden_rows [R, H] in the order the sampler asked for -> local logits [R, V_r]."""
        return self.lm_head(hidden_rows)

    def attention_layers(self) -> list[PagedAttention]:
        return [layer.self_attn.attn for layer in self.model.layers]
