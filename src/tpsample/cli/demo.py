"""`tpsample demo`: a mixed batch through every strategy at TP ranks, then real chat answers.

The work lives in `tpsample.demo.sampler` (sampler part) and `tpsample.demo.engine` (engine
part: SmolLM2-135M-Instruct's answers at TP=1 and TP=3 under every strategy); this module owns
the options, their checks, the progress shown while each part runs, and the closing sentence.
"""
from __future__ import annotations

from .args import check_device, csv_ints, int_at_least
from .engine_opts import check_model

# SmolLM2-135M-Instruct's shape (the default engine model; its offline stand-in splits alike)
DEFAULT_MODEL = {"num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536}


def register(sub) -> None:
    p = sub.add_parser("demo", help="every strategy on one mixed batch, then real chat answers at TP=1 and TP=3",
                       description="A mixed batch through every sampling strategy at TP ranks (local processes, "
                                   "gloo), then SmolLM2-135M-Instruct's chat answers at TP=1 and TP=3 under every "
                                   "strategy (fetched once; a tiny random model when offline).")
    p.add_argument("--tp", metavar="N", type=int_at_least(1), default=2,
                   help="tensor-parallel ranks of the sampler part (local processes)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where logits and models live")
    p.add_argument("--part", choices=["all", "sampler", "engine"], default="all", help="which part to run")
    g = p.add_argument_group("engine part")
    g.add_argument("--engine-model", metavar="DIR", default=None,
                   help="a local HF checkpoint folder (default: SmolLM2-135M-Instruct, fetched once)")
    g.add_argument("--engine-tp", metavar="LIST", type=csv_ints(1), default=None,
                   help="comma-separated TP sizes (default: 1 and the smallest > 1 that splits the model: 1,3)")
    g.add_argument("--engine-max-tokens", metavar="TOKENS", type=int_at_least(1), default=24,
                   help="tokens per chat answer")
    p.set_defaults(check=check, run=run)


def check(args) -> None:
    check_device(args.device)
    if args.part in ("all", "engine"):
        check_model(args.engine_model, args.engine_tp or [1], args.device, option="--engine-model",
                    default=DEFAULT_MODEL, default_name="the default model (SmolLM2-135M-Instruct)")


def run(args) -> int:
    from ..demo.sampler import closing_sentence
    from ..term import phase

    sampler = engine = None
    if args.part in ("all", "sampler"):
        from ..demo.sampler import run_sampler_demo

        with phase(f"sampler demo: 4 strategies at TP={args.tp} on {args.device}"):
            sampler = run_sampler_demo(tp=args.tp, device=args.device)
    if args.part in ("all", "engine"):
        from ..demo.engine import run_demo

        engine = run_demo(model=args.engine_model, tp_sizes=args.engine_tp, device=args.device,
                          max_tokens=args.engine_max_tokens)      # shows its own progress
    print(closing_sentence(sampler, engine, args.tp))
    ok = all(v["identical"] for v in (sampler or {}).values()) and (engine or {}).get("identical", True)
    return 0 if ok else 1
