"""`allowed_token_ids` (step 3 of docs/semantics.md): every other token -> -inf.

State: per slot, the allowed set as a bitmask of ceil(V/32) int32 words (bit = allowed), only
for requests that set one. Torch op: unpack the rows' words for the columns held and mask.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .scatter import keep_bits


@dataclass(frozen=True)
class AllowedRows:
    """Rows restricted to an allowed set: rows [m] int64; bitmask [m, ceil(V/32)] int32 (bit = allowed)."""
    rows: torch.Tensor
    bitmask: torch.Tensor


class AllowedIds:
    name = "allowed_token_ids"
    f32: dict = {}
    i64: dict = {}
    tables = {"allowed": (torch.int32, 0, None)}        # None: ceil(V/32) words

    def stage(self, p, prompt, vocab_size: int, eos_token_id):
        if p.allowed_token_ids is None:
            return None
        ids = np.asarray(sorted(set(p.allowed_token_ids)), dtype=np.int64)
        words = np.zeros((vocab_size + 31) // 32, dtype=np.int64)
        np.bitwise_or.at(words, ids // 32, np.left_shift(1, ids % 32))
        return {"allowed": words.astype(np.uint32).view(np.int32)}

    def rows(self, ctx, r_np: np.ndarray, r_d: torch.Tensor) -> AllowedRows:
        return AllowedRows(r_d, ctx.store.padded["allowed"].table.index_select(0, ctx.slots_of(self.name, r_d)))

    def apply(self, l: torch.Tensor, rows: AllowedRows, col_start: int) -> None:
        keep_bits(l, rows.rows, rows.bitmask, col_start)
