"""The engine at TP=2 (spawned gloo workers): every strategy gives TP=1's tokens, through
preemption; spec decode and grammars work across ranks; a dead worker stops the run promptly."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tpsample import SamplingParams
from tpsample.engine import GuidedDecoding
from tpsample.llm import LLM
from tpsample.testing.toy import make_random_checkpoint

VOCAB = 509      # odd: the two vocab shards differ in size
PROMPTS = [[(11 * i + j) % 400 + 1 for j in range(3 + i % 6)] for i in range(12)]
KINDS = [dict(temperature=0), dict(temperature=0.9, top_k=40, top_p=0.9, logprobs=2), dict(temperature=1.0, min_p=0.05),
         dict(temperature=0.7, repetition_penalty=1.3, presence_penalty=0.4), dict(temperature=1.2, top_k=5)]
PARAMS = [SamplingParams(seed=7 + i, max_tokens=16 + i % 4, ignore_eos=True, **KINDS[i % len(KINDS)])
          for i in range(len(PROMPTS))]
TIGHT = dict(dtype="float32", kv_cache_tokens=96, max_num_seqs=8)   # forces preemption


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_random_checkpoint(str(tmp_path_factory.mktemp("tp")), family="qwen2", vocab_size=VOCAB,
                                  init_std=0.3, eos_token_id=0, tokenizer=True)


@pytest.fixture(scope="module")
def baseline(folder):
    return LLM(folder, dtype="float32", kv_cache_tokens=4096, max_num_seqs=16).generate(PROMPTS, PARAMS)


@pytest.fixture(scope="module")
def tp2_auto(folder):
    with LLM(folder, tensor_parallel_size=2, strategy="auto", **TIGHT) as llm:
        yield llm


def _assert_same(outs, expected):
    for out, exp in zip(outs, expected, strict=True):          # a missing output is a failure
        assert out.output_token_ids == exp.output_token_ids
        if exp.logprobs is not None:
            got = torch.tensor([lp.logprob for lp in out.logprobs])
            torch.testing.assert_close(got, torch.tensor([lp.logprob for lp in exp.logprobs]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("strategy", ["replicated", "batch_sharded", "vocab_parallel", "auto"])
def test_every_strategy_generates_tp1_tokens_at_tp2_through_preemption(folder, baseline, tp2_auto, strategy):
    if strategy == "auto":
        outs, stats = tp2_auto.generate(PROMPTS, PARAMS), tp2_auto.last_stats
    else:
        with LLM(folder, tensor_parallel_size=2, strategy=strategy, **TIGHT) as llm:
            outs, stats = llm.generate(PROMPTS, PARAMS), llm.last_stats
    assert stats.num_preemptions > 0
    _assert_same(outs, baseline)


def test_bad_request_at_tp2_raises_value_error_and_the_engine_keeps_serving(tp2_auto, baseline):
    with pytest.raises(ValueError, match="logprobs"):
        tp2_auto.generate(PROMPTS[:2], [PARAMS[0], SamplingParams(logprobs=1000)])
    with pytest.raises(ValueError, match="token ids"):
        tp2_auto.generate([PROMPTS[0], [VOCAB + 5]], PARAMS[0])
    _assert_same(tp2_auto.generate(PROMPTS[:3], PARAMS[:3]), baseline[:3])


def test_spec_decode_and_json_schema_work_across_ranks(folder):
    pytest.importorskip("xgrammar")
    schema = {"type": "object", "required": ["ok"], "additionalProperties": False,
              "properties": {"ok": {"type": "boolean"}}}
    repetitive = [[5, 6, 7, 8] * 5, [9, 10, 11] * 6]
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    expected = LLM(folder, dtype="float32", kv_cache_tokens=2048).generate(repetitive, greedy)
    with LLM(folder, tensor_parallel_size=2, strategy="batch_sharded", dtype="float32", kv_cache_tokens=2048,
             speculative_ngram=3) as llm:
        _assert_same(llm.generate(repetitive, greedy), expected)
        assert llm.last_stats.num_accepted_drafts > 0
        outs = llm.generate(["hello", "fox"], SamplingParams(temperature=1.0, seed=3, max_tokens=40),
                            guided=GuidedDecoding(json_schema=schema))
    for out in outs:
        assert out.finish_reason == "stop" and isinstance(json.loads(out.text)["ok"], bool)


def test_killed_worker_ends_the_run_with_a_clear_error_within_the_timeout(folder):
    llm = LLM(folder, tensor_parallel_size=2, dtype="float32", kv_cache_tokens=8192, step_timeout_s=30)
    victim, killed_at = llm._backend.pids()[1], []

    def kill_rank_1_once_tokens_flow(_delta):       # mid-run on any machine, however fast
        if not killed_at:
            os.kill(victim, signal.SIGKILL)
            killed_at.append(time.monotonic())
    with pytest.raises(RuntimeError, match="rank 1 died"):
        llm.generate([[1, 2, 3]] * 8, SamplingParams(temperature=1.0, max_tokens=4000, ignore_eos=True),
                     stream=kill_rank_1_once_tokens_flow)
    assert time.monotonic() - killed_at[0] < 30, "found dead before the step timeout, not by it"
    assert not any(p.is_alive() for p in llm._backend.procs), "every worker is stopped"
    with pytest.raises(RuntimeError, match="stopped"):
        llm.generate([[1, 2, 3]])


SPMD_SCRIPT = """
import json, sys
import torch.distributed as dist
from tpsample import SamplingParams
from tpsample.llm import LLM
folder, out = sys.argv[1], sys.argv[2]
with LLM(folder, tensor_parallel_size=2, dtype="float32", kv_cache_tokens=1024, strategy="batch_sharded") as llm:
    outs = llm.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0.8, seed=1, max_tokens=8))
    try:
        llm.generate([[1, 10**6]])
        err = None
    except ValueError as e:
        err = str(e)
    json.dump({"tokens": [o.output_token_ids for o in outs], "err": err},
              open(f"{out}/rank{dist.get_rank()}.json", "w"))
"""


def test_torchrun_ranks_all_return_the_tp1_outputs_and_share_value_errors(folder, tmp_path):
    from tpsample.parallel.launch import free_port

    script = tmp_path / "spmd.py"
    script.write_text(SPMD_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(free_port()), str(script), folder, str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    expected = LLM(folder, dtype="float32", kv_cache_tokens=1024).generate(
        [[1, 2, 3], [4, 5]], SamplingParams(temperature=0.8, seed=1, max_tokens=8))
    for r in ranks:
        assert r["tokens"] == [o.output_token_ids for o in expected]
        assert r["err"] is not None and "token ids" in r["err"]
