"""Per-request persistent sampler state and deterministic slot allocation.

A slot is the request's index in `[0, max_num_reqs)`. Slots are handed out smallest-free-first
and freed back into a sorted heap, so every rank that sees the same add/remove sequence holds the
same slot for the same request without talking (iterating a set would be hash-ordered per
process). Histories are kept sparse (token lists), never as dense `[max_reqs, V]` counts.
"""
from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass, field

from .params import SamplingParams


@dataclass
class RequestState:
    req_id: str
    slot: int
    params: SamplingParams
    seed: int                      # the request's seed (drawn once when params.seed is None)
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)

    _prompt_set: frozenset = field(default=frozenset(), repr=False)
    _out_counts: dict = field(default_factory=dict, repr=False)
    _counted: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self._prompt_set = frozenset(self.prompt_token_ids)

    def output_counts(self) -> dict[int, int]:
        """Counts of output tokens, updated incrementally as outputs are appended."""
        out = self.output_token_ids
        if self._counted > len(out):       # history was rewritten: recount
            self._out_counts, self._counted = {}, 0
        for tok in out[self._counted:]:
            self._out_counts[tok] = self._out_counts.get(tok, 0) + 1
        self._counted = len(out)
        return self._out_counts

    def seen_tokens(self, extra=()) -> set[int]:
        """Prompt + output tokens (+ extra), for the repetition penalty."""
        return set(self._prompt_set).union(self.output_counts(), extra)

    @property
    def num_output(self) -> int:
        return len(self.output_token_ids)

    @property
    def next_position(self) -> int:
        """Absolute position of the next token to sample."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class SlotTable:
    """Deterministic slot allocation: smallest free slot first."""

    def __init__(self, max_num_reqs: int):
        if max_num_reqs < 1:
            raise ValueError(f"max_num_reqs must be >= 1, got {max_num_reqs}")
        self.max_num_reqs = max_num_reqs
        self._free = list(range(max_num_reqs))
        self.requests: dict[str, RequestState] = {}

    def add(self, req_id: str, params: SamplingParams, prompt: list[int], seed: int) -> RequestState:
        if req_id in self.requests:
            raise ValueError(f"req_id {req_id!r} is already active; remove it first")
        if not self._free:
            raise ValueError(f"no free slot: all max_num_reqs={self.max_num_reqs} slots are in use")
        slot = heapq.heappop(self._free)
        state = RequestState(req_id, slot, params, seed, list(prompt))
        self.requests[req_id] = state
        return state

    def remove(self, req_id: str) -> None:
        state = self.requests.pop(req_id, None)
        if state is None:
            raise ValueError(f"req_id {req_id!r} is not active")
        heapq.heappush(self._free, state.slot)

    def get(self, req_id: str) -> RequestState:
        try:
            return self.requests[req_id]
        except KeyError:
            raise ValueError(f"req_id {req_id!r} is not active (add_request it first)") from None


def derive_seed(base_seed: int, req_id: str, serial: int) -> int:
    """A request seed from the sampler's base seed, the request id and its add-order serial.

    Pure function of replicated values, so every rank derives the same seed without talking.
    """
    h = hashlib.blake2b(f"{base_seed}:{serial}:{req_id}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")
