"""The Sampler facade: the public API of DESIGN.md section 4.

Contract:
- in: requests (`add_request` / `remove_request`), a `plan` per step built from replicated
  inputs, and this rank's local logits `[rows, V_r]` in `plan.logits_order`.
- out: a `SamplerOutput` identical on every rank, in batch order. `sample` appends the emitted
  tokens to each request's history (penalties, positions, min_tokens, bad words).
- invariants: slot allocation and request seeds are identical on every rank without talking
  (the base seed is agreed once, at construction); bad input raises `ValueError` naming the
  field and the allowed range before any collective runs; never returns an out-of-range id.
- never imports `model` or `engine`. Strategy differences live in `parallel/`, not here.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

import torch

from .parallel import auto
from .parallel.batch_sharded import BatchSharded
from .parallel.collectives import Collectives
from .parallel.common import StepContext
from .parallel.group import DEFAULT_TIMEOUT_S, TPGroup
from .parallel.plan import SamplingPlan, build_plan
from .parallel.replicated import Replicated
from .parallel.shard import vocab_shard
from .parallel.vocab_parallel import VocabParallel
from .sampling.output import SamplerOutput
from .sampling.params import SamplingParams
from .sampling.state import SlotTable, derive_seed
from .validation import (check_bitmask, check_draft_probs, check_drafts, check_logits, check_prompt,
                         check_req_ids, is_token)

STRATEGIES = {s.name: s for s in (Replicated(), BatchSharded(), VocabParallel())}
STRATEGY_NAMES = ("auto", *STRATEGIES)


@dataclass(frozen=True)
class StepStats:
    strategy: str
    bytes_sent: int           # this rank, this step
    bytes_received: int
    num_collectives: int
    peak_bytes: int           # sampler memory above its inputs (CUDA: allocator peak; CPU: counted)
    local_logits_bytes: int


class Sampler:
    def __init__(self, vocab_size: int, *, max_num_reqs: int = 256, max_num_logits_per_req: int = 1,
                 strategy: str = "auto", group=None, device=None, max_logprobs: int = 20,
                 eos_token_id: Optional[int] = None, seed: Optional[int] = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, inplace_logits: bool = False):
        """inplace_logits: let `sample` use fp32 local logits as its working buffer (saves a copy
        of the shard; the tensor then holds processed values). seed: the base of request seeds
        (drawn and agreed across ranks once, here, when None). timeout_s: per collective."""
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
        if strategy not in STRATEGY_NAMES:
            raise ValueError(f"strategy must be one of {STRATEGY_NAMES}, got {strategy!r}")
        if not isinstance(max_num_logits_per_req, int) or max_num_logits_per_req < 1:
            raise ValueError(f"max_num_logits_per_req must be an integer >= 1, got {max_num_logits_per_req!r}")
        if not isinstance(max_logprobs, int) or max_logprobs < 0:
            raise ValueError(f"max_logprobs must be an integer >= 0, got {max_logprobs!r}")
        if not isinstance(max_num_reqs, int) or isinstance(max_num_reqs, bool) or max_num_reqs < 1:
            raise ValueError(f"max_num_reqs must be an integer >= 1, got {max_num_reqs!r}")
        if eos_token_id is not None and not is_token(eos_token_id, vocab_size):
            raise ValueError(f"eos_token_id must be in [0, {vocab_size}), got {eos_token_id}")
        self.vocab_size = vocab_size
        self.max_num_logits_per_req = max_num_logits_per_req
        self.strategy = strategy
        self.max_logprobs = max_logprobs
        self.eos_token_id = eos_token_id
        self.inplace_logits = inplace_logits
        self.device = torch.device(device) if device is not None else None
        self.group = TPGroup.resolve(group, timeout_s)
        self.comm = Collectives(self.group)
        self.col_start, self.col_end = vocab_shard(vocab_size, self.group.size, self.group.rank)
        self.slots = SlotTable(max_num_reqs)
        base = seed if seed is not None else random.SystemRandom().getrandbits(62)
        self.base_seed = self.comm.broadcast_int(base) if seed is None else seed
        self._serial = 0
        self.last_stats: Optional[StepStats] = None

    @property
    def tp_size(self) -> int:
        return self.group.size

    @property
    def rank(self) -> int:
        return self.group.rank

    def add_request(self, req_id: str, params: SamplingParams, prompt_token_ids: list[int]) -> int:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        params.validate_for_vocab(self.vocab_size, self.max_logprobs)
        check_prompt(prompt_token_ids, self.vocab_size)
        seed = params.seed if params.seed is not None else derive_seed(self.base_seed, req_id, self._serial)
        self._serial += 1
        return self.slots.add(req_id, params, list(prompt_token_ids), seed).slot

    def remove_request(self, req_id: str) -> None:
        self.slots.remove(req_id)

    def plan(self, req_ids: list[str], *, draft_token_ids=None, grammar_bitmask=None,
             strategy: Optional[str] = None) -> SamplingPlan:
        req_ids = check_req_ids(req_ids)
        states = [self.slots.get(r) for r in req_ids]
        drafts = check_drafts(draft_token_ids, len(req_ids), self.vocab_size, self.max_num_logits_per_req)
        num_rows = sum(1 + len(d) for d in drafts)
        bitmask = check_bitmask(grammar_bitmask, num_rows, self.vocab_size)
        n_lp = [s.params.logprobs for s in states if s.params.logprobs is not None]
        width = 1 + max(n_lp) if n_lp else 0
        chosen = self._choose(strategy or self.strategy, states, num_rows, width > 0)
        return build_plan(chosen, self.tp_size, req_ids, [s.slot for s in states], drafts, width, bitmask)

    def _choose(self, strategy: str, states, num_rows: int, logprobs: bool) -> str:
        if strategy != "auto":
            if strategy not in STRATEGIES:
                raise ValueError(f"strategy must be one of {STRATEGY_NAMES}, got {strategy!r}")
            return strategy
        tp = self.tp_size
        per_owner = [0] * tp
        for s in states:
            per_owner[s.slot % tp] += 1
        p = [s.params for s in states]
        return auto.choose(num_rows, self.vocab_size, tp, max(per_owner, default=0) * self.max_num_logits_per_req,
                           top_k=any(x.top_k > 0 for x in p), top_p=any(x.top_p < 1 for x in p),
                           min_p=any(x.min_p > 0 for x in p), logprobs=logprobs,
                           on_gpu=self.device is not None and self.device.type == "cuda")

    def sample(self, local_logits: torch.Tensor, plan: SamplingPlan, *,
               draft_probs: Optional[torch.Tensor] = None) -> SamplerOutput:
        states = [self.slots.get(r) for r in plan.req_ids]
        width = self.col_end - self.col_start
        check_logits(local_logits, plan.num_rows, width, "local_logits")
        if draft_probs is not None:
            check_draft_probs(draft_probs, plan.num_rows, width)
        comm = Collectives(self.group)
        ctx = StepContext(states, self.vocab_size, self.col_start, self.col_end, self.eos_token_id, comm,
                          draft_probs=draft_probs, inplace=self.inplace_logits)
        on_cuda = local_logits.is_cuda
        if on_cuda:
            torch.cuda.synchronize(local_logits.device)
            torch.cuda.reset_peak_memory_stats(local_logits.device)
            base = torch.cuda.memory_allocated(local_logits.device)
        out = STRATEGIES[plan.strategy].sample(local_logits, plan, ctx)
        peak = (torch.cuda.max_memory_allocated(local_logits.device) - base) if on_cuda else ctx.meter.peak
        for i, state in enumerate(states):
            state.output_token_ids.extend(out.tokens(i))
        self.last_stats = StepStats(plan.strategy, comm.stats.bytes_sent, comm.stats.bytes_received,
                                    comm.stats.num_collectives, int(peak),
                                    local_logits.numel() * local_logits.element_size())
        return out
