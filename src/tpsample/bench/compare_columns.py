"""The columns of `bench sampler --compare`: tpsample called four ways, and the anchors.

A column's `setup(case, logits)` returns a `Timed` (`call() -> finish()`, `before()` and what
was replayed), None where the column does not apply, or a string saying why it could not run
for that case here. `before()` refills the buffer the next call reads from the pristine copy
(outside what is measured), as an LM head would have written it, so every column reads logits
just written (in-place calls need that anyway).

tpsample, every request seeded, `plan` + `sample` per call, tokens and logprobs read on the
host: replay off (`auto_graph=False`); auto replay (past `replay.AFTER` identical calls the step
is captured and replayed); a new buffer each call (two buffers in turn: the launch list is
replayed, never a graph); capture + replay (`Sampler.capture`, CUDA only). The replaying columns
skip the in-place (penalties) case. Anchors: FlashInfer as vLLM calls it (`flashinfer.recipe`),
with `top_k_max` on top-k cases, and `argmax().tolist()` beside greedy.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from . import flashinfer
from .workloads import Case

WARMUP = 8                  # untimed calls first: past the auto replay's capture (replay.AFTER = 4)
TOP_K_MAX = 50


@dataclass
class Logits:
    """The harness's own buffers (allocated before any column, so never counted as its memory)."""
    pristine: torch.Tensor      # [R, V] never written
    work: torch.Tensor          # the buffer calls read, refilled from pristine before each call
    spare: torch.Tensor         # a second buffer: `tpsample, new buffer` alternates the two

    @classmethod
    def randn(cls, rows: int, vocab: int, device, seed: int) -> Logits:
        g = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(rows, vocab, device=device, generator=g) * 3
        return cls(x, x.clone(), x.clone())


@dataclass
class Timed:
    call: Callable
    before: Callable
    replays: Callable[[], int] = lambda: 0     # calls replayed so far (a graph or a launch list)
    keep: list = field(default_factory=list)   # what must stay alive while the column runs


def prompts(rows: int, vocab: int, length: int) -> torch.Tensor:
    """[rows, length] int64 random history tokens (the same for tpsample and the anchors)."""
    return torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(0))


def case_sampler(case: Case, rows: int, vocab: int, device, *, auto_graph: bool):
    """(sampler, request ids): `rows` seeded requests with the case's parameters and histories;
    in place when the case has histories (penalties rewrite the logits, as an engine lets them)."""
    import tpsample
    s = tpsample.Sampler(vocab, max_num_reqs=rows, strategy="replicated", seed=1, device=device,
                         inplace_logits=case.prompt_len > 1, max_logprobs=20, auto_graph=auto_graph)
    history = prompts(rows, vocab, case.prompt_len).tolist()
    for i in range(rows):
        s.add_request(f"r{i}", tpsample.SamplingParams(seed=i, max_tokens=10**6, **case.params), history[i])
    return s, [f"r{i}" for i in range(rows)]


def _read(out):
    return lambda: (out.token_lists(), out.logprobs)


def _refill(x: Logits):
    return lambda: x.work.copy_(x.pristine)


def _replays(s) -> Callable[[], int]:
    graph = s.auto_graph
    return (lambda: graph.replays + graph.tape_replays) if graph is not None else (lambda: 0)


def replay_off(case: Case, x: Logits):
    s, ids = case_sampler(case, *x.work.shape, x.work.device, auto_graph=False)
    return Timed(lambda: _read(s.sample(x.work, s.plan(ids))), _refill(x), keep=[s])


def auto_replay(case: Case, x: Logits):
    if case.prompt_len > 1:
        return "in place: never replayed"
    s, ids = case_sampler(case, *x.work.shape, x.work.device, auto_graph=True)
    return Timed(lambda: _read(s.sample(x.work, s.plan(ids))), _refill(x), _replays(s), [s])


def new_buffer(case: Case, x: Logits):
    if case.prompt_len > 1:
        return "in place: never replayed"
    s, ids = case_sampler(case, *x.work.shape, x.work.device, auto_graph=True)
    bufs, turn = (x.work, x.spare), [0]

    def before():
        turn[0] ^= 1
        bufs[turn[0]].copy_(x.pristine)

    return Timed(lambda: _read(s.sample(bufs[turn[0]], s.plan(ids))), before, _replays(s), [s])


def capture_replay(case: Case, x: Logits, reserve_tokens: int):
    if x.work.device.type != "cuda":
        return "needs CUDA"
    s, ids = case_sampler(case, *x.work.shape, x.work.device, auto_graph=False)
    step = s.capture(s.plan(ids), x.work, reserve_tokens=reserve_tokens)
    count = [0]

    def call():
        count[0] += 1
        return _read(step.replay())
    return Timed(call, _refill(x), lambda: count[0], [s, step])


def flashinfer_column(case: Case, x: Logits, status: dict, top_k_max: int | None):
    modules = status["modules"]
    needed = ("sampling", "topk") if top_k_max else ("sampling",)
    missing = [f"{m} module: {modules[m]['why']}" for m in needed if not modules[m]["ok"]]
    if top_k_max and not case.params.get("top_k"):
        return None
    if not flashinfer.supported(case.params):
        return "FlashInfer has no such op"
    if missing:
        return "; ".join(missing)
    hist = None
    if case.prompt_len > 1:
        rows, vocab = x.work.shape
        hist = (prompts(rows, vocab, case.prompt_len).to(x.work.device),
                torch.randint(0, vocab, (rows, 32), generator=torch.Generator().manual_seed(1)).to(x.work.device))
    return Timed(flashinfer.recipe(case.params, x.work, top_k_max, hist), _refill(x), keep=[hist])


def argmax(case: Case, x: Logits):
    if case.params.get("temperature") != 0.0:
        return None
    return Timed(lambda: x.work.argmax(dim=1).tolist, _refill(x))


# column -> its short name in the table
SHORT = {"tpsample, replay off": "replay off", "tpsample, auto replay": "auto replay",
         "tpsample, new buffer": "new buffer", "tpsample, capture + replay": "capture+replay",
         "flashinfer": "FlashInfer", f"flashinfer, top_k_max={TOP_K_MAX}": f"FI top_k_max={TOP_K_MAX}",
         "argmax().tolist()": "argmax"}


def columns(status: dict, reserve_tokens: int) -> dict:
    """name -> setup(case, logits): every column, in the table's order."""
    return {
        "tpsample, replay off": replay_off,
        "tpsample, auto replay": auto_replay,
        "tpsample, new buffer": new_buffer,
        "tpsample, capture + replay": lambda c, x: capture_replay(c, x, reserve_tokens),
        "flashinfer": lambda c, x: flashinfer_column(c, x, status, None),
        f"flashinfer, top_k_max={TOP_K_MAX}": lambda c, x: flashinfer_column(c, x, status, TOP_K_MAX),
        "argmax().tolist()": argmax,
    }
