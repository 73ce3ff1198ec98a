"""A validated request (`protocol`) into what the engine takes: one SamplingParams per choice, the
grammar, the token budget. Every bad value is a ValueError naming the field (a 400).

Defaults: a sampling field the request leaves out (absent or null) takes the model's generation
config (`--generation-config`, `GenerationDefaults`), then OpenAI's. Every integer that reaches
the engine's int64 tables is range-checked first (`check_ranges`), so no value can fail there.
"""
from __future__ import annotations

import json
import os

import tpsample
from tpsample.coerce import INT64_MAX
from tpsample.engine.hf_files import SAMPLING_FIELDS, check_sampling_defaults, sampling_defaults
from tpsample.engine.request import GuidedDecoding
from tpsample.params import LOGIT_BIAS_BOUND
from tpsample.serve import protocol as P

MAX_N = 16
INT64_MIN = -INT64_MAX - 1
# the samplers' fields a request passes on as they are (SamplingParams checks them)
SAMPLER_FIELDS = ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
                  "xtc_threshold", "xtc_probability", "top_n_sigma", "logprobs_mode", "kept_support")
# OpenAI's defaults, where neither the request nor the generation config sets a field
OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                   "presence_penalty": 0.0, "frequency_penalty": 0.0}

GENERATION_CONFIG_MODES = ("auto", "vllm", "none")


def generation_defaults(mode: str, folder: str, override: dict | None = None) -> dict:
    """The request defaults of `--generation-config MODE` and `--override-generation-config`:
    "auto" reads the model folder's generation_config.json (temperature, top_p, top_k, min_p,
    repetition_penalty, max_new_tokens as max_tokens); "vllm" or "none" reads nothing; any other
    value is a folder to read it from (as vLLM). The override's fields win. ValueError naming the
    file (or the option) and the field for a value of the wrong type."""
    if mode in ("vllm", "none"):
        defaults = {}
    elif mode == "auto":
        defaults = sampling_defaults(folder)
    elif os.path.isdir(mode):
        defaults = sampling_defaults(mode)
    else:
        raise ValueError(f"--generation-config must be one of {GENERATION_CONFIG_MODES} or a folder holding "
                         f"generation_config.json, got {mode!r}")
    if override:
        unknown = sorted(set(override) - set(SAMPLING_FIELDS))
        if unknown:
            raise ValueError(f"--override-generation-config: {unknown[0]!r} is not one of {sorted(SAMPLING_FIELDS)}")
        defaults = {**defaults, **check_sampling_defaults(override, "--override-generation-config")}
    try:                                    # every request without these fields will use them: check now
        tpsample.SamplingParams(**{k: v for k, v in defaults.items() if k != "top_k"}, top_k=defaults.get("top_k") or -1)
    except ValueError as e:
        raise ValueError(f"the sampling defaults of --generation-config {mode} and --override-generation-config: "
                         f"{e}") from None
    return defaults


def _in_range(value: int | None, name: str, lo: int, hi: int, hi_text: str | None = None) -> None:
    if value is not None and not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi_text or hi}], got {value}")


