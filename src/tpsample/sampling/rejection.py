"""Speculative decoding verification.

Every row that verifies a draft token x also has `main`: the token plain decoding emits at that
row's position (the step-10 Gumbel draw keyed by (seed, position), the greedy argmax, or the
guard's token). Two rules, per row:

- Deterministic drafts (n-gram drafts: no draft probabilities; a draft_probs row one-hot at x;
  every greedy row): accept iff x == main, and at the first rejection emit main itself. For a
  sampled row this is rejection sampling with one-hot q: P(accept) = P(main == x) = p(x), and
  on rejection main ~ p given main != x = normalise(max(p - onehot(x), 0)). Since every emitted
  token is the token plain decoding emits at its position, which drafts are verified (and so
  speculation, preemption and batch layout) never changes a seeded request's tokens.
- Probabilistic drafts (a draft_probs row q with q(x) < 1), Leviathan et al. 2023:
      accept  iff  u < p(x) / q(x)       u keyed by (seed, position) on the accept stream
      else emit a draw from normalise(max(p - q, 0))   (on the residual noise stream)
  Every emitted token is distributed as p, but which one depends on the drafts.
All terms are column-local plus reducer calls, so vocab-parallel never gathers a row.
"""
from __future__ import annotations

import torch

from ..noise import SALT_ACCEPT, SALT_RESIDUAL, uniform01
from ..numerics import NEG_INF
from .draw import gumbel_draw
from .logprobs import log_sum_exp, value_at


def verify_drafts(l: torch.Tensor, b, main: torch.Tensor, col_start: int, red,
                  draft_probs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted [rows] bool, token emitted on rejection [rows] int64) for every row.

    l: the processed rows (after thresholds); main: each row's plain-decoding token (row-wide).
    Rows without a draft come back not accepted; the caller ignores their second value."""
    drafts = b.draft_tokens.to(l.device)
    has_draft = drafts >= 0
    # the same comparison serves greedy rows: there main is the argmax
    accepted, residual = has_draft & (drafts == main), main
    if draft_probs is None:
        return accepted, residual
    q = draft_probs.to(torch.float32)
    x = drafts.clamp(min=0)
    qx = value_at(q, x, col_start, red).clamp(min=0)
    # a one-hot q row is a deterministic draft: keep it on the plain draw (see the module doc)
    drafted = has_draft & (qx < 1) & ~b.greedy.to(l.device)
    acc_q, res_q = _rejection(l, b, x, qx, q, main, col_start, red)
    return torch.where(drafted, acc_q, accepted), torch.where(drafted, res_q, residual)


def _rejection(l: torch.Tensor, b, x: torch.Tensor, qx: torch.Tensor, q: torch.Tensor, main: torch.Tensor,
               col_start: int, red) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling against a draft distribution q: (accepted, residual draw) per row."""
    dev = l.device
    lse = log_sum_exp(l, red)
    px = torch.exp((value_at(l, x, col_start, red) - lse).double())
    px = torch.where(torch.isfinite(lse), px, torch.zeros_like(px))
    u = uniform01(b.seeds, b.positions, SALT_ACCEPT).to(dev)
    accepted = u * qx.double() < px
    resid = (torch.exp(l - lse.unsqueeze(1)) - q).clamp_(min=0)
    none = torch.full((l.shape[0],), NEG_INF, device=dev)
    res_v, res_tok = gumbel_draw(l, none, b.seeds, b.positions, col_start, red,
                                 salt=SALT_RESIDUAL, log_weights=torch.log(resid))
    # An empty residual (p == q) has probability zero of being reached; fall back to the draw.
    return accepted, torch.where(res_v == NEG_INF, main, res_tok)
