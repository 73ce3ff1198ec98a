"""Structured output through xgrammar: compile a `GuidedDecoding` (in worker threads, with a
time limit, cached), keep one matcher per request, and produce the packed int32 bitmask rows the
sampler takes as `grammar_bitmask` (bit = 1 allowed, rows in batch order, ceil(V/32) words per row).

Contract
- `compile(guided)`: the compiled grammar, from the cache or compiled now on the calling thread;
  ValueError for a schema / regex / grammar xgrammar rejects.
- `start(guided)`: a Future of the compiled grammar, compiled in one of `COMPILE_THREADS`
  worker threads (xgrammar releases the GIL), so the engine loop parks a guided request on it
  and keeps stepping the others. Equal grammars share one job; `release(guided)` says a waiter
  gave up (a time limit, an abort): a job nobody waits for is cancelled if it has not started
  (a running compile cannot be interrupted; it finishes and lands in the cache).
- `GrammarWaits`: the engine core's batches parked on their grammars, handed back once every
  grammar compiled, one failed, or the batch waited past its time limit.
- The cache holds at most `max_cached` compiled grammars and `max_cached_bytes` of them (xgrammar's
  `memory_size_bytes`: a grammar's token masks grow with the vocabulary, to MBs each), least
  recently used dropped first, so a grammar is compiled once while it is cached and the memory
  it keeps is bounded (the newest grammar stays even when it alone is larger); xgrammar's own
  (unbounded) cache is off. `num_compiled` counts compilations, `cached_bytes` what is kept.

Lives on rank 0 with the scheduler; the bitmask travels to every rank inside the step.
"""
from __future__ import annotations

import importlib.util
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from tpsample.engine.hf_files import has_tokenizer, load_tokenizer
from tpsample.engine.request import GuidedDecoding

COMPILE_TIMEOUT_S = 30.0          # the engine core's default time limit for one grammar
COMPILE_THREADS = 2
MAX_CACHED = 64
MAX_CACHED_BYTES = 512 << 20      # as vLLM's default xgrammar cache (VLLM_XGRAMMAR_CACHE_MB)


