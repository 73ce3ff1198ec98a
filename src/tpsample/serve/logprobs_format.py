"""Logprobs as JSON: OpenAI's chat and completions shapes and vLLM's prompt logprobs.

Tokens are shown as their text (exact bytes for byte-level BPE) or, with
`return_tokens_as_token_ids`, as "token_id:<id>" (vLLM). Everything is strict JSON: a logprob
that is not finite (-inf for a token a grammar forbids, NaN from NaN logits) is reported as
-9999.0, as OpenAI does.
"""
from __future__ import annotations

import functools
import math

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
