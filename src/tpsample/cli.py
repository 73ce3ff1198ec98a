"""The `tpsample` command: demo, bench (sampler | kernels | engine | serve), generate, serve, chat.

Parsers are built inside `main`, never at import time. Subcommands import their modules lazily so
`tpsample --help` stays fast.
"""
from __future__ import annotations

import argparse
import sys


def _engine_commands():
    try:
        from .engine import cli_commands
    except ImportError as exc:  # the engine is optional for the sampler-only commands
        return None, exc
    return cli_commands, None


def _demo(args) -> int:
    from .demo import closing_sentence, run_sampler_demo
    if args.tp < 1:
        raise ValueError(f"--tp must be >= 1, got {args.tp}")
    sampler = run_sampler_demo(tp=args.tp, device=args.device) if args.part in ("all", "sampler") else None
    engine_summary = None
    if args.part in ("all", "engine"):
        engine, err = _engine_commands()
        if engine is None:
            print(f"engine demo unavailable: {err}")
            return 1
        engine_summary = engine.run_demo_engine(args)
    print(closing_sentence(sampler, engine_summary, args.tp))
    ok = all(v["identical"] for v in (sampler or {}).values()) and (engine_summary or {}).get("identical", True)
    return 0 if ok else 1


def _bench(args) -> int:
    if args.what == "sampler":
        from .bench import sampler
        sampler.main(args)
    elif args.what == "kernels":
        from .bench import kernels
        kernels.run_bench_kernels(args)
    elif args.what == "serve":
        from .serve import commands as serve_commands
        serve_commands.run_bench_serve(args)
    else:
        engine, err = _engine_commands()
        if engine is None:
            raise SystemExit(f"bench engine unavailable: {err}")
        engine.run_bench_engine(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpsample", description="Exact sampling for tensor-parallel decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="every strategy on a mixed batch at TP=2, then real chat answers "
                                       "at TP=1 and TP=3")
    demo.add_argument("--tp", type=int, default=2, help="TP size of the sampler part (default: 2)")
    demo.add_argument("--device", default=None, help="cpu (default) or cuda")
    demo.add_argument("--part", default="all", choices=["all", "sampler", "engine"])
    bench = sub.add_parser("bench", help="benchmarks: a table and one JSON line")
    bsub = bench.add_subparsers(dest="what", required=True)
    from .bench import sampler as bench_sampler
    bench_sampler.add_args(bsub.add_parser("sampler", help="strategies x TP x rows x vocab"))
    kernels = bsub.add_parser("kernels", help="Triton kernels vs torch and FlashInfer")
    try:
        from .bench.kernels import add_bench_kernels_args
        add_bench_kernels_args(kernels)
    except ImportError:
        pass
    engine_bench = bsub.add_parser("engine", help="engine throughput per strategy")
    engine, _ = _engine_commands()
    gen = sub.add_parser("generate", help="generate with a local HF checkpoint (default: SmolLM2-135M-Instruct)")
    from .serve import commands as serve_commands
    serve_commands.add_serve_args(sub.add_parser("serve", help="OpenAI-compatible HTTP server"))
    serve_commands.add_chat_args(sub.add_parser("chat", help="chat in the terminal"))
    serve_commands.add_bench_serve_args(bsub.add_parser("serve", help="concurrent clients against the server"))
    for name, sp in (("add_bench_engine_args", engine_bench), ("add_generate_args", gen),
                     ("add_demo_engine_args", demo)):
        if engine is not None and hasattr(engine, name):
            getattr(engine, name)(sp)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except ValueError as e:                 # a user mistake: one line, exit code 2
        print(f"tpsample {args.command}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2


def _run(args) -> int:
    if args.command in ("serve", "chat"):
        from .serve import commands as serve_commands
        return getattr(serve_commands, f"run_{args.command}")(args)
    if args.command == "demo":
        if args.device is None:
            args.device = "cpu"
        return _demo(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "generate":
        engine, _ = _engine_commands()
        return engine.run_generate(args) or 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
