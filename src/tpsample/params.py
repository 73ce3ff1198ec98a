"""SamplingParams: the per-request sampling knobs, validated and frozen at construction.

Every bad value raises `ValueError` naming the field and the allowed range. Numbers may be
Python or numpy scalars (stored as `int` / `float`); containers are copied and frozen (tuples,
a read-only `FrozenDict`). Checks that need the vocabulary size or the sampler's limits live in
`validate_for_vocab`, which also returns the params to store (`top_k >= V` becomes -1, off).

The ranges keep every value meaningful in the sampler's fp32 / int64 / int32 tables:
- real ranges end at the fp32 numbers nearest their decimal bounds and a value is compared in
  its own precision, so 1e-6 passes as a Python float, a numpy float32 and a fp32 tensor alike;
- `temperature` 0 (greedy) or [1e-6, 1e6] (below, `l / T` overflows fp32; above, rows are
  uniform already); `top_p` (0, 1] and non-zero `min_p` >= 2**-126 (smaller is 0 in fp32);
  `repetition_penalty` [0.01, 100]; `logit_bias` values [-100, 100], the OpenAI API's range
  (use `allowed_token_ids` or `bad_words_token_ids` to ban a token exactly);
- integers fit their tables: token ids in [0, 2**31), counts below 2**63, `logprobs`,
  `prompt_logprobs` and `kept_support` in [0, 65536] (`MAX_LOGPROBS`); `seed` any integer, used
  mod 2**64;
- llama.cpp's samplers by its ranges: DRY (`dry_base` >= 1, breakers of 1 to 21 token ids or
  strings of 1 to 40 characters, which only the text front ends take), `top_n_sigma` (<= 0 off),
  XTC (probability 0 off).
So for raw logits with |l| <= 1e30 every processed value stays finite in fp32; beyond that the
guard (no finite kept token: the raw argmax, flagged) applies.
"""
from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from .coerce import FP32_TINY, INT64_MAX, MAX_TOKEN_ID, FrozenDict, as_bool, as_float, as_int, check, fail, token_ids

MAX_LOGIT_BIAS = 1024           # entries
MAX_BAD_WORDS = 128             # sequences
MAX_BAD_WORD_LEN = 1024         # tokens per sequence
LOGIT_BIAS_BOUND = 100.0        # |bias| <= this


