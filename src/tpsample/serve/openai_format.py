"""Engine outputs as OpenAI JSON: responses, stream chunks, usage and logprobs; and vLLM's
token-in / token-out responses (`/inference/v1/generate`).

Plain dicts, shaped as OpenAI's chat.completion / chat.completion.chunk / text_completion
objects, plus vLLM's fields: `stop_reason` on every choice; with `return_token_ids` the
`token_ids` of each choice and the `prompt_token_ids`; `prompt_logprobs` (chat: on the response,
completions: on each choice); `echo` (the prompt, or chat's last assistant message, starts the
answer; completions' logprobs then start with the prompt's); `stream_options.
continuous_usage_stats` (usage in every chunk, the choice's tokens so far). The `id` is
"chatcmpl-" / "cmpl-" and the request's `request_id` when it gave one.
Logprobs show tokens as their text (exact bytes for byte-level BPE) or, with
`return_tokens_as_token_ids`, as "token_id:<id>" (vLLM); a logprob that is not finite (-inf for
a token a grammar forbids, NaN from NaN logits) is -9999.0, as OpenAI reports it.
"""
from __future__ import annotations

import functools
import math
import time
import uuid

from tpsample.engine.request import TokenLogprob
from tpsample.serve.inputs import Prepared


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
    """Token id -> (text, raw bytes) for logprobs, cached; exact bytes for byte-level BPE.
    as_ids: the text is "token_id:<id>" (vLLM's `return_tokens_as_token_ids`)."""

    def __init__(self, tokenizer, *, as_ids: bool = False):
        self.tokenizer, self.as_ids = tokenizer, as_ids
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._byte_level = decoder is not None and "ByteLevel" in type(decoder).__name__ + repr(decoder)
        self._bytes_of = _gpt2_byte_decoder() if self._byte_level else None
        self.get = functools.lru_cache(maxsize=65536)(self._get)

    def _get(self, token_id: int) -> tuple[str, list[int]]:
        if self.tokenizer is None:
            return f"token_id:{token_id}", []
        text = self.tokenizer.decode([token_id])
        raw = list(text.encode("utf-8"))
        if self._byte_level:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if piece is not None and all(ch in self._bytes_of for ch in piece):
                raw = [self._bytes_of[ch] for ch in piece]
        return (f"token_id:{token_id}" if self.as_ids else text), raw

    def text(self, token_id: int) -> str:
        return self.get(token_id)[0]


FLOOR_LOGPROB = -9999.0


def finite(lp: float) -> float:
    """A logprob JSON can carry: -inf and NaN become -9999.0."""
    return lp if math.isfinite(lp) else FLOOR_LOGPROB


def chat_logprobs(tt: TokenText, lps: list[TokenLogprob]) -> dict:
    def entry(tid: int, lp: float) -> dict:
        text, raw = tt.get(tid)
        return {"token": text, "logprob": finite(lp), "bytes": raw}

    return {"content": [{**entry(lp.token_id, lp.logprob),
                         "top_logprobs": [entry(t, v) for t, v in zip(lp.top_token_ids, lp.top_logprobs)]}
                        for lp in lps]}


def completion_logprobs(tt: TokenText, lps: list, offset: int) -> dict:
    """Completions' logprobs of `lps`, the first token's text starting at character `offset`."""
    tokens, offsets = [], []
    for lp in lps:
        text = tt.text(lp.token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [finite(lp.logprob) for lp in lps], "text_offset": offsets,
            "top_logprobs": [{tt.text(t): finite(v) for t, v in zip(lp.top_token_ids, lp.top_logprobs)}
                             for lp in lps]}


def echo_logprobs(tt: TokenText, prompt_ids: list[int], prompt_lps: list) -> dict:
    """Completions' logprobs of an echoed prompt (its prompt logprobs): the first token has none
    (null), as in vLLM."""
    rest = completion_logprobs(tt, prompt_lps[1:], len(tt.text(prompt_ids[0])))
    return {"tokens": [tt.text(prompt_ids[0])] + rest["tokens"], "token_logprobs": [None] + rest["token_logprobs"],
            "text_offset": [0] + rest["text_offset"], "top_logprobs": [None] + rest["top_logprobs"]}


def join_logprobs(a: dict | None, b: dict | None) -> dict | None:
    """Two completions' logprobs objects one after the other."""
    if a is None or b is None:
        return a or b
    return {key: a[key] + b[key] for key in a}


