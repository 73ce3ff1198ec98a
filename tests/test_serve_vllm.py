"""What a script written for `vllm serve` sees: /metrics after real traffic (read with
prometheus_client's own parser), /tokenize and /detokenize, /version, model cards, prompt
logprobs (checked against transformers' forward), echo, structured outputs, token-in /
token-out generation, generation-config defaults and logit_bias. One in-process server on a
tiny random model, driven by the `openai` client and raw HTTP.
"""
from __future__ import annotations

import json
import math

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from tpsample import SamplingParams
from tpsample.llm import LLM
from tpsample.serve.app import build_app
from tpsample.serve.server import BackgroundServer
from tpsample.testing.toy import make_chat_checkpoint

MODEL = "toy"
HI = [{"role": "user", "content": "hello world"}]
ENGINE = dict(dtype="float32", kv_cache_tokens=4096, max_num_seqs=8)
VLLM_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:time_to_first_token_seconds",
                "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
                "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                "vllm:request_decode_time_seconds", "vllm:request_success", "vllm:num_preemptions",
                "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_chat_checkpoint(str(tmp_path_factory.mktemp("vllm")))


@pytest.fixture(scope="module")
def server(folder):
    with LLM(folder, **ENGINE) as llm, BackgroundServer(build_app(llm, model_name=MODEL)) as srv:
        srv.llm = llm
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def scrape(server) -> dict:
    """{(sample name, labels without model_name / engine): value}, every sample labelled with the model."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text):
        for s in family.samples:
            assert s.labels["model_name"] == MODEL and s.labels["engine"] == "0", s
            rest = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))
            out[s.name, rest] = s.value
    return out


def delta(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after[key] - before.get(key, 0.0)


def test_metrics_has_vllm_names_and_counters_move_by_exactly_what_clients_received(server, client):
    families = {f.name for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}
    assert set(VLLM_METRICS) <= families
    before, stats_before = scrape(server), httpx.get(server.url + "/stats").json()["finished"]
    prompt_tokens, completion_tokens, reasons, choices = 0, 0, [], 0
    for kw in (dict(max_tokens=5), dict(max_tokens=7, n=2, seed=1), dict(max_tokens=30, stop=["e"])):
        r = client.chat.completions.create(model=MODEL, messages=HI, **kw)
        prompt_tokens += r.usage.prompt_tokens
        completion_tokens += r.usage.completion_tokens
        reasons += [c.finish_reason for c in r.choices]
    c = client.completions.create(model=MODEL, prompt="the quick brown fox", max_tokens=6,
                                  stream=True, stream_options={"include_usage": True})
    chunks = list(c)
    usage = chunks[-1].usage
    prompt_tokens, completion_tokens = prompt_tokens + usage.prompt_tokens, completion_tokens + usage.completion_tokens
    reasons += [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    choices = len(reasons)
    after = scrape(server)
    assert delta(before, after, "vllm:prompt_tokens_total") == prompt_tokens
    assert delta(before, after, "vllm:generation_tokens_total") == completion_tokens
    for reason in ("stop", "length", "abort", "error"):
        got = delta(before, after, "vllm:request_success_total", finished_reason=reason)
        assert got == reasons.count(reason), (reason, reasons)
        stats = httpx.get(server.url + "/stats").json()["finished"]
        assert stats.get(reason, 0) - stats_before.get(reason, 0) == got
    for name in ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
                 "request_decode_time_seconds", "time_to_first_token_seconds"):
        assert delta(before, after, f"vllm:{name}_count") == choices, name
    assert delta(before, after, "vllm:inter_token_latency_seconds_count") == completion_tokens - choices
    assert delta(before, after, "vllm:time_to_first_token_seconds_sum") > 0
    assert after["vllm:num_requests_running", ()] == 0 and after["vllm:kv_cache_usage_perc", ()] == 0


def test_tokenize_and_detokenize_answer_as_vllm(server, client):
    tok = server.llm.tokenizer
    r = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": "hello world", "return_token_strs": True})
    ids = tok.encode("hello world")
    assert r.json() == {"count": len(ids), "max_model_len": server.llm.info.max_model_len, "tokens": ids,
                        "token_strs": tok.convert_ids_to_tokens(ids)}
    chat = httpx.post(server.url + "/tokenize", json={"messages": HI}).json()
    expected = tok.encode(tok.apply_chat_template(HI, tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False)
    assert chat["tokens"] == expected and chat["token_strs"] is None
    plain = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=1)
    assert plain.usage.prompt_tokens == chat["count"]
    assert httpx.post(server.url + "/detokenize", json={"tokens": ids}).json() == {"prompt": "hello world"}
    r = httpx.post(server.url + "/detokenize", json={"tokens": [10**6]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    r = httpx.post(server.url + "/tokenize", json={"prompt": "a", "messages": HI})
    assert r.status_code == 400


def test_models_and_version(server, client):
    card = client.models.list().data[0]
    assert card.id == MODEL and card.owned_by == "tpsample"
    assert card.model_extra["root"] == server.llm.config.model
    assert card.model_extra["max_model_len"] == server.llm.info.max_model_len
    assert httpx.get(server.url + "/version").json()["version"]


def reference_logprobs(folder: str, ids: list[int]) -> torch.Tensor:
    """log_softmax of transformers' logits, fp64: row i predicts ids[i + 1]."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)


