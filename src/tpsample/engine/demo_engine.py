"""The engine part of `tpsample demo`: a random-weight Qwen2-shaped model with the real
151,936-token vocabulary (hidden 64, 2 layers, so it runs on a laptop CPU) at TP ranks, one
mixed batch through every strategy. Per strategy: tokens identical to `replicated`, per-rank
sampler peak (profile step at max_num_seqs rows), KV blocks the remaining memory buys, how many
requests of the batch's size those blocks hold at once, the peak actually running, tokens/s.
"""
from __future__ import annotations

import random
import tempfile

from tpsample.engine.toy import QWEN2_VOCAB, make_random_checkpoint

STRATEGIES = ("replicated", "batch_sharded", "vocab_parallel", "auto")


def demo_requests(num_requests: int, max_tokens: int, vocab_size: int, seed: int = 0):
    """A mixed batch: greedy, top-k/top-p with logprobs, min-p, penalties; varied prompt lengths."""
    from tpsample import SamplingParams

    rng = random.Random(seed)
    kinds = [dict(temperature=0.0), dict(temperature=0.8, top_k=50, top_p=0.9, logprobs=2),
             dict(temperature=1.0, min_p=0.05), dict(temperature=0.7, repetition_penalty=1.3, frequency_penalty=0.5),
             dict(temperature=1.0, top_p=0.95)]
    prompts = [[rng.randrange(vocab_size) for _ in range(rng.randint(4, 40))] for _ in range(num_requests)]
    params = [SamplingParams(seed=1000 + i, max_tokens=rng.randint(max_tokens // 2, max_tokens), ignore_eos=True,
                             **kinds[i % len(kinds)]) for i in range(num_requests)]
    return prompts, params


def run_strategy(folder: str, strategy: str, prompts, params, *, tp: int, device: str | None,
                 cpu_memory_bytes: int, max_num_seqs: int) -> dict:
    from tpsample.llm import LLM

    with LLM(folder, tensor_parallel_size=tp, strategy=strategy, device=device, dtype="float32",
             max_num_seqs=max_num_seqs, cpu_memory_bytes=cpu_memory_bytes) as llm:
        outs = llm.generate(prompts, params)
        info, stats = llm.info, llm.last_stats
    per_request = sum(len(p) + sp.max_tokens for p, sp in zip(prompts, params)) // len(prompts)
    return {"tokens": [o.output_token_ids for o in outs], "sampler_peak_bytes": list(info.sampler_peak_bytes),
            "kv_blocks": info.num_kv_blocks, "kv_tokens": info.kv_tokens,
            "kv_bound_concurrency": info.kv_tokens // per_request, "max_running": stats.max_running,
            "tokens_per_s": stats.output_tokens_per_s, "preemptions": stats.num_preemptions}


def print_table(results: dict, tp: int) -> None:
    from tpsample.term import console, table as make_table

    ref = results[STRATEGIES[0]]["tokens"]
    table = make_table(f"engine, TP={tp}, random Qwen2-shaped model, V={QWEN2_VOCAB:,}",
                       ["strategy", "tokens =\nreplicated", "sampler peak\nMiB/rank", "KV\nblocks",
                        "requests\nKV holds", "peak\nrunning", "tokens/s"], left=("strategy",))
    for name, r in results.items():
        peaks = " / ".join(f"{b / 2**20:.1f}" for b in r["sampler_peak_bytes"])
        table.add_row(name, "yes" if r["tokens"] == ref else "NO", peaks, f"{r['kv_blocks']:,}",
                      f"{r['kv_bound_concurrency']:,}", str(r["max_running"]), f"{r['tokens_per_s']:.0f}")
    console().print(table)


def run_demo(*, tp: int = 2, device: str | None = "cpu", num_requests: int = 24, max_tokens: int = 24,
             max_num_seqs: int = 128, cpu_memory_bytes: int = 512 << 20, model: str | None = None) -> dict:
    """Run every strategy on one mixed batch; print the table; return the per-strategy results."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = model or make_random_checkpoint(tmp, family="qwen2", vocab_size=QWEN2_VOCAB, hidden_size=64,
                                                 num_layers=2, num_heads=4, num_kv_heads=2,
                                                 intermediate_size=128, tie_word_embeddings=True, init_std=0.5)
        from tpsample.model import ModelConfig

        prompts, params = demo_requests(num_requests, max_tokens, ModelConfig.from_folder(folder).vocab_size)
        results = {s: run_strategy(folder, s, prompts, params, tp=tp, device=device,
                                   cpu_memory_bytes=cpu_memory_bytes, max_num_seqs=max_num_seqs)
                   for s in STRATEGIES}
    print_table(results, tp)
    return results
