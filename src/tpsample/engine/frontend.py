"""The front end's view of a request: engine token updates in, text deltas and outputs out.

Used by `tpsample.LLM` and the server alike. The engine core reports token ids; a
`TrackedRequest` detokenizes them incrementally, applies stop strings (and asks its caller to
abort the engine request when one matches), keeps logprobs and NaN counts, and builds the
`StreamDelta`s and the final `RequestOutput` with vLLM's finish_reason / stop_reason.
Updates that arrive after the request finished here (the engine may run a step or two past a
stop string before the abort lands) are ignored, so the output never depends on that lag.

`IncrementalDetokenizer`, the text side of one request, one token at a time as vLLM's:
- `add_token(id)` appends one output token; `take_delta(finished)` returns the text that became
  final since the last call. The deltas concatenate to `text` (the final output text).
- No delta ever ends in a broken character: while decoding the newest tokens ends in U+FFFD (an
  incomplete UTF-8 sequence split across tokens), that text is held back until a later token
  completes it; an incomplete sequence left at the very end of generation is dropped.
- Stop strings are searched across token boundaries in the newly decoded text (plus the last
  len(stop) - 1 characters before it); the earliest match wins. Without
  `include_stop_str_in_output` the text is cut before the match, and while running the last
  max(len(stop)) - 1 characters are held back, so a stop string is never half streamed.
- Decodes a small window (a few prompt tokens of context, then the pending tokens), not the
  whole output, per token.
"""
from __future__ import annotations

from tpsample.engine.core import Abort, AddRequests, Rejected, Report, Reported, TokenUpdate
from tpsample.engine.request import RequestOutput, StreamDelta, TokenLogprob

CONTEXT_TOKENS = 5        # prompt tokens decoded before the output, so leading spaces come out right
REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], *, stop: tuple[str, ...] | None = None,
                 include_stop_str_in_output: bool = False, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.tokens = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0                 # window start: context for the next decode
        self.read_offset = len(self.tokens)    # tokens before this are already in `text`
        self.text = ""
        self.stop = tuple(stop or ())
        self.include_stop = include_stop_str_in_output
        self.holdback = 0 if self.include_stop or not self.stop else max(map(len, self.stop)) - 1
        self._sent = 0                         # characters of `text` handed out by take_delta

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def add_token(self, token_id: int, check_stop: bool = True) -> str | None:
        """Append one token; returns the stop string it completed (text already cut), else None.
        check_stop=False (before min_tokens, as vLLM) appends without looking for stop strings."""
        self.tokens.append(token_id)
        prefix = self._decode(self.tokens[self.prefix_offset:self.read_offset])
        full = self._decode(self.tokens[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith(REPLACEMENT):
            return None                        # nothing new, or an incomplete character: wait
        new = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        self.text += new
        return self._check_stop(len(new)) if check_stop else None

    def _check_stop(self, num_new: int) -> str | None:
        best = None
        for s in self.stop:
            i = self.text.find(s, max(0, len(self.text) - num_new - len(s) + 1))
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        self.text = self.text[:i + len(s)] if self.include_stop else self.text[:i]
        return s

    def take_delta(self, finished: bool) -> str:
        """The new final text since the last call (all of it once `finished`)."""
        end = len(self.text) if finished else max(self._sent, len(self.text) - self.holdback)
        delta, self._sent = self.text[self._sent:end], end
        return delta


class TrackedRequest:
    def __init__(self, req_id: str, index: int, prompt_token_ids: list[int], params, tokenizer=None,
                 prompt: str | None = None, *, skip_special_tokens: bool = True):
        self.req_id, self.index, self.prompt, self.params = req_id, index, prompt, params
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self.kept_support: list | None = [] if params.kept_support is not None else None
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.num_nan_logits = 0
        self.detok = None
        if tokenizer is not None:
            self.detok = IncrementalDetokenizer(tokenizer, self.prompt_token_ids, stop=params.stop,
                                                include_stop_str_in_output=params.include_stop_str_in_output,
                                                skip_special_tokens=skip_special_tokens)
        elif params.stop:
            raise ValueError("SamplingParams.stop needs a tokenizer in the model folder; use stop_token_ids")

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def apply(self, upd: TokenUpdate) -> tuple[StreamDelta | None, bool]:
        """(the delta to stream or None, whether the engine request must now be aborted)."""
        if self.finished:
            return None, False
        if upd.prompt_logprobs is not None:
            self.prompt_logprobs = list(upd.prompt_logprobs)
        new, stop_str = [], None
        for j, token in enumerate(upd.new_token_ids):
            new.append(token)
            if self.logprobs is not None and upd.logprobs is not None:
                self.logprobs.append(upd.logprobs[j])
            if self.kept_support is not None and upd.kept_support is not None:
                self.kept_support.append(upd.kept_support[j])
            last_stop_token = upd.stop_token and j == len(upd.new_token_ids) - 1
            if self.detok is not None and not (last_stop_token and not self.params.include_stop_str_in_output):
                num_out = len(self.output_token_ids) + len(new)
                stop_str = self.detok.add_token(token, check_stop=num_out >= self.params.min_tokens)
                if stop_str is not None:
                    break
        self.output_token_ids += new
        self.num_nan_logits = upd.num_nan_logits
        abort = False
        if stop_str is not None:
            self.finish_reason, self.stop_reason = "stop", stop_str
            abort = upd.finish_reason is None
        elif upd.finish_reason is not None:
            self.finish_reason, self.stop_reason = upd.finish_reason, upd.stop_reason
        text = self.detok.take_delta(self.finished) if self.detok is not None else ""
        if not new and not text and not self.finished:
            return None, abort
        return StreamDelta(self.index, self.req_id, new, self.finished, self.finish_reason, text,
                           self.stop_reason), abort

    def output(self) -> RequestOutput:
        return RequestOutput(self.req_id, list(self.prompt_token_ids), list(self.output_token_ids),
                             self.finish_reason, self.logprobs,
                             text=self.detok.text if self.detok is not None else None, prompt=self.prompt,
                             stop_reason=self.stop_reason, num_nan_logits=self.num_nan_logits,
                             prompt_logprobs=self.prompt_logprobs, kept_support=self.kept_support)


def run_to_completion(client, tracked: list[TrackedRequest], new_requests: tuple, on_delta=None):
    """Submit the requests as one batch, drive the client until every one finished, and return
    (outputs in order, the run's RunStats). A rejected batch raises its ValueError; if anything
    raises mid-run (a failing callback, an interrupt), the unfinished requests are aborted."""
    by_id = {t.req_id: t for t in tracked}
    client.submit(AddRequests(tuple(new_requests)))
    try:
        while any(not t.finished for t in tracked):
            for ev in client.poll(timeout=1.0):
                if isinstance(ev, Rejected) and ev.req_ids[0] in by_id:
                    raise ev.error
                if isinstance(ev, TokenUpdate) and ev.req_id in by_id:
                    delta, abort = by_id[ev.req_id].apply(ev)
                    if abort:
                        client.submit(Abort((ev.req_id,)))
                    if delta is not None and on_delta is not None:
                        on_delta(delta)
    except BaseException:
        _abort_quietly(client, [t.req_id for t in tracked if not t.finished])
        raise
    client.submit(Report())
    while True:
        for ev in client.poll(timeout=1.0):
            if isinstance(ev, Reported):
                return [t.output() for t in tracked], ev.stats


def _abort_quietly(client, req_ids: list[str]) -> None:
    try:
        client.submit(Abort(tuple(req_ids)))
        client.poll(timeout=0)
    except Exception:
        pass
