"""The messages rank 0 sends to every rank, and the channel that carries them.

A step is a diff against what every rank already holds: requests joining and leaving, the KV
pages each scheduled sequence gained since it last ran, and the tokens fed this step. Block
tables are never resent whole; each rank keeps them (`engine.blocks.BlockTables`). The
grammar bitmask, the one large per-step tensor, travels as a tensor broadcast over the control
group right after the pickled header, never inside the pickle.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class StepInput:
    """One engine step. Sequences are laid out one after another; batch rows request by request.

    Every rank applies `remove`, then `add` (in order, so sampler slots and block-table rows
    match), then `block_updates`, runs the forward over `token_ids`, then samples
    `sample_req_ids` (if any) in that order, and takes the logprobs of the prompt tokens at
    `prompt_logprob_index` (prefill rows of requests that asked for prompt logprobs).
    """
    remove: tuple[str, ...] = ()                    # req_ids leaving the sampler (and their tables)
    add: tuple[tuple[str, Any, list[int]], ...] = ()  # (req_id, SamplingParams, prompt ids) joining it
    # (req_id, first page index, new page ids): table[first:first + len(ids)] = ids; first == 0
    # restarts a table (a preempted request being recomputed)
    block_updates: tuple[tuple[str, int, tuple[int, ...]], ...] = ()
    seq_req_ids: tuple[str, ...] = ()               # [S] the scheduled sequences, in token order
    token_ids: list[int] = field(default_factory=list)          # [T] new tokens (drafts included)
    query_lens: list[int] = field(default_factory=list)         # [S] new tokens per sequence
    seq_lens: list[int] = field(default_factory=list)           # [S] context length after the step
    sample_req_ids: list[str] = field(default_factory=list)     # [num_reqs] in batch order
    draft_token_ids: list[list[int]] | None = None              # [num_reqs][num_drafts]
    logits_token_index: list[int] = field(default_factory=list)  # [rows] token index of each row
    grammar_bitmask: torch.Tensor | None = None                 # [rows, ceil(V/32)] int32, 1 = allowed
    # prompt logprobs: [P] token index of each prompt row, [P] the prompt token it predicts, top-n
    prompt_logprob_index: list[int] = field(default_factory=list)
    prompt_logprob_token_ids: list[int] = field(default_factory=list)
    num_prompt_logprobs: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class StepOutput:
    """What a rank's runner returns for one step, identical on every rank.

    sampled: the sampler's output for `sample_req_ids` (None when nothing sampled);
    prompt_logprobs: a `LogprobsOutput` over `prompt_logprob_index` rows, in that order: column 0
    the given prompt token, then the top `num_prompt_logprobs` (None when no row asked).
    """
    sampled: Any = None
    prompt_logprobs: Any = None


@dataclass(frozen=True)
class Shutdown:
    """Every rank leaves its loop."""


@dataclass(frozen=True)
class EndOfGenerate:
    """torchrun (SPMD) mode: rank 0 finished a generate() call; every rank returns this result."""
    outputs: list | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class _Header:
    step: StepInput
    bitmask_shape: tuple[int, int] | None


class StepChannel:
    """Carries messages from rank 0 to every other rank over a CPU (gloo) group; None at TP=1."""

    def __init__(self, group=None):
        self.group = group
        self.size = 1 if group is None else dist.get_world_size(group)
        self._src = None if group is None else dist.get_global_rank(group, 0)

    def send(self, msg) -> None:
        if self.size == 1:
            return
        bitmask = getattr(msg, "grammar_bitmask", None)
        if isinstance(msg, StepInput):
            shape = None if bitmask is None else tuple(bitmask.shape)
            msg = _Header(replace(msg, grammar_bitmask=None), shape)
        dist.broadcast_object_list([msg], src=self._src, group=self.group)
        if bitmask is not None:
            dist.broadcast(bitmask.contiguous(), src=self._src, group=self.group)

    def recv(self):
        box = [None]
        dist.broadcast_object_list(box, src=self._src, group=self.group)
        msg = box[0]
        if not isinstance(msg, _Header):
            return msg
        if msg.bitmask_shape is None:
            return msg.step
        bitmask = torch.empty(msg.bitmask_shape, dtype=torch.int32)
        dist.broadcast(bitmask, src=self._src, group=self.group)
        return replace(msg.step, grammar_bitmask=bitmask)
