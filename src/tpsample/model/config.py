"""ModelConfig: the fields of an HF config.json that the Llama/Qwen2 family needs, validated.

Reads the raw JSON (old `rope_theta` + `rope_scaling` and transformers-5 `rope_parameters`
layouts both), so the model never depends on transformers' config classes. Every field the model
uses is checked for type and range as it is read (`ConfigFields`), and the sizes for what the
model needs of them (KV heads divide the heads; without `head_dim` the heads divide
`hidden_size`; an even rotary dimension): a bad value is one ValueError line naming config.json,
the field, the value and what is allowed (`.../config.json: num_attention_heads must be an
integer >= 1, got 0`), never an error deep inside the model. An integer field takes a JSON integer
only (`"500"`, `500.0` and `true` are refused); a real field any finite JSON number; an absent or
null field its default, and a required field that is absent is an error naming it.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "dynamic")
_ARCHS = {"llama": "llama", "qwen2": "qwen2", "mistral": "llama"}
REQUIRED = object()       # the default of a field that must be present


class ConfigFields:
    """Typed, range-checked reads of one config.json object, each failure one line (module docstring)."""

    def __init__(self, d: dict, source: str, prefix: str = ""):
        self.d, self.source, self.prefix = d, source, prefix

    def fail(self, name: str, allowed: str, value) -> ValueError:
        text = repr(value)
        text = text if len(text) <= 80 else text[:77] + "..."
        return ValueError(f"{self.source}: {self.prefix}{name} must be {allowed}, got {text}")

    def _absent(self, name: str) -> bool:
        return self.d.get(name) is None

    def _default(self, name: str, default, allowed: str):
        if default is REQUIRED:
            raise ValueError(f"{self.source} lacks the field {self.prefix}{name} ({allowed})")
        return default

    def integer(self, name: str, lo: int = 1, hi: int | None = None, default=REQUIRED) -> int:
        """A JSON integer in [lo, hi] (hi None: no upper bound)."""
        allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
        if self._absent(name):
            return self._default(name, default, allowed)
        value = self.d[name]
        if type(value) is not int or value < lo or (hi is not None and value > hi):
            raise self.fail(name, allowed, value)
        return value

    def real(self, name: str, lo: float, hi: float = math.inf, *, default=REQUIRED) -> float:
        """A finite JSON number in (lo, hi]."""
        allowed = f"a number > {lo:g}" if hi == math.inf else f"a number in ({lo:g}, {hi:g}]"
        if self._absent(name):
            return self._default(name, default, allowed)
        value = self.d[name]
        if type(value) not in (int, float) or not math.isfinite(value) or not lo < value <= hi:
            raise self.fail(name, allowed, value)
        return float(value)

    def flag(self, name: str, default: bool = False) -> bool:
        if self._absent(name):
            return default
        if type(self.d[name]) is not bool:
            raise self.fail(name, "true or false", self.d[name])
        return self.d[name]

    def text(self, name: str, choices: tuple[str, ...] | None = None, default=REQUIRED) -> str | None:
        allowed = "a string" if choices is None else f"one of {', '.join(map(repr, choices))}"
        if self._absent(name):
            return self._default(name, default, allowed)
        value = self.d[name]
        if not isinstance(value, str) or (choices is not None and value not in choices):
            raise self.fail(name, allowed, value)
        return value

    def token_ids(self, name: str) -> tuple[int, ...]:
        """null, a token id (an integer >= 0), or a list of them."""
        if self._absent(name):
            return ()
        value = self.d[name]
        ids = value if isinstance(value, list) else [value]
        if not all(type(t) is int and t >= 0 for t in ids):
            raise self.fail(name, "null, a token id (an integer >= 0) or a list of token ids", value)
        return tuple(ids)

    def section(self, name: str) -> ConfigFields:
        """A nested object (absent or null: empty), read with its name as the fields' prefix."""
        value = {} if self._absent(name) else self.d[name]
        if not isinstance(value, dict):
            raise self.fail(name, "an object or null", value)
        return ConfigFields(value, self.source, f"{self.prefix}{name}.")


