"""Input checks for the Sampler facade: clear `ValueError`s before any collective or kernel runs."""
from __future__ import annotations

import torch


def is_token(t, vocab_size: int) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size


def check_req_ids(req_ids) -> list[str]:
    if isinstance(req_ids, (str, bytes)) or not isinstance(req_ids, (list, tuple)):
        raise ValueError(f"req_ids must be a list of request ids, got {type(req_ids).__name__}")
    if len(set(req_ids)) != len(req_ids):
        raise ValueError("req_ids must be unique within a step")
    return list(req_ids)


def check_prompt(prompt, vocab_size: int) -> None:
    if not isinstance(prompt, (list, tuple)):
        raise ValueError(f"prompt_token_ids must be a list of ints, got {type(prompt).__name__}")
    bad = [t for t in prompt if not is_token(t, vocab_size)]
    if bad:
        raise ValueError(f"prompt_token_ids must be token ids in [0, {vocab_size}), got {bad[:5]}")


def check_drafts(drafts, num_reqs: int, vocab_size: int, max_logits_per_req: int) -> list[list[int]]:
    if drafts is None:
        return [[] for _ in range(num_reqs)]
    if not isinstance(drafts, (list, tuple)) or not all(isinstance(d, (list, tuple)) for d in drafts):
        raise ValueError("draft_token_ids must be a list with one list of token ids per request")
    drafts = [list(d) for d in drafts]
    if len(drafts) != num_reqs:
        raise ValueError(f"draft_token_ids must have one list per request ({num_reqs}), got {len(drafts)}")
    for d in drafts:
        if len(d) > max_logits_per_req - 1:
            raise ValueError(f"draft_token_ids: at most max_num_logits_per_req - 1 = {max_logits_per_req - 1} "
                             f"drafts per request, got {len(d)}")
        bad = [t for t in d if not is_token(t, vocab_size)]
        if bad:
            raise ValueError(f"draft_token_ids must be token ids in [0, {vocab_size}), got {bad[:5]}")
    return drafts


def check_bitmask(mask, num_rows: int, vocab_size: int):
    if mask is None:
        return None
    words = (vocab_size + 31) // 32
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.int32:
        raise ValueError(f"grammar_bitmask must be an int32 tensor [rows, {words}]")
    if tuple(mask.shape) != (num_rows, words):
        raise ValueError(f"grammar_bitmask must have shape [{num_rows}, {words}] (rows, ceil(V/32)), "
                         f"got {list(mask.shape)}")
    return mask


def check_logits(x, num_rows: int, width: int, name: str) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor [rows, V_r]")
    if x.dim() != 2 or tuple(x.shape) != (num_rows, width):
        raise ValueError(f"{name} must have shape [{num_rows}, {width}] (plan rows, this rank's vocab "
                         f"shard), got {list(x.shape)}")


def check_draft_probs(p, num_rows: int, width: int, *, draft_rows=None, full_rows: bool = False) -> None:
    """Shape, dtype, and values: every entry a probability in [0, 1] (NaN and inf rejected).

    draft_rows: indices (in logits order) of the rows that verify a draft token. When given and
    the rows are full vocabulary rows (`full_rows`, i.e. TP=1), such a row must not be all zero:
    the draft token was drawn from it. (Under TP a rank holds a shard, where zeros are legal.)
    Costs one [rows] reduction and one host sync; no [rows, V] temporary.
    """
    check_logits(p, num_rows, width, "draft_probs")
    if num_rows == 0 or width == 0:
        return
    lo, hi = torch.aminmax(p, dim=1)                     # NaN anywhere in a row -> NaN here
    ok = (lo >= 0) & (hi <= 1)
    if draft_rows is not None and full_rows and len(draft_rows):
        idx = torch.as_tensor(list(draft_rows), dtype=torch.int64, device=p.device)
        ok[idx] &= hi[idx] > 0
    if not bool(ok.all()):
        row = int((~ok).nonzero()[0, 0])
        raise ValueError(f"draft_probs row {row} must hold probabilities in [0, 1] (finite, not negative, "
                         f"not all zero on a draft row), got min {float(lo[row]):g}, max {float(hi[row]):g}")
