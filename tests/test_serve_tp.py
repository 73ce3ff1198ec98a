"""The server at TP=2 (spawned gloo workers; the engine core runs in rank 0): the same tokens
as TP=1, concurrent streams joining one engine, and a disconnect that frees everything."""
from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tpsample import SamplingParams
from tpsample.llm import LLM
from tpsample.serve.app import build_app
from tpsample.serve.server import BackgroundServer
from tpsample.testing.toy import make_chat_checkpoint

ENGINE = dict(dtype="float32", kv_cache_tokens=8192, max_num_seqs=16)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_chat_checkpoint(str(tmp_path_factory.mktemp("srvtp")), family="qwen2", vocab_size=509)


def test_server_at_tp2_gives_tp1_tokens_and_frees_everything_after_a_disconnect(folder):
    prompts = [f"request {i}" for i in range(3)]
    with LLM(folder, **ENGINE) as ref:
        expected = [ref.chat([{"role": "user", "content": p}], SamplingParams(temperature=0.8, seed=i, max_tokens=12))[0]
                    for i, p in enumerate(prompts)]
        greedy = ref.generate([[3, 1, 4, 1, 5]], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    with LLM(folder, tensor_parallel_size=2, strategy="vocab_parallel", **ENGINE) as llm, \
            BackgroundServer(build_app(llm, model_name="toy")) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        got = client.completions.create(model="toy", prompt=[3, 1, 4, 1, 5], temperature=0, max_tokens=16,
                                        extra_body={"ignore_eos": True, "return_token_ids": True})
        assert got.choices[0].model_extra["token_ids"] == greedy.output_token_ids
        texts: dict[int, str] = {}

        def run(i: int) -> None:
            chunks = client.chat.completions.create(model="toy", messages=[{"role": "user", "content": prompts[i]}],
                                                    temperature=0.8, seed=i, max_tokens=12, stream=True)
            texts[i] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert texts == {i: e.text for i, e in enumerate(expected)}
        body = {"model": "toy", "messages": [{"role": "user", "content": "long"}], "max_tokens": 900,
                "stream": True, "ignore_eos": True}
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            for _ in range(4):
                next(lines)
        deadline = time.monotonic() + 30
        while True:
            s = httpx.get(srv.url + "/stats").json()
            if s["in_flight"] == 0 and s["resources"]["running"] == 0 or time.monotonic() > deadline:
                break
        r = s["resources"]
        assert s["finished"].get("abort") == 1
        assert r["free_kv_blocks"] == r["num_kv_blocks"] and r["sampler_slots_used"] == 0
