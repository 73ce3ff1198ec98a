"""The OpenAI-compatible server on a tiny random model, driven by the official `openai` client.

One server per module (127.0.0.1, a port the OS picks). The toy tokenizer is byte-level BPE
trained on ASCII, so every non-ASCII character is split over several tokens.
"""
from __future__ import annotations

import json
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

MODEL = "toy"
ENGINE = dict(dtype="float32", kv_cache_tokens=8192, max_num_seqs=32)
HI = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_chat_checkpoint(str(tmp_path_factory.mktemp("srv")))


@pytest.fixture(scope="module")
def server(folder):
    llm = LLM(folder, **ENGINE)
    app = build_app(llm, model_name=MODEL)
    with BackgroundServer(app) as srv:
        srv.app = app
        yield srv
    llm.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(folder):
    with LLM(folder, **ENGINE) as llm:
        yield llm


def _stats(server) -> dict:
    return httpx.get(server.url + "/stats").json()


def _wait_idle(server, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        s = _stats(server)
        r = s["resources"]
        if s["in_flight"] == 0 and r["running"] == 0 and r["waiting"] == 0 or time.monotonic() > deadline:
            return s


def _assert_nothing_held(server) -> None:
    r = _wait_idle(server)["resources"]
    assert r["running"] == 0 and r["waiting"] == 0
    assert r["free_kv_blocks"] == r["num_kv_blocks"], "a KV block leaked"
    assert r["sampler_slots_used"] == 0, "a sampler slot leaked"


def _stream_text(client, **kw) -> tuple[list[str], str | None]:
    deltas, finish = [], None
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **kw):
        for ch in chunk.choices:
            if ch.delta.content:
                deltas.append(ch.delta.content)
            assert ch.delta.content or ch.delta.role or ch.finish_reason, "a chunk that says nothing"
            finish = ch.finish_reason or finish
    return deltas, finish


def test_streaming_chat_concatenates_to_the_plain_answer(client):
    plain = client.chat.completions.create(model=MODEL, messages=HI, temperature=0, max_tokens=24)
    deltas, finish = _stream_text(client, messages=HI, temperature=0, max_tokens=24)
    assert "".join(deltas) == plain.choices[0].message.content and finish == plain.choices[0].finish_reason
    assert plain.usage.completion_tokens == 24 or plain.choices[0].finish_reason == "stop"
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens
    text = client.completions.create(model=MODEL, prompt="hello", temperature=0, max_tokens=8)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="hello", temperature=0, max_tokens=8, stream=True))
    assert streamed == text.choices[0].text


def test_server_greedy_equals_llm_generate(client, reference):
    prompt = [5, 17, 42, 99, 7]
    got = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=20,
                                    extra_body={"return_token_ids": True, "ignore_eos": True})
    expected = reference.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    assert got.choices[0].model_extra["token_ids"] == expected.output_token_ids
    assert got.choices[0].text == expected.text
    chat = client.chat.completions.create(model=MODEL, messages=HI, temperature=0, max_tokens=16)
    assert chat.choices[0].message.content == reference.chat(HI, SamplingParams(temperature=0, max_tokens=16))[0].text


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "greeting", "age"],
          "properties": {"name": {"enum": ["Zoë", "José"]}, "greeting": {"enum": ["¿cómo estás?", "日本語 🎉"]},
                         "age": {"enum": [30, 41]}}}


def test_json_schema_keeps_key_order_and_streams_whole_characters(client, reference):
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    for seed in range(3):
        deltas, finish = _stream_text(client, messages=HI, temperature=1.0, seed=seed, max_tokens=120,
                                      response_format=fmt)
        text = "".join(deltas)
        assert finish == "stop" and list(json.loads(text)) == ["name", "greeting", "age"]
        assert all("\ufffd" not in d for d in deltas), deltas
        plain = client.chat.completions.create(model=MODEL, messages=HI, temperature=1.0, seed=seed,
                                               max_tokens=120, response_format=fmt)
        assert plain.choices[0].message.content == text
    # free JSON from a random model rarely ends: favour quotes and braces so it does
    bias = {str(reference.tokenizer.convert_tokens_to_ids(t)): 8.0 for t in ('"', "}")}
    obj = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=200, seed=5, logit_bias=bias,
                                         response_format={"type": "json_object"})
    assert obj.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(obj.choices[0].message.content), dict)


