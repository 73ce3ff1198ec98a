"""Building a step's RowBatch from the per-slot tables: gathers over slot indices, no row loop.

`RowsView` names the rows (host arrays from the plan). Everything the step needs from the host
(slot and row indices) goes to the device in one pinned, non-blocking copy (`upload`); the rest
is gathered on the device. Host decisions (which processors run, filter hints) use the tables'
host mirrors, so nothing here reads the device.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from .columns import (
    COLUMNS,
    F_ALLOWED,
    F_BAD,
    F_BIAS,
    F_FREQ,
    F_REP,
    F_STOPS,
    FLAGS,
    FREQ,
    MIN_P,
    MIN_TOKENS,
    NUM_LP,
    PRES,
    PROCESSED,
    REP,
    TOP_K,
    TOP_P,
    T,
)
from .rowbatch import AllowedRows, HostRows, PaddedRows, PenaltyRows, RowBatch, RowSource


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


def _static_part(store, rows: RowsView, device: torch.device) -> dict:
    """What depends only on the rows (fixed for a plan): host parameters, which rows use which
    processor, and their indices on the device (one upload, cached on the view)."""
    slots = rows.slots
    hf, hi = store.f32.host[:, slots], store.i64.host[:, slots]
    flags = hi[FLAGS]
    want = {name: np.flatnonzero(flags & bit) for name, bit in
            (("bias", F_BIAS), ("allowed", F_ALLOWED), ("bad", F_BAD), ("penalty", F_REP | F_FREQ))}
    wants_lp = hi[NUM_LP] >= 0
    want["lp_raw"] = np.flatnonzero(wants_lp & (hi[PROCESSED] == 0))
    want["lp_proc"] = np.flatnonzero(wants_lp & (hi[PROCESSED] != 0))
    names = list(want)
    drafts = rows.drafts_before if rows.drafts_before is not None else np.zeros((len(slots), 0), np.int64)
    # each list's rows, and the slots of the lists whose tables are read by slot (the slots of a
    # plan's rows do not change while it is current)
    by_slot = ("bias", "allowed", "bad", "penalty")
    dev = upload([slots, rows.offsets, rows.draft_tokens, drafts] + [want[k] for k in names]
                 + [slots[want[k]] for k in by_slot], device)
    host = HostRows(temperature=hf[T], top_k=hi[TOP_K], top_p=hf[TOP_P], min_p=hf[MIN_P], num_logprobs=hi[NUM_LP],
                    processed=hi[PROCESSED].astype(bool), has_draft=rows.draft_tokens >= 0)
    k = len(names)
    return {"host": host, "want": want, "idx": dict(zip(names, dev[4:4 + k])),
            "idx_slots": dict(zip(by_slot, dev[4 + k:])), "slots": dev[0], "offsets": dev[1],
            "draft": dev[2], "drafts": dev[3], "stops_any": bool((flags & F_STOPS).any()),
            "prompt_width": store.padded["prompt_set"].max_length(slots[want["penalty"]])}


def build_row_batch(store, rows: RowsView, device: torch.device) -> RowBatch:
    c = rows.cache.get(device)
    if c is None:
        c = rows.cache[device] = _static_part(store, rows, device)
    want, idx = dict(c["want"]), dict(c["idx"])
    want["stops"] = np.zeros(0, np.int64)
    if c["stops_any"]:      # rows whose min_tokens may still be unmet: each step emits >= 1 token
        hi = store.i64.host[:, rows.slots]
        lower = store.history.steps[rows.slots] + rows.offsets
        want["stops"] = np.flatnonzero((hi[FLAGS] & F_STOPS).astype(bool) & (hi[MIN_TOKENS] > lower))
    idx["stops"] = upload([want["stops"]], device)[0] if len(want["stops"]) else None
    source = RowSource(store.f32.device_table, store.i64.device_table, store.history.num_out, c["slots"],
                       c["offsets"], COLUMNS)
    ctx = _Ctx(store, rows, source, c["drafts"], device, c)
    return RowBatch(
        num_rows=len(rows.slots), vocab_size=store.vocab_size, source=source, draft_tokens=c["draft"], host=c["host"],
        bias=ctx.bias(want["bias"], idx["bias"]), allowed=ctx.allowed(want["allowed"], idx["allowed"]),
        banned=ctx.banned(want["stops"], idx["stops"], want["bad"], idx["bad"]),
        penalties=ctx.penalties(want["penalty"], idx["penalty"]),
        lp_raw_rows=idx["lp_raw"] if len(want["lp_raw"]) else None,
        lp_proc_rows=idx["lp_proc"] if len(want["lp_proc"]) else None,
    )


class _Ctx:
    """The gathers behind each sparse field of a RowBatch (only for the rows that use it)."""

    def __init__(self, store, rows: RowsView, source, drafts_d, device, static: dict):
        self.store, self.rows, self.device, self.source = store, rows, device, source
        self.slots_d, self.offsets_d, self.drafts_d = source.slots, source.offsets, drafts_d
        self.static = static
        self._num_out = None

    @property
    def num_out(self) -> torch.Tensor:
        """[n] each row's request's emitted-token count (gathered once, when a list needs it)."""
        if self._num_out is None:
            self._num_out = self.source.num_out.index_select(0, self.slots_d)
        return self._num_out

    def _slots_of(self, kind: str, r_d: torch.Tensor) -> torch.Tensor:
        """[m] the slots of batch rows r_d: uploaded once per plan for the lists fixed by the
        rows' flags (bias, allowed, bad, penalty), gathered per step for the min_tokens stops."""
        got = self.static["idx_slots"].get(kind)
        return got if got is not None else self.slots_d.index_select(0, r_d)

    def _table(self, name: str, r_np: np.ndarray, slots: torch.Tensor) -> torch.Tensor:
        """[m, longest] rows of a padded table for batch rows r (host indices r_np), slots [m]."""
        table = self.store.padded[name]
        width = max(1, table.max_length(self.rows.slots[r_np]))
        return table.table.index_select(0, slots)[:, :width]

    def bias(self, r_np, r_d) -> Optional[PaddedRows]:
        if not len(r_np):
            return None
        slots = self._slots_of("bias", r_d)
        tok = self._table("bias_tokens", r_np, slots).to(torch.int64)
        return PaddedRows(r_d, tok, self._table("bias_values", r_np, slots))

    def allowed(self, r_np, r_d) -> Optional[AllowedRows]:
        if not len(r_np):
            return None
        table = self.store.padded["allowed"].table
        return AllowedRows(r_d, table.index_select(0, self._slots_of("allowed", r_d)))

    def banned(self, stop_np, stop_d, bad_np, bad_d) -> Optional[tuple[PaddedRows, ...]]:
        parts = []
        if len(stop_np):
            slots = self._slots_of("stops", stop_d)
            tok = self._table("stops", stop_np, slots).to(torch.int64)
            src = self.source
            need = src.i64_table[src.columns["min_tokens"]].index_select(0, slots)
            done = self.num_out.index_select(0, stop_d) + self.offsets_d.index_select(0, stop_d)
            parts.append(PaddedRows(stop_d, tok.masked_fill_((done >= need).unsqueeze(1), -1)))
        if len(bad_np):
            parts.append(PaddedRows(bad_d, self._bad_word_finals(bad_np, bad_d)))
        return tuple(parts) or None

    def _sequence(self, r_np, r_d) -> tuple[torch.Tensor, torch.Tensor]:
        """(history + drafts before the row [m, W] int64 (-1 pad), its length [m]) for rows r."""
        rows = self.rows
        width = self.store.history.view_width(rows.slots[r_np])
        d = 0 if rows.drafts_before is None else rows.drafts_before.shape[1]
        seq = self.store.history.rows(self.slots_d.index_select(0, r_d), width + d)
        n = self.num_out.index_select(0, r_d)
        if d:
            pos = (n.unsqueeze(1) + torch.arange(d, device=self.device)).clamp(max=width + d - 1)
            drafts = self.drafts_d.index_select(0, r_d)
            seq.scatter_(1, pos, torch.where(drafts >= 0, drafts, seq.gather(1, pos)))
        return seq, n + self.offsets_d.index_select(0, r_d)

    def _bad_word_finals(self, r_np, r_d) -> torch.Tensor:
        """[m, words] final token of each bad word whose prefix ends the row's history, else -1."""
        slots = self._slots_of("bad", r_d)
        starts = self._table("bad_starts", r_np, slots).to(torch.int64)
        lens = self._table("bad_lens", r_np, slots).to(torch.int64)
        toks = self._table("bad_tokens", r_np, slots).to(torch.int64)
        seq, length = self._sequence(r_np, r_d)
        m, words = starts.shape
        t = torch.arange(max(0, int(self.store.bad_longest[self.rows.slots[r_np]].max()) - 1), device=self.device)
        pre = toks.gather(1, (starts.unsqueeze(2) + t).clamp(0, toks.shape[1] - 1).view(m, -1)).view(m, words, -1)
        hpos = length.view(m, 1, 1) - (lens.unsqueeze(2) - 1) + t
        hist = seq.gather(1, hpos.clamp(0, max(seq.shape[1] - 1, 0)).view(m, -1)).view(m, words, -1) \
            if seq.shape[1] else torch.full_like(pre, -3)
        need = t < (lens - 1).unsqueeze(2)
        ok = ~need | ((hpos >= 0) & (hist == pre))
        match = ok.all(dim=2) & (lens > 0)
        last = toks.gather(1, (starts + lens - 1).clamp(0, toks.shape[1] - 1))
        return torch.where(match, last, torch.full_like(last, -1))

    def penalties(self, r_np, r_d) -> Optional[PenaltyRows]:
        """Without drafts the rows' outputs are the slots' histories: the kernel reads their
        ascending copy in place (seq is built only if the torch processors run)."""
        if not len(r_np):
            return None
        table = self.store.padded["prompt_set"]
        width = self.static["prompt_width"]
        slots = self._slots_of("penalty", r_d)
        if self.rows.drafts_before is None:
            h = self.store.history
            return PenaltyRows(r_d, slots, None, table.table, width, self.source.f32_table, (REP, FREQ, PRES),
                               ordered=h.ordered, num_out=h.num_out,
                               build_seq=lambda: self._sequence(r_np, r_d)[0])
        return PenaltyRows(r_d, slots, self._sequence(r_np, r_d)[0], table.table, width, self.source.f32_table,
                           (REP, FREQ, PRES))
