"""The device work of one sampling step, shared by `Sampler.sample` and `CapturedStep`.

`run_step` samples the plan's rows with the plan's strategy and appends the emitted tokens to
each request's device history: what an eager call does after its host checks, and exactly
what a captured step records in its graph (so the two cannot drift apart). It never reads the
device and never touches host bookkeeping (`History.note_step` is the caller's, after the
launch). Never imports `model` or `engine`.
"""
from __future__ import annotations

import torch

from .parallel.common import StepContext, StepResult
from .parallel.plan import SamplingPlan
from .parallel.registry import STRATEGIES


def run_step(logits: torch.Tensor, plan: SamplingPlan, ctx: StepContext, slots_dev: torch.Tensor,
             append) -> StepResult:
    """logits: this rank's [plan.num_rows, V_r] rows in plan.logits_order; slots_dev: the plan's
    slots on the logits' device; append: the history-append kernel (None: torch ops)."""
    result = STRATEGIES[plan.strategy].sample(logits, plan, ctx)
    m = plan.max_rows
    ctx.store.append(slots_dev, result.block[:, :m], result.block[:, m], append)
    return result
