"""Fused Triton kernels for the model's small ops on the GPU path (one launch each instead of the
five to fifteen that eager torch needs; under CUDA graphs launches are most of a decode step):

- `rms_norm(x, weight, eps, residual)`: optionally `r = x + residual` first (returned), then
  `weight * (r * rsqrt(mean(r^2) + eps)).to(dtype)` with the statistics in fp32, as transformers.
- `silu_mul(gate_up)`: `silu(gate) * up` for the fused `[T, 2I]` projection.
- `rope_store(q, k, v, positions, cos_sin, slot_mapping, k_cache, v_cache)`: rotates q and k in
  place (neox layout, partial rotary) from a `[max_pos, rotary_dim]` fp32 table (cos | sin), and
  writes k and v into the paged cache at their slots (slot < 0: not written).

The torch twins are the model's own CPU code (`model/layers.py`, `model/attention.py`), which the
tests hold these against. Compiled on first use, keyed by TRITON_INTERPRET (see `attention_kernels.py`).
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from tpsample.kernels.launcher import cdiv, interpreting
from tpsample.numerics import next_pow2


def _rms_norm(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, eps, stride_x, stride_r, N: tl.constexpr,
              BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = x + tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        tl.store(res_out_ptr + row * N + offs, x, mask=mask)
    h = x.to(tl.float32)
    var = tl.sum(h * h, 0) / N
    y = (h * tl.rsqrt(var + eps)).to(x.dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * N + offs, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def _silu_mul(x_ptr, out_ptr, stride_x, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + N + offs, mask=mask, other=0.0)
    g32 = gate.to(tl.float32)
    act = (g32 / (1.0 + tl.exp(-g32))).to(gate.dtype)
    tl.store(out_ptr + row * N + offs, act * up, mask=mask)


def _rope_store(q_ptr, k_ptr, v_ptr, pos_ptr, table_ptr, slot_ptr, kc_ptr, vc_ptr, stride_qt, stride_qh,
                stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch, NUM_Q: tl.constexpr,
                D: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr, D_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + t)
    offs = tl.arange(0, HALF_PAD)
    mask = offs < HALF
    cos = tl.load(table_ptr + pos * (2 * HALF) + offs, mask=mask, other=0.0)
    sin = tl.load(table_ptr + pos * (2 * HALF) + HALF + offs, mask=mask, other=0.0)
    if h < NUM_Q:
        base = q_ptr + t * stride_qt + h * stride_qh
    else:
        base = k_ptr + t * stride_kt + (h - NUM_Q) * stride_kh
    x1 = tl.load(base + offs, mask=mask, other=0.0)
    x2 = tl.load(base + HALF + offs, mask=mask, other=0.0)
    c = cos.to(x1.dtype).to(tl.float32)
    s = sin.to(x1.dtype).to(tl.float32)
    y1 = (x1.to(tl.float32) * c - x2.to(tl.float32) * s).to(x1.dtype)
    y2 = (x2.to(tl.float32) * c + x1.to(tl.float32) * s).to(x1.dtype)
    tl.store(base + offs, y1, mask=mask)
    tl.store(base + HALF + offs, y2, mask=mask)
    if h >= NUM_Q:
        slot = tl.load(slot_ptr + t)
        if slot >= 0:
            kvh = h - NUM_Q
            offs_d = tl.arange(0, D_PAD)
            d_mask = offs_d < D
            dst = slot.to(tl.int64) * stride_cs + kvh * stride_ch + offs_d
            k_row = tl.load(k_ptr + t * stride_kt + kvh * stride_kh + offs_d, mask=d_mask)
            v_row = tl.load(v_ptr + t * stride_vt + kvh * stride_vh + offs_d, mask=d_mask)
            tl.store(kc_ptr + dst, k_row, mask=d_mask)
            tl.store(vc_ptr + dst, v_row, mask=d_mask)


@functools.cache
def _compile(interpret: bool) -> SimpleNamespace:
    del interpret
    return SimpleNamespace(rms_norm=triton.jit(_rms_norm), silu_mul=triton.jit(_silu_mul),
                           rope_store=triton.jit(_rope_store))


def _kernels() -> SimpleNamespace:
    return _compile(interpreting())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x, residual [T, N] -> (normed [T, N], x + residual or None)."""
    num_rows, n = x.shape
    out = torch.empty(num_rows, n, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else None
    if num_rows:
        _kernels().rms_norm[(num_rows,)](
            x, residual if residual is not None else x, weight, out, res_out if res_out is not None else out, eps,
            x.stride(0), residual.stride(0) if residual is not None else 0, N=n,
            BLOCK=next_pow2(n), HAS_RESIDUAL=residual is not None, num_warps=4)
    return out, res_out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] (gate | up) -> [T, I]."""
    num_rows, two_n = gate_up.shape
    n = two_n // 2
    out = torch.empty(num_rows, n, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, next_pow2(n))
    if num_rows:
        _kernels().silu_mul[(num_rows, cdiv(n, block))](gate_up, out, gate_up.stride(0), N=n, BLOCK=block,
                                                                num_warps=4)
    return out


def rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               cos_sin: torch.Tensor, slot_mapping: torch.Tensor | None, k_cache: torch.Tensor | None,
               v_cache: torch.Tensor | None) -> None:
    """q [T, Hq, D], k, v [T, Hkv, D] (views with unit last stride); rotates q, k in place and
    stores k, v at slot_mapping [T] (None: no cache)."""
    num_tokens, num_q, dim = q.shape
    num_kv = k.shape[1]
    half = cos_sin.shape[1] // 2
    if num_tokens == 0:
        return
    store = slot_mapping is not None
    slots = slot_mapping if store else positions.new_full((num_tokens,), -1)
    kc = k_cache if store else k
    vc = v_cache if store else v
    _kernels().rope_store[(num_tokens, num_q + num_kv)](
        q, k, v, positions, cos_sin, slots, kc, vc, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), kc.stride(0) if store else 0, kc.stride(1) if store else 0, NUM_Q=num_q,
        D=dim, HALF=half, HALF_PAD=next_pow2(half), D_PAD=next_pow2(dim), num_warps=1)
