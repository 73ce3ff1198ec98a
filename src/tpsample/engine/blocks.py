"""Paged KV blocks: rank 0's accounting of who owns which block, and every rank's block tables.

`BlockManager` (rank 0 only): a request holding n tokens owns ceil(n / block_size) blocks; free
blocks are handed out lowest id first, so a run is reproducible. The block ids travel to every
rank inside each step as diffs (`StepInput.block_updates`).

`BlockTables` (every rank): a request gets a row when it joins (`StepInput.add`) and gives it back
when it leaves (`StepInput.remove`); rows are handed out lowest first, so every rank agrees.
`apply` writes each sequence's new page ids; `gather` returns the rows of a step's sequences as
one array, ready for the attention metadata, with no Python loop over tokens.
"""
from __future__ import annotations

import heapq

import numpy as np


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


class BlockTables:
    def __init__(self, max_rows: int, max_pages: int):
        self.table = np.zeros((max_rows, max_pages), dtype=np.int32)    # [rows, pages] page ids
        self.num_pages = np.zeros(max_rows, dtype=np.int64)             # pages valid per row
        self._rows: dict[str, int] = {}
        self._free = list(range(max_rows))

    def add(self, req_id: str) -> None:
        if req_id in self._rows:
            raise ValueError(f"request {req_id!r} already has a block table")
        if not self._free:
            raise ValueError(f"no block-table row left for {req_id!r} (max_num_seqs={len(self.table)})")
        self._rows[req_id] = heapq.heappop(self._free)

    def remove(self, req_id: str) -> None:
        row = self._rows.pop(req_id)
        self.num_pages[row] = 0
        heapq.heappush(self._free, row)

    def apply(self, updates) -> None:
        """updates: (req_id, first page index, new page ids) from `StepInput.block_updates`."""
        for req_id, first, pages in updates:
            row = self._rows[req_id]
            end = first + len(pages)
            if end > self.table.shape[1]:
                raise ValueError(f"request {req_id!r} needs {end} pages, more than the {self.table.shape[1]} "
                                 "a sequence of max_model_len can hold")
            self.table[row, first:end] = pages
            self.num_pages[row] = end

    def rows(self, req_ids) -> np.ndarray:
        return np.fromiter((self._rows[r] for r in req_ids), dtype=np.int64, count=len(req_ids))

    def gather(self, rows: np.ndarray, num_pages: int) -> np.ndarray:
        """[len(rows), num_pages] int32: the first num_pages page ids of each row."""
        return self.table[rows, :num_pages]
