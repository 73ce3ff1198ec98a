"""The Llama / Qwen2 family (GQA, RoPE, RMSNorm, SwiGLU, optional qkv bias, tied embeddings).

Reads as single-device code: tensor parallelism appears only through the layer classes, whose
local sizes the model reads back (`qkv_proj.split_sizes`). Module names mirror the HF
checkpoint so the loader maps tensors by name, except the fused projections (q|k|v, gate|up),
which the loader fills part by part (`loader.STACKED`).

The small layers' numerics follow transformers' eager code step for step (fp32 variance in
RMSNorm, fp32 angles cast to the activation dtype in RoPE) so logits match the reference tightly.
On CUDA tensors the norm, the activation and RoPE + KV store run as fused Triton kernels
(`tpsample.model.kernels`); the torch code here is the CPU path and their reference.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tpsample.kernels.launcher import kernels_wanted
from tpsample.model.attention import AttentionMetadata, PagedAttention
from tpsample.model.config import ModelConfig, RopeConfig
from tpsample.model.parallel_layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    TPGroup,
    VocabParallelEmbedding,
)


def use_kernels(x: torch.Tensor) -> bool:
    """The fused Triton kernels serve CUDA tensors; CPU tensors take the torch code."""
    return kernels_wanted(x.device, cpu_ok=False)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(x), or with a residual: (norm(x + residual), x + residual) (the next residual)."""
        if use_kernels(x):
            from tpsample.model.kernels import rms_norm

            out, res = rms_norm(x, self.weight, self.eps, residual)
            return out if residual is None else (out, res)
        if residual is not None:
            x = x + residual
            return self._norm(x), x
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class SiluAndMul(nn.Module):
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] (gate | up) -> silu(gate) * up [T, I]."""
        if use_kernels(gate_up):
            from tpsample.model.kernels import silu_mul

            return silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def _base_inv_freq(base: float | torch.Tensor, dim: int) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim
    if isinstance(base, torch.Tensor):           # [T] per-token bases (dynamic NTK)
        return 1.0 / (base.unsqueeze(-1) ** exponents)
    return 1.0 / (base ** exponents)


def _llama3_inv_freq(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotates q and k by their absolute positions (neox / rotate-half layout)."""

    def __init__(self, head_dim: int, rope: RopeConfig, max_position_embeddings: int):
        super().__init__()
        self.rope = rope
        self.rotary_dim = int(head_dim * rope.partial_rotary_factor)
        self.max_position_embeddings = max_position_embeddings
        inv_freq = _base_inv_freq(rope.theta, self.rotary_dim)
        if rope.rope_type == "linear":
            inv_freq = inv_freq / rope.factor
        elif rope.rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, rope)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._table: torch.Tensor | None = None    # [positions, rotary_dim] fp32: cos | sin

    @property
    def has_table(self) -> bool:
        """Positions alone fix the angles (every type but dynamic NTK): a table can serve them."""
        return self.rope.rope_type != "dynamic"

    def cos_sin_table(self, num_positions: int, device) -> torch.Tensor:
        """[num_positions, rotary_dim] fp32, cos then sin of each angle (the fused kernel's input);
        the same fp32 angles as `forward`. Built once, grown when a longer one is asked for."""
        assert self.has_table
        t = self._table
        if t is None or t.shape[0] < num_positions or t.device != torch.device(device):
            pos = torch.arange(num_positions, device=device).float().unsqueeze(-1)
            freqs = pos * self.inv_freq.to(device)
            self._table = t = torch.cat((freqs.cos(), freqs.sin()), dim=-1).contiguous()
        return t

    def _inv_freq_per_token(self, seq_lens: torch.Tensor) -> torch.Tensor:
        """Dynamic NTK: each token uses its sequence's length, as transformers does per sequence."""
        length = seq_lens.clamp(min=self.max_position_embeddings).to(torch.float)
        f, dim = self.rope.factor, self.rotary_dim
        base = self.rope.theta * ((f * length / self.max_position_embeddings) - (f - 1)) ** (dim / (dim - 2))
        return _base_inv_freq(base, dim).to(seq_lens.device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                seq_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T]; q [T, Hq, D]; k [T, Hkv, D]; seq_lens [T] (dynamic NTK only)."""
        if self.rope.rope_type == "dynamic":
            assert seq_lens is not None, "dynamic RoPE needs each token's sequence length"
            freqs = positions.float().unsqueeze(-1) * self._inv_freq_per_token(seq_lens)
        else:
            freqs = positions.float().unsqueeze(-1) * self.inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)     # [T, 1, rotary_dim]
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        return _rotate(q, cos, sin, self.rotary_dim), _rotate(k, cos, sin, self.rotary_dim)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    out = rot * cos + rotated * sin
    return out if rest.shape[-1] == 0 else torch.cat((out, rest), dim=-1)


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
            from tpsample.model.kernels import rope_store

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
