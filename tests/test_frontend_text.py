"""The text side: incremental detokenization, stop strings, finish/stop reasons, chat templates,
prompt shapes, NaN logits, aborts, and the errors a user gets for bad inputs."""
from __future__ import annotations

import json
import multiprocessing
import os
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from tpsample import SamplingParams
from tpsample.engine import GuidedDecoding
from tpsample.engine.core import Abort, AddRequests, NewRequest, TokenUpdate
from tpsample.engine.frontend import IncrementalDetokenizer
from tpsample.llm import LLM
from tpsample.testing.toy import make_byte_tokenizer, make_chat_checkpoint, make_random_checkpoint

TEXT = "Hoy, ¿cómo estás? 日本語 🎉 naïve café"
HI = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def tok():
    return make_byte_tokenizer(500, 0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_chat_checkpoint(str(tmp_path_factory.mktemp("fe")))


@pytest.fixture(scope="module")
def llm(folder):
    with LLM(folder, dtype="float32", kv_cache_tokens=4096, max_num_seqs=8) as llm:
        yield llm


def _feed(tok, ids, **kw) -> tuple[list[str], IncrementalDetokenizer, str | None]:
    d = IncrementalDetokenizer(tok, tok.encode("prompt: "), **kw)
    deltas, stop = [], None
    for t in ids:
        stop = d.add_token(t)
        deltas.append(d.take_delta(stop is not None))
        if stop is not None:
            break
    deltas.append(d.take_delta(True))
    return deltas, d, stop


def test_stream_deltas_never_split_a_character_and_concatenate_to_the_text(tok):
    ids = tok.encode(TEXT)
    assert any("\ufffd" in tok.decode([t]) for t in ids), "the premise: some tokens are partial characters"
    deltas, d, _ = _feed(tok, ids)
    assert "".join(deltas) == d.text == TEXT
    assert all("\ufffd" not in x for x in deltas)


def test_stop_strings_match_across_token_boundaries_and_are_never_half_streamed(tok):
    text = "hello world, hello tensor parallel sampling"
    ids = tok.encode(text)
    for stop in ("o w", "tensor par", "ing"):
        deltas, d, got = _feed(tok, ids, stop=("zzz", stop))
        assert got == stop and d.text == text[:text.index(stop)] == "".join(deltas)
        kept, d2, _ = _feed(tok, ids, stop=(stop,), include_stop_str_in_output=True)
        assert d2.text == text[:text.index(stop) + len(stop)] == "".join(kept)
    assert tok.decode(tok.encode("hello")[-1:]) == "hello", "the premise: one token completes both stops"
    _, d, got = _feed(tok, ids, stop=("llo", "ell"))
    assert got == "ell" and d.text == "h", "the earliest match wins"


def test_llm_stop_strings_cut_exactly_where_the_free_text_has_them(llm):
    free = llm.generate(["the quick brown fox"], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    stop = free.text[12:15]
    out = llm.generate(["the quick brown fox"], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                                               stop=[stop]))[0]
    assert out.text == free.text[:free.text.index(stop)]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.output_token_ids == free.output_token_ids[:len(out.output_token_ids)]
    assert len(out.output_token_ids) < 40
    assert llm.last_stats.num_output_tokens == len(out.output_token_ids), "the engine stopped at the stop string"
    assert llm._backend.engine.resources()["running"] == 0
    streamed = []
    llm.generate(["the quick brown fox"], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]),
                 stream=lambda d: streamed.append(d.text))
    assert "".join(streamed) == out.text
    later = llm.generate(["the quick brown fox"], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                                                 stop=[stop], min_tokens=len(out.output_token_ids) + 2))[0]
    assert len(later.output_token_ids) > len(out.output_token_ids), "no stop string before min_tokens (as vLLM)"


def test_finish_and_stop_reasons_follow_vllm(llm):
    free = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert (free.finish_reason, free.stop_reason) == ("length", None)
    token = free.output_token_ids[4]
    stopped = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[token],
                                                       ignore_eos=True))[0]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", token)
    assert stopped.output_token_ids[-1] == token
    eos = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=12, allowed_token_ids=[0]))[0]
    assert (eos.finish_reason, eos.stop_reason, eos.output_token_ids) == ("stop", None, [0])


def test_chat_applies_the_template_and_equals_generate_on_the_templated_ids(llm):
    enc = llm.tokenizer.apply_chat_template(HI, add_generation_prompt=True, tokenize=True)
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    params = SamplingParams(temperature=0, max_tokens=10)
    chat = llm.chat(HI, params)[0]
    assert chat.prompt_token_ids == list(ids) and chat.prompt.endswith("assistant:")
    for prompts in (enc, [list(ids)], torch.tensor(ids), torch.tensor([ids])):
        assert llm.generate(prompts, params)[0].output_token_ids == chat.output_token_ids
    two = llm.chat([HI, [{"role": "user", "content": "other"}]], params)
    assert len(two) == 2 and two[0].output_token_ids == chat.output_token_ids


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_encodings_drop_their_padding(llm, folder, side):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, padding_side=side)
    tok.pad_token = tok.eos_token
    texts = ["hello world, hello", "fox"]
    params = SamplingParams(temperature=0, max_tokens=5)
    got = llm.generate(tok(texts, padding=True, return_tensors="pt"), params)
    assert [o.prompt_token_ids for o in got] == [tok.encode(t) for t in texts]
    assert [o.output_token_ids for o in got] == [o.output_token_ids for o in llm.generate(texts, params)]


