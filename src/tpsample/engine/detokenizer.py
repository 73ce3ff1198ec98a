"""Incremental detokenization and stop strings: the text side of one request.

The engine produces token ids only; the front ends (`tpsample.LLM`, the server) turn them into
text here, one token at a time, as vLLM's detokenizer does.

Contract
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
