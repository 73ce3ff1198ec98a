"""`tpsample bench engine`: throughput and latency per strategy over batch sizes, or a preset.

Sweep (no preset): for each strategy one engine is started (max_num_seqs = the largest batch)
and warmed up; each batch size then runs B seeded top-k/top-p requests submitted together.
Preset (`--preset`, see `engine_presets.py`): a realistic shape with random weights made on the
device, one batch per strategy, plus transformers' `generate` as the reference where the preset
asks for it. Per run: output tokens/s, mean time to first token, mean time per output token after
the first, per-rank sampler peak, KV blocks, the most requests running at once, and (on CUDA)
the decode steps' share of HBM bandwidth. Prints a table, saves a matplotlib plot (sweep), and
ends with one JSON line.
"""
from __future__ import annotations

import json
import random
import tempfile
import time

from tpsample.bench.measure import copy_bandwidth
from tpsample.bench.report import finish
from tpsample.bench.report import print_table as print_whole
from tpsample.parallel.names import REPORT_ORDER as STRATEGIES
from tpsample.testing.toy import QWEN2_VOCAB, make_random_checkpoint


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
    stats, info = llm.last_stats, llm.info
    decode_ms = 1e3 * stats.decode_s / stats.num_decode_steps if stats.num_decode_steps else 0.0
    return {"tokens_per_s": n_out / wall, "ttft_ms": 1e3 * ttft, "tpot_ms": 1e3 * tpot, "wall_s": wall,
            "num_output_tokens": n_out, "max_running": stats.max_running, "num_preemptions": stats.num_preemptions,
            "decode_steps": stats.num_decode_steps, "decode_step_ms": decode_ms,
            "decode_bytes_per_s": stats.decode_bytes_per_s(info.weights_bytes, info.kv_bytes_per_token)}


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
    from tpsample.term import console
    from tpsample.term import table as make_table

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
              prompt_len: int, max_tokens: int, kv_cache_tokens, cpu_memory_bytes: int, plot: str,
              out: str | None = None) -> dict:
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
    return finish(summary, out, device)


