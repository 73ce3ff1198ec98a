"""KV-cache sizing and allocation, per rank.

The capacity is either fixed (`kv_cache_tokens`) or what is left of the rank's memory after a
profile of the configured step: a forward over the token budget (on CUDA through the same paged
kernels as serving, over a scratch cache), the local logits of the largest batch
(max_num_seqs x (1 + spec tokens) rows), the CUDA graphs' own pool (a second set of decode
logits and activations at the largest batch), and the worst sampler step the configuration
allows: every row with logprobs up to `max_logprobs` (raw and processed), penalties, a grammar
bitmask and the draft rows, with and without top-k. The sampler's peak is what differs by
strategy, so the memory sharded sampling saves becomes KV blocks. Ranks agree on the smallest count.

On CUDA the forward's peak is measured with the allocator; on CPU it is estimated from the
shapes and the budget is `cpu_memory_bytes` per rank.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

import tpsample
from tpsample.engine.config import EngineConfig
from tpsample.model import CausalLM, TPGroup, build_attention_metadata, build_paged_metadata

PENALTIES = dict(repetition_penalty=1.1, frequency_penalty=0.1, presence_penalty=0.1)
PROFILE_MIXES = (dict(temperature=0.8, top_k=50, top_p=0.9, logprobs_mode="processed", **PENALTIES),
                 dict(temperature=1.0, top_p=0.95, min_p=0.02, logprobs_mode="raw", **PENALTIES))


@dataclass(frozen=True)
class MemoryProfile:
    weights_bytes: int
    forward_bytes: int        # activations + local logits at the largest step (+ graph pool)
    sampler_peak_bytes: int   # this rank's sampler peak above its inputs, worst profiled step
    kv_bytes_per_token: int
    num_blocks: int


def kv_bytes_per_token(model: CausalLM, dtype: torch.dtype) -> int:
    attn = model.attention_layers()
    return 2 * len(attn) * attn[0].num_kv_heads * attn[0].head_dim * torch.finfo(dtype).bits // 8


def profile_sampler(sampler, cfg: EngineConfig, dtype: torch.dtype, device: torch.device) -> int:
    """Peak bytes of the worst sampler step at the largest batch, through the real API."""
    return max(_profile_one(sampler, cfg, dtype, device, mix) for mix in PROFILE_MIXES)


def _profile_one(sampler, cfg: EngineConfig, dtype, device, mix: dict) -> int:
    k = cfg.num_speculative_tokens
    vocab = sampler.vocab_size
    ids = [f"__profile_{i}" for i in range(cfg.max_num_seqs)]
    logprobs = cfg.max_logprobs if cfg.max_logprobs > 0 else None
    for i, rid in enumerate(ids):
        params = tpsample.SamplingParams(seed=i, logprobs=logprobs, **mix)
        sampler.add_request(rid, params, [i % vocab])
    drafts = [[0] * k for _ in ids] if k else None
    rows = len(ids) * (1 + k)
    bitmask = torch.full((rows, (vocab + 31) // 32), -1, dtype=torch.int32)
    profiling, sampler.profile_memory = sampler.profile_memory, True      # the allocator's real peak
    try:
        plan = sampler.plan(ids, draft_token_ids=drafts, grammar_bitmask=bitmask)
        start, end = tpsample.vocab_shard(vocab, sampler.tp_size, sampler.rank)
        gen = torch.Generator().manual_seed(0)
        logits = torch.randn(rows, end - start, generator=gen).to(device, dtype)
        sampler.sample(logits, plan)
    finally:
        sampler.profile_memory = profiling
        for rid in ids:
            sampler.remove_request(rid)
    return int(sampler.last_stats.peak_bytes)


def _forward_tokens(cfg: EngineConfig, max_model_len: int) -> int:
    return min(cfg.token_budget, max_model_len)


def _logits_rows(cfg: EngineConfig, n: int) -> int:
    return min(n, cfg.max_num_seqs * (1 + cfg.num_speculative_tokens))


@torch.inference_mode()
def measure_forward_cuda(model: CausalLM, cfg: EngineConfig, max_model_len: int, device, dtype,
                         use_kernels: bool) -> int:
    """Allocator peak of a forward over the token budget plus the largest logits. With the kernels,
    through the paged path over a scratch cache of just that many tokens (bound, then dropped)."""
    n = _forward_tokens(cfg, max_model_len)
    layers = model.attention_layers()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    if use_kernels:
        scratch = allocate_kv(model, -(-n // cfg.block_size), cfg.block_size, dtype, device)
        base += scratch.numel() * scratch.element_size()
        pages = np.arange(-(-n // cfg.block_size))[None, :]
        meta = build_paged_metadata([n], [n], pages, np.arange(n), cfg.block_size, n, device)
    else:
        meta = build_attention_metadata([n], [n], None, cfg.block_size, device)
    hidden = model(torch.zeros(n, dtype=torch.int64, device=device), torch.arange(n, device=device), meta)
    model.compute_logits(hidden[:_logits_rows(cfg, n)])
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    if use_kernels:
        for attn in layers:
            attn.kv_cache = None
        del scratch
    return peak


def estimate_forward_cpu(model: CausalLM, cfg: EngineConfig, max_model_len: int, dtype) -> int:
    """Shape-based bound on the forward's live activations (CPU has no allocator peak)."""
    mc, n = model.config, _forward_tokens(cfg, max_model_len)
    attn, mlp = model.attention_layers()[0], model.model.layers[0].mlp
    size = torch.finfo(dtype).bits // 8
    width = 4 * mc.hidden_size + 3 * mlp.gate_up_proj.split_sizes[0] + \
        3 * (attn.num_heads + 2 * attn.num_kv_heads) * attn.head_dim
    scores = attn.num_heads * n * n * 4                          # one prefill chunk, fp32
    vocab_local = model.lm_head.weight.shape[0]
    return n * width * size + scores + _logits_rows(cfg, n) * vocab_local * (size + 4)


