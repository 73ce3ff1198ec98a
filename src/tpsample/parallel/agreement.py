"""What TP ranks disagree on, once their plan fingerprints were found to differ.

A plan's fingerprint covers the step's structure (slots, occupants, drafts, strategy, logprobs
width, grammar mask) and each request's print (its id, params and prompt, hashed once at
add_request: `state.digest`). Every step compares one 8-byte fingerprint per rank; only when they
differ does `disagreement` run, to say why:

1. all-gather [num_reqs, has_prints]; if the ranks' batches have the same size,
2. all-gather the per-request prints and take the first batch position where they differ,
3. all-gather that request's per-field digests and name the fields that differ.

Collective: every rank saw the same gathered fingerprints, so every rank calls it, runs the same
gathers (of the same shapes, decided from gathered values only) and raises; none is left waiting.
"""
from __future__ import annotations

import numpy as np
import torch

from ..state.digest import DIGEST_FIELDS
from .collectives import Collectives


def _gather(check: Collectives, values: np.ndarray) -> np.ndarray:
    """[tp, *values.shape] int64: every rank's values, rank order (host tensors, the gloo twin)."""
    t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
    return check.all_gather(t).numpy()


def disagreement(check: Collectives, plan, prints: list[int], slots) -> str:
    """The error message for ranks whose plan fingerprints `prints` differ (see the module
    docstring). plan: this rank's SamplingPlan; slots: this rank's SlotTable (for the digests)."""
    has = plan.param_prints is not None and plan.num_reqs > 0
    head = _gather(check, np.array([plan.num_reqs, int(has)]))
    if (head == head[0]).all() and has:
        per_req = _gather(check, plan.param_prints)
        differs = np.flatnonzero((per_req != per_req[0]).any(axis=0))
        if len(differs):
            i = int(differs[0])
            digests = slots.get(plan.req_ids[i]).digests
            if digests is None:
                digests = np.zeros(len(DIGEST_FIELDS), np.int64)
            every = _gather(check, digests)
            fields = [DIGEST_FIELDS[j] for j in np.flatnonzero((every != every[0]).any(axis=0))]
            return _message(plan.req_ids[i], i, fields, check.group.rank)
    return (f"TP ranks disagree on the step: plan fingerprints {prints} differ (every rank must add the same "
            "requests with the same params and plan the same req_ids in the same order, with the same drafts, "
            "grammar mask and strategy)")


def _message(req_id: str, position: int, fields: list[str], rank: int) -> str:
    if "req_id" in fields or not fields:
        return (f"TP ranks disagree on the step: batch position {position} holds request {req_id!r} on rank "
                f"{rank} but another request on another rank (every rank must add the same requests and "
                "plan the same req_ids in the same order)")
    verb = "differs" if len(fields) == 1 else "differ"
    return (f"TP ranks disagree on request {req_id!r}: {', '.join(fields)} {verb} between ranks (every rank "
            "must add each request with the same SamplingParams and prompt_token_ids)")
