"""The Sampler facade: tpsample's public sampling API.

Contract:
- in: requests (`add_request` / `remove_request`), a `plan` per step built from replicated
  inputs, and this rank's local logits `[rows, V_r]` in `plan.logits_order`.
- out: a `SamplerOutput` identical on every rank, in batch order. `sample` appends the emitted
  tokens to each request's history on the device (penalties, positions, min_tokens, bad words).
- state: a request's parameters and sparse lists are written once, at `add_request`, into
  per-slot tables (`tpsample.state`); a step moves slot indices and runs tensor ops: no Python
  loop over requests or rows, no host synchronisation inside `sample` (results come back through
  one pinned, non-blocking copy that `SamplerOutput` waits for when first read).
- invariants: slot allocation and request seeds are identical on every rank without talking
  (the base seed is agreed once, at construction); bad input raises `ValueError` naming the
  field and the allowed range before any collective runs; a plan is checked against the sampler
  that made it and, at TP > 1, against the other ranks' plans; never returns an out-of-range id.
- never imports `model` or `engine`. Strategy differences live in `parallel.strategies` (a
  before and an after around the recipe), backends in `sampling.recipe`, not here.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .parallel import names
from .parallel.agreement import disagreement
from .parallel.collectives import Collectives
from .parallel.group import DEFAULT_TIMEOUT_S, TPGroup
from .parallel.measured import MeasuredAuto, features
from .parallel.plan import SamplingPlan, build_plan
from .parallel.shard import vocab_shard
from .parallel.strategies import BY_NAME, Step, device_copy
from .params import SamplingParams
from .replay import AutoGraph, CapturedStep
from .sampling.keys import append_kernel
from .sampling.output import SamplerOutput
from .sampling.processors import PROCESSORS
from .sampling.recipe import sample_rows
from .state.store import RequestStore, derive_seed
from .validation import (
    check_bitmask,
    check_device,
    check_draft_probs,
    check_drafts,
    check_logits,
    check_prompt,
    check_req_ids,
    check_sampler_args,
)

STRATEGY_NAMES = names.ALL
_UIDS = itertools.count(1)


@dataclass(frozen=True)
class StepStats:
    strategy: str
    bytes_sent: int           # this rank, this step
    bytes_received: int
    num_collectives: int
    peak_bytes: int           # sampler memory above its inputs (CUDA: allocator peak when
                              # profile_memory, else counted; CPU: counted)
    local_logits_bytes: int
    num_rounds: int = 0       # collectives the strategy issued this step (num_collectives also
                              # counts the plan check when the plan is new)
    exact_rows: int = 0       # vocab_parallel rows that took the exact top-p path (extra rounds)


class Sampler:
    def __init__(self, vocab_size: int, *, max_num_reqs: int = 256, max_num_logits_per_req: int = 1,
                 strategy: str = "auto", group=None, device=None, max_logprobs: int = 20,
                 eos_token_id: Optional[int] = None, seed: Optional[int] = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, inplace_logits: bool = False,
                 profile_memory: bool = False, check_plans: bool = True, auto_graph: bool = True):
        """vocab_size: V. max_num_reqs: concurrent requests (slot tables grow with use, so a large
        value costs nothing up front). max_num_logits_per_req: 1 + the most draft tokens a request
        may verify per step. strategy: "auto", "replicated", "batch_sharded" or "vocab_parallel".
        group: the TP process group (None: the default group if initialised, else TP=1).
        device: where per-slot state lives (None: the device of the first logits; else "cpu" or a
        CUDA device that exists here).
        inplace_logits: let `sample` use fp32 local logits as its working buffer (saves a copy
        of the shard; the tensor then holds processed values). seed: the base of request seeds
        (drawn and agreed across ranks once, here, when None). timeout_s: per collective, > 0.
        profile_memory: measure each step's CUDA peak (synchronises; for profiling, not serving).
        check_plans: at TP > 1, every step first checks that all ranks sample the same plan (one
        8-byte all-gather on the host over a gloo group, never a device sync), so ranks that
        disagree get a clear error instead of a hang or silently different tokens.
        auto_graph: at TP = 1 on CUDA, replay a step once the same plan has been sampled a few
        calls in a row (`tpsample.replay`): from a CUDA graph over the same logits buffer, or,
        when each call brings a new buffer, from the step's recorded kernel launches
        (`tpsample.replay`); the tokens are the eager ones, at a fraction of the host cost; the
        output's device tensors then hold their values until the next call."""
        check_sampler_args(vocab_size, max_num_reqs, max_num_logits_per_req, max_logprobs, eos_token_id,
                           strategy, STRATEGY_NAMES, group=group, timeout_s=timeout_s, seed=seed,
                           flags={"inplace_logits": inplace_logits, "profile_memory": profile_memory,
                                  "check_plans": check_plans, "auto_graph": auto_graph}, group_types=(TPGroup,))
        device = check_device(device)
        self.vocab_size = vocab_size
        self.max_num_logits_per_req = max_num_logits_per_req
        self.strategy = strategy
        self.max_logprobs = max_logprobs
        self.eos_token_id = eos_token_id
        self.inplace_logits = inplace_logits
        self.profile_memory = profile_memory
        self.device = device
        self.group = TPGroup.resolve(group, timeout_s)
        # replays record a plain TP = 1 step (no draft probs: checked per call)
        replayable = auto_graph and self.group.size == 1 and not inplace_logits and not profile_memory
        self.auto_graph = AutoGraph() if replayable else None
        self.comm = Collectives(self.group)
        self.col_start, self.col_end = vocab_shard(vocab_size, self.group.size, self.group.rank)
        self.store = RequestStore(vocab_size, max_num_reqs, eos_token_id, PROCESSORS)
        base = seed if seed is not None else random.SystemRandom().getrandbits(62)
        self.base_seed = self.comm.broadcast_int(base) if seed is None else seed
        self.uid = next(_UIDS)
        self._serial = 0
        self._last_plan: Optional[SamplingPlan] = None
        self._checked: tuple = (None, -1)    # (plan, slot-table version) last found current
        self._append = None                  # the history-append kernel of self.device (or None)
        self._check = Collectives(self.group.cpu_twin()) if (check_plans and self.group.size > 1) else None
        self.last_stats: Optional[StepStats] = None
        self.auto = MeasuredAuto(self.group, vocab_size)    # measured on first use (strategy "auto")
        self._plan_auto_version = 0

    @property
    def tp_size(self) -> int:
        """Ranks in the TP group (1 without a group)."""
        return self.group.size

    @property
    def rank(self) -> int:
        """This rank's index in the TP group; its logits shard is `vocab_shard(V, tp_size, rank)`."""
        return self.group.rank

    @property
    def slots(self):
        """The slot table: `slots.get(req_id)` gives a request's slot, seed, params and history."""
        return self.store.slots

    def add_request(self, req_id: str, params: SamplingParams, prompt_token_ids) -> int:
        """Register a request and write its sampling state once; returns its slot.

        prompt_token_ids: the prompt (positions and the repetition penalty's token set). The
        params are copied: changing the caller's objects later has no effect. A call that raises
        leaves the sampler as it was (no slot taken, no table row or seed serial used)."""
        if not isinstance(req_id, str):
            raise ValueError(f"req_id must be a string, got {type(req_id).__name__}")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        params.validate_for_vocab(self.vocab_size, self.max_logprobs)
        prompt = check_prompt(prompt_token_ids, self.vocab_size)
        seed = params.seed if params.seed is not None else derive_seed(self.base_seed, req_id, self._serial)
        slot = self.store.add(req_id, params, prompt, seed).slot      # a failed add changes nothing
        self._serial += 1                                             # ... not even the next seed
        return slot

    def remove_request(self, req_id: str) -> None:
        """Free a request's slot (its state is overwritten when the slot is reused)."""
        self.store.remove(req_id)

    def plan(self, req_ids, *, draft_token_ids=None, grammar_bitmask=None,
             strategy: Optional[str] = None) -> SamplingPlan:
        """The step's plan: which rows exist, where each rank's logits rows go, which strategy.

        req_ids: the step's active request ids, in batch order. draft_token_ids: per request, the
        draft tokens to verify (a list of lists, or an int array [num_reqs, D] padded with -1).
        grammar_bitmask: int32 [rows, ceil(V/32)] (bit = allowed) in batch row order. Pure
        function of replicated inputs: every rank gets the same plan without talking. A call
        with the same requests as the previous step (no drafts, no mask) returns that plan."""
        last = self._last_plan
        if (last is not None and draft_token_ids is None and grammar_bitmask is None and strategy is None
                and last.grammar_bitmask is None and not last.has_drafts and isinstance(req_ids, list)
                and len(req_ids) == last.num_reqs and tuple(req_ids) == last.req_ids
                and self._current(last) and self._plan_auto_version == self.auto.version):
            return last
        req_ids = check_req_ids(req_ids)
        slots = self.store.slots.slots_of(req_ids)
        drafts = check_drafts(draft_token_ids, len(req_ids), self.vocab_size, self.max_num_logits_per_req)
        num_rows = len(req_ids) + int((drafts >= 0).sum())
        bitmask = check_bitmask(grammar_bitmask, num_rows, self.vocab_size)
        lp = self.store.i64.host[self.store.layout.i64["num_logprobs"], slots] if len(slots) else np.zeros(0, np.int64)
        width = 1 + int(lp.max()) if len(lp) and lp.max() >= 0 else 0
        rows_per_req = 1 + (drafts >= 0).sum(axis=1) if drafts.shape[1] else np.ones(len(slots), np.int64)
        chosen = self._choose(strategy or self.strategy, slots, rows_per_req)
        plan = build_plan(BY_NAME[chosen], self.tp_size, req_ids, slots, self.store.slots.generation[slots].copy(), drafts,
                          width, bitmask, self.uid, self.vocab_size, param_prints=self.store.slots.prints[slots])
        self._last_plan, self._plan_auto_version = plan, self.auto.version
        return plan

    def _choose(self, strategy: str, slots: np.ndarray, rows_per_req: np.ndarray) -> str:
        if strategy != "auto":
            if strategy not in BY_NAME:
                raise ValueError(f"strategy must be one of {STRATEGY_NAMES}, got {strategy!r}")
            return strategy
        tp = self.tp_size
        per_owner = np.bincount(slots % tp, weights=rows_per_req, minlength=tp) if len(slots) else np.zeros(tp)
        feats = features(self.store, slots, bool((rows_per_req > 1).any()))
        return self.auto.choose(feats, int(rows_per_req.sum()), int(per_owner.max()), self._device_type())

    def _device_type(self) -> str:
        """The device kind before any logits were seen: NCCL groups run on CUDA, others on CPU."""
        if self.device is not None:
            return self.device.type
        return "cuda" if self.group.backend == "nccl" else "cpu"

    def sample(self, local_logits: torch.Tensor, plan: SamplingPlan, *,
               draft_probs: Optional[torch.Tensor] = None) -> SamplerOutput:
        """Sample the step: the output is identical on every rank, in batch order.

        local_logits: [plan.num_rows, V_r] this rank's vocab shard, rows in plan.logits_order
        (float32 / bf16 / fp16). draft_probs: optional [rows, V_r] draft distributions (rows in
        logits_order) for probabilistic drafts. Side effect: each request's emitted tokens are
        appended to its history on the device. No host synchronisation (unless profile_memory)."""
        # 1. checks: the plan is this sampler's and current; the logits and draft probs fit it
        self._check_inputs(local_logits, plan, draft_probs)
        # 2. replay: the same decode step again replays its recording (`replay.AutoGraph`)
        replay = self.auto_graph
        if replay is not None and draft_probs is None and (local_logits.is_cuda or not replay.cuda_only):
            out = replay.sample(self, plan, local_logits)
            if out is not None:      # no collective, no counted memory
                self.last_stats = StepStats(plan.strategy, 0, 0, 0, 0, local_logits.numel() * local_logits.element_size())
                return out
        # 3. state: the device bound, every rank on this plan, the device tables current
        self._prepare_state(local_logits.device, plan)
        # 4. the strategy's before (all-gather / all-to-all / the shard), 5. the sampling recipe
        sent, received, calls = self.comm.stats.bytes_sent, self.comm.stats.bytes_received, self.comm.stats.num_collectives
        step = self._step_inputs(draft_probs)
        base = self._start_profile(local_logits.device)
        res = sample_rows(plan.sharding.before(local_logits, plan, step))
        # 6. the strategy's after (per-request results, identical on every rank), 7. the history append
        block, logprobs, support = self._after(res, plan, step, local_logits.device)
        # 8. host bookkeeping, the step's stats and the output (its host copy is read on first use)
        self.store.history.note_step(plan.slots, plan.rows_per_req)
        stats = self.comm.stats
        peak = self._end_profile(local_logits.device, base) if base is not None else step.meter.peak
        self.last_stats = StepStats(plan.strategy, stats.bytes_sent - sent, stats.bytes_received - received,
                                    stats.num_collectives - calls, int(peak),
                                    local_logits.numel() * local_logits.element_size(),
                                    stats.num_collectives - calls, res.exact_rows)
        return SamplerOutput(block, plan.max_rows, logprobs, support)

    def _device_steps(self, logits: torch.Tensor, plan: SamplingPlan, append: bool = True) -> tuple:
        """Steps 4-7 of `sample` (the device work): what a recording replays (`replay`).
        Returns (block, logprobs)."""
        step = self._step_inputs()
        block, logprobs, _ = self._after(sample_rows(plan.sharding.before(logits, plan, step)), plan, step,
                                         logits.device, append)
        return block, logprobs

    def _after(self, res, plan: SamplingPlan, step: Step, dev: torch.device, append: bool = True) -> tuple:
        """Steps 6-7: (block, logprobs, kept supports or None) in batch order on every rank, the
        emitted tokens appended to the device history (unless a warm-up step)."""
        strategy = plan.sharding
        block, logprobs = strategy.after(res, plan, step)
        support = strategy.kept_support(res, plan, step)
        if append:
            m = plan.max_rows
            self.store.append(device_copy(plan, "slots", plan.slots, dev), block[:, :m], block[:, m], self._append[1])
        return block, logprobs, support

    def _step_inputs(self, draft_probs: Optional[torch.Tensor] = None) -> Step:
        return Step(self.store, self.vocab_size, self.col_start, self.col_end, self.comm, draft_probs,
                    self.inplace_logits)

    def _check_inputs(self, local_logits, plan, draft_probs) -> None:
        self._check_plan(plan)
        width = self.col_end - self.col_start
        fits = isinstance(local_logits, torch.Tensor) and local_logits.shape == (plan.num_rows, width)
        if not (fits and local_logits.is_floating_point()):      # the error names what is wrong
            check_logits(local_logits, plan.num_rows, width, "local_logits")
        if draft_probs is not None:      # full rows (TP = 1): a row that verifies a draft cannot be all zero
            full = self.tp_size == 1
            draft_rows = np.flatnonzero(plan.all_rows.draft_tokens >= 0) if full else None
            check_draft_probs(draft_probs, plan.num_rows, width, draft_rows=draft_rows, full_rows=full)

    def _prepare_state(self, dev: torch.device, plan: SamplingPlan) -> None:
        """The device bound (and its append kernel), the ranks agreeing on the plan, `auto`
        measured for a new feature class, the device tables current with room for the step."""
        self._bind_device(dev)
        if self._check is not None:
            self._agree(plan)
        if self.strategy == "auto" and self.tp_size > 1:    # first use of a feature class: measure it
            self.auto.ensure(features(self.store, plan.slots, plan.has_drafts), dev)
        store = self.store
        need = int((store.history.upper[plan.slots] + plan.rows_per_req).max()) if plan.num_reqs else 0
        store.sync(dev, need)

    def _bind_device(self, dev: torch.device) -> None:
        """The device the state lives on (the first logits' unless given) and its append kernel."""
        if self.device is None:
            self.device = dev
        if self._append is None or self._append[0] != dev:
            self._append = (dev, append_kernel(dev))

    def capture(self, plan: SamplingPlan, logits: torch.Tensor, *, reserve_tokens: int = 1024) -> CapturedStep:
        """Record a decode step of `sample` (no drafts, grammar mask or processed logprobs) for
        this plan and this logits buffer in a CUDA graph; `.replay()` then samples the buffer's
        current contents with the tokens and logprobs an eager `sample` gives (see
        `tpsample.replay`). reserve_tokens: history room per request for later replays."""
        return CapturedStep(self, plan, logits, reserve_tokens)

    def kernel_fallback_rows(self) -> int:
        """Rows sampled by the kernels on this sampler's device so far (every sampler of the
        device counts here) whose filter candidates did not fit or whose top-p bracket did not
        certify, so that they took the exact one-program-per-row search; reads the device (not
        for hot paths). Divide by the rows sampled for the rate."""
        from .kernels.launcher import fallback_counter
        return 0 if self.device is None else int(fallback_counter(self.device).item())

    def kernel_listed_rows(self) -> int:
        """Rows sampled by the kernels on this sampler's device so far (every sampler of the
        device counts here) whose top-p without top-k was settled from one list of columns (the
        fast case: the entries above a bound guessed from the row's block maxima hold the kept
        set). Reads the device (not for hot paths)."""
        from .kernels.launcher import listed_counter
        return 0 if self.device is None else int(listed_counter(self.device).item())

    def kernel_lean_rows(self) -> int:
        """Rows sampled by the kernels on this sampler's device so far (every sampler of the
        device counts here) whose top-p without top-k the list did not settle (a flat row that
        keeps more entries than the list holds) and that took the lean third pass: the few entries
        from the bracket up (at most about 2 x KernelConfig.cap), listed by one compare and
        resolved per row (rows keeping more entries take the collect pass).
        Reads the device (not for hot paths)."""
        from .kernels.launcher import lean_counter
        return 0 if self.device is None else int(lean_counter(self.device).item())

    def output_token_ids(self, req_id: str) -> list[int]:
        """The tokens a request has emitted so far (reads the device: not for hot paths)."""
        return self.store.slots.get(req_id).output_token_ids

    def _check_plan(self, plan) -> None:
        if not isinstance(plan, SamplingPlan):
            raise ValueError(f"plan must be a SamplingPlan from Sampler.plan, got {type(plan).__name__}")
        if plan.sampler_uid != self.uid:
            raise ValueError("plan was built by another Sampler; build it with this sampler's plan()")
        if plan.num_reqs and not self._current(plan):
            raise ValueError("plan is stale: a request it names was removed (or its slot reused) after "
                             "plan() was called; call plan() again")

    def _current(self, plan: SamplingPlan) -> bool:
        """No request the plan names was removed or replaced since plan() (one integer compare
        when the slot table did not change since this plan was last found current)."""
        version = self.store.slots.version
        if self._checked[0] is plan and self._checked[1] == version:
            return True
        ok = bool(np.array_equal(self.store.slots.generation[plan.slots], plan.generations))
        if ok:
            self._checked = (plan, version)
        return ok

    def _agree(self, plan: SamplingPlan) -> None:
        """Every rank must be sampling the same plan (same requests, order, drafts, strategy, and
        each request's params and prompt: the fingerprint covers the per-slot prints written at
        add_request); otherwise the collectives that follow would mismatch (a hang) or silently
        differ. Runs every step (a rank cannot know whether the others changed their plan), on
        the host. On a mismatch every rank raises a ValueError (no rank is left waiting), naming
        the first differing request and its fields when the batches line up (`parallel.agreement`)."""
        prints = self._check.all_gather(torch.tensor([plan.fingerprint], dtype=torch.int64)).view(-1).tolist()
        if len(set(prints)) != 1:
            raise ValueError(disagreement(self._check, plan, prints, self.store.slots))

    def _start_profile(self, dev):
        if not (self.profile_memory and dev.type == "cuda"):
            return None
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        return torch.cuda.memory_allocated(dev)

    def _end_profile(self, dev, base: int) -> int:
        torch.cuda.synchronize(dev)
        return torch.cuda.max_memory_allocated(dev) - base
