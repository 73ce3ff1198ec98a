"""Speculative decoding verification (rejection sampling, Leviathan et al. 2023).

For a row that verifies draft token x, with target p = softmax(processed row) and draft q:
    accept  iff  u < p(x) / q(x)       u keyed by (seed, position) on the accept stream
    else emit a draw from normalise(max(p - q, 0))   (the residual, on its own noise stream)
q absent means one-hot at x (n-gram drafts): the residual is p without x, so the draw is the
usual Gumbel argmax with x left out. Greedy rows accept while x == argmax and emit the argmax
at the first rejection. This makes every emitted token distributed exactly as p. All terms are
column-local plus reducer calls, so vocab-parallel never gathers a row.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..noise import SALT_ACCEPT, SALT_RESIDUAL, uniform01
from ..numerics import NEG_INF
from .draw import gumbel_draw
from .logprobs import log_sum_exp, value_at


def verify_drafts(l: torch.Tensor, b, greedy_tok: torch.Tensor, main: torch.Tensor, col_start: int,
                  red, draft_probs: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted [rows] bool, residual token [rows] int64) for every row; l is the processed row."""
    dev = l.device
    drafts = b.draft_tokens.to(dev)
    has_draft = drafts >= 0
    x = drafts.clamp(min=0)
    lse = log_sum_exp(l, red)
    px = torch.exp((value_at(l, x, col_start, red) - lse).double())
    px = torch.where(torch.isfinite(lse), px, torch.zeros_like(px))
    if draft_probs is None:
        qx = torch.ones_like(px)
    else:
        qx = value_at(draft_probs.to(torch.float32), x, col_start, red).double().clamp(min=0)
    u = uniform01(b.seeds, b.positions, SALT_ACCEPT).to(dev)
    accepted = has_draft & (u * qx < px)
    none = torch.full((l.shape[0],), NEG_INF, device=dev)
    if draft_probs is None:
        res_v, res_tok = gumbel_draw(l, none, b.seeds, b.positions, col_start, red,
                                     salt=SALT_RESIDUAL, exclude=torch.where(has_draft, drafts, -1))
    else:
        p = torch.exp(l - lse.unsqueeze(1))
        resid = (p - draft_probs.to(torch.float32)).clamp_(min=0)
        log_w = torch.log(resid)
        res_v, res_tok = gumbel_draw(l, none, b.seeds, b.positions, col_start, red,
                                     salt=SALT_RESIDUAL, log_weights=log_w)
    # An empty residual (p == q) has probability zero of being reached; fall back to the draw.
    residual = torch.where(res_v == NEG_INF, main, res_tok)
    is_greedy = b.greedy.to(dev)
    accepted = torch.where(is_greedy, has_draft & (drafts == greedy_tok), accepted)
    residual = torch.where(is_greedy, greedy_tok, residual)
    return accepted, residual
