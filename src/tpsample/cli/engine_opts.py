"""The option groups of the commands that run the engine (generate, serve, chat, bench serve):
the engine's options, the sampling options, and their checks.

`add_engine_args(p, ...)` / `check_engine_args(args)` / `open_llm(args)`;
`add_sampling_args(p)` / `sampling_params_from_args(args, vocab_size)`;
`check_checkpoint_folder(folder)`: config.json and the checkpoint's tensors, checked before any
work starts (also for `bench engine --model` and `demo --engine-model`).
"""
from __future__ import annotations

import os

from ..numerics import DTYPE_NAMES
from ..parallel import names
from ..params import RANGES
from .args import check_gpus_for_ranks, check_tp_splits, int_at_least, read_model_config, real

STRATEGIES = names.ALL
DEFAULT_MODEL = "SmolLM2-135M-Instruct"


def add_engine_args(p, *, positional_model: bool = False, max_num_seqs: int = 256,
                    speculative: bool = False) -> None:
    """The model (`--model DIR`, or a positional folder) and the engine's options; without a
    model the default one is fetched once."""
    g = p.add_argument_group("engine")
    model_help = (f"local HF checkpoint folder (config.json + *.safetensors [+ tokenizer files]); default: "
                  f"{DEFAULT_MODEL}, fetched once")
    if positional_model:
        p.add_argument("model", nargs="?", default=None, help=model_help)
    else:
        g.add_argument("--model", metavar="DIR", default=None, help=model_help)
    g.add_argument("--tp", metavar="N", type=int_at_least(1), default=1,
                   help="tensor-parallel ranks (one process each)")
    g.add_argument("--strategy", choices=STRATEGIES, default="auto", help="sampling strategy across ranks")
    g.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda when there is one GPU per rank, else cpu")
    g.add_argument("--dtype", choices=DTYPE_NAMES, default=None, help="weights and activations (default: the checkpoint's)")
    g.add_argument("--max-num-seqs", metavar="N", type=int_at_least(1), default=max_num_seqs,
                   help="requests running at once")
    g.add_argument("--max-model-len", metavar="TOKENS", type=int_at_least(1), default=None,
                   help="prompt + output tokens per request (default: the model's, capped by the KV cache)")
    g.add_argument("--kv-cache-tokens", metavar="TOKENS", type=int_at_least(1), default=None,
                   help="fix the KV cache capacity, in tokens (default: sized from free memory)")
    if speculative:
        g.add_argument("--speculative-ngram", metavar="N", type=int_at_least(1), default=None,
                       help="n-gram draft tokens per step (default: no speculative decoding)")


def check_engine_args(args) -> dict:
    """Checks before anything starts; returns the checkpoint's config.json."""
    return check_model(args.model, [args.tp], args.device)


def check_model(folder: str | None, tp_sizes, device, *, option: str = "--model", default: dict | None = None,
                default_name: str = "") -> dict:
    """The checkpoint folder (or, without one, the `default` model's config) and that every TP
    size splits it with a GPU per rank on cuda; returns its config.json."""
    config = read_model_config(folder, option) if folder is not None else default
    if folder is not None:
        check_checkpoint_folder(folder)
    for tp in tp_sizes:
        check_gpus_for_ranks(device, tp)
        check_tp_splits(config, tp, folder or default_name)
    return config


def check_checkpoint_folder(folder: str) -> None:
    """Every config.json field the model uses, and every tensor of the checkpoint against the
    shapes the config implies (headers only, no weights read): ValueError of one line."""
    from ..model import ModelConfig, check_checkpoint

    check_checkpoint(folder, ModelConfig.from_folder(folder))


def open_llm(args, console=None):
    """(LLM, model name) from the engine options; the default model is resolved (fetched) first."""
    from ..engine.default_model import resolve_model
    from ..llm import LLM
    from ..term import quiet_third_party

    quiet_third_party()
    folder, _ = resolve_model(args.model, console)
    llm = LLM(folder, tensor_parallel_size=args.tp, strategy=args.strategy, device=args.device, dtype=args.dtype,
              max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
              speculative_ngram=getattr(args, "speculative_ngram", None), kv_cache_tokens=args.kv_cache_tokens)
    return llm, os.path.basename(os.path.normpath(folder))


def add_sampling_args(p) -> None:
    g = p.add_argument_group("sampling (ranges as tpsample.SamplingParams)")
    g.add_argument("--max-tokens", metavar="N", type=int_at_least(1), default=64,
                   help="output tokens per prompt, at most")
    g.add_argument("--temperature", metavar="T", type=real, default=1.0, help=RANGES["temperature"].allowed)
    g.add_argument("--top-k", metavar="K", type=int, default=-1, help="keep the k most likely tokens (-1 or 0: off)")
    g.add_argument("--top-p", metavar="P", type=real, default=1.0, help=f"nucleus mass {RANGES['top_p'].allowed} (1: off)")
    g.add_argument("--min-p", metavar="P", type=real, default=0.0,
                   help="drop tokens below min_p x the top token's probability (0: off)")
    g.add_argument("--seed", metavar="N", type=int, default=None, help="request seed (default: drawn once per request)")
    g.add_argument("--logprobs", metavar="N", type=int_at_least(0), default=None,
                   help="top-n logprobs per token, n <= 20 (default: none)")
    g.add_argument("--dry-multiplier", metavar="M", type=real, default=0.0, help="DRY penalty scale (0: off)")
    g.add_argument("--dry-base", metavar="B", type=real, default=1.75, help=f"DRY growth base, {RANGES['dry_base'].allowed}")
    g.add_argument("--dry-allowed-length", metavar="N", type=int, default=2,
                   help="repeats up to this long go unpenalised")
    g.add_argument("--dry-penalty-last-n", metavar="N", type=int, default=-1,
                   help="DRY looks at the last N tokens (-1: the whole context, 0: off)")
    g.add_argument("--dry-sequence-breaker", metavar="TEXT", action="append", default=None,
                   dest="dry_sequence_breakers",
                   help="a string that ends repeats (repeatable; default with DRY on: llama.cpp's \\n : \" *)")
    g.add_argument("--top-n-sigma", metavar="N", type=real, default=-1.0,
                   help="keep tokens within N standard deviations of the top logit (<= 0: off)")
    g.add_argument("--xtc-probability", metavar="P", type=real, default=0.0,
                   help="chance per token of removing the most likely tokens (0: off)")
    g.add_argument("--xtc-threshold", metavar="P", type=real, default=0.1,
                   help="XTC removes tokens at or above this probability but the least likely of them")


def sampling_params_from_args(args, vocab_size: int):
    """SamplingParams from every option named after one of its fields (ValueError naming the
    field for a bad value)."""
    import dataclasses

    from ..engine.config import EngineConfig
    from ..params import SamplingParams

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(SamplingParams) if hasattr(args, f.name)}
    params = SamplingParams(**given)
    max_logprobs = EngineConfig.__dataclass_fields__["max_logprobs"].default
    # the breaker strings are mapped to token ids with the tokenizer when the LLM runs them
    checked = dataclasses.replace(params, dry_sequence_breakers=None).validate_for_vocab(vocab_size, max_logprobs)
    return dataclasses.replace(checked, dry_sequence_breakers=params.dry_sequence_breakers)
