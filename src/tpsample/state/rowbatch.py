"""RowBatch: the per-step, per-row view of requests that the sampling pipeline consumes.

Built by `RequestStore.row_batch` from the per-slot tables with tensor ops over slot indices
(no Python loop over requests or rows). Row j of a request is the target row for position
`prompt_len + num_out + j`; its history is the request's outputs followed by its drafts before
j (if they are accepted, they are outputs). Per-row token lists (bias, banned, penalty
histories) are `PaddedRows`: global token ids padded with -1, only for the rows that use them.
Host-side flags (numpy, from the tables' host mirrors) say which processors and filters any row
needs, so the pipeline skips the others and never reads the device to decide.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch


@dataclass(frozen=True)
class PaddedRows:
    """Token lists of some rows: rows [m] int64 batch rows; tokens [m, K] int64 global ids (-1 pad);
    values [m, K] fp32 when the list carries values (logit bias)."""
    rows: torch.Tensor
    tokens: torch.Tensor
    values: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class AllowedRows:
    """Rows restricted to an allowed set: rows [m] int64; bitmask [m, ceil(V/32)] int32 (bit = allowed)."""
    rows: torch.Tensor
    bitmask: torch.Tensor


@dataclass(frozen=True)
class PenaltyRows:
    """Rows with a repetition, frequency or presence penalty (one list for all three: a penalty a
    row does not use is the identity, rep 1 / freq 0 / pres 0).

    rows / slots [m] int64 (device): batch rows and their slots; seq [m, W] int64: each row's
    outputs, then the drafts before the row (-1 pad), in order (None: built by `build_seq` on
    first use); prompt_table [slots, cap] int32 (or None): each slot's distinct prompt tokens,
    ascending, -1 padded (empty without a repetition penalty); prompt_width: the longest of the
    rows' prompt sets; f32_table / columns: the per-slot parameter table and its (rep, freq, pres)
    columns. ordered / num_out: when no row verifies drafts, each slot's outputs ascending
    ([slots, cap + 1] int32, `History.ordered`) and their counts [slots] int64, which the kernel
    reads in place of sorting seq."""
    rows: torch.Tensor
    slots: torch.Tensor
    seq: Optional[torch.Tensor]
    prompt_table: Optional[torch.Tensor]
    prompt_width: int
    f32_table: torch.Tensor
    columns: tuple
    ordered: Optional[torch.Tensor] = None
    num_out: Optional[torch.Tensor] = None
    build_seq: Optional[Callable[[], torch.Tensor]] = field(default=None, repr=False)
    _built: list = field(default_factory=list, repr=False, compare=False)

    def outputs(self) -> torch.Tensor:
        """seq (built once when it was left to `build_seq`)."""
        if self.seq is not None:
            return self.seq
        if not self._built:
            self._built.append(self.build_seq())
        return self._built[0]

    def prompt(self) -> torch.Tensor:
        """[m, prompt_width] int64 the rows' prompt sets (-1 pad)."""
        if self.prompt_table is None or self.prompt_width == 0:
            return self.rows.new_full((self.rows.shape[0], 0), -1)
        return self.prompt_table.index_select(0, self.slots)[:, : self.prompt_width].to(torch.int64)

    def values(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rep, freq, pres) [m] fp32."""
        return tuple(self.f32_table[c].index_select(0, self.slots) for c in self.columns)


@dataclass(frozen=True)
class HostRows:
    """Per-row parameters on the host (numpy), for decisions that must not read the device."""
    temperature: np.ndarray   # [n] float32
    top_k: np.ndarray         # [n] int64 (0 = off)
    top_p: np.ndarray         # [n] float32
    min_p: np.ndarray         # [n] float32
    num_logprobs: np.ndarray  # [n] int64 (-1 = none)
    processed: np.ndarray     # [n] bool
    has_draft: np.ndarray     # [n] bool
    memo: dict = field(default_factory=dict, compare=False, repr=False)   # decisions derived from these


@dataclass(frozen=True)
class RowSource:
    """Where a batch's per-row parameters live: the per-slot tables ([params, slots] fp32 and
    int64, with the column index of each parameter), the history lengths [slots], and the rows'
    slots and draft offsets [n] on the device. Gathers happen on first use."""
    f32_table: torch.Tensor
    i64_table: torch.Tensor
    num_out: torch.Tensor
    slots: torch.Tensor
    offsets: torch.Tensor
    columns: dict            # parameter name -> column of its table


class RowBatch:
    """Per-row parameters (device tensors, gathered from the tables on first use), host flags,
    and the sparse per-row lists of the rows that use them."""

    def __init__(self, *, num_rows: int, vocab_size: int, source: RowSource, draft_tokens: torch.Tensor,
                 host: HostRows, bias: Optional[PaddedRows] = None, allowed: Optional[AllowedRows] = None,
                 banned: Optional[tuple] = None, penalties: Optional[PenaltyRows] = None, lp_raw_rows: Optional[torch.Tensor] = None,
                 lp_proc_rows: Optional[torch.Tensor] = None):
        self.num_rows, self.vocab_size, self.source = num_rows, vocab_size, source
        self.draft_tokens = draft_tokens            # [n] int64 (-1 = bonus / no draft)
        self.host = host
        self.bias, self.allowed, self.banned = bias, allowed, banned   # banned: min_tokens stops, bad words
        self.penalties = penalties                  # rows with repetition / frequency / presence penalties
        self.lp_raw_rows, self.lp_proc_rows = lp_raw_rows, lp_proc_rows   # [m] rows wanting raw / processed
        self._cache: dict = {}

    def _col(self, table: str, name: str) -> torch.Tensor:
        key = (table, name)
        got = self._cache.get(key)
        if got is None:
            src = self.source
            t = src.f32_table if table == "f32" else src.i64_table
            got = self._cache[key] = t[src.columns[name]].index_select(0, src.slots)
        return got

    @property
    def seeds(self) -> torch.Tensor:          # [n] int64
        return self._col("i64", "seed")

    @property
    def positions(self) -> torch.Tensor:      # [n] int64: prompt_len + outputs + draft offset
        got = self._cache.get("positions")
        if got is None:
            src = self.source
            got = self._cache["positions"] = (self._col("i64", "prompt_len") + src.num_out.index_select(0, src.slots)
                                              + src.offsets)
        return got

    @property
    def temperature(self) -> torch.Tensor:    # [n] fp32 (0 = greedy)
        return self._col("f32", "temperature")

    @property
    def top_k(self) -> torch.Tensor:          # [n] int64 (0 = off; never above V)
        return self._col("i64", "top_k")

    @property
    def top_p(self) -> torch.Tensor:          # [n] fp32 (1 = off)
        return self._col("f32", "top_p")

    @property
    def min_p(self) -> torch.Tensor:          # [n] fp32 (0 = off)
        return self._col("f32", "min_p")

    @property
    def rep(self) -> torch.Tensor:
        return self._col("f32", "rep")

    @property
    def freq(self) -> torch.Tensor:
        return self._col("f32", "freq")

    @property
    def pres(self) -> torch.Tensor:
        return self._col("f32", "pres")

    @property
    def num_logprobs(self) -> torch.Tensor:   # [n] int64 (-1 = none)
        return self._col("i64", "num_logprobs")

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature == 0

    @property
    def sample_any(self) -> bool:
        return bool((self.host.temperature > 0).any())

    @property
    def top_k_max(self) -> int:
        return int(self.host.top_k.max()) if self.num_rows else 0

    @property
    def top_p_any(self) -> bool:
        return bool((self.host.top_p < 1).any())

    @property
    def min_p_any(self) -> bool:
        return bool((self.host.min_p > 0).any())

    @property
    def logprobs_max(self) -> int:
        return int(self.host.num_logprobs.max()) if self.num_rows else -1

    @property
    def drafts_any(self) -> bool:
        return bool(self.host.has_draft.any())

    @property
    def uses_processors(self) -> bool:
        return any(x is not None for x in (self.bias, self.allowed, self.banned, self.penalties))
