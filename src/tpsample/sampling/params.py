"""SamplingParams: the per-request knobs of DESIGN.md section 2, validated at construction.

Every bad value raises `ValueError` naming the field and the allowed range. Checks that need
the vocabulary size or the sampler's limits (token ids in [0, V), logprobs <= max_logprobs)
live in `validate_for_vocab`, called by `Sampler.add_request`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

MAX_LOGIT_BIAS = 1024
MAX_BAD_WORDS = 128
MAX_BAD_WORD_LEN = 1024
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_LEN = 256
LOGPROBS_MODES = ("raw", "processed")


def _check(cond: bool, field: str, allowed: str, value) -> None:
    if not cond:
        raise ValueError(f"SamplingParams.{field} must be {allowed}, got {value!r}")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: Optional[int] = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Optional[dict[int, float]] = None
    allowed_token_ids: Optional[list[int]] = None
    bad_words_token_ids: Optional[list[list[int]]] = None
    min_tokens: int = 0
    stop_token_ids: Optional[list[int]] = None
    logprobs: Optional[int] = None
    logprobs_mode: str = "raw"
    max_tokens: int = 16
    ignore_eos: bool = False
    stop: Optional[tuple[str, ...]] = None      # stop strings (a str or a list is accepted); matched on text
    include_stop_str_in_output: bool = False    # keep the matched stop string (or stop token's text)

    def __post_init__(self) -> None:
        _check(_is_number(self.temperature) and self.temperature >= 0, "temperature",
               "a finite number >= 0 (0 = greedy)", self.temperature)
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        _check(isinstance(self.top_k, int) and not isinstance(self.top_k, bool)
               and (self.top_k in (-1, 0) or self.top_k >= 1), "top_k",
               "-1 or 0 (off) or an integer >= 1", self.top_k)
        _check(_is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", "in [0, 1]", self.min_p)
        _check(self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool)),
               "seed", "None or an integer", self.seed)
        _check(_is_number(self.repetition_penalty) and self.repetition_penalty > 0,
               "repetition_penalty", "a finite number > 0", self.repetition_penalty)
        _check(_is_number(self.frequency_penalty) and abs(self.frequency_penalty) <= 2,
               "frequency_penalty", "in [-2, 2]", self.frequency_penalty)
        _check(_is_number(self.presence_penalty) and abs(self.presence_penalty) <= 2,
               "presence_penalty", "in [-2, 2]", self.presence_penalty)
        _check(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens",
               "an integer >= 0", self.min_tokens)
        _check(_is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens",
               "an integer >= 1", self.max_tokens)
        _check(self.logprobs is None or (_is_int(self.logprobs) and self.logprobs >= 0),
               "logprobs", "None or an integer >= 0", self.logprobs)
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", "True or False", self.ignore_eos)
        _check(self.logprobs_mode in LOGPROBS_MODES, "logprobs_mode", f"one of {LOGPROBS_MODES}",
               self.logprobs_mode)
        _check(isinstance(self.include_stop_str_in_output, bool), "include_stop_str_in_output",
               "True or False", self.include_stop_str_in_output)
        self._validate_stop()
        self._validate_lists()

    def _validate_stop(self) -> None:
        """Stop strings are matched by the detokenizing front end, never by the sampler."""
        stop = self.stop
        if stop is None:
            return
        if isinstance(stop, str):
            stop = (stop,)
        _check(isinstance(stop, (list, tuple)) and len(stop) <= MAX_STOP_STRINGS, "stop",
               f"a string or a list of at most {MAX_STOP_STRINGS} strings", stop)
        for s in stop:
            _check(isinstance(s, str) and 1 <= len(s) <= MAX_STOP_STRING_LEN, "stop",
                   f"non-empty strings of at most {MAX_STOP_STRING_LEN} characters", s)
        object.__setattr__(self, "stop", tuple(stop) or None)   # normalised once, at construction

    def _validate_lists(self) -> None:
        if self.logit_bias is not None:
            _check(isinstance(self.logit_bias, dict) and len(self.logit_bias) <= MAX_LOGIT_BIAS,
                   "logit_bias", f"a dict of at most {MAX_LOGIT_BIAS} entries", self.logit_bias)
            for tok, bias in self.logit_bias.items():
                _check(_is_token(tok), "logit_bias", "keyed by token ids >= 0", tok)
                _check(_is_number(bias), "logit_bias", "finite float values", bias)
        if self.allowed_token_ids is not None:
            _check(isinstance(self.allowed_token_ids, (list, tuple)) and len(self.allowed_token_ids) > 0,
                   "allowed_token_ids", "a non-empty list of token ids", self.allowed_token_ids)
            _check(all(_is_token(t) for t in self.allowed_token_ids), "allowed_token_ids",
                   "token ids >= 0", self.allowed_token_ids)
        if self.stop_token_ids is not None:
            _check(isinstance(self.stop_token_ids, (list, tuple)) and all(_is_token(t) for t in self.stop_token_ids),
                   "stop_token_ids", "a list of token ids >= 0", self.stop_token_ids)
        if self.bad_words_token_ids is not None:
            words = self.bad_words_token_ids
            _check(isinstance(words, (list, tuple)) and len(words) <= MAX_BAD_WORDS,
                   "bad_words_token_ids", f"a list of at most {MAX_BAD_WORDS} sequences",
                   len(words) if isinstance(words, (list, tuple)) else words)
            for w in words:
                _check(isinstance(w, (list, tuple)) and 1 <= len(w) <= MAX_BAD_WORD_LEN,
                       "bad_words_token_ids", f"non-empty sequences of at most {MAX_BAD_WORD_LEN} tokens", w)
                _check(all(_is_token(t) for t in w), "bad_words_token_ids", "token ids >= 0", w)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def validate_for_vocab(self, vocab_size: int, max_logprobs: int) -> None:
        """The checks that need the sampler's vocabulary size and limits."""
        def in_vocab(ids, field):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            _check(not bad, field, f"token ids in [0, {vocab_size})", bad[:5])

        if self.logit_bias:
            in_vocab(list(self.logit_bias), "logit_bias")
        if self.allowed_token_ids is not None:
            _check(len(self.allowed_token_ids) <= vocab_size, "allowed_token_ids",
                   f"at most vocab_size={vocab_size} ids", len(self.allowed_token_ids))
            in_vocab(self.allowed_token_ids, "allowed_token_ids")
        if self.stop_token_ids:
            in_vocab(self.stop_token_ids, "stop_token_ids")
        for w in self.bad_words_token_ids or ():
            in_vocab(w, "bad_words_token_ids")
        if self.logprobs is not None:
            _check(self.logprobs <= max_logprobs, "logprobs", f"<= max_logprobs={max_logprobs}",
                   self.logprobs)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_token(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0
