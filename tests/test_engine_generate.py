"""The engine at TP=1: greedy equals transformers, preemption and chunking keep tokens, stops."""
from __future__ import annotations

import pytest
import torch
import transformers

from tpsample import SamplingParams
from tpsample.llm import LLM
from tpsample.testing.toy import make_random_checkpoint

VOCAB = 500
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 50)), [42] * 20, [300, 301]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {fam: make_random_checkpoint(str(tmp_path_factory.mktemp(fam)), family=fam, vocab_size=VOCAB,
                                        init_std=0.3, eos_token_id=0, seed=1)
            for fam in ("llama", "qwen2")}


def _hf_greedy(folder: str, prompt: list[int], n: int) -> list[int]:
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = ref.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=0,
                       pad_token_id=0)[0, len(prompt):].tolist()
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_generation_matches_transformers_generate(folders, family):
    llm = LLM(folders[family], dtype="float32", kv_cache_tokens=2048, max_num_seqs=8)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        expected = _hf_greedy(folders[family], prompt, 24)
        assert out.output_token_ids == expected
        assert out.finish_reason == ("stop" if expected[-1] == 0 and len(expected) < 24 else "length")


def test_chunked_prefill_under_a_small_token_budget_keeps_greedy_tokens(folders):
    llm = LLM(folders["llama"], dtype="float32", kv_cache_tokens=2048, max_num_seqs=4, max_num_batched_tokens=8)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.output_token_ids == _hf_greedy(folders["llama"], prompt, 12)


def _mixed_params(n: int) -> list[SamplingParams]:
    kinds = [dict(temperature=0), dict(temperature=0.9, top_k=40, top_p=0.9), dict(temperature=1.0, min_p=0.05),
             dict(temperature=0.7, repetition_penalty=1.3, frequency_penalty=0.5)]
    return [SamplingParams(seed=100 + i, max_tokens=30 + 3 * (i % 5), ignore_eos=True, **kinds[i % len(kinds)])
            for i in range(n)]


def test_more_requests_than_the_kv_cache_holds_all_finish_with_the_right_lengths(folders):
    prompts = [[(7 * i + j) % VOCAB for j in range(5 + i % 7)] for i in range(24)]
    params = _mixed_params(len(prompts))
    roomy = LLM(folders["qwen2"], dtype="float32", kv_cache_tokens=8192, max_num_seqs=32)
    expected = roomy.generate(prompts, params)
    tight = LLM(folders["qwen2"], dtype="float32", kv_cache_tokens=160, max_num_seqs=32)
    outs = tight.generate(prompts, params)
    assert tight.last_stats.num_preemptions > 0, "the cache was meant to run out"
    for p, out, exp in zip(params, outs, expected, strict=True):
        assert len(out.output_token_ids) == p.max_tokens and out.finish_reason == "length"
        assert out.output_token_ids == exp.output_token_ids   # recompute keeps seeded tokens


def test_ngram_speculative_decoding_gives_exactly_the_greedy_tokens(folders):
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 5 + [9], [1, 2, 3, 1, 2, 3, 1, 2]]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = LLM(folders["llama"], dtype="float32", kv_cache_tokens=2048, max_num_seqs=8)
    spec = LLM(folders["llama"], dtype="float32", kv_cache_tokens=2048, max_num_seqs=8, speculative_ngram=3)
    expected = plain.generate(prompts, params)
    outs = spec.generate(prompts, params)
    assert spec.last_stats.num_draft_tokens > 0 and spec.last_stats.num_accepted_drafts > 0
    assert spec.last_stats.num_steps < plain.last_stats.num_steps
    for out, exp in zip(outs, expected, strict=True):
        assert out.output_token_ids == exp.output_token_ids


def test_stop_token_ids_and_max_tokens_set_the_finish_reason(folders):
    llm = LLM(folders["llama"], dtype="float32", kv_cache_tokens=2048)
    free = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    stop_at = free.output_token_ids[3]
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_at]))[0]
    first = free.output_token_ids.index(stop_at)
    assert out.output_token_ids == free.output_token_ids[:first + 1] and out.finish_reason == "stop"
    assert free.finish_reason == "length" and len(free.output_token_ids) == 10


def test_streaming_callback_sees_every_token_in_order(folders):
    llm = LLM(folders["qwen2"], dtype="float32", kv_cache_tokens=2048)
    seen: dict[int, list[int]] = {}
    finished = set()
    outs = llm.generate(PROMPTS[:3], _mixed_params(3), stream=lambda d: (
        seen.setdefault(d.index, []).extend(d.new_token_ids), d.finished and finished.add(d.index)))
    assert {i: o.output_token_ids for i, o in enumerate(outs)} == seen and finished == {0, 1, 2}


def test_logprobs_come_back_per_output_token(folders):
    llm = LLM(folders["qwen2"], dtype="float32", kv_cache_tokens=2048)
    out = llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=5, logprobs=3))[0]
    assert len(out.logprobs) == 5
    for tok, lp in zip(out.output_token_ids, out.logprobs, strict=True):
        assert lp.token_id == tok and lp.rank == 1 and len(lp.top_token_ids) == 3
        assert lp.top_token_ids[0] == tok and lp.logprob == pytest.approx(lp.top_logprobs[0])


def test_bad_request_raises_value_error_and_leaves_the_engine_usable(folders):
    llm = LLM(folders["llama"], dtype="float32", kv_cache_tokens=256, max_num_seqs=4)
    good = SamplingParams(temperature=0, max_tokens=4)
    for prompts, params in [([[1, VOCAB]], good), ([[]], good), ([[1] * 300], good),
                            ([[1]], SamplingParams(logprobs=99)), ([[1]], SamplingParams(stop_token_ids=[VOCAB]))]:
        with pytest.raises(ValueError):
            llm.generate([PROMPTS[0]] + prompts, good if params is good else [good, params])
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate(["text needs a tokenizer"])
    out = llm.generate([PROMPTS[0]], good)[0]
    assert out.output_token_ids == _hf_greedy(folders["llama"], PROMPTS[0], 4)
