"""Request-side data: what a caller asks for and what it gets back, and what the engine reports.

`GuidedDecoding` is the engine's structured-output argument (SamplingParams stays the sampler's
contract and has no grammar field): pass it as `llm.generate(..., guided=GuidedDecoding(...))`.
`Request` is the scheduler's mutable record of one request; it lives on rank 0 only.
`EngineInfo` holds the static facts fixed at start-up, `RunStats` the statistics of a run.
"""
from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class GuidedDecoding:
    """Exactly one of: a JSON schema (dict or str), a regex, an EBNF grammar, or any JSON object.

    any_whitespace: let JSON carry free whitespace between tokens (off: compact JSON, which keeps
    weak models from emitting whitespace forever).
    """
    json_schema: dict | str | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    any_whitespace: bool = False

    def __post_init__(self) -> None:
        chosen = [self.json_schema is not None, self.regex is not None, self.grammar is not None,
                  bool(self.json_object)]
        if sum(chosen) != 1:
            raise ValueError("GuidedDecoding needs exactly one of json_schema, regex, grammar, json_object")

    def key(self) -> tuple[str, str]:
        """(kind, source) with the schema serialised, so equal requests share a compiled grammar."""
        if self.json_schema is not None:
            schema = self.json_schema
            # key order is part of the schema: properties are generated in the order given
            source = schema if isinstance(schema, str) else json.dumps(schema)
            return ("json_schema_ws" if self.any_whitespace else "json_schema"), source
        if self.regex is not None:
            return "regex", self.regex
        if self.grammar is not None:
            return "grammar", self.grammar
        return "json_object", ""


@dataclass(frozen=True)
class TokenLogprob:
    """The logprob and rank of one output token, plus the top-n alternatives (ties -> lower id)."""
    token_id: int
    logprob: float
    rank: int
    top_token_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


@dataclass(frozen=True)
class TokenSupport:
    """The kept support of the row an output token was sampled from (`SamplingParams.kept_support`):
    how many tokens it kept, their value bounds after the temperature, the most probable ids."""
    count: int
    threshold: float
    upper: float
    token_ids: tuple[int, ...]


FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(frozen=True)
class RequestTimings:
    """Where a finished request's time went, in seconds, from the engine's clock (vLLM's phases):
    queued (admitted -> first scheduled), prefill (first scheduled -> first token), decode
    (first token -> last token), inference (first scheduled -> last token). A phase the request
    never reached counts 0."""
    queued_s: float
    prefill_s: float
    decode_s: float
    inference_s: float


@dataclass
class RequestOutput:
    """One finished request. As in vLLM: finish_reason "stop" (EOS, a stop token, a stop string
    or a finished grammar), "length" (max_tokens or max_model_len), "abort" (cancelled), "error"
    (the logits were NaN and left nothing to sample, or the grammar allowed no token); stop_reason is the matched stop string or
    stop token id, None for EOS and every other reason."""
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    finish_reason: str | None          # one of FINISH_REASONS; None while streaming
    logprobs: list[TokenLogprob] | None = None
    text: str | None = None
    prompt: str | None = None
    stop_reason: str | int | None = None
    num_nan_logits: int = 0            # NaN values seen in this request's logits rows
    # with SamplingParams.prompt_logprobs: one entry per prompt token, None for the first (nothing
    # predicts it), then the prompt token's logprob and rank given the tokens before it, plus the top-n
    prompt_logprobs: list[TokenLogprob | None] | None = None
    kept_support: list[TokenSupport] | None = None     # per output token, when asked


@dataclass(frozen=True)
class StreamDelta:
    """What the streaming callback receives after each step that produced tokens for a request."""
    index: int                          # position of the request in the generate() call
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    text: str = ""                      # the new text (never a broken character); "" without a tokenizer
    stop_reason: str | int | None = None


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    req_id: str
    index: int
    prompt_token_ids: list[int]
    params: Any                         # tpsample.SamplingParams
    guided: GuidedDecoding | None = None
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None    # [None] + one per prompt token computed
    kept_support: list[TokenSupport] | None = None
    num_computed_tokens: int = 0        # tokens whose K/V sit in the cache
    block_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    stop_reason: int | None = None      # the stop token id that finished it (None for EOS)
    num_nan_logits: int = 0
    in_sampler: bool = False            # added to the sampler on every rank (kept while preempted)
    num_preemptions: int = 0
    matcher: Any = None                 # xgrammar.GrammarMatcher for guided requests
    # time.monotonic() stamps on rank 0: admitted, first scheduled, first and last token
    arrival_s: float = 0.0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def max_total_tokens(self) -> int:
        return len(self.prompt_token_ids) + self.params.max_tokens

    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def timings(self, now: float) -> RequestTimings:
        """The phases so far (`now` ends a phase still running: an abort)."""
        scheduled = self.scheduled_s if self.scheduled_s is not None else now
        first = self.first_token_s if self.first_token_s is not None else (now if self.scheduled_s else scheduled)
        last = self.last_token_s if self.last_token_s is not None else first
        return RequestTimings(queued_s=scheduled - self.arrival_s, prefill_s=first - scheduled,
                              decode_s=last - first, inference_s=last - scheduled)


@dataclass(frozen=True)
class EngineInfo:
    strategy: str
    tensor_parallel_size: int
    device: str
    dtype: str
    vocab_size: int
    num_kv_blocks: int
    block_size: int
    kv_tokens: int
    max_model_len: int
    max_num_seqs: int
    sampler_peak_bytes: tuple[int, ...]   # per rank, profile step at max_num_seqs x (1 + k) rows
    weights_bytes: int                    # per rank
    kv_bytes_per_token: int               # per rank
    attention: str = "torch"              # "triton" (paged kernels) or "torch" (gather + SDPA)
    cuda_graph_batch_sizes: tuple[int, ...] = ()   # decode batches replayed from CUDA graphs

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunStats:
    wall_s: float = 0.0
    num_steps: int = 0
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_preemptions: int = 0
    max_running: int = 0
    num_drafts: int = 0                   # requests that had draft tokens, summed over steps
    num_draft_tokens: int = 0
    num_accepted_drafts: int = 0
    num_decode_steps: int = 0             # steps with one new token per sequence
    decode_s: float = 0.0                 # their wall time, schedule to tokens on the host
    decode_context_tokens: int = 0        # sum over those steps of the sequences' context lengths

    def add_decode_step(self, seconds: float, context_tokens: int) -> None:
        self.num_decode_steps += 1
        self.decode_s += seconds
        self.decode_context_tokens += context_tokens

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def decode_bytes_per_s(self, weights_bytes: int, kv_bytes_per_token: int) -> float:
        """Bytes a decode step must read (weights once, each sequence's K/V) over its wall time."""
        if self.decode_s <= 0:
            return 0.0
        read = self.num_decode_steps * weights_bytes + self.decode_context_tokens * kv_bytes_per_token
        return read / self.decode_s

    def as_dict(self) -> dict:
        return {**asdict(self), "output_tokens_per_s": self.output_tokens_per_s}
