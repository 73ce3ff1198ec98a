"""`tpsample bench sampler | kernels | engine`: the benchmarks' options and their checks.

The benchmarks themselves live in `tpsample.bench.sampler`, `tpsample.bench.kernels` and
`tpsample.bench.engine`; each prints a table and ends with one JSON line. Everything a
run could trip over late (no CUDA, an unwritable plot path, a TP size the model cannot split)
is checked here first.
"""
from __future__ import annotations

import argparse
import importlib.util
import os

from ..bench.workloads import CASE_NAMES, CLASSES, WORKLOADS
from ..numerics import DTYPE_NAMES
from ..parallel import names
from .args import (
    UsageError,
    check_device,
    check_writable_file,
    csv_choices,
    csv_ints,
    int_at_least,
    positive_real,
)
from .engine_opts import add_engine_args, check_model, open_llm

STRATEGIES = names.REPORT_ORDER
# The random model bench engine builds when --model is not given (bench.engine).
BUILTIN_MODEL = {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}


def register(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks: a table for people, then one JSON line",
                           description="Benchmarks. Each prints a table and ends with one JSON line.")
    what = bench.add_subparsers(dest="what", required=True, metavar="BENCH")
    _sampler_parser(what)
    _kernels_parser(what)
    _engine_parser(what)
    _serve_parser(what)


def _out_option(p) -> None:
    p.add_argument("--out", metavar="PATH", default=None,
                   help="also write the JSON report (with the commit, versions and command) to PATH (default: none)")