def prompt_logprobs(tt: TokenText, lps: list | None) -> list | None:
    """vLLM's prompt_logprobs: per prompt token null (the first) or {token id: {logprob, rank,
    decoded_token}}, the prompt token first, then the top-n (ranked 1..n)."""
    if lps is None:
        return None
    out = []
    for lp in lps:
        if lp is None:
            out.append(None)
            continue
        entry = {str(lp.token_id): {"logprob": finite(lp.logprob), "rank": lp.rank, "decoded_token": tt.text(lp.token_id)}}
        for rank, (t, v) in enumerate(zip(lp.top_token_ids, lp.top_logprobs), start=1):
            entry.setdefault(str(t), {"logprob": finite(v), "rank": rank, "decoded_token": tt.text(t)})
        out.append(entry)
    return out


def kept_support_json(supports) -> list[dict] | None:
    """Per token its kept support (count, bounds, ids); a bound that is not finite is null."""
    if supports is None:
        return None
    bound = lambda v: v if math.isfinite(v) else None  # noqa: E731
    return [{"count": s.count, "threshold": bound(s.threshold), "upper": bound(s.upper),
             "token_ids": list(s.token_ids)} for s in supports]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


_OBJECTS = {"chat": ("chat.completion", "chat.completion.chunk"), "completion": ("text_completion",) * 2}


class _Answer:
    """What every formatter shares: the usage, and the tokens streamed per choice (for
    `stream_options.continuous_usage_stats`, usage in every chunk)."""

    def __init__(self, job: Prepared):
        self.job = job
        options = job.req.stream_options
        self.continuous_usage = bool(options and options.continuous_usage_stats)
        self._num_tokens: dict[int, int] = {}

    def _streamed(self, t, new: int):
        """Count `new` tokens of choice `t`; (their logprobs or None, the choice's tokens so far)."""
        self._num_tokens[t.index] = self._num_tokens.get(t.index, 0) + new
        lps = t.logprobs[len(t.logprobs) - new:] if t.logprobs is not None else None
        return lps, self._num_tokens[t.index]

    def usage(self, completion_tokens: int) -> dict:
        return usage(len(self.job.prompt_ids), completion_tokens)


