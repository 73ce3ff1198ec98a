"""Realistic-shape presets of `tpsample bench engine` (random weights, made on the device).

- `qwen2-1.5b`: the Qwen2-1.5B shape, bf16, 64 requests x 128 prompt tokens x 64 new tokens,
  seeded top-k/top-p; TP=1; transformers' `generate` on the same GPU and batch as the reference.
- `qwen2-7b`: a Qwen2-7B-like shape, same workload.
- `kv-bound`: the 7B-like shape at TP=2 with long prompts, many requests and a memory cap that
  leaves a few GiB for the KV cache, so the sampler memory each strategy frees shows up as KV
  blocks, concurrent requests and tokens/s. `tiny-kv-bound` is its CPU-sized twin (tests).

Per run: output tokens/s, time to first token, time per output token, decode-step time, and the
share of HBM bandwidth the decode steps reach: (weights + each sequence's K/V read per step) /
decode step time, against the measured device-to-device copy bandwidth and the nominal 4.8 TB/s.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from tpsample.parallel import names

NOMINAL_HBM_BYTES_PER_S = 4.8e12      # H200 datasheet

QWEN2_15B = dict(vocab_size=151_936, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, intermediate_size=8960, tie_word_embeddings=True)
QWEN2_7B = dict(vocab_size=152_064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, intermediate_size=18944, tie_word_embeddings=False)
TINY = dict(vocab_size=4096, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=False)


@dataclass(frozen=True, kw_only=True)
class Preset:
    shape: dict
    tp: int = 1
    num_requests: int = 64
    prompt_len: int = 128
    max_tokens: int = 64
    dtype: str = "bfloat16"
    headroom_bytes: int | None = None     # cap memory at weights + this (per rank); None: 0.9 of it
    cpu_memory_bytes: int = 1 << 30
    hf_reference: bool = True
    strategies: tuple[str, ...] = ("auto",)
    engine_options: dict = field(default_factory=dict)


PRESETS = {
    "qwen2-1.5b": Preset(shape=QWEN2_15B),
    "qwen2-7b": Preset(shape=QWEN2_7B),
    "kv-bound": Preset(shape=QWEN2_7B, tp=2, num_requests=256, prompt_len=2048, max_tokens=128,
                       headroom_bytes=6 << 30, hf_reference=False,
                       strategies=names.REPORT_ORDER),
    "tiny-kv-bound": Preset(shape=TINY, tp=2, num_requests=12, prompt_len=100, max_tokens=6, dtype="float32",
                            cpu_memory_bytes=5 << 20, hf_reference=False,
                            strategies=names.FIXED,
                            engine_options=dict(max_num_batched_tokens=256)),
}


def write_config(folder: str, shape: dict, dtype: str) -> str:
    """A Qwen2 config.json (random weights come from load_format='dummy')."""
    cfg = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-6,
               rope_theta=1e6, max_position_embeddings=32768, torch_dtype=dtype, eos_token_id=None,
               bos_token_id=None, use_sliding_window=False, **shape)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    return folder


def weights_bytes_per_rank(shape: dict, tp: int, dtype_bytes: int) -> int:
    h, i, v, layers = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"], shape["num_hidden_layers"]
    d = h // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * d
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * i
    embed = v * h * (1 if shape.get("tie_word_embeddings") else 2)
    return (layers * per_layer + embed) * dtype_bytes // tp


def memory_utilization(preset: Preset, device: str) -> float:
    """The gpu_memory_utilization that caps each rank at weights + headroom (0.9 without a cap)."""
    if preset.headroom_bytes is None or device != "cuda":
        return 0.9
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    size = 2 if preset.dtype in ("bfloat16", "float16") else 4
    return min(0.95, (weights_bytes_per_rank(preset.shape, preset.tp, size) + preset.headroom_bytes) / total)


def hf_generate_tokens_per_s(folder: str, prompts: list[list[int]], max_tokens: int, dtype: str) -> float:
    """transformers' generate on the same GPU and batch: seeded top-k/top-p, exactly max_tokens each."""
    import time

    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    torch_dtype = getattr(torch, dtype)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch_dtype).eval()
    ids = torch.tensor(prompts, device="cuda")
    mask = torch.ones_like(ids)
    kwargs = dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.9, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:2], attention_mask=mask[:2], max_new_tokens=4, min_new_tokens=4, **kwargs)  # warm-up
        torch.cuda.synchronize()
        torch.manual_seed(0)
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             **kwargs)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    num_out = (out.shape[1] - ids.shape[1]) * out.shape[0]
    del model, out
    torch.cuda.empty_cache()
    return num_out / wall
