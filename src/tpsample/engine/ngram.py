"""Prompt-lookup (n-gram) drafts: propose the tokens that followed the latest earlier occurrence
of the history's last n tokens, trying n from max_n down to min_n.

Pure function of the token history; drafts are verified by the sampler (one-hot q), so a draft
only ever changes speed, never the tokens of greedy decoding.
"""
from __future__ import annotations


def propose_ngram(tokens: list[int], *, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k draft tokens (possibly none) continuing `tokens`."""
    if k <= 0:
        return []
    total = len(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n:]
        # latest match first: the most recent context predicts best
        for start in range(total - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                follow = tokens[start + n:start + n + k]
                if follow:
                    return follow
    return []
