"""Beyond the weights: malformed tokenizer files are one ValueError line naming the file, and a
ValueError a TP worker raises while it starts reaches the caller as one line (no traceback)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tpsample.engine.hf_files import load_tokenizer
from tpsample.testing.toy import make_random_checkpoint


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return Path(make_random_checkpoint(str(tmp_path_factory.mktemp("toy")), vocab_size=300, hidden_size=32,
                                       num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32,
                                       tokenizer=True, eos_token_id=0))


def _copy(toy: Path, tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(toy, folder)
    return folder


@pytest.mark.parametrize("file,text,says", [
    ("tokenizer.json", '{"model": ', "is not valid JSON"), ("tokenizer.json", "[1, 2]", "must hold a JSON object"),
    ("tokenizer_config.json", "{", "is not valid JSON"), ("tokenizer_config.json", "\xff\xfe", "is not valid JSON"),
    ("special_tokens_map.json", '"eos"', "must hold a JSON object"),
])
def test_a_tokenizer_file_that_is_not_a_json_object_is_refused_naming_it(toy, tmp_path, file, text, says):
    from tpsample.llm import LLM

    folder = _copy(toy, tmp_path, "tok")
    (folder / file).write_bytes(text.encode("latin-1"))
    for load in (lambda: load_tokenizer(str(folder)), lambda: LLM(str(folder), device="cpu")):
        with pytest.raises(ValueError) as e:
            load()
        assert str(e.value).startswith(f"{folder / file} {says}") and "\n" not in str(e.value), str(e.value)


def test_tokenizer_files_that_transformers_cannot_build_from_are_refused_naming_the_folder(toy, tmp_path):
    folder = _copy(toy, tmp_path, "tok")
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": 5}}))
    with pytest.raises(ValueError, match=f"the tokenizer files in {folder} do not load"):
        load_tokenizer(str(folder))


def test_a_value_error_raised_in_a_tp_worker_reaches_the_caller_as_one_line(toy):
    from tpsample.llm import LLM

    with pytest.raises(ValueError) as e:     # the KV cache is sized, and this refused, inside each rank
        LLM(str(toy), tensor_parallel_size=2, device="cpu", max_model_len=512, kv_cache_tokens=64)
    message = str(e.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert "failed during start-up: max_model_len=512 exceeds the KV cache capacity of 64 tokens" in message
