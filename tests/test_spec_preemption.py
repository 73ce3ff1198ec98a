"""Seeded requests under n-gram speculative decoding, through the engine (TP=1, CPU).

Each emitted token is the token plain decoding emits at its position, so neither speculation
nor preemption by recompute changes a seeded request's tokens. Preemption matters because it
changes which drafts a request verifies: a request preempted right after its drafts were
proposed samples that position again from a prefill row with no draft, and the n-gram proposer
then sees a different schedule. The checkpoint is random but peaked enough (low temperatures,
repetitive prompts) that many drafts are accepted and many rejected.
"""
from __future__ import annotations

import pytest

from tpsample import SamplingParams
from tpsample.llm import LLM
from tpsample.testing.toy import make_random_checkpoint

VOCAB = 64
ROOMY, TIGHT = 4096, 48           # KV cache tokens: room for every request / preemptions
PROMPTS = [[(5 * i + j % 3) % (VOCAB - 1) + 1 for j in range(4 + i % 6)] * 2 for i in range(30)]
KINDS = [{"temperature": 0.3}, {"temperature": 0.6, "top_k": 20}, {"temperature": 1.0, "top_p": 0.9},
         {"temperature": 0.5, "repetition_penalty": 1.2, "presence_penalty": 0.3}, {"temperature": 0}]
PARAMS = [SamplingParams(seed=100 + i, max_tokens=20, ignore_eos=True, **KINDS[i % len(KINDS)])
          for i in range(len(PROMPTS))]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_random_checkpoint(str(tmp_path_factory.mktemp("spec")), family="qwen2", vocab_size=VOCAB,
                                  init_std=0.3, eos_token_id=0, seed=1)


def _generate(folder: str, kv_cache_tokens: int, speculative_ngram, **kw):
    """(output tokens per prompt, run stats)."""
    with LLM(folder, dtype="float32", kv_cache_tokens=kv_cache_tokens, max_num_seqs=8,
             speculative_ngram=speculative_ngram, **kw) as llm:
        outs = llm.generate(PROMPTS, PARAMS)
        stats = llm.last_stats
    assert all(len(o.output_token_ids) == p.max_tokens for o, p in zip(outs, PARAMS, strict=True))
    return [o.output_token_ids for o in outs], stats


@pytest.fixture(scope="module")
def plain(folder):
    return _generate(folder, ROOMY, None)[0]


@pytest.fixture(scope="module")
def roomy_spec(folder):
    return _generate(folder, ROOMY, 3)


def test_seeded_tokens_independent_of_preemption_under_speculation(folder, roomy_spec):
    tokens, stats = _generate(folder, TIGHT, 3)
    assert stats.num_preemptions > 0, "the cache was meant to run out"
    assert stats.num_accepted_drafts > 0
    for i, (got, want) in enumerate(zip(tokens, roomy_spec[0], strict=True)):
        assert got == want, f"request {i} ({PARAMS[i]})"


def test_speculation_gives_the_tokens_of_plain_decoding_for_seeded_requests(plain, roomy_spec):
    tokens, stats = roomy_spec
    assert 0 < stats.num_accepted_drafts < stats.num_draft_tokens, "drafts both accepted and rejected"
    for i, (got, want) in enumerate(zip(tokens, plain, strict=True)):
        assert got == want, f"request {i} ({PARAMS[i]})"


def test_vocab_parallel_tp2_under_preemption_and_speculation_gives_plain_tp1_tokens(folder, plain):
    """The shard-local verification (reducer calls only, no gathered row) draws the same plain
    tokens as TP=1 without speculation."""
    tokens, stats = _generate(folder, TIGHT, 3, tensor_parallel_size=2, strategy="vocab_parallel")
    assert stats.num_preemptions > 0 and stats.num_accepted_drafts > 0
    for i, (got, want) in enumerate(zip(tokens, plain, strict=True)):
        assert got == want, f"request {i} ({PARAMS[i]})"
