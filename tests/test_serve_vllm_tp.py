"""vLLM's endpoints at TP=3 (spawned gloo workers; the engine core in rank 0): prompt logprobs
from each rank's vocabulary shard (vocab_parallel, prefill in chunks) equal TP=1's, token-in / token-out gives TP=1's tokens,
structured outputs hold, and /metrics counters move by what the clients received."""
from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tpsample import SamplingParams
from tpsample.llm import LLM
from tpsample.serve.app import build_app
from tpsample.serve.server import BackgroundServer
from tpsample.testing.toy import make_chat_checkpoint

ENGINE = dict(dtype="float32", kv_cache_tokens=2048, max_num_seqs=8)
PROMPT = [5, 17, 42, 99, 7, 3, 250, 11]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # 3 query heads and 1 KV head: TP 3 splits it; a vocabulary of 500 does not divide by 3
    return make_chat_checkpoint(str(tmp_path_factory.mktemp("vllmtp")), hidden_size=48, num_heads=3, num_kv_heads=1,
                                intermediate_size=96, num_layers=1)


def counters(url: str) -> dict:
    return {(s.name, s.labels.get("finished_reason")): s.value
            for f in text_string_to_metric_families(httpx.get(url + "/metrics").text) for s in f.samples}


def test_vllm_endpoints_at_tp3_agree_with_tp1(folder):
    with LLM(folder, **ENGINE) as ref:
        expected = ref.generate([PROMPT], SamplingParams(temperature=0.7, seed=5, max_tokens=6, prompt_logprobs=2,
                                                         logprobs=1))[0]
    # vocab_parallel: no rank ever holds a full row; 5 tokens a step: the prompt prefills in chunks
    with LLM(folder, tensor_parallel_size=3, strategy="vocab_parallel", max_num_batched_tokens=5, **ENGINE) as llm, \
            BackgroundServer(build_app(llm, model_name="toy")) as srv:
        before = counters(srv.url)
        g = httpx.post(srv.url + "/inference/v1/generate", timeout=120, json={
            "token_ids": PROMPT, "sampling_params": {"temperature": 0.7, "seed": 5, "max_tokens": 6,
                                                     "prompt_logprobs": 2, "logprobs": 1}}).json()
        assert g["choices"][0]["token_ids"] == expected.output_token_ids
        for got, want in zip(g["prompt_logprobs"][1:], expected.prompt_logprobs[1:]):
            assert [int(k) for k in got] == [want.token_id, *want.top_token_ids]
            assert [v["logprob"] for v in got.values()] == pytest.approx([want.logprob, *want.top_logprobs], abs=1e-5)
        got_lps = [e["logprob"] for e in g["choices"][0]["logprobs"]["content"]]
        assert got_lps == pytest.approx([lp.logprob for lp in expected.logprobs], abs=1e-5)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "hi"}], max_tokens=9,
                                           extra_body={"structured_outputs": {"choice": ["red", "green"]}})
        assert r.choices[0].message.content in ("red", "green")
        after = counters(srv.url)
        assert after["vllm:prompt_tokens_total", None] - before["vllm:prompt_tokens_total", None] == \
            len(PROMPT) + r.usage.prompt_tokens
        assert after["vllm:generation_tokens_total", None] - before["vllm:generation_tokens_total", None] == \
            6 + r.usage.completion_tokens
        finished = {reason: after["vllm:request_success_total", reason] - before["vllm:request_success_total", reason]
                    for reason in ("stop", "length", "abort", "error")}
        assert finished == {"stop": 1, "length": 1, "abort": 0, "error": 0}

