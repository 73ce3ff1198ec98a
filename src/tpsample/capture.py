"""A decode step of `Sampler.sample` recorded once in a CUDA graph and replayed every step.

`Sampler.capture(plan, logits)` records, for a fixed plan and a fixed logits buffer, everything
`sample` does on the device: the row gathers, the kernels, raw logprobs when rows ask for them,
the history append, and the device-to-host copy of the results into one pinned buffer that the
step owns (`sampling.output.ReplayResults`). Refused, with a `ValueError` naming the cause, at
capture: drafts, a grammar mask, processed logprobs (`logprobs_mode="processed"`), requests
still below their min_tokens, and TP > 1 without NCCL.

`replay()` samples whatever the buffer holds now and returns a `SamplerOutput` (shared mode),
with the tokens and logprobs an eager `sample` would give: the noise keys come from the
positions on the device, which advance with every replay; penalties read each slot's ascending
history at its length on the device, and the recorded bad-word history views span the whole
reserved history (`History.full_width`). Per replay:
1. guards on the host, no table sync and no device read (`ReplayGuard`): the plan went stale
   (a request left or its slot was reused), the reserved history would overflow, or a table
   the graph reads was reallocated (by an eager step or another capture: new slots, longer
   history) -> `ValueError`; capture again then;
2. the previous output, if still held and unread, detaches from the pinned buffer (no wait);
3. one graph launch and one event; then the host bookkeeping (history bounds).
An output's host fields are its own once read; its `device_*` fields are the graph's static
tensors (the next replay overwrites them).
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from .parallel.collectives import Collectives
from .parallel.common import StepContext
from .parallel.registry import STRATEGIES
from .sampling.keys import append_kernel
from .sampling.output import ReplayResults, SamplerOutput
from .state.columns import F_STOPS, FLAGS, MIN_TOKENS, NUM_LP, PROCESSED
from .step import run_step


def check_capturable(sampler, plan) -> None:
    """Why this plan cannot be recorded, as a ValueError (host-side checks only)."""
    sampler._check_plan(plan)
    if plan.has_drafts:
        raise ValueError("capture records plain decode steps: this plan verifies draft tokens (sample it eagerly)")
    if plan.grammar_bitmask is not None:
        raise ValueError("capture records plain decode steps: this plan has a grammar mask (sample it eagerly)")
    hi = sampler.store.i64.host[:, plan.slots]
    proc = np.flatnonzero((hi[NUM_LP] >= 0) & (hi[PROCESSED] != 0))
    if len(proc):
        names = [plan.req_ids[i] for i in proc[:3]]
        raise ValueError(f"capture supports raw logprobs only: requests {names} ask for processed logprobs "
                         "(logprobs_mode='processed'); sample them eagerly")
    # min_tokens bans are chosen on the host per step; once met (each step emits >= 1 token) they
    # never apply again, so only a request still below its min_tokens is refused
    steps = sampler.store.history.steps[plan.slots]
    stops = np.flatnonzero((hi[FLAGS] & F_STOPS).astype(bool) & (hi[MIN_TOKENS] > steps))
    if len(stops):
        raise ValueError(f"capture does not support requests with min_tokens still to reach: "
                         f"{[plan.req_ids[i] for i in stops[:3]]}")
    if sampler.tp_size > 1 and sampler.group.backend != "nccl":
        raise ValueError("capture at TP > 1 needs an NCCL group")


def _tables(store) -> tuple:
    """Every device table a captured step may read (None where not allocated)."""
    h = store.history
    return (store.f32.device_table, store.i64.device_table, h.tokens, h.ordered, h.num_out,
            *(t.table for t in store.padded.values()))


class ReplayGuard:
    """The checks before each replay; none touches the device or syncs a table.

    stale plan: one integer compare while the slot table's version is unchanged (else the plan
    slots' generations, compared as bytes); reserved history: one vectorised compare of the plan
    slots' host bounds; reallocated tables: the identity of the 13 tables the graph may read.
    Holding those tables keeps the memory a graph reads allocated even after the store replaces
    one (the replay is refused then)."""

    def __init__(self, store, plan, limit: int):
        self.store, self.slots, self.limit = store, plan.slots, limit
        self.generations = plan.generations.tobytes()
        self.version = store.slots.version
        self.tables = _tables(store)

    def check(self) -> None:
        store = self.store
        if store.slots.version != self.version:
            if store.slots.generation.take(self.slots).tobytes() != self.generations:
                raise ValueError("plan is stale: a request it names was removed (or its slot reused) after it "
                                 "was captured; plan and capture again")
            self.version = store.slots.version
        if np.count_nonzero(store.history.upper.take(self.slots) >= self.limit):
            raise ValueError("the captured step ran out of reserved history; capture again")
        if not all(map(operator.is_, _tables(store), self.tables)):
            raise ValueError("a table the captured step reads was reallocated (new slots or history); "
                             "capture again")


def reserve(sampler, plan, dev, reserve_tokens: int) -> int:
    """Before recording a step: the sampler's device set, the store synced with room for
    `reserve_tokens` more tokens per request; returns the history capacity (the guard's limit)."""
    store = sampler.store
    if sampler.device is None:
        sampler.device = dev
    upper = store.history.upper[plan.slots]
    store.sync(dev, int(upper.max()) + reserve_tokens if plan.num_reqs else reserve_tokens)
    return store.history.capacity


def step_context(sampler) -> StepContext:
    """The StepContext a recorded step runs with (no drafts)."""
    s = sampler
    return StepContext(s.store, s.vocab_size, s.col_start, s.col_end, Collectives(s.group), inplace=s.inplace_logits)


def _require_cuda(logits: torch.Tensor) -> None:
    if not logits.is_cuda:
        raise ValueError("capture needs CUDA logits")


class CapturedStep:
    """One plan's decode step in a CUDA graph over one logits buffer (see the module docstring)."""

    def __init__(self, sampler, plan, logits: torch.Tensor, reserve_tokens: int = 1024):
        check_capturable(sampler, plan)
        _require_cuda(logits)
        self.sampler, self.plan, self.logits = sampler, plan, logits
        store, dev = sampler.store, logits.device
        limit = reserve(sampler, plan, dev, reserve_tokens)
        self._slots_dev = plan.device_array("slots", plan.slots, dev)
        self._append = append_kernel(dev)
        # recorded per-step history views (penalties, bad words) span the whole reserve, so they
        # still hold every token later replays append
        with store.history.full_width():
            warm = STRATEGIES[plan.strategy].sample(logits, plan, self._ctx())   # compiles kernels, fills caches
            self._results = ReplayResults(warm.block, plan.max_rows, warm.logprobs)   # pinned: outside the graph
            torch.cuda.synchronize(dev)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._record()
        self._guard = ReplayGuard(store, plan, limit)

    def _ctx(self) -> StepContext:
        return step_context(self.sampler)

    def _record(self) -> None:
        """The step the graph holds: sample, append to the history, copy the results out."""
        res = run_step(self.logits, self.plan, self._ctx(), self._slots_dev, self._append)
        self._results.bind(res.block, res.logprobs)
        self._results.fill()
        self.block = res.block

    def replay(self) -> SamplerOutput:
        """Sample the step from the logits buffer's current contents."""
        self._guard.check()
        self._results.release()
        self.graph.replay()
        out = self._results.publish()
        self.sampler.store.history.note_step(self.plan.slots, self.plan.rows_per_req)   # after the launch
        return out
