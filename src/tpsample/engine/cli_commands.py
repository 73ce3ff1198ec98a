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
    p.add_argument("--model", default=None,
                   help="local HF folder (config.json + *.safetensors); default: SmolLM2-135M-Instruct")
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
    p.add_argument("--stream", action="store_true", help="print the text as it comes")
    p.add_argument("--chat", action="store_true", help="apply the chat template: each --prompt is a user message")
    p.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")


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


def _text_printer(num_prompts: int):
    """Stream text as it comes: bare for one prompt, one tagged line per delta for several."""
    if num_prompts == 1:
        return lambda d: print(d.text if d.text else "", end="\n" if d.finished else "", flush=True)
    return lambda d: d.text and print(f"[{d.index}] {d.text!r}", flush=True)


def run_generate(args) -> int:
    import tpsample

    prompts = list(args.prompt) + [_csv_ints(p) for p in args.prompt_ids]
    if not prompts:
        print("give at least one --prompt or --prompt-ids", file=sys.stderr)
        return 2
    params = tpsample.SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                     min_p=args.min_p, seed=args.seed, logprobs=args.logprobs,
                                     max_tokens=args.max_tokens, stop=args.stop)
    if args.chat and args.prompt_ids:
        raise ValueError("--chat takes text --prompt messages, not --prompt-ids")
    from tpsample.engine.default_model import quiet_transformers, resolve_model
    quiet_transformers()
    with _llm_from_args(args, resolve_model(args.model)[0]) as llm:
        stream = _text_printer(len(prompts)) if args.stream else None
        if args.chat:
            outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, guided=_guided(args),
                            stream=stream)
        else:
            outs = llm.generate(prompts, params, guided=_guided(args), stream=stream)
        for i, out in enumerate(outs):
            shown = out.text if out.text is not None else out.output_token_ids
            print(f"[{i}] ({out.finish_reason}, {len(out.output_token_ids)} tokens) {shown!r}")
        stats, info = llm.last_stats, llm.info
    print(json.dumps({"info": info.as_dict(), "stats": stats.as_dict()}))
    return 0


def add_demo_engine_args(p) -> None:
    """Options of the engine part of `tpsample demo` (--device comes from the demo itself)."""
    p.add_argument("--engine-model", default=None,
                   help="local HF folder for the engine part (default: SmolLM2-135M-Instruct, fetched once)")
    p.add_argument("--engine-tp", default=None,
                   help="comma-separated TP sizes for the engine part (default: 1 and the smallest > 1 that "
                        "splits the model: 1,3 for SmolLM2)")
    p.add_argument("--engine-max-tokens", type=int, default=24, help="tokens per chat answer (default: 24)")


def run_demo_engine(args) -> dict:
    from tpsample.engine.demo_engine import run_demo

    sizes = _csv_ints(args.engine_tp) if getattr(args, "engine_tp", None) else None
    if sizes is not None and (not sizes or min(sizes) < 1):
        raise ValueError(f"--engine-tp must list TP sizes >= 1, got {args.engine_tp!r}")
    if getattr(args, "engine_max_tokens", 24) < 1:
        raise ValueError(f"--engine-max-tokens must be >= 1, got {args.engine_max_tokens}")
    return run_demo(model=getattr(args, "engine_model", None), tp_sizes=sizes,
                    device=getattr(args, "device", None) or "cpu", max_tokens=getattr(args, "engine_max_tokens", 24))


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
