"""The grammar cache's memory: bounded by count and by bytes, and given back when grammars leave it.

A synthetic byte-level vocabulary of 32k tokens (printable ASCII pieces, many with quotes,
braces and spaces, as real BPE vocabularies have) makes xgrammar's per-grammar token masks
large enough to see in the process's RSS.
"""
from __future__ import annotations

import random

import pytest

from tpsample.engine.request import GuidedDecoding
from tpsample.engine.structured import GrammarBackend

VOCAB = 32_768


def synthetic_tokenizer(vocab_size: int = VOCAB, seed: int = 0):
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<|endoftext|>": 0, **{ch: i + 1 for i, ch in enumerate(alphabet)}}
    pieces = [c for c in alphabet if c.isascii() and c.isprintable()] + ["Ġ"] * 10
    while len(vocab) < vocab_size:
        vocab.setdefault("".join(rng.choice(pieces) for _ in range(rng.randint(2, 8))), len(vocab))
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def schema(i: int, width: int = 60) -> GuidedDecoding:
    """A distinct JSON schema per i (half string, half integer properties)."""
    return GuidedDecoding(json_schema={"type": "object", "properties": {
        f"k{i}_{j}": {"type": "string" if j % 2 else "integer"} for j in range(width)}})


@pytest.fixture(scope="module")
def tokenizer():
    return synthetic_tokenizer()


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_the_cache_keeps_at_most_its_byte_budget_and_the_newest_grammar(tokenizer):
    one = GrammarBackend(tokenizer, VOCAB).compile(schema(-1)).memory_size_bytes
    backend = GrammarBackend(tokenizer, VOCAB, max_cached=64, max_cached_bytes=int(2.5 * one))
    for i in range(6):
        backend.compile(schema(i))
        assert backend.cached_bytes <= max(backend.max_cached_bytes, one + 64)
    assert backend.is_cached(schema(5)) and backend.is_cached(schema(4)) and not backend.is_cached(schema(3))
    huge = GrammarBackend(tokenizer, VOCAB, max_cached_bytes=1)
    huge.compile(schema(0))
    huge.compile(schema(1))
    assert huge.is_cached(schema(1)) and not huge.is_cached(schema(0))


def test_rss_stops_growing_once_the_cache_is_full(tokenizer):
    cap = 16
    backend = GrammarBackend(tokenizer, VOCAB, max_cached=cap)
    backend.compile(schema(-1))                         # xgrammar's tables for the tokenizer
    fill = [backend.start(schema(i)).result(timeout=60) for i in range(cap)]     # compiled in the pool threads
    held = sum(g.memory_size_bytes for g in fill) / 2**20
    del fill
    full = rss_mib()
    for i in range(cap, 4 * cap):                      # three more cache-fulls, each evicting the last
        backend.start(schema(i)).result(timeout=60)
    grown = rss_mib() - full
    assert backend.num_compiled == 4 * cap + 1 and backend.cached_bytes / 2**20 <= 1.5 * held
    # the 48 grammars compiled after the cache filled held 3 x `held` MiB; evicted, they were freed
    # (what stays is allocator slack: about a quarter of `held` here)
    assert grown < held, f"RSS grew {grown:.1f} MiB after the cache was full ({held:.1f} MiB cached)"
