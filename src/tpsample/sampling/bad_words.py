"""`bad_words_token_ids` (step 5 of docs/semantics.md): for each banned sequence w, if the last
len(w) - 1 outputs equal w[:-1], w[-1] -> -inf.

State: per slot, the words' tokens back to back with each word's start and length (padded
tables) and the longest word's length (a column), only for requests with bad words. Each step
compares every word's prefix with the end of the row's history (outputs, then the drafts before
the row) on the device and bans the final tokens of the words that match.
"""
from __future__ import annotations

import numpy as np
import torch

from .scatter import PaddedRows, ban


class BadWords:
    name = "bad_words"
    f32: dict = {}
    i64 = {"bad_word_longest": 0}
    tables = {"bad_tokens": (torch.int32, -1, 8), "bad_starts": (torch.int32, -1, 8), "bad_lens": (torch.int32, 0, 8)}

    def stage(self, p, prompt, vocab_size: int, eos_token_id):
        words = p.bad_words_token_ids or ()
        if not words:
            return None
        lens = [len(w) for w in words]
        return {"bad_tokens": [t for w in words for t in w], "bad_lens": lens, "bad_word_longest": max(lens),
                "bad_starts": np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)}

    def rows(self, ctx, r_np: np.ndarray, r_d: torch.Tensor) -> PaddedRows:
        """[m, words] the final token of each bad word whose prefix ends the row's history, else -1."""
        slots = ctx.slots_of(self.name, r_d)
        starts = ctx.table("bad_starts", r_np, slots).to(torch.int64)
        lens = ctx.table("bad_lens", r_np, slots).to(torch.int64)
        toks = ctx.table("bad_tokens", r_np, slots).to(torch.int64)
        seq, length = ctx.sequence(r_np, r_d)
        m, words = starts.shape
        longest = int(ctx.host_column("bad_word_longest")[r_np].max())
        t = torch.arange(max(0, longest - 1), device=seq.device)
        pre = toks.gather(1, (starts.unsqueeze(2) + t).clamp(0, toks.shape[1] - 1).view(m, -1)).view(m, words, -1)
        hpos = length.view(m, 1, 1) - (lens.unsqueeze(2) - 1) + t
        hist = seq.gather(1, hpos.clamp(0, max(seq.shape[1] - 1, 0)).view(m, -1)).view(m, words, -1) \
            if seq.shape[1] else torch.full_like(pre, -3)
        need = t < (lens - 1).unsqueeze(2)
        ok = ~need | ((hpos >= 0) & (hist == pre))
        match = ok.all(dim=2) & (lens > 0)
        last = toks.gather(1, (starts + lens - 1).clamp(0, toks.shape[1] - 1))
        return PaddedRows(r_d, torch.where(match, last, torch.full_like(last, -1)))

    def apply(self, l: torch.Tensor, finals: PaddedRows, col_start: int) -> None:
        ban(l, finals, col_start)