class GrammarBackend:
    """Compiles grammars against one tokenizer and the model's vocab size (cached by source).

    `tokenizer` may be a zero-argument callable returning it: xgrammar's tokenizer tables are
    then built by the first compile (seconds for a large vocabulary), not at start-up.
    """

    def __init__(self, tokenizer, vocab_size: int, *, max_cached: int = MAX_CACHED,
                 max_cached_bytes: int = MAX_CACHED_BYTES):
        self.vocab_size, self.max_cached, self.max_cached_bytes = vocab_size, max_cached, max_cached_bytes
        self._tokenizer = tokenizer
        self._compiler = None
        self._lock = threading.RLock()                  # the cache, the jobs, the counters
        self._compiler_lock = threading.Lock()          # builds the compiler once
        self._cache: OrderedDict[tuple[str, str], object] = OrderedDict()
        self.cached_bytes = 0
        self._jobs: dict[tuple[str, str], tuple[Future, int]] = {}     # key -> (job, waiters)
        self._pool: ThreadPoolExecutor | None = None
        self.num_compiled = 0

    def _ensure_compiler(self):
        with self._compiler_lock:
            if self._compiler is None:
                import xgrammar as xgr

                self._xgr = xgr
                tok = self._tokenizer if hasattr(self._tokenizer, "encode") else self._tokenizer()
                info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=self.vocab_size)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return self._compiler

    def compile(self, guided: GuidedDecoding):
        key = guided.key()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        return self._compile(key)

    def _compile(self, key: tuple[str, str]):
        compiler = self._ensure_compiler()
        kind, source = key
        try:
            if kind in ("json_schema", "json_schema_ws"):
                compiled = compiler.compile_json_schema(source, any_whitespace=kind == "json_schema_ws")
            elif kind == "regex":
                compiled = compiler.compile_regex(source)
            elif kind == "grammar":
                compiled = compiler.compile_grammar(source)
            else:
                compiled = compiler.compile_builtin_json_grammar()
        except Exception as e:  # xgrammar raises RuntimeError / its own types for bad sources
            why = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).strip())   # drop its C++ source prefix
            raise ValueError(f"guided decoding {kind} does not compile: {why}") from e
        with self._lock:
            self.num_compiled += 1
            if key not in self._cache:          # two threads may compile one grammar: keep one
                self._cache[key] = compiled
                self.cached_bytes += compiled.memory_size_bytes
            while len(self._cache) > self.max_cached or (len(self._cache) > 1
                                                          and self.cached_bytes > self.max_cached_bytes):
                self.cached_bytes -= self._cache.popitem(last=False)[1].memory_size_bytes
        return compiled

    def is_cached(self, guided: GuidedDecoding) -> bool:
        with self._lock:
            return guided.key() in self._cache

    def start(self, guided: GuidedDecoding) -> Future:
        key = guided.key()
        with self._lock:
            job, waiters = self._jobs.get(key, (None, 0))
            if job is None or job.cancelled():
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="tpsample-grammar")
                job, waiters = self._pool.submit(self._compile, key), 0
                job.add_done_callback(lambda done, key=key: self._forget(key, done))
            if not job.done():
                self._jobs[key] = (job, waiters + 1)
        return job

    def release(self, guided: GuidedDecoding) -> None:
        key = guided.key()
        with self._lock:
            job, waiters = self._jobs.get(key, (None, 0))
            if job is None:
                return
            if waiters > 1:
                self._jobs[key] = (job, waiters - 1)
                return
            del self._jobs[key]
        job.cancel()

    def _forget(self, key, done: Future) -> None:
        with self._lock:
            if self._jobs.get(key, (None,))[0] is done:
                del self._jobs[key]

    def matcher(self, guided: GuidedDecoding):
        compiled = self.compile(guided)
        return self._xgr.GrammarMatcher(compiled)

    def empty_bitmask(self, num_rows: int) -> torch.Tensor:
        """[num_rows, ceil(V/32)] int32, every token allowed."""
        return torch.full((num_rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)

    def fill_rows(self, matcher, drafts: list[int], bitmask: torch.Tensor, first_row: int) -> None:
        """Fill one request's rows (draft rows, then the bonus row) starting at first_row.

        Row j holds the mask after drafts[:j]; `drafts` must be a valid prefix (see
        `valid_draft_prefix`). The matcher ends where it started.
        """
        matcher.fill_next_token_bitmask(bitmask, first_row)
        for j, token in enumerate(drafts):
            accepted = matcher.accept_token(token)
            assert accepted, "drafts must be cut to the grammar's valid prefix first"
            matcher.fill_next_token_bitmask(bitmask, first_row + j + 1)
        if drafts:
            matcher.rollback(len(drafts))


@dataclass
class _Wait:
    batch: tuple
    backend: GrammarBackend
    jobs: list                              # (GuidedDecoding, Future)
    deadline: float
    timeout_s: float


class GrammarWaits:
    """Batches (of anything with `.req_id`s) waiting for their grammars to compile."""

    def __init__(self):
        self._waits: list[_Wait] = []

    def __bool__(self) -> bool:
        return bool(self._waits)

    def req_ids(self) -> set[str]:
        return {r.req_id for w in self._waits for r in w.batch}

    def park(self, backend: GrammarBackend, batch: tuple, guided: list[GuidedDecoding], timeout_s: float) -> None:
        """Start compiling `guided` for `batch`, which may wait `timeout_s` for them."""
        jobs = [(g, backend.start(g)) for g in guided]
        self._waits.append(_Wait(batch, backend, jobs, time.monotonic() + timeout_s, timeout_s))

    def ready(self) -> list[tuple[tuple, ValueError | None]]:
        """(batch, None) for batches whose grammars all compiled, (batch, ValueError) for those where
        one failed or that waited too long; each is forgotten once returned."""
        out, now = [], time.monotonic()
        for w in list(self._waits):
            done = all(job.done() for _, job in w.jobs)
            if not done and now < w.deadline:
                continue
            self._drop(w)
            failed = [job.exception() for _, job in w.jobs if job.done() and not job.cancelled() and job.exception()]
            if failed:
                out.append((w.batch, failed[0] if isinstance(failed[0], ValueError) else ValueError(str(failed[0]))))
            elif not done:
                out.append((w.batch, ValueError(f"the grammar (response_format or structured_outputs) did not "
                                                f"compile within {w.timeout_s:g} s (the server's grammar time limit)")))
            else:
                out.append((w.batch, None))
        return out

    def cancel(self, req_ids: set[str]) -> list[tuple]:
        """Drop and return the batches holding one of `req_ids`."""
        hit = [w for w in self._waits if any(r.req_id in req_ids for r in w.batch)]
        for w in hit:
            self._drop(w)
        return [w.batch for w in hit]

    def _drop(self, w: _Wait) -> None:
        self._waits.remove(w)
        for guided, _ in w.jobs:
            w.backend.release(guided)


def valid_draft_prefix(matcher, drafts: list[int]) -> list[int]:
    """The longest prefix of drafts the grammar accepts; the matcher ends where it started."""
    kept: list[int] = []
    for token in drafts:
        if matcher.is_terminated() or not matcher.accept_token(token):
            break
        kept.append(token)
    if kept:
        matcher.rollback(len(kept))
    return kept


def make_grammar_backend(folder: str, vocab_size: int) -> GrammarBackend | None:
    """A GrammarBackend when the folder has a tokenizer and xgrammar is installed, else None.
    The tokenizer and xgrammar's tables load on the first guided request."""
    if not has_tokenizer(folder) or importlib.util.find_spec("xgrammar") is None:
        return None
    return GrammarBackend(lambda: load_tokenizer(folder), vocab_size)