def check_ranges(req) -> None:
    """Every integer field within what the engine stores (int64), before anything is built."""
    n = num_choices(req)
    _in_range(n, "n", 1, MAX_N)
    echo = bool(getattr(req, "echo", False))
    for name in ("max_tokens", "max_completion_tokens"):
        _in_range(getattr(req, name, None), name, 0 if echo else 1, INT64_MAX, "2**63 - 1")
    _in_range(req.min_tokens, "min_tokens", 0, INT64_MAX, "2**63 - 1")
    _in_range(req.top_k, "top_k", -1, INT64_MAX, "2**63 - 1")
    if req.seed is not None:            # choice i uses seed + i
        _in_range(req.seed, "seed", INT64_MIN, INT64_MAX - (n - 1), f"2**63 - {n}")
    for name in ("logprobs", "top_logprobs", "best_of", "prompt_logprobs"):
        value = getattr(req, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            _in_range(value, name, 0, INT64_MAX, "2**63 - 1")
    if req.truncate_prompt_tokens is not None and req.truncate_prompt_tokens != -1:
        _in_range(req.truncate_prompt_tokens, "truncate_prompt_tokens", 1, INT64_MAX, "2**63 - 1 (or -1)")
    for name in ("stop_token_ids", "allowed_token_ids"):
        bad = [tid for tid in getattr(req, name) or () if not 0 <= tid <= INT64_MAX]
        if bad:
            raise ValueError(f"{name} must be token ids in [0, 2**63 - 1], got {bad[0]}")
    if getattr(req, "best_of", None) not in (None, 1, n):
        raise ValueError("best_of must equal n (or be left out)")


def num_choices(req) -> int:
    return 1 if req.n is None else req.n


def logprobs(req) -> int | None:
    """The top-n of each output token's logprobs (None: no logprobs)."""
    if isinstance(req, P.ChatCompletionRequest):
        if req.top_logprobs and not req.logprobs:          # 0 is OpenAI's default: allowed alone
            raise ValueError("top_logprobs needs logprobs=true")
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


def prompt_logprobs(req) -> int | None:
    """vLLM: echo with logprobs returns the prompt's too (the top-n of the output's)."""
    if req.prompt_logprobs is None and getattr(req, "echo", False):
        return logprobs(req)
    return req.prompt_logprobs


def logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """Keys as token ids, values clamped to [-100, 100] (as vLLM); ids outside the vocabulary are
    refused by the engine."""
    if bias is None:
        return None
    try:
        out = {int(k): max(-LOGIT_BIAS_BOUND, min(LOGIT_BIAS_BOUND, v)) for k, v in bias.items()}
    except ValueError:
        raise ValueError("logit_bias keys must be token ids (strings of integers)") from None
    bad = [tid for tid in out if not 0 <= tid <= INT64_MAX]
    if bad:
        raise ValueError(f"logit_bias must be keyed by token ids in [0, 2**63 - 1], got {bad[0]}")
    return out


def bad_words(words: list[str] | None, tokenizer) -> list[list[int]] | None:
    """Each word's token ids, alone and after a space when that is a different token (as vLLM), so
    the word is banned at the start of the text and inside it."""
    if not words:
        return None
    if tokenizer is None:
        raise ValueError("bad_words needs a tokenizer in the model folder")
    out = []
    for word in words:
        ids = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        if not ids:
            raise ValueError(f"bad_words: {word!r} has no tokens")
        out.append(ids)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced and spaced[0] != ids[0] and len(spaced) == len(ids):
            out.append(spaced)
    return out


def max_tokens(req, prompt_len: int, max_model_len: int, default: int | None = None) -> int:
    """The request's max_tokens; left out: the generation config's, else what the context leaves
    (chat, as vLLM) or 16 (completions, OpenAI's default). 0 only with echo (the prompt alone)."""
    room = max_model_len - prompt_len
    if room < 1:
        raise ValueError(f"the prompt has {prompt_len} tokens; this model's context is {max_model_len}")
    name, wanted = "max_completion_tokens", getattr(req, "max_completion_tokens", None)
    if wanted is None:                      # 0 is a value, not "left out"
        name, wanted = "max_tokens", req.max_tokens
    if wanted is None:
        fallback = 16 if isinstance(req, P.CompletionRequest) else room
        return min(room, default) if default is not None else fallback
    if wanted < (0 if getattr(req, "echo", False) else 1):
        raise ValueError(f"{name} must be >= 1 (0 only with echo), got {wanted}")
    if wanted > room:
        raise ValueError(f"{name}={wanted} plus the prompt's {prompt_len} tokens exceed this model's "
                         f"context of {max_model_len} tokens")
    return wanted


def sampling_params(req, num_max_tokens: int, defaults: dict, tokenizer) -> list[tpsample.SamplingParams]:
    """One SamplingParams per choice; with a seed and n > 1, choice i uses seed + i (as vLLM).
    Only choice 0 computes the prompt's logprobs (the same for every choice), unless each choice
    echoes them (echo with logprobs)."""
    check_ranges(req)
    pick = {name: getattr(req, name) if getattr(req, name) is not None else defaults.get(name, default)
            for name, default in OPENAI_DEFAULTS.items()}
    if pick["top_k"] == 0:
        pick["top_k"] = -1                  # vLLM's "off"
    base = dict(**pick, logit_bias=logit_bias(req.logit_bias), min_tokens=req.min_tokens or 0,
                stop_token_ids=req.stop_token_ids, ignore_eos=bool(req.ignore_eos), logprobs=logprobs(req),
                max_tokens=max(1, num_max_tokens), stop=req.stop or None,
                include_stop_str_in_output=bool(req.include_stop_str_in_output),
                allowed_token_ids=req.allowed_token_ids, bad_words_token_ids=bad_words(req.bad_words, tokenizer))
    base.update({name: getattr(req, name, None) for name in SAMPLER_FIELDS if getattr(req, name, None) is not None})
    first_prompt_logprobs, echo = prompt_logprobs(req), bool(getattr(req, "echo", False))
    return [tpsample.SamplingParams(**base, seed=None if req.seed is None else req.seed + i,
                                    prompt_logprobs=first_prompt_logprobs if i == 0 or echo else None)
            for i in range(num_choices(req))]


def guided_decoding(req) -> GuidedDecoding | None:
    """The grammar of `response_format` or `structured_outputs` (not both)."""
    fmt, so = getattr(req, "response_format", None), req.structured_outputs
    if fmt is not None and fmt.type != "text" and so is not None:
        raise ValueError("structured_outputs: give either response_format or structured_outputs, not both")
    if so is not None:
        return _structured_outputs(so)
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return GuidedDecoding(json_object=True)
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ValueError("response_format json_schema needs json_schema.schema")
    return GuidedDecoding(json_schema=fmt.json_schema.schema_)


def _structured_outputs(so: P.StructuredOutputs) -> GuidedDecoding:
    given = [name for name, value in (("json", so.json_), ("regex", so.regex), ("choice", so.choice),
                                      ("grammar", so.grammar), ("json_object", so.json_object or None))
             if value is not None]
    if len(given) != 1:
        raise ValueError(f"structured_outputs must hold exactly one of json, regex, choice, grammar, json_object; "
                         f"got {given or 'none'}")
    if so.json_ is not None:
        return GuidedDecoding(json_schema=so.json_, any_whitespace=so.disable_any_whitespace is False)
    if so.regex is not None:
        return GuidedDecoding(regex=so.regex)
    if so.choice is not None:
        if not so.choice:
            raise ValueError("structured_outputs.choice must hold at least one string")
        return GuidedDecoding(grammar="root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in so.choice))
    if so.grammar is not None:
        return GuidedDecoding(grammar=so.grammar)
    return GuidedDecoding(json_object=True)
