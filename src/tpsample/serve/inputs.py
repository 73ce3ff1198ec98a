"""Request bodies into engine inputs, off the event loop.

Contract
- `Preparer.prepare(kind, body)` ("chat" or "completion", the raw body) returns a `Prepared`
  (the validated request, prompt ids and text, one SamplingParams per choice, the grammar) or
  raises: ValueError (400, the field named), RequestValidationError (400), ModelNotFound (404).
- All the work (strict JSON parsing, validation, the size limits, the chat template,
  tokenization, the sampling params) runs in a pool of `ServeConfig.prep_threads` threads, so
  a large body never stalls the event loop: /health, other requests and running streams go on.
- Strict JSON: NaN / Infinity literals and invalid UTF-8 are a 400; a lone UTF-16 surrogate
  (`"\\ud800"`) anywhere in the body is a 400 naming where it is.
- Limits, each a 400 naming the option: `max_messages` chat messages, `max_prompt_chars`
  characters of prompt text (a completion's prompt, or a chat's message contents together).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

import anyio
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from tpsample.engine.breakers import with_token_breakers
from tpsample.engine.prompts import chat_prompts, normalize_prompts
from tpsample.serve import protocol as P
from tpsample.serve.config import ServeConfig
from tpsample.serve.errors import ModelNotFound

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MODELS = {"chat": P.ChatCompletionRequest, "completion": P.CompletionRequest}


@dataclass(frozen=True)
class Prepared:
    req: BaseModel
    prompt_ids: list[int]
    prompt_text: str | None
    params: list
    guided: object


class Preparer:
    def __init__(self, tokenizer, *, model_names: tuple[str, ...], max_model_len: int, config: ServeConfig):
        self.tokenizer, self.model_names, self.max_model_len = tokenizer, model_names, max_model_len
        self.config = config
        self._limiter: anyio.CapacityLimiter | None = None

    async def prepare(self, kind: str, body: bytes) -> Prepared:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.config.prep_threads)
        return await anyio.to_thread.run_sync(self._prepare, kind, body, limiter=self._limiter)

    def _prepare(self, kind: str, body: bytes) -> Prepared:
        req = parse_body(_MODELS[kind], body)
        if req.model not in (None, "") + self.model_names:
            raise ModelNotFound(f"The model `{req.model}` does not exist; this server serves `{self.model_names[0]}`")
        P.check_ranges(req)
        texts, ids = self._chat(req) if kind == "chat" else self._completion(req)
        if not ids[0]:
            raise ValueError("the prompt is empty")
        params = P.sampling_params(req, P.max_tokens(req, len(ids[0]), self.max_model_len))
        params = [with_token_breakers(p, self.tokenizer) for p in params]      # DRY breaker strings -> ids
        return Prepared(req, ids[0], texts[0], params, P.guided_decoding(req))

    def _chat(self, req: P.ChatCompletionRequest):
        limit = self.config.max_messages
        if len(req.messages) > limit:
            raise ValueError(f"messages must hold at most {limit:,} messages (this server's --max-messages), "
                             f"got {len(req.messages):,}")
        messages = P.chat_messages(req.messages)
        self._check_chars("messages", sum(len(m["content"]) for m in messages), "characters of content in all")
        return chat_prompts(messages, self.tokenizer)

    def _completion(self, req: P.CompletionRequest):
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt = [prompt]                       # OpenAI: a flat list of ints is one prompt
        texts = [prompt] if isinstance(prompt, str) else [p for p in prompt if isinstance(p, str)]
        self._check_chars("prompt", sum(len(t) for t in texts), "characters")
        texts, ids = normalize_prompts(prompt, self.tokenizer, self.model_names[0])
        if len(ids) != 1:
            raise ValueError("prompt: give one prompt per request (a string or a list of token ids)")
        return texts, ids

    def _check_chars(self, field: str, count: int, what: str) -> None:
        limit = self.config.max_prompt_chars
        if count > limit:
            raise ValueError(f"{field} must be at most {limit:,} {what} (this server's --max-prompt-chars), "
                             f"got {count:,}")


def parse_body(model: type[BaseModel], body: bytes) -> BaseModel:
    """The body as `model`: strict JSON, valid Unicode, the model's fields and types."""
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("the request body is nested too deeply") from None
    except ValueError as e:                         # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"the request body is not valid JSON: {e}") from None
    if _SURROGATE_ESCAPE.search(body):
        try:
            _check_unicode(data, "")
        except RecursionError:
            raise ValueError("the request body is nested too deeply") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False, include_input=False)) from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def _check_unicode(obj, path: str) -> None:
    """ValueError naming the first string (or key) that holds a lone surrogate."""
    if isinstance(obj, str):
        m = _SURROGATE.search(obj)
        if m:
            raise ValueError(f"{path or 'the body'} must be valid Unicode text, but it holds a lone UTF-16 "
                             f"surrogate (\\u{ord(m.group()):04x})")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _check_unicode(k, f"a key of {path or 'the body'}")
            _check_unicode(v, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check_unicode(v, f"{path}[{i}]")
