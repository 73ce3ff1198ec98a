"""Structured output: xgrammar bitmasks make a random model emit valid JSON / regex matches."""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("xgrammar")      # structured output needs it (absent on some GPU machines)

from tpsample import SamplingParams
from tpsample.engine import GuidedDecoding
from tpsample.llm import LLM
from tpsample.testing.toy import make_random_checkpoint

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "kind", "tags"],
          "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["fox", "dog", "cat"]},
                         "tags": {"type": "array", "maxItems": 2, "items": {"enum": ["a", "b"]}}}}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    folder = make_random_checkpoint(str(tmp_path_factory.mktemp("tok")), family="qwen2", vocab_size=500,
                                    init_std=0.3, eos_token_id=0, tokenizer=True)
    return LLM(folder, dtype="float32", kv_cache_tokens=4096, max_num_seqs=8, speculative_ngram=2)


def _assert_schema(obj: dict) -> None:
    assert set(obj) == {"ok", "kind", "tags"} and isinstance(obj["ok"], bool)
    assert obj["kind"] in ("fox", "dog", "cat") and set(obj["tags"]) <= {"a", "b"} and len(obj["tags"]) <= 2


def test_json_schema_requests_yield_valid_json_mixed_with_free_requests(llm):
    prompts = ["hello world", "the quick brown fox", '{"name":', "hello"]
    params = [SamplingParams(temperature=0, max_tokens=60), SamplingParams(temperature=0.9, seed=1, max_tokens=60),
              SamplingParams(temperature=1.0, seed=2, max_tokens=8), SamplingParams(temperature=0.5, seed=3, max_tokens=60)]
    guided = [GuidedDecoding(json_schema=SCHEMA), GuidedDecoding(json_schema=SCHEMA), None,
              GuidedDecoding(json_schema=json.dumps(SCHEMA))]
    outs = llm.generate(prompts, params, guided=guided)
    for out, g in zip(outs, guided):
        if g is None:
            assert len(out.output_token_ids) == 8
            continue
        assert out.finish_reason == "stop", out.text
        _assert_schema(json.loads(out.text))


def test_regex_request_matches_the_pattern(llm):
    pattern = r"(yes|no), [0-9]{3}"
    outs = llm.generate(["hello", "fox"], SamplingParams(temperature=1.0, seed=7, max_tokens=30),
                        guided=GuidedDecoding(regex=pattern))
    for out in outs:
        assert out.finish_reason == "stop" and re.fullmatch(pattern, out.text), out.text


def test_guided_decoding_needs_exactly_one_constraint_and_a_valid_schema(llm):
    with pytest.raises(ValueError):
        GuidedDecoding()
    with pytest.raises(ValueError):
        GuidedDecoding(regex="a", json_object=True)
    with pytest.raises(ValueError, match="does not compile"):
        llm.generate(["hi"], guided=GuidedDecoding(json_schema="{not json"))
    assert llm.generate(["hi"], SamplingParams(max_tokens=2, seed=0))[0].text is not None


def test_grammar_that_allows_only_eos_ends_the_request_despite_min_tokens(llm):
    """min_tokens bans EOS, the grammar allows nothing else once "yes" is out: the sampler's guard
    must pick the grammar's EOS (never a token the grammar forbids) and the request ends there."""
    outs = llm.generate(["hello", "fox"], SamplingParams(temperature=0.7, seed=3, max_tokens=20, min_tokens=10),
                        guided=GuidedDecoding(regex="yes"))
    for out in outs:
        assert out.finish_reason == "stop" and out.text == "yes", (out.text, out.finish_reason)
        assert len(out.output_token_ids) < 10
