"""A decode step recorded once as its list of kernel launches, replayed over any logits buffer.

A CUDA graph (`capture.CapturedStep`) freezes the logits' address: an engine whose logits come
in a new allocation each step cannot replay it. `TapedStep` records the same step (`run_step`,
the same static buffers, guards and pinned results) as the list of its Triton launches with
their arguments, and replays it by issuing those launches again with the logits pointer
swapped for the new buffer's: no Python pipeline, no per-argument checks (pointers are passed
as integers), one launch per kernel, then the results' copy to the host and one event.

Contract:
- the same plans as `capture` (`check_capturable`); the new buffer must match the recorded one
  in shape, strides, dtype, device and 16-byte alignment (what the kernels were specialised on);
- a plan `capture` refuses raises its `ValueError` before any work. A step that does device
  work outside the recorded launches (a torch operation on a device tensor other than views
  and allocations: the tape could not repeat it), or whose launches are not all repeatable (a
  kernel compiled during the recording), is marked `refused` (the reason); the caller then
  samples the plan eagerly;
- the recording call is itself a step: `first` is its output (refused or not). Replays give
  the tokens and logprobs an eager call gives, bitwise (same kernels, same arguments);
- an output's device tensors are the step's static buffers, overwritten by the next replay.
Never imports `model` or `engine`.
"""
from __future__ import annotations

import torch

from .capture import ReplayGuard, check_capturable, reserve, step_context
from .kernels.launcher import LaunchList, recorded
from .parallel.registry import STRATEGIES
from .sampling.keys import append_kernel
from .sampling.output import ReplayResults, SamplerOutput
from .step import run_step

class TapedStep:
    """One plan's decode step as a list of launches, replayable over any matching logits buffer."""

    def __init__(self, sampler, plan, logits: torch.Tensor, reserve_tokens: int = 1024):
        check_capturable(sampler, plan)
        self.sampler, self.plan = sampler, plan
        self.key = _buffer_key(logits)
        store, dev = sampler.store, logits.device
        limit = reserve(sampler, plan, dev, reserve_tokens)
        slots_dev = plan.device_array("slots", plan.slots, dev)
        ctx = step_context(sampler)
        with store.history.full_width():
            warm = STRATEGIES[plan.strategy].sample(logits, plan, ctx)      # compiles kernels, fills caches
            self._results = ReplayResults(warm.block, plan.max_rows, warm.logprobs)
            with recorded(dev.type) as (tape, check):
                res = run_step(logits, plan, ctx, slots_dev, append_kernel(dev))
        # the recording was this call's step (run in full, history appended): it is returned
        # whether or not the launches can be replayed
        self.refused = None
        if check.found:
            self.refused = f"device work outside the kernels ({', '.join(sorted(set(check.found)))})"
        else:
            try:
                self._launches = LaunchList(tape, [logits], views=True)
            except ValueError as e:
                self.refused = str(e)
        if self.refused is not None:
            store.history.note_step(plan.slots, plan.rows_per_req)
            self.first = SamplerOutput(res.block, plan.max_rows, res.logprobs)
            return
        self._results.bind(res.block, res.logprobs)
        self._guard = ReplayGuard(store, plan, limit)
        self.first = self._finish()

    def matches(self, logits: torch.Tensor) -> bool:
        return _buffer_key(logits) == self.key

    def replay(self, logits: torch.Tensor) -> SamplerOutput:
        """Sample the step from `logits` (a buffer matching the recorded one, see `matches`)."""
        if self.refused is not None:
            raise ValueError(f"this step cannot be replayed from its launches: {self.refused}")
        if not self.matches(logits):
            raise ValueError("logits differ from the recorded step's in shape, strides, dtype, device or alignment")
        self._guard.check()
        self._results.release()
        self._launches.launch([logits])
        return self._finish()

    def _finish(self) -> SamplerOutput:
        self._results.fill()
        out = self._results.publish()
        self.sampler.store.history.note_step(self.plan.slots, self.plan.rows_per_req)   # after the launches
        return out


def _buffer_key(logits: torch.Tensor) -> tuple:
    return (logits.shape, logits.stride(), logits.dtype, logits.device, logits.data_ptr() & 15 == 0)
