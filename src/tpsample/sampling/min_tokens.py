"""`min_tokens` (step 3 of docs/semantics.md): while fewer than `min_tokens` outputs exist,
`stop_token_ids` (and EOS unless `ignore_eos`) -> -inf.

State: per slot, the `min_tokens` column and the stop ids (a padded table), only for requests
with `min_tokens > 0` and some stop id. Each step picks the rows that may still be below their
minimum from host bounds (each step emits at least one token: `History.steps`), so no device
read decides it; on the device a row whose outputs (plus the drafts before it) already reach
the minimum bans nothing.
"""
from __future__ import annotations

import numpy as np
import torch

from .scatter import PaddedRows, ban


class MinTokens:
    name = "min_tokens"
    f32: dict = {}
    i64 = {"min_tokens": 0}
    tables = {"stops": (torch.int32, -1, 8)}

    def stage(self, p, prompt, vocab_size: int, eos_token_id):
        stops = set(p.stop_token_ids or ())
        if eos_token_id is not None and not p.ignore_eos:
            stops.add(eos_token_id)
        if p.min_tokens == 0 or not stops:
            return None
        return {"min_tokens": p.min_tokens, "stops": sorted(stops)}

    def rows(self, ctx, r_np: np.ndarray, r_d: torch.Tensor):
        below = ctx.host_column("min_tokens")[r_np] > ctx.steps()[r_np]
        live = r_np[below]
        if not len(live):
            return None
        rows = ctx.upload(live)
        slots = ctx.slots_of(None, rows)
        tok = ctx.table("stops", live, slots).to(torch.int64)
        need = ctx.source.i64_table[ctx.source.layout.i64["min_tokens"]].index_select(0, slots)
        done = ctx.num_out.index_select(0, rows) + ctx.offsets.index_select(0, rows)
        return PaddedRows(rows, tok.masked_fill_((done >= need).unsqueeze(1), -1))

    def apply(self, l: torch.Tensor, stops: PaddedRows, col_start: int) -> None:
        ban(l, stops, col_start)

    @staticmethod
    def pending(store, slots: np.ndarray) -> np.ndarray:
        """Which of these slots may still be below their min_tokens (host bounds only)."""
        layout = store.layout
        hi = store.i64.host[:, slots]
        uses = (hi[layout.i64["flags"]] & layout.bits[MinTokens.name]) != 0
        return uses & (hi[layout.i64["min_tokens"]] > store.history.steps[slots])