def read_json_object(path: str, not_json: str = "is not valid JSON") -> dict:
    """The JSON object in the file; ValueError naming the file when it cannot be read, is not
    JSON (saying `not_json`), or holds something other than an object."""
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read())
    except OSError as e:
        raise ValueError(f"{path} cannot be read: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} {not_json}: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value


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
    def from_folder(cls, folder: str) -> ModelConfig:
        """ValueError naming the problem for a missing folder, a file, or a broken config.json."""
        folder = os.fspath(folder)
        if os.path.isfile(folder):
            raise ValueError(f"model must be a folder (config.json + *.safetensors), got the file {folder}")
        path = os.path.join(folder, "config.json")
        if not os.path.isfile(path):
            what = "has no config.json" if os.path.isdir(folder) else "does not exist"
            raise ValueError(f"model folder {folder} {what}; expected a local HF checkpoint folder")
        return cls.from_dict(read_json_object(path), source=path)

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
    def from_dict(cls, d: dict, source: str = "config.json") -> ModelConfig:
        """The config of a config.json object; every field the model uses is checked for type and
        range (ValueError naming `source`, the field, the value and what is allowed)."""
        f = ConfigFields(d, source)
        model_type = f.text("model_type", tuple(sorted(_ARCHS)), default="llama")
        f.text("hidden_act", ("silu",), default="silu")
        if d.get("use_sliding_window") or (model_type == "mistral" and d.get("sliding_window")):
            raise ValueError(f"{source}: sliding-window attention is not supported")
        family = _ARCHS[model_type]
        hidden, heads = f.integer("hidden_size"), f.integer("num_attention_heads")
        kv_heads = f.integer("num_key_value_heads", default=heads)
        if heads % kv_heads:
            raise f.fail("num_key_value_heads", f"a divisor of num_attention_heads = {heads}", kv_heads)
        head_dim = f.integer("head_dim", default=None)
        if head_dim is None:
            if hidden % heads:
                raise f.fail("num_attention_heads", f"a divisor of hidden_size = {hidden} (or head_dim given)", heads)
            head_dim = hidden // heads
        max_len = f.integer("max_position_embeddings", default=4096)
        attention_bias = f.flag("attention_bias")
        return cls(
            family=family, vocab_size=f.integer("vocab_size", hi=2**31 - 1), hidden_size=hidden,
            intermediate_size=f.integer("intermediate_size"), num_layers=f.integer("num_hidden_layers"),
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
            rms_norm_eps=f.real("rms_norm_eps", 0.0, 1.0, default=1e-6), max_position_embeddings=max_len,
            tie_word_embeddings=f.flag("tie_word_embeddings"),
            qkv_bias=family == "qwen2" or attention_bias, o_bias=family == "llama" and attention_bias,
            mlp_bias=f.flag("mlp_bias"), rope=_rope_from_fields(f, max_len, head_dim),
            eos_token_ids=f.token_ids("eos_token_id"),
            torch_dtype=f.text("torch_dtype", default=None) or f.text("dtype", default=None),
        )


def _rope_from_fields(f: ConfigFields, max_len: int, head_dim: int) -> RopeConfig:
    """RoPE from `rope_scaling` updated by `rope_parameters` (transformers 5), theta and the partial
    factor falling back to the top level."""
    scaling, params = f.section("rope_scaling"), f.section("rope_parameters")
    r = ConfigFields({**scaling.d, **{k: v for k, v in params.d.items() if v is not None}}, f.source,
                     "rope_parameters." if params.d else "rope_scaling.")
    rope_type = r.text("rope_type", SUPPORTED_ROPE_TYPES, default=r.text("type", SUPPORTED_ROPE_TYPES, "default"))
    rope = RopeConfig(
        theta=r.real("rope_theta", 0.0, default=f.real("rope_theta", 0.0, default=10000.0)), rope_type=rope_type,
        factor=r.real("factor", 0.0, default=1.0), low_freq_factor=r.real("low_freq_factor", 0.0, default=1.0),
        high_freq_factor=r.real("high_freq_factor", 0.0, default=4.0),
        original_max_position_embeddings=r.integer("original_max_position_embeddings", default=max_len),
        partial_rotary_factor=r.real("partial_rotary_factor", 0.0, 1.0,
                                     default=f.real("partial_rotary_factor", 0.0, 1.0, default=1.0)))
    if rope_type == "llama3" and rope.high_freq_factor <= rope.low_freq_factor:
        raise r.fail("high_freq_factor", f"> low_freq_factor = {rope.low_freq_factor:g} for llama3 scaling",
                     rope.high_freq_factor)
    rotary_dim, least = int(head_dim * rope.partial_rotary_factor), 4 if rope_type == "dynamic" else 2
    if rotary_dim % 2 or rotary_dim < least:
        raise ValueError(f"{f.source}: head_dim {head_dim} x partial_rotary_factor {rope.partial_rotary_factor:g} "
                         f"gives {rotary_dim} rotary dimensions; RoPE needs an even number, at least {least}")
    return rope
