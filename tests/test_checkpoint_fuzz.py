"""A checkpoint folder that lies is refused before any weight is read: truncated or corrupt files,
tensors of the wrong dtype or of any shape but the one config.json implies (larger as well as
smaller), missing or extra tensors, config.json fields of the wrong type or range. Each is one
ValueError line naming the file and the tensor or field; never a traceback, never a silent
(cut-down) load. A tiny toy checkpoint, mutated one way at a time."""
from __future__ import annotations

import json
import os
import random
import re
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tpsample.model import TPGroup, expected_tensors, load_model
from tpsample.model.config import ModelConfig
from tpsample.testing.toy import make_random_checkpoint

TOY = dict(family="qwen2", vocab_size=96, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
           intermediate_size=48)
WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    folder = Path(make_random_checkpoint(str(tmp_path_factory.mktemp("toy")), **TOY))
    return {"folder": folder, "tensors": load_file(folder / WEIGHTS),
            "config": json.loads((folder / "config.json").read_text()), "bytes": (folder / WEIGHTS).read_bytes()}


@pytest.fixture
def variant(toy, tmp_path):
    """variant(name, tensors=..., config=..., raw=...) -> a checkpoint folder differing from the toy
    in what is given (raw: the bytes of model.safetensors)."""
    def make(name: str, *, tensors=None, config=None, raw=None) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(toy["config"] if config is None else config))
        if raw is not None:
            (folder / WEIGHTS).write_bytes(raw)
        else:
            save_file(toy["tensors"] if tensors is None else tensors, str(folder / WEIGHTS))
        return folder
    return make


def refusal(folder: Path) -> str:
    """The one-line ValueError loading `folder` raises (a load, or any other error, fails the test)."""
    with pytest.raises(ValueError) as e:
        load_model(str(folder), TPGroup.of(None), dtype=torch.float32)
    message = str(e.value)
    assert "\n" not in message, message
    return message


def with_tensor(toy, name: str, value: torch.Tensor | None) -> dict:
    tensors = dict(toy["tensors"])
    if value is None:
        del tensors[name]
    else:
        tensors[name] = value
    return tensors


def test_the_toy_checkpoint_and_its_tied_twin_load(toy, variant):
    load_model(str(toy["folder"]), TPGroup.of(None), dtype=torch.float32)
    tied = variant("tied", tensors=with_tensor(toy, "lm_head.weight", None),
                   config={**toy["config"], "tie_word_embeddings": True})
    load_model(str(tied), TPGroup.of(None), dtype=torch.float32)


@pytest.mark.parametrize("family,extra", [("qwen2", {}), ("qwen2", {"tie_word_embeddings": True}),
                                          ("llama", {"attention_bias": True, "mlp_bias": True}),
                                          ("llama", {"head_dim": 16, "tie_word_embeddings": True})])
def test_the_expected_tensors_are_exactly_the_ones_transformers_saves(family, extra):
    import transformers

    kw = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=48, **extra)
    cls = transformers.Qwen2Config if family == "qwen2" else transformers.LlamaConfig
    hf = transformers.AutoModelForCausalLM.from_config(cls(**kw))
    saved = {n: tuple(t.shape) for n, t in hf.state_dict().items()
             if not (n == "lm_head.weight" and hf.config.tie_word_embeddings)}
    cfg = ModelConfig.from_dict({"model_type": family, **kw})
    assert {n: s.shape for n, s in expected_tensors(cfg).items()} == saved


