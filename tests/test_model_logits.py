"""Our Llama/Qwen2 forward equals transformers' (fp32) at TP=1 and TP=2 (gloo, spawned ranks)."""
from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers

import tpsample
from tpsample.model import ModelConfig, TPGroup, build_attention_metadata, load_model
from tpsample.parallel.launch import free_port
from tpsample.testing.toy import make_random_checkpoint

VOCAB = 509          # not divisible by 2: the vocab split is uneven
CASES = {
    "llama": dict(family="llama"),
    "qwen2_tied": dict(family="qwen2", tie_word_embeddings=True),
    "llama_one_kv_head": dict(family="llama", num_kv_heads=1),   # TP=2 replicates the KV head
    "llama3_rope": dict(family="llama", rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "linear_rope": dict(family="qwen2", rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "dynamic_rope": dict(family="llama", max_position_embeddings=8, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
}
PROMPTS = [[3, 17, 250, 4, 99, 300, 7, 8, 11, 508, 2, 64], [5, 6, 7, 400, 1]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {name: make_random_checkpoint(str(tmp_path_factory.mktemp(name)), vocab_size=VOCAB, init_std=0.2, **kw)
            for name, kw in CASES.items()}


def _reference_logits(folder: str) -> list[torch.Tensor]:
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return [ref(torch.tensor([p])).logits[0] for p in PROMPTS]


def _local_logits(folder: str, group: TPGroup) -> torch.Tensor:
    """This rank's [T, V_r] logits for every prompt token, prompts one after another."""
    model = load_model(folder, group, dtype=torch.float32)
    lens = [len(p) for p in PROMPTS]
    meta = build_attention_metadata(lens, lens, None, 16)
    ids = torch.tensor([t for p in PROMPTS for t in p])
    positions = torch.cat([torch.arange(n) for n in lens])
    with torch.no_grad():
        return model.compute_logits(model(ids, positions, meta))


def _rank_main(rank: int, port: int, folders: dict, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    group = TPGroup.of(dist.new_group([0, 1]))
    for name, folder in folders.items():
        torch.save(_local_logits(folder, group), f"{out_dir}/{name}_rank{rank}.pt")
    dist.destroy_process_group()


def _assert_close(ours: torch.Tensor, folder: str) -> None:
    ref = torch.cat(_reference_logits(folder))
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers_at_tp1(checkpoints, name):
    _assert_close(_local_logits(checkpoints[name], TPGroup.of(None)), checkpoints[name])


def test_logits_match_transformers_at_tp2_with_each_rank_holding_its_vocab_shard(checkpoints, tmp_path):
    mp.spawn(_rank_main, args=(free_port(), checkpoints, str(tmp_path)), nprocs=2, join=True)
    for name, folder in checkpoints.items():
        shards = [torch.load(tmp_path / f"{name}_rank{r}.pt") for r in range(2)]
        for r, shard in enumerate(shards):
            start, end = tpsample.vocab_shard(VOCAB, 2, r)
            assert shard.shape[1] == end - start, "the LM head must return only this rank's columns"
        _assert_close(torch.cat(shards, dim=1), folder)


@pytest.mark.parametrize("name", ["llama3_rope", "linear_rope", "dynamic_rope"])
def test_rope_scaling_changes_logits(checkpoints, name, tmp_path):
    """Guards the RoPE cases: the same weights read with plain RoPE do not match the reference."""
    config = json.loads((Path(checkpoints[name]) / "config.json").read_text())
    config.pop("rope_scaling", None)
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(Path(checkpoints[name]) / "model.safetensors", tmp_path / "model.safetensors")
    plain = _local_logits(str(tmp_path), TPGroup.of(None))
    ref = torch.cat(_reference_logits(checkpoints[name]))
    assert (plain - ref).abs().max() > 1e-3


def test_config_rejects_unsupported_architectures():
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_dict({"model_type": "gpt2"})
    base = transformers.LlamaConfig(rope_scaling={"rope_type": "yarn", "factor": 2.0}).to_dict()
    with pytest.raises(ValueError, match="rope_type"):
        ModelConfig.from_dict(base)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_match_transformers_in_the_same_dtype(checkpoints, dtype):
    folder = checkpoints["qwen2_tied"]
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    model = load_model(folder, TPGroup.of(None), dtype=dtype)
    n = len(PROMPTS[0])
    with torch.no_grad():
        expected = ref(torch.tensor(PROMPTS[:1])).logits[0]
        ours = model.compute_logits(model(torch.tensor(PROMPTS[0]), torch.arange(n),
                                          build_attention_metadata([n], [n], None, 16)))
    assert ours.dtype == dtype
    torch.testing.assert_close(ours.float(), expected.float(), atol=0.05, rtol=0.02)
