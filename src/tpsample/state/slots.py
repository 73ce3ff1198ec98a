"""Deterministic slot allocation and the host-side record of each active request.

A slot is the request's row in every per-slot table, in `[0, max_num_reqs)`. Slots are handed out
smallest-free-first: a heap of freed slots plus a high-water mark, so nothing is built for slots
never used (a huge `max_num_reqs` costs nothing up front). Every rank that sees the same
add/remove sequence holds the same slot for the same request without talking (iterating a set
would be hash-ordered per process). Each slot also has a generation, bumped whenever a request
takes it or leaves it, so a plan built for an earlier occupant is recognised as stale, and a
print (`prints[slot]`, see `state.digest`): one hash of the occupant's id, parameters and prompt,
which plans carry so that TP ranks agree on every request's parameters, not just its slot.
`reserving(req_id)` takes a slot for a request whose state is then written: if the writing fails,
the table is left exactly as it was (same free slots, high-water mark and generations).
"""
from __future__ import annotations

import contextlib
import heapq
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import numpy as np

from ..params import SamplingParams


@dataclass
class RequestInfo:
    """What the host keeps of an active request (its sampling state lives in per-slot tables)."""
    req_id: str
    slot: int
    params: SamplingParams
    seed: int                          # the request's seed (drawn once when params.seed is None)
    prompt_token_ids: list[int]         # a copy: changing the caller's list has no effect
    _outputs: Callable[[], list[int]] = field(repr=False, default=lambda: [])
    digests: Optional[np.ndarray] = field(repr=False, default=None)   # per DIGEST_FIELDS entry

    @property
    def output_token_ids(self) -> list[int]:
        """Tokens emitted so far, read from the device history (synchronises: not for hot paths)."""
        return self._outputs()


class SlotTable:
    """Smallest-free-first slot allocation with per-slot generations."""

    def __init__(self, max_num_reqs: int):
        self.max_num_reqs = max_num_reqs
        self._freed: list[int] = []          # heap of freed slots below the high-water mark
        self.high_water = 0                  # one past the largest slot ever handed out (tables need
        #                                      this many rows); slots from it on were never used
        self.generation = np.zeros(16, dtype=np.int64)
        self.prints = np.zeros(16, dtype=np.int64)     # per slot: its occupant's print (state.digest)
        self.requests: dict[str, RequestInfo] = {}
        self.version = 0                     # bumped with every generation change (a cheap staleness test)

    def allocate(self, req_id: str) -> int:
        if req_id in self.requests:
            raise ValueError(f"req_id {req_id!r} is already active; remove it first")
        if self._freed:
            slot = heapq.heappop(self._freed)
        elif self.high_water < self.max_num_reqs:
            slot = self.high_water
            self.high_water += 1
        else:
            raise ValueError(f"no free slot: all max_num_reqs={self.max_num_reqs} slots are in use")
        if slot >= len(self.generation):
            size = max(2 * len(self.generation), slot + 1)
            self.generation = np.concatenate([self.generation, np.zeros(size - len(self.generation), np.int64)])
            self.prints = np.concatenate([self.prints, np.zeros(size - len(self.prints), np.int64)])
        self.generation[slot] += 1
        self.version += 1
        return slot

    @contextlib.contextmanager
    def reserving(self, req_id: str) -> Iterator[int]:
        """A slot for `req_id` (as `allocate`) while the body writes its state; if the body raises,
        the allocation is undone (the slot is free again, the high-water mark and the slot's
        generation are back), so the next request gets the slot it would have got anyway."""
        fresh = not self._freed                  # allocate takes a fresh slot only when none was freed
        slot = self.allocate(req_id)
        try:
            yield slot
        except BaseException:
            self.generation[slot] -= 1
            self.version += 1                    # a version never repeats (plans re-check once)
            if fresh:
                self.high_water -= 1
            else:
                heapq.heappush(self._freed, slot)
            self.requests.pop(req_id, None)
            raise

    def register(self, info: RequestInfo, print_value: int = 0) -> None:
        """info's request takes its (allocated) slot; print_value: its `state.digest` print."""
        self.prints[info.slot] = print_value
        self.requests[info.req_id] = info

    def remove(self, req_id: str) -> RequestInfo:
        info = self.requests.pop(req_id, None)
        if info is None:
            raise ValueError(f"req_id {req_id!r} is not active")
        heapq.heappush(self._freed, info.slot)
        self.generation[info.slot] += 1          # plans naming the old occupant are now stale
        self.version += 1
        return info

    def get(self, req_id: str) -> RequestInfo:
        try:
            return self.requests[req_id]
        except KeyError:
            raise ValueError(f"req_id {req_id!r} is not active (add_request it first)") from None

    def slots_of(self, req_ids) -> np.ndarray:
        """[num_reqs] int64 slots of the given active request ids."""
        try:
            return np.fromiter((self.requests[r].slot for r in req_ids), dtype=np.int64, count=len(req_ids))
        except KeyError as exc:
            raise ValueError(f"req_id {exc.args[0]!r} is not active (add_request it first)") from None
        except TypeError:
            bad = next(r for r in req_ids if not isinstance(r, str))
            raise ValueError(f"req_ids must be strings, got {type(bad).__name__}") from None
