"""The three strategies: a *before* and an *after* around the one sampling recipe.

Contract: `before(logits, plan, step)` turns this rank's `[rows, V_r]` shard (rows in
`plan.logits_order`) into the `SampleArgs` this rank samples; the Sampler runs the recipe
(`sampling.recipe.sample_rows`) on them; `after(result, plan, step)` turns the per-row result
into the step's per-request block and logprobs, identical on every rank and in batch order.

- `Replicated` (the baseline most engines run): before, one all-gather of the vocab shards
  builds the full `[rows, V]` rows on every rank; every rank samples the whole batch; after:
  nothing to exchange. Costs TP copies of the full logits.
- `BatchSharded` (vLLM's MRV2 design, PR #50465): before, one all-to-all turns `[rows, V_r]`
  (owner-sorted: owner = slot % TP) into `[rows_own, V]`, the full rows of the requests this
  rank owns (received `[TP, rows_own, V_r]`, laid side by side, vocab padding dropped); the rank
  samples its own requests (their grammar rows, drafts, penalties); after, one packed int64
  all-gather of (tokens, num_sampled, num_rejected, NaN and guard counts), padded to the
  largest shard, plus one for logprobs (ids, ranks and fp32 bits), and batch order restored by
  one device gather. A rank that owns nothing still joins every collective.
- `VocabParallel`: before, nothing (the shard is the rank's part of every row, reduced through
  `ShardReducer`'s collectives inside the recipe's rounds: O(rows x TP x small) values a round);
  after, nothing to exchange. No rank ever holds a full row. At TP = 1 the shard is the full row.
Kept supports (RL sampling masks) follow the logprobs: `kept_support` is the rows' own under
replicated and vocab_parallel, and one more packed all-gather under batch_sharded.
Every strategy gives the same tokens, because every reduction is order-independent. Never
imports model or engine code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from ..sampling.logprobs import padded_logprobs
from ..sampling.output import KeptSupport, LogprobsOutput
from ..sampling.recipe import RowResult, SampleArgs, padded_support
from ..sampling.reducer import LocalRows, best_of_parts
from ..state.store import RequestStore
from .collectives import Collectives
from .plan import SamplingPlan
from .shard import vocab_shard


class MemoryMeter:
    """Peak bytes of the sampler's own buffers in one step (CPU: counted from tensor sizes)."""

    def __init__(self):
        self.current = 0
        self.peak = 0

    def hold(self, nbytes: int) -> None:
        self.current += int(nbytes)
        self.peak = max(self.peak, self.current)

    def note(self, nbytes: int) -> None:
        self.peak = max(self.peak, self.current + int(nbytes))


@dataclass
class Step:
    """One step's inputs beside the logits: the request tables, this rank's columns, the group,
    draft distributions ([rows, V_r], rows in logits_order) and the memory meter."""
    store: RequestStore
    vocab_size: int
    col_start: int
    col_end: int
    comm: Collectives
    draft_probs: Optional[torch.Tensor] = None
    inplace: bool = False              # the caller lets the sampler overwrite fp32 local logits
    meter: MemoryMeter = field(default_factory=MemoryMeter)