def graph_pool_bytes(model: CausalLM, cfg: EngineConfig, dtype) -> int:
    """The CUDA graphs' pool: decode logits and a few activations per row at the largest batch."""
    mc = model.config
    size = torch.finfo(dtype).bits // 8
    width = 4 * mc.hidden_size + 2 * model.model.layers[0].mlp.gate_up_proj.split_sizes[0]
    return cfg.max_num_seqs * (model.lm_head.weight.shape[0] + width) * size


def size_kv(model: CausalLM, sampler, cfg: EngineConfig, group: TPGroup, dtype, device,
            max_model_len: int, *, use_kernels: bool = False) -> MemoryProfile:
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    sampler_peak = profile_sampler(sampler, cfg, dtype, device)
    per_token = kv_bytes_per_token(model, dtype)
    if device.type == "cuda":
        forward = measure_forward_cuda(model, cfg, max_model_len, device, dtype, use_kernels)
        if use_kernels and cfg.cuda_graphs:
            forward += graph_pool_bytes(model, cfg, dtype)
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
        mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
        raise ValueError(f"no memory left for the KV cache (budget after weights {mib(budget)}, forward "
                         f"{mib(forward)}, sampler {mib(sampler_peak)}): raise gpu_memory_utilization / "
                         "cpu_memory_bytes, or set kv_cache_tokens")
    return MemoryProfile(weights, forward, sampler_peak, per_token, num_blocks)


def allocate_kv(model: CausalLM, num_blocks: int, block_size: int, dtype, device) -> torch.Tensor:
    """One [layers, 2, slots, Hkv_local, D] tensor; each attention layer gets its (K, V) views."""
    layers = model.attention_layers()
    slots = num_blocks * block_size
    kv = torch.empty(len(layers), 2, slots, layers[0].num_kv_heads, layers[0].head_dim,
                     dtype=dtype, device=device)
    # The torch path only gathers slots written before it reads them, plus slot 0 for padding
    # (masked out, but 0 * NaN would still poison the sum): zero that one block, leave the rest
    # untouched (on CPU, untouched pages cost nothing). The kernels never read unwritten slots.
    kv[:, :, :block_size].zero_()
    for i, attn in enumerate(layers):
        attn.kv_cache = (kv[i, 0], kv[i, 1])
    return kv
