"""KV-cache sizing and allocation, per rank.

The capacity is either fixed (`kv_cache_tokens`) or what is left of the rank's memory after a
profile of the configured step: a dummy forward over the token budget, the local logits of the
largest batch (max_num_seqs x (1 + spec tokens) rows), and one dummy sampler step at that shape
with the configured strategy. The sampler's own peak is what differs by strategy, so the memory
sharded sampling saves becomes KV blocks. Ranks agree on the smallest count.

On CUDA the forward's peak is measured with the allocator; on CPU it is estimated from the
shapes and the budget is `cpu_memory_bytes` per rank.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

import tpsample
from tpsample.engine.config import EngineConfig
from tpsample.model import CausalLM, TPGroup, build_attention_metadata

PROFILE_PARAMS = dict(temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.1)


@dataclass(frozen=True)
class MemoryProfile:
    weights_bytes: int
    forward_bytes: int        # activations + local logits at the largest step
    sampler_peak_bytes: int   # this rank's sampler peak above its inputs, largest batch
    kv_bytes_per_token: int
    num_blocks: int


def kv_bytes_per_token(model: CausalLM, dtype: torch.dtype) -> int:
    attn = model.attention_layers()
    return 2 * len(attn) * attn[0].num_kv_heads * attn[0].head_dim * torch.finfo(dtype).bits // 8


def profile_sampler(sampler, cfg: EngineConfig, dtype: torch.dtype, device: torch.device) -> int:
    """Peak bytes of one sampler step at the largest batch, through the real API."""
    k = cfg.num_speculative_tokens
    ids = [f"__profile_{i}" for i in range(cfg.max_num_seqs)]
    for i, rid in enumerate(ids):
        sampler.add_request(rid, tpsample.SamplingParams(seed=i, **PROFILE_PARAMS), [i % sampler.vocab_size])
    drafts = [[0] * k for _ in ids] if k else None
    plan = sampler.plan(ids, draft_token_ids=drafts)
    start, end = tpsample.vocab_shard(sampler.vocab_size, sampler.tp_size, sampler.rank)
    logits = torch.randn(len(ids) * (1 + k), end - start, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    sampler.sample(logits, plan)
    for rid in ids:
        sampler.remove_request(rid)
    return int(sampler.last_stats.peak_bytes)


def _forward_tokens(cfg: EngineConfig, max_model_len: int) -> int:
    return min(cfg.token_budget, max_model_len)


@torch.inference_mode()
def measure_forward_cuda(model: CausalLM, cfg: EngineConfig, max_model_len: int, device) -> int:
    """Allocator peak of a cache-less forward over the token budget plus the largest logits."""
    n = _forward_tokens(cfg, max_model_len)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    meta = build_attention_metadata([n], [n], None, cfg.block_size, device)
    hidden = model(torch.zeros(n, dtype=torch.int64, device=device), torch.arange(n, device=device), meta)
    rows = min(n, cfg.max_num_seqs * (1 + cfg.num_speculative_tokens))
    model.compute_logits(hidden[:rows])
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def estimate_forward_cpu(model: CausalLM, cfg: EngineConfig, max_model_len: int, dtype) -> int:
    """Shape-based bound on the forward's live activations (CPU has no allocator peak)."""
    mc, n = model.config, _forward_tokens(cfg, max_model_len)
    attn, mlp = model.attention_layers()[0], model.model.layers[0].mlp
    size = torch.finfo(dtype).bits // 8
    width = 4 * mc.hidden_size + 3 * mlp.gate_proj.out_features_local + \
        3 * (attn.num_heads + 2 * attn.num_kv_heads) * attn.head_dim
    scores = attn.num_heads * n * n * 4                          # one prefill chunk, fp32
    rows = min(n, cfg.max_num_seqs * (1 + cfg.num_speculative_tokens))
    vocab_local = model.lm_head.weight.shape[0]
    return n * width * size + scores + rows * vocab_local * (size + 4)


def size_kv(model: CausalLM, sampler, cfg: EngineConfig, group: TPGroup, dtype, device,
            max_model_len: int) -> MemoryProfile:
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    sampler_peak = profile_sampler(sampler, cfg, dtype, device)
    per_token = kv_bytes_per_token(model, dtype)
    if device.type == "cuda":
        forward = measure_forward_cuda(model, cfg, max_model_len, device)
        free, total = torch.cuda.mem_get_info(device)
        outside_torch = (total - free) - torch.cuda.memory_reserved(device)
        budget = int(total * cfg.gpu_memory_utilization) - outside_torch - weights
    else:
        forward = estimate_forward_cpu(model, cfg, max_model_len, dtype)
        budget = cfg.cpu_memory_bytes - weights
    if cfg.kv_cache_tokens is not None:
        num_blocks = -(-cfg.kv_cache_tokens // cfg.block_size)
    else:
        free_bytes = budget - forward - sampler_peak
        num_blocks = max(0, free_bytes // (per_token * cfg.block_size))
    agreed = torch.tensor([num_blocks], dtype=torch.int64, device=device)
    group.all_reduce(agreed, op=dist.ReduceOp.MIN)
    num_blocks = int(agreed.item())
    if num_blocks < 1:
        raise ValueError("no memory left for the KV cache: raise gpu_memory_utilization / "
                         "cpu_memory_bytes, or set kv_cache_tokens")
    return MemoryProfile(weights, forward, sampler_peak, per_token, num_blocks)


def allocate_kv(model: CausalLM, num_blocks: int, block_size: int, dtype, device) -> torch.Tensor:
    """One [layers, 2, slots, Hkv_local, D] tensor; each attention layer gets its (K, V) views."""
    layers = model.attention_layers()
    slots = num_blocks * block_size
    kv = torch.empty(len(layers), 2, slots, layers[0].num_kv_heads, layers[0].head_dim,
                     dtype=dtype, device=device)
    # Attention only gathers slots written before it reads them, plus slot 0 for padding (masked
    # out, but 0 * NaN would still poison the sum): zero that one block, leave the rest untouched
    # (on CPU, untouched pages cost nothing).
    kv[:, :, :block_size].zero_()
    for i, attn in enumerate(layers):
        attn.kv_cache = (kv[i, 0], kv[i, 1])
    return kv
