"""Every field of every request schema is applied or refused with a 400 naming it.

The schemas' fields are enumerated from the pydantic models (plus the fields refused by name,
`protocol.REFUSED`); each must have a probe here, and each probe shows its field's effect on a
real answer of a server on a tiny random model (greedy, so outputs are exact): a value that must
change the tokens, the text, the prompt or the shape of the answer, or a 400 whose `param` is the
field. Adding a field to a schema without a probe fails `test_every_field_has_a_probe`.
"""
from __future__ import annotations

import json

import httpx
import pytest

from tpsample.llm import LLM
from tpsample.serve import protocol as P
from tpsample.serve.app import build_app
from tpsample.serve.server import BackgroundServer
from tpsample.testing.toy import TOY_CHAT_TEMPLATE, make_chat_checkpoint

MODEL = "toy"
HI = [{"role": "user", "content": "hello world"}]
EOS = 0
# the chat template also shows a variable that chat_template_kwargs can set
TEMPLATE = TOY_CHAT_TEMPLATE + "{% if suffix is defined %}{{ suffix }}{% endif %}"


def fields_checkpoint(folder: str) -> str:
    """A chat checkpoint whose tokenizer adds a BOS (id 0) and whose template takes a variable."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    make_chat_checkpoint(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", EOS)])
    tok.chat_template = TEMPLATE
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = fields_checkpoint(str(tmp_path_factory.mktemp("fields")))
    with LLM(folder, dtype="float32", kv_cache_tokens=4096, max_num_seqs=8) as llm, \
            BackgroundServer(build_app(llm, model_name=MODEL)) as srv:
        srv.tokenizer = llm.tokenizer
        yield srv


class Answer:
    """One answer, the same view for every endpoint (choice 0 unless said)."""

    def __init__(self, r: httpx.Response, kind: str):
        self.status, self.kind = r.status_code, kind
        self.stream = r.headers.get("content-type", "").startswith("text/event-stream")
        if self.stream:
            self.chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                           if line.startswith("data: ") and line != "data: [DONE]"]
            self.body = {}
            return
        self.body = r.json()
        self.error = self.body.get("error")

    @property
    def choice(self) -> dict:
        return self.body["choices"][0]

    @property
    def tokens(self) -> list[int]:
        return self.choice["token_ids"]

    @property
    def text(self) -> str:
        return self.choice["message"]["content"] if self.kind == "chat" else self.choice.get("text")


def ask(server, kind: str, **fields) -> Answer:
    """A greedy request of 8 tokens with token ids returned, with `fields` on top (None drops one)."""
    path = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "generate": "/inference/v1/generate"}
    if kind == "generate":                  # sampling fields go into sampling_params
        inner = {k: fields.pop(k) for k in list(fields) if k in P.GenerateSamplingParams.model_fields}
        params = {"temperature": 0, "max_tokens": 8, "ignore_eos": True, **inner}
        body = {"token_ids": [5, 17, 42, 99], "sampling_params": {k: v for k, v in params.items() if v is not None},
                **fields}
    else:
        body = {"max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                **({"messages": HI} if kind == "chat" else {"prompt": "hello world"}), **fields}
    body = {k: v for k, v in body.items() if v is not None}
    return Answer(httpx.post(server.url + path[kind], json=body, timeout=60), kind)


def refused(a: Answer, field: str) -> bool:
    return a.status == 400 and a.error["param"].split(".")[-1] == field


# -- probes: field -> check(server, kind) ---------------------------------------------------------
_GREEDY: dict = {}


def _greedy(server, kind):
    """The plain answer (asked once per server and endpoint)."""
    if (server.url, kind) not in _GREEDY:
        _GREEDY[server.url, kind] = ask(server, kind)
    return _GREEDY[server.url, kind]


def same_as_greedy(**fields):
    return lambda server, kind: ask(server, kind, **fields).tokens == _greedy(server, kind).tokens


def differs_from_greedy(**fields):
    return lambda server, kind: ask(server, kind, **fields).tokens != _greedy(server, kind).tokens


def refuses(field, value):
    return lambda server, kind: refused(ask(server, kind, **{field: value}), field)


def accepts_and_refuses(field, ok, bad):
    return lambda server, kind: ask(server, kind, **{field: ok}).status == 200 and refused(
        ask(server, kind, **{field: bad}), field)


def _token_after(server, kind, i):
    return _greedy(server, kind).tokens[i]


def _seed(server, kind):
    a, b = (ask(server, kind, temperature=1.0, seed=s).tokens for s in (1, 2))
    return a == ask(server, kind, temperature=1.0, seed=1).tokens and a != b


def _stop_string(text: str) -> str:
    """Two characters from inside the text (no replacement character)."""
    return next(text[i:i + 2] for i in range(1, len(text) - 1) if "\ufffd" not in text[i:i + 2])


def _stop(server, kind):
    text = ask(server, kind, max_tokens=24).text
    stop = _stop_string(text)
    a = ask(server, kind, stop=[stop], max_tokens=24)
    return a.choice["finish_reason"] == "stop" and a.text == text[:text.index(stop)]


def _include_stop(server, kind):
    text = ask(server, kind, max_tokens=24).text
    stop = _stop_string(text)
    return ask(server, kind, stop=[stop], max_tokens=24, include_stop_str_in_output=True).text == \
        text[:text.index(stop) + 2]


def _stop_token_ids(server, kind):
    t = _token_after(server, kind, 2)
    a = ask(server, kind, stop_token_ids=[t])
    return a.tokens[-1] == t and len(a.tokens) <= 3 and a.choice.get("stop_reason", t) == t


def _eos_forced(server, kind, **fields):
    return ask(server, kind, logit_bias={str(EOS): 100}, **fields)


def _ignore_eos(server, kind):
    return len(_eos_forced(server, kind, ignore_eos=None).tokens) == 1 and \
        len(_eos_forced(server, kind, ignore_eos=True).tokens) == 8


def _min_tokens(server, kind):
    return len(_eos_forced(server, kind, ignore_eos=None, min_tokens=4).tokens) == 5


def _skip_special_tokens(server, kind):
    return "<|endoftext|>" not in _eos_forced(server, kind).text and \
        "<|endoftext|>" in _eos_forced(server, kind, skip_special_tokens=False).text


def _logit_bias(server, kind):
    return set(ask(server, kind, logit_bias={"7": 100}).tokens) == {7}


def _allowed(server, kind):
    return set(ask(server, kind, allowed_token_ids=[9, 11]).tokens) <= {9, 11}


def _bad_words(server, kind):
    (hello,) = server.tokenizer.encode("hello", add_special_tokens=False)
    forced = {str(hello): 100}
    return set(ask(server, kind, logit_bias=forced).tokens) == {hello} and \
        hello not in ask(server, kind, logit_bias=forced, bad_words=["hello"]).tokens


# twenty tokens far above the rest: greedy repeats the best of them until a penalty moves it
FAVOURED = {str(t): 10.0 for t in range(20, 40)}


def penalised(**penalty):
    return lambda server, kind: ask(server, kind, logit_bias=FAVOURED, **penalty).tokens != ask(
        server, kind, logit_bias=FAVOURED).tokens


def _prompt_ids(a: Answer) -> list[int]:
    return a.body["prompt_token_ids"]


def _truncate(server, kind):
    full = _prompt_ids(_greedy(server, kind))
    return _prompt_ids(ask(server, kind, truncate_prompt_tokens=3)) == full[-3:]


def _truncation_side(server, kind):
    full = _prompt_ids(_greedy(server, kind))
    return _prompt_ids(ask(server, kind, truncate_prompt_tokens=3, truncation_side="right")) == full[:3]


def _add_special_tokens(server, kind):
    default, flipped = _prompt_ids(_greedy(server, kind)), _prompt_ids(
        ask(server, kind, add_special_tokens=kind == "chat"))
    return (default[0] == EOS) != (flipped[0] == EOS) and default[-1] == flipped[-1]


def _prompt_logprobs(server, kind):
    a = ask(server, kind, prompt_logprobs=1)
    plp = a.body["prompt_logprobs"] if kind == "chat" else a.choice["prompt_logprobs"]
    return plp[0] is None and len(plp) == a.body["usage"]["prompt_tokens"]


def _echo(server, kind):
    if kind == "chat":
        msgs = HI + [{"role": "assistant", "content": "hi there"}]
        return ask(server, kind, messages=msgs, echo=True, continue_final_message=True).text.startswith("hi there")
    return ask(server, kind, echo=True).text == "hello world" + _greedy(server, kind).text


def _return_token_ids(server, kind):
    return "token_ids" not in ask(server, kind, return_token_ids=None).choice and "token_ids" in _greedy(server, kind).choice


def _as_token_ids(server, kind):
    lp = {"logprobs": True} if kind == "chat" else {"logprobs": 1}
    a = ask(server, kind, return_tokens_as_token_ids=True, **lp)
    first = a.choice["logprobs"]["content"][0]["token"] if kind == "chat" else a.choice["logprobs"]["tokens"][0]
    return first == f"token_id:{a.tokens[0]}"


def _structured(server, kind):
    a = ask(server, kind, structured_outputs={"choice": ["yes", "no"]}, ignore_eos=None)
    return a.text in ("yes", "no")


def _response_format(server, kind):
    a = ask(server, kind, response_format={"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"enum": ["abc", "de"]}}}, ignore_eos=None, max_tokens=16)
    return json.loads(a.text) in ("abc", "de")


def _stream(server, kind):
    a = ask(server, kind, stream=True, return_token_ids=None)
    return a.stream and a.chunks[-1]["choices"][0]["finish_reason"] == "length"


def _stream_options(server, kind):
    a = ask(server, kind, stream=True, return_token_ids=None,
            stream_options={"include_usage": True, "continuous_usage_stats": True})
    return a.chunks[-1]["usage"]["completion_tokens"] == 8 and all("usage" in c for c in a.chunks) and \
        refused(ask(server, kind, stream_options={"include_usage": True}), "stream_options")


def _request_id(server, kind):
    return ask(server, kind, request_id="abc123").body["id"].endswith("-abc123")


def _model(server, kind):
    return ask(server, kind, model=MODEL).status == 200 and ask(server, kind, model="other").status == 404


def _n(server, kind):
    return len(ask(server, kind, n=2, temperature=1.0, seed=3).body["choices"]) == 2 and refused(
        ask(server, kind, n=0), "n")


def _max_tokens(field):
    return lambda server, kind: len(ask(server, kind, **{field: 3}).tokens) == 3


def _logprobs(server, kind):
    if kind == "chat":
        a = ask(server, kind, logprobs=True, top_logprobs=2)
        return len(a.choice["logprobs"]["content"]) == 8 and len(a.choice["logprobs"]["content"][0]["top_logprobs"]) == 2
    lps = ask(server, kind, logprobs=2).choice["logprobs"]      # top-n keyed by text: equal texts merge
    return len(lps["token_logprobs"]) == 8 and max(len(top) for top in lps["top_logprobs"]) == 2


def _top_logprobs(server, kind):
    return len(ask(server, kind, logprobs=True, top_logprobs=3).choice["logprobs"]["content"][0]["top_logprobs"]) == 3


def _generation_prompt(server, kind):
    return len(_prompt_ids(ask(server, kind, add_generation_prompt=False))) < len(_prompt_ids(_greedy(server, kind)))


def _continue_final(server, kind):
    msgs = HI + [{"role": "assistant", "content": "hi"}]
    closed = _prompt_ids(ask(server, kind, messages=msgs, add_generation_prompt=False))
    open_ = _prompt_ids(ask(server, kind, messages=msgs, continue_final_message=True))
    return closed != open_ and refused(ask(server, kind, messages=msgs, continue_final_message=True,
                                           add_generation_prompt=True), "add_generation_prompt")


def _template_kwargs(server, kind):
    return len(_prompt_ids(ask(server, kind, chat_template_kwargs={"suffix": "hello hello"}))) > \
        len(_prompt_ids(_greedy(server, kind))) and refused(
        ask(server, kind, chat_template_kwargs={"tokenize": True}), "chat_template_kwargs")


def _best_of(server, kind):
    return ask(server, kind, best_of=1).status == 200 and refused(ask(server, kind, best_of=3), "best_of")


def _messages(server, kind):
    other = ask(server, kind, messages=[{"role": "user", "content": "the quick brown fox"}])
    return _prompt_ids(other) != _prompt_ids(_greedy(server, kind)) and refused(ask(server, kind, messages=[]), "messages")


def _prompt(server, kind):
    return _prompt_ids(ask(server, kind, prompt=[3, 4, 5])) == [3, 4, 5]


def _user(server, kind):
    return ask(server, kind, user="someone").tokens == _greedy(server, kind).tokens     # accepted: no effect


def _differs(field, on, off, **common):
    """The field changes the answer: `field=on` against `field=off`, with `common` on both."""
    return lambda server, kind: ask(server, kind, **common, **{field: on}).tokens != ask(
        server, kind, **common, **{field: off}).tokens


REPEATED = {"70": 30.0}         # greedy then repeats token 70, which DRY penalises (no breaker)
_DRY = dict(logit_bias=REPEATED, dry_multiplier=5.0, dry_base=4.0, dry_allowed_length=1)


def _dry_breakers(server, kind):
    fav = server.tokenizer.decode([int(next(iter(REPEATED)))])
    return ask(server, kind, **_DRY, dry_sequence_breakers=[fav]).tokens != ask(
        server, kind, **_DRY, dry_sequence_breakers=[]).tokens


def _logprobs_mode(server, kind):
    def first(mode):
        a = ask(server, kind, logprobs=True if kind == "chat" else 1, logprobs_mode=mode)
        lps = a.choice["logprobs"]
        return lps["content"][0]["logprob"] if kind == "chat" else lps["token_logprobs"][0]
    return first("raw_logits") != first("raw_logprobs")


def _kept_support(server, kind):
    ks = ask(server, kind, kept_support=2, temperature=1.0, seed=0, top_k=5).choice["kept_support"]
    return len(ks) == 8 and all(s["count"] == 5 and len(s["token_ids"]) == 2 for s in ks)


SAMPLERS = {
    "dry_multiplier": _differs("dry_multiplier", 5.0, 0.0, logit_bias=REPEATED, dry_base=4.0, dry_allowed_length=1),
    "dry_base": _differs("dry_base", 100.0, 1.01, logit_bias=REPEATED, dry_multiplier=0.01, dry_allowed_length=1),
    "dry_allowed_length": _differs("dry_allowed_length", 1, 50, logit_bias=REPEATED, dry_multiplier=5.0, dry_base=4.0),
    "dry_penalty_last_n": _differs("dry_penalty_last_n", -1, 1, **_DRY),
    "dry_sequence_breakers": _dry_breakers,
    "xtc_probability": _differs("xtc_probability", 1.0, 0.0, temperature=1.0, seed=0, xtc_threshold=0.0001),
    "xtc_threshold": _differs("xtc_threshold", 0.0001, 0.5, temperature=1.0, seed=0, xtc_probability=1.0),
    "top_n_sigma": same_as_greedy(temperature=1.0, seed=0, top_n_sigma=0.0001),
    "logprobs_mode": _logprobs_mode, "kept_support": _kept_support,
}


SHARED = {
    **SAMPLERS, "model": _model, "max_tokens": _max_tokens("max_tokens"), "temperature": differs_from_greedy(temperature=1.5, seed=0),
    "top_p": same_as_greedy(temperature=1.0, top_p=1e-9, seed=0), "n": _n, "stream": _stream,
    "stream_options": _stream_options, "stop": _stop, "seed": _seed,
    "presence_penalty": penalised(presence_penalty=2.0), "frequency_penalty": penalised(frequency_penalty=2.0), "logit_bias": _logit_bias, "response_format": _response_format, "user": _user,
    "request_id": _request_id, "priority": accepts_and_refuses("priority", 0, 1),
    "top_k": same_as_greedy(temperature=1.0, top_k=1, seed=0), "min_p": same_as_greedy(temperature=1.0, min_p=1.0, seed=0),
    "repetition_penalty": penalised(repetition_penalty=3.0), "min_tokens": _min_tokens,
    "ignore_eos": _ignore_eos, "stop_token_ids": _stop_token_ids, "include_stop_str_in_output": _include_stop,
    "skip_special_tokens": _skip_special_tokens,
    "spaces_between_special_tokens": accepts_and_refuses("spaces_between_special_tokens", True, False),
    "allowed_token_ids": _allowed, "bad_words": _bad_words, "truncate_prompt_tokens": _truncate,
    "truncation_side": _truncation_side, "prompt_logprobs": _prompt_logprobs, "echo": _echo,
    "add_special_tokens": _add_special_tokens, "return_token_ids": _return_token_ids,
    "return_tokens_as_token_ids": _as_token_ids, "structured_outputs": _structured, "logprobs": _logprobs,
}
PROBES = {
    "chat": {**SHARED, "messages": _messages, "max_completion_tokens": _max_tokens("max_completion_tokens"),
             "top_logprobs": _top_logprobs, "add_generation_prompt": _generation_prompt,
             "continue_final_message": _continue_final, "chat_template_kwargs": _template_kwargs},
    "completion": {**SHARED, "prompt": _prompt, "best_of": _best_of},
}


def _g_stop(server, kind):
    a = ask(server, kind, stop=["e"], max_tokens=24, logit_bias={str(server.tokenizer.convert_tokens_to_ids("e")): 5})
    return a.choice["finish_reason"] == "stop" and len(a.tokens) < 24


def _g_detokenize(server, kind):
    return ask(server, kind, stop=["e"], detokenize=True).status == 200 and refused(
        ask(server, kind, stop=["e"], detokenize=False), "stop")


def _g_skip_special_tokens(server, kind):      # a stop string matched on text with the special tokens shown
    kw = dict(logit_bias={str(EOS): 100}, stop=["<|endoftext|>"])
    return ask(server, kind, **kw).choice["finish_reason"] == "length" and \
        ask(server, kind, skip_special_tokens=False, **kw).choice["finish_reason"] == "stop"


def _g_truncate(server, kind):
    return ask(server, kind, truncate_prompt_tokens=2).body["usage"]["prompt_tokens"] == 2


def _g_structured(server, kind):
    a = ask(server, kind, structured_outputs={"choice": ["yes", "no"]}, ignore_eos=None)
    return server.tokenizer.decode(a.tokens, skip_special_tokens=True) in ("yes", "no")


def _g_logprobs(server, kind):
    content = ask(server, kind, logprobs=2).choice["logprobs"]["content"]
    return len(content) == 8 and len(content[0]["top_logprobs"]) == 2 and content[0]["token"].startswith("token_id:")


def _g_prompt_logprobs(server, kind):
    plp = ask(server, kind, prompt_logprobs=1).body["prompt_logprobs"]
    return plp[0] is None and len(plp) == 4


def _g_request_id(server, kind):
    return ask(server, kind, request_id="abc123").body["request_id"] == "abc123"


def _g_token_ids(server, kind):
    return ask(server, kind, token_ids=[3, 4, 5]).tokens != _greedy(server, kind).tokens and refused(
        ask(server, kind, token_ids=[10**6]), "prompt")


def _g_sampling_params(server, kind):
    return refused(ask(server, kind, sampling_params={"frobnicate": 1}), "frobnicate")


def _g_stream_options(server, kind):
    a = ask(server, kind, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    return a.chunks[-1]["usage"]["completion_tokens"] == 8 and all("usage" in c for c in a.chunks)


def _g_stream(server, kind):
    a = ask(server, kind, stream=True)
    return a.stream and [t for c in a.chunks for t in c["choices"][0]["token_ids"]] == _greedy(server, kind).tokens


PROBES["generate"] = {
    **{k: SHARED[k] for k in ("n", "seed", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                              "frequency_penalty", "repetition_penalty", "logit_bias", "allowed_token_ids",
                              "bad_words", "min_tokens", "ignore_eos", "stop_token_ids", "model", "priority",
                              "spaces_between_special_tokens")},
    "max_tokens": _max_tokens("max_tokens"), "stop": _g_stop, "detokenize": _g_detokenize,
    "skip_special_tokens": _g_skip_special_tokens, "truncate_prompt_tokens": _g_truncate,
    "structured_outputs": _g_structured, "logprobs": _g_logprobs, "prompt_logprobs": _g_prompt_logprobs,
    "include_stop_str_in_output": accepts_and_refuses("include_stop_str_in_output", False, True),
    "request_id": _g_request_id, "token_ids": _g_token_ids, "sampling_params": _g_sampling_params,
    "stream": _g_stream, "stream_options": _g_stream_options,
}
MODELS = {"chat": [P.ChatCompletionRequest], "completion": [P.CompletionRequest],
          "generate": [P.GenerateRequest, P.GenerateSamplingParams]}


def schema_fields(model) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


def test_every_field_has_a_probe():
    for kind, models in MODELS.items():
        assert set.union(*map(schema_fields, models)) == set(PROBES[kind]), kind


@pytest.mark.parametrize("kind", ["chat", "completion", "generate"])
def test_every_field_is_applied(server, kind):
    failed = [field for field, probe in PROBES[kind].items() if not probe(server, kind)]
    assert not failed, f"{kind}: these fields had no effect: {failed}"


@pytest.mark.parametrize("kind", ["chat", "completion", "generate"])
def test_fields_not_implemented_are_refused_by_name_and_unknown_ones_too(server, kind):
    for field in P.REFUSED:
        value = {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}.get(field, "x")
        a = ask(server, kind, **{field: value})
        assert refused(a, field) and field in a.error["message"], (field, a.body)
    assert ask(server, kind, tool_choice="none").status == 200       # the no-op value is accepted
    a = ask(server, kind, frobnicate=1)
    assert refused(a, "frobnicate") and "unknown" in a.error["message"]