def test_every_truncation_or_padding_of_the_file_is_refused_naming_it(toy, variant):
    data = toy["bytes"]
    n = 8 + struct.unpack("<Q", data[:8])[0]          # the header's end
    for cut in sorted({0, 4, 7, 8, n // 2, n - 1, n, n + 1, (n + len(data)) // 2, len(data) - 1}):
        message = refusal(variant(f"cut{cut}", raw=data[:cut]))
        assert WEIGHTS in message, (cut, message)
    for pad in (b"\0", b"x" * 7):
        assert "trailing bytes" in refusal(variant(f"pad{len(pad)}", raw=data + pad))


def _with_header(header: dict, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def test_corrupt_files_are_refused_naming_the_file(toy, variant):
    rng = random.Random(0)
    one = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    corrupt = {
        "empty": b"", "random": bytes(rng.randrange(256) for _ in range(4096)),
        "huge_header": struct.pack("<Q", 10**12) + b"{}", "header_not_json": struct.pack("<Q", 4) + b"{no",
        "header_a_list": _with_header([1, 2]), "entry_not_an_object": _with_header({"x": 3}),
        "no_dtype": _with_header({"x": {"shape": [2], "data_offsets": [0, 8]}}, bytes(8)),
        "bad_shape": _with_header({"x": {**one, "shape": [-2]}}, bytes(8)),
        "offsets_disagree_with_shape": _with_header({"x": {**one, "data_offsets": [0, 4]}}, bytes(4)),
        "overlapping": _with_header({"x": one, "y": one}, bytes(8)),
    }
    for name, raw in corrupt.items():
        folder = variant(name, raw=raw)
        message = refusal(folder)
        assert message.startswith(str(folder / WEIGHTS)) and "SafetensorError" not in message, (name, message)


def test_a_directory_named_like_the_weights_or_no_weights_at_all_is_refused(toy, variant):
    folder = variant("dir")
    os.remove(folder / WEIGHTS)
    assert "model folder" in refusal(folder) and "no *.safetensors" in refusal(folder)
    (folder / WEIGHTS).mkdir()
    assert f"{folder / WEIGHTS} is not a regular file" in refusal(folder)


@pytest.mark.parametrize("dtype,name", [(torch.int32, "I32"), (torch.int64, "I64"), (torch.bool, "BOOL"),
                                        (torch.uint8, "U8"), (torch.float8_e4m3fn, "F8_E4M3")])
def test_a_tensor_of_a_non_float_dtype_is_refused_naming_it(toy, variant, dtype, name):
    for tensor in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.k_proj.bias"):
        bad = torch.zeros(toy["tensors"][tensor].shape).to(dtype)
        message = refusal(variant(f"{name}-{tensor}", tensors=with_tensor(toy, tensor, bad)))
        assert f"{WEIGHTS}: tensor {tensor} has dtype {name}" in message, message


def _other_shapes(shape: tuple[int, ...]):
    for d in range(len(shape)):
        for delta in (1, -1, shape[d]):
            yield shape[:d] + (shape[d] + delta,) + shape[d + 1:]
    yield (1, *shape)
    yield (int(torch.Size(shape).numel()),) if len(shape) > 1 else (shape[0], 1)


def test_every_tensor_of_any_other_shape_than_the_config_implies_is_refused_naming_it(toy, variant):
    for tensor, value in toy["tensors"].items():
        for shape in _other_shapes(tuple(value.shape)):
            message = refusal(variant(f"{tensor}-{'x'.join(map(str, shape))}",
                                      tensors=with_tensor(toy, tensor, torch.zeros(shape))))
            assert f"{WEIGHTS}: tensor {tensor} has shape {list(shape)}; config.json implies " \
                   f"{list(value.shape)}" in message, message


def test_missing_and_extra_tensors_are_refused_naming_them(toy, variant):
    for tensor in toy["tensors"]:
        message = refusal(variant(f"without-{tensor}", tensors=with_tensor(toy, tensor, None)))
        assert "lacks" in message and tensor in message, message
    for extra in ("model.layers.1.mlp.up_proj.weight", "model.layers.0.self_attn.o_proj.bias", "scale"):
        message = refusal(variant(f"with-{extra}", tensors=with_tensor(toy, extra, torch.zeros(4))))
        assert f"{WEIGHTS}: holds" in message and extra in message, message


def test_a_tensor_in_two_files_is_refused_naming_both(toy, variant):
    folder = variant("split")
    save_file({"model.norm.weight": toy["tensors"]["model.norm.weight"]}, str(folder / "extra.safetensors"))
    message = refusal(folder)
    assert "model.norm.weight" in message and "extra.safetensors" in message and WEIGHTS in message


@pytest.mark.parametrize("vocab", [80, 95, 97, 120])
def test_a_config_vocab_size_that_disagrees_with_the_tensors_is_refused(toy, variant, vocab):
    message = refusal(variant(f"vocab{vocab}", config={**toy["config"], "vocab_size": vocab}))
    assert "vocab_size" in message and "[96, 32]" in message and f"[{vocab}, 32]" in message, message


BAD_FIELDS = [
    ("num_attention_heads", 0), ("num_attention_heads", -4), ("num_attention_heads", "4"),
    ("num_attention_heads", 4.5), ("num_attention_heads", True), ("num_attention_heads", 3),
    ("num_key_value_heads", 0), ("num_key_value_heads", 3), ("num_key_value_heads", "2"),
    ("hidden_size", 0), ("hidden_size", "32"), ("intermediate_size", 0), ("intermediate_size", -128),
    ("vocab_size", "96"), ("vocab_size", 0), ("vocab_size", 2**31), ("vocab_size", [96]),
    ("num_hidden_layers", 0), ("num_hidden_layers", "1"), ("rope_theta", "abc"), ("rope_theta", 0),
    ("rope_theta", -1.0), ("rms_norm_eps", 0), ("rms_norm_eps", "1e-6"), ("rms_norm_eps", 2.0),
    ("max_position_embeddings", 0), ("max_position_embeddings", -1), ("max_position_embeddings", "1024"),
    ("tie_word_embeddings", 1), ("tie_word_embeddings", "false"), ("head_dim", 0), ("head_dim", 7),
    ("model_type", 3), ("model_type", "gpt2"), ("hidden_act", "gelu"), ("rope_parameters", "x"),
    ("rope_parameters", {"rope_type": "yarn"}), ("rope_parameters", {"rope_type": "linear", "factor": 0}),
    ("rope_parameters", {"rope_theta": "abc"}), ("rope_scaling", ["linear"]), ("eos_token_id", -1),
    ("eos_token_id", "0"), ("eos_token_id", [0, None]), ("torch_dtype", 5), ("partial_rotary_factor", 1.5),
    ("attention_bias", "yes"), ("mlp_bias", 0),
]


def test_config_fields_of_the_wrong_type_or_range_are_refused_naming_the_field(toy, variant):
    for i, (field, value) in enumerate(BAD_FIELDS):
        folder = variant(f"field{i}", config={**toy["config"], field: value})
        message = refusal(folder)
        assert str(folder / "config.json") in message and field in message, (field, value, message)


def test_a_missing_required_config_field_is_refused_naming_it(toy, variant):
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        config = dict(toy["config"])
        del config[field]
        message = refusal(variant(f"no-{field}", config=config))
        assert f"config.json lacks the field {field}" in message, message


REPRESENTATIVE = {      # name -> (what to change, what the one line must say)
    "truncated": (dict(raw=lambda b: b[: len(b) // 2]), "is truncated"),
    "oversized_embedding": (dict(tensors=lambda t: {**t, "model.embed_tokens.weight": torch.zeros(97, 32)}),
                            "tensor model.embed_tokens.weight has shape [97, 32]"),
    "heads_zero": (dict(config=lambda c: {**c, "num_attention_heads": 0}), "num_attention_heads must be"),
    "vocab_a_string": (dict(config=lambda c: {**c, "vocab_size": "96"}), "vocab_size must be"),
}


def _representative(toy, variant, name: str) -> tuple[Path, str]:
    change, says = REPRESENTATIVE[name]
    kw = {}
    if "raw" in change:
        kw["raw"] = change["raw"](toy["bytes"])
    if "tensors" in change:
        kw["tensors"] = change["tensors"](dict(toy["tensors"]))
    if "config" in change:
        kw["config"] = change["config"](dict(toy["config"]))
    return variant(name, **kw), says


@pytest.fixture
def no_engine(monkeypatch):
    """Every way LLM(...) starts an engine fails the test: the checks must come first."""
    import tpsample.llm

    def started(*_, **__):
        raise AssertionError("an engine started")
    for backend in ("InProcessBackend", "MultiprocBackend", "SpmdBackend"):
        monkeypatch.setattr(tpsample.llm, backend, started)


@pytest.mark.parametrize("name", list(REPRESENTATIVE))
def test_the_llm_constructor_refuses_a_lying_checkpoint_in_one_line_before_any_engine_starts(toy, variant, name,
                                                                                            no_engine):
    from tpsample.llm import LLM

    folder, says = _representative(toy, variant, name)
    for tp in (1, 2):
        with pytest.raises(ValueError, match=re.escape(says)) as e:
            LLM(str(folder), tensor_parallel_size=tp, device="cpu")
        assert "\n" not in str(e.value)


WORK = {"generate": ("tpsample.llm", "LLM"), "bench engine": ("tpsample.bench.engine", "run_bench"),
        "demo": ("tpsample.demo.engine", "run_demo")}


@pytest.mark.parametrize("name", list(REPRESENTATIVE))
def test_the_command_line_prints_one_line_and_exits_2_for_a_lying_checkpoint(toy, variant, name, capsys,
                                                                            monkeypatch, no_engine):
    import importlib

    from tpsample import cli

    folder, says = _representative(toy, variant, name)
    before_work = [["generate", "--model", str(folder), "--prompt-ids", "1,2"],
                   ["bench", "engine", "--model", str(folder), "--tp", "1", "--plot", str(folder / "p.png")],
                   ["demo", "--part", "engine", "--engine-model", str(folder)]]
    for argv in [["chat", str(folder)], ["serve", str(folder), "--port", "0"], *before_work]:
        if argv is before_work[0]:       # these commands check the checkpoint before their work starts
            for module, attr in WORK.values():
                monkeypatch.setattr(importlib.import_module(module), attr, lambda *a, **k: pytest.fail("work started"))
        code = cli.main(argv)
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.count("\n") == 1, (argv, code, err)
        assert err.startswith("tpsample: error: ") and says in err and "Traceback" not in err, (argv, err)


def test_a_config_torch_dtype_the_engine_cannot_use_is_refused_naming_the_field(toy, variant, no_engine):
    from tpsample.llm import LLM

    folder = variant("int8", config={**toy["config"], "torch_dtype": "int8"})
    with pytest.raises(ValueError, match="config.json torch_dtype 'int8'"):
        LLM(str(folder), device="cpu")


def test_a_slice_that_does_not_fit_its_parameter_names_the_checkpoint_tensor_not_the_layer(toy):
    from tpsample.model.llama import CausalLM
    from tpsample.model.loader import CheckpointSlice, _target

    model = CausalLM(ModelConfig.from_folder(str(toy["folder"])), TPGroup.of(None))
    params = dict(model.named_parameters())
    for name, value in toy["tensors"].items():
        target, part = _target(name)
        loader = getattr(params[target], "weight_loader", None)
        if loader is None:
            continue
        short = CheckpointSlice(name, value[:-1], torch.float32)
        with pytest.raises(ValueError) as e:
            loader(params[target], short) if part is None else loader(params[target], short, part)
        assert f"checkpoint tensor {name}:" in str(e.value) and "Parallel" not in str(e.value), str(e.value)
