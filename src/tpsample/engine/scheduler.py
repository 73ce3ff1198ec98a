"""Scheduler: continuous batching under a token budget, with preemption by recompute.

Contract
- Inputs: requests (`add`, `abort`), then per step `schedule()` -> `StepInput` and, once the step
  ran, `update(sampled_token_ids, num_sampled, logprobs, num_nans, num_fallback)` with the
  sampler's output (batch order).
- Outputs: `StepInput`s (plain data sent to every rank) and, from `update`, the tokens each
  request gained this step.
- Invariants: one scheduler, on rank 0; a request holds KV blocks only while running; prefill and
  decode share one budget of `token_budget` tokens (drafts included); when blocks run out, the
  latest-admitted running request is preempted (its blocks freed, its tokens kept) and goes back
  to the front of the queue to be recomputed: no request is ever dropped. A preempted request
  keeps its sampler slot, so its penalty history and positions carry on and (with seeded,
  position-keyed noise) it produces the tokens it would have produced without preemption.
  The sampler holds at most `max_num_seqs` requests; slots are freed through `StepInput.remove`.
  An aborted request frees its blocks at once and its slot with the next removal; a step whose
  rows were NaN and left nothing to sample ends the request with finish reason "error".
- Never imports torch.distributed, the model, or the sampler: it only plans.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import replace

from tpsample.engine.blocks import BlockManager
from tpsample.engine.config import EngineConfig
from tpsample.engine.ngram import NgramProposer
from tpsample.engine.request import Request, Status, TokenLogprob
from tpsample.engine.step import StepInput
from tpsample.engine.structured import GrammarBackend, valid_draft_prefix


class Scheduler:
    def __init__(self, cfg: EngineConfig, *, num_blocks: int, max_model_len: int,
                 eos_token_ids: tuple[int, ...], grammar: GrammarBackend | None = None):
        self.cfg, self.max_model_len, self.grammar = cfg, max_model_len, grammar
        self.eos_token_ids = frozenset(eos_token_ids)
        self.blocks = BlockManager(num_blocks, cfg.block_size)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._to_remove: list[str] = []
        self._num_in_sampler = 0
        self._scheduled: list[tuple[Request, int, list[int]]] = []
        self._prompt_rows: list[tuple[Request, int]] = []   # this step's prompt-logprob rows, per request
        self._pages_sent: dict[str, int] = {}      # req_id -> pages every rank's table holds
        spec = cfg.speculative_ngram
        self._ngram = None if spec is None else NgramProposer(min_n=spec.min_n, max_n=spec.max_n)
        self.num_preemptions = 0
        self.max_running = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, req: Request) -> bool:
        """Finish `req` now with reason "abort" (between steps only); False if already finished."""
        if req.status == Status.FINISHED:
            return False
        self._finish(req, "abort")
        return True

    def pending_removals(self) -> tuple[str, ...]:
        removed, self._to_remove = tuple(self._to_remove), []
        return removed

    # -- planning -----------------------------------------------------------------------------
    def schedule(self) -> StepInput:
        budget = self.cfg.token_budget
        scheduled, preempted = self._schedule_running(budget)
        budget -= sum(n + len(d) for _, n, d in scheduled)
        added: list[tuple[str, object, list[int]]] = []
        if not preempted:
            scheduled += self._schedule_waiting(budget, added)
        self._scheduled = scheduled
        self.max_running = max(self.max_running, len(self.running))
        return self._build_step(scheduled, added)

    def _schedule_running(self, budget: int) -> tuple[list, bool]:
        scheduled, preempted, i = [], False, 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            samples = req.num_computed_tokens + num_new == req.num_tokens
            drafts = self._drafts(req, budget - num_new) if samples else []
            need = req.num_computed_tokens + num_new + len(drafts)
            while not self.blocks.can_grow(req.block_ids, need):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    return scheduled, preempted
            self.blocks.grow(req.block_ids, need)
            scheduled.append((req, num_new, drafts))
            budget -= num_new + len(drafts)
            i += 1
        return scheduled, preempted

    def _schedule_waiting(self, budget: int, added: list) -> list:
        scheduled = []
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            req = self.waiting[0]
            if not req.in_sampler and self._num_in_sampler >= self.cfg.max_num_seqs:
                break
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self.blocks.can_grow(req.block_ids, req.num_computed_tokens + num_new):
                break
            self.blocks.grow(req.block_ids, req.num_computed_tokens + num_new)
            self.waiting.popleft()
            req.status = Status.RUNNING
            if req.scheduled_s is None:
                req.scheduled_s = time.monotonic()
            self.running.append(req)
            if not req.in_sampler:
                added.append((req.req_id, req.params, list(req.prompt_token_ids)))
                req.in_sampler = True
                self._num_in_sampler += 1
            scheduled.append((req, num_new, []))
            budget -= num_new
        return scheduled

    def _preempt(self, req: Request) -> None:
        self.blocks.free(req.block_ids)
        self._pages_sent[req.req_id] = 0           # its next pages restart the table
        req.num_computed_tokens = 0
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _drafts(self, req: Request, budget: int) -> list[int]:
        spec = self.cfg.speculative_ngram
        if spec is None:
            return []
        limit = min(req.max_total_tokens, self.max_model_len) - req.num_tokens - 1
        k = min(spec.num_speculative_tokens, limit, budget)
        drafts = self._ngram.propose(req.req_id, req.prompt_token_ids, req.output_token_ids, k)
        if drafts and req.matcher is not None:
            drafts = valid_draft_prefix(req.matcher, drafts)
        return drafts

    def _build_step(self, scheduled: list, added: list) -> StepInput:
        tokens, q_lens, s_lens, seq_ids, updates = [], [], [], [], []
        sample_ids, drafts_all, rows, row_reqs = [], [], [], []
        prompt_index, prompt_targets, self._prompt_rows = [], [], []
        for req, num_new, drafts in scheduled:
            start = req.num_computed_tokens
            first_token = len(tokens)
            positions = _prompt_logprob_positions(req, start, num_new)
            if positions:
                prompt_index += [first_token + p - start for p in positions]
                prompt_targets += [req.prompt_token_ids[p + 1] for p in positions]
                self._prompt_rows.append((req, len(positions)))
            tokens += _token_slice(req, start, start + num_new) + drafts
            q_lens.append(num_new + len(drafts))
            s_lens.append(start + num_new + len(drafts))
            seq_ids.append(req.req_id)
            sent = self._pages_sent.get(req.req_id, 0)
            if len(req.block_ids) > sent:
                updates.append((req.req_id, sent, tuple(req.block_ids[sent:])))
                self._pages_sent[req.req_id] = len(req.block_ids)
            if start + num_new == req.num_tokens:
                sample_ids.append(req.req_id)
                drafts_all.append(list(drafts))
                rows += range(first_token + num_new - 1, first_token + num_new + len(drafts))
                row_reqs.append((req, drafts))
        return StepInput(
            remove=self.pending_removals(), add=tuple(added), block_updates=tuple(updates),
            seq_req_ids=tuple(seq_ids), token_ids=tokens, query_lens=q_lens, seq_lens=s_lens,
            sample_req_ids=sample_ids, draft_token_ids=drafts_all if any(drafts_all) else None,
            logits_token_index=rows, grammar_bitmask=self._bitmask(row_reqs, len(rows)),
            prompt_logprob_index=prompt_index, prompt_logprob_token_ids=prompt_targets,
            num_prompt_logprobs=max((r.params.prompt_logprobs for r, _ in self._prompt_rows), default=0))

    def _bitmask(self, row_reqs: list, num_rows: int):
        if self.grammar is None or not any(req.matcher is not None for req, _ in row_reqs):
            return None
        bitmask = self.grammar.empty_bitmask(num_rows)
        row = 0
        for req, drafts in row_reqs:
            if req.matcher is not None:
                self.grammar.fill_rows(req.matcher, drafts, bitmask, row)
            row += 1 + len(drafts)
        return bitmask

    # -- results ------------------------------------------------------------------------------
    def update(self, sampled: list[list[int]], num_sampled: list[int],
               logprobs: list[list[TokenLogprob]] | None, num_nans: list[int] | None = None,
               num_fallback: list[int] | None = None, prompt_logprobs: list[TokenLogprob] | None = None,
               kept_support: list | None = None) -> list[tuple[Request, list[int]]]:
        """Advance every scheduled request; return (request, new tokens) for those that sampled.
        prompt_logprobs: the step's prompt-logprob rows, in `StepInput.prompt_logprob_index` order."""
        self._add_prompt_logprobs(prompt_logprobs or [])
        results, i = [], 0
        for req, num_new, drafts in self._scheduled:
            req.num_computed_tokens += num_new
            if req.num_computed_tokens != req.num_tokens:
                continue                                   # a prefill chunk: nothing sampled
            n = num_sampled[i]
            req.num_computed_tokens += n - 1               # accepted drafts now have valid K/V
            nans = num_nans[i] if num_nans is not None else 0
            req.num_nan_logits += nans
            if nans and num_fallback is not None and num_fallback[i]:
                self._finish(req, "error")                 # NaN rows left nothing to sample from
                results.append((req, []))
                i += 1
                continue
            new = self._append(req, sampled[i][:n], None if logprobs is None else logprobs[i],
                               None if kept_support is None else kept_support[i])
            results.append((req, new))
            i += 1
        self._scheduled = []
        return results

    def _add_prompt_logprobs(self, rows: list[TokenLogprob]) -> None:
        first = 0
        for req, n in self._prompt_rows:
            req.prompt_logprobs += [_top(lp, req.params.prompt_logprobs) for lp in rows[first:first + n]]
            first += n
        self._prompt_rows = []

    def _append(self, req: Request, tokens: list[int], logprobs, supports=None) -> list[int]:
        new = []
        for j, token in enumerate(tokens):
            if req.matcher is not None and not req.matcher.is_terminated() and not req.matcher.accept_token(token):
                # the sampler's guard gives the best token the grammar allows; a token the matcher
                # still refuses means the grammar allows nothing here: end the request, token dropped
                self._finish(req, "error")
                break
            req.output_token_ids.append(token)
            new.append(token)
            if req.logprobs is not None and logprobs is not None:
                req.logprobs.append(_top(logprobs[j], req.params.logprobs))
            if req.kept_support is not None and supports is not None:
                req.kept_support.append(replace(supports[j], token_ids=supports[j].token_ids[:req.params.kept_support]))
            reason = self._finish_reason(req, token)
            if reason is not None:
                self._finish(req, reason)
                break
        return new

    def _finish_reason(self, req: Request, token: int) -> str | None:
        p, num_out = req.params, len(req.output_token_ids)
        if req.matcher is not None and req.matcher.is_terminated():
            return "stop"                                  # a complete grammar ends it, min_tokens or not
        if num_out >= p.min_tokens:
            if token in (p.stop_token_ids or ()):
                req.stop_reason = token                    # vLLM: the stop token id; None for EOS
                return "stop"
            if not p.ignore_eos and token in self.eos_token_ids:
                return "stop"
        if num_out >= p.max_tokens or req.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _finish(self, req: Request, reason: str) -> None:
        (self.waiting if req.status == Status.WAITING else self.running).remove(req)
        req.finish_reason, req.status = reason, Status.FINISHED
        self.blocks.free(req.block_ids)
        if req.in_sampler:                                 # a request never run holds no slot
            self._to_remove.append(req.req_id)
            self._num_in_sampler -= 1
        self._pages_sent.pop(req.req_id, None)
        if self._ngram is not None:
            self._ngram.drop(req.req_id)


def _top(lp: TokenLogprob, n: int) -> TokenLogprob:
    """lp with its top-n alternatives only: the batch's widest request sets the width, others trim."""
    return replace(lp, top_token_ids=lp.top_token_ids[:n], top_logprobs=lp.top_logprobs[:n])


def _prompt_logprob_positions(req: Request, start: int, num_new: int) -> range:
    """Positions p in this chunk whose hidden state gives the logprob of prompt token p + 1 and
    whose logprob is not known yet (a request recomputed after preemption asks for none again)."""
    if req.prompt_logprobs is None:
        return range(0)
    return range(max(start, len(req.prompt_logprobs) - 1), min(start + num_new, len(req.prompt_token_ids) - 1))


def _token_slice(req: Request, start: int, end: int) -> list[int]:
    """req.all_token_ids()[start:end] without building the whole history (decode takes one)."""
    num_prompt = len(req.prompt_token_ids)
    if start >= num_prompt:
        return req.output_token_ids[start - num_prompt:end - num_prompt]
    return req.prompt_token_ids[start:end] + req.output_token_ids[:max(0, end - num_prompt)]
