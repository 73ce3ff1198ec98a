"""The engine on a GPU (Triton attention, fused kernels, CUDA-graph decode) against its CPU path,
and an in-process LLM that gives its GPU memory back on close()."""
from __future__ import annotations

import gc

import pytest
import torch

from tpsample import SamplingParams
from tpsample.llm import LLM
from tpsample.testing.toy import make_random_checkpoint

pytestmark = pytest.mark.gpu

VOCAB = 500
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 90)), [42] * 20, [300, 301], [5, 6, 7, 8] * 6]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {fam: make_random_checkpoint(str(tmp_path_factory.mktemp(fam)), family=fam, vocab_size=VOCAB,
                                        init_std=0.3, eos_token_id=0, seed=1, num_heads=8, num_kv_heads=2,
                                        hidden_size=128)
            for fam in ("llama", "qwen2")}


def _greedy(folder, device, **kw):
    with LLM(folder, dtype="float32", device=device, kv_cache_tokens=4096, max_num_seqs=8, **kw) as llm:
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
        return [o.output_token_ids for o in outs], llm.info


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_tokens_equal_on_the_cpu_and_gpu_paths(folders, family):
    cpu, _ = _greedy(folders[family], "cpu")
    gpu, info = _greedy(folders[family], "cuda")
    assert info.attention == "triton" and info.cuda_graph_batch_sizes
    assert gpu == cpu


def test_chunked_prefill_spec_decode_and_eager_decode_on_the_gpu_keep_the_cpu_tokens(folders):
    cpu, _ = _greedy(folders["llama"], "cpu")
    chunked, _ = _greedy(folders["llama"], "cuda", max_num_batched_tokens=16, cuda_graphs=False)
    spec, _ = _greedy(folders["llama"], "cuda", speculative_ngram=3)
    assert chunked == cpu and spec == cpu


def test_close_gives_the_gpu_memory_back_to_a_second_llm_in_the_same_process(folders):
    gc.collect()
    torch.cuda.empty_cache()
    before, reserved_before = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    first = LLM(folders["qwen2"], dtype="bfloat16", device="cuda", gpu_memory_utilization=0.3, max_num_seqs=16)
    blocks = first.info.num_kv_blocks
    assert torch.cuda.memory_allocated() - before > blocks * first.info.block_size * first.info.kv_bytes_per_token
    first.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8))
    first.close()
    assert torch.cuda.memory_allocated() - before < 64 << 20
    assert torch.cuda.memory_reserved() - reserved_before < 64 << 20, "the driver must get the KV cache back"
    second = LLM(folders["qwen2"], dtype="bfloat16", device="cuda", gpu_memory_utilization=0.3, max_num_seqs=16)
    try:
        assert abs(second.info.num_kv_blocks - blocks) <= blocks // 100
    finally:
        second.close()
