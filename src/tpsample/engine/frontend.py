"""The front end's view of a request: engine token updates in, text deltas and outputs out.

Used by `tpsample.LLM` and the server alike. The engine core reports token ids; a
`TrackedRequest` detokenizes them incrementally, applies stop strings (and asks its caller to
abort the engine request when one matches), keeps logprobs and NaN counts, and builds the
`StreamDelta`s and the final `RequestOutput` with vLLM's finish_reason / stop_reason.
Updates that arrive after the request finished here (the engine may run a step or two past a
stop string before the abort lands) are ignored, so the output never depends on that lag.
"""
from __future__ import annotations

from tpsample.engine.core import TokenUpdate
from tpsample.engine.detokenizer import IncrementalDetokenizer
from tpsample.engine.request import RequestOutput, StreamDelta, TokenLogprob


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
    from tpsample.engine.core import Abort, AddRequests, Rejected, Report, Reported

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
    from tpsample.engine.core import Abort

    try:
        client.submit(Abort(tuple(req_ids)))
        client.poll(timeout=0)
    except Exception:
        pass
