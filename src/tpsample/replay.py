"""Replaying a decode step instead of launching it again: CUDA graphs, launch lists, and when.

A replay issues the step's recorded device work without the host's launches and Python (a
small fraction of an eager call's host cost). Four ways, one policy:

- `CapturedStep` (`Sampler.capture(plan, logits)`): the step's device work (the Sampler's
  `_device_steps`: the strategy's before and after, the recipe, the history append) and the
  device-to-host copy of its results into one pinned buffer (`sampling.output.ReplayResults`),
  recorded in a CUDA graph for a fixed plan and a fixed logits buffer. `replay()` samples
  whatever the buffer holds now, with the tokens and logprobs an eager `sample` gives.
- `TapedStep`: the same step recorded as its list of Triton launches with their arguments
  (`kernels.launcher.LaunchList`), replayed over any logits buffer of the same shape, strides,
  dtype, device and 16-byte alignment (an engine whose LM head allocates its output per step).
- `AutoGraph` (`Sampler(auto_graph=True)`, TP = 1 on CUDA): after `AFTER` consecutive eager
  calls with the same plan object over the same buffer it captures the step and replays it
  while both stay the same; when the plan repeats but the buffer moves it records a launch list
  and replays that over each new buffer.
- `launch_at(sites, site, tensors, inputs, launch)`: the ops' launch lists (`tpsample.ops`), one
  per *site*: everything the launches were specialised on (shapes, strides, dtypes, 16-byte
  alignment, device, stream and the caller's own switches). A site's first call is recorded;
  later calls issue its list with their tensors' pointers. No plan or table can go stale under
  it: the site key is all a list depends on.

The policy, for all four. *What is refused*, for a Sampler step (`check_capturable`, a
`ValueError` naming the cause): no drafts, no grammar mask, no processed logprobs, no
top-n-sigma, XTC, kept support or logprob values other than the raw log-softmax (rows the torch
backend samples), no request still below its min_tokens, and at TP > 1 an NCCL group; for any
launch list (`record_launches`): device work outside the kernels (torch ops: penalties,
processors, a first call creating caches), a launch that compiled a kernel, or an input read in
another dtype or layout; and a call whose inputs share memory is never recorded (a list maps
each pointer to one role). A recording refused that way is not kept (the call it ran is still
that call's result). An ops site records again on a later call, up to `RECORD_TRIES` refusals
(its first call may create caches); a Sampler step is recorded after a warm-up step, so its
refusal is final for the plan. *When a recording is stale*: each replay of a Sampler step first runs `ReplayGuard`
on the host (no device read): the plan went stale (a request left or its slot was reused), the
reserved history would overflow, or a table the recording reads was reallocated -> `ValueError`
(capture again; `AutoGraph` then samples eagerly and counts again). Per replay the noise keys
advance with the positions on the device, penalties read each slot's ascending history at its
length on the device, and recorded history views span the whole reserve (`History.full_width`).
An output's host fields are its own once read; its `device_*` fields are the recording's static
tensors, which the next replay overwrites. Never imports `model` or `engine`.
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from .kernels.launcher import LaunchList, recorded
from .sampling.min_tokens import MinTokens
from .sampling.output import ReplayResults, SamplerOutput

AFTER = 4             # consecutive identical eager calls before a recording (the capture costs a few ms)
RESERVE_TOKENS = 1024
RECORD_TRIES = 3      # refused launch-list recordings of one key before it launches eagerly for good
MAX_SITES = 32        # ops sites kept (the oldest goes first)


def buffer_key(t: torch.Tensor) -> tuple:
    """What a launch list's kernels were specialised on for one tensor it is replayed over."""
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15 == 0)


def record_launches(device_type: str, tensors: list, run, views: bool = False) -> tuple:
    """(run()'s result, its LaunchList over `tensors` or None, why none or None): `run` launches
    while recorded; the list is refused for device work outside the kernels, a compile, or a
    tensor read in another dtype or layout (module docstring)."""
    with recorded(device_type) as (tape, work):
        result = run()
    if work.found:
        return result, None, f"device work outside the kernels ({', '.join(sorted(set(work.found)))})"
    try:
        return result, LaunchList(tape, tensors, views=views), None
    except ValueError as e:
        return result, None, str(e)


