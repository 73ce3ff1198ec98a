"""Request bodies into engine inputs, off the event loop.

Contract
- `Preparer.prepare(kind, body)` ("chat", "completion" or "generate", the raw body) returns a
  `Prepared` (the validated request, prompt ids and text, one SamplingParams per choice, the
  grammar, what to echo); `Preparer.run(fn, ...)` runs any other body work (/tokenize,
  /detokenize) the same way. Errors: ValueError (400, the field named), RequestValidationError
  (400), ModelNotFound (404).
- All the work (strict JSON parsing, validation, the size limits, the chat template,
  tokenization, the sampling params) runs in a pool of `ServeConfig.prep_threads` threads, so
  a large body never stalls the event loop: /health, other requests and running streams go on.
- Strict JSON: NaN / Infinity literals and a body that is not UTF-8 text are a 400; a lone
  UTF-16 surrogate (`"\\ud800"`) anywhere in the body is a 400 naming where it is.
- Limits, each a 400 naming the option: `max_messages` chat messages, `max_prompt_chars`
  characters of prompt text (a completion's prompt, or a chat's message contents together).
- Prompts: `truncate_prompt_tokens` keeps the last (or, `truncation_side: "right"`, the first) n
  tokens (-1: the model's context); `add_special_tokens` as vLLM (completions: on, chat: off).
- vLLM's /tokenize (`prompt`, or `messages` templated as in chat completions; answers count,
  max_model_len, tokens and, with `return_token_strs`, token_strs) and /detokenize (`tokens`,
  ids in the vocabulary; answers {"prompt": text}) run here too, under the same limits.
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
from tpsample.serve import sampling as S
from tpsample.serve.config import ServeConfig
from tpsample.serve.errors import ModelNotFound

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MODELS = {"chat": P.ChatCompletionRequest, "completion": P.CompletionRequest, "generate": P.GenerateRequest}
# apply_chat_template's own arguments: chat_template_kwargs may not set them
_TEMPLATE_ARGS = frozenset({"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                            "continue_final_message", "tokenize", "padding", "truncation", "max_length",
                            "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
                            "sanitize_control_tokens"})


@dataclass(frozen=True)
class Prepared:
    req: BaseModel
    prompt_ids: list[int]
    prompt_text: str | None
    params: list
    guided: object
    echo: str | None = None             # text the answer starts with (echo)
    echo_only: bool = False             # echo with max_tokens 0: the prompt alone, no output tokens
    skip_special_tokens: bool = True    # the text leaves out special tokens (EOS and the like)


class Preparer:
    def __init__(self, tokenizer, *, model_names: tuple[str, ...], max_model_len: int, config: ServeConfig,
                 defaults: dict | None = None):
        self.tokenizer, self.model_names, self.max_model_len = tokenizer, model_names, max_model_len
        self.config, self.defaults = config, defaults or {}
        self._limiter: anyio.CapacityLimiter | None = None

    async def run(self, fn, *args):
        """fn(*args) in the preparation threads."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.config.prep_threads)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def prepare(self, kind: str, body: bytes) -> Prepared:
        return await self.run(self._prepare, kind, body)

    def parse(self, model: type[BaseModel], body: bytes) -> BaseModel:
        """The body as `model`, its `model` field checked against the served names."""
        req = parse_body(model, body)
        if getattr(req, "model", None) not in (None, "") + self.model_names:
            raise ModelNotFound(f"The model `{req.model}` does not exist; this server serves `{self.model_names[0]}`")
        return req

    def _prepare(self, kind: str, body: bytes) -> Prepared:
        req = self.parse(_MODELS[kind], body)
        sampling = req.sampling_params if kind == "generate" else req
        S.check_ranges(sampling)
        if kind == "chat":
            texts, ids = self.chat_prompt(req)
        elif kind == "completion":
            texts, ids = self.text_prompt(req)
        else:
            texts, ids = [None], [list(req.token_ids)]
        prompt_ids = self._truncate(ids[0], sampling)
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        # token-in / token-out takes vLLM's SamplingParams defaults: only max_tokens comes from the config
        defaults = self.defaults if kind != "generate" else \
            {k: v for k, v in self.defaults.items() if k == "max_tokens"}
        num_max_tokens = S.max_tokens(sampling, len(prompt_ids), self.max_model_len, defaults.get("max_tokens"))
        if kind == "generate" and sampling.stop and not sampling.detokenize:
            raise ValueError("stop strings need detokenize=true; use stop_token_ids")
        params = S.sampling_params(sampling, num_max_tokens, defaults, self.tokenizer)
        params = [with_token_breakers(p, self.tokenizer) for p in params]      # DRY breaker strings -> ids
        echo = self._echo_text(req, texts[0], prompt_ids, ids[0]) if getattr(req, "echo", False) else None
        return Prepared(req, prompt_ids, texts[0] if prompt_ids == ids[0] else None, params,
                        S.guided_decoding(sampling), echo, echo_only=echo is not None and num_max_tokens == 0,
                        skip_special_tokens=sampling.skip_special_tokens is not False)

    def chat_prompt(self, req) -> tuple[list[str], list[list[int]]]:
        """([templated text], [token ids]) of a request's `messages` (chat completions, /tokenize)."""
        limit = self.config.max_messages
        if len(req.messages) > limit:
            raise ValueError(f"messages must hold at most {limit:,} messages (this server's --max-messages), "
                             f"got {len(req.messages):,}")
        messages = chat_messages(req.messages)
        self._check_chars("messages", sum(len(m["content"]) for m in messages), "characters of content in all")
        continue_final = bool(req.continue_final_message)
        add_prompt = req.add_generation_prompt if req.add_generation_prompt is not None else not continue_final
        return chat_prompts(messages, self.tokenizer, add_generation_prompt=add_prompt,
                            continue_final_message=continue_final, template_kwargs=template_kwargs(req),
                            add_special_tokens=bool(req.add_special_tokens))

    def text_prompt(self, req) -> tuple[list[str | None], list[list[int]]]:
        """([text or None], [token ids]) of a request's `prompt` (completions, /tokenize)."""
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt = [prompt]                       # OpenAI: a flat list of ints is one prompt
        texts = [prompt] if isinstance(prompt, str) else [p for p in prompt if isinstance(p, str)]
        self._check_chars("prompt", sum(len(t) for t in texts), "characters")
        texts, ids = normalize_prompts(prompt, self.tokenizer, self.model_names[0],
                                       add_special_tokens=req.add_special_tokens is not False)
        if len(ids) != 1:
            raise ValueError("prompt: give one prompt per request (a string or a list of token ids)")
        return texts, ids

    def _truncate(self, ids: list[int], req) -> list[int]:
        k = req.truncate_prompt_tokens
        if k is None:
            return ids
        k = self.max_model_len if k == -1 else k
        if k > self.max_model_len:
            raise ValueError(f"truncate_prompt_tokens={k} exceeds this model's context of {self.max_model_len} tokens")
        return ids[:k] if getattr(req, "truncation_side", None) == "right" else ids[-k:]

    def _echo_text(self, req, text: str | None, prompt_ids: list[int], ids: list[int]) -> str:
        """Completions: the prompt (decoded when given as ids or truncated); chat: the last message's
        content when it is the assistant's (the answer continues it), else nothing."""
        if isinstance(req, P.ChatCompletionRequest):
            last = req.messages[-1] if req.messages else {}
            return chat_messages([last])[0]["content"] if last.get("role") == "assistant" else ""
        if text is not None and prompt_ids == ids:
            return text
        return self.tokenizer.decode(prompt_ids) if self.tokenizer is not None else ""

    def _check_chars(self, field: str, count: int, what: str) -> None:
        limit = self.config.max_prompt_chars
        if count > limit:
            raise ValueError(f"{field} must be at most {limit:,} {what} (this server's --max-prompt-chars), "
                             f"got {count:,}")


