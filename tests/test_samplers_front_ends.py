"""The new samplers through the text front ends: DRY breaker strings mapped to token ids as
llama.cpp maps them (against a line-by-line port of `get_overlapping_token_sequences`), the
`LLM` and the server applying every new field (the same tokens as the token-id form) and
returning each token's kept support and the chosen logprob values, bad values refused naming
the field (a ValueError, a 400)."""
from __future__ import annotations

import httpx
import pytest

from tpsample import SamplingParams as SP
from tpsample.engine.breakers import LLAMA_CPP_BREAKERS, token_sequences, with_token_breakers
from tpsample.llm import LLM
from tpsample.serve.app import build_app
from tpsample.serve.server import BackgroundServer
from tpsample.testing.toy import make_byte_tokenizer, make_chat_checkpoint

ENGINE = dict(dtype="float32", kv_cache_tokens=4096, max_num_seqs=8)


def llama_overlaps(tokenizer, s: str) -> list[tuple[int, ...]]:
    """get_overlapping_token_sequences (llama.cpp, from koboldcpp), with MAX_SEQ_LEN 20, ported."""
    out = []
    for token_id in range(len(tokenizer)):
        word = tokenizer.decode([token_id])
        if s in word:
            out.append((token_id,))
            continue
        pos = word.find(s[0])
        while pos != -1:
            match, i = True, 1
            while i < len(s) and i + pos < len(word):
                if word[pos + i] != s[i]:
                    match = False
                    break
                i += 1
            if match:
                seq = (token_id, *tokenizer.encode(s[i:], add_special_tokens=False)[:20])
                if seq not in out:
                    out.append(seq)
            pos = word.find(s[0], pos + 1)
    return out


@pytest.fixture(scope="module")
def tok():
    return make_byte_tokenizer(500, 0)


@pytest.mark.parametrize("text", ["\n", ":", "he", "hello", " world", '":', "q"])
def test_breaker_strings_map_as_llama_cpp_maps_them(tok, text):
    got = token_sequences(tok, text)
    assert list(got) == llama_overlaps(tok, text)
    assert any(len(seq) > 1 for seq in got) or len(text) == 1 or text == "q"


def test_dry_on_without_breakers_takes_llama_cpps_default_strings(tok):
    on = with_token_breakers(SP(dry_multiplier=0.8), tok)
    explicit = with_token_breakers(SP(dry_multiplier=0.8, dry_sequence_breakers=list(LLAMA_CPP_BREAKERS)), tok)
    assert on.dry_sequence_breakers == explicit.dry_sequence_breakers and len(on.dry_sequence_breakers) > 4
    assert with_token_breakers(SP(), tok).dry_sequence_breakers is None                  # DRY off: nothing added
    assert with_token_breakers(SP(dry_multiplier=0.8, dry_sequence_breakers=[]), tok).dry_sequence_breakers == ()
    with pytest.raises(ValueError, match="dry_sequence_breakers holds strings"):
        with_token_breakers(SP(dry_multiplier=0.8, dry_sequence_breakers=["x"]), None)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_chat_checkpoint(str(tmp_path_factory.mktemp("samplers")))


@pytest.fixture(scope="module")
def llm(folder):
    with LLM(folder, **ENGINE) as llm:
        yield llm


NEW = dict(dry_multiplier=2.0, dry_allowed_length=1, top_n_sigma=1.5, xtc_probability=0.5, xtc_threshold=0.05,
           kept_support=4, logprobs=2, logprobs_mode="temperature_logprobs")


def test_llm_applies_the_new_fields_and_string_breakers_like_their_token_ids(llm):
    base = SP(temperature=0.8, seed=3, max_tokens=12, ignore_eos=True)
    prompt = ["the quick brown fox jumps over the lazy dog, the quick brown fox"]
    plain = llm.generate(prompt, base)[0]
    strings = SP(**{**_kw(base), **NEW, "dry_sequence_breakers": [" fox", "\n"]})
    ids = with_token_breakers(strings, llm.tokenizer)
    got, want = llm.generate(prompt, strings)[0], llm.generate(prompt, ids)[0]
    assert got.output_token_ids == want.output_token_ids != plain.output_token_ids
    assert len(got.kept_support) == len(got.output_token_ids) == len(got.logprobs)
    for token, ks, lp in zip(got.output_token_ids, got.kept_support, got.logprobs):
        assert 1 <= ks.count and token in ks.token_ids + (token,) and len(ks.token_ids) == min(4, ks.count)
        assert ks.threshold <= ks.upper and lp.token_id == token
    assert plain.kept_support is None


def _kw(p: SP) -> dict:
    return {k: getattr(p, k) for k in ("temperature", "seed", "max_tokens", "ignore_eos")}


def test_an_llm_without_a_tokenizer_refuses_breaker_strings_and_runs_without_default_ones(tmp_path):
    from tpsample.testing.toy import make_random_checkpoint
    with LLM(make_random_checkpoint(str(tmp_path), vocab_size=64), **ENGINE) as bare:
        with pytest.raises(ValueError, match="dry_sequence_breakers holds strings, which need a tokenizer"):
            bare.generate([[1, 2, 3]], SP(dry_multiplier=1.0, dry_sequence_breakers=["x"]))
        out = bare.generate([[1, 2, 3, 1, 2, 3]], SP(dry_multiplier=1.0, max_tokens=4, seed=1))[0]
        assert len(out.output_token_ids) == 4


@pytest.fixture(scope="module")
def server(folder):
    llm = LLM(folder, **ENGINE)
    with BackgroundServer(build_app(llm, model_name="toy")) as srv:
        srv.llm = llm
        yield srv
    llm.close()


def _body(**kw) -> dict:
    return {"model": "toy", "prompt": "the quick brown fox jumps over the lazy dog, the quick", "max_tokens": 8,
            "temperature": 0.8, "seed": 5, "ignore_eos": True, **kw}


def test_server_takes_the_new_fields_and_returns_kept_supports(server, llm):
    fields = {**NEW, "dry_sequence_breakers": [" fox"]}
    got = httpx.post(server.url + "/v1/completions", json=_body(**fields, return_token_ids=True), timeout=60).json()
    choice = got["choices"][0]
    p = with_token_breakers(SP(**{**_kw(SP(temperature=0.8, seed=5, max_tokens=8, ignore_eos=True)), **fields}),
                            llm.tokenizer)
    want = llm.generate([_body()["prompt"]], p)[0]
    assert choice["token_ids"] == want.output_token_ids
    assert [s["token_ids"] for s in choice["kept_support"]] == [list(s.token_ids) for s in want.kept_support]
    assert [s["count"] for s in choice["kept_support"]] == [s.count for s in want.kept_support]
    stream = httpx.post(server.url + "/v1/completions", json=_body(**fields, stream=True), timeout=60)
    chunks = [c for c in stream.text.split("\n\n") if c.startswith("data: {")]
    streamed = [s for c in chunks for s in httpx.Response(200, content=c[6:]).json()["choices"][0].get(
        "kept_support") or []]
    assert [s["token_ids"] for s in streamed] == [list(s.token_ids) for s in want.kept_support]


@pytest.mark.parametrize("field,value", [("dry_base", 0.5), ("top_n_sigma", 1e7), ("xtc_threshold", -1),
                                         ("kept_support", -2), ("logprobs_mode", "logits"),
                                         ("dry_sequence_breakers", ["x" * 41])])
def test_server_answers_400_naming_a_bad_new_field(server, field, value):
    r = httpx.post(server.url + "/v1/completions", json=_body(**{field: value}), timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
