"""Sampling plans: plain data computed by a pure function of replicated inputs.

Every rank calls `build_plan` with the same slots, drafts and TP size and gets the same plan
without talking. All per-request and per-row fields are numpy arrays built by vectorised ops.

Row layout. The batch has `num_rows` logits rows, request by request in batch order: request i
owns rows [row_start[i], row_start[i] + rows_per_req[i]); its draft rows come first, its bonus
row last. The runner computes this rank's local logits for batch rows in `logits_order` (local
row j is batch row logits_order[j]).

- replicated / vocab_parallel: logits_order is the identity.
- batch_sharded: owner(request) = slot % tp_size. logits_order lists the rows of rank 0's
  requests, then rank 1's, ... (batch order kept within an owner), so one all-to-all with
  `rows_per_rank` as splits hands each rank the full rows of its own requests. `max_rows` is the
  gather width (max rows per request over the whole batch), so every rank packs the same shape
  even when it owns nothing; `gather_index` [num_reqs] says where each request's packed result
  lands in the all-gathered [tp x max_owned] block, restoring batch order with one device gather.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from ..state.rows import RowsView


@dataclass(frozen=True, eq=False)
class SamplingPlan:
    strategy: str                      # resolved strategy for this step (its name)
    tp_size: int
    req_ids: tuple[str, ...]
    slots: np.ndarray                  # [num_reqs] int64
    generations: np.ndarray            # [num_reqs] int64: each slot's occupant when planned
    drafts: np.ndarray                 # [num_reqs, D] int64 draft tokens, -1 padded (D may be 0)
    rows_per_req: np.ndarray           # [num_reqs] 1 + number of drafts
    row_start: np.ndarray              # [num_reqs] first batch row of each request
    num_rows: int
    max_rows: int
    logprobs_width: int                # 1 + max top-n over the batch (0 when no logprobs)
    logits_order: torch.Tensor         # [num_rows] int64 batch row of each local logits row
    owners: np.ndarray                 # [num_reqs] owner rank (batch_sharded; all 0 otherwise)
    owned_reqs: tuple[np.ndarray, ...]  # per rank: its request indices, batch order
    rows_per_rank: tuple[int, ...]     # per rank: logits rows it owns (all-to-all splits)
    gather_index: np.ndarray           # [num_reqs] row of each request in the gathered results
    grammar_bitmask: Optional[torch.Tensor] = None   # [num_rows, ceil(V/32)] int32, batch order
    sampler_uid: int = 0               # the sampler that built it
    vocab_size: int = 0
    param_prints: Optional[np.ndarray] = None      # [num_reqs] int64 each slot's print (state.digest)
    sharding: Any = None               # the strategy object (`parallel.strategies`): its before and after
    _cache: dict = field(default_factory=dict, repr=False)      # views and device copies, reused
    # derived (plain fields: a step reads them without calling into this module)
    num_reqs: int = field(init=False)
    has_drafts: bool = field(init=False)             # some request verifies draft tokens
    all_rows: RowsView = field(init=False, repr=False)   # every row's RowsView
    fingerprint: int = field(init=False)             # what every rank must agree on (`_fingerprint_of`)

    def __post_init__(self):
        object.__setattr__(self, "num_reqs", len(self.slots))
        object.__setattr__(self, "has_drafts", self.max_rows > 1)
        object.__setattr__(self, "all_rows", self._rows_view(None))
        object.__setattr__(self, "fingerprint", self._fingerprint_of())

    def draft_token_ids(self) -> list[list[int]]:
        return [[int(t) for t in row if t >= 0] for row in self.drafts]

    def batch_rows(self, req_indices: np.ndarray) -> np.ndarray:
        """Batch rows of the given requests, request by request."""
        req_indices = np.asarray(req_indices, dtype=np.int64)
        n = self.rows_per_req[req_indices]
        reps = np.repeat(req_indices, n)
        within = np.arange(len(reps)) - np.repeat(np.cumsum(n) - n, n)
        return self.row_start[reps] + within

    def rows_view(self, req_indices: Optional[np.ndarray] = None) -> RowsView:
        """The RowsView of the given requests' rows (all requests when None); cached, so a plan
        reused across steps uploads its indices once."""
        if req_indices is None:
            return self.all_rows
        key = ("view", np.asarray(req_indices).tobytes())
        view = self._cache.get(key)
        if view is None:
            view = self._cache[key] = self._rows_view(req_indices)
        return view

    def _rows_view(self, req_indices: Optional[np.ndarray]) -> RowsView:
        reqs = np.arange(self.num_reqs) if req_indices is None else np.asarray(req_indices, dtype=np.int64)
        n = self.rows_per_req[reqs]
        row_req = np.repeat(reqs, n)
        offsets = np.arange(len(row_req)) - np.repeat(np.cumsum(n) - n, n)
        d = self.drafts.shape[1]
        if d == 0:
            return RowsView(self.slots[row_req], offsets, np.full(len(row_req), -1, np.int64))
        drafts = self.drafts[row_req]                                     # [rows, D]
        j = np.minimum(offsets, d - 1)
        draft_tok = np.where(offsets < d, drafts[np.arange(len(row_req)), j], -1)
        before = np.where(np.arange(d)[None, :] < offsets[:, None], drafts, -1)
        return RowsView(self.slots[row_req], offsets, draft_tok, before)

    def _fingerprint_of(self) -> int:
        """A 63-bit hash of what every rank must agree on, the requests' params included."""
        h = hashlib.blake2b(digest_size=8)
        for part in (self.strategy.encode(), self.slots.tobytes(), self.generations.tobytes(),
                     self.drafts.tobytes(), bytes([self.logprobs_width % 256]),
                     b"m" if self.grammar_bitmask is not None else b"-",
                     b"" if self.param_prints is None else self.param_prints.tobytes()):
            h.update(part)
        return int.from_bytes(h.digest(), "little") >> 1

