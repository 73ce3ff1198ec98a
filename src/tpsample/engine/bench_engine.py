"""`tpsample bench engine`: throughput and latency per strategy over batch sizes.

For each strategy one engine is started (max_num_seqs = the largest batch) and warmed up; each
batch size then runs B seeded top-k/top-p requests submitted together. Per run: output tokens/s,
mean time to first token, mean time per output token after the first, per-rank sampler peak and
KV blocks. Prints a table, saves a matplotlib plot, and ends with one JSON line.
"""
from __future__ import annotations

import json
import random
import tempfile
import time

from tpsample.engine.demo_engine import STRATEGIES
from tpsample.engine.toy import QWEN2_VOCAB, make_random_checkpoint


def _requests(batch: int, prompt_len: int, max_tokens: int, vocab: int, seed: int):
    from tpsample import SamplingParams

    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(batch)]
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=seed, max_tokens=max_tokens, ignore_eos=True)
    return prompts, params


def _timed_generate(llm, prompts, params) -> dict:
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    start = time.perf_counter()

    def on_delta(d):
        now = time.perf_counter()
        first.setdefault(d.index, now)
        last[d.index] = now

    outs = llm.generate(prompts, params, stream=on_delta)
    wall = time.perf_counter() - start
    n_out = sum(len(o.output_token_ids) for o in outs)
    ttft = sum(first[i] - start for i in first) / len(first)
    tpot = sum((last[i] - first[i]) / max(1, len(outs[i].output_token_ids) - 1) for i in first) / len(first)
    return {"tokens_per_s": n_out / wall, "ttft_ms": 1e3 * ttft, "tpot_ms": 1e3 * tpot, "wall_s": wall}


def bench_strategy(folder: str, strategy: str, batch_sizes: list[int], *, tp: int, device, dtype,
                   prompt_len: int, max_tokens: int, kv_cache_tokens, cpu_memory_bytes: int) -> list[dict]:
    from tpsample.llm import LLM
    from tpsample.model import ModelConfig

    vocab = ModelConfig.from_folder(folder).vocab_size
    rows = []
    with LLM(folder, tensor_parallel_size=tp, strategy=strategy, device=device, dtype=dtype,
             max_num_seqs=max(batch_sizes), kv_cache_tokens=kv_cache_tokens, cpu_memory_bytes=cpu_memory_bytes) as llm:
        llm.generate(*_requests(2, prompt_len, 4, vocab, 0))               # warm-up
        for b in batch_sizes:
            r = _timed_generate(llm, *_requests(b, prompt_len, max_tokens, vocab, b))
            rows.append({"strategy": strategy, "batch": b, **r, "kv_blocks": llm.info.num_kv_blocks,
                         "sampler_peak_bytes": list(llm.info.sampler_peak_bytes)})
    return rows


def print_table(rows: list[dict], tp: int) -> None:
    from tpsample.term import console, table as make_table

    table = make_table(f"engine throughput and latency, TP={tp}",
                       ["strategy", "batch", "tokens/s", "TTFT\nms", "TPOT\nms", "sampler peak\nMiB/rank", "KV\nblocks"],
                       left=("strategy",))
    for r in rows:
        peaks = " / ".join(f"{b / 2**20:.1f}" for b in r["sampler_peak_bytes"])
        table.add_row(r["strategy"], str(r["batch"]), f"{r['tokens_per_s']:.1f}", f"{r['ttft_ms']:.1f}",
                      f"{r['tpot_ms']:.1f}", peaks, f"{r['kv_blocks']:,}")
    console().print(table)


def save_plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tput, ax_tpot) = plt.subplots(1, 2, figsize=(10, 4))
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        mine = [r for r in rows if r["strategy"] == strategy]
        ax_tput.plot([r["batch"] for r in mine], [r["tokens_per_s"] for r in mine], marker="o", label=strategy)
        ax_tpot.plot([r["batch"] for r in mine], [r["tpot_ms"] for r in mine], marker="o", label=strategy)
    for ax, label in ((ax_tput, "output tokens/s"), (ax_tpot, "time per output token (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel(label)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_bench(*, model: str | None, tp: int, strategies: list[str], batch_sizes: list[int], device, dtype,
              prompt_len: int, max_tokens: int, kv_cache_tokens, cpu_memory_bytes: int, plot: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = model or make_random_checkpoint(tmp, family="qwen2", vocab_size=QWEN2_VOCAB, hidden_size=64,
                                                 num_layers=2, tie_word_embeddings=True, init_std=0.5)
        rows = [row for s in strategies for row in bench_strategy(
            folder, s, batch_sizes, tp=tp, device=device, dtype=dtype or "float32", prompt_len=prompt_len,
            max_tokens=max_tokens, kv_cache_tokens=kv_cache_tokens, cpu_memory_bytes=cpu_memory_bytes)]
    print_table(rows, tp)
    save_plot(rows, plot)
    summary = {"bench": "engine", "tp": tp, "device": device or "auto", "prompt_len": prompt_len,
               "max_tokens": max_tokens, "plot": plot, "results": rows}
    print(json.dumps(summary))
    return summary


__all__ = ["STRATEGIES", "run_bench"]
