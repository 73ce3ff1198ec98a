"""Decode steps of the sampler replayed from a CUDA graph while the batch stays the same.

Contract
- `SamplerGraphs(sampler).sample(logits, plan)` returns what `sampler.sample(logits, plan)`
  returns, token for token (`Sampler.capture` records the same step), for a decode step whose
  logits sit in the decode graph's static output buffer.
- After `STREAK` consecutive steps with the same plan (the sampler hands back the previous
  step's plan object while the batch is unchanged) over the same buffer, the step is captured
  once and later steps replay it: host work of one graph launch instead of a dozen kernel
  launches. A replay the capture's guards refuse (the plan went stale, the reserved history is
  used up, a table moved) falls back to eager sampling and a new capture when the streak
  allows. A plan that cannot be captured (drafts, grammar masks, processed logprobs, pending
  min_tokens) is sampled eagerly, without asking again while it lasts.
- One captured step at a time (a new one releases the old graph). Only at TP = 1: captured
  collectives need NCCL and have not been validated at TP > 1.
- Never imports the model, the scheduler or the strategies.
"""
from __future__ import annotations

import torch

STREAK = 3


def _same_buffer(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype and a.device == b.device)


class SamplerGraphs:
    def __init__(self, sampler):
        self.sampler = sampler
        self.step = None          # the captured step (CapturedStep) or None
        self.plan = None          # the last plan sampled, and how many steps in a row used it
        self.streak = 0
        self.refused = None       # a plan capture refused (sampled eagerly while it lasts)
        self.num_captures = 0
        self.num_replays = 0

    def sample(self, logits: torch.Tensor, plan):
        step = self.step
        if step is not None and step.plan is plan and _same_buffer(step.logits, logits):
            try:
                out = step.replay()
                self.num_replays += 1
                return out
            except ValueError:    # refused before anything ran: sample eagerly, capture again
                self.step = None
        self.streak = self.streak + 1 if plan is self.plan else 1
        self.plan = plan
        if self.streak >= STREAK and plan is not self.refused and self.sampler.tp_size == 1:
            self.step = None      # the old graph's memory goes back before a new capture
            try:
                step = self.sampler.capture(plan, logits)
            except ValueError:    # not capturable: checked before anything is recorded
                self.refused = plan
            else:
                self.step = step
                self.num_captures += 1
                self.num_replays += 1
                return step.replay()
        return self.sampler.sample(logits, plan)

    def close(self) -> None:
        self.step = self.plan = self.refused = None
