"""A step's rows: `RowsView` names them, `build_row_batch` gathers their state into a `RowBatch`.

Gathers over slot indices, no Python loop over requests or rows. Row j of a request is the
target row for position `prompt_len + num_out + j`; its history is the request's outputs
followed by its drafts before j (if they are accepted, they are outputs). Everything the step
needs from the host (slot and row indices) goes to the device in one pinned, non-blocking copy
(`upload`, cached per plan); the rest is gathered on the device, on first use. Which rows use
which processor comes from the `flags` column's host mirror, so nothing here reads the device
to decide; each processor gathers its own rows (`RowContext` is what it may ask for).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from .columns import Layout


@dataclass(frozen=True)
class RowsView:
    """Rows of a step: slots [n], draft offsets [n] (j of row j of its request), the draft token
    each row verifies [n] (-1 none), and drafts before each row [n, D] (-1 pad; None: no drafts)."""
    slots: np.ndarray
    offsets: np.ndarray
    draft_tokens: np.ndarray
    drafts_before: Optional[np.ndarray] = None
    cache: dict = field(default_factory=dict, compare=False, repr=False)   # per device: uploads

    @property
    def num_rows(self) -> int:
        return len(self.slots)

    def subset(self, rows: np.ndarray) -> "RowsView":
        before = None if self.drafts_before is None else self.drafts_before[rows]
        return RowsView(self.slots[rows], self.offsets[rows], self.draft_tokens[rows], before)


@dataclass(frozen=True)
class HostRows:
    """Per-row parameters on the host (numpy), for decisions that must not read the device."""
    temperature: np.ndarray   # [n] float32
    top_k: np.ndarray         # [n] int64 (0 = off)
    top_p: np.ndarray         # [n] float32
    min_p: np.ndarray         # [n] float32
    num_logprobs: np.ndarray  # [n] int64 (-1 = none)
    processed: np.ndarray     # [n] bool
    has_draft: np.ndarray     # [n] bool
    top_n_sigma: Optional[np.ndarray] = None      # [n] float32 (0 = off; None: every row off)
    xtc_probability: Optional[np.ndarray] = None  # [n] float32 (0 = off; None: every row off)
    lp_kind: Optional[np.ndarray] = None          # [n] int64 (columns.LP_*; None: every row LP_LOGPROBS)
    kept_cap: Optional[np.ndarray] = None         # [n] int64 (-1: no kept support; None: none for every row)
    memo: dict = field(default_factory=dict, compare=False, repr=False)   # decisions derived from these

    def beyond_logprobs(self) -> np.ndarray:
        """[n] bool: rows asking for logprob values other than the log-softmax, or a kept support."""
        out = np.zeros(len(self.temperature), dtype=bool)
        if self.lp_kind is not None:
            out |= (self.lp_kind != 0) & (self.num_logprobs >= 0)
        if self.kept_cap is not None:
            out |= self.kept_cap >= 0
        return out

    def uses(self, name: str) -> np.ndarray:
        """[n] bool: the rows of sampled requests whose filter `name` (a float field, 0 = off) is on."""
        values = getattr(self, name)
        if values is None:
            return np.zeros(len(self.temperature), dtype=bool)
        return (values > 0) & (self.temperature > 0)


@dataclass(frozen=True)
class RowSource:
    """Where a batch's per-row parameters live: the per-slot tables ([params, slots] fp32 and
    int64, rows named by `layout`), the history lengths [slots], and the rows' slots and draft
    offsets [n] on the device. Gathers happen on first use."""
    f32_table: torch.Tensor
    i64_table: torch.Tensor
    num_out: torch.Tensor
    slots: torch.Tensor
    offsets: torch.Tensor
    layout: Layout


class RowBatch:
    """Per-row parameters (device tensors, gathered from the tables on first use), host flags,
    and per processor the rows that use it (`processors`: name -> what its `rows` gathered)."""

    def __init__(self, *, num_rows: int, vocab_size: int, source: RowSource, draft_tokens: torch.Tensor,
                 host: HostRows, processors: Optional[dict] = None, lp_raw_rows: Optional[torch.Tensor] = None,
                 lp_proc_rows: Optional[torch.Tensor] = None, origin: Optional[tuple] = None):
        self.num_rows, self.vocab_size, self.source = num_rows, vocab_size, source
        self.draft_tokens = draft_tokens            # [n] int64 (-1 = bonus / no draft)
        self.host = host
        self.processors = processors or {}          # only the processors some row uses
        self.lp_raw_rows, self.lp_proc_rows = lp_raw_rows, lp_proc_rows   # [m] rows wanting raw / processed
        self.origin = origin                        # (tables, RowsView, device) it was built from
        self._cache: dict = {}

    def subset(self, rows: np.ndarray) -> "RowBatch":
        """The RowBatch of some of these rows (host indices), built from the same tables."""
        tables, view, device = self.origin
        return tables.row_batch(view.subset(rows), device)

    def column(self, name: str) -> torch.Tensor:
        """[n] the rows' values of a per-slot parameter (gathered once)."""
        got = self._cache.get(name)
        if got is None:
            src = self.source
            f32 = src.layout.f32.get(name)
            row = src.f32_table[f32] if f32 is not None else src.i64_table[src.layout.i64[name]]
            got = self._cache[name] = row.index_select(0, src.slots)
        return got

    @property
    def seeds(self) -> torch.Tensor:          # [n] int64
        return self.column("seed")

    @property
    def positions(self) -> torch.Tensor:      # [n] int64: prompt_len + outputs + draft offset
        got = self._cache.get("positions")
        if got is None:
            src = self.source
            got = self._cache["positions"] = (self.column("prompt_len") + src.num_out.index_select(0, src.slots)
                                              + src.offsets)
        return got

    @property
    def temperature(self) -> torch.Tensor:    # [n] fp32 (0 = greedy)
        return self.column("temperature")

    @property
    def top_k(self) -> torch.Tensor:          # [n] int64 (0 = off; never above V)
        return self.column("top_k")

    @property
    def top_p(self) -> torch.Tensor:          # [n] fp32 (1 = off)
        return self.column("top_p")

    @property
    def min_p(self) -> torch.Tensor:          # [n] fp32 (0 = off)
        return self.column("min_p")

    @property
    def num_logprobs(self) -> torch.Tensor:   # [n] int64 (-1 = none)
        return self.column("num_logprobs")

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature == 0

    @property
    def sample_any(self) -> bool:
        return bool((self.host.temperature > 0).any())

    @property
    def top_k_max(self) -> int:
        return int(self.host.top_k.max()) if self.num_rows else 0

    @property
    def top_p_any(self) -> bool:
        return bool((self.host.top_p < 1).any())

    @property
    def min_p_any(self) -> bool:
        return bool((self.host.min_p > 0).any())

    @property
    def top_n_sigma(self) -> torch.Tensor:    # [n] fp32 (0 = off)
        return self.column("top_n_sigma")

    @property
    def sigma_any(self) -> bool:
        return bool(self.host.uses("top_n_sigma").any())

    @property
    def xtc_any(self) -> bool:
        return bool(self.host.uses("xtc_probability").any())

    @property
    def torch_only_any(self) -> bool:
        """Some row uses what only the torch backend computes on a shard: XTC, logprob values
        other than the log-softmax, a kept support."""
        return self.xtc_any or bool(self.host.beyond_logprobs().any())

    @property
    def kept_cap_max(self) -> int:
        """The largest kept-support cap of the rows (-1: no row asks for one)."""
        h = self.host.kept_cap
        return int(h.max()) if h is not None and self.num_rows else -1

    @property
    def logprobs_max(self) -> int:
        return int(self.host.num_logprobs.max()) if self.num_rows else -1

    @property
    def drafts_any(self) -> bool:
        return bool(self.host.has_draft.any())

    @property
    def uses_processors(self) -> bool:
        return bool(self.processors)


