"""A `tpsample serve` process against hostile or odd clients: body size and time limits, slow
or silent connections, API keys and Host headers, input that must stay off the event loop,
grammars that compile slowly, odd Unicode and integers, and bodies that must be strict JSON.

One server (a child process on 127.0.0.1, a port the OS picks) with small limits serves the
module; `ServeProcess` is shared with test_serve_shutdown.py. Raw-socket tests wait at most a
timeout plus a few seconds. Tests that need slow work inside the server (tokenizing, compiling a
grammar) run the app in this process and hold that work until they release it, so they hold on
any machine, however fast.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tpsample.testing.toy import make_chat_checkpoint

MODEL = "toy"
KEY = "test-key-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
ENGINE_ARGS = ["--dtype", "float32", "--kv-cache-tokens", "2048", "--max-num-seqs", "8"]
LIMITS = ["--max-body-mb", "3", "--max-messages", "100", "--max-prompt-chars", "2500000", "--max-pending", "4",
          "--timeout-header", "1", "--timeout-body", "1", "--timeout-keep-alive", "1", "--grammar-timeout", "2"]
HI = [{"role": "user", "content": "hello world"}]


def tiny_chat_model(folder: str) -> str:
    """A chat checkpoint small enough to start fast and split over TP = 1 and 3."""
    return make_chat_checkpoint(folder, hidden_size=48, num_heads=3, num_kv_heads=1, intermediate_size=96,
                                num_layers=1)


class ServeProcess:
    """`tpsample serve` in a child process on 127.0.0.1, at the port the OS picked (it prints it)."""

    def __init__(self, folder: str, *options: str, env: dict | None = None, startup_s: float = 120):
        cmd = [sys.executable, "-m", "tpsample.cli", "serve", folder, *ENGINE_ARGS, "--port", "0",
               "--served-model-name", MODEL, "--log-level", "warning", *options]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        self.log: list[str] = []
        deadline, self.url = time.monotonic() + startup_s, None
        while self.url is None and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("the server exited before it served:\n" + "".join(self.log))
            self.log.append(line)
            m = re.search(r"(http://[\d.]+:\d+)/v1", line)
            self.url = m and m.group(1)
        assert self.url, "the server did not start"
        self.port = int(self.url.rsplit(":", 1)[1])
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    def descendants(self) -> list[int]:
        """Every process below the server (workers, helpers), from /proc."""
        parents = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    pass
        found, frontier = [], [self.proc.pid]
        while frontier:
            kids = [pid for pid, ppid in parents.items() if ppid in frontier]
            found += kids
            frontier = kids
        return found

    def close(self) -> None:
        pids = self.descendants() if self.proc.poll() is None else []
        for pid in [self.proc.pid, *pids]:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        self.proc.wait()


def running(pid: int) -> bool:
    """The process exists and is not a zombie (a dead child its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def strict_json(text: str):
    """json.loads that refuses NaN and +-Infinity, as strict JSON parsers do."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_chat_model(str(tmp_path_factory.mktemp("hard")))


@pytest.fixture(scope="module")
def server(folder):
    srv = ServeProcess(folder, *LIMITS, env={"TPSAMPLE_API_KEY": KEY})
    yield srv
    srv.close()


def post(server, path: str, body=None, *, content: bytes | None = None, headers=None, timeout: float = 60):
    return httpx.post(server.url + path, json=body, content=content, timeout=timeout,
                      headers={**AUTH, "content-type": "application/json", **(headers or {})})


def assert_error(r, status: int, *words: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    err = strict_json(r.text)["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert all(w in err["message"] for w in words), err
    return err


class Hold:
    """Holds a call inside the server (`here()`) until the test releases it (at most a minute):
    work that takes as long as the test needs, however fast the machine."""

    def __init__(self):
        self.entered, self.released = threading.Event(), threading.Event()

    def here(self) -> None:
        self.entered.set()
        self.released.wait(60)

    def release(self) -> None:
        self.released.set()


def in_thread(call) -> tuple[threading.Thread, dict]:
    """Start `call` in a thread; its return value lands in the dict under "value"."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(value=call()))
    thread.start()
    return thread, result


@contextlib.contextmanager
def in_process_server(folder: str, *options: str):
    """The app on a background thread of this process (so a test can patch the engine), configured
    from `tpsample serve` options; yields (server, llm)."""
    from tpsample.cli import build_parser
    from tpsample.cli.serve import serve_config
    from tpsample.llm import LLM
    from tpsample.serve.app import build_app
    from tpsample.serve.server import BackgroundServer

    config = serve_config(build_parser().parse_args(["serve", *options]))
    with LLM(folder, dtype="float32", kv_cache_tokens=2048, max_num_seqs=8) as llm, \
            BackgroundServer(build_app(llm, model_name=MODEL, config=config)) as srv:
        yield srv, llm


def raw(server, data: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    if data:
        s.sendall(data)
    return s


def read_until_closed(s: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and when it closed (s after the call)."""
    start, got = time.monotonic(), b""
    s.settimeout(limit_s)
    try:
        while chunk := s.recv(65536):
            got += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    finally:
        s.close()
    return got, time.monotonic() - start


# -- access ------------------------------------------------------------------------------------
def test_v1_routes_need_the_api_key_and_health_stays_open(server):
    assert httpx.get(server.url + "/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        err = assert_error(httpx.get(server.url + "/v1/models", headers=headers), 401, "API key")
        assert err["code"] == "invalid_api_key"
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 2})
    assert_error(r, 401)
    assert httpx.get(server.url + "/v1/models", headers=AUTH).json()["data"][0]["id"] == MODEL


def test_a_foreign_host_header_is_refused_on_localhost(server):
    for host in ("evil.example", f"evil.example:{server.port}", "127.0.0.1.evil.example"):
        err = assert_error(httpx.get(server.url + "/v1/models", headers={**AUTH, "Host": host}), 403, "Host")
        assert err["code"] == "host_not_allowed"
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", "LOCALHOST"):
        assert httpx.get(server.url + "/v1/models", headers={**AUTH, "Host": host}).status_code == 200


def test_allowed_hosts_and_the_api_key_come_from_the_options_or_the_environment(monkeypatch):
    from tpsample.cli import build_parser
    from tpsample.cli.serve import serve_config

    def config(*argv):
        return serve_config(build_parser().parse_args(["serve", *argv]))

    monkeypatch.setenv("TPSAMPLE_API_KEY", "from-env")
    assert config().api_key == "from-env" and config("--api-key", "given").api_key == "given"
    monkeypatch.delenv("TPSAMPLE_API_KEY")
    assert config().api_key is None
    assert config().host_names("127.0.0.1") >= {"localhost", "127.0.0.1"} and config().host_names("0.0.0.0") is None
    assert config("--allowed-hosts", "api.example,Other.Example").host_names("127.0.0.1") == \
        {"api.example", "other.example"}
    assert config("--allowed-hosts", "*").host_names("127.0.0.1") is None


# -- request size and time ---------------------------------------------------------------------
def test_a_body_above_the_limit_is_a_413_before_it_is_read(server):
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n")
    got, _ = read_until_closed(raw(server, (head % (256 << 20)).encode()), 5)   # no byte of the body sent
    status, body = got.split(b"\r\n", 1)[0], got.split(b"\r\n\r\n", 1)[-1]
    assert b" 413 " in status and "--max-body-mb" in strict_json(body)["error"]["message"]


def test_a_chunked_body_is_a_413_once_it_crosses_the_limit(server):
    s = raw(server, (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
                     "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode())
    chunk = b"%x\r\n%s\r\n" % (1 << 20, b"x" * (1 << 20))
    got = b""
    for _ in range(8):                      # 8 MiB offered, the limit is 3 MiB
        try:
            s.sendall(chunk)
        except OSError:
            break
        s.settimeout(0.2)
        try:
            got = s.recv(65536)
        except TimeoutError:
            continue
        break
    s.close()
    assert b" 413 " in got.split(b"\r\n", 1)[0], got[:200]


def test_silent_and_trickling_connections_are_closed_after_the_header_timeout(server):
    _, waited = read_until_closed(raw(server), 6)
    assert waited < 4, "a connection that sends nothing stayed open"
    s = raw(server, b"GET /health HTTP/1.1\r\n")
    start = time.monotonic()
    try:
        for ch in b"Host: 127.0.0.1\r\nX-Slow: " + b"a" * 40:
            s.sendall(bytes([ch]))
            time.sleep(0.25)
            if time.monotonic() - start > 6:
                break
    except OSError:
        pass                                # closed by the server
    got, _ = read_until_closed(s, 2)
    assert time.monotonic() - start < 5 and b"200" not in got.split(b"\r\n", 1)[0]


def test_a_body_shorter_than_its_content_length_is_a_408_after_the_body_timeout(server):
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
    got, waited = read_until_closed(raw(server, head.encode()), 6)
    assert b" 408 " in got.split(b"\r\n", 1)[0] and waited < 4
    assert strict_json(got.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(server):
    s = raw(server, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    got, waited = read_until_closed(s, 6)
    assert got.startswith(b"HTTP/1.1 200") and waited < 4


# -- large and odd input -----------------------------------------------------------------------
def test_a_large_prompt_beyond_the_context_is_a_400_naming_the_context(server):
    prompt = "hello world the quick brown fox " * 70_000             # 2.2 M characters, under the limit
    assert_error(post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1}), 400, "context")
    assert httpx.get(server.url + "/health").status_code == 200


def test_tokenization_runs_off_the_event_loop_so_health_and_other_requests_go_on(folder, monkeypatch):
    hold = Hold()
    with in_process_server(folder) as (srv, llm):
        encode = llm.tokenizer.encode

        def held_encode(text, *args, **kwargs):
            if "HOLD" in text:
                hold.here()
            return encode(text, *args, **kwargs)
        monkeypatch.setattr(llm.tokenizer, "encode", held_encode)
        held, result = in_thread(lambda: post(srv, "/v1/completions", {"prompt": "HOLD hello", "max_tokens": 2}))
        try:
            assert hold.entered.wait(60), "the held prompt never reached the tokenizer"
            assert httpx.get(srv.url + "/health", timeout=10).status_code == 200       # while the tokenizer is held
            assert post(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 2}, timeout=10).status_code == 200
        finally:
            hold.release()
            held.join(timeout=60)
    assert result["value"].status_code == 200


def test_prompts_and_chats_above_the_size_limits_are_a_400_naming_the_limit(server):
    err = assert_error(post(server, "/v1/completions", {"prompt": "x" * 2_600_000}), 400, "--max-prompt-chars")
    assert err["param"] == "prompt"
    err = assert_error(post(server, "/v1/chat/completions", {"messages": HI * 101}), 400, "--max-messages")
    assert err["param"] == "messages"
    assert_error(post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "y" * 1_300_000}] * 2}),
                 400, "--max-prompt-chars")


def test_odd_text_is_a_400_never_a_500(server):
    lone = '"\\ud800"'
    cases = [("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
              "text must be a string"),
             ("/v1/chat/completions", '{"messages": [{"role": "user", "content": %s}]}' % lone, "surrogate"),
             ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": %s}]}]}'
              % lone, "surrogate"),
             ("/v1/completions", '{"prompt": %s}' % lone, "surrogate"),
             ("/v1/completions", '{"prompt": "a", "stop": [%s]}' % lone, "surrogate"),
             ("/v1/completions", '{"prompt": "a", "temperature": NaN}', "not valid JSON"),
             ("/v1/completions", b'{"prompt": "\xff"}', "not valid JSON"),
             ("/v1/completions", "[" * 100_000 + "]" * 100_000, "")]
    for path, body, words in cases:
        content = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
        assert_error(post(server, path, content=content), 400, words)


def test_integers_beyond_int64_are_a_400_and_the_engine_keeps_serving(server):
    chat = {"messages": HI, "max_tokens": 4}
    for bad in (dict(min_tokens=2**63), dict(min_tokens=10**30), dict(seed=2**63), dict(top_k=2**64),
                dict(logit_bias={str(10**30): 1}), dict(stop_token_ids=[2**63]), dict(max_completion_tokens=0),
                dict(max_tokens=0), dict(top_logprobs=2**63, logprobs=True)):
        name = next(iter(bad))
        err = assert_error(post(server, "/v1/chat/completions", {**chat, **bad}), 400, name)
        assert err["param"] == name, err
    assert_error(post(server, "/v1/completions", {"prompt": "hi", "logprobs": 2**64}), 400, "logprobs")
    r = post(server, "/v1/chat/completions", chat)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert httpx.get(server.url + "/health").status_code == 200


def test_n_above_the_pending_limit_is_a_400_naming_the_limit_not_a_429(server):
    err = assert_error(post(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 2, "n": 5}), 400,
                       "--max-pending", "4")
    assert err["param"] == "n"
    assert post(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 2, "n": 4}).status_code == 200


# -- structured output -------------------------------------------------------------------------
def _sse_objects(r) -> list:
    lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [strict_json(line.removeprefix("data: ")) for line in lines[:-1]]


def test_structured_output_with_logprobs_is_strict_json_with_minus_9999_for_forbidden_tokens(server):
    fmt = {"type": "json_object"}
    chat = {"messages": HI, "max_tokens": 6, "response_format": fmt, "logprobs": True, "top_logprobs": 5, "seed": 1}
    body = strict_json(post(server, "/v1/chat/completions", chat).text)
    tops = [t["logprob"] for item in body["choices"][0]["logprobs"]["content"] for t in item["top_logprobs"]]
    assert -9999.0 in tops
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**chat, "stream": True}, headers=AUTH,
                      timeout=60) as r:
        assert r.status_code == 200 and _sse_objects(r)
    comp = {"prompt": "hello", "max_tokens": 6, "response_format": fmt, "logprobs": 5, "seed": 1}
    body = strict_json(post(server, "/v1/completions", comp).text)
    assert -9999.0 in [v for top in body["choices"][0]["logprobs"]["top_logprobs"] for v in top.values()]
    with httpx.stream("POST", server.url + "/v1/completions", json={**comp, "stream": True}, headers=AUTH,
                      timeout=60) as r:
        assert r.status_code == 200 and _sse_objects(r)


def test_a_grammar_compiles_once_while_cached_and_the_cache_is_bounded(folder):
    from transformers import AutoTokenizer

    from tpsample.engine.request import GuidedDecoding
    from tpsample.engine.structured import GrammarBackend

    backend = GrammarBackend(AutoTokenizer.from_pretrained(folder), 500, max_cached=2)
    a, b, c = (GuidedDecoding(regex=r) for r in ("a+", "b+", "c+"))
    jobs = [backend.start(a) for _ in range(3)]                 # equal grammars share one job
    assert all(job is jobs[0] for job in jobs)
    jobs[0].result(timeout=60)
    backend.matcher(a)
    backend.compile(GuidedDecoding(regex="a+"))
    assert backend.num_compiled == 1
    backend.compile(b)
    backend.compile(c)
    assert backend.num_compiled == 3 and not backend.is_cached(a) and backend.is_cached(b) and backend.is_cached(c)


def test_an_exception_while_admitting_a_request_rejects_it_and_the_engine_goes_on(folder):
    from tpsample import SamplingParams
    from tpsample.llm import LLM

    with LLM(folder, dtype="float32", kv_cache_tokens=512, max_num_seqs=4) as llm:
        engine = llm._backend.engine
        make = engine.make_request

        def broken(*args, **kw):
            raise OverflowError("Python int too large to convert to C long")

        engine.make_request = broken
        with pytest.raises(ValueError, match="OverflowError"):
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
        engine.make_request = make
        assert len(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))[0].output_token_ids) == 2


def test_a_grammar_still_compiling_at_the_time_limit_is_a_400_and_stalls_no_other_request(folder, monkeypatch):
    from tpsample.engine.structured import GrammarBackend

    hold, compile_now = Hold(), GrammarBackend._compile

    def held_compile(self, key):
        if "held" in key[1]:
            hold.here()                     # compiling for as long as the test needs, on any machine
        return compile_now(self, key)
    monkeypatch.setattr(GrammarBackend, "_compile", held_compile)
    fmt = {"type": "json_schema", "json_schema": {"name": "held", "schema": {"type": "object", "title": "held"}}}
    with in_process_server(folder, "--grammar-timeout", "1") as (srv, _):
        slow, result = in_thread(lambda: post(srv, "/v1/chat/completions", {"messages": HI, "response_format": fmt}))
        try:
            assert hold.entered.wait(60), "the grammar never started compiling"
            assert post(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 4}).status_code == 200
            slow.join(timeout=60)
            assert hold.entered.is_set() and not hold.released.is_set()     # answered while still compiling
            assert_error(result["value"], 400, "did not compile within 1 s")
        finally:
            hold.release()
