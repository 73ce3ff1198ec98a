"""`tpsample bench engine`: throughput and latency per strategy over batch sizes, or a preset.

Sweep (no preset): for each strategy one engine is started (max_num_seqs = the largest batch)
and warmed up; each batch size then runs B seeded top-k/top-p requests submitted together.
Presets (`PRESETS`, random weights made on the device, one batch per strategy, each engine in a
process of its own on a GPU): `qwen2-1.5b` and `qwen2-7b` (those shapes, bf16, 64 requests x 128
prompt tokens x 64 new tokens, TP = 1, transformers' `generate` on the same GPU and batch as the
reference); `kv-bound` (the 7B-like shape at TP = 2 with long prompts, many requests and a memory
cap that leaves a few GiB for the KV cache, so the sampler memory a strategy frees shows up as KV
blocks, concurrent requests and tokens/s) and `tiny-kv-bound`, its CPU-sized twin (tests).
Per run: output tokens/s, mean time to first token, mean time per output token after the first,
per-rank sampler peak, KV blocks, the most requests running at once, and (on CUDA) the decode
steps' share of HBM bandwidth: (weights + each sequence's K/V read per step) / decode step time,
against the measured device-to-device copy bandwidth and the nominal 4.8 TB/s. Prints a table,
saves a plot (sweep), and ends with one JSON line.
"""
from __future__ import annotations

import json
import os
import random
import tempfile
import time
from dataclasses import dataclass, field

from tpsample.bench.report import copy_bandwidth, finish
from tpsample.bench.report import print_table as print_whole
from tpsample.numerics import release_device_memory
from tpsample.parallel import names
from tpsample.parallel.names import REPORT_ORDER as STRATEGIES

NOMINAL_HBM_BYTES_PER_S = 4.8e12      # H200 datasheet

QWEN2_15B = dict(vocab_size=151_936, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, intermediate_size=8960, tie_word_embeddings=True)
QWEN2_7B = dict(vocab_size=152_064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, intermediate_size=18944, tie_word_embeddings=False)
TINY = dict(vocab_size=4096, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=False)


@dataclass(frozen=True, kw_only=True)
class Preset:
    shape: dict
    tp: int = 1
    num_requests: int = 64
    prompt_len: int = 128
    max_tokens: int = 64
    dtype: str = "bfloat16"
    headroom_bytes: int | None = None     # cap memory at weights + this (per rank); None: 0.9 of it
    cpu_memory_bytes: int = 1 << 30
    hf_reference: bool = True
    strategies: tuple[str, ...] = ("auto",)
    engine_options: dict = field(default_factory=dict)


PRESETS = {
    "qwen2-1.5b": Preset(shape=QWEN2_15B),
    "qwen2-7b": Preset(shape=QWEN2_7B),
    "kv-bound": Preset(shape=QWEN2_7B, tp=2, num_requests=256, prompt_len=2048, max_tokens=128,
                       headroom_bytes=6 << 30, hf_reference=False,
                       strategies=names.REPORT_ORDER),
    "tiny-kv-bound": Preset(shape=TINY, tp=2, num_requests=12, prompt_len=100, max_tokens=6, dtype="float32",
                            cpu_memory_bytes=5 << 20, hf_reference=False,
                            strategies=names.FIXED,
                            engine_options=dict(max_num_batched_tokens=256)),
}


def write_config(folder: str, shape: dict, dtype: str) -> str:
    """A Qwen2 config.json (random weights come from load_format='dummy')."""
    cfg = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-6,
               rope_theta=1e6, max_position_embeddings=32768, torch_dtype=dtype, eos_token_id=None,
               bos_token_id=None, use_sliding_window=False, **shape)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    return folder


def weights_bytes_per_rank(shape: dict, tp: int, dtype_bytes: int) -> int:
    h, i, v, layers = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"], shape["num_hidden_layers"]
    d = h // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * d
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * i
    embed = v * h * (1 if shape.get("tie_word_embeddings") else 2)
    return (layers * per_layer + embed) * dtype_bytes // tp