def test_n_choices_with_a_seed_are_reproducible_and_choice_i_uses_seed_plus_i(client):
    kw = dict(model=MODEL, messages=HI, temperature=1.0, max_tokens=12)
    a = client.chat.completions.create(n=3, seed=11, **kw)
    b = client.chat.completions.create(n=3, seed=11, **kw)
    texts = [c.message.content for c in sorted(a.choices, key=lambda c: c.index)]
    assert texts == [c.message.content for c in sorted(b.choices, key=lambda c: c.index)]
    assert client.chat.completions.create(n=1, seed=13, **kw).choices[0].message.content == texts[2]
    assert len(set(texts)) > 1


def test_logprobs_and_top_logprobs_come_back_per_token(client):
    r = client.chat.completions.create(model=MODEL, messages=HI, temperature=0, max_tokens=6, logprobs=True,
                                       top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for item in content:
        assert len(item.top_logprobs) == 3 and item.logprob == pytest.approx(item.top_logprobs[0].logprob)
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob >= item.top_logprobs[2].logprob
    c = client.completions.create(model=MODEL, prompt="hello", temperature=0, max_tokens=4, logprobs=2,
                                  extra_body={"ignore_eos": True})
    assert len(c.choices[0].logprobs.token_logprobs) == 4
    assert all(len(top) <= 2 for top in c.choices[0].logprobs.top_logprobs)


def test_stop_strings_cut_the_text_and_report_the_stop_reason(client):
    kw = dict(model=MODEL, prompt="the quick brown fox", temperature=0, max_tokens=40, extra_body={"ignore_eos": True})
    free = client.completions.create(**kw).choices[0].text
    stop = free[10:13]
    assert len(stop) == 3 and "\ufffd" not in stop
    cut = client.completions.create(stop=[stop], **kw).choices[0]
    assert cut.text == free[:free.index(stop)] and cut.finish_reason == "stop"
    assert cut.model_extra["stop_reason"] == stop
    kept = client.completions.create(stop=stop, **{**kw, "extra_body": {"ignore_eos": True,
                                                                        "include_stop_str_in_output": True}})
    assert kept.choices[0].text == free[:free.index(stop) + 3]
    streamed = "".join(c.choices[0].text for c in client.completions.create(stop=[stop], stream=True, **kw))
    assert streamed == cut.text


def test_sixteen_concurrent_streams_finish_and_nothing_leaks(server, client):
    results: dict[int, str] = {}

    def run(i: int) -> None:
        deltas, finish = _stream_text(client, messages=[{"role": "user", "content": f"req {i}"}],
                                      temperature=0.8, seed=i, max_tokens=30)
        results[i] = finish

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == list(range(16)) and all(f in ("stop", "length") for f in results.values())
    _assert_nothing_held(server)


def test_client_disconnecting_mid_stream_aborts_its_request_and_frees_everything(server):
    before = _stats(server)["finished"].get("abort", 0)
    body = {"model": MODEL, "messages": HI, "max_tokens": 900, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in got)
    stats = _wait_idle(server)
    assert stats["finished"].get("abort", 0) == before + 1, "the disconnect did not abort the request"
    _assert_nothing_held(server)


def test_bad_requests_get_openai_error_bodies(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HI, temperature=-1)
    assert e.value.body["param"] == "temperature" and "temperature" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=HI)
    assert e.value.body["code"] == "model_not_found"
    for bad in (dict(top_p=0), dict(n=0), dict(logprobs=True, top_logprobs=99), dict(max_tokens=10**6),
                dict(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}})):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=HI, **bad)
    for raw in (b"{not json", b'{"model": "toy"}', b'{"model": "toy", "messages": "hi"}'):
        r = httpx.post(server.url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert "Traceback" not in r.text
    _assert_nothing_held(server)


def test_overload_answers_429_and_a_stopped_engine_503(server, client, folder):
    engine = server.app.state.engine
    limit, engine.max_pending = engine.max_pending, 1
    try:
        body = {"model": MODEL, "messages": HI, "max_tokens": 900, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            next(lines)
            assert _stats(server)["in_flight"] == 1
            with pytest.raises(openai.RateLimitError):
                client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)
    finally:
        engine.max_pending = limit
    with LLM(folder, **ENGINE) as llm:
        app = build_app(llm, model_name=MODEL)
        with BackgroundServer(app) as other:
            app.state.engine.shutdown()
            r = httpx.post(other.url + "/v1/completions", json={"model": MODEL, "prompt": "hi"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stopped"
            assert httpx.get(other.url + "/health").status_code == 503
    _assert_nothing_held(server)
