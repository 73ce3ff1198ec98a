"""Per-slot tables: written when a request arrives, read by tensor ops over slot indices.

- `DenseTable`: [width, slots] of one dtype (a parameter per row, so gathering slots gives each
  parameter as a contiguous [n] tensor); a slot no request ever took holds each parameter's
  "off" value (`fill`). The host mirror (numpy, in pinned memory when a
  CUDA device is used) is the source of truth; `sync(device)` copies the whole table to the
  device in one non-blocking copy when a row changed since the last sync (a table is a few KiB).
  The host never writes the mirror while a copy from it may still be in flight (an event guards
  it), so a copy never reads a half-written row.
- `PaddedTable`: [slots, capacity] rows of variable length (token lists, bitmask words), padded
  with a fill value, on the device. A row is staged on the host at add time and written by the
  next `sync` in one copy per table. The capacity grows (doubling) to the longest row seen, so
  memory follows use: a table no request uses is never allocated. `row_state` / `restore_row`
  undo a slot's stages (the store's rollback of an add that failed).

Rows are indexed by slot; the number of rows grows with the highest slot in use (doubling).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch


def _grown(n: int, need: int) -> int:
    while n < need:
        n *= 2
    return n


class DenseTable:
    def __init__(self, fill: np.ndarray):
        """fill: [width] each parameter's value in a slot no request took (its dtype is the table's)."""
        self.fill = np.asarray(fill)
        self.width, self.dtype = len(self.fill), self.fill.dtype
        self.host = np.repeat(self.fill[:, None], 16, axis=1)
        self._pinned: Optional[torch.Tensor] = None     # the host mirror's pinned storage (CUDA)
        self.device_table: Optional[torch.Tensor] = None
        self._dirty = True
        self._copy_done: Optional[torch.cuda.Event] = None

    def ensure_rows(self, rows: int) -> None:
        if rows > self.host.shape[1]:
            self._wait_copy()
            grown = np.repeat(self.fill[:, None], _grown(self.host.shape[1], rows), axis=1)
            grown[:, : self.host.shape[1]] = self.host
            self.host, self._pinned, self._dirty = grown, None, True

    def write_column(self, slot: int, values) -> None:
        """Slot `slot` takes `values` (one per parameter) at the next sync."""
        self._wait_copy()
        self.host[:, slot] = values
        self._dirty = True

    def _wait_copy(self) -> None:
        if self._copy_done is not None and not self._copy_done.query():
            self._copy_done.synchronize()

    def sync(self, device: torch.device) -> torch.Tensor:
        """The device copy, refreshed from the mirror if anything changed."""
        if self.device_table is not None and self.device_table.device != device:
            self.device_table, self._dirty = None, True
        if not self._dirty:
            return self.device_table
        if device.type == "cuda":
            if self._pinned is None:
                self._pinned = torch.from_numpy(self.host).pin_memory()
                self.host = self._pinned.numpy()
            src = self._pinned
        else:
            src = torch.from_numpy(self.host)
        if self.device_table is None or self.device_table.shape != src.shape:
            self.device_table = torch.empty(src.shape, dtype=src.dtype, device=device)
        self.device_table.copy_(src, non_blocking=True)
        if device.type == "cuda":
            self._copy_done = torch.cuda.Event()
            self._copy_done.record()
        self._dirty = False
        return self.device_table


class PaddedTable:
    def __init__(self, dtype: torch.dtype, fill: int | float, min_capacity: int = 8):
        self.dtype, self.fill, self.min_capacity = dtype, fill, min_capacity
        self.table: Optional[torch.Tensor] = None     # [rows, capacity] on the device
        self.lengths = np.zeros(16, dtype=np.int64)   # per slot: valid entries (host)
        self._staged: dict[int, np.ndarray] = {}

    @property
    def capacity(self) -> int:
        return 0 if self.table is None else self.table.shape[1]

    def stage(self, slot: int, values) -> None:
        """Row `slot` becomes `values` (1-D, may be empty) at the next sync."""
        values = np.asarray(values)
        if slot >= len(self.lengths):
            grown = np.zeros(_grown(len(self.lengths), slot + 1), dtype=np.int64)
            grown[: len(self.lengths)] = self.lengths
            self.lengths = grown
        prev = int(self.lengths[slot])
        self.lengths[slot] = len(values)
        if len(values) or prev:          # an empty row over an empty row needs no write
            self._staged[slot] = values

    def row_state(self, slot: int) -> tuple:
        """What `stage(slot, ...)` changes, for `restore_row` (an add that fails puts it back)."""
        length = int(self.lengths[slot]) if slot < len(self.lengths) else 0
        return slot, length, self._staged.get(slot)

    def restore_row(self, state: tuple) -> None:
        """Undo the stages of a slot since `row_state` returned `state`."""
        slot, length, staged = state
        if slot < len(self.lengths):
            self.lengths[slot] = length
        self._staged.pop(slot, None)
        if staged is not None:
            self._staged[slot] = staged

    def max_length(self, slots: np.ndarray) -> int:
        return int(self.lengths[slots].max()) if len(slots) else 0

    def sync(self, device: torch.device, rows: int) -> Optional[torch.Tensor]:
        """The device table with every staged row written (None while no row was ever non-empty)."""
        if self.table is not None and self.table.device != device:
            self.table = self.table.to(device)
        if not self._staged:
            if self.table is not None and self.table.shape[0] < rows:
                self._resize(device, rows, self.capacity)
            return self.table
        longest = max(len(v) for v in self._staged.values())
        if self.table is None and longest == 0:
            self._staged.clear()
            return None
        cap = max(self.capacity, self.min_capacity)
        cap = _grown(cap, longest)
        nrows = max(rows, 16 if self.table is None else self.table.shape[0])
        if self.table is None or cap > self.capacity or nrows > self.table.shape[0]:
            self._resize(device, _grown(16, nrows), cap)
        slots = np.fromiter(self._staged, dtype=np.int64, count=len(self._staged))
        block = np.full((len(slots), self.capacity), self.fill, dtype=_np_dtype(self.dtype))
        for i, v in enumerate(self._staged.values()):      # rows staged since the last step only
            block[i, : len(v)] = v
        src = torch.from_numpy(block)
        idx = torch.from_numpy(slots)
        if device.type == "cuda":
            src, idx = src.pin_memory(), idx.pin_memory()
        self.table.index_copy_(0, idx.to(device, non_blocking=True), src.to(device, non_blocking=True))
        self._staged.clear()
        return self.table

    def _resize(self, device, rows: int, cap: int) -> None:
        new = torch.full((rows, cap), self.fill, dtype=self.dtype, device=device)
        if self.table is not None:
            r, c = self.table.shape
            new[:r, :c] = self.table
        self.table = new


def _np_dtype(dtype: torch.dtype):
    return {torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32}[dtype]
