"""Per-request digests: what TP ranks must agree on about a request, hashed once at add time.

`request_digests(req_id, params, seed, prompt, vocab_size)` gives one 63-bit digest per entry
of `DIGEST_FIELDS` (an int64 vector): the request id, the prompt (its length keys the noise
positions, its token set the repetition penalty) and every `SamplingParams` field the sampler
may read (all but the front ends' own, so a new field is covered as it is added; the seed as
resolved, as the noise uses it). Values are put in a canonical form first, so params that
sample the same way digest the same: a `top_k` that keeps every token (0, -1 or >= V) is -1, the
seed is taken mod 2**64, id sets (allowed ids, stop ids) are sorted and deduplicated, the logit
bias is sorted by token id.

`request_print(digests)` folds the vector into the single 63-bit value the sampler keeps per
slot; a plan's fingerprint hashes its slots' prints, so a step's agreement check covers every
request's parameters at no per-step cost. Pure functions of replicated values: equal requests
give equal digests on every rank and in every process (no Python `hash`, which is salted).
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from ..noise import seed_to_int64
from ..params import SamplingParams

# fields only the front ends read (stop strings, lengths): never the sampler's business
FRONT_END_FIELDS = frozenset({"max_tokens", "stop", "include_stop_str_in_output", "prompt_logprobs"})
DIGEST_FIELDS = ("req_id", "prompt_token_ids",
                 *(f.name for f in dataclasses.fields(SamplingParams) if f.name not in FRONT_END_FIELDS))


def _h(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def _ids(values) -> bytes:
    return b"-" if values is None else np.unique(np.asarray(values, dtype=np.int64)).tobytes()


# the fields whose canonical form is not their repr (every other field: repr of its value)
_CANONICAL = {
    "seed": lambda p, seed, vocab_size: repr(seed_to_int64(seed)).encode(),
    "top_k": lambda p, seed, vocab_size: repr(p.top_k if 0 < p.top_k < vocab_size else -1).encode(),
    "logit_bias": lambda p, seed, vocab_size: repr(sorted((p.logit_bias or {}).items())).encode(),
    "allowed_token_ids": lambda p, seed, vocab_size: _ids(p.allowed_token_ids),
    "stop_token_ids": lambda p, seed, vocab_size: _ids(p.stop_token_ids),
    "bad_words_token_ids": lambda p, seed, vocab_size: repr(sorted(p.bad_words_token_ids or ())).encode(),
}


def _canonical(req_id: str, p: SamplingParams, seed: int, prompt, vocab_size: int) -> tuple[bytes, ...]:
    """Each DIGEST_FIELDS entry as bytes, in a form equal for params that sample alike."""
    out = [req_id.encode(), np.asarray(prompt, dtype=np.int64).tobytes()]
    for name in DIGEST_FIELDS[2:]:
        form = _CANONICAL.get(name)
        out.append(form(p, seed, vocab_size) if form is not None else repr(getattr(p, name)).encode())
    return tuple(out)


def request_digests(req_id: str, params: SamplingParams, seed: int, prompt, vocab_size: int) -> np.ndarray:
    """[len(DIGEST_FIELDS)] int64: one 63-bit digest per field (see the module docstring)."""
    return np.array([_h(b) for b in _canonical(req_id, params, seed, prompt, vocab_size)], dtype=np.int64)


def request_print(digests: np.ndarray) -> int:
    """The 63-bit print of a request: one hash of its field digests."""
    return _h(np.ascontiguousarray(digests, dtype=np.int64).tobytes())