def memory_utilization(preset: Preset, device: str) -> float:
    """The gpu_memory_utilization that caps each rank at weights + headroom (0.9 without a cap)."""
    if preset.headroom_bytes is None or device != "cuda":
        return 0.9
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    size = 2 if preset.dtype in ("bfloat16", "float16") else 4
    return min(0.95, (weights_bytes_per_rank(preset.shape, preset.tp, size) + preset.headroom_bytes) / total)


def hf_generate_tokens_per_s(folder: str, prompts: list[list[int]], max_tokens: int, dtype: str) -> float:
    """transformers' generate on the same GPU and batch: seeded top-k/top-p, exactly max_tokens each."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    torch_dtype = getattr(torch, dtype)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch_dtype).eval()
    ids = torch.tensor(prompts, device="cuda")
    mask = torch.ones_like(ids)
    kwargs = dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.9, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:2], attention_mask=mask[:2], max_new_tokens=4, min_new_tokens=4, **kwargs)  # warm-up
        torch.cuda.synchronize()
        torch.manual_seed(0)
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             **kwargs)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    num_out = (out.shape[1] - ids.shape[1]) * out.shape[0]
    del model, out
    release_device_memory()
    return num_out / wall


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
    from tpsample.term import table as make_table

    table = make_table(f"engine throughput and latency, TP={tp}",
                       ["strategy", "batch", "tokens/s", "TTFT\nms", "TPOT\nms", "sampler peak\nMiB/rank", "KV\nblocks"],
                       left=("strategy",))
    for r in rows:
        peaks = " / ".join(f"{b / 2**20:.1f}" for b in r["sampler_peak_bytes"])
        table.add_row(r["strategy"], str(r["batch"]), f"{r['tokens_per_s']:.1f}", f"{r['ttft_ms']:.1f}",
                      f"{r['tpot_ms']:.1f}", peaks, f"{r['kv_blocks']:,}")
    print_whole(table)


def run_bench(*, model: str | None, tp: int, strategies: list[str], batch_sizes: list[int], device, dtype,
              prompt_len: int, max_tokens: int, kv_cache_tokens, cpu_memory_bytes: int, plot: str,
              out: str | None = None) -> dict:
    from tpsample.testing.toy import QWEN2_VOCAB, make_random_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        folder = model or make_random_checkpoint(tmp, family="qwen2", vocab_size=QWEN2_VOCAB, hidden_size=64,
                                                 num_layers=2, tie_word_embeddings=True, init_std=0.5)
        rows = [row for s in strategies for row in bench_strategy(
            folder, s, batch_sizes, tp=tp, device=device, dtype=dtype or "float32", prompt_len=prompt_len,
            max_tokens=max_tokens, kv_cache_tokens=kv_cache_tokens, cpu_memory_bytes=cpu_memory_bytes)]
    print_table(rows, tp)
    from tpsample.bench.plots import plot_engine

    plot_engine(rows, plot)
    summary = {"bench": "engine", "tp": tp, "device": device or "auto", "prompt_len": prompt_len,
               "max_tokens": max_tokens, "plot": plot, "results": rows}
    return finish(summary, out, device)


def run_preset(name: str, *, strategies: list[str] | None, device: str | None, hf_reference: bool | None,
               tp: int | None = None, out: str | None = None) -> dict:
    """One batch of the preset per strategy (each in a fresh engine, closed before the next)."""
    from rich.progress import Progress

    preset = PRESETS[name]
    device = device or "cpu"
    tp = tp or preset.tp
    strategies = strategies or list(preset.strategies)
    util = memory_utilization(preset, device)
    bandwidth = copy_bandwidth(device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, Progress(transient=True) as progress:
        folder = write_config(tmp, preset.shape, preset.dtype)
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
    preset = PRESETS[name]
    prompts, _ = _requests(preset.num_requests, preset.prompt_len, preset.max_tokens, preset.shape["vocab_size"], 0)
    return hf_generate_tokens_per_s(folder, prompts, preset.max_tokens, preset.dtype)


def preset_run(folder: str, name: str, strategy: str, tp: int, device: str, util: float, bandwidth) -> dict:
    """One engine of the preset: warm-up, then the timed batch; the engine is closed on return."""
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
