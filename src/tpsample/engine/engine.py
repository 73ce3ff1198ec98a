"""Engine: the step loop. Runs on rank 0; every other rank runs `follow`.

Contract
- Inputs: token-id prompts with `SamplingParams` (and optional `GuidedDecoding`), through
  `make_request` + `add_request`, then `step` until `has_unfinished()` is False; `abort` cancels
  a request between steps. `engine.core.EngineCore` drives this loop for every front end.
- Outputs: from `step`, (request, new token ids) for each request that sampled.
- Invariants: each step is planned once (scheduler, rank 0), sent unchanged to every rank
  (`StepChannel`), and executed by every rank's runner in the same order; a bad request raises
  ValueError before it touches the scheduler or any rank, so running requests are undisturbed;
  an aborted request's KV blocks and sampler slot (on every rank) are free when `abort` returns.
- Knows nothing about tokenization (grammars arrive as a ready `GrammarBackend`, stop strings are
  the front end's) or processes.
"""
from __future__ import annotations

import time

from tpsample.engine.request import EngineInfo, GuidedDecoding, Request, RunStats, TokenLogprob, TokenSupport
from tpsample.engine.runner import ModelRunner
from tpsample.engine.scheduler import Scheduler
from tpsample.engine.step import EndOfGenerate, Shutdown, StepChannel, StepInput
from tpsample.engine.structured import GrammarBackend
from tpsample.params import SamplingParams


def follow(runner: ModelRunner, channel: StepChannel):
    """Execute rank 0's steps until it sends Shutdown or EndOfGenerate; return that message."""
    while True:
        msg = channel.recv()
        if isinstance(msg, (Shutdown, EndOfGenerate)):
            return msg
        runner.execute(msg)