def test_prompt_logprobs_are_the_prompt_tokens_logprobs_under_the_model(server, client, folder):
    prompt = [5, 17, 42, 99, 7, 3, 250, 11]
    ref = reference_logprobs(folder, prompt)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, extra_body={"prompt_logprobs": 3})
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(prompt)
    for i, entry in enumerate(plp[1:]):
        mine = entry[str(prompt[i + 1])]
        assert mine["logprob"] == pytest.approx(ref[i, prompt[i + 1]].item(), abs=1e-4)
        assert mine["rank"] == 1 + int((ref[i] > ref[i, prompt[i + 1]]).sum())
        top = sorted((v for k, v in entry.items() if k != str(prompt[i + 1]) or v["rank"] <= 3),
                     key=lambda v: v["rank"])
        best = ref[i].topk(3).values.tolist()
        assert [v["logprob"] for v in top[:3]] == pytest.approx(best, abs=1e-4)
    g = httpx.post(server.url + "/inference/v1/generate",
                   json={"token_ids": prompt, "sampling_params": {"max_tokens": 2, "prompt_logprobs": 3}}).json()
    assert g["prompt_logprobs"] == plp
    chat = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=1, extra_body={"prompt_logprobs": 0})
    assert chat.model_extra["prompt_logprobs"][0] is None
    assert all(len(e) == 1 for e in chat.model_extra["prompt_logprobs"][1:])
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", stream=True, extra_body={"prompt_logprobs": 1})


def test_echo_returns_the_prompt_with_its_logprobs_streamed_or_not(server, client):
    kw = dict(model=MODEL, prompt="hello world", temperature=0, logprobs=1)
    plain = client.completions.create(max_tokens=4, **kw).choices[0]
    echo = client.completions.create(max_tokens=4, echo=True, **kw).choices[0]
    assert echo.text == "hello world" + plain.text
    assert echo.logprobs.token_logprobs[0] is None
    assert echo.logprobs.token_logprobs[2:] == plain.logprobs.token_logprobs
    assert echo.logprobs.text_offset[2:] == [o + len("hello world") for o in plain.logprobs.text_offset]
    only = client.completions.create(max_tokens=0, echo=True, **kw)
    assert only.choices[0].text == "hello world" and only.usage.completion_tokens == 0
    assert only.choices[0].logprobs.token_logprobs == echo.logprobs.token_logprobs[:2]
    streamed = list(client.completions.create(max_tokens=4, echo=True, stream=True, **kw))
    assert "".join(c.choices[0].text for c in streamed) == echo.text
    assert [v for c in streamed for v in c.choices[0].logprobs.token_logprobs] == echo.logprobs.token_logprobs
    msgs = HI + [{"role": "assistant", "content": "I am"}]
    chat = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3, temperature=0,
                                          extra_body={"echo": True, "continue_final_message": True})
    assert chat.choices[0].message.content.startswith("I am")


def test_structured_outputs_constrain_the_answer(client):
    def ask(**so):
        r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=40, seed=3,
                                           extra_body={"structured_outputs": so})
        return r.choices[0]

    assert ask(choice=["yes", "no", "maybe not"]).message.content in ("yes", "no", "maybe not")
    assert ask(regex="[a-c]{3}x").message.content[-1] == "x"
    assert ask(grammar='root ::= "ab" | "cd" "e"').message.content in ("ab", "cde")
    schema = {"type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"], "additionalProperties": False}
    assert json.loads(ask(json=schema).message.content)["n"] in (1, 2)
    for bad in ({}, {"regex": "a", "choice": ["b"]}, {"grammar": "root ::= ("}):
        with pytest.raises(openai.BadRequestError):
            ask(**bad)