def build_plan(strategy, tp_size: int, req_ids, slots: np.ndarray, generations: np.ndarray,
               drafts: np.ndarray, logprobs_width: int, grammar_bitmask: Optional[torch.Tensor] = None,
               sampler_uid: int = 0, vocab_size: int = 0, param_prints: Optional[np.ndarray] = None) -> SamplingPlan:
    """strategy: the strategy object (`parallel.strategies`); its `by_owner` says whether rows
    travel owner by owner (batch_sharded's all-to-all)."""
    num_reqs = len(slots)
    rows_per_req = 1 + (drafts >= 0).sum(axis=1).astype(np.int64) if drafts.shape[1] else np.ones(num_reqs, np.int64)
    row_start = np.cumsum(rows_per_req) - rows_per_req
    num_rows = int(rows_per_req.sum())
    sharded = strategy.by_owner
    owners = (slots % tp_size) if sharded else np.zeros(num_reqs, np.int64)
    owned = tuple(np.flatnonzero(owners == r) for r in range(tp_size))
    plan_args = dict(strategy=strategy.name, sharding=strategy, tp_size=tp_size, req_ids=tuple(req_ids), slots=slots,
                     generations=generations, drafts=drafts, rows_per_req=rows_per_req, row_start=row_start,
                     num_rows=num_rows, max_rows=int(rows_per_req.max()) if num_reqs else 1,
                     logprobs_width=logprobs_width, owners=owners, owned_reqs=owned,
                     grammar_bitmask=grammar_bitmask, sampler_uid=sampler_uid, vocab_size=vocab_size,
                     param_prints=param_prints)
    if sharded:
        probe = SamplingPlan(logits_order=torch.zeros(0), rows_per_rank=(), gather_index=np.zeros(0), **plan_args)
        order = probe.batch_rows(np.concatenate(owned)) if num_reqs else np.zeros(0, np.int64)
        rows_per_rank = tuple(int(rows_per_req[o].sum()) for o in owned)
        width = max((len(o) for o in owned), default=0)
        gather_index = np.zeros(num_reqs, np.int64)
        for r, o in enumerate(owned):
            gather_index[o] = r * width + np.arange(len(o))
    else:
        order = np.arange(num_rows)
        rows_per_rank = tuple(num_rows if r == 0 else 0 for r in range(tp_size))
        gather_index = np.arange(num_reqs)
    return SamplingPlan(logits_order=torch.from_numpy(np.asarray(order, dtype=np.int64)),
                        rows_per_rank=rows_per_rank, gather_index=gather_index, **plan_args)