def fp32(x: float) -> float:
    """x rounded to the nearest fp32 number (what the sampler's fp32 tables hold)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


TEMPERATURE_RANGE = (fp32(1e-6), 1e6)            # fp32 ends (see the module docstring)
REPETITION_PENALTY_RANGE = (fp32(0.01), 100.0)
PENALTY_BOUND = 2.0             # |frequency_penalty|, |presence_penalty|
MAX_STOP_STRINGS = 16           # stop strings per request
MAX_STOP_STRING_LEN = 256       # characters per stop string
# vLLM's names, the short names ("raw" = "raw_logprobs", "processed" = "processed_logprobs") and
# "temperature_logprobs": the log-softmax of the raw row divided by the temperature (what an RL
# trainer computes from the same logits), nothing else applied
LOGPROBS_MODES = ("raw", "processed", "raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits",
                  "temperature_logprobs")
PROCESSED_MODES = ("processed", "processed_logprobs", "processed_logits")
LOGIT_MODES = ("raw_logits", "processed_logits")
MAX_DRY_BREAKERS = 1 << 16      # sequences
MAX_DRY_BREAKER_LEN = 21        # tokens: a head and llama.cpp's longest tail (20)
MAX_LOGPROBS = 1 << 16          # top-n lists are gathered per row; larger n is a full sort
TOKEN_IDS = "token ids in [0, 2**31)"      # MAX_TOKEN_ID + 1 = 2**31


@dataclass(frozen=True)
class Range:
    """A numeric field's allowed values: [lo, hi], and 0 too when `or_zero` (greedy / off).
    `holds` is written with comparisons and & | only, so it reads a Python number, a numpy
    array and a tensor alike (SamplingParams and the stateless ops check against one table)."""
    lo: float
    hi: float
    allowed: str                    # the range in words, as error messages give it
    or_zero: bool = False
    integer: bool = False

    def holds(self, v):
        inside = (v >= self.lo) & (v <= self.hi)
        return (v == 0) | inside if self.or_zero else inside


_T_LO, _T_HI = TEMPERATURE_RANGE
_R_LO, _R_HI = REPETITION_PENALTY_RANGE
_TOP_N = f"None or an integer in [0, {MAX_LOGPROBS}]"
# SamplingParams' numeric fields; None stays allowed where the field's default is None
RANGES = {
    "temperature": Range(_T_LO, _T_HI, f"0 (greedy) or in [{_T_LO:g}, {_T_HI:g}]", or_zero=True),
    "top_k": Range(-1, math.inf, "-1 or 0 (off), or an integer >= 1 (>= V is off)", integer=True),
    "top_p": Range(FP32_TINY, 1.0, "in (0, 1], at least 2**-126 (fp32's smallest normal)"),
    "min_p": Range(FP32_TINY, 1.0, "0 (off) or in [2**-126, 1]", or_zero=True),
    "repetition_penalty": Range(_R_LO, _R_HI, f"in [{_R_LO:g}, {_R_HI:g}] (1 = off)"),
    "frequency_penalty": Range(-PENALTY_BOUND, PENALTY_BOUND, f"in [{-PENALTY_BOUND:g}, {PENALTY_BOUND:g}] (0 = off)"),
    "presence_penalty": Range(-PENALTY_BOUND, PENALTY_BOUND, f"in [{-PENALTY_BOUND:g}, {PENALTY_BOUND:g}] (0 = off)"),
    "min_tokens": Range(0, INT64_MAX, "an integer in [0, 2**63)", integer=True),
    "max_tokens": Range(1, INT64_MAX, "an integer in [1, 2**63)", integer=True),
    "logprobs": Range(0, MAX_LOGPROBS, _TOP_N, integer=True),
    "prompt_logprobs": Range(0, MAX_LOGPROBS, _TOP_N, integer=True),
    "kept_support": Range(0, MAX_LOGPROBS, _TOP_N, integer=True),
    "dry_multiplier": Range(0.0, 100.0, "in [0, 100] (0 = off)"),
    "dry_base": Range(1.0, 100.0, "in [1, 100]"),
    "dry_allowed_length": Range(0, MAX_TOKEN_ID, "an integer in [0, 2**31)", integer=True),
    "dry_penalty_last_n": Range(-1, MAX_TOKEN_ID, "-1 (the whole context), 0 (off) or an integer in [1, 2**31)",
                                integer=True),
    "top_n_sigma": Range(-1e6, 1e6, "in [-1e6, 1e6] (<= 0 = off)"),
    "xtc_threshold": Range(0.0, 1.0, "in [0, 1]"),
    "xtc_probability": Range(0.0, 1.0, "in [0, 1] (0 = off)"),
}
_OPTIONAL = ("logprobs", "prompt_logprobs", "kept_support")


def _ranged(value, field: str):
    """value (None kept for the fields whose default is None) as an int or float in its range."""
    r = RANGES[field]
    if value is None and field in _OPTIONAL:
        return None
    v = (as_int if r.integer else as_float)(value, field, r.allowed)
    check(r.holds(v), field, r.allowed, value)
    return v


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
    logit_bias: Optional[Mapping[int, float]] = None          # stored as a FrozenDict
    allowed_token_ids: Optional[tuple[int, ...]] = None        # lists accepted, stored as tuples
    bad_words_token_ids: Optional[tuple[tuple[int, ...], ...]] = None
    min_tokens: int = 0
    stop_token_ids: Optional[tuple[int, ...]] = None
    logprobs: Optional[int] = None
    logprobs_mode: str = "raw"
    max_tokens: int = 16
    ignore_eos: bool = False
    stop: Optional[tuple[str, ...]] = None      # stop strings (a str or a list is accepted); matched on text
    include_stop_str_in_output: bool = False    # keep the matched stop string (or stop token's text)
    prompt_logprobs: Optional[int] = None       # each prompt token's logprob and rank, plus the top-n (engine)
    dry_multiplier: float = 0.0                 # DRY (llama.cpp's): 0 = off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1                # -1: the whole context (prompt + outputs); 0: off
    dry_sequence_breakers: Optional[tuple] = None     # token id sequences (head, tail...); strings: front ends
    top_n_sigma: float = -1.0                   # <= 0 = off
    xtc_threshold: float = 0.1
    xtc_probability: float = 0.0                # 0 = off
    kept_support: Optional[int] = None          # RL: each sampled row's kept support, with up to this many ids

    def __post_init__(self) -> None:
        # Construction-time normalisation of the instance being built (numpy scalars -> Python
        # numbers, containers -> frozen copies); nothing else ever writes a field.
        for name, value in self._checked_numbers().items():
            object.__setattr__(self, name, value)
        for name, value in self._checked_containers().items():
            object.__setattr__(self, name, value)

    def _checked_numbers(self) -> dict:
        check(isinstance(self.logprobs_mode, str) and self.logprobs_mode in LOGPROBS_MODES, "logprobs_mode",
              f"one of {LOGPROBS_MODES}", self.logprobs_mode)
        return {
            **{field: _ranged(getattr(self, field), field) for field in RANGES},
            "seed": None if self.seed is None else as_int(self.seed, "seed",
                                                          "None or an integer (any size: used mod 2**64)"),
            "ignore_eos": as_bool(self.ignore_eos, "ignore_eos"),
            "include_stop_str_in_output": as_bool(self.include_stop_str_in_output, "include_stop_str_in_output"),
        }

    def _checked_containers(self) -> dict:
        out = {}
        if self.logit_bias is not None:
            out["logit_bias"] = _frozen_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            out["allowed_token_ids"] = token_ids(self.allowed_token_ids, "allowed_token_ids",
                                                 f"a non-empty list of {TOKEN_IDS}", non_empty=True)
        if self.stop_token_ids is not None:
            out["stop_token_ids"] = token_ids(self.stop_token_ids, "stop_token_ids", f"a list of {TOKEN_IDS}")
        if self.bad_words_token_ids is not None:
            out["bad_words_token_ids"] = _frozen_bad_words(self.bad_words_token_ids)
        if self.stop is not None:
            out["stop"] = _frozen_stop(self.stop)
        if self.dry_sequence_breakers is not None:
            out["dry_sequence_breakers"] = _frozen_breakers(self.dry_sequence_breakers)
        return out

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def dry_enabled(self) -> bool:
        """DRY changes logits (llama.cpp's condition: a multiplier and a window)."""
        return self.dry_multiplier > 0 and self.dry_penalty_last_n != 0

    def validate_for_vocab(self, vocab_size: int, max_logprobs: int) -> "SamplingParams":
        """Check what needs the sampler's vocabulary size and limits; return the params to store.

        The returned params equal these except that a `top_k >= vocab_size` (keep every token)
        becomes -1 (off), so no code downstream ever sees a k larger than the vocabulary.
        """
        def in_vocab(ids, field):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            check(not bad, field, f"token ids in [0, {vocab_size})", bad[:5])

        if self.logit_bias:
            in_vocab(list(self.logit_bias), "logit_bias")
        if self.allowed_token_ids is not None:
            check(len(self.allowed_token_ids) <= vocab_size, "allowed_token_ids",
                  f"at most vocab_size={vocab_size} ids", len(self.allowed_token_ids))
            in_vocab(self.allowed_token_ids, "allowed_token_ids")
        if self.stop_token_ids:
            in_vocab(self.stop_token_ids, "stop_token_ids")
        for w in self.bad_words_token_ids or ():
            in_vocab(w, "bad_words_token_ids")
        for w in self.dry_sequence_breakers or ():
            check(not isinstance(w, str), "dry_sequence_breakers", "token id sequences for the sampler (strings are "
                  "mapped to token ids by LLM, tpsample generate and the server, which hold the tokenizer)", w)
            in_vocab(w, "dry_sequence_breakers")
        if self.logprobs is not None:
            check(self.logprobs <= max_logprobs, "logprobs", f"<= max_logprobs={max_logprobs}", self.logprobs)
        if self.prompt_logprobs is not None:
            check(self.prompt_logprobs <= max_logprobs, "prompt_logprobs", f"<= max_logprobs={max_logprobs}",
                  self.prompt_logprobs)
        if self.top_k >= vocab_size:
            return dataclasses.replace(self, top_k=-1)
        return self


def _frozen_bias(bias) -> FrozenDict:
    allowed = (f"a dict of at most {MAX_LOGIT_BIAS} entries {{token id in [0, 2**31): bias in "
               f"[{-LOGIT_BIAS_BOUND:g}, {LOGIT_BIAS_BOUND:g}]}}")
    if not isinstance(bias, Mapping) or len(bias) > MAX_LOGIT_BIAS:
        raise fail("logit_bias", allowed, bias if not isinstance(bias, Mapping) else f"{len(bias)} entries")
    out = {}
    for tok, b in bias.items():
        tok = as_int(tok, "logit_bias", f"keyed by {TOKEN_IDS}")
        check(0 <= tok <= MAX_TOKEN_ID, "logit_bias", f"keyed by {TOKEN_IDS}", tok)
        values = (f"{{token id: bias}} with biases in [{-LOGIT_BIAS_BOUND:g}, {LOGIT_BIAS_BOUND:g}] "
                  "(the OpenAI API's range)")
        out[tok] = as_float(b, "logit_bias", values)
        check(-LOGIT_BIAS_BOUND <= out[tok] <= LOGIT_BIAS_BOUND, "logit_bias", values, b)
    return FrozenDict(out)


def _frozen_bad_words(words) -> tuple[tuple[int, ...], ...]:
    allowed = f"a list of at most {MAX_BAD_WORDS} sequences"
    if not isinstance(words, (list, tuple)) or len(words) > MAX_BAD_WORDS:
        raise fail("bad_words_token_ids", allowed, len(words) if isinstance(words, (list, tuple)) else words)
    seq_allowed = f"non-empty sequences of at most {MAX_BAD_WORD_LEN} {TOKEN_IDS}"
    out = []
    for w in words:
        check(isinstance(w, (list, tuple)) and 1 <= len(w) <= MAX_BAD_WORD_LEN, "bad_words_token_ids",
              seq_allowed, w)
        out.append(token_ids(w, "bad_words_token_ids", seq_allowed))
    return tuple(out)


def _frozen_breakers(breakers) -> tuple:
    """DRY sequence breakers: token id sequences (a bare id is a one-token sequence), or strings
    of 1 to 40 characters that the text front ends map to token ids (`engine.breakers`)."""
    allowed = (f"a list of at most {MAX_DRY_BREAKERS} token ids, sequences of 1 to {MAX_DRY_BREAKER_LEN} token "
               "ids, or strings of 1 to 40 characters (mapped by the text front ends)")
    check(isinstance(breakers, (list, tuple)) and len(breakers) <= MAX_DRY_BREAKERS, "dry_sequence_breakers",
          allowed, breakers if not isinstance(breakers, (list, tuple)) else f"{len(breakers)} entries")
    out = []
    for w in breakers:
        if isinstance(w, str):
            check(1 <= len(w) <= 40, "dry_sequence_breakers", allowed, w)
            out.append(w)
            continue
        w = w if isinstance(w, (list, tuple)) else [w]
        check(1 <= len(w) <= MAX_DRY_BREAKER_LEN, "dry_sequence_breakers", allowed, w)
        out.append(token_ids(w, "dry_sequence_breakers", allowed))
    return tuple(out)


def _frozen_stop(stop) -> tuple[str, ...] | None:
    """Stop strings as a tuple (matched by the detokenizing front end, never by the sampler)."""
    if isinstance(stop, str):
        stop = (stop,)
    check(isinstance(stop, (list, tuple)) and len(stop) <= MAX_STOP_STRINGS, "stop",
          f"a string or a list of at most {MAX_STOP_STRINGS} strings", stop)
    for s in stop:
        check(isinstance(s, str) and 1 <= len(s) <= MAX_STOP_STRING_LEN, "stop",
              f"non-empty strings of at most {MAX_STOP_STRING_LEN} characters", s)
    return tuple(stop) or None
