"""The engine's memory: close() lets go of everything, and KV sizing reserves the worst sampler step."""
from __future__ import annotations

import gc
import weakref

import pytest

from tpsample import SamplingParams
from tpsample.llm import LLM
from tpsample.testing.toy import make_random_checkpoint

VOCAB = 3000


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_random_checkpoint(str(tmp_path_factory.mktemp("mem")), vocab_size=VOCAB, init_std=0.3)


def test_close_drops_the_model_kv_cache_and_sampler_of_an_in_process_llm(folder):
    """Released by close() itself, not later by the garbage collector (which is held off here)."""
    llm = LLM(folder, dtype="float32", kv_cache_tokens=512, max_num_seqs=4)
    llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3))
    runner = llm._backend.engine.runner
    held = [weakref.ref(runner.kv_cache), weakref.ref(runner.model), weakref.ref(runner.sampler),
            weakref.ref(next(runner.model.parameters()))]
    del runner
    gc.collect()
    gc.disable()
    try:
        llm.close()
        alive = [ref() is not None for ref in held]
    finally:
        gc.enable()
    assert alive == [False] * len(held), "close() must release every large object"
    again = LLM(folder, dtype="float32", kv_cache_tokens=512, max_num_seqs=4)
    assert again.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3))[0].output_token_ids
    again.close()


def test_kv_sizing_reserves_at_least_what_a_logprobs_step_takes(folder):
    """Profiled with logprobs up to max_logprobs: a real step of the largest batch, every row asking
    for max_logprobs with top-p alone, stays within the sampler memory the KV sizing set aside."""
    seqs = 8
    with LLM(folder, dtype="float32", max_num_seqs=seqs, max_logprobs=20, cpu_memory_bytes=64 << 20) as llm:
        reserved = llm.info.sampler_peak_bytes[0]
        params = SamplingParams(temperature=1.0, top_p=0.95, seed=1, logprobs=20, max_tokens=3, ignore_eos=True)
        llm.generate([[i + 1, 2, 3] for i in range(seqs)], params)
        sampler = llm._backend.engine.runner.sampler
        assert sampler.last_stats.peak_bytes <= reserved
        assert sampler.last_stats.peak_bytes > 0
