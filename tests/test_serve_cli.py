"""The commands as a user runs them: `tpsample serve` (answers, then stops on Ctrl-C),
`tpsample chat` and `generate --chat --stream` (text), `bench serve`, and one-line errors."""
from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tpsample import SamplingParams
from tpsample.cli import main
from tpsample.llm import LLM
from tpsample.testing.toy import make_chat_checkpoint

ENGINE_ARGS = ["--dtype", "float32", "--kv-cache-tokens", "2048", "--max-num-seqs", "8"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_chat_checkpoint(str(tmp_path_factory.mktemp("cli")), vocab_size=400)


@pytest.fixture(scope="module")
def reference(folder):
    with LLM(folder, dtype="float32", kv_cache_tokens=2048, max_num_seqs=8) as llm:
        yield llm


def test_user_mistakes_are_one_line_and_exit_2(folder, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        cases = [("serve", folder, "--port", "99999"), ("serve", folder, "--port", str(taken.getsockname()[1])),
                 ("serve", folder, "--tp", "0", "--port", "0"), ("bench", "serve", "--clients", "0"),
                 ("generate", "--model", folder, "--chat", "--prompt-ids", "1,2"),
                 ("generate", "--model", folder, "--prompt", "x", "--stop", "")]
        for args in cases:
            assert main(list(args)) == 2, args
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_chat_and_generate_stream_text(folder, reference, capsys, monkeypatch):
    params = SamplingParams(temperature=0, max_tokens=8)
    first = reference.chat([{"role": "user", "content": "hello"}], params)[0].text
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(["chat", folder, *ENGINE_ARGS, "--temperature", "0", "--max-tokens", "8"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "assistant> " + first.splitlines()[0]
    assert main(["generate", "--model", folder, *ENGINE_ARGS, "--chat", "--stream", "--prompt", "hello",
                 "--temperature", "0", "--max-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(first) and not re.search(r"\+\[\d", out), "text, not token ids"


def test_serve_answers_and_stops_cleanly_on_ctrl_c(folder, reference):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "tpsample.cli", "serve", folder, *ENGINE_ARGS, "--port", "0",
                             "--served-model-name", "toy", "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        url, deadline = None, time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "the server exited before it served"
            m = re.search(r"(http://[\d.]+:\d+)/v1", line)
            url = m and m.group(1)
        body = {"model": "toy", "messages": [{"role": "user", "content": "hello"}], "temperature": 0, "max_tokens": 8}
        got = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()
        expected = reference.chat(body["messages"], SamplingParams(temperature=0, max_tokens=8))[0].text
        assert got["choices"][0]["message"]["content"] == expected
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bench_serve_reports_latency_percentiles_and_no_leak(folder, capsys):
    assert main(["bench", "serve", "--model", folder, *ENGINE_ARGS, "--clients", "3", "--duration", "2",
                 "--max-tokens", "6"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["requests"] > 0 and result["errors"] == 0 and result["idle"]
    assert result["leaked_kv_blocks"] == 0 and result["leaked_sampler_slots"] == 0
    assert result["ttft_ms"]["p50"] <= result["ttft_ms"]["p99"]


def test_bench_serve_report_records_what_produced_it(folder, tmp_path, capsys):
    out = tmp_path / "serve.json"
    assert main(["bench", "serve", "--model", folder, *ENGINE_ARGS, "--clients", "1", "--duration", "1",
                 "--max-tokens", "2", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    written = json.loads(out.read_text())
    assert printed == written and written["bench"] == "serve" and written["requests"] > 0
    assert {"commit", "date", "device", "torch", "command"} <= set(written["meta"])


def test_chat_applies_the_sampling_options_of_generate(folder, reference, capsys, monkeypatch):
    greedy = reference.chat([{"role": "user", "content": "hello"}], SamplingParams(temperature=0, max_tokens=8))
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(["chat", folder, *ENGINE_ARGS, "--top-k", "1", "--seed", "3", "--max-tokens", "8"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "assistant> " + greedy[0].text.splitlines()[0]
