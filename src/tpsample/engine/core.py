"""EngineCore: the one engine loop that requests join while it runs, and its clients.

Contract
- Inputs: commands (`AddRequests`, `Abort`, `Report`), queued from any thread or process.
- Outputs: events (`Accepted`, `Rejected`, `TokenUpdate`, `Reported`), in the order they happen.
- Invariants: commands are applied between steps, never during one; an `AddRequests` batch is
  validated as a whole and either every request joins or none does (`Rejected` carries the
  ValueError); every request that joined gets exactly one `TokenUpdate` with a finish reason;
  once idle, the core flushes, so no sampler slot or KV block stays held. Any exception while
  admitting a batch rejects that batch (as a ValueError naming it); the loop goes on.
- Grammars compile off the loop: a batch with a grammar not compiled yet waits (parked) while
  its grammars compile in the grammar backend's threads and the loop keeps stepping the others;
  it is then admitted, or `Rejected` when a grammar fails or takes longer than the request's
  `grammar_timeout_s` (default `structured.COMPILE_TIMEOUT_S`). An `Abort` of a parked request
  rejects its batch.
- Where it runs: `LocalClient` drives it in the caller's process (TP=1, and rank 0 under
  torchrun); with spawned workers it runs inside rank 0 (`serve_core`) and `WorkerClient`
  talks to it over the worker pipe. Every client is polled from one thread; `submit` is
  thread-safe. Knows nothing about tokenization: stop strings are the front end's, which aborts.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from tpsample.engine.request import GuidedDecoding, Request, RequestTimings, RunStats, TokenLogprob
from tpsample.engine.structured import COMPILE_TIMEOUT_S, GrammarWaits

PARKED_POLL_S = 0.005           # how often an otherwise idle loop looks at the grammars compiling


@dataclass(frozen=True)
class NewRequest:
    req_id: str
    prompt_token_ids: list[int]
    params: object                          # tpsample.SamplingParams
    guided: GuidedDecoding | None = None
    index: int = 0                          # position in the caller's batch, for error messages
    grammar_timeout_s: float | None = None  # the most its grammar may take to compile (None: the default)


@dataclass(frozen=True)
class AddRequests:
    requests: tuple[NewRequest, ...]


@dataclass(frozen=True)
class Abort:
    req_ids: tuple[str, ...]


@dataclass(frozen=True)
class Report:
    """Ask for the run counters (reset after reading) and the resources held right now."""


@dataclass(frozen=True)
class Accepted:
    req_ids: tuple[str, ...]


@dataclass(frozen=True)
class Rejected:
    req_ids: tuple[str, ...]
    error: ValueError


@dataclass(frozen=True)
class TokenUpdate:
    req_id: str
    new_token_ids: list[int]
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None               # None while running
    stop_reason: int | None = None          # the stop token id that finished it
    stop_token: bool = False                # the last new token is the EOS / stop token that finished it
    num_nan_logits: int = 0                 # NaN values in the request's logits rows so far
    time_s: float = 0.0                     # time.monotonic() on rank 0 when these tokens were ready
    timings: RequestTimings | None = None   # with its first tokens and its finish: where its time went
    prompt_logprobs: list | None = None     # with its first tokens (or its finish): RequestOutput.prompt_logprobs
    kept_support: list | None = None        # TokenSupport per new token, when the request asked


@dataclass(frozen=True)
class Reported:
    stats: RunStats
    resources: dict = field(default_factory=dict)


class EngineCore:
    def __init__(self, engine):
        self.engine = engine
        self.live: dict[str, Request] = {}
        self.parked = GrammarWaits()             # batches whose grammars compile

    def apply(self, cmd) -> list:
        if isinstance(cmd, AddRequests):
            return [ev for ev in (self._add(cmd.requests),) if ev is not None]
        if isinstance(cmd, Abort):
            return [Rejected(_ids(b), ValueError("aborted while its grammar compiled"))
                    for b in self.parked.cancel(set(cmd.req_ids))] + \
                [self._abort(rid) for rid in cmd.req_ids if rid in self.live]
        if isinstance(cmd, Report):
            return [Reported(self.engine.take_stats(), self.engine.resources())]
        raise TypeError(f"unknown engine command {cmd!r}")

    def _add(self, new: tuple[NewRequest, ...], compiled: bool = False):
        """Accepted, Rejected, or None when the batch was parked until its grammars compile."""
        ids = _ids(new)
        try:
            parked = self.parked.req_ids()
            dup = [rid for rid in ids if rid in self.live or rid in parked] or \
                [rid for rid in ids if ids.count(rid) > 1]
            if dup:
                raise ValueError(f"request id {dup[0]!r} is already in use")
            if not compiled and self._park(new):
                return None
            reqs = [self.engine.make_request(r.prompt_token_ids, r.params, r.guided, r.index, r.req_id)
                    for r in new]
            self._join(reqs)
        except ValueError as e:
            return Rejected(ids, e)
        except Exception as e:              # a bug or an unchecked value: this batch fails, the loop goes on
            return Rejected(ids, ValueError(f"the request could not be admitted: {type(e).__name__}: {e}"))
        return Accepted(ids)

    def _join(self, reqs: list[Request]) -> None:
        """Add every request to the engine, or (when one fails) none: the ones added are aborted."""
        added = []
        try:
            for req in reqs:
                self.engine.add_request(req)
                added.append(req)
        except BaseException:
            for req in added:
                self.engine.abort(req)
            raise
        for req in reqs:
            self.live[req.req_id] = req

    def _park(self, new: tuple[NewRequest, ...]) -> bool:
        grammar = getattr(self.engine, "grammar", None)
        todo = [r for r in new if r.guided is not None and grammar is not None and not grammar.is_cached(r.guided)]
        if todo:
            self.parked.park(grammar, new, [r.guided for r in todo],
                             min(r.grammar_timeout_s or COMPILE_TIMEOUT_S for r in todo))
        return bool(todo)

    def _unpark(self) -> list:
        """Events of the parked batches whose grammars are done (admitted or failed) or too late."""
        return [self._add(batch, compiled=True) if error is None else Rejected(_ids(batch), error)
                for batch, error in self.parked.ready()]

    def _abort(self, req_id: str) -> TokenUpdate:
        req = self.live.pop(req_id)
        self.engine.abort(req)
        now = time.monotonic()
        return TokenUpdate(req_id, [], None, "abort", num_nan_logits=req.num_nan_logits, time_s=now,
                           timings=req.timings(now))

    def step(self) -> list[TokenUpdate]:
        updates = []
        results = self.engine.step()
        now = time.monotonic()
        for req, new in results:
            lps = req.logprobs[len(req.logprobs) - len(new):] if req.logprobs is not None and new else None
            ks = req.kept_support[len(req.kept_support) - len(new):] if req.kept_support is not None and new else None
            done = req.finish_reason is not None
            if done:
                del self.live[req.req_id]
            first = len(req.output_token_ids) == len(new)      # its first update: tokens or an early finish
            updates.append(TokenUpdate(
                req.req_id, list(new), lps, req.finish_reason, req.stop_reason,
                stop_token=done and req.finish_reason == "stop" and bool(new), num_nan_logits=req.num_nan_logits,
                time_s=now, timings=req.timings(now) if done or first else None,
                prompt_logprobs=req.prompt_logprobs if first else None, kept_support=ks))
        return updates

    def run_once(self, commands: list) -> list:
        """Admit the parked batches that are ready, apply the commands, then run one step if
        anything is unfinished, else flush."""
        events = self._unpark() if self.parked else []
        events += [ev for cmd in commands for ev in self.apply(cmd)]
        if self.engine.has_unfinished():
            events += self.step()
        if not self.engine.has_unfinished():
            self.engine.flush()
        return events


def _ids(batch: tuple[NewRequest, ...]) -> tuple[str, ...]:
    return tuple(r.req_id for r in batch)


class LocalClient:
    """The core in this process; `poll` runs it (one step) on the calling thread."""

    def __init__(self, engine):
        self.core = EngineCore(engine)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()

    def submit(self, cmd) -> None:
        self._inbox.put(cmd)

    def poll(self, timeout: float | None = None) -> list:
        """Events of one round; waits up to `timeout` for a command while the engine is idle."""
        cmds = []
        if not self.core.engine.has_unfinished() and self._inbox.empty() and timeout != 0:
            parked = bool(self.core.parked)
            try:
                cmds.append(self._inbox.get(timeout=min(timeout or PARKED_POLL_S, PARKED_POLL_S) if parked
                                            else timeout))
            except queue.Empty:
                if not parked:
                    return []
        while not self._inbox.empty():
            cmds.append(self._inbox.get_nowait())
        return self.core.run_once(cmds)


def serve_core(engine, conn) -> None:
    """Rank 0 of spawned workers: run the core on commands from the pipe until "shutdown".
    While busy (or a grammar compiles), every round sends its events (possibly none: a sign of
    progress); idle, it sends nothing and waits for the next command."""
    core, pending = EngineCore(engine), []
    while True:
        busy = engine.has_unfinished() or bool(pending)
        if conn.poll(0 if busy else PARKED_POLL_S if core.parked else None):
            while conn.poll(0):
                msg = conn.recv()
                if msg[0] == "shutdown":
                    engine.shutdown()
                    return
                pending.append(msg[1])
        events = core.run_once(pending)
        pending = []
        conn.send(("events", events))


class WorkerClient:
    """The parent side of `serve_core`: commands down the rank-0 pipe, events back.

    It knows when rank 0 owes it an answer (a request running, a command unanswered): then a
    silence longer than `step_timeout_s` is a hung worker; otherwise silence just means idle.
    """

    def __init__(self, backend):
        self.backend = backend
        self._lock = threading.Lock()
        self._awaiting = 0                  # AddRequests / Report commands not answered yet
        self._live: set[str] = set()

    def submit(self, cmd) -> None:
        if self.backend._closed:
            raise RuntimeError("tpsample engine is stopped")
        with self._lock:
            self._awaiting += isinstance(cmd, (AddRequests, Report))
            self.backend.conns[0].send(("core", cmd))

    def poll(self, timeout: float | None = None) -> list:
        """The next batch of events, or [] after `timeout` when idle; a dead or hung worker raises."""
        b = self.backend
        if b._closed:
            raise RuntimeError("tpsample engine is stopped")
        with self._lock:
            busy = self._awaiting > 0 or bool(self._live)
        if not busy and not b._inbox[0] and not wait(b.conns + [p.sentinel for p in b.procs], timeout):
            return []
        msg = b._receive(0, b.cfg.step_timeout_s, "serving")
        events = msg[1] if msg[0] == "events" else []
        with self._lock:
            for ev in events:
                self._awaiting -= isinstance(ev, (Accepted, Rejected, Reported))
                if isinstance(ev, Accepted):
                    self._live.update(ev.req_ids)
                elif isinstance(ev, TokenUpdate) and ev.finish_reason is not None:
                    self._live.discard(ev.req_id)
        return events