def launch_at(sites: dict, site, tensors: list, inputs: int, launch) -> None:
    """`launch()` over `tensors` (the first `inputs` the caller's, the rest outputs it made), or
    the site's launch list issued over them. `sites` maps a site to its LaunchList or to the
    number of its refused recordings; the caller keeps it (one dict per kind of call)."""
    got = sites.get(site, 0)
    if not isinstance(got, int):
        got.launch(tensors)
        return
    ptrs = {t.data_ptr() for t in tensors[:inputs]}
    if got >= RECORD_TRIES or len(ptrs) < inputs:
        launch()
        return
    if site not in sites and len(sites) >= MAX_SITES:
        sites.pop(next(iter(sites)))
    _, tape, _ = record_launches(tensors[0].device.type, tensors, launch)
    sites[site] = tape or got + 1


def check_capturable(sampler, plan) -> None:
    """Why this plan cannot be recorded, as a ValueError (host-side checks only)."""
    sampler._check_plan(plan)
    if plan.has_drafts:
        raise ValueError("capture records plain decode steps: this plan verifies draft tokens (sample it eagerly)")
    if plan.grammar_bitmask is not None:
        raise ValueError("capture records plain decode steps: this plan has a grammar mask (sample it eagerly)")
    store = sampler.store
    hi, cols = store.i64.host[:, plan.slots], store.layout.i64
    proc = np.flatnonzero((hi[cols["num_logprobs"]] >= 0) & (hi[cols["processed"]] != 0))
    if len(proc):
        names = [plan.req_ids[i] for i in proc[:3]]
        raise ValueError(f"capture supports raw logprobs only: requests {names} ask for processed logprobs "
                         "(logprobs_mode='processed'); sample them eagerly")
    asks = np.flatnonzero((hi[cols["kept_cap"]] >= 0) | ((hi[cols["num_logprobs"]] >= 0) & (hi[cols["lp_kind"]] != 0)))
    if len(asks):
        raise ValueError(f"capture does not support kept_support or logprobs_mode other than raw / processed "
                         f"logprobs (requests {[plan.req_ids[i] for i in asks[:3]]}); sample them eagerly")
    for name in ("top_n_sigma", "xtc_probability"):
        uses = np.flatnonzero(store.f32.host[store.layout.f32[name], plan.slots] > 0)
        if len(uses):
            raise ValueError(f"capture does not support {name} (requests {[plan.req_ids[i] for i in uses[:3]]}); "
                             "sample them eagerly")
    # min_tokens bans are chosen on the host per step; once met (each step emits >= 1 token) they
    # never apply again, so only a request still below its min_tokens is refused
    stops = np.flatnonzero(MinTokens.pending(store, plan.slots))
    if len(stops):
        raise ValueError(f"capture does not support requests with min_tokens still to reach: "
                         f"{[plan.req_ids[i] for i in stops[:3]]}")
    if sampler.tp_size > 1 and sampler.group.backend != "nccl":
        raise ValueError("capture at TP > 1 needs an NCCL group")


def _tables(store) -> tuple:
    """Every device table a recorded step may read (None where not allocated)."""
    h = store.history
    return (store.f32.device_table, store.i64.device_table, h.tokens, h.ordered, h.num_out,
            *(t.table for t in store.padded.values()))


class ReplayGuard:
    """The checks before each replay; none touches the device or syncs a table.

    stale plan: one integer compare while the slot table's version is unchanged (else the plan
    slots' generations, compared as bytes); reserved history: one vectorised compare of the plan
    slots' host bounds; reallocated tables: the identity of the tables the recording may read.
    Holding those tables keeps the memory a recording reads allocated even after the store
    replaces one (the replay is refused then)."""

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


class _Recording:
    """What both recordings share (after `check_capturable`): the reserved history, the warm-up step (kernels
    compiled, caches filled, results' shapes known: no history append) and the guard."""

    def __init__(self, sampler, plan, logits: torch.Tensor, reserve_tokens: int):
        self.sampler, self.plan = sampler, plan
        store, dev = sampler.store, logits.device
        sampler._bind_device(dev)
        upper = store.history.upper[plan.slots]
        store.sync(dev, int(upper.max()) + reserve_tokens if plan.num_reqs else reserve_tokens)
        self.limit = store.history.capacity
        with store.history.full_width():
            block, logprobs = sampler._device_steps(logits, plan, append=False)
        self._results = ReplayResults(block, plan.max_rows, logprobs)   # pinned: outside any graph

    def _finish(self) -> SamplerOutput:
        out = self._results.publish()
        self.sampler.store.history.note_step(self.plan.slots, self.plan.rows_per_req)   # after the launch
        return out


def _require_cuda(logits: torch.Tensor) -> None:
    if not logits.is_cuda:
        raise ValueError("capture needs CUDA logits")


