"""EngineConfig: every knob of the engine, frozen and validated at construction.

`check_max_model_len` holds `max_model_len` to the checkpoint's context (`model_len_limit`);
setting TPSAMPLE_ALLOW_LONG_MAX_MODEL_LEN=1 allows a longer one with a warning (as vLLM's
VLLM_ALLOW_LONG_MAX_MODEL_LEN): positions past the trained range give unreliable outputs.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

from tpsample.parallel import names

STRATEGIES = names.ALL
DEVICES = ("cpu", "cuda")
LOAD_FORMATS = ("safetensors", "dummy")
ALLOW_LONG_MAX_MODEL_LEN = "TPSAMPLE_ALLOW_LONG_MAX_MODEL_LEN"
SCALED_ROPE_TYPES = ("linear", "dynamic")     # rope types whose factor stretches the context


@dataclass(frozen=True, kw_only=True)
class NgramConfig:
    """Prompt-lookup drafts: match the last n tokens (max_n down to min_n) earlier in the history
    and propose the up to `num_speculative_tokens` tokens that followed the latest match."""
    num_speculative_tokens: int = 4
    min_n: int = 1
    max_n: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {self.num_speculative_tokens!r}")
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"ngram sizes must satisfy 1 <= min_n <= max_n, got {self.min_n}, {self.max_n}")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    model: str                                  # local HF folder: config.json + *.safetensors
    tensor_parallel_size: int = 1
    strategy: str = "auto"                      # the sampler strategy
    device: str | None = None                   # None: cuda if one GPU per rank, else cpu
    dtype: str | None = None                    # None: the checkpoint's dtype
    gpu_memory_utilization: float = 0.9
    cpu_memory_bytes: int = 2 << 30             # per-rank budget used to size the KV cache on CPU
    max_num_seqs: int = 256
    max_model_len: int | None = None            # None: config max_position_embeddings, capped by KV
    max_num_batched_tokens: int | None = None   # token budget per step; None: max(2048, seqs*(1+k))
    speculative_ngram: NgramConfig | None = None
    kv_cache_tokens: int | None = None          # fixes KV capacity instead of profiling
    block_size: int = 16
    max_logprobs: int = 20
    step_timeout_s: float = 300.0               # a step with no answer from the workers fails
    startup_timeout_s: float = 600.0
    cuda_graphs: bool = True                    # replay decode steps from CUDA graphs (GPU only)
    load_format: str = "safetensors"            # "dummy": random weights, only config.json is read

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "max_num_seqs", "block_size"):
            _positive_int(getattr(self, name), name)
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.device is not None and self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES} or None, got {self.device!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        if not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be True or False, got {self.cuda_graphs!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        for name in ("max_model_len", "max_num_batched_tokens", "kv_cache_tokens"):
            if getattr(self, name) is not None:
                _positive_int(getattr(self, name), name)
        if self.speculative_ngram is not None and not isinstance(self.speculative_ngram, NgramConfig):
            raise ValueError("speculative_ngram must be an NgramConfig or None")

    @property
    def num_speculative_tokens(self) -> int:
        return 0 if self.speculative_ngram is None else self.speculative_ngram.num_speculative_tokens

    @property
    def token_budget(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return max(2048, self.max_num_seqs * (1 + self.num_speculative_tokens))


def _positive_int(value, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def model_len_limit(model_config) -> int:
    """The checkpoint's context: `max_position_embeddings`, times the rope factor for linear and
    dynamic scaling (as vLLM derives it; llama3 scaling states the extended length itself)."""
    limit = model_config.max_position_embeddings
    rope = model_config.rope
    if rope.rope_type in SCALED_ROPE_TYPES:
        limit = int(limit * rope.factor)
    return limit


def check_max_model_len(max_model_len: int | None, model_config) -> None:
    """ValueError if `max_model_len` exceeds the checkpoint's context (`model_len_limit`), unless
    the environment sets TPSAMPLE_ALLOW_LONG_MAX_MODEL_LEN=1 (or true): then a warning."""
    limit = model_len_limit(model_config)
    if max_model_len is None or max_model_len <= limit:
        return
    allowed = os.environ.get(ALLOW_LONG_MAX_MODEL_LEN, "0").strip().lower() in ("1", "true")
    rope, mpe = model_config.rope, model_config.max_position_embeddings
    source = f"config.json max_position_embeddings={mpe}"
    if limit != mpe:
        source += f" x rope {rope.rope_type} factor {rope.factor:g}"
    what = f"max_model_len={max_model_len} exceeds the checkpoint's context of {limit} tokens ({source})"
    if not allowed:
        raise ValueError(f"{what}; use max_model_len <= {limit}, or set {ALLOW_LONG_MAX_MODEL_LEN}=1 to "
                         "allow it (positions past the trained range may give wrong outputs)")
    warnings.warn(f"{what}; allowed by {ALLOW_LONG_MAX_MODEL_LEN}=1: positions past the trained range may give "
                  "wrong outputs", UserWarning, stacklevel=3)