def run_preset(name: str, *, strategies: list[str] | None, device: str | None, hf_reference: bool | None,
               tp: int | None = None, out: str | None = None) -> dict:
    """One batch of the preset per strategy (each in a fresh engine, closed before the next)."""
    from rich.progress import Progress

    from tpsample.bench import engine_presets as bp

    preset = bp.PRESETS[name]
    device = device or "cpu"
    tp = tp or preset.tp
    strategies = strategies or list(preset.strategies)
    util = bp.memory_utilization(preset, device)
    bandwidth = copy_bandwidth(device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, Progress(transient=True) as progress:
        folder = bp.write_config(tmp, preset.shape, preset.dtype)
        task = progress.add_task(f"bench engine {name}", total=len(strategies) + bool(hf_reference))
        isolate = device == "cuda"        # on a GPU each configuration runs in its own process
        for strategy in strategies:
            args = dict(folder=folder, name=name, strategy=strategy, tp=tp, device=device, util=util,
                        bandwidth=bandwidth)
            rows.append(_isolated("preset_run", args) if isolate else preset_run(**args))
            progress.advance(task)
        reference = None
        if hf_reference if hf_reference is not None else (preset.hf_reference and device == "cuda" and tp == 1):
            try:
                reference = _isolated("hf_reference", dict(folder=folder, name=name))
            except Exception as e:     # the engine's numbers still stand; say why the reference is missing
                print(f"transformers generate reference failed: {type(e).__name__}: {e}")
            progress.advance(task)
    print_preset_table(name, rows, reference, bandwidth)
    summary = {"bench": "engine", "preset": name, "tp": tp, "device": device, "num_requests": preset.num_requests,
               "prompt_len": preset.prompt_len, "max_tokens": preset.max_tokens, "gpu_memory_utilization": util,
               "copy_bytes_per_s": bandwidth, "hf_generate_tokens_per_s": reference, "results": rows}
    return finish(summary, out, device)


_MARK = "@@bench-result "


def _isolated(fn: str, kwargs: dict):
    """fn(**kwargs) of this module in a fresh Python process (its own CUDA context and allocator)."""
    import subprocess
    import sys

    code = ("import json, sys; from tpsample.bench import engine as b; "
            f"print({_MARK!r} + json.dumps(getattr(b, sys.argv[1])(**json.loads(sys.argv[2]))))")
    done = subprocess.run([sys.executable, "-c", code, fn, json.dumps(kwargs)], capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    raise RuntimeError(f"{fn} failed in its subprocess:\n{done.stderr[-3000:]}")


def hf_reference(folder: str, name: str) -> float:
    from tpsample.bench import engine_presets as bp

    preset = bp.PRESETS[name]
    prompts, _ = _requests(preset.num_requests, preset.prompt_len, preset.max_tokens, preset.shape["vocab_size"], 0)
    return bp.hf_generate_tokens_per_s(folder, prompts, preset.max_tokens, preset.dtype)


def preset_run(folder: str, name: str, strategy: str, tp: int, device: str, util: float, bandwidth) -> dict:
    """One engine of the preset: warm-up, then the timed batch; the engine is closed on return."""
    from tpsample.bench.engine_presets import NOMINAL_HBM_BYTES_PER_S, PRESETS
    from tpsample.llm import LLM

    preset = PRESETS[name]
    prompts, params = _requests(preset.num_requests, preset.prompt_len, preset.max_tokens,
                                preset.shape["vocab_size"], 0)
    with LLM(folder, tensor_parallel_size=tp, strategy=strategy, device=device, dtype=preset.dtype,
             load_format="dummy", max_num_seqs=preset.num_requests, gpu_memory_utilization=util,
             cpu_memory_bytes=preset.cpu_memory_bytes, **preset.engine_options) as llm:
        llm.generate(prompts[:2], params)                                  # warm-up
        r = _timed_generate(llm, prompts, params)
        info = llm.info
    r.update(strategy=strategy, kv_blocks=info.num_kv_blocks, kv_tokens=info.kv_tokens, block_size=info.block_size,
             kv_bytes_per_token=info.kv_bytes_per_token,
             sampler_peak_bytes=list(info.sampler_peak_bytes), attention=info.attention,
             cuda_graphs=bool(info.cuda_graph_batch_sizes),
             hbm_fraction_nominal=r["decode_bytes_per_s"] / NOMINAL_HBM_BYTES_PER_S,
             hbm_fraction_measured=r["decode_bytes_per_s"] / bandwidth if bandwidth else None)
    return r


def print_preset_table(name: str, rows: list[dict], reference: float | None, bandwidth: float | None) -> None:
    from tpsample.term import console as make_console
    from tpsample.term import table as make_table

    table = make_table(f"engine preset {name}", ["strategy", "tokens/s", "x HF", "TPOT\nms", "decode\nstep ms",
                       "HBM %\n(meas / 4.8)", "sampler\nMiB / rank", "KV\nblocks", "max\nrunning"], left=("strategy",))
    for r in rows:
        meas = f"{100 * r['hbm_fraction_measured']:.0f}" if r["hbm_fraction_measured"] is not None else "-"
        table.add_row(r["strategy"], f"{r['tokens_per_s']:,.0f}",
                      f"{r['tokens_per_s'] / reference:.1f}" if reference else "-", f"{r['tpot_ms']:.2f}",
                      f"{r['decode_step_ms']:.2f}", f"{meas} / {100 * r['hbm_fraction_nominal']:.0f}",
                      " / ".join(f"{b / 2**20:.0f}" for b in r["sampler_peak_bytes"]), f"{r['kv_blocks']:,}",
                      str(r["max_running"]))
    print_whole(table)
    console = make_console()
    if reference:
        console.print(f"transformers generate, same GPU and batch: {reference:,.0f} tokens/s")
    if bandwidth:
        console.print(f"measured device-to-device copy: {bandwidth / 1e12:.2f} TB/s")


__all__ = ["STRATEGIES", "run_bench", "run_preset"]
