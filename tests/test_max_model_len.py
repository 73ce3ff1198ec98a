"""max_model_len is held to the checkpoint's context (config.json max_position_embeddings, stretched
by linear / dynamic rope scaling): a longer one is refused before anything loads, unless
TPSAMPLE_ALLOW_LONG_MAX_MODEL_LEN=1 allows it (with a warning), as vLLM's override does."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tpsample import SamplingParams
from tpsample.engine.config import ALLOW_LONG_MAX_MODEL_LEN, check_max_model_len, model_len_limit
from tpsample.llm import LLM
from tpsample.testing.toy import make_random_checkpoint

VOCAB = 300


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_random_checkpoint(str(tmp_path_factory.mktemp("ctx1024")), family="llama", vocab_size=VOCAB,
                                  max_position_embeddings=1024, seed=2)


def test_max_model_len_beyond_the_checkpoint_context_is_refused(folder, monkeypatch):
    monkeypatch.delenv(ALLOW_LONG_MAX_MODEL_LEN, raising=False)
    with pytest.raises(ValueError, match=r"max_model_len=4096 exceeds the checkpoint's context of 1024 tokens "
                                         r"\(config.json max_position_embeddings=1024\).*"
                                         r"TPSAMPLE_ALLOW_LONG_MAX_MODEL_LEN=1"):
        LLM(folder, dtype="float32", max_model_len=4096, kv_cache_tokens=4096)


def test_max_model_len_within_the_context_is_accepted(folder, monkeypatch):
    monkeypatch.delenv(ALLOW_LONG_MAX_MODEL_LEN, raising=False)
    with LLM(folder, dtype="float32", max_model_len=1024, kv_cache_tokens=2048, max_num_seqs=2) as llm:
        assert llm.info.max_model_len == 1024


def test_the_override_allows_a_longer_max_model_len_with_a_warning(folder, monkeypatch):
    monkeypatch.setenv(ALLOW_LONG_MAX_MODEL_LEN, "1")
    with pytest.warns(UserWarning, match="exceeds the checkpoint's context of 1024 tokens"):
        llm = LLM(folder, dtype="float32", max_model_len=2048, kv_cache_tokens=2048, max_num_seqs=2)
    with llm:
        assert llm.info.max_model_len == 2048
        out = llm.generate([[(7 * i) % VOCAB for i in range(1500)]], SamplingParams(temperature=0, max_tokens=2))
        assert len(out[0].output_token_ids) == 2          # a prompt past the trained range runs


@pytest.mark.parametrize("rope,limit", [
    ({"rope_type": "default"}, 1024), ({"rope_type": "linear", "factor": 2.0}, 2048),
    ({"rope_type": "dynamic", "factor": 4.0}, 4096), ({"rope_type": "llama3", "factor": 8.0}, 1024),
])
def test_rope_scaling_that_stretches_the_context_raises_the_limit(rope, limit, monkeypatch):
    monkeypatch.delenv(ALLOW_LONG_MAX_MODEL_LEN, raising=False)
    cfg = SimpleNamespace(max_position_embeddings=1024,
                          rope=SimpleNamespace(rope_type=rope["rope_type"], factor=rope.get("factor", 1.0)))
    assert model_len_limit(cfg) == limit
    check_max_model_len(limit, cfg)
    check_max_model_len(None, cfg)
    with pytest.raises(ValueError, match=f"max_model_len={limit + 1} exceeds the checkpoint's context of {limit}"):
        check_max_model_len(limit + 1, cfg)
