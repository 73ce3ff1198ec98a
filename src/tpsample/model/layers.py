"""Single-device layers of the Llama/Qwen2 family: RMSNorm, rotary embedding, SiLU-and-mul.

Numerics follow transformers' eager code step for step (fp32 variance in RMSNorm, fp32 angles
cast to the activation dtype in RoPE) so logits match the reference tightly. On CUDA tensors the
norm and the activation run as one fused Triton kernel each (`tpsample.model.ops_kernels`); the
torch code here is the CPU path and their reference.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tpsample.kernels.launcher import kernels_wanted
from tpsample.model.config import RopeConfig


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
            from tpsample.model.ops_kernels import rms_norm

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
            from tpsample.model.ops_kernels import silu_mul

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
