"""EngineCore: the one engine loop that requests join while it runs, and its clients.

Contract
- Inputs: commands (`AddRequests`, `Abort`, `Report`), queued from any thread or process.
- Outputs: events (`Accepted`, `Rejected`, `TokenUpdate`, `Reported`), in the order they happen.
- Invariants: commands are applied between steps, never during one; an `AddRequests` batch is
  validated as a whole and either every request joins or none does (`Rejected` carries the
  ValueError); every request that joined gets exactly one `TokenUpdate` with a finish reason;
  once idle, the core flushes, so no sampler slot or KV block stays held.
- Where it runs: `LocalClient` drives it in the caller's process (TP=1, and rank 0 under
  torchrun); with spawned workers it runs inside rank 0 (`serve_core`) and `WorkerClient`
  talks to it over the worker pipe. Every client is polled from one thread; `submit` is
  thread-safe. Knows nothing about tokenization: stop strings are the front end's, which aborts.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from tpsample.engine.report import RunStats
from tpsample.engine.request import GuidedDecoding, Request, TokenLogprob


@dataclass(frozen=True)
class NewRequest:
    req_id: str
    prompt_token_ids: list[int]
    params: object                          # tpsample.SamplingParams
    guided: GuidedDecoding | None = None
    index: int = 0                          # position in the caller's batch, for error messages


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


@dataclass(frozen=True)
class Reported:
    stats: RunStats
    resources: dict = field(default_factory=dict)
    finished: dict = field(default_factory=dict)    # requests finished so far, by finish reason


class EngineCore:
    def __init__(self, engine):
        self.engine = engine
        self.live: dict[str, Request] = {}
        self.finished: dict[str, int] = {}

    def apply(self, cmd) -> list:
        if isinstance(cmd, AddRequests):
            return [self._add(cmd.requests)]
        if isinstance(cmd, Abort):
            return [self._abort(rid) for rid in cmd.req_ids if rid in self.live]
        if isinstance(cmd, Report):
            return [Reported(self.engine.take_stats(), self.engine.resources(), dict(self.finished))]
        raise TypeError(f"unknown engine command {cmd!r}")

    def _add(self, new: tuple[NewRequest, ...]):
        ids = tuple(r.req_id for r in new)
        try:
            dup = [rid for rid in ids if rid in self.live] or [rid for rid in ids if ids.count(rid) > 1]
            if dup:
                raise ValueError(f"request id {dup[0]!r} is already in use")
            reqs = [self.engine.make_request(r.prompt_token_ids, r.params, r.guided, r.index, r.req_id)
                    for r in new]
        except ValueError as e:
            return Rejected(ids, e)
        for req in reqs:
            self.engine.add_request(req)
            self.live[req.req_id] = req
        return Accepted(ids)

    def _abort(self, req_id: str) -> TokenUpdate:
        req = self.live.pop(req_id)
        self.engine.abort(req)
        self.finished["abort"] = self.finished.get("abort", 0) + 1
        return TokenUpdate(req_id, [], None, "abort", num_nan_logits=req.num_nan_logits)

    def step(self) -> list[TokenUpdate]:
        updates = []
        for req, new in self.engine.step():
            lps = req.logprobs[len(req.logprobs) - len(new):] if req.logprobs is not None and new else None
            done = req.finish_reason is not None
            if done:
                del self.live[req.req_id]
                self.finished[req.finish_reason] = self.finished.get(req.finish_reason, 0) + 1
            updates.append(TokenUpdate(
                req.req_id, list(new), lps, req.finish_reason, req.stop_reason,
                stop_token=done and req.finish_reason == "stop" and bool(new), num_nan_logits=req.num_nan_logits))
        return updates

    def run_once(self, commands: list) -> list:
        """Apply the commands, then run one step if anything is unfinished, else flush."""
        events = [ev for cmd in commands for ev in self.apply(cmd)]
        if self.engine.has_unfinished():
            events += self.step()
        if not self.engine.has_unfinished():
            self.engine.flush()
        return events


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
            try:
                cmds.append(self._inbox.get(timeout=timeout))
            except queue.Empty:
                return []
        while not self._inbox.empty():
            cmds.append(self._inbox.get_nowait())
        return self.core.run_once(cmds)


def serve_core(engine, conn, first_cmd) -> None:
    """Rank 0 of spawned workers: run the core on commands from the pipe until "shutdown".
    While busy, every round sends its events (possibly none: a sign of progress); idle, it
    sends nothing and waits for the next command."""
    core, pending = EngineCore(engine), [first_cmd]
    while True:
        busy = engine.has_unfinished() or bool(pending)
        if conn.poll(0 if busy else None):
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