class ShardReducer:
    """Row reductions across the TP group for rows split by vocabulary."""

    def __init__(self, comm: Collectives):
        self.comm = comm
        self.num_parts = comm.size

    def max(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(x, "max")

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(x, "sum")

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_gather(x).permute(1, 0, 2)   # [rows, tp, c]

    def argmax_pair(self, values: torch.Tensor, ids: torch.Tensor):
        packed = torch.stack([values.double(), ids.double()], dim=1)   # ids < 2**53: exact
        parts = self.gather(packed)                      # [rows, tp, 2]
        return best_of_parts(parts[:, :, 0].to(values.dtype), parts[:, :, 1].to(torch.int64))


class _Strategy:
    def kept_support(self, res: RowResult, plan: SamplingPlan, step: Step) -> Optional[KeptSupport]:
        """Every row's kept support in batch order, identical on every rank (None: no request asked)."""
        width = support_width(plan, step)
        return None if width < 0 else KeptSupport(*padded_support(res, res.emitted.shape[0], width, res.emitted.device))


class Replicated(_Strategy):
    name = "replicated"
    by_owner = False

    def before(self, x: torch.Tensor, plan: SamplingPlan, step: Step) -> SampleArgs:
        full = _gather_vocab(x, step)
        probs = None if step.draft_probs is None else _gather_vocab(step.draft_probs, step)
        batch = step.store.row_batch(plan.all_rows, x.device)
        return SampleArgs(full, 0, batch, LocalRows(), plan.grammar_bitmask, probs, step.meter,
                          step.inplace or step.comm.size > 1)

    def after(self, res: RowResult, plan: SamplingPlan, step: Step) -> tuple:
        return request_results(res, plan, None)


class BatchSharded(_Strategy):
    name = "batch_sharded"
    by_owner = True                    # rows travel owner by owner (plan.logits_order)

    def before(self, x: torch.Tensor, plan: SamplingPlan, step: Step) -> SampleArgs:
        owned = plan.owned_reqs[step.comm.group.rank]
        full = _owned_rows(x, plan, step)
        probs = None if step.draft_probs is None else _owned_rows(step.draft_probs, plan, step)
        mask = None
        if plan.grammar_bitmask is not None:
            rows = device_copy(plan, ("mask_rows", step.comm.group.rank), plan.batch_rows(owned),
                               plan.grammar_bitmask.device)
            mask = plan.grammar_bitmask.index_select(0, rows)
        batch = step.store.row_batch(plan.rows_view(owned), x.device)
        return SampleArgs(full, 0, batch, LocalRows(), mask, probs, step.meter, step.inplace or step.comm.size > 1)

    def after(self, res: RowResult, plan: SamplingPlan, step: Step) -> tuple:
        comm = step.comm
        owned = plan.owned_reqs[comm.group.rank]
        block, lp = request_results(res, plan, owned)
        if comm.size == 1:
            return block, lp
        max_own = max(len(o) for o in plan.owned_reqs)
        gathered = comm.all_gather(_pad_rows(block, max_own))                     # [tp, max_own, w]
        out = gathered.reshape(-1, block.shape[1]).index_select(0, device_copy(plan, "gather", plan.gather_index,
                                                                                   block.device))
        return out, None if lp is None else _gather_logprobs(lp, plan, comm)

    def kept_support(self, res: RowResult, plan: SamplingPlan, step: Step) -> Optional[KeptSupport]:
        """One packed all-gather of every rank's rows (ids, count, bounds' fp32 bits), batch order."""
        own = super().kept_support(res, plan, step)
        if own is None or step.comm.size == 1:
            return own
        w = own.token_ids.shape[1]
        bits = torch.stack([own.threshold, own.upper], dim=1).view(torch.int32).to(torch.int64)
        packed = torch.cat([own.token_ids, own.count.unsqueeze(1), bits], dim=1)
        g = step.comm.all_gather(_pad_rows(packed, max(plan.rows_per_rank)))       # [tp, max_rows_own, w + 3]
        g = g.reshape(-1, w + 3).index_select(0, device_copy(plan, "lp_gather", _lp_index(plan), g.device))
        bounds = g[:, w + 1:].to(torch.int32).view(torch.float32)
        return KeptSupport(g[:, :w].contiguous(), g[:, w].contiguous(), bounds[:, 0].contiguous(),
                           bounds[:, 1].contiguous())


class VocabParallel(_Strategy):
    name = "vocab_parallel"
    by_owner = False

    def before(self, x: torch.Tensor, plan: SamplingPlan, step: Step) -> SampleArgs:
        red = LocalRows() if step.comm.size == 1 else ShardReducer(step.comm)
        batch = step.store.row_batch(plan.all_rows, x.device)
        return SampleArgs(x, step.col_start, batch, red, plan.grammar_bitmask, step.draft_probs, step.meter,
                          step.inplace)

    def after(self, res: RowResult, plan: SamplingPlan, step: Step) -> tuple:
        return request_results(res, plan, None)


BY_NAME = {s.name: s for s in (Replicated(), BatchSharded(), VocabParallel())}


def request_results(res: RowResult, plan: SamplingPlan, req_indices: Optional[np.ndarray]) -> tuple:
    """(block [reqs, max_rows + 4] int64, logprobs or None) of these requests (all when None)
    from their rows' results: the kernels' packed block as it is, else the per-request assembly
    (drafts: accepted tokens up to the first rejection); logprobs padded to the plan's width."""
    dev = res.emitted.device
    if plan.has_drafts:
        rows_per_req = plan.rows_per_req if req_indices is None else plan.rows_per_req[req_indices]
        layout = RequestRows.build(rows_per_req, plan.max_rows, dev)
        block = assemble(res.emitted, res.accepted, res.fallback, res.num_nans, layout, plan.max_rows)
    elif res.block is not None:
        block = res.block
    else:
        block = assemble(res.emitted, res.accepted, res.fallback, res.num_nans, None, plan.max_rows)
    lp = None
    if plan.logprobs_width > 0:
        lp = LogprobsOutput(*padded_logprobs((res.lp_ids, res.lp_vals, res.lp_ranks), res.emitted.shape[0],
                                             plan.logprobs_width, dev))
    return block, lp


def device_copy(plan: SamplingPlan, name, values: np.ndarray, device) -> torch.Tensor:
    """An int64 host array of the plan on `device`, copied once (pinned, non-blocking) and kept
    with the plan, so a reused plan uploads nothing."""
    key = (name, str(device))
    t = plan._cache.get(key)
    if t is None:
        t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
        if torch.device(device).type == "cuda":
            t = t.pin_memory()
        t = plan._cache[key] = t.to(device, non_blocking=True)
    return t


@dataclass(frozen=True)
class RequestRows:
    """Where each request's rows are: index [num_reqs, max_rows] int64 batch rows (0 padded),
    valid [num_reqs, max_rows] bool, num_rows [num_reqs] int64; all on the device."""
    index: torch.Tensor
    valid: torch.Tensor
    num_rows: torch.Tensor

    @staticmethod
    def build(rows_per_req: np.ndarray, max_rows: int, device) -> "RequestRows":
        start = np.cumsum(rows_per_req) - rows_per_req
        j = np.arange(max_rows)[None, :]
        valid = j < rows_per_req[:, None]
        index = np.where(valid, start[:, None] + j, 0)
        packed = torch.from_numpy(np.concatenate([index, valid, rows_per_req[:, None]], axis=1).astype(np.int64))
        if torch.device(device).type == "cuda":
            packed = packed.pin_memory()
        packed = packed.to(device, non_blocking=True)
        return RequestRows(packed[:, :max_rows], packed[:, max_rows:2 * max_rows].bool(), packed[:, -1])


def assemble(emitted: torch.Tensor, accepted: torch.Tensor, fallback: torch.Tensor, num_nans: torch.Tensor,
             layout: Optional[RequestRows], max_rows: int) -> torch.Tensor:
    """Per-request packed block [num_reqs, max_rows + 4] int64 (device) from per-row results.

    Rows come request by request (drafts first, bonus row last). A request emits its accepted
    draft tokens up to the first rejection, then that row's emitted token (the residual), or,
    if every draft is accepted, the bonus row's token. Columns: tokens (-1 pad), num_sampled,
    num_rejected, num_nans, num_fallback (rows that emitted a token through the guard).
    layout None: one row per request (no drafts in the step).
    """
    if layout is None:
        ones = torch.ones_like(emitted)
        return torch.stack([emitted, ones, ones - 1, num_nans, fallback.to(torch.int64)], dim=1)
    idx, valid = layout.index, layout.valid
    is_draft = torch.arange(max_rows, device=idx.device).unsqueeze(0) < (layout.num_rows - 1).unsqueeze(1)
    acc = accepted[idx] & is_draft
    k = torch.cumprod(acc.to(torch.int64), dim=1).sum(dim=1)         # leading accepted drafts
    emit = (torch.arange(max_rows, device=idx.device).unsqueeze(0) <= k.unsqueeze(1)) & valid
    tokens = torch.where(emit, emitted[idx], torch.full_like(idx, -1))
    nans = (num_nans[idx] * valid).sum(dim=1)
    fb = (fallback[idx] & emit).sum(dim=1)
    return torch.cat([tokens, torch.stack([k + 1, layout.num_rows - 1 - k, nans, fb], dim=1)], dim=1)


def support_width(plan: SamplingPlan, step: Step) -> int:
    """The most kept ids any request of the plan asks for (-1: none asks), from the host tables."""
    store = step.store
    caps = store.i64.host[store.layout.i64["kept_cap"], plan.slots]
    return int(caps.max()) if len(caps) else -1


def _gather_vocab(x: torch.Tensor, step: Step) -> torch.Tensor:
    """[rows, V_r] shards -> [rows, V] on every rank (shards may be uneven)."""
    tp = step.comm.size
    if tp == 1:
        return x
    widths = [e - s for s, e in (vocab_shard(step.vocab_size, tp, r) for r in range(tp))]
    parts = step.comm.all_gather(_pad_columns(x, max(widths)))          # [tp, rows, V_r max]
    step.meter.hold(parts.numel() * parts.element_size())
    full = torch.cat([parts[r, :, : widths[r]] for r in range(tp)], dim=1)
    step.meter.hold(full.numel() * full.element_size())
    return full


def _owned_rows(x: torch.Tensor, plan: SamplingPlan, step: Step) -> torch.Tensor:
    """[rows, V_r] (owner-sorted) -> [rows_own, V], the full rows of owned requests, received in
    the buffer that is sampled (no padded copy, no staging, no concatenation)."""
    comm = step.comm
    tp, me = comm.size, comm.group.rank
    if tp == 1:
        return x
    own = plan.rows_per_rank[me]
    full = torch.empty((own, step.vocab_size), dtype=x.dtype, device=x.device)
    step.meter.hold(full.numel() * full.element_size())
    shards = [vocab_shard(step.vocab_size, tp, r) for r in range(tp)]
    return comm.exchange_rows(x.contiguous(), list(plan.rows_per_rank), full, shards)


def _lp_index(plan: SamplingPlan) -> np.ndarray:
    """[num_rows]: where each batch row's logprobs land in the gathered [tp x max_rows_own] block."""
    max_rows_own = max(plan.rows_per_rank)
    index = np.zeros(plan.num_rows, np.int64)
    for r, reqs in enumerate(plan.owned_reqs):
        rows = plan.batch_rows(reqs)
        index[rows] = r * max_rows_own + np.arange(len(rows))
    return index


def _gather_logprobs(lp: LogprobsOutput, plan: SamplingPlan, comm: Collectives) -> LogprobsOutput:
    """One packed all-gather of every rank's logprob rows, in batch order."""
    w = plan.logprobs_width
    packed = torch.cat([lp.token_ids, lp.ranks.unsqueeze(1), lp.logprobs.view(torch.int32).to(torch.int64)], dim=1)
    g = comm.all_gather(_pad_rows(packed, max(plan.rows_per_rank)))           # [tp, max_rows_own, 2w + 1]
    g = g.reshape(-1, 2 * w + 1).index_select(0, device_copy(plan, "lp_gather", _lp_index(plan), g.device))
    return LogprobsOutput(g[:, :w].contiguous(), g[:, w + 1:].to(torch.int32).view(torch.float32).contiguous(),
                          g[:, w].contiguous())


def _pad_columns(x: torch.Tensor, width: int) -> torch.Tensor:
    if x.shape[1] == width:
        return x
    out = x.new_zeros((x.shape[0], width))
    out[:, : x.shape[1]] = x
    return out


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x
    out = x.new_zeros((rows, *x.shape[1:]))
    out[: x.shape[0]] = x
    return out
