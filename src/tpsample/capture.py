"""A decode step of `Sampler.sample` recorded once in a CUDA graph and replayed every step.

`Sampler.capture(plan, logits)` records, for a fixed plan (no drafts, no logprobs, no grammar
mask, no pending min_tokens bans) and a fixed logits buffer, everything `sample` does on the
device: the row gathers, the kernels and the history append. `replay()` samples whatever the
buffer holds now and returns a `SamplerOutput` (one pinned copy, read lazily), with the same
tokens an eager `sample` would give: the noise keys come from the positions on the device, which
advance with every replay. The host keeps its bookkeeping per replay. A replay is refused with a
clear error when the plan went stale (a request left) or a table the graph reads was
reallocated (history capacity, a new slot range): capture again then.
"""
from __future__ import annotations

import torch

from .parallel.collectives import Collectives
from .parallel.common import StepContext
from .parallel.registry import STRATEGIES
from .sampling.keys import append_kernel
from .sampling.output import SamplerOutput


class CapturedStep:
    def __init__(self, sampler, plan, logits: torch.Tensor, reserve_tokens: int = 1024):
        if not logits.is_cuda:
            raise ValueError("capture needs CUDA logits")
        if plan.has_drafts or plan.logprobs_width or plan.grammar_bitmask is not None:
            raise ValueError("capture supports plain decode steps: no drafts, logprobs or grammar mask")
        if sampler.tp_size > 1 and sampler.group.backend != "nccl":
            raise ValueError("capture at TP > 1 needs an NCCL group")
        sampler._check_plan(plan)
        self.sampler, self.plan, self.logits = sampler, plan, logits
        store, dev = sampler.store, logits.device
        if sampler.device is None:
            sampler.device = dev
        upper = store.history.upper[plan.slots]
        store.sync(dev, int(upper.max()) + reserve_tokens if plan.num_reqs else reserve_tokens)
        self._limit = store.history.capacity
        view = plan.rows_view(None)
        ctx = self._ctx()
        strategy = STRATEGIES[plan.strategy]
        strategy.sample(logits, plan, ctx)                    # compiles kernels, fills caches
        if view.cache[dev]["stops_any"]:
            raise ValueError("capture does not support requests with min_tokens still to reach")
        self._slots = plan.device_array("slots", plan.slots, dev)
        append = append_kernel(dev)
        torch.cuda.synchronize(dev)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.block = strategy.sample(logits, plan, self._ctx()).block
            store.append(self._slots, self.block[:, : plan.max_rows], self.block[:, plan.max_rows], append)
        self._tables = self._pointers()

    def _ctx(self) -> StepContext:
        s = self.sampler
        return StepContext(s.store, s.vocab_size, s.col_start, s.col_end, Collectives(s.group),
                           inplace=s.inplace_logits)

    def _pointers(self) -> tuple:
        store = self.sampler.store
        tables = [store.f32.device_table, store.i64.device_table, store.history.tokens, store.history.num_out]
        tables += [t.table for t in store.padded.values()]
        return tuple(None if t is None else t.data_ptr() for t in tables)

    def replay(self) -> SamplerOutput:
        """Sample the step from the logits buffer's current contents."""
        s, plan = self.sampler, self.plan
        s._check_plan(plan)
        store = s.store
        if int((store.history.upper[plan.slots] + 1).max()) > self._limit:
            raise ValueError("the captured step ran out of reserved history; capture again")
        store.sync(self.logits.device, 0)
        if self._pointers() != self._tables:
            raise ValueError("a table the captured step reads was reallocated (new slots or history); capture again")
        self.graph.replay()
        store.history.note_step(plan.slots, plan.rows_per_req)
        return SamplerOutput(self.block, plan.max_rows)
