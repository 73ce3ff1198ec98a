"""OpenAI request bodies, and their translation into engine inputs.

The fields are OpenAI's (chat completions and legacy completions) plus vLLM's sampling
extensions (`top_k`, `min_p`, `repetition_penalty`, `min_tokens`, `ignore_eos`,
`stop_token_ids`, `include_stop_str_in_output`, `return_token_ids`), llama.cpp's samplers by
llama.cpp's names (`dry_*`, `xtc_*`, `top_n_sigma`; DRY breakers as strings), and for RL
`logprobs_mode` (vLLM's values; vLLM takes it per engine, here per request) and `kept_support`. Unknown fields are ignored,
as OpenAI-compatible servers do. Every bad value ends as a `ValueError` (the app answers 400
with the field in `param`); nothing here touches the engine. Every integer that reaches the
engine's int64 tables is range-checked here first (`check_ranges`), so no value can fail there.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import tpsample
from tpsample.engine.request import GuidedDecoding

MAX_N = 16
SAMPLER_FIELDS = ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
                  "xtc_threshold", "xtc_probability", "top_n_sigma", "logprobs_mode", "kept_support")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    name: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Sampling(BaseModel):
    """The fields both endpoints share."""
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    # vLLM extensions
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False
    # llama.cpp's samplers, by llama.cpp's names
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: list[str] | None = None
    xtc_threshold: float = 0.1
    xtc_probability: float = 0.0
    top_n_sigma: float = -1.0
    # for RL: which logprob values, and each token's kept support
    logprobs_mode: str = "raw_logprobs"
    kept_support: int | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


def _in_range(value: int | None, name: str, lo: int, hi: int, hi_text: str | None = None) -> None:
    if value is not None and not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi_text or hi}], got {value}")


def check_ranges(req: _Sampling) -> None:
    """Every integer field within what the engine stores (int64), before anything is built."""
    _in_range(req.n, "n", 1, MAX_N)
    for name in ("max_tokens", "max_completion_tokens"):
        _in_range(getattr(req, name, None), name, 1, INT64_MAX, "2**63 - 1")
    _in_range(req.min_tokens, "min_tokens", 0, INT64_MAX, "2**63 - 1")
    _in_range(req.top_k, "top_k", -1, INT64_MAX, "2**63 - 1")
    if req.seed is not None:            # choice i uses seed + i
        _in_range(req.seed, "seed", INT64_MIN, INT64_MAX - (req.n - 1), f"2**63 - {req.n}")
    for name in ("logprobs", "top_logprobs", "best_of"):
        value = getattr(req, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            _in_range(value, name, 0, INT64_MAX, "2**63 - 1")
    bad = [tid for tid in req.stop_token_ids or () if not 0 <= tid <= INT64_MAX]
    if bad:
        raise ValueError(f"stop_token_ids must be token ids in [0, 2**63 - 1], got {bad[0]}")


def check_unsupported(req: _Sampling) -> None:
    if isinstance(req, CompletionRequest):
        if req.echo:
            raise ValueError("echo is not supported")
        if req.suffix:
            raise ValueError("suffix is not supported")
        if req.best_of not in (None, 1) and req.best_of != req.n:
            raise ValueError("best_of must equal n (or be left out)")
    if not 1 <= req.n <= MAX_N:
        raise ValueError(f"n must be in [1, {MAX_N}], got {req.n}")


def _logprobs(req: _Sampling) -> int | None:
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if bias is None:
        return None
    try:
        out = {int(k): float(v) for k, v in bias.items()}
    except ValueError:
        raise ValueError("logit_bias keys must be token ids (strings of integers)") from None
    bad = [tid for tid in out if not 0 <= tid <= INT64_MAX]
    if bad:
        raise ValueError(f"logit_bias must be keyed by token ids in [0, 2**63 - 1], got {bad[0]}")
    return out


def max_tokens(req: _Sampling, prompt_len: int, max_model_len: int) -> int:
    """The request's max_tokens; by default whatever the context leaves (as vLLM does)."""
    room = max_model_len - prompt_len
    if room < 1:
        raise ValueError(f"the prompt has {prompt_len} tokens; this model's context is {max_model_len}")
    name, wanted = "max_completion_tokens", getattr(req, "max_completion_tokens", None)
    if wanted is None:                      # 0 is a value (a 400), not "left out"
        name, wanted = "max_tokens", req.max_tokens
    if wanted is None:
        return room
    if wanted < 1:
        raise ValueError(f"{name} must be >= 1, got {wanted}")
    if wanted > room:
        raise ValueError(f"{name}={wanted} plus the prompt's {prompt_len} tokens exceed this model's "
                         f"context of {max_model_len} tokens")
    return wanted


def sampling_params(req: _Sampling, num_max_tokens: int) -> list[tpsample.SamplingParams]:
    """One SamplingParams per choice; with a seed and n > 1, choice i uses seed + i (as vLLM)."""
    check_unsupported(req)
    check_ranges(req)
    base = dict(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
                presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                repetition_penalty=req.repetition_penalty, logit_bias=_logit_bias(req.logit_bias),
                min_tokens=req.min_tokens, stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos,
                logprobs=_logprobs(req), max_tokens=num_max_tokens, stop=req.stop,
                include_stop_str_in_output=req.include_stop_str_in_output,
                **{name: getattr(req, name) for name in SAMPLER_FIELDS})
    return [tpsample.SamplingParams(**base, seed=None if req.seed is None else req.seed + i) for i in range(req.n)]


def guided_decoding(req: _Sampling) -> GuidedDecoding | None:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return GuidedDecoding(json_object=True)
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ValueError("response_format json_schema needs json_schema.schema")
    return GuidedDecoding(json_schema=fmt.json_schema.schema_)


def chat_messages(messages: list[dict]) -> list[dict]:
    """Messages with text content only (parts of type "text" joined)."""
    if not messages:
        raise ValueError("messages must not be empty")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] needs a role")
        content = m.get("content")
        if isinstance(content, list):
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                raise ValueError(f"messages[{i}]: only text content parts are supported")
            bad = [j for j, p in enumerate(content) if not isinstance(p.get("text", ""), str)]
            if bad:
                raise ValueError(f"messages[{i}].content[{bad[0]}].text must be a string, got "
                                 f"{type(content[bad[0]]['text']).__name__}")
            content = "".join(p.get("text", "") for p in content)
        elif content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
        out.append({**m, "content": content or ""})
    return out
