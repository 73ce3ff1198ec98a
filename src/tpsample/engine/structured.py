"""Structured output through xgrammar: compile a `GuidedDecoding` once, keep one matcher per
request, and produce the packed int32 bitmask rows the sampler takes as `grammar_bitmask`
(bit = 1 allowed, rows in batch order, ceil(V/32) words per row).

Lives on rank 0 with the scheduler; the bitmask travels to every rank inside the step.
"""
from __future__ import annotations

import re

import torch

from tpsample.engine.request import GuidedDecoding


class GrammarBackend:
    """Compiles grammars against one tokenizer and the model's vocab size (cached by source).

    `tokenizer` may be a zero-argument callable returning it: xgrammar's tokenizer tables are
    then built on the first guided request (seconds for a large vocabulary), not at start-up.
    """

    def __init__(self, tokenizer, vocab_size: int):
        self.vocab_size = vocab_size
        self._tokenizer = tokenizer
        self._compiler = None
        self._cache: dict[tuple[str, str], object] = {}

    def _ensure_compiler(self):
        if self._compiler is None:
            import xgrammar as xgr

            self._xgr = xgr
            tok = self._tokenizer() if callable(self._tokenizer) else self._tokenizer
            info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=self.vocab_size)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler

    def compile(self, guided: GuidedDecoding):
        """The compiled grammar; raises ValueError for a schema/regex/grammar xgrammar rejects."""
        key = guided.key()
        if key not in self._cache:
            self._ensure_compiler()
            kind, source = key
            try:
                if kind in ("json_schema", "json_schema_ws"):
                    compiled = self._compiler.compile_json_schema(source, any_whitespace=kind == "json_schema_ws")
                elif kind == "regex":
                    compiled = self._compiler.compile_regex(source)
                elif kind == "grammar":
                    compiled = self._compiler.compile_grammar(source)
                else:
                    compiled = self._compiler.compile_builtin_json_grammar()
            except Exception as e:  # xgrammar raises RuntimeError / its own types for bad sources
                why = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).strip())   # drop its C++ source prefix
                raise ValueError(f"guided decoding {kind} does not compile: {why}") from e
            self._cache[key] = compiled
        return self._cache[key]

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
