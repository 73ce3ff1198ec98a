"""Output-token history per slot, kept on the device and appended on the device.

`tokens` [slots, capacity + 1] int32 holds each request's emitted tokens (-1 after the end; the
last column is scratch that masked writes land in), `ordered` the same tokens ascending (what the
penalty kernel searches: occurrence counts by binary search, no sort per step; kept only for
the slots `append` is told to keep it for, the requests with penalties, else left at -1);
`num_out` [slots] int64 counts them. All are updated from the sampled ids on the device, never rebuilt
from Python lists. The host keeps
only bounds of each slot's length: `upper` (each step emits at most a request's rows), which
sizes the table and the per-step views, and `steps` (each step emits at least one token), which
tells which min_tokens bans may still apply, without reading the device.
Memory per slot: 8 bytes x the longest history in the table (the capacity doubles as needed).
"""
from __future__ import annotations

import contextlib
from typing import Optional

import numpy as np
import torch

from .tables import _grown


class History:
    def __init__(self):
        self.tokens: Optional[torch.Tensor] = None   # [rows, cap + 1] int32, emission order
        self.ordered: Optional[torch.Tensor] = None  # [rows, cap + 1] int32, ascending (-1 past the end)
        self.num_out: Optional[torch.Tensor] = None  # [rows] int64
        self.upper = np.zeros(16, dtype=np.int64)    # host upper bound of num_out per slot
        self.steps = np.zeros(16, dtype=np.int64)    # host lower bound of num_out per slot
        self._reset: list[int] = []
        self.full_views = False     # per-step views span the whole capacity (see `full_width`)

    @contextlib.contextmanager
    def full_width(self):
        """While a step is recorded into a CUDA graph: per-step history views (penalty counts,
        bad words) span the whole capacity instead of the longest current history, so the
        recorded shapes stay valid for the tokens appended by later replays."""
        self.full_views = True
        try:
            yield
        finally:
            self.full_views = False

    def view_width(self, slots: np.ndarray) -> int:
        """Columns of a per-step view of these slots' histories."""
        if self.full_views:
            return self.capacity
        return int(self.upper[slots].max()) if len(slots) else 0

    @property
    def capacity(self) -> int:
        return 0 if self.tokens is None else self.tokens.shape[1] - 1

    def reset(self, slot: int) -> None:
        """A new request takes `slot`: its history is empty (applied at the next sync)."""
        if slot >= len(self.upper):
            size = _grown(len(self.upper), slot + 1)
            self.upper = np.concatenate([self.upper, np.zeros(size - len(self.upper), np.int64)])
            self.steps = np.concatenate([self.steps, np.zeros(size - len(self.steps), np.int64)])
        self.upper[slot] = 0
        self.steps[slot] = 0
        self._reset.append(slot)

    def sync(self, device: torch.device, rows: int, need: int) -> None:
        """Tables on `device` with >= rows slots and room for `need` tokens per slot; resets applied."""
        if self.tokens is not None and self.tokens.device != device:
            self.tokens, self.ordered, self.num_out = (t.to(device) for t in (self.tokens, self.ordered, self.num_out))
        cap = max(self.capacity, 64)
        cap = _grown(cap, need)
        nrows = _grown(16, max(rows, 1 if self.tokens is None else self.tokens.shape[0]))
        if self.tokens is None or cap > self.capacity or nrows > self.tokens.shape[0]:
            tokens = torch.full((nrows, cap + 1), -1, dtype=torch.int32, device=device)
            ordered = torch.full_like(tokens, -1)
            num_out = torch.zeros(nrows, dtype=torch.int64, device=device)
            if self.tokens is not None:
                r, c = self.tokens.shape
                tokens[:r, : c - 1] = self.tokens[:, : c - 1]
                ordered[:r, : c - 1] = self.ordered[:, : c - 1]
                num_out[:r] = self.num_out
            self.tokens, self.ordered, self.num_out = tokens, ordered, num_out
        if self._reset:
            idx = torch.tensor(self._reset, dtype=torch.int64).to(device, non_blocking=True)
            self.num_out.index_fill_(0, idx, 0)
            self.tokens.index_fill_(0, idx, -1)
            self.ordered.index_fill_(0, idx, -1)
            self._reset.clear()

    def rows(self, slots: torch.Tensor, width: int) -> torch.Tensor:
        """[n, width] int64 histories of the given slots, -1 past each one's length."""
        h = self.tokens.index_select(0, slots)[:, :width].to(torch.int64)
        n = self.num_out.index_select(0, slots)
        past = torch.arange(width, device=h.device).unsqueeze(0) >= n.unsqueeze(1)
        return h.masked_fill_(past, -1)

    def append(self, slots: torch.Tensor, tokens: torch.Tensor, num_sampled: torch.Tensor, kernel=None,
               ordered_flags=None) -> None:
        """history[slot] += tokens[i, :num_sampled[i]] for each request i (device ops only), in
        emission order and in the ascending copy.

        slots: [num_reqs] int64 (distinct); tokens: [num_reqs, max_rows] int64; num_sampled:
        [num_reqs] int64. kernel: an equivalent single-launch implementation
        (`kernels.history.append_history`). ordered_flags: None (every slot keeps the
        ascending copy) or (flags [slots] int64, mask): only slots with flags & mask keep it.
        """
        if slots.numel() == 0:
            return
        if kernel is not None:
            kernel(self.tokens, self.ordered, self.num_out, slots, tokens, num_sampled, ordered_flags)
            return
        width = tokens.shape[1]
        start = self.num_out.index_select(0, slots)
        pos = start.unsqueeze(1) + torch.arange(width, device=tokens.device).unsqueeze(0)
        keep = torch.arange(width, device=tokens.device).unsqueeze(0) < num_sampled.unsqueeze(1)
        pos = torch.where(keep, pos, torch.full_like(pos, self.capacity))       # masked -> scratch
        rows = slots.unsqueeze(1).expand_as(pos)
        self.tokens.index_put_((rows, pos), tokens.to(torch.int32))
        self.num_out.index_add_(0, slots, num_sampled)
        # the ascending copy of the touched rows: -1 (past the end) sorts last
        h = self.tokens.index_select(0, slots)[:, : self.capacity]
        top = torch.iinfo(torch.int32).max
        ordered = torch.where(h < 0, top, h).sort(dim=1).values
        ordered = torch.where(ordered == top, -1, ordered)
        if ordered_flags is not None:       # the other slots' copies stay as they are (-1)
            flags, mask = ordered_flags
            keep = (flags.index_select(0, slots) & mask) != 0
            ordered = torch.where(keep.unsqueeze(1), ordered, self.ordered.index_select(0, slots)[:, : self.capacity])
        self.ordered[:, : self.capacity].index_copy_(0, slots, ordered)

    def note_step(self, slots: np.ndarray, rows_per_req: np.ndarray) -> None:
        """Host bookkeeping for a sampled step: each request emits 1 to rows_per_req tokens."""
        self.upper[slots] += rows_per_req
        self.steps[slots] += 1

    def read(self, slot: int) -> list[int]:
        if self.tokens is None or slot >= self.tokens.shape[0] or slot in self._reset:
            return []                      # not sampled since it was (re)added
        n = int(self.num_out[slot])
        return self.tokens[slot, :n].tolist()
