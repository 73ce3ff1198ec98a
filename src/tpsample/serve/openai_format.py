"""Engine outputs as OpenAI JSON: responses, stream chunks, logprobs, usage.

Plain dicts, shaped as OpenAI's chat.completion / chat.completion.chunk / text_completion
objects, plus vLLM's fields: `stop_reason` on every choice, and with `return_token_ids` the
`token_ids` of each choice and the `prompt_token_ids`. Everything is strict JSON: a logprob
that is not finite (-inf for a token a grammar forbids, NaN from NaN logits) is reported as
-9999.0, as OpenAI does.
"""
from __future__ import annotations

import functools
import math
import time

from tpsample.engine.request import TokenLogprob


def _gpt2_byte_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2 and its descendants) back to bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, extra = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenText:
    """Token id -> (text, raw bytes) for logprobs, cached; exact bytes for byte-level BPE."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._byte_level = decoder is not None and "ByteLevel" in type(decoder).__name__ + repr(decoder)
        self._bytes_of = _gpt2_byte_decoder() if self._byte_level else None
        self.get = functools.lru_cache(maxsize=65536)(self._get)

    def _get(self, token_id: int) -> tuple[str, list[int]]:
        text = self.tokenizer.decode([token_id])
        if self._byte_level:
            raw = self.tokenizer.convert_ids_to_tokens(token_id)
            if raw is not None and all(ch in self._bytes_of for ch in raw):
                return text, [self._bytes_of[ch] for ch in raw]
        return text, list(text.encode("utf-8"))


FLOOR_LOGPROB = -9999.0


def finite(lp: float) -> float:
    """A logprob JSON can carry: -inf and NaN become -9999.0."""
    return lp if math.isfinite(lp) else FLOOR_LOGPROB


def kept_support_json(supports) -> list[dict] | None:
    """Per token its kept support (count, bounds, ids); a bound that is not finite is null."""
    if supports is None:
        return None
    bound = lambda v: v if math.isfinite(v) else None  # noqa: E731
    return [{"count": s.count, "threshold": bound(s.threshold), "upper": bound(s.upper),
             "token_ids": list(s.token_ids)} for s in supports]


def chat_logprobs(tt: TokenText, lps: list[TokenLogprob]) -> dict:
    def entry(tid: int, lp: float) -> dict:
        text, raw = tt.get(tid)
        return {"token": text, "logprob": finite(lp), "bytes": raw}

    return {"content": [{**entry(lp.token_id, lp.logprob),
                         "top_logprobs": [entry(t, v) for t, v in zip(lp.top_token_ids, lp.top_logprobs)]}
                        for lp in lps]}


def completion_logprobs(tt: TokenText, lps: list[TokenLogprob], offset: int) -> dict:
    tokens, offsets = [], []
    for lp in lps:
        text = tt.get(lp.token_id)[0]
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [finite(lp.logprob) for lp in lps], "text_offset": offsets,
            "top_logprobs": [{tt.get(t)[0]: finite(v) for t, v in zip(lp.top_token_ids, lp.top_logprobs)}
                             for lp in lps]}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Formatter:
    """Builds the JSON of one HTTP request (chat or completion)."""

    def __init__(self, kind: str, model: str, tokenizer, *, return_token_ids: bool = False):
        assert kind in ("chat", "completion")
        self.kind, self.model, self.return_token_ids = kind, model, return_token_ids
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + _uid()
        self.created = int(time.time())
        self.tt = TokenText(tokenizer)
        self._offsets: dict[int, int] = {}      # completion logprobs: characters streamed per choice

    def _head(self, chunk: bool) -> dict:
        obj = {"chat": ("chat.completion", "chat.completion.chunk"), "completion": ("text_completion",) * 2}
        return {"id": self.id, "object": obj[self.kind][chunk], "created": self.created, "model": self.model}

    def _logprobs(self, index: int, lps):
        if lps is None:
            return None
        if self.kind == "chat":
            return chat_logprobs(self.tt, lps)
        out = completion_logprobs(self.tt, lps, self._offsets.get(index, 0))
        self._offsets[index] = self._offsets.get(index, 0) + sum(len(t) for t in out["tokens"])
        return out

    def response(self, tracked: list, prompt_token_ids: list[int]) -> dict:
        choices = []
        for t in tracked:
            out = t.output()
            choice = {"index": t.index, "logprobs": self._logprobs(t.index, out.logprobs),
                      "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
            if self.kind == "chat":
                choice["message"] = {"role": "assistant", "content": out.text}
            else:
                choice["text"] = out.text
            if self.return_token_ids:
                choice["token_ids"] = out.output_token_ids
            if out.kept_support is not None:
                choice["kept_support"] = kept_support_json(out.kept_support)
            choices.append(choice)
        body = {**self._head(False), "choices": choices,
                "usage": usage(len(prompt_token_ids), sum(len(t.output_token_ids) for t in tracked))}
        if self.return_token_ids:
            body["prompt_token_ids"] = list(prompt_token_ids)
        return body

    def chunk(self, index: int, delta, logprobs=None, kept_support=None) -> dict:
        """One stream chunk for choice `index`; delta is a StreamDelta or, for chat, a dict;
        kept_support: the new tokens' kept supports, when the request asked."""
        choice = {"index": index, "logprobs": logprobs, "finish_reason": None}
        if isinstance(delta, dict):
            choice["delta"] = delta
        else:
            choice["logprobs"] = self._logprobs(index, logprobs)
            if self.kind == "chat":
                choice["delta"] = {"content": delta.text} if delta.text or not delta.finished else {}
            else:
                choice["text"] = delta.text
            if delta.finished:
                choice["finish_reason"], choice["stop_reason"] = delta.finish_reason, delta.stop_reason
            if self.return_token_ids:
                choice["token_ids"] = list(delta.new_token_ids)
            if kept_support is not None:
                choice["kept_support"] = kept_support_json(kept_support)
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self._head(True), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}


def _uid() -> str:
    import uuid

    return uuid.uuid4().hex[:24]