def template_kwargs(req) -> dict | None:
    """chat_template_kwargs, refused where one would set apply_chat_template's own arguments."""
    kwargs = req.chat_template_kwargs
    clash = sorted((kwargs or {}).keys() & _TEMPLATE_ARGS)
    if clash:
        raise ValueError(f"chat_template_kwargs may not set {clash[0]!r}: it is a request field or the server's own")
    return kwargs


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


def parse_body(model: type[BaseModel], body: bytes) -> BaseModel:
    """The body as `model`: strict JSON, valid Unicode, the model's fields and types.

    The bytes are decoded as strict UTF-8 here: `json.loads` given bytes would also take UTF-16
    and UTF-32, and lets an encoded surrogate (CESU-8 `ED A0 80`) through."""
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("the request body is nested too deeply") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"the request body is not valid JSON: it is not UTF-8 text (byte {e.start}: "
                         f"{e.reason})") from None
    except ValueError as e:                         # JSONDecodeError
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


def tokenize(preparer: Preparer, body: bytes) -> dict:
    req = preparer.parse(P.TokenizeRequest, body)
    tokenizer = preparer.tokenizer
    if tokenizer is None:
        raise ValueError("prompt: /tokenize needs a tokenizer in the model folder")
    _, ids = preparer.chat_prompt(req) if req.messages is not None else preparer.text_prompt(req)
    tokens = ids[0]
    return {"count": len(tokens), "max_model_len": preparer.max_model_len, "tokens": tokens,
            "token_strs": tokenizer.convert_ids_to_tokens(tokens) if req.return_token_strs else None}


def detokenize(preparer: Preparer, vocab_size: int, body: bytes) -> dict:
    req = preparer.parse(P.DetokenizeRequest, body)
    if preparer.tokenizer is None:
        raise ValueError("tokens: /detokenize needs a tokenizer in the model folder")
    bad = [t for t in req.tokens if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"tokens must be token ids in [0, {vocab_size}), got {bad[0]}")
    return {"prompt": preparer.tokenizer.decode(req.tokens)}
