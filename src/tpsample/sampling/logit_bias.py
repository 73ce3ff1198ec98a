"""`logit_bias` (step 3 of docs/semantics.md): l[t] += b for each (token t, bias b).

State: per slot, the bias's token ids and values (two padded tables, only for requests that
set a bias). Torch op: one gather -> add -> scatter over the columns held.
"""
from __future__ import annotations

import numpy as np
import torch

from .scatter import PaddedRows, skip, targets


class LogitBias:
    name = "logit_bias"
    f32: dict = {}
    i64: dict = {}
    tables = {"bias_tokens": (torch.int32, -1, 8), "bias_values": (torch.float32, 0.0, 8)}

    def stage(self, p, prompt, vocab_size: int, eos_token_id):
        if not p.logit_bias:
            return None
        return {"bias_tokens": list(p.logit_bias), "bias_values": list(p.logit_bias.values())}

    def rows(self, ctx, r_np: np.ndarray, r_d: torch.Tensor) -> PaddedRows:
        slots = ctx.slots_of(self.name, r_d)
        return PaddedRows(r_d, ctx.table("bias_tokens", r_np, slots).to(torch.int64),
                          ctx.table("bias_values", r_np, slots))

    def apply(self, l: torch.Tensor, bias: PaddedRows, col_start: int) -> None:
        if skip(bias, l):
            return
        rows, col, src, live = targets(bias, col_start, l.shape[1])
        old = l[rows, col]
        l[rows, col] = torch.where(live, old + bias.values.gather(1, src), old)
