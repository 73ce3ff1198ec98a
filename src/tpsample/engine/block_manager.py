"""Paged KV block accounting (rank 0 only; block ids travel to every rank inside each step).

A request holding n tokens owns ceil(n / block_size) blocks. Free blocks are handed out lowest id
first, so a run is reproducible.
"""
from __future__ import annotations

import heapq


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        assert num_blocks >= 1 and block_size >= 1
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks))   # a heap: lowest id first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_needed(self, block_ids: list[int], num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - len(block_ids))

    def can_grow(self, block_ids: list[int], num_tokens: int) -> bool:
        return self.blocks_needed(block_ids, num_tokens) <= len(self._free)

    def grow(self, block_ids: list[int], num_tokens: int) -> None:
        """Extends block_ids in place so it covers num_tokens tokens; caller checked can_grow."""
        for _ in range(self.blocks_needed(block_ids, num_tokens)):
            block_ids.append(heapq.heappop(self._free))

    def free(self, block_ids: list[int]) -> None:
        for b in block_ids:
            heapq.heappush(self._free, b)
        block_ids.clear()
