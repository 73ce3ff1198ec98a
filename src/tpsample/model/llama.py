"""The Llama / Qwen2 family (GQA, RoPE, RMSNorm, SwiGLU, optional qkv bias, tied embeddings).

Reads as single-device code: tensor parallelism appears only through the layer classes, whose
local sizes the model reads back (`qkv_proj.split_sizes`). Module names mirror the HF
checkpoint so the loader maps tensors by name, except the fused projections (q|k|v, gate|up),
which the loader fills part by part (`loader.STACKED`).
"""
from __future__ import annotations

import torch
from torch import nn

from tpsample.model.attention import AttentionMetadata, PagedAttention
from tpsample.model.config import ModelConfig
from tpsample.model.layers import RMSNorm, RotaryEmbedding, SiluAndMul, use_kernels
from tpsample.model.parallel_layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    TPGroup,
    VocabParallelEmbedding,
)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, group: TPGroup, rotary_emb: RotaryEmbedding):
        super().__init__()
        d, hidden = cfg.head_dim, cfg.hidden_size
        self.head_dim = d
        self.qkv_proj = MergedColumnParallelLinear(hidden, [cfg.num_heads * d, cfg.num_kv_heads * d,
                                                            cfg.num_kv_heads * d],
                                                   bias=cfg.qkv_bias, group=group, unit=d)
        self.o_proj = RowParallelLinear(cfg.num_heads * d, hidden, bias=cfg.o_bias, group=group, unit=d)
        self.num_heads = self.qkv_proj.split_sizes[0] // d
        self.num_kv_heads = self.qkv_proj.split_sizes[1] // d
        self.rotary_emb = rotary_emb
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, d)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.split_sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if meta.paged is not None and self.rotary_emb.has_table and use_kernels(x):
            from tpsample.model.ops_kernels import rope_store

            table = self.rotary_emb.cos_sin_table(meta.paged.max_seq_len, x.device)
            k_cache, v_cache = self.attn.kv_cache
            rope_store(q, k, v, positions, table, meta.slot_mapping, k_cache, v_cache)
            return self.o_proj(self.attn(q, k, v, meta, stored=True))
        q, k = self.rotary_emb(positions, q, k, meta.seq_lens_per_token)
        return self.o_proj(self.attn(q, k, v, meta))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, group: TPGroup):
        super().__init__()
        h, i, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_up_proj = MergedColumnParallelLinear(h, [i, i], bias=b, group=group)
        self.down_proj = RowParallelLinear(i, h, bias=b, group=group)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, group: TPGroup, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.self_attn = Attention(cfg, group, rotary_emb)
        self.mlp = MLP(cfg, group)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, residual) -> (h', residual') with the layer's input = h + residual (residual None: h).

        Equals `r = h + residual; r = r + attn(norm(r)); r + mlp(norm(r))` term by term; the
        additions ride along the norms so that on the GPU each is one fused kernel."""
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        else:
            x, residual = self.input_layernorm(h, residual)
        x, residual = self.post_attention_layernorm(self.self_attn(positions, x, meta), residual)
        return self.mlp(x), residual


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig, group: TPGroup):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, group=group)
        rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope, cfg.max_position_embeddings)   # shared
        self.layers = nn.ModuleList(DecoderLayer(cfg, group, rotary_emb) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        h, residual = self.embed_tokens(token_ids), None
        for layer in self.layers:
            h, residual = layer(positions, h, residual, meta)
        return self.norm(h, residual)[0]


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
