"""Engine subcommands for the `tpsample` CLI: `generate`, `bench engine`, and the engine part of
`demo`. `cli.py` owns the top-level parser and calls `add_*_args(subparser)` to build each
subcommand's options, then `run_*(args)`. Nothing here runs at import time.
"""
from __future__ import annotations

import argparse
import json
import sys

from tpsample.engine.demo_engine import STRATEGIES


def _csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _engine_args(p) -> None:
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (ranks)")
    p.add_argument("--strategy", default="auto", choices=["auto", *STRATEGIES[:3]])
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if one GPU per rank)")
    p.add_argument("--dtype", default=None, help="float32 | float16 | bfloat16 (default: the checkpoint's)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--kv-cache-tokens", type=int, default=None, help="fix the KV capacity instead of profiling")
    p.add_argument("--speculative-ngram", type=int, default=None, help="n-gram draft tokens per step")


def add_generate_args(p) -> None:
    p.add_argument("--model", required=True, help="local HF folder (config.json + *.safetensors)")
    p.add_argument("--prompt", action="append", default=[], help="a text prompt (repeatable; needs a tokenizer)")
    p.add_argument("--prompt-ids", action="append", default=[], help="comma-separated token ids (repeatable)")
    _engine_args(p)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--logprobs", type=int, default=None)
    p.add_argument("--json-schema", default=None, help="a JSON schema (inline JSON or @file)")
    p.add_argument("--regex", default=None, help="constrain the output to this regex")
    p.add_argument("--stream", action="store_true", help="print tokens as they come")


def _llm_from_args(args, model: str):
    from tpsample.llm import LLM

    return LLM(model, tensor_parallel_size=args.tp, strategy=args.strategy, device=args.device, dtype=args.dtype,
               max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
               speculative_ngram=args.speculative_ngram, kv_cache_tokens=args.kv_cache_tokens)


def _guided(args):
    from tpsample.engine.request import GuidedDecoding

    if args.json_schema:
        text = args.json_schema
        if text.startswith("@"):
            with open(text[1:]) as f:
                text = f.read()
        return GuidedDecoding(json_schema=text)
    return GuidedDecoding(regex=args.regex) if args.regex else None


def run_generate(args) -> int:
    import tpsample

    prompts = list(args.prompt) + [_csv_ints(p) for p in args.prompt_ids]
    if not prompts:
        print("give at least one --prompt or --prompt-ids", file=sys.stderr)
        return 2
    params = tpsample.SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                     min_p=args.min_p, seed=args.seed, logprobs=args.logprobs,
                                     max_tokens=args.max_tokens)
    with _llm_from_args(args, args.model) as llm:
        stream = (lambda d: print(f"[{d.index}] +{d.new_token_ids}", flush=True)) if args.stream else None
        outs = llm.generate(prompts, params, guided=_guided(args), stream=stream)
        for i, out in enumerate(outs):
            shown = out.text if out.text is not None else out.output_token_ids
            print(f"[{i}] ({out.finish_reason}, {len(out.output_token_ids)} tokens) {shown!r}")
        stats, info = llm.last_stats, llm.info
    print(json.dumps({"info": info.as_dict(), "stats": stats.as_dict()}))
    return 0


def add_demo_engine_args(p) -> None:
    """Options of the engine part of `tpsample demo` (--tp and --device come from the demo itself)."""
    p.add_argument("--engine-requests", type=int, default=24, help="requests in the engine demo batch")
    p.add_argument("--engine-max-tokens", type=int, default=24)
    p.add_argument("--engine-max-num-seqs", type=int, default=128, help="rows the KV profile reserves for")
    p.add_argument("--engine-memory-mib", type=int, default=512, help="per-rank memory budget on CPU")
    p.add_argument("--engine-model", default=None, help="a local HF folder instead of the random model")


def run_demo_engine(args) -> dict:
    from tpsample.engine.demo_engine import run_demo

    return run_demo(tp=getattr(args, "tp", 2), device=getattr(args, "device", None) or "cpu",
                    num_requests=getattr(args, "engine_requests", 24),
                    max_tokens=getattr(args, "engine_max_tokens", 24),
                    max_num_seqs=getattr(args, "engine_max_num_seqs", 128),
                    cpu_memory_bytes=getattr(args, "engine_memory_mib", 512) << 20,
                    model=getattr(args, "engine_model", None))


def add_bench_engine_args(p) -> None:
    p.add_argument("--model", default=None, help="local HF folder (default: random Qwen2-shaped, V=151,936)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default 2, or the preset's)")
    p.add_argument("--strategies", default=None, help=f"comma-separated (default {','.join(STRATEGIES)}, "
                                                       "or the preset's)")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--kv-cache-tokens", type=int, default=None)
    p.add_argument("--memory-mib", type=int, default=1024, help="per-rank memory budget on CPU")
    p.add_argument("--plot", default="bench_engine.png", help="where to save the plot")
    p.add_argument("--preset", default=None, choices=["qwen2-1.5b", "qwen2-7b", "kv-bound", "tiny-kv-bound"],
                   help="a realistic shape with random weights (see docs/engine.md); --tp / --strategies "
                        "override the preset's, the sweep options are ignored")
    p.add_argument("--hf-reference", default=None, action=argparse.BooleanOptionalAction,
                   help="also time transformers' generate on the same GPU and batch (default: the preset's)")


def run_bench_engine(args) -> dict:
    from tpsample.engine.bench_engine import run_bench, run_preset

    strategies = args.strategies.split(",") if args.strategies else None
    if args.preset is not None:
        return run_preset(args.preset, strategies=strategies, device=args.device, hf_reference=args.hf_reference,
                          tp=args.tp)
    args.tp, strategies = args.tp or 2, strategies or list(STRATEGIES)
    return run_bench(model=args.model, tp=args.tp, strategies=strategies,
                     batch_sizes=_csv_ints(args.batch_sizes), device=args.device, dtype=args.dtype,
                     prompt_len=args.prompt_len, max_tokens=args.max_tokens, kv_cache_tokens=args.kv_cache_tokens,
                     cpu_memory_bytes=args.memory_mib << 20, plot=args.plot)
