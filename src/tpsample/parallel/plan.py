"""Sampling plans: plain data computed by pure functions of replicated inputs.

Every rank calls `build_plan` with the same request ids, slots, draft lists and TP size, and gets
the same plan without talking.

Row layout. The batch has `num_rows` logits rows, request by request in the order of `req_ids`:
request i owns rows [row_start[i], row_start[i] + rows_per_req[i]); its draft rows come first,
its bonus row last. The runner computes this rank's local logits for batch rows in
`logits_order` (local row j is batch row logits_order[j]).

- replicated / vocab_parallel: logits_order is the identity.
- batch_sharded: owner(request) = slot % tp_size. logits_order lists the rows of rank 0's
  requests, then rank 1's, ... (batch order kept within an owner), so one all-to-all with
  `rows_per_rank` as splits hands each rank the full rows of its own requests.
  `max_rows` is the gather width: max rows per request over the whole batch, so every rank packs
  the same shape even when it owns nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class SamplingPlan:
    strategy: str                      # resolved strategy for this step
    tp_size: int
    req_ids: tuple[str, ...]
    slots: tuple[int, ...]
    draft_token_ids: tuple[tuple[int, ...], ...]
    rows_per_req: tuple[int, ...]      # 1 + number of drafts
    row_start: tuple[int, ...]         # first batch row of each request
    num_rows: int
    max_rows: int
    logprobs_width: int                # 1 + max top-n over the batch (0 when no logprobs)
    logits_order: torch.Tensor         # [num_rows] int64 batch row of each local logits row
    owners: tuple[int, ...]            # per request (batch_sharded; all 0 otherwise)
    owned_reqs: tuple[tuple[int, ...], ...]   # per rank: its request indices, batch order
    rows_per_rank: tuple[int, ...]     # per rank: logits rows it owns (all-to-all splits)
    grammar_bitmask: Optional[torch.Tensor] = None   # [num_rows, ceil(V/32)] int32, batch order

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    def batch_rows(self, req_indices) -> list[int]:
        """Batch rows of the given requests, request by request."""
        return [self.row_start[i] + j for i in req_indices for j in range(self.rows_per_req[i])]


def build_plan(strategy: str, tp_size: int, req_ids: list[str], slots: list[int],
               drafts: list[list[int]], logprobs_width: int,
               grammar_bitmask: Optional[torch.Tensor] = None) -> SamplingPlan:
    rows_per_req = tuple(1 + len(d) for d in drafts)
    row_start, acc = [], 0
    for n in rows_per_req:
        row_start.append(acc)
        acc += n
    sharded = strategy == "batch_sharded"
    owners = tuple((s % tp_size) if sharded else 0 for s in slots)
    owned = tuple(tuple(i for i, o in enumerate(owners) if o == r) for r in range(tp_size))
    if sharded:
        order = [row_start[i] + j for r in range(tp_size) for i in owned[r] for j in range(rows_per_req[i])]
        rows_per_rank = tuple(sum(rows_per_req[i] for i in owned[r]) for r in range(tp_size))
    else:
        order = list(range(acc))
        rows_per_rank = tuple(acc if r == 0 else 0 for r in range(tp_size))
    return SamplingPlan(
        strategy=strategy, tp_size=tp_size, req_ids=tuple(req_ids), slots=tuple(slots),
        draft_token_ids=tuple(tuple(d) for d in drafts), rows_per_req=rows_per_req,
        row_start=tuple(row_start), num_rows=acc, max_rows=max(rows_per_req, default=1),
        logprobs_width=logprobs_width, logits_order=torch.tensor(order, dtype=torch.int64),
        owners=owners, owned_reqs=owned, rows_per_rank=rows_per_rank, grammar_bitmask=grammar_bitmask,
    )