class Formatter(_Answer):
    """Builds the JSON of one HTTP request (chat or completion)."""

    def __init__(self, kind: str, model: str, tokenizer, job: Prepared):
        assert kind in ("chat", "completion")
        super().__init__(job)
        req = job.req
        self.kind, self.model = kind, model
        self.return_token_ids = bool(req.return_token_ids)
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + (req.request_id or uuid.uuid4().hex[:24])
        self.created = int(time.time())
        self.tt = TokenText(tokenizer, as_ids=bool(req.return_tokens_as_token_ids))
        self._offsets: dict[int, int] = {}      # completion logprobs: characters streamed per choice
        self._echoed: set[int] = set()

    def _head(self, chunk: bool) -> dict:
        return {"id": self.id, "object": _OBJECTS[self.kind][chunk], "created": self.created, "model": self.model}

    def _logprobs(self, index: int, lps, prompt_lps=None):
        """The choice's logprobs object; completions with echo start with the prompt's."""
        echo = None
        if self.kind == "completion" and self.job.echo is not None and index not in self._echoed and prompt_lps:
            echo = echo_logprobs(self.tt, self.job.prompt_ids, prompt_lps)
            self._offsets[index] = len(self.job.echo)
        if lps is None:
            return echo
        if self.kind == "chat":
            return chat_logprobs(self.tt, lps)
        out = completion_logprobs(self.tt, lps, self._offsets.get(index, 0))
        self._offsets[index] = self._offsets.get(index, 0) + sum(len(t) for t in out["tokens"])
        return join_logprobs(echo, out)

    def _echo(self, index: int) -> str:
        """The echo text, once per choice."""
        if self.job.echo is None or index in self._echoed:
            return ""
        self._echoed.add(index)
        return self.job.echo

    def response(self, tracked: list) -> dict:
        choices = []
        for t in tracked:
            out = t.output()
            choice = {"index": t.index, "logprobs": self._logprobs(t.index, out.logprobs, out.prompt_logprobs),
                      "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
            text = self._echo(t.index) + (out.text or "")
            if self.kind == "chat":
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
                if self.job.req.prompt_logprobs is not None or self.job.echo is not None:
                    choice["prompt_logprobs"] = prompt_logprobs(self.tt, tracked[0].prompt_logprobs)
            if self.return_token_ids:
                choice["token_ids"] = out.output_token_ids
            if out.kept_support is not None:
                choice["kept_support"] = kept_support_json(out.kept_support)
            choices.append(choice)
        body = {**self._head(False), "choices": choices,
                "usage": self.usage(sum(len(t.output_token_ids) for t in tracked))}
        if self.kind == "chat" and (self.job.req.prompt_logprobs is not None or self.job.echo is not None):
            body["prompt_logprobs"] = prompt_logprobs(self.tt, tracked[0].prompt_logprobs)
        if self.return_token_ids:
            body["prompt_token_ids"] = list(self.job.prompt_ids)
        return body

    def opening(self, index: int) -> list[dict]:
        """Chat's first chunks of a choice: its role, then the echoed message (if any)."""
        if self.kind != "chat":
            return []
        chunks = [self._chunk(index, {"delta": {"role": "assistant", "content": ""}})]
        echo = self._echo(index)
        if echo:
            chunks.append(self._chunk(index, {"delta": {"content": echo}}))
        return chunks

    def chunk(self, t, delta) -> dict | None:
        """One stream chunk: choice `t` (a TrackedRequest) got `delta` (a StreamDelta); None when
        there is nothing to say (text held back: a character split across tokens)."""
        new = len(delta.new_token_ids)
        lps, _ = self._streamed(t, new)
        ks = t.kept_support[len(t.kept_support) - new:] if t.kept_support is not None else None
        if not delta.text and not delta.finished and lps is None and ks is None and not self.return_token_ids \
                and not (self.kind == "completion" and self.job.echo and t.index not in self._echoed):
            return None
        choice = {"logprobs": self._logprobs(t.index, lps, t.prompt_logprobs)}
        if self.kind == "chat":
            choice["delta"] = {"content": delta.text} if delta.text or not delta.finished else {}
        else:
            choice["text"] = self._echo(t.index) + delta.text
        if delta.finished:
            choice["finish_reason"], choice["stop_reason"] = delta.finish_reason, delta.stop_reason
        if self.return_token_ids:
            choice["token_ids"] = list(delta.new_token_ids)
        if ks is not None:
            choice["kept_support"] = kept_support_json(ks)
        return self._chunk(t.index, choice)

    def _chunk(self, index: int, fields: dict) -> dict:
        body = {**self._head(True), "choices": [{"index": index, "logprobs": None, "finish_reason": None, **fields}]}
        if self.continuous_usage:
            body["usage"] = self.usage(self._num_tokens.get(index, 0))
        return body

    def usage_chunk(self, completion_tokens: int) -> dict:
        return {**self._head(True), "choices": [], "usage": self.usage(completion_tokens)}


class GenerateFormatter(_Answer):
    """vLLM's /inference/v1/generate answers: token ids and logprobs ("token_id:<id>"), no text."""

    def __init__(self, tokenizer, job: Prepared, request_id: str):
        super().__init__(job)
        self.request_id = request_id
        self.tt = TokenText(tokenizer, as_ids=True)
        self.text = TokenText(tokenizer)              # prompt_logprobs' decoded_token

    def _choice(self, index: int, token_ids: list[int], lps, finish_reason: str | None) -> dict:
        return {"index": index, "logprobs": chat_logprobs(self.tt, lps) if lps is not None else None,
                "finish_reason": finish_reason, "token_ids": list(token_ids)}

    def response(self, tracked: list) -> dict:
        return {"request_id": self.request_id,
                "choices": [self._choice(t.index, t.output_token_ids, t.logprobs, t.finish_reason) for t in tracked],
                "prompt_logprobs": prompt_logprobs(self.text, tracked[0].prompt_logprobs), "kv_transfer_params": None,
                "usage": self.usage(sum(len(t.output_token_ids) for t in tracked))}

    def opening(self, index: int) -> list[dict]:
        return []

    def chunk(self, t, delta) -> dict | None:
        new = len(delta.new_token_ids)
        if not new and not delta.finished:
            return None
        lps, so_far = self._streamed(t, new)
        body = {"request_id": self.request_id,
                "choices": [self._choice(t.index, delta.new_token_ids, lps, delta.finish_reason)]}
        if self.continuous_usage:
            body["usage"] = self.usage(so_far)
        return body

    def usage_chunk(self, completion_tokens: int) -> dict:
        return {"request_id": self.request_id, "choices": [], "usage": self.usage(completion_tokens)}