def _sampler_parser(what) -> None:
    p = what.add_parser("sampler", help="strategies x TP x rows x vocab: latency, memory, bytes moved; or --compare")
    p.add_argument("--tp", metavar="N", type=int_at_least(1), nargs="+", default=[1, 2, 4],
                   help="TP sizes (local processes)")
    p.add_argument("--rows", metavar="N", type=int_at_least(1), nargs="+", default=None,
                   help="logits rows per step (default: 8 64; with --compare 32 256 1024)")
    p.add_argument("--vocab", metavar="V", type=int_at_least(1), nargs="+", default=None,
                   help="vocabulary sizes (default: 32000 151936; with --compare 151936, the first one given)")
    p.add_argument("--strategies", metavar="NAME", nargs="+", choices=STRATEGIES, default=list(STRATEGIES),
                   help=f"strategies to run, from {', '.join(STRATEGIES)}")
    p.add_argument("--steps", metavar="N", type=int_at_least(1), default=None,
                   help="timed steps per case, after warm-up (default: 3; with --compare 21 calls)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="where the logits live (default: cpu; with --compare cuda, and cpu is a smoke run of its "
                        "code: wall times only)")
    p.add_argument("--workload", metavar="NAME", nargs="+", choices=[*WORKLOADS, "classes"], default=["topk-topp"],
                   help=f"sampling parameters of the requests, from {', '.join(WORKLOADS)}; 'classes' for every "
                        f"feature class ({' '.join(CLASSES)})")
    p.add_argument("--logits", choices=["randn", "zipf"], nargs="+", default=["randn"],
                   help="randn x 3, or Zipf-like rows (logit -1.1 ln(rank) + noise, ranks shuffled); several run in "
                        "turn")
    p.add_argument("--threads", metavar="N", type=int_at_least(1), default=1,
                   help="torch threads per rank, the same at every TP (TP = 1 included)")
    p.add_argument("--plot", metavar="PATH", default=None,
                   help="PNG path for the plot, '' to skip (default: bench_sampler.png, with --compare "
                        "bench_sampler_compare.png)")
    p.add_argument("--compare", action="store_true",
                   help="one GPU: tpsample (automatic replay off / on, a new buffer each call, capture + replay) "
                        "against FlashInfer and argmax on the same logits, per call as an engine sees it")
    p.add_argument("--cases", metavar="NAME", nargs="+", choices=CASE_NAMES, default=None,
                   help=f"--compare: the cases to run, from {', '.join(CASE_NAMES)} (default: all)")
    p.add_argument("--flashinfer-build-s", metavar="S", type=int_at_least(0), default=240,
                   help="--compare: seconds FlashInfer's JIT modules may take to build, all together; 0 skips "
                        "FlashInfer")
    p.add_argument("--flashinfer-status", metavar="PATH", default=None,
                   help="--compare: FlashInfer's modules were built ahead by `python -m tpsample.bench.flashinfer "
                        "--out PATH`: read that status instead of building (default: build)")
    _out_option(p)
    p.set_defaults(check=_check_sampler, run=_run_sampler)


def _check_sampler(args) -> None:
    compare = args.compare
    args.device = args.device or ("cuda" if compare else "cpu")
    args.rows = args.rows or ([32, 256, 1024] if compare else [8, 64])
    args.vocab = args.vocab or ([151936] if compare else [32000, 151936])
    args.steps = args.steps or (21 if compare else 3)
    if "classes" in args.workload:
        named = (CLASSES if name == "classes" else [name] for name in args.workload)
        args.workload = list(dict.fromkeys(w for names in named for w in names))
    if args.plot is None:
        args.plot = "bench_sampler_compare.png" if compare else "bench_sampler.png"
    for path, option in ((args.plot, "--plot"), (args.out, "--out")):
        if path:
            check_writable_file(path, option)
    check_device(args.device, "--compare" if compare else "--device")
    if compare:
        if args.flashinfer_status and not os.path.isfile(args.flashinfer_status):
            raise UsageError(f"--flashinfer-status {args.flashinfer_status!r} is not a file")
        return
    if max(args.tp) > min(args.vocab):
        raise ValueError(f"--tp {max(args.tp)} exceeds --vocab {min(args.vocab)}: every rank needs a vocabulary shard")


def _run_sampler(args) -> int:
    from ..bench import sampler

    sampler.main(args)
    return 0


def _kernels_parser(what) -> None:
    p = what.add_parser("kernels", help="the Triton kernels against torch and FlashInfer (needs CUDA)")
    p.add_argument("--rows", metavar="N", type=int_at_least(1), nargs="+", default=[1, 32, 256, 1024],
                   help="rows per call")
    p.add_argument("--vocab", metavar="V", type=int_at_least(1), nargs="+", default=[32000, 151936],
                   help="vocabulary sizes (tokens)")
    p.add_argument("--dtypes", metavar="DTYPE", nargs="+", default=None,
                   help="logits dtypes: fp32 bf16 (default: all)")
    p.add_argument("--shapes", nargs="+", choices=["randn", "zipf"], default=["randn", "zipf"],
                   help="logit shapes: randn x 3, or a peaked Zipf-like row")
    p.add_argument("--configs", metavar="NAME", nargs="+", default=None,
                   help="sampling configurations: greedy temperature topk50_topp0.9 topp0.9 minp0.05 logprobs5 "
                        "(default: all)")
    p.add_argument("--iters", metavar="N", type=int_at_least(1), default=20, help="timed calls per case")
    p.add_argument("--warmup", metavar="N", type=int_at_least(0), default=3, help="untimed calls per case first")
    p.add_argument("--quick", action="store_true", help="rows 1 and 256, vocab 151,936, fp32 only")
    p.add_argument("--no-anchors", action="store_true", help="skip the torch / FlashInfer anchors")
    p.add_argument("--gpu-time", action="store_true",
                   help="also report the kernels' device time alone (torch.profiler; on with --quick)")
    p.add_argument("--sweep", metavar="VARIANT", nargs="*", default=None,
                   help="instead: the launch-shape sweep of sample_rows over KernelConfig variants (device time "
                        "per kernel, token check, paths); names pick variants (default: all)")
    p.add_argument("--device", metavar="DEVICE", default="cuda", help="a CUDA device: cuda or cuda:N")
    _out_option(p)
    p.set_defaults(check=_check_kernels, run=_run_kernels)


def _check_kernels(args) -> None:
    if not args.device.startswith("cuda"):
        raise UsageError(f"bench kernels needs a CUDA device, got --device {args.device}")
    check_device(args.device)
    if importlib.util.find_spec("triton") is None:
        raise UsageError("bench kernels needs triton (pip install triton)")
    from ..bench.kernels import CONFIGS, VARIANTS
    from ..bench.kernels import DTYPES as KERNEL_DTYPES

    for option, given, known in (("--configs", args.configs, CONFIGS), ("--dtypes", args.dtypes, KERNEL_DTYPES),
                                 ("--sweep", args.sweep, VARIANTS)):
        bad = [x for x in given or () if x not in known]
        if bad:
            raise UsageError(f"{option}: unknown {bad[0]!r}; choose from {', '.join(known)}")
    args.configs = list(args.configs or CONFIGS)
    args.dtypes = list(args.dtypes or KERNEL_DTYPES)
    if args.out:
        check_writable_file(args.out, "--out")


def _run_kernels(args) -> int:
    from ..bench import kernels

    if args.sweep is not None:
        kernels.run_sweep(args)
    else:
        kernels.run_bench_kernels(args)
    return 0


def _engine_parser(what) -> None:
    from ..bench.engine import PRESETS

    p = what.add_parser("engine", help="engine throughput and latency per strategy, or a realistic preset")
    p.add_argument("--preset", choices=list(PRESETS), default=None,
                   help="a realistic shape with random weights (docs/engine.md); --tp / --strategies override the "
                        "preset's, the sweep options are ignored (default: none, the sweep)")
    p.add_argument("--hf-reference", action=argparse.BooleanOptionalAction, default=None,
                   help="also time transformers' generate on the same GPU and batch (default: the preset's)")
    p.add_argument("--model", metavar="DIR", default=None,
                   help="local HF checkpoint folder (default: a random Qwen2-shaped model, V = 151,936)")
    p.add_argument("--tp", metavar="N", type=int_at_least(1), default=None,
                   help="tensor-parallel ranks, one process each (default: 2, or the preset's)")
    p.add_argument("--strategies", metavar="NAMES", type=csv_choices(STRATEGIES), default=None,
                   help=f"comma-separated, from {', '.join(STRATEGIES)} (default: all, or the preset's)")
    p.add_argument("--batch-sizes", metavar="LIST", type=csv_ints(1), default=[1, 8, 32],
                   help="comma-separated requests per run (default: 1,8,32)")
    p.add_argument("--prompt-len", metavar="TOKENS", type=int_at_least(1), default=32,
                   help="prompt tokens per request")
    p.add_argument("--max-tokens", metavar="TOKENS", type=int_at_least(1), default=32,
                   help="output tokens per request")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda when there is one GPU per rank, else cpu")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default=None, help="weights and activations (default: float32)")
    p.add_argument("--kv-cache-tokens", metavar="TOKENS", type=int_at_least(1), default=None,
                   help="fix the KV cache capacity, in tokens (default: sized from memory)")
    p.add_argument("--memory-mib", metavar="MIB", type=int_at_least(1), default=1024,
                   help="per-rank memory budget on CPU that sizes the KV cache, in MiB")
    p.add_argument("--plot", metavar="PATH", default="bench_engine.png", help="PNG path for the plot")
    _out_option(p)
    p.set_defaults(check=_check_engine, run=_run_engine)


def _check_engine(args) -> None:
    if args.out:
        check_writable_file(args.out, "--out")
    if args.preset is not None:
        from ..bench.engine import PRESETS

        preset = PRESETS[args.preset]
        args.tp = args.tp or preset.tp
        check_model(None, [args.tp], args.device, default=preset.shape, default_name=f"preset {args.preset}")
        return
    args.tp, args.strategies = args.tp or 2, args.strategies or list(STRATEGIES)
    check_writable_file(args.plot, "--plot")
    check_model(args.model, [args.tp], args.device, default=BUILTIN_MODEL, default_name="the built-in model")


def _run_engine(args) -> int:
    from ..bench.engine import run_bench, run_preset
    from ..term import phase

    if args.preset is not None:           # run_preset shows its own progress
        run_preset(args.preset, strategies=args.strategies, device=args.device, hf_reference=args.hf_reference,
                   tp=args.tp, out=args.out)
        return 0
    with phase(f"bench engine: {len(args.strategies)} strategies x batch sizes {args.batch_sizes} at TP={args.tp}"):
        run_bench(model=args.model, tp=args.tp, strategies=args.strategies, batch_sizes=args.batch_sizes,
                  device=args.device, dtype=args.dtype, prompt_len=args.prompt_len, max_tokens=args.max_tokens,
                  kv_cache_tokens=args.kv_cache_tokens, cpu_memory_bytes=args.memory_mib << 20, plot=args.plot,
                  out=args.out)
    return 0


def _serve_parser(what) -> None:
    p = what.add_parser("serve", help="concurrent clients against the server: requests/s, TTFT and TPOT percentiles")
    add_engine_args(p, max_num_seqs=64)
    p.add_argument("--url", default=None,
                   help="benchmark a running server instead, e.g. http://127.0.0.1:8000 (default: start one)")
    p.add_argument("--clients", type=int_at_least(1), default=8, help="concurrent clients")
    p.add_argument("--duration", type=positive_real, default=20.0, help="seconds to keep sending")
    p.add_argument("--max-tokens", type=int_at_least(1), default=32, help="tokens per answer")
    _out_option(p)
    p.set_defaults(check=_check_out, run=_run_serve)


def _check_out(args) -> None:
    if args.out:
        check_writable_file(args.out, "--out")


def _run_serve(args) -> int:
    from ..bench.serve import run_bench

    run_bench(args, open_llm)
    return 0
