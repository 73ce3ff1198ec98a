"""`tpsample demo`: a mixed batch through every strategy at TP ranks, then the engine.

The work lives in `tpsample.demo` (sampler part) and `tpsample.engine.demo_engine` (engine
part); this module owns the options, their checks, and the progress shown while each part runs.
"""
from __future__ import annotations

from .args import check_device, check_gpus_for_ranks, check_tp_splits, int_at_least, read_model_config

# The random model the engine part builds when --engine-model is not given (engine.demo_engine).
BUILTIN_MODEL = {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}


def register(sub) -> None:
    p = sub.add_parser("demo", help="every strategy on one mixed batch (sampler, then the engine)",
                       description="A mixed batch through every sampling strategy at TP ranks (local processes, "
                                   "gloo), then a random-weight Qwen2-shaped engine per strategy.")
    p.add_argument("--tp", metavar="N", type=int_at_least(1), default=2, help="tensor-parallel ranks (local processes)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where logits and models live")
    p.add_argument("--part", choices=["all", "sampler", "engine"], default="all", help="which part to run")
    g = p.add_argument_group("engine part")
    g.add_argument("--engine-requests", metavar="N", type=int_at_least(1), default=24, help="requests in the batch")
    g.add_argument("--engine-max-tokens", metavar="TOKENS", type=int_at_least(1), default=24,
                   help="largest output per request, in tokens")
    g.add_argument("--engine-max-num-seqs", metavar="N", type=int_at_least(1), default=128,
                   help="rows the sampler profile reserves memory for (requests)")
    g.add_argument("--engine-memory-mib", metavar="MIB", type=int_at_least(1), default=512,
                   help="per-rank memory budget on CPU that sizes the KV cache, in MiB")
    g.add_argument("--engine-model", metavar="DIR", default=None,
                   help="a local HF checkpoint folder (default: a random model with the 151,936-token vocabulary)")
    p.set_defaults(check=check, run=run)


def check(args) -> None:
    check_device(args.device)
    if args.part in ("all", "engine"):
        check_gpus_for_ranks(args.device, args.tp)
        if args.engine_model is not None:
            check_tp_splits(read_model_config(args.engine_model, "--engine-model"), args.tp, args.engine_model)
        else:
            check_tp_splits(BUILTIN_MODEL, args.tp, "the engine demo's model (--part sampler skips it)")


def run(args) -> int:
    from ..term import phase

    ok = True
    if args.part in ("all", "sampler"):
        from ..demo import run_sampler_demo

        with phase(f"sampler demo: 4 strategies at TP={args.tp} on {args.device}"):
            summary = run_sampler_demo(tp=args.tp, device=args.device)
        ok = all(v["identical"] for v in summary.values())
    if args.part in ("all", "engine"):
        from ..engine.demo_engine import run_demo

        with phase(f"engine demo: 4 strategies x {args.engine_requests} requests at TP={args.tp}"):
            results = run_demo(tp=args.tp, device=args.device, num_requests=args.engine_requests,
                               max_tokens=args.engine_max_tokens, max_num_seqs=args.engine_max_num_seqs,
                               cpu_memory_bytes=args.engine_memory_mib << 20, model=args.engine_model)
        tokens = [r["tokens"] for r in results.values()]
        ok = ok and all(t == tokens[0] for t in tokens)
    return 0 if ok else 1
