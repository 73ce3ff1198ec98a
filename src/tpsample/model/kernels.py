"""The model's Triton kernels: paged attention over block tables, and fused small ops.

The cache of one layer is two tensors `[num_slots, Hkv, D]` (K and V); token `p` of a sequence
lives in slot `table[p // page] * page + p % page`. Attention kernels:

- `decode_split`: one query per sequence (decode). Programs `(seq, kv_head, split)`: each takes
  all `G = Hq / Hkv` query heads of its KV head (GQA without repeating K/V: one read of a K/V
  tile serves the whole group) over one contiguous share of the context, and writes a partial
  (running max, sum of exponentials, unnormalised output). With one split it normalises and
  writes the output itself.
- `decode_reduce`: combines the splits of each (seq, head) (flash-decoding's second pass).
- `prefill`: any query lengths (prefill, chunked prefill, spec-decode rows). Programs
  `(query tile, q_head)`; query `i` of a sequence sits at position `seq_len - q_len + i` and
  attends to positions `<= ` its own; K/V rows are indexed by `q_head // G`.

Softmax runs in fp32 with exp2; fp32 inputs use IEEE dot products (no TF32), half inputs
accumulate in fp32. Everything a launcher (`paged_decode`, `paged_prefill`) needs is already on
the device, so decode launches can be captured in a CUDA graph (the grid depends only on the
batch size and `num_splits`); `num_decode_splits` and `prefill_tiles` lay out their work.

Fused ops (one launch each instead of the several eager torch needs):

- `rms_norm(x, weight, eps, residual)`: optionally `r = x + residual` first (returned), then
  `weight * (r * rsqrt(mean(r^2) + eps)).to(dtype)` with the statistics in fp32, as transformers.
- `silu_mul(gate_up)`: `silu(gate) * up` for the fused `[T, 2I]` projection.
- `rope_store(q, k, v, positions, cos_sin, slot_mapping, k_cache, v_cache)`: rotates q and k in
  place (neox layout, partial rotary) from a `[max_pos, rotary_dim]` fp32 table (cos | sin), and
  writes k and v into the paged cache at their slots (slot < 0: not written).

The torch references are the model's own CPU code (`model/attention.py`, `model/llama.py`). The
kernels are plain functions compiled on first use by `compiled()`, keyed by the `TRITON_INTERPRET`
setting at call time, so a test can switch the interpreter on with monkeypatch without leaking a
compiled-or-interpreted choice into other tests.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import torch
import triton
import triton.language as tl

from tpsample.kernels.launcher import cdiv, interpreting
from tpsample.numerics import next_pow2

LOG2E = 1.4426950408889634


def _decode_split(q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, part_m_ptr, part_l_ptr,
                  part_acc_ptr, scale_log2, stride_qs, stride_qh, stride_ks, stride_kh, stride_ts,
                  stride_os, stride_oh, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
                  D_PAD: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                  NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr):
    s = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + s)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    heads = kvh * G + offs_g
    g_mask = offs_g < G
    d_mask = offs_d < D
    q = tl.load(q_ptr + s.to(tl.int64) * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)                # [G_PAD, D_PAD]
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l_sum = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        p_mask = pos < end
        page = tl.load(table_ptr + s.to(tl.int64) * stride_ts + pos // PAGE, mask=p_mask, other=0)
        slot = page.to(tl.int64) * PAGE + pos % PAGE
        kv_off = slot[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :]
        kv_mask = p_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)                     # [BLOCK_N, D_PAD]
        v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # [G_PAD, BLOCK_N]
        scores = tl.where(p_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
        o_off = s.to(tl.int64) * stride_os + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])
    else:
        row = (s.to(tl.int64) * (G * tl.num_programs(1)) + heads) * NUM_SPLITS + split   # [G_PAD]
        tl.store(part_m_ptr + row, m, mask=g_mask)
        tl.store(part_l_ptr + row, l_sum, mask=g_mask)
        tl.store(part_acc_ptr + row[:, None] * D_PAD + offs_d[None, :], acc, mask=g_mask[:, None])


def _decode_reduce(out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, stride_os, stride_oh,
                   D: tl.constexpr, D_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr):
    s = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, D_PAD)
    row = (s.to(tl.int64) * tl.num_programs(1) + h) * NUM_SPLITS + offs_s      # [NUM_SPLITS]
    m = tl.load(part_m_ptr + row)
    l_sum = tl.load(part_l_ptr + row)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)     # an empty sequence (padding row)
    w = tl.exp2(m - m_max)                                     # empty splits: exp2(-inf) = 0
    total = tl.sum(w * l_sum, 0)
    acc = tl.load(part_acc_ptr + row[:, None] * D_PAD + offs_d[None, :])      # [NUM_SPLITS, D_PAD]
    out = tl.sum(acc * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + s.to(tl.int64) * stride_os + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < D)


def _prefill(q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, cu_q_ptr, tile_seq_ptr, tile_start_ptr,
             out_ptr, scale_log2, stride_qt, stride_qh, stride_ks, stride_kh, stride_ts, stride_ot,
             stride_oh, G: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, PAGE: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    tile = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // G
    s = tl.load(tile_seq_ptr + tile)
    t0 = tl.load(tile_start_ptr + tile)
    q_start = tl.load(cu_q_ptr + s)
    q_len = tl.load(cu_q_ptr + s + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + s)
    ctx0 = seq_len - q_len                                      # position of the first query
    offs_m = t0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    m_mask = offs_m < q_len
    d_mask = offs_d < D
    tok = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)                # [BLOCK_M, D_PAD]
    q_pos = ctx0 + offs_m
    kv_end = tl.minimum(seq_len, ctx0 + t0 + BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for n0 in range(0, kv_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        p_mask = pos < kv_end
        page = tl.load(table_ptr + s.to(tl.int64) * stride_ts + pos // PAGE, mask=p_mask, other=0)
        slot = page.to(tl.int64) * PAGE + pos % PAGE
        kv_off = slot[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :]
        kv_mask = p_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # [BLOCK_M, BLOCK_N]
        keep = p_mask[None, :] & (pos[None, :] <= q_pos[:, None])
        scores = tl.where(keep, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # rows with nothing visible yet
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(scores - m_safe[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    out = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
    tl.store(out_ptr + tok[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


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
    del interpret   # the cache key: triton.jit reads the setting when it wraps the functions
    return SimpleNamespace(decode_split=triton.jit(_decode_split), decode_reduce=triton.jit(_decode_reduce),
                           prefill=triton.jit(_prefill), rms_norm=triton.jit(_rms_norm),
                           silu_mul=triton.jit(_silu_mul), rope_store=triton.jit(_rope_store))


def compiled() -> SimpleNamespace:
    """The kernels, compiled (GPU) or interpreted (TRITON_INTERPRET=1), as set right now."""
    return _compile(interpreting())


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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x, residual [T, N] -> (normed [T, N], x + residual or None)."""
    num_rows, n = x.shape
    out = torch.empty(num_rows, n, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else None
    if num_rows:
        compiled().rms_norm[(num_rows,)](
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
        compiled().silu_mul[(num_rows, cdiv(n, block))](gate_up, out, gate_up.stride(0), N=n, BLOCK=block,
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
    compiled().rope_store[(num_tokens, num_q + num_kv)](
        q, k, v, positions, cos_sin, slots, kc, vc, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), kc.stride(0) if store else 0, kc.stride(1) if store else 0, NUM_Q=num_q,
        D=dim, HALF=half, HALF_PAD=next_pow2(half), D_PAD=next_pow2(dim), num_warps=1)
