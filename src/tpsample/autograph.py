"""Eager `sample` calls replayed from a CUDA graph once they repeat (the sampler's `auto_graph`).

An eager call costs the host a few hundred microseconds of launches and Python; a replayed
graph about forty. Engines that call `sample` eagerly with a persistent logits buffer (the LM
head's output of a graphed decode step, or the same allocation every step) repeat the same
plan over the same buffer step after step. `AutoGraph` notices that: after `AFTER` consecutive
calls with the same plan object and the same logits buffer (pointer, shape, strides, dtype,
device) it captures the step (`capture.CapturedStep`) and replays it for as long as both stay
the same. Tokens and logprobs are bitwise those of the eager call (the capture tests hold that).

Contract:
- used only at TP = 1, on CUDA logits, without draft probabilities, in-place logits or memory
  profiling (`Sampler` decides); a plan `capture` refuses (drafts, a grammar mask, processed
  logprobs, min_tokens still to reach) is remembered as refused and sampled eagerly;
- a replay the step's guard refuses (stale plan, reserved history used up, a table
  reallocated) drops the graph: the call is sampled eagerly and counting starts again;
- an output's device tensors are the graph's static buffers: they hold this step's results
  until the next call replays the graph (as with any CUDA-graph output); its host fields are
  its own (see `sampling.output`).
Never imports `model` or `engine`.
"""
from __future__ import annotations

from typing import Optional

import torch

AFTER = 4             # consecutive identical calls before a capture (the capture costs a few ms)
RESERVE_TOKENS = 1024


class AutoGraph:
    def __init__(self):
        self.plan = None
        self.key: tuple = ()
        self.seen = 0
        self.step = None
        self.refused = False
        self.captures = 0     # graphs captured so far (for tests and benchmarks)
        self.replays = 0

    def sample(self, sampler, plan, logits: torch.Tensor):
        """The call's output from a replay, or None: sample it eagerly."""
        key = (logits.data_ptr(), logits.shape, logits.stride(), logits.dtype, logits.device)
        if plan is not self.plan or key != self.key:
            self.plan, self.key, self.seen, self.step, self.refused = plan, key, 0, None, False
        self.seen += 1
        if self.step is None:
            if self.refused or self.seen < AFTER:
                return None
            self.step = self._capture(sampler, plan, logits)
            if self.step is None:
                return None
        try:
            out = self.step.replay()
        except ValueError:           # the guard refused: the batch or a table changed under it
            self.step, self.seen = None, 0
            return None
        self.replays += 1
        return out

    def _capture(self, sampler, plan, logits):
        from .capture import CapturedStep
        try:
            step = CapturedStep(sampler, plan, logits, RESERVE_TOKENS)
        except ValueError:           # not a capturable step: sample this plan eagerly
            self.refused = True
            return None
        self.captures += 1
        return step


def wanted(sampler, logits: torch.Tensor, draft_probs: Optional[torch.Tensor]) -> bool:
    """Whether this call may be replayed (see the module contract)."""
    return (sampler.auto_graph is not None and draft_probs is None and logits.is_cuda
            and sampler.tp_size == 1 and not sampler.inplace_logits and not sampler.profile_memory)
