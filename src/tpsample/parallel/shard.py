"""The vocabulary split every part of tpsample uses (LM head, sampler, draft probs)."""
from __future__ import annotations


def vocab_shard(vocab_size: int, tp_size: int, rank: int) -> tuple[int, int]:
    """Columns [start, end) of rank `rank`: the first vocab_size % tp_size ranks get one extra."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank must be in [0, {tp_size}), got {rank}")
    base, extra = divmod(vocab_size, tp_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
