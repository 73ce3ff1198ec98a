"""The messages rank 0 sends to every rank: plain, picklable data, identical on every rank."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class StepInput:
    """One engine step. Sequences are laid out one after another; batch rows request by request.

    Every rank applies `remove`, then `add` (in order, so sampler slots match), runs the forward
    over `token_ids`, then samples `sample_req_ids` (if any) in that order.
    """
    remove: tuple[str, ...] = ()                    # req_ids leaving the sampler
    add: tuple[tuple[str, Any, list[int]], ...] = ()  # (req_id, SamplingParams, prompt ids) joining it
    token_ids: list[int] = field(default_factory=list)          # [T] new tokens (drafts included)
    query_lens: list[int] = field(default_factory=list)         # [S] new tokens per sequence
    seq_lens: list[int] = field(default_factory=list)           # [S] context length after the step
    block_tables: list[list[int]] = field(default_factory=list)  # [S][num_blocks] KV block ids
    sample_req_ids: list[str] = field(default_factory=list)     # [num_reqs] in batch order
    draft_token_ids: list[list[int]] | None = None              # [num_reqs][num_drafts]
    logits_token_index: list[int] = field(default_factory=list)  # [rows] token index of each row
    grammar_bitmask: torch.Tensor | None = None                 # [rows, ceil(V/32)] int32, 1 = allowed

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class Shutdown:
    """Every rank leaves its loop."""


@dataclass(frozen=True)
class EndOfGenerate:
    """torchrun (SPMD) mode: rank 0 finished a generate() call; every rank returns this result."""
    outputs: list | None = None
    error: BaseException | None = None
