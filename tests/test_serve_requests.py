"""Request bodies the server must refuse or count right: JSON types taken as they are, bodies a
cross-site page can send, text that is not Unicode, and finish counters that agree with what
clients receive. One in-process server on a tiny random model (127.0.0.1, a port the OS picks).
"""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tpsample.llm import LLM
from tpsample.serve.app import build_app
from tpsample.serve.server import BackgroundServer
from tpsample.testing.toy import make_chat_checkpoint

MODEL = "toy"
HI = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = make_chat_checkpoint(str(tmp_path_factory.mktemp("req")))
    with LLM(folder, dtype="float32", kv_cache_tokens=4096, max_num_seqs=8) as llm, \
            BackgroundServer(build_app(llm, model_name=MODEL)) as srv:
        yield srv


def post(server, path: str, body=None, *, content: bytes | None = None, headers=None):
    return httpx.post(server.url + path, json=body, content=content, timeout=60,
                      headers={"content-type": "application/json", **(headers or {})})


def assert_400_naming(r, field: str) -> None:
    assert r.status_code == 400, (field, r.status_code, r.text)
    err = r.json()["error"]
    assert err["param"].split(".")[0] == field and field in err["message"], err


def wait_idle(server, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        s = httpx.get(server.url + "/stats").json()
        if s["in_flight"] == 0 and s["resources"]["running"] == 0 or time.monotonic() > deadline:
            return s


MISTYPED = [("seed", "7"), ("max_tokens", "5"), ("temperature", "0.5"), ("n", "2"), ("stream", "true"),
            ("ignore_eos", 1), ("top_k", 2.0), ("logprobs", "2"), ("stop_token_ids", ["3"]),
            ("include_stop_str_in_output", "false"), ("min_tokens", True)]


@pytest.mark.parametrize("field,value", MISTYPED)
def test_a_field_of_the_wrong_json_type_is_a_400_naming_it(server, field, value):
    assert_400_naming(post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, field: value}), field)
    if field != "logprobs":                 # chat's logprobs is a boolean, completions' a number
        assert_400_naming(post(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 2, field: value}),
                          field)


def test_an_encoded_surrogate_or_other_invalid_utf8_is_a_400_on_every_endpoint(server):
    for path, body in (("/v1/completions", b'{"prompt": "\xed\xa0\x80"}'),
                       ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xed\xb0\x80"}]}'),
                       ("/v1/completions", '{"prompt": "é"}'.encode("utf-16"))):
        r = post(server, path, content=body)
        assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])
def test_a_body_that_is_not_sent_as_json_is_a_415_and_generates_nothing(server, content_type):
    before = wait_idle(server)["finished"]
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    r = httpx.post(server.url + "/v1/completions", content=body,
                   headers={"content-type": content_type} if content_type else {})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", r.text
    assert wait_idle(server)["finished"] == before
    ok = post(server, "/v1/completions", content=body, headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


def test_stats_count_stop_string_finishes_as_stop_as_the_client_saw_them(server):
    kw = {"prompt": "the quick brown fox", "temperature": 0, "max_tokens": 40, "ignore_eos": True}
    free = post(server, "/v1/completions", kw).json()["choices"][0]["text"]
    stop = free[10:13]
    before = wait_idle(server)["finished"]
    got = [post(server, "/v1/completions", {**kw, "stop": [stop]}).json()["choices"][0]["finish_reason"]
           for _ in range(3)]
    after = wait_idle(server)["finished"]
    assert got == ["stop"] * 3
    assert after.get("stop", 0) - before.get("stop", 0) == 3, (before, after)
    assert after.get("abort", 0) == before.get("abort", 0), (before, after)