@pytest.mark.parametrize("bad, match", [(123, "int"), (None, "NoneType"), (b"hi", "bytes"), ([1, 2, 3], "ambiguous"),
                                        (torch.zeros(2, 2), "integers"), ([["a"]], "prompt 0"),
                                        (torch.zeros(1, 2, 2, dtype=torch.long), "shape")])
def test_bad_prompts_raise_value_errors_that_say_what_to_pass(llm, bad, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(bad)


def test_bad_models_and_tp_sizes_fail_before_any_worker_starts(tmp_path, folder):
    with pytest.raises(ValueError, match="got None"):
        LLM(None)
    with pytest.raises(ValueError, match="the file"):
        LLM(os.path.join(folder, "config.json"))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        LLM(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="lacks the field"):
        LLM(str(tmp_path))
    smol_like = make_random_checkpoint(str(tmp_path / "m"), family="llama", vocab_size=100, hidden_size=144,
                                       num_heads=9, num_kv_heads=3, intermediate_size=192)
    with pytest.raises(ValueError, match="Sizes that work: 1, 3$"):
        LLM(smol_like, tensor_parallel_size=2)
    assert not multiprocessing.active_children(), "no worker was started"


def test_a_closed_llm_says_so(folder):
    llm = LLM(folder, dtype="float32", kv_cache_tokens=256)
    llm.close()
    with pytest.raises(ValueError, match="closed"):
        llm.generate([[1, 2]])
    with pytest.raises(ValueError, match="closed"):
        llm.chat(HI)


def test_json_schema_dicts_keep_their_key_order(llm):
    schema = {"type": "object", "additionalProperties": False, "required": ["zeta", "alpha", "mid"],
              "properties": {"zeta": {"enum": [1, 2]}, "alpha": {"enum": ["a", "b"]}, "mid": {"type": "boolean"}}}
    compiled_source = json.loads(GuidedDecoding(json_schema=schema).key()[1])
    assert list(compiled_source["properties"]) == ["zeta", "alpha", "mid"]
    out = llm.generate(["hello"], SamplingParams(temperature=0.7, seed=1, max_tokens=60),
                       guided=GuidedDecoding(json_schema=schema))[0]
    assert list(json.loads(out.text)) == ["zeta", "alpha", "mid"]


def test_abort_frees_the_slot_and_blocks_at_once(llm):
    client, engine = llm.engine_client(), llm._backend.engine
    long = SamplingParams(max_tokens=500, ignore_eos=True)
    client.submit(AddRequests((NewRequest("a", [1, 2, 3], long), NewRequest("b", [4, 5], long))))
    for _ in range(3):
        client.poll(timeout=0)
    held = engine.resources()
    assert held["running"] == 2 and held["sampler_slots_used"] == 2
    assert engine.abort(client.core.live["a"])                   # the engine API: free when it returns
    now = engine.resources()
    assert now["running"] == 1 and now["sampler_slots_used"] == 1 and now["free_kv_blocks"] > held["free_kv_blocks"]
    client.submit(Abort(("a", "b")))                            # the core's command: an "abort" update each
    events = client.poll(timeout=0)
    assert sorted(e.req_id for e in events if isinstance(e, TokenUpdate) and e.finish_reason == "abort") == ["a", "b"]
    free = engine.resources()
    assert free["running"] == 0 and free["sampler_slots_used"] == 0
    assert free["free_kv_blocks"] == free["num_kv_blocks"]


def test_nan_logits_end_the_request_with_finish_reason_error_and_a_count(tmp_path):
    folder = make_random_checkpoint(str(tmp_path), family="llama", vocab_size=300, eos_token_id=0)
    path = os.path.join(folder, "model.safetensors")
    weights = load_file(path)
    weights["lm_head.weight"][:] = float("nan")
    save_file(weights, path, metadata={"format": "pt"})
    with LLM(folder, dtype="float32", kv_cache_tokens=256) as nan_llm:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = nan_llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4))[0]
        assert (out.finish_reason, out.output_token_ids) == ("error", [])
        assert out.num_nan_logits == 300
        assert any("NaN" in str(w.message) for w in caught)
        assert nan_llm._backend.engine.resources()["sampler_slots_used"] == 0


def test_stop_strings_are_validated_and_normalised():
    assert SamplingParams(stop="x").stop == ("x",) and SamplingParams(stop=["a", "bb"]).stop == ("a", "bb")
    assert SamplingParams(stop=[]).stop is None
    for bad, field in ((dict(stop=[""]), "stop"), (dict(stop=5), "stop"), (dict(stop=["a"] * 17), "stop"),
                       (dict(stop=["x" * 257]), "stop"), (dict(include_stop_str_in_output=1), "include_stop_str")):
        with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
            SamplingParams(**bad)


def test_stop_strings_without_a_tokenizer_are_refused(tmp_path):
    folder = make_random_checkpoint(str(tmp_path), family="llama", vocab_size=200)
    with LLM(folder, dtype="float32", kv_cache_tokens=256) as bare:
        with pytest.raises(ValueError, match="stop_token_ids"):
            bare.generate([[1, 2]], SamplingParams(stop=["x"]))
