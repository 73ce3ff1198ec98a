"""Per-request digests: what TP ranks must agree on about a request, hashed once at add time.

`request_digests(req_id, params, seed, prompt, vocab_size)` gives one 63-bit digest per entry
of `DIGEST_FIELDS` (an int64 vector): the request id, every sampling-relevant parameter (the
resolved seed, as the noise uses it), and the prompt (its length keys the noise positions, its
token set the repetition penalty). Values are put in a canonical form first, so params that
sample the same way digest the same: a `top_k` that keeps every token (0, -1 or >= V) is -1, the
seed is taken mod 2**64, id sets (allowed ids, stop ids) are sorted and deduplicated, the logit
bias is sorted by token id. Fields the sampler never reads (max_tokens, stop strings) are left out.

`request_print(digests)` folds the vector into the single 63-bit value the sampler keeps per
slot; a plan's fingerprint hashes its slots' prints, so a step's agreement check covers every
request's parameters at no per-step cost. Pure functions of replicated values: equal requests
give equal digests on every rank and in every process (no Python `hash`, which is salted).
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..noise import seed_to_int64
from ..params import SamplingParams

DIGEST_FIELDS = ("req_id", "prompt_token_ids", "seed", "temperature", "top_k", "top_p", "min_p",
                 "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias",
                 "allowed_token_ids", "bad_words_token_ids", "stop_token_ids", "ignore_eos", "min_tokens",
                 "logprobs", "logprobs_mode")


def _h(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def _ids(values) -> bytes:
    return b"-" if values is None else np.unique(np.asarray(values, dtype=np.int64)).tobytes()


def _canonical(req_id: str, p: SamplingParams, seed: int, prompt, vocab_size: int) -> tuple[bytes, ...]:
    """Each DIGEST_FIELDS entry as bytes, in a form equal for params that sample alike."""
    bias = sorted((p.logit_bias or {}).items())
    scalars = dict(seed=seed_to_int64(seed), temperature=p.temperature,
                   top_k=p.top_k if 0 < p.top_k < vocab_size else -1, top_p=p.top_p, min_p=p.min_p,
                   repetition_penalty=p.repetition_penalty, frequency_penalty=p.frequency_penalty,
                   presence_penalty=p.presence_penalty, ignore_eos=p.ignore_eos, min_tokens=p.min_tokens,
                   logprobs=p.logprobs, logprobs_mode=p.logprobs_mode)
    parts = {"req_id": req_id.encode(), "prompt_token_ids": np.asarray(prompt, dtype=np.int64).tobytes(),
             "logit_bias": repr(bias).encode(), "allowed_token_ids": _ids(p.allowed_token_ids),
             "bad_words_token_ids": repr(sorted(p.bad_words_token_ids or ())).encode(),
             "stop_token_ids": _ids(p.stop_token_ids)}
    parts.update({name: repr(value).encode() for name, value in scalars.items()})
    return tuple(parts[name] for name in DIGEST_FIELDS)


def request_digests(req_id: str, params: SamplingParams, seed: int, prompt, vocab_size: int) -> np.ndarray:
    """[len(DIGEST_FIELDS)] int64: one 63-bit digest per field (see the module docstring)."""
    return np.array([_h(b) for b in _canonical(req_id, params, seed, prompt, vocab_size)], dtype=np.int64)


def request_print(digests: np.ndarray) -> int:
    """The 63-bit print of a request: one hash of its field digests."""
    return _h(np.ascontiguousarray(digests, dtype=np.int64).tobytes())
