"""DRY sequence breakers given as strings (the text front ends: `LLM`, `tpsample generate`, the
server), mapped to the token id sequences the sampler takes, as llama.cpp maps them
(`get_overlapping_token_sequences`, ported from koboldcpp):
- every token whose text contains the string is a one-token breaker;
- every token whose text ends with the beginning of the string (the string starts at some
  position of the token and runs past its end) is the head of a breaker whose tail is the
  tokenization of the rest of the string, at most 20 tokens (llama.cpp's cap).
Strings are at most 40 characters (llama.cpp truncates longer ones; here they are refused).
When DRY is on and no breakers are given, llama.cpp's defaults apply: "\\n", ":", "\\"", "*".
Token texts are the tokenizer's decoding of each id alone (special tokens included); the
decoded vocabulary and each string's sequences are cached per tokenizer.
"""
from __future__ import annotations

import dataclasses
import weakref

from tpsample.params import MAX_DRY_BREAKER_LEN, SamplingParams

LLAMA_CPP_BREAKERS = ("\n", ":", '"', "*")
MAX_BREAKER_CHARS = 40
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()    # tokenizer -> (texts, {string: sequences})


def with_token_breakers(params: SamplingParams, tokenizer) -> SamplingParams:
    """params whose DRY breakers are token id sequences: strings mapped with the tokenizer, and
    llama.cpp's default strings when DRY is on and none are given. ValueError naming
    dry_sequence_breakers for a string without a tokenizer or longer than 40 characters."""
    breakers = params.dry_sequence_breakers
    if breakers is None and params.dry_enabled:
        breakers = LLAMA_CPP_BREAKERS if tokenizer is not None else ()
    if breakers is None or not any(isinstance(b, str) for b in breakers):
        return params if breakers is params.dry_sequence_breakers else dataclasses.replace(
            params, dry_sequence_breakers=breakers)
    if tokenizer is None:
        raise ValueError("SamplingParams.dry_sequence_breakers holds strings, which need a tokenizer in the model "
                         "folder; give token id sequences instead")
    out: list[tuple[int, ...]] = []
    for b in breakers:
        for seq in (token_sequences(tokenizer, b) if isinstance(b, str) else (b,)):
            if seq not in out:
                out.append(seq)
    return dataclasses.replace(params, dry_sequence_breakers=out)


def token_sequences(tokenizer, text: str) -> tuple[tuple[int, ...], ...]:
    """The breaker sequences (head, tail...) of one string, llama.cpp's way (module docstring)."""
    if not 1 <= len(text) <= MAX_BREAKER_CHARS:
        raise ValueError(f"SamplingParams.dry_sequence_breakers must be strings of 1 to {MAX_BREAKER_CHARS} "
                         f"characters, got {text[:50]!r}")
    texts, done = _vocab(tokenizer)
    if text not in done:
        done[text] = _overlaps(tokenizer, texts, text)
    return done[text]


def _vocab(tokenizer) -> tuple:
    got = _CACHE.get(tokenizer)
    if got is None:
        got = _CACHE[tokenizer] = ([tokenizer.decode([t]) for t in range(len(tokenizer))], {})
    return got


def _overlaps(tokenizer, texts: list[str], s: str) -> tuple[tuple[int, ...], ...]:
    out: list[tuple[int, ...]] = []
    tails: dict[str, tuple[int, ...]] = {}
    for tok, word in enumerate(texts):
        if s in word:
            out.append((tok,))
            continue
        for pos in (i for i, c in enumerate(word) if c == s[0]):
            overlap = len(word) - pos
            if overlap < len(s) and word[pos:] == s[:overlap]:
                rest = s[overlap:]
                if rest not in tails:
                    tails[rest] = tuple(tokenizer.encode(rest, add_special_tokens=False)[: MAX_DRY_BREAKER_LEN - 1])
                seq = (tok, *tails[rest])
                if seq not in out:
                    out.append(seq)
    return tuple(out)