class CapturedStep(_Recording):
    """One plan's decode step in a CUDA graph over one logits buffer (module docstring)."""

    def __init__(self, sampler, plan, logits: torch.Tensor, reserve_tokens: int = RESERVE_TOKENS):
        check_capturable(sampler, plan)
        _require_cuda(logits)
        self.logits = logits
        super().__init__(sampler, plan, logits, reserve_tokens)
        with sampler.store.history.full_width():
            torch.cuda.synchronize(logits.device)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._record()
        self._guard = ReplayGuard(sampler.store, plan, self.limit)

    def _record(self) -> None:
        """The step the graph holds: sample, append to the history, copy the results out."""
        block, logprobs = self.sampler._device_steps(self.logits, self.plan)
        self._results.bind(block, logprobs)
        self._results.fill()
        self.block = block

    def replay(self) -> SamplerOutput:
        """Sample the step from the logits buffer's current contents."""
        self._guard.check()
        self._results.release()
        self.graph.replay()
        return self._finish()


class TapedStep(_Recording):
    """One plan's decode step as a list of launches, replayable over any matching logits buffer.
    The recording call is itself a step: `first` is its output (refused or not)."""

    def __init__(self, sampler, plan, logits: torch.Tensor, reserve_tokens: int = RESERVE_TOKENS):
        check_capturable(sampler, plan)
        super().__init__(sampler, plan, logits, reserve_tokens)
        self.key = buffer_key(logits)
        store = sampler.store
        with store.history.full_width():
            (block, logprobs), self._launches, self.refused = record_launches(
                logits.device.type, [logits], lambda: sampler._device_steps(logits, plan),
                views=True)
        if self.refused is not None:
            store.history.note_step(plan.slots, plan.rows_per_req)
            self.first = SamplerOutput(block, plan.max_rows, logprobs)
            return
        self._results.bind(block, logprobs)
        self._guard = ReplayGuard(store, plan, self.limit)
        self._results.fill()
        self.first = self._finish()

    def matches(self, logits: torch.Tensor) -> bool:
        return buffer_key(logits) == self.key

    def replay(self, logits: torch.Tensor) -> SamplerOutput:
        """Sample the step from `logits` (a buffer matching the recorded one, see `matches`)."""
        if self.refused is not None:
            raise ValueError(f"this step cannot be replayed from its launches: {self.refused}")
        if not self.matches(logits):
            raise ValueError("logits differ from the recorded step's in shape, strides, dtype, device or alignment")
        self._guard.check()
        self._results.release()
        self._launches.launch([logits])
        self._results.fill()
        return self._finish()


class AutoGraph:
    """Eager calls replayed once they repeat (module docstring). The Sampler asks it only at
    TP = 1, without draft probabilities, in-place logits or memory profiling, and for CUDA
    logits unless `cuda_only` is False (CPU tests stand the graphs in with fakes)."""

    cuda_only = True

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
        self.captures = 0          # graphs captured so far (for tests and benchmarks)
        self.replays = 0
        self.tapes = 0             # launch lists recorded so far
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
            out = _refusable(self.step.replay)
            if out is not None:
                self.replays += 1
                return out
            self.step, self.seen, self.calls = None, 0, 0
            return None
        if self.tape is not None and self.tape.matches(logits):
            out = _refusable(self.tape.replay, logits)
            if out is not None:
                self.tape_replays += 1
                return out
            self.tape, self.seen, self.calls = None, 0, 0
            return None
        if self.seen >= AFTER and not self.refused:
            self.step = _refusable(CapturedStep, sampler, plan, logits)
            self.refused = self.step is None     # not a capturable step: sample this plan eagerly
            if self.step is not None:
                self.captures += 1
                self.graph_key = key
                self.replays += 1
                return self.step.replay()
        if self.calls >= AFTER and self.seen < self.calls and not self.tape_refused:
            return self._record(sampler, plan, logits)    # the buffer moves: a launch list follows it
        return None

    def _record(self, sampler, plan, logits):
        tape = _refusable(TapedStep, sampler, plan, logits)
        if tape is None:             # not a capturable plan (nothing ran): sample it eagerly
            self.tape_refused = True
            return None
        self.tapes += 1
        if tape.refused is not None:
            self.tape_refused = True
        else:
            self.tape = tape
        return tape.first


def _refusable(fn, *args):
    """fn(*args), or None when it refuses (a ValueError: the batch or a table changed under a
    recording, or the plan cannot be recorded)."""
    try:
        return fn(*args)
    except ValueError:
        return None
