"""ModelConfig: the fields of an HF config.json that the Llama/Qwen2 family needs, validated.

Reads the raw JSON (old `rope_theta` + `rope_scaling` and transformers-5 `rope_parameters`
layouts both), so the model never depends on transformers' config classes.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "dynamic")
_ARCHS = {"llama": "llama", "qwen2": "qwen2", "mistral": "llama"}


@dataclass(frozen=True, kw_only=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    partial_rotary_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope_type must be one of {SUPPORTED_ROPE_TYPES}, got {self.rope_type!r}")
        if self.factor <= 0:
            raise ValueError(f"rope factor must be > 0, got {self.factor}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    family: str                      # "llama" | "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    rope: RopeConfig = field(default_factory=RopeConfig)
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads={self.num_heads} must be a multiple of "
                             f"num_key_value_heads={self.num_kv_heads}")

    @classmethod
    def from_folder(cls, folder: str) -> "ModelConfig":
        """ValueError naming the problem for a missing folder, a file, or a broken config.json."""
        folder = os.fspath(folder)
        if os.path.isfile(folder):
            raise ValueError(f"model must be a folder (config.json + *.safetensors), got the file {folder}")
        path = os.path.join(folder, "config.json")
        if not os.path.isfile(path):
            what = "has no config.json" if os.path.isdir(folder) else "does not exist"
            raise ValueError(f"model folder {folder} {what}; expected a local HF checkpoint folder")
        try:
            with open(path) as f:
                d = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise ValueError(f"{path} must hold a JSON object, got {type(d).__name__}")
        try:
            return cls.from_dict(d)
        except KeyError as e:
            raise ValueError(f"{path} lacks the field {e.args[0]!r}") from None
        except TypeError as e:
            raise ValueError(f"{path} has a field of the wrong type: {e}") from None

    def tp_problems(self, tp: int) -> list[str]:
        """Why tensor_parallel_size=tp cannot split this model (empty when it can)."""
        problems = []
        if self.num_heads % tp:
            problems.append(f"{self.num_heads} attention heads are not divisible by {tp}")
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            problems.append(f"{self.num_kv_heads} KV heads neither divide nor are divisible by {tp}")
        if self.intermediate_size % tp:
            problems.append(f"intermediate_size {self.intermediate_size} is not divisible by {tp}")
        if self.vocab_size < tp:
            problems.append(f"vocab_size {self.vocab_size} is smaller than {tp}")
        return problems

    def check_tensor_parallel(self, tp: int) -> None:
        """ValueError (before any worker starts) when tp does not split the model; lists what works.
        The vocabulary needs no divisibility: vocab shards may differ in size by one column."""
        problems = self.tp_problems(tp)
        if problems:
            ok = [t for t in range(1, self.num_heads + 1) if not self.tp_problems(t)]
            raise ValueError(f"tensor_parallel_size={tp} cannot split this model: {'; '.join(problems)}. "
                             f"Sizes that work: {', '.join(map(str, ok))}")

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        model_type = d.get("model_type", "llama")
        if model_type not in _ARCHS:
            raise ValueError(f"model_type must be one of {sorted(_ARCHS)}, got {model_type!r}")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {d['hidden_act']!r}")
        if d.get("use_sliding_window") or (model_type == "mistral" and d.get("sliding_window")):
            raise ValueError("sliding-window attention is not supported")
        family = _ARCHS[model_type]
        heads = d["num_attention_heads"]
        attention_bias = bool(d.get("attention_bias", False))
        eos = d.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        return cls(
            family=family, vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_layers=d["num_hidden_layers"],
            num_heads=heads, num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or attention_bias,
            o_bias=family == "llama" and attention_bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            rope=_rope_from_dict(d), eos_token_ids=eos,
            torch_dtype=d.get("torch_dtype") or d.get("dtype"),
        )


def _rope_from_dict(d: dict) -> RopeConfig:
    params = dict(d.get("rope_scaling") or {})
    params.update(d.get("rope_parameters") or {})
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    kwargs = {k: params[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                     "original_max_position_embeddings") if params.get(k) is not None}
    if "original_max_position_embeddings" not in kwargs:
        kwargs["original_max_position_embeddings"] = d.get("max_position_embeddings", 8192)
    prf = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    return RopeConfig(theta=float(theta), rope_type=rope_type, partial_rotary_factor=prf, **kwargs)
