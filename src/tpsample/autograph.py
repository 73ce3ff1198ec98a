"""Eager `sample` calls replayed from a CUDA graph once they repeat (the sampler's `auto_graph`).

An eager call costs the host a few hundred microseconds of launches and Python; a replayed
graph about forty. Engines that call `sample` eagerly with a persistent logits buffer (the LM
head's output of a graphed decode step, or the same allocation every step) repeat the same
plan over the same buffer step after step. `AutoGraph` notices that: after `AFTER` consecutive
calls with the same plan object and the same logits buffer (pointer, shape, strides, dtype,
device) it captures the step (`capture.CapturedStep`) and replays it for as long as both stay
the same. When the plan repeats but the buffer moves (a new allocation each step), it records
the step's launch list instead (`tape.TapedStep`) and replays that over each new buffer of the
same shape, strides, dtype and alignment. Tokens and logprobs are bitwise those of the eager
call (the capture and tape tests hold that).

Contract:
- used only at TP = 1, on CUDA logits, without draft probabilities, in-place logits or memory
  profiling (`Sampler` decides); a plan `capture` refuses (drafts, a grammar mask, processed
  logprobs, min_tokens still to reach) is remembered as refused and sampled eagerly;
- a replay the step's guard refuses (stale plan, reserved history used up, a table
  reallocated) drops the graph or the launch list: the call is sampled eagerly (or recorded
  again) and counting starts again;
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
        self.seen = 0              # consecutive calls with this plan and this buffer
        self.calls = 0             # consecutive calls with this plan
        self.step = None           # the graph, over the buffer of `graph_key`
        self.graph_key: tuple = ()
        self.tape = None           # the launch list, over any matching buffer
        self.refused = False       # graph capture refused for this plan
        self.tape_refused = False
        self.captures = 0     # graphs captured so far (for tests and benchmarks)
        self.replays = 0
        self.tapes = 0        # launch lists recorded so far
        self.tape_replays = 0

    def sample(self, sampler, plan, logits: torch.Tensor):
        """The call's output from a replay, or None: sample it eagerly."""
        key = (logits.data_ptr(), logits.shape, logits.stride(), logits.dtype, logits.device)
        if plan is not self.plan:
            self.plan, self.calls, self.step, self.tape = plan, 0, None, None
            self.refused = self.tape_refused = False
            self.key, self.seen = (), 0
        if key != self.key:
            self.key, self.seen = key, 0
        self.seen += 1
        self.calls += 1
        if self.step is not None and key == self.graph_key:
            out = self._replay(lambda: self.step.replay())
            if out is not None:
                self.replays += 1
                return out
            self.step, self.seen, self.calls = None, 0, 0
            return None
        if self.tape is not None and self.tape.matches(logits):
            out = self._replay(lambda: self.tape.replay(logits))
            if out is not None:
                self.tape_replays += 1
                return out
            self.tape, self.seen, self.calls = None, 0, 0
            return None
        if self.seen >= AFTER and not self.refused:
            self.step = self._capture(sampler, plan, logits)
            if self.step is not None:
                self.graph_key = key
                self.replays += 1
                return self.step.replay()
        if self.calls >= AFTER and self.seen < self.calls and not self.tape_refused:
            return self._record(sampler, plan, logits)    # the buffer moves: a launch list follows it
        return None

    @staticmethod
    def _replay(run):
        try:
            return run()
        except ValueError:           # the guard refused: the batch or a table changed under it
            return None

    def _capture(self, sampler, plan, logits):
        from .capture import CapturedStep
        try:
            step = CapturedStep(sampler, plan, logits, RESERVE_TOKENS)
        except ValueError:           # not a capturable step: sample this plan eagerly
            self.refused = True
            return None
        self.captures += 1
        return step

    def _record(self, sampler, plan, logits):
        from .tape import TapedStep
        try:
            tape = TapedStep(sampler, plan, logits, RESERVE_TOKENS)
        except ValueError:           # not a capturable plan (nothing ran): sample it eagerly
            self.tape_refused = True
            return None
        self.tapes += 1
        if tape.refused is not None:
            self.tape_refused = True
        else:
            self.tape = tape
        return tape.first


def wanted(sampler, logits: torch.Tensor, draft_probs: Optional[torch.Tensor]) -> bool:
    """Whether this call may be replayed (see the module contract)."""
    return (sampler.auto_graph is not None and draft_probs is None and logits.is_cuda
            and sampler.tp_size == 1 and not sampler.inplace_logits and not sampler.profile_memory)
