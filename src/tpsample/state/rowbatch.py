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

from dataclasses import dataclass
from typing import Optional

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
class HostRows:
    """Per-row parameters on the host (numpy), for decisions that must not read the device."""
    temperature: np.ndarray   # [n] float32
    top_k: np.ndarray         # [n] int64 (0 = off)
    top_p: np.ndarray         # [n] float32
    min_p: np.ndarray         # [n] float32
    num_logprobs: np.ndarray  # [n] int64 (-1 = none)
    processed: np.ndarray     # [n] bool
    has_draft: np.ndarray     # [n] bool


@dataclass(frozen=True)
class RowBatch:
    num_rows: int
    vocab_size: int
    seeds: torch.Tensor          # [n] int64
    positions: torch.Tensor      # [n] int64
    temperature: torch.Tensor    # [n] fp32 (0 = greedy)
    top_k: torch.Tensor          # [n] int64 (0 = off; never above V)
    top_p: torch.Tensor          # [n] fp32 (1 = off)
    min_p: torch.Tensor          # [n] fp32 (0 = off)
    rep: torch.Tensor            # [n] fp32
    freq: torch.Tensor           # [n] fp32
    pres: torch.Tensor           # [n] fp32
    num_logprobs: torch.Tensor   # [n] int64 (-1 = none)
    processed_logprobs: torch.Tensor  # [n] bool
    draft_tokens: torch.Tensor   # [n] int64 (-1 = bonus / no draft)
    host: HostRows
    bias: Optional[PaddedRows] = None
    allowed: Optional[AllowedRows] = None
    banned: Optional[PaddedRows] = None     # min_tokens stop ids / EOS, bad-word final tokens
    seen: Optional[PaddedRows] = None       # prompt set + history (repetition penalty rows)
    out_tokens: Optional[PaddedRows] = None  # history (frequency / presence penalty rows)
    lp_raw_rows: Optional[torch.Tensor] = None   # [m] int64 rows wanting raw logprobs
    lp_proc_rows: Optional[torch.Tensor] = None  # [m] int64 rows wanting processed logprobs

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
        return any(x is not None for x in (self.bias, self.allowed, self.banned, self.seen, self.out_tokens))