class Engine:
    def __init__(self, runner: ModelRunner, channel: StepChannel, *, grammar: GrammarBackend | None = None,
                 eos_token_ids: tuple[int, ...] = (), sampler_peaks: list[int] | None = None):
        self.cfg, self.runner, self.channel, self.grammar = runner.cfg, runner, channel, grammar
        self.vocab_size = runner.vocab_size
        eos = tuple(runner.model_config.eos_token_ids) + tuple(eos_token_ids)
        self.scheduler = Scheduler(self.cfg, num_blocks=runner.memory.num_blocks,
                                   max_model_len=runner.max_model_len, eos_token_ids=eos, grammar=grammar)
        self.info = EngineInfo(
            strategy=self.cfg.strategy, tensor_parallel_size=self.cfg.tensor_parallel_size,
            device=str(runner.device), dtype=str(runner.dtype).removeprefix("torch."),
            vocab_size=self.vocab_size, num_kv_blocks=runner.memory.num_blocks,
            block_size=self.cfg.block_size, kv_tokens=runner.memory.num_blocks * self.cfg.block_size,
            max_model_len=runner.max_model_len, max_num_seqs=self.cfg.max_num_seqs,
            sampler_peak_bytes=tuple(sampler_peaks or [runner.memory.sampler_peak_bytes]),
            weights_bytes=runner.memory.weights_bytes, kv_bytes_per_token=runner.memory.kv_bytes_per_token,
            attention=runner.attention_backend, cuda_graph_batch_sizes=runner.cuda_graph_batch_sizes)
        self.stats = RunStats()
        self._next_id = 0

    # -- requests -----------------------------------------------------------------------------
    def make_request(self, prompt_token_ids, params, guided: GuidedDecoding | None = None,
                     index: int = 0, req_id: str | None = None) -> Request:
        """A validated request (ValueError naming the problem); nothing is scheduled yet."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a tpsample.SamplingParams, got {type(params).__name__}")
        prompt = list(prompt_token_ids)
        bad = [t for t in prompt if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size]
        if not prompt or bad:
            raise ValueError(f"prompt {index}: prompt_token_ids must be a non-empty list of token ids "
                             f"in [0, {self.vocab_size}), got {bad[:5] if bad else 'an empty prompt'}")
        if len(prompt) >= self.runner.max_model_len:
            raise ValueError(f"prompt {index}: {len(prompt)} tokens leave no room under "
                             f"max_model_len={self.runner.max_model_len}")
        params = params.validate_for_vocab(self.vocab_size, self.cfg.max_logprobs)   # top_k >= V -> off
        matcher = None
        if guided is not None:
            if self.grammar is None:
                raise ValueError(f"prompt {index}: guided decoding needs a tokenizer in the model folder")
            matcher = self.grammar.matcher(guided)
        req = Request(req_id=req_id or f"req-{self._next_id}", index=index, prompt_token_ids=prompt, params=params,
                      guided=guided, matcher=matcher)
        req.logprobs = [] if params.logprobs is not None else None
        req.prompt_logprobs = [None] if params.prompt_logprobs is not None else None
        req.kept_support = [] if params.kept_support is not None else None
        self._next_id += 1
        return req

    def add_request(self, req: Request) -> None:
        req.arrival_s = time.monotonic()
        self.scheduler.add(req)
        self.stats.num_prompt_tokens += len(req.prompt_token_ids)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort(self, req: Request) -> bool:
        """Finish `req` with reason "abort" and free its blocks and slot now; False if it had finished."""
        if not self.scheduler.abort(req):
            return False
        self.flush()
        return True

    # -- the loop -----------------------------------------------------------------------------
    def step(self) -> list[tuple[Request, list[int]]]:
        start = time.perf_counter()
        step = self.scheduler.schedule()
        if not step.token_ids:
            raise RuntimeError("scheduler made no progress (no tokens scheduled); this is a bug")
        self.channel.send(step)
        result = self.runner.execute(step)
        self.stats.num_steps += 1
        prompt_logprobs = _token_logprobs(result.prompt_logprobs)
        out = result.sampled
        if out is None:
            return self.scheduler.update([], [], None, prompt_logprobs=prompt_logprobs)
        num_sampled = out.num_sampled.tolist()
        if step.draft_token_ids is not None:
            proposed = sum(len(d) for d in step.draft_token_ids)
            self.stats.num_drafts += sum(1 for d in step.draft_token_ids if d)
            self.stats.num_draft_tokens += proposed
            self.stats.num_accepted_drafts += proposed - int(out.num_rejected.sum())
        logprobs = _per_request(step, num_sampled, _token_logprobs(out.logprobs))
        supports = _per_request(step, num_sampled, _token_supports(out.kept_support))
        results = self.scheduler.update(out.sampled_token_ids.tolist(), num_sampled, logprobs, out.num_nans.tolist(),
                                        out.num_fallback.tolist(), prompt_logprobs, supports)
        self.stats.num_output_tokens += sum(len(new) for _, new in results)
        _stamp_tokens(results, time.monotonic())
        if len(step.token_ids) == len(step.seq_lens):     # a pure decode step: time it
            self.stats.add_decode_step(time.perf_counter() - start, sum(step.seq_lens))
        return results

    def flush(self) -> None:
        """Release the sampler slots of finished requests on every rank."""
        removed = self.scheduler.pending_removals()
        if removed:
            step = StepInput(remove=removed)
            self.channel.send(step)
            self.runner.execute(step)

    def take_stats(self) -> RunStats:
        """The counters since the last call (wall_s is the caller's to fill), then reset them."""
        stats, self.stats = self.stats, RunStats()
        stats.num_preemptions, stats.max_running = self.scheduler.num_preemptions, self.scheduler.max_running
        self.scheduler.num_preemptions = self.scheduler.max_running = 0
        return stats

    def resources(self) -> dict:
        """What is held right now: a finished, flushed engine holds no block and no slot."""
        sched = self.scheduler
        return {"num_kv_blocks": sched.blocks.num_blocks, "free_kv_blocks": sched.blocks.num_free,
                "running": len(sched.running), "waiting": len(sched.waiting),
                "sampler_slots_used": len(self.runner.sampler.slots.requests)}

    def shutdown(self) -> None:
        self.channel.send(Shutdown())


def _stamp_tokens(results: list[tuple[Request, list[int]]], now: float) -> None:
    for req, new in results:
        if new:
            if req.first_token_s is None:
                req.first_token_s = now
            req.last_token_s = now


def _token_logprobs(lps) -> list[TokenLogprob] | None:
    """A LogprobsOutput as one TokenLogprob per row (top-n padding dropped)."""
    if lps is None:
        return None
    ids, values, ranks = lps.token_ids.tolist(), lps.logprobs.tolist(), lps.ranks.tolist()
    out = []
    for r in range(len(ids)):
        top = [(t, lp) for t, lp in zip(ids[r][1:], values[r][1:]) if t >= 0]
        out.append(TokenLogprob(ids[r][0], values[r][0], ranks[r], tuple(t for t, _ in top),
                                tuple(lp for _, lp in top)))
    return out


def _token_supports(ks) -> list[TokenSupport] | None:
    """A KeptSupport as one TokenSupport per row (id padding dropped)."""
    if ks is None:
        return None
    ids, count, thr, upper = ks.token_ids.tolist(), ks.count.tolist(), ks.threshold.tolist(), ks.upper.tolist()
    return [TokenSupport(count[r], thr[r], upper[r], tuple(t for t in ids[r] if t >= 0)) for r in range(len(ids))]


def _per_request(step: StepInput, num_sampled: list[int], rows: list | None) -> list[list] | None:
    """Per sampled request, the rows of its emitted tokens (a request has 1 + len(drafts) rows)."""
    if rows is None:
        return None
    drafts = step.draft_token_ids or [[] for _ in step.sample_req_ids]
    result, first = [], 0
    for n, d in zip(num_sampled, drafts):
        result.append(rows[first:first + n])
        first += 1 + len(d)
    return result