def upload(arrays: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """int64 host arrays -> device tensors through one pinned, non-blocking copy."""
    flat = [np.ascontiguousarray(a, dtype=np.int64).reshape(-1) for a in arrays]
    buf = torch.from_numpy(np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64))
    if device.type == "cuda":
        buf = buf.pin_memory().to(device, non_blocking=True)
    out, at = [], 0
    for a, f in zip(arrays, flat):
        out.append(buf[at: at + f.size].view(a.shape))
        at += f.size
    return out


def _static_part(store, view: RowsView, device: torch.device) -> dict:
    """What depends only on the rows (fixed for a plan): host parameters, which rows use which
    processor, and their indices and slots on the device (one upload, cached on the view)."""
    slots, layout = view.slots, store.layout
    hf, hi = store.f32.host[:, slots], store.i64.host[:, slots]
    flags = hi[layout.i64["flags"]]
    names = [p.name for p in store.processors]
    want = {name: np.flatnonzero(flags & layout.bits[name]) for name in names}
    wants_lp = hi[layout.i64["num_logprobs"]] >= 0
    processed = hi[layout.i64["processed"]] != 0
    lp = [np.flatnonzero(wants_lp & ~processed), np.flatnonzero(wants_lp & processed)]
    drafts = view.drafts_before if view.drafts_before is not None else np.zeros((len(slots), 0), np.int64)
    dev = upload([slots, view.offsets, view.draft_tokens, drafts, *lp] + [want[n] for n in names]
                 + [slots[want[n]] for n in names], device)
    host = HostRows(temperature=hf[layout.f32["temperature"]], top_k=hi[layout.i64["top_k"]],
                    top_p=hf[layout.f32["top_p"]], min_p=hf[layout.f32["min_p"]],
                    num_logprobs=hi[layout.i64["num_logprobs"]], processed=processed,
                    has_draft=view.draft_tokens >= 0, top_n_sigma=hf[layout.f32["top_n_sigma"]],
                    xtc_probability=hf[layout.f32["xtc_probability"]], lp_kind=hi[layout.i64["lp_kind"]],
                    kept_cap=hi[layout.i64["kept_cap"]])
    k = len(names)
    return {"host": host, "want": want, "idx": dict(zip(names, dev[6:6 + k])),
            "idx_slots": dict(zip(names, dev[6 + k:])), "slots": dev[0], "offsets": dev[1], "draft": dev[2],
            "drafts": dev[3], "lp": [d if len(h) else None for d, h in zip(dev[4:6], lp)], "values": {}}