def test_token_in_token_out_generate_matches_completions_streamed_or_not(server, client):
    prompt, params = [5, 17, 42, 99], {"max_tokens": 6, "temperature": 0.8, "seed": 4, "logprobs": 1}
    g = httpx.post(server.url + "/inference/v1/generate", json={"token_ids": prompt, "sampling_params": params}).json()
    c = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0.8, seed=4,
                                  extra_body={"return_token_ids": True})
    assert g["choices"][0]["token_ids"] == c.choices[0].model_extra["token_ids"]
    content = g["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in g["choices"][0]["token_ids"]]
    assert g["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}
    with httpx.stream("POST", server.url + "/inference/v1/generate",
                      json={"token_ids": prompt, "sampling_params": params, "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert [t for ch in chunks for t in ch["choices"][0]["token_ids"]] == g["choices"][0]["token_ids"]


def test_logit_bias_is_clamped_to_100_and_ids_outside_the_vocabulary_are_refused(server, client):
    kw = dict(model=MODEL, prompt="hi", max_tokens=5, temperature=1.0, seed=2)
    huge = client.completions.create(logit_bias={"7": 1e6, "9": -1e6}, **kw)
    clamped = client.completions.create(logit_bias={"7": 100, "9": -100}, **kw)
    assert huge.choices[0].text == clamped.choices[0].text
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(logit_bias={str(server.llm.info.vocab_size): 1}, **kw)
    assert e.value.body["param"] == "logit_bias"


def test_generation_config_fills_only_the_fields_a_request_leaves_out(folder, tmp_path):
    from tpsample.serve.config import ServeConfig
    from tpsample.serve.inputs import Preparer
    from tpsample.serve.sampling import generation_defaults

    with open(f"{folder}/generation_config.json") as f:
        base = json.load(f)
    model = tmp_path / "m"
    model.mkdir()
    (model / "generation_config.json").write_text(json.dumps({**base, "temperature": 0.6, "top_k": 20,
                                                              "max_new_tokens": 7}))
    defaults = generation_defaults("auto", str(model), {"top_p": 0.5})
    assert defaults == {"temperature": 0.6, "top_k": 20, "max_tokens": 7, "top_p": 0.5}
    assert generation_defaults("vllm", str(model)) == {} == generation_defaults("none", str(model))
    with LLM(folder, **ENGINE) as llm:
        prep = Preparer(llm.tokenizer, model_names=(MODEL,), max_model_len=llm.info.max_model_len,
                        config=ServeConfig(), defaults=defaults)

        def params(**body):
            job = prep._prepare("chat", json.dumps({"messages": HI, **body}).encode())
            return job.params[0]

        p = params()
        assert (p.temperature, p.top_k, p.top_p, p.max_tokens) == (0.6, 20, 0.5, 7)
        p = params(temperature=1.0, top_k=None, max_tokens=3)
        assert (p.temperature, p.top_k, p.top_p, p.max_tokens) == (1.0, 20, 0.5, 3)
        g = prep._prepare("generate", json.dumps({"token_ids": [1, 2], "sampling_params": {}}).encode()).params[0]
        assert (g.temperature, g.top_k, g.max_tokens) == (1.0, -1, 7)     # vLLM's SamplingParams defaults
    (model / "generation_config.json").write_text('{"temperature": ')
    with pytest.raises(ValueError, match="generation_config.json"):
        generation_defaults("auto", str(model))
    (model / "generation_config.json").write_text('{"temperature": "hot"}')
    with pytest.raises(ValueError, match="generation_config.json: temperature must be a number"):
        generation_defaults("auto", str(model))
    with pytest.raises(ValueError, match="--override-generation-config"):
        generation_defaults("vllm", str(model), {"temperature": -1})


def test_llm_generate_returns_prompt_logprobs_across_prefill_chunks(folder):
    prompt = list(range(3, 40))
    ref = reference_logprobs(folder, prompt)
    with LLM(folder, max_num_batched_tokens=8, **ENGINE) as llm:       # the prompt prefills in 5 chunks
        out = llm.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    got = [lp.logprob for lp in out.prompt_logprobs[1:]]
    expected = [ref[i, prompt[i + 1]].item() for i in range(len(prompt) - 1)]
    assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-4 and all(math.isfinite(v) for v in got)


def test_a_malformed_generation_config_stops_serve_in_one_line_naming_it(folder, tmp_path, capsys):
    import shutil

    from tpsample.cli import main

    bad = shutil.copytree(folder, tmp_path / "bad")
    args = ["serve", str(bad), "--port", "0", "--dtype", "float32", "--kv-cache-tokens", "1024"]
    for content, words in (('{"temperature": ', "generation_config.json is not a readable JSON file"),
                           ('{"temperature": "hot"}', "generation_config.json: temperature must be a number"),
                           ("{}", "--override-generation-config: 'temprature'")):
        (bad / "generation_config.json").write_text(content)
        extra = ["--override-generation-config", '{"temprature": 1}'] if content == "{}" else []
        assert main(args + extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
