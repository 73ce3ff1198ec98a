"""How the ops sample: the Sampler's own code paths, over per-row parameters laid out as its
per-slot tables (a `RowTable`, one slot per row or request) instead of a RequestStore.

Contract:
- `RowTable.build(...)` takes normalised per-row tensors (`args.normalise`) on the logits'
  device and writes them into `[params, n]` fp32 / int64 tables with the Sampler's core column
  layout (`state.columns`): seed, top-k, `prompt_len` = the position, no outputs, no
  processors. So `position = prompt_len + num_out + draft offset` is the caller's position (plus
  the draft offset of a verify row), and the noise is keyed exactly as the Sampler keys it.
  `row_batch(view, device)` is `RequestStore.row_batch`'s signature: the strategies and the
  sampling recipe run on it unchanged. The identity view (every row, no drafts) needs no
  upload, so a call can be recorded in a CUDA graph.
- host: the rows' parameters as numpy (`HostRows`) when known. When they are not (device
  tensors on the kernel path, which needs only the kernels' hints), conservative stand-ins
  (every filter possibly on) and the caller's hints fill them; the caller reads the device
  instead wherever the torch pipeline would decide from them (`needs_host_values`).
- `sample_full(x, table, bitmask, width)`: full rows (TP = 1): the sampling recipe
  (`sampling.recipe.sample_rows`) with the identity reducer, what every strategy runs at TP = 1.
- `sample_tp(x, table, strategy, comm, ...)`: a plan built from the rows (row r is request r,
  slot r, so batch_sharded's owner is r % TP) and the Sampler's strategies (the before and
  after around the recipe); every rank gets the same result, equal bitwise to TP = 1. Rows that
  verify drafts come from the plan (`drafts`), as in `Sampler.plan`.
- `choose(strategy, table, tp, vocab_size, device, rows_per_req)`: "auto" as the Sampler means it.
Never imports the Sampler.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..kernels.launcher import RowHints, kernels_wanted
from ..parallel import auto
from ..parallel.auto import Features, static_costs
from ..parallel.collectives import Collectives
from ..parallel.plan import build_plan
from ..parallel.shard import vocab_shard
from ..parallel.strategies import BY_NAME, Step
from ..sampling.logprobs import padded_logprobs
from ..sampling.recipe import SampleArgs, sample_rows
from ..sampling.reducer import LocalRows
from ..state.columns import Layout
from ..state.rows import HostRows, RowBatch, RowSource, RowsView, upload

LAYOUT = Layout.of(())     # the core columns: the ops' processors are ops of their own
HINT_FIELDS = ("any_filter", "any_top_k_or_p", "any_greedy", "any_plain", "any_top_p_alone")


def hints_from_bits(bits: int) -> RowHints:
    """RowHints from a bit field (bit i = HINT_FIELDS[i]; higher bits are ignored); -1: unknown,
    every hint on."""
    if bits < 0:
        return RowHints()
    return RowHints(*(bool(bits >> i & 1) for i in range(len(HINT_FIELDS))))


def hints_to_bits(h: RowHints) -> int:
    return sum(int(getattr(h, f)) << i for i, f in enumerate(HINT_FIELDS))


def identity_view(n: int) -> RowsView:
    """Every row of a table once, in order, with no drafts."""
    return RowsView(np.arange(n, dtype=np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64))


class RowTable:
    def __init__(self, f32: torch.Tensor, i64: torch.Tensor, host: dict, vocab_size: int,
                 hints: Optional[RowHints]):
        self.f32, self.i64, self.vocab_size = f32, i64, vocab_size
        self.size = f32.shape[1]
        self.num_out = torch.zeros(self.size, dtype=torch.int64, device=f32.device)
        self.host = host               # name -> [n] numpy (parameters possibly stand-ins)
        self.hints = hints             # set when host holds stand-ins: the kernels' hints

    @staticmethod
    def build(temperature, top_k, top_p, min_p, seeds, positions, *, num_logprobs: int, processed: bool,
              vocab_size: int, host: Optional[dict], hints: int = -1) -> "RowTable":
        """Normalised [n] tensors; host: the same values as numpy (None: unknown, see module doc)."""
        n, dev = temperature.shape[0], temperature.device
        lp = torch.full((n,), num_logprobs, dtype=torch.int64, device=dev)
        none = torch.zeros(n, dtype=torch.int64, device=dev)
        f32 = _stack(LAYOUT.f32, {"temperature": temperature, "top_p": top_p, "min_p": min_p})
        i64 = _stack(LAYOUT.i64, {"seed": seeds, "top_k": top_k, "prompt_len": positions, "num_logprobs": lp,
                                  "processed": none + int(processed), "flags": none})
        known = host is not None
        if not known:       # stand-ins that only widen what the torch pipeline would look at
            host = {"temperature": np.ones(n, np.float32), "top_k": np.full(n, vocab_size, np.int64),
                    "top_p": np.full(n, 0.5, np.float32), "min_p": np.full(n, 0.5, np.float32)}
        host = dict(host, num_logprobs=np.full(n, num_logprobs, np.int64), processed=np.full(n, processed))
        return RowTable(f32, i64, host, vocab_size, None if known else hints_from_bits(hints))

    def row_batch(self, view: RowsView, device) -> RowBatch:
        n = view.num_rows
        if self._is_identity(view):
            slots = torch.arange(n, device=device)
            offsets = torch.zeros(n, dtype=torch.int64, device=device)
            drafts = torch.full((n,), -1, dtype=torch.int64, device=device)
        else:
            slots, offsets, drafts = upload([view.slots, view.offsets, view.draft_tokens], torch.device(device))
        h = {k: v[view.slots] for k, v in self.host.items()}
        host = HostRows(temperature=h["temperature"], top_k=h["top_k"], top_p=h["top_p"], min_p=h["min_p"],
                        num_logprobs=h["num_logprobs"], processed=h["processed"], has_draft=view.draft_tokens >= 0)
        if self.hints is not None:      # the kernels decide from these, never from the stand-ins
            host.memo[("hints", self.vocab_size)] = self.hints
        wants = host.num_logprobs >= 0
        source = RowSource(self.f32, self.i64, self.num_out, slots, offsets, LAYOUT)
        return RowBatch(num_rows=n, vocab_size=self.vocab_size, source=source, draft_tokens=drafts, host=host,
                        lp_raw_rows=_rows(wants & ~host.processed, device),
                        lp_proc_rows=_rows(wants & host.processed, device), origin=(self, view, device))

    def _is_identity(self, view: RowsView) -> bool:
        n = view.num_rows
        return (n == self.size and view.drafts_before is None and not (view.draft_tokens >= 0).any()
                and not view.offsets.any() and np.array_equal(view.slots, np.arange(n)))


def _stack(columns: dict, values: dict) -> torch.Tensor:
    """[len(columns), n] the named rows in the layout's order; a column not given holds its "off"
    value (the Sampler-only filters: the ops do not take them)."""
    like = next(iter(values.values()))
    fill = dict(zip(LAYOUT.f32, LAYOUT.f32_fill)) | dict(zip(LAYOUT.i64, LAYOUT.i64_fill))
    return torch.stack([values[name] if name in values else torch.full_like(like, fill[name])
                        for name in sorted(columns, key=columns.get)])


def _rows(mask: np.ndarray, device) -> Optional[torch.Tensor]:
    """Device indices of the rows in `mask` (all rows: an arange, no upload); None for none."""
    if not mask.any():
        return None
    if mask.all():
        return torch.arange(len(mask), device=device)
    return upload([np.flatnonzero(mask)], torch.device(device))[0]


def choose(strategy: str, table: RowTable, tp: int, vocab_size: int, device: torch.device,
           rows_per_req: np.ndarray) -> str:
    """"auto" means what it means for the Sampler: the strategy the cost model of
    `parallel.auto` estimates fastest for this batch's feature class, rows and owners
    (request r is owned by rank r % TP). The Sampler measures the model's constants on the real
    group on first use; a stateless call has no state to keep them in, so it takes the static
    constants of the device kind (those the Sampler starts from)."""
    if strategy != "auto":
        return strategy
    h = table.host
    f = Features.of(h["temperature"], h["top_k"], h["top_p"], h["min_p"], h["num_logprobs"], h["processed"],
                    bool((rows_per_req > 1).any()))
    owner_rows = max(int(rows_per_req[r::tp].sum()) for r in range(tp))
    return auto.choose(int(rows_per_req.sum()), owner_rows, vocab_size, tp, f, *static_costs(device.type, f))


def kernel_path(x: torch.Tensor) -> bool:
    """Full rows of x go through the fused kernels (the gate the recipe applies)."""
    return x.stride(1) == 1 and kernels_wanted(x.device)


def needs_host_values(x: torch.Tensor, processed_logprobs: bool, tp: int) -> bool:
    """The torch pipeline runs on some row and decides from host parameters."""
    return tp > 1 or processed_logprobs or not kernel_path(x)


def sample_full(x: torch.Tensor, table: RowTable, bitmask: Optional[torch.Tensor], width: int):
    """(tokens [R] int64, fallback [R] bool, num_nans [R] int64, lp_ids [R, width] int64,
    lp_vals [R, width] fp32, lp_ranks [R] int64), each a tensor of its own (no views)."""
    dev, n = x.device, table.size
    view = identity_view(n)
    b = table.row_batch(view, dev)
    res = sample_rows(SampleArgs(x, 0, b, LocalRows(), bitmask))
    if width:
        ids, vals, ranks = padded_logprobs((res.lp_ids, res.lp_vals, res.lp_ranks), n, width, dev)
    else:
        ids = torch.empty((n, 0), dtype=torch.int64, device=dev)
        vals = torch.empty((n, 0), dtype=torch.float32, device=dev)
        ranks = torch.zeros(n, dtype=torch.int64, device=dev)
    return (res.emitted.to(torch.int64).clone(), res.fallback.to(torch.bool).clone(),
            res.num_nans.to(torch.int64).clone(), ids.clone(), vals.clone(), ranks.clone())


def sample_tp(x: torch.Tensor, table: RowTable, strategy: str, comm: Collectives, vocab_size: int, *,
              bitmask: Optional[torch.Tensor] = None, width: int = 0, drafts: Optional[np.ndarray] = None,
              draft_probs: Optional[torch.Tensor] = None) -> tuple:
    """(block [reqs, max_rows + 4] int64, LogprobsOutput or None): one step of `strategy` over
    this rank's shard x [rows, V_r] in batch order (rows: each request's draft rows, then its
    bonus row, when drafts [reqs, D] are given)."""
    reqs = table.size
    drafts = np.zeros((reqs, 0), np.int64) if drafts is None else drafts
    plan = build_plan(BY_NAME[strategy], comm.size, range(reqs), np.arange(reqs, dtype=np.int64), np.zeros(reqs, np.int64),
                      drafts, width, bitmask, 0, vocab_size)
    start, end = vocab_shard(vocab_size, comm.size, comm.group.rank)
    if plan.sharding.by_owner and comm.size > 1:      # the strategy takes rows owner by owner
        order = plan.logits_order.to(x.device)
        x = x.index_select(0, order)
        draft_probs = None if draft_probs is None else draft_probs.index_select(0, order)
    step = Step(table, vocab_size, start, end, comm, draft_probs=draft_probs)
    return plan.sharding.after(sample_rows(plan.sharding.before(x, plan, step)), plan, step)