def build_row_batch(store, view: RowsView, device: torch.device) -> RowBatch:
    """The RowBatch of `view`'s rows: the core parameters gathered on first use, and each
    processor's rows gathered by the processor itself, for the processors some row uses."""
    c = view.cache.get(device)
    if c is None:
        c = view.cache[device] = _static_part(store, view, device)
    source = RowSource(store.f32.device_table, store.i64.device_table, store.history.num_out, c["slots"],
                       c["offsets"], store.layout)
    ctx = RowContext(store, view, source, c["drafts"], device, c)
    processors = {}
    for proc in store.processors:
        r_np = c["want"][proc.name]
        got = proc.rows(ctx, r_np, c["idx"][proc.name]) if len(r_np) else None
        if got is not None:
            processors[proc.name] = got
    return RowBatch(num_rows=len(view.slots), vocab_size=store.vocab_size, source=source, draft_tokens=c["draft"],
                    host=c["host"], processors=processors, lp_raw_rows=c["lp"][0], lp_proc_rows=c["lp"][1],
                    origin=(store, view, device))


class RowContext:
    """What a processor's `rows` may ask of a step's rows: the store (`store.padded` tables,
    `store.history`), the view, the device copies (`source`), and gathers cached per step."""

    def __init__(self, store, view: RowsView, source: RowSource, drafts_d, device, static: dict):
        self.store, self.view, self.source, self.device = store, view, source, device
        self.offsets, self.drafts_d = source.offsets, drafts_d
        self._static = static
        self._num_out = None

    @property
    def num_out(self) -> torch.Tensor:
        """[n] each row's request's emitted-token count (gathered once, when a processor needs it)."""
        if self._num_out is None:
            self._num_out = self.source.num_out.index_select(0, self.source.slots)
        return self._num_out

    def slots_of(self, name, r_d: torch.Tensor) -> torch.Tensor:
        """[m] the slots of batch rows r_d: uploaded once per plan for a processor's flagged rows
        (`name`), gathered on the device otherwise (name None: rows chosen this step)."""
        got = self._static["idx_slots"].get(name) if name is not None else None
        return got if got is not None else self.source.slots.index_select(0, r_d)

    def table(self, name: str, r_np: np.ndarray, slots: torch.Tensor) -> torch.Tensor:
        """[m, longest] rows of the padded table `name` for batch rows r_np, slots [m]."""
        table = self.store.padded[name]
        width = max(1, table.max_length(self.view.slots[r_np]))
        return table.table.index_select(0, slots)[:, :width]

    def host_column(self, name: str) -> np.ndarray:
        """[n] a dense parameter's host values for the rows (the tables' host mirror)."""
        layout, slots = self.store.layout, self.view.slots
        if name in layout.f32:
            return self.store.f32.host[layout.f32[name], slots]
        return self.store.i64.host[layout.i64[name], slots]

    def steps(self) -> np.ndarray:
        """[n] a lower bound of each row's outputs before it (each step emits >= 1 token)."""
        return self.store.history.steps[self.view.slots] + self.view.offsets

    def upload(self, r_np: np.ndarray) -> torch.Tensor:
        return upload([r_np], torch.device(self.device))[0]

    def static_value(self, key, make):
        """A value computed once per plan (the rows do not change while it is current)."""
        values = self._static["values"]
        if key not in values:
            values[key] = make()
        return values[key]

    def sequence(self, r_np: np.ndarray, r_d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(history + drafts before the row [m, W] int64 (-1 pad), its length [m]) for rows r."""
        view = self.view
        history = self.store.history
        width = history.view_width(view.slots[r_np])
        d = 0 if view.drafts_before is None else view.drafts_before.shape[1]
        seq = history.rows(self.source.slots.index_select(0, r_d), width + d)
        n = self.num_out.index_select(0, r_d)
        if d:
            pos = (n.unsqueeze(1) + torch.arange(d, device=seq.device)).clamp(max=width + d - 1)
            drafts = self.drafts_d.index_select(0, r_d)
            seq.scatter_(1, pos, torch.where(drafts >= 0, drafts, seq.gather(1, pos)))
        return seq, n + self.offsets.index_select(0, r_d)
