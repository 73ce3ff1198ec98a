"""Request bodies: OpenAI's chat and legacy completions, vLLM's extensions, and vLLM's tokenizer
and token-in / token-out endpoints, as strict pydantic models.

Every field a body may hold is either one of the models' fields, each applied (docs/serving.md
says where), or refused with a 400 naming it: a field of OpenAI's or vLLM's that tpsample does
not implement is refused by name with the reason (`REFUSED`, unless it holds its no-op value,
e.g. `"tool_choice": "none"`), any other unknown field as unknown. JSON types are taken as they
are ("7" is not an integer, 1 not a boolean). `null` means "left out": the server's default,
which for sampling fields is the model's generation config, then OpenAI's.
Nothing here touches the engine; `sampling.py` turns a model into engine inputs.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

_TOOLS = "tools and function calling are not supported"
_CHAT_TEMPLATE = "a request may not carry its own chat template (templates run code on the server)"
# field -> (values that change nothing and are accepted, why any other value is refused)
REFUSED: dict[str, tuple[tuple, str]] = {
    "tools": ((None, []), _TOOLS), "tool_choice": ((None, "none"), _TOOLS), "functions": ((None, []), _TOOLS),
    "function_call": ((None, "none"), _TOOLS), "parallel_tool_calls": ((None,), _TOOLS),
    "suffix": ((None, ""), "suffix (insertion) is not supported"),
    "chat_template": ((None,), _CHAT_TEMPLATE),
    "documents": ((None, []), "documents (RAG chat templates) are not supported"),
    "reasoning_effort": ((None,), "reasoning models' options are not supported"),
    "use_beam_search": ((None, False), "beam search is not supported"),
    "length_penalty": ((None, 1.0, 1), "length_penalty belongs to beam search, which is not supported"),
    "logprob_token_ids": ((None,), "logprobs of given token ids are not supported; use top_logprobs"),
    "logits_processors": ((None, []), "custom logits processors are not supported"),
    "guided_json": ((None,), "use structured_outputs.json"), "guided_regex": ((None,), "use structured_outputs.regex"),
    "guided_choice": ((None,), "use structured_outputs.choice"),
    "guided_grammar": ((None,), "use structured_outputs.grammar"),
    "cache_salt": ((None,), "there is no prefix cache to salt"),
    "kv_transfer_params": ((None,), "disaggregated serving is not supported"),
    "vllm_xargs": ((None,), "custom extensions are not supported"),
    "extra_args": ((None,), "custom extensions are not supported"),
    "mm_processor_kwargs": ((None,), "images and audio are not supported"),
    "media_io_kwargs": ((None,), "images and audio are not supported"),
    "modalities": ((None, ["text"]), "only text output is supported"), "audio": ((None,), "audio is not supported"),
    "prompt_embeds": ((None,), "prompt embeddings are not supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
}


class _Model(BaseModel):
    """Strict JSON types, unknown fields refused, the fields of `REFUSED` refused with their reason."""
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data):
        if isinstance(data, dict):
            for name in data.keys() & REFUSED.keys():
                noop, why = REFUSED[name]
                if data[name] not in noop:
                    raise field_error(name, f"{name} is not supported: {why}")
            data = {k: v for k, v in data.items() if k not in REFUSED}
        return data


def field_error(field: str, message: str) -> PydanticCustomError:
    """A validation error that names `field` (the server answers 400 with it as `param`)."""
    return PydanticCustomError("field_error", message.replace("{", "{{").replace("}", "}}"), {"field": field})


class StreamOptions(_Model):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False         # usage in every chunk (vLLM)


class JsonSchemaFormat(_Model):
    name: str | None = None
    description: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None                          # the schema is always enforced exactly


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Model):
    """vLLM's structured outputs: exactly one of json, regex, choice, grammar (EBNF), json_object."""
    json_: dict | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool | None = None          # True: compact JSON (the default here); False: any
    disable_fallback: bool | None = None                # one backend (xgrammar): nothing to fall back to
    disable_additional_properties: Literal[False] | None = None
    whitespace_pattern: None = None
    structural_tag: None = None


class _Sampling(_Model):
    """Fields chat and completions share (vLLM's names for its extensions)."""
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None                             # the caller's id for its own records: no effect
    request_id: str | None = None                       # the response's id
    priority: Literal[0] | None = None                  # no priority scheduling: 0 only
    # vLLM's extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: Literal[True] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    prompt_logprobs: int | None = None
    echo: bool | None = None
    add_special_tokens: bool | None = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    structured_outputs: StructuredOutputs | None = None
    # llama.cpp's samplers, by llama.cpp's names (DRY breakers as strings, mapped with the tokenizer)
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    xtc_threshold: float | None = None
    xtc_probability: float | None = None
    top_n_sigma: float | None = None
    # for RL: which logprob values (vLLM's names; vLLM takes it per engine, here per request), and
    # each sampled token's kept support with up to this many ids
    logprobs_mode: str | None = None
    kept_support: int | None = None

    @model_validator(mode="after")
    def _check_streaming(self):
        if self.stream_options is not None and not self.stream:
            raise field_error("stream_options", "stream_options is only allowed with stream=true")
        if self.stream and self.prompt_logprobs is not None:
            raise field_error("prompt_logprobs", "prompt_logprobs is not available with stream=true (as in vLLM)")
        return self


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    best_of: int | None = None                          # n, or left out


class TokenizeRequest(_Model):
    """vLLM's /tokenize: `prompt` (text) or `messages` (the chat template applied)."""
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = None

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise field_error("prompt", "give exactly one of prompt and messages")
        return self


class DetokenizeRequest(_Model):
    model: str | None = None
    tokens: list[int]


class GenerateSamplingParams(_Model):
    """vLLM's SamplingParams as /inference/v1/generate takes them (its names and defaults)."""
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = None
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True                             # False: stop strings are refused (they need text)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: Literal[True] = True
    include_stop_str_in_output: Literal[False] = False  # it changes text only, and there is no text here
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: StructuredOutputs | None = None
    truncate_prompt_tokens: int | None = None


class GenerateRequest(_Model):
    """vLLM's token-in / token-out request: token ids in, token ids and logprobs out."""
    request_id: str | None = None
    token_ids: list[int]
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    priority: Literal[0] | None = None


def _field_names(*models) -> frozenset[str]:
    names = set(REFUSED)
    for model in models:
        names |= {f.alias or name for name, f in model.model_fields.items()}
    return frozenset(names)


# every field name a request body may hold, refused ones included (errors name them as `param`)
FIELD_NAMES = _field_names(ChatCompletionRequest, CompletionRequest, TokenizeRequest, DetokenizeRequest,
                           GenerateRequest, GenerateSamplingParams, StreamOptions, StructuredOutputs)
