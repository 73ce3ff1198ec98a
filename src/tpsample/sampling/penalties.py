"""Repetition, frequency and presence penalties (step 4 of docs/semantics.md).

Repetition r on seen tokens (the prompt's token set and the outputs; l > 0: l / r, else l * r),
then frequency f and presence p on outputs (l - f * count - p * [count > 0]).

State: per slot, the three factors (float columns) and the prompt's distinct tokens ascending
(a padded table, only with a repetition penalty). Penalty counts come from the history itself
(no `[slots, V]` count table); without drafts the kernel reads each slot's outputs ascending
(`History.ordered`, kept only for the slots of requests with penalties: the history append
keeps it for the flag bit of this processor) and counts by binary search. Torch op: gathers and
scatters over the columns held; on a kernel device one launch (`kernels.penalties.apply_penalties_`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from .keys import penalty_kernel
from .scatter import PaddedRows, skip, targets


@dataclass(frozen=True)
class PenaltyRows:
    """Rows with a repetition, frequency or presence penalty (one list for all three: a penalty a
    row does not use is the identity, rep 1 / freq 0 / pres 0).

    rows / slots [m] int64 (device): batch rows and their slots; seq [m, W] int64: each row's
    outputs, then the drafts before the row (-1 pad), in order (None: built by `build_seq` on
    first use); prompt_table [slots, cap] int32 (or None): each slot's distinct prompt tokens,
    ascending, -1 padded; prompt_width: the longest of the rows' prompt sets; f32_table / columns:
    the per-slot parameter table and its (repetition, frequency, presence) rows. ordered / num_out:
    when no row verifies drafts, each slot's outputs ascending ([slots, cap + 1] int32,
    `History.ordered`) and their counts [slots] int64, which the kernel reads in place of sorting seq."""
    rows: torch.Tensor
    slots: torch.Tensor
    seq: Optional[torch.Tensor]
    prompt_table: Optional[torch.Tensor]
    prompt_width: int
    f32_table: torch.Tensor
    columns: tuple
    ordered: Optional[torch.Tensor] = None
    num_out: Optional[torch.Tensor] = None
    build_seq: Optional[Callable[[], torch.Tensor]] = field(default=None, repr=False)
    _built: list = field(default_factory=list, repr=False, compare=False)

    def outputs(self) -> torch.Tensor:
        """seq (built once when it was left to `build_seq`)."""
        if self.seq is not None:
            return self.seq
        if not self._built:
            self._built.append(self.build_seq())
        return self._built[0]

    def prompt(self) -> torch.Tensor:
        """[m, prompt_width] int64 the rows' prompt sets (-1 pad)."""
        if self.prompt_table is None or self.prompt_width == 0:
            return self.rows.new_full((self.rows.shape[0], 0), -1)
        return self.prompt_table.index_select(0, self.slots)[:, : self.prompt_width].to(torch.int64)

    def values(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rep, freq, pres) [m] fp32."""
        return tuple(self.f32_table[c].index_select(0, self.slots) for c in self.columns)


COLUMNS = ("repetition_penalty", "frequency_penalty", "presence_penalty")


class Penalties:
    name = "penalties"
    f32 = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
    i64: dict = {}
    tables = {"prompt_set": (torch.int32, -1, 8)}

    def stage(self, p, prompt, vocab_size: int, eos_token_id):
        if p.repetition_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0:
            return None
        out = {name: getattr(p, name) for name in COLUMNS}
        if p.repetition_penalty != 1.0:
            out["prompt_set"] = np.unique(np.asarray(prompt, dtype=np.int64))
        return out

    def rows(self, ctx, r_np: np.ndarray, r_d: torch.Tensor) -> PenaltyRows:
        """Without drafts the rows' outputs are the slots' histories: the kernel reads their
        ascending copy in place (seq is built only if the torch op runs)."""
        store, src = ctx.store, ctx.source
        table = store.padded["prompt_set"]
        width = ctx.static_value(("prompt_width", self.name),
                                 lambda: table.max_length(ctx.view.slots[r_np]))
        slots = ctx.slots_of(self.name, r_d)
        columns = tuple(src.layout.f32[c] for c in COLUMNS)
        if ctx.view.drafts_before is None:
            h = store.history
            return PenaltyRows(r_d, slots, None, table.table, width, src.f32_table, columns, ordered=h.ordered,
                               num_out=h.num_out, build_seq=lambda: ctx.sequence(r_np, r_d)[0])
        return PenaltyRows(r_d, slots, ctx.sequence(r_np, r_d)[0], table.table, width, src.f32_table, columns)

    def apply(self, l: torch.Tensor, pen: PenaltyRows, col_start: int) -> None:
        if l.shape[1] == 0:
            return
        kernel = penalty_kernel(l.device) if l.stride(1) == 1 else None
        if kernel is not None:
            if pen.ordered is not None:         # the slots' outputs, ascending, in place
                ordered, lengths = pen.ordered, pen.num_out
            else:
                ordered, lengths = torch.sort(pen.seq, dim=1).values, None
            kernel(l, col_start, pen.rows, pen.slots, ordered, pen.prompt_table, pen.prompt_width, pen.f32_table,
                   pen.columns, lengths)
            return
        penalties_torch(l, pen, col_start)


def penalties_torch(l: torch.Tensor, pen: PenaltyRows, col_start: int) -> None:
    """The torch op (what the kernel computes, bit for bit)."""
    rep, freq, pres = pen.values()
    seq = pen.outputs()
    seen = PaddedRows(pen.rows, torch.cat([pen.prompt(), seq], dim=1))
    if not skip(seen, l):
        rows, col, _, live = targets(seen, col_start, l.shape[1])
        v = l[rows, col]
        r = rep.unsqueeze(1)
        l[rows, col] = torch.where(live, torch.where(v > 0, v / r, v * r), v)
    out_tokens = PaddedRows(pen.rows, seq)
    if not skip(out_tokens, l):
        tok = out_tokens.tokens
        ordered = torch.sort(tok, dim=1).values
        counts = (torch.searchsorted(ordered, tok, right=True) - torch.searchsorted(ordered, tok)).float()
        rows, col, src, live = targets(out_tokens, col_start, l.shape[1])
        v = l[rows, col]
        c = counts.gather(1, src)
        new = v - freq.unsqueeze(1) * c
        new = new - pres.unsqueeze(1) * (c > 0).float()
        l[rows, col] = torch.where(live, new, v)
