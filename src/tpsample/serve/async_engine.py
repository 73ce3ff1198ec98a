"""AsyncEngine: HTTP requests join the one running engine loop.

Contract
- One thread polls the engine client (`LLM.engine_client()`: the core in this process at TP=1,
  in rank 0 of the workers at TP>1) and hands its events to the asyncio loop; every request is
  a `TrackedRequest` per choice (text, stop strings, logprobs) fed from a per-request queue.
- `generate` yields (choice, StreamDelta) as tokens arrive. Whatever way it ends (finished, a
  stop string, the client disconnecting, cancellation), the choices still running are aborted,
  which frees their sampler slots and KV blocks at once.
- Admission: at most `max_pending` choices in flight, else `Overloaded` (429); a request of
  more choices than that could never run and is a ValueError (400). A stopped, failed or
  draining engine raises `EngineStopped` (503). A request the engine rejects raises its
  ValueError (400). Never blocks the event loop on the engine.
- Every choice's end is counted in `metrics` with the finish reason its client got ("abort"
  for one still running when its generator closes: the client left, or the server stopped it),
  with its tokens and the engine's time stamps; `report` passes the engine's counters there too.
- `drain(reason)` (server shutdown): no new request is admitted and every open one ends at once
  with `EngineStopped(reason)`. An engine that fails calls `on_failure(error)` (the server exits).
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid

from tpsample.engine.core import Abort, Accepted, AddRequests, NewRequest, Rejected, Report, Reported, TokenUpdate
from tpsample.engine.frontend import TrackedRequest
from tpsample.serve.metrics import ServeMetrics


class Overloaded(Exception):
    """Too many requests in flight: the client should retry later (429)."""


class EngineStopped(Exception):
    """The engine is not running (503)."""


class _Failed:
    def __init__(self, error: BaseException | str):
        self.error = error


def _without_tokens(ev: TokenUpdate) -> TokenUpdate:
    """The update with its tokens dropped (a finish is "length": the caller asked for none)."""
    return dataclasses.replace(ev, new_token_ids=[], logprobs=None, stop_reason=None, stop_token=False,
                               finish_reason=None if ev.finish_reason is None else "length")


class AsyncEngine:
    def __init__(self, llm, *, max_pending: int | None = None, grammar_timeout_s: float | None = None,
                 metrics: ServeMetrics | None = None):
        self.llm, self.tokenizer, self.info = llm, llm.tokenizer, llm.info
        self.metrics = metrics or ServeMetrics(llm.config.model)
        self.client = llm.engine_client()
        self.max_pending = max_pending or 4 * llm.info.max_num_seqs
        self.grammar_timeout_s = grammar_timeout_s
        self.on_failure = None                      # called with the error once the engine failed
        self.draining: str | None = None            # why no request is admitted any more
        self.num_pending = 0
        self._queues: dict[str, asyncio.Queue] = {}
        self._reports: list[asyncio.Future] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    # -- the polling thread -------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._poll_forever, name="tpsample-engine", daemon=True)
        self._thread.start()

    def _poll_forever(self) -> None:
        try:
            while not self._stop.is_set():
                events = self.client.poll(timeout=0.05)
                if events:
                    self._loop.call_soon_threadsafe(self._dispatch, events)
        except BaseException as e:          # a dead worker, a bug: fail every waiting request
            self.error = e
            self._loop.call_soon_threadsafe(self._failed, e)

    def _failed(self, error: BaseException) -> None:
        self._fail_all(error)
        if self.on_failure is not None:
            self.on_failure(error)

    def _dispatch(self, events: list) -> None:
        for ev in events:
            if isinstance(ev, Reported):
                if self._reports:
                    self._reports.pop(0).set_result(ev)
                continue
            ids = ev.req_ids if isinstance(ev, (Accepted, Rejected)) else (ev.req_id,)
            q = self._queues.get(ids[0])
            if q is not None:
                q.put_nowait(ev)

    def _fail_all(self, error: BaseException) -> None:
        for q in set(self._queues.values()):
            q.put_nowait(_Failed(error))
        for f in self._reports:
            f.set_exception(EngineStopped(f"engine stopped: {error}"))
        self._reports.clear()

    def drain(self, reason: str) -> None:
        """Admit nothing more and end every open request with EngineStopped(reason)."""
        self.draining = reason
        for q in set(self._queues.values()):
            q.put_nowait(_Failed(reason))

    def drain_soon(self, reason: str) -> None:
        """`drain` from any thread or a signal handler."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.drain, reason)

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self.error is None and not self._stop.is_set() and self._thread is not None \
            and self._thread.is_alive()

    # -- requests -----------------------------------------------------------------------------
    def _admit(self, n: int) -> None:
        if not self.alive:
            raise EngineStopped("the engine is not running" + (f": {self.error}" if self.error else ""))
        if self.draining:
            raise EngineStopped(self.draining)
        if n > self.max_pending:
            raise ValueError(f"n must be at most {self.max_pending}, this server's limit of choices in flight "
                             f"(--max-pending), got {n}")
        if self.num_pending + n > self.max_pending:
            raise Overloaded(f"{self.num_pending} requests are in flight (limit {self.max_pending}); retry later")

    async def generate(self, prompt_token_ids: list[int], params: list, guided=None, prompt: str | None = None, *,
                       echo_only: bool = False, skip_special_tokens: bool = True):
        """Async iterator of (TrackedRequest, StreamDelta), one TrackedRequest per choice; first
        (None, None) once the engine accepted the request (a rejection raises its ValueError).
        echo_only: the caller wants the prompt alone (echo with max_tokens 0; params ask for one
        token): the token sampled is dropped, never delivered or counted, and the choice ends
        with "length"."""
        arrival_s = time.monotonic()
        self._admit(len(params))
        base = uuid.uuid4().hex
        tracked = [TrackedRequest(f"{base}-{i}", i, prompt_token_ids, p, self.tokenizer, prompt,
                                  skip_special_tokens=skip_special_tokens)
                   for i, p in enumerate(params)]
        by_id = {t.req_id: t for t in tracked}
        queue: asyncio.Queue = asyncio.Queue()
        for rid in by_id:
            self._queues[rid] = queue
        self.num_pending += len(tracked)
        clock = None
        try:
            self._submit(AddRequests(tuple(NewRequest(t.req_id, t.prompt_token_ids, t.params, guided, t.index,
                                                      grammar_timeout_s=self.grammar_timeout_s)
                                           for t in tracked)))
            while not all(t.finished for t in tracked):
                ev = await queue.get()
                if isinstance(ev, _Failed):
                    raise EngineStopped(ev.error if isinstance(ev.error, str) else f"engine stopped: {ev.error}")
                if isinstance(ev, Rejected):
                    raise ev.error
                if isinstance(ev, Accepted):
                    clock = self.metrics.request(len(prompt_token_ids), arrival_s)
                    yield None, None
                if isinstance(ev, TokenUpdate):
                    if echo_only:
                        ev = _without_tokens(ev)
                    t = by_id[ev.req_id]
                    was_running = not t.finished
                    delta, abort = t.apply(ev)
                    if abort:
                        self._submit(Abort((ev.req_id,)))
                    if delta is not None:
                        clock.tokens(t.index, len(delta.new_token_ids), ev)
                    if was_running and t.finished:
                        clock.finished(t.index, t.finish_reason, ev)
                    if delta is not None:
                        yield t, delta
        finally:
            running = tuple(t.req_id for t in tracked if not t.finished)
            if clock is not None:
                for t in tracked:
                    if not t.finished:
                        clock.finished(t.index, "abort")
            if running and self.alive:
                self._submit(Abort(running))
            for rid in by_id:
                self._queues.pop(rid, None)
            self.num_pending -= len(tracked)

    def _submit(self, cmd) -> None:
        try:
            self.client.submit(cmd)
        except (RuntimeError, OSError) as e:        # the workers are gone
            raise EngineStopped(f"engine stopped: {e}") from None

    async def report(self):
        """The engine's `Reported`: what it holds now (KV blocks, sampler slots, running and
        waiting requests) and its counters since the last report (also added to `metrics`)."""
        if not self.alive:
            raise EngineStopped("the engine is not running")
        fut = self._loop.create_future()
        self._reports.append(fut)
        self._submit(Report())
        reported = await fut
        self.metrics.observe_report(reported.stats, reported.resources)
        return reported
