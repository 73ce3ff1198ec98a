"""`tpsample generate`: prompts through `tpsample.LLM` on a local checkpoint; one line per
output, then one JSON line (engine info and run stats)."""
from __future__ import annotations

import argparse
import importlib.util
import json

from .args import UsageError
from .engine_opts import add_engine_args, add_sampling_args, check_engine_args, open_llm, sampling_params_from_args


def token_ids(text: str) -> list[int]:
    """An option type: comma-separated token ids (integers >= 0), at least one."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    try:
        ids = [int(x) for x in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated token ids, got {text!r}") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"must be comma-separated token ids >= 0, got {text!r}")
    return ids


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate with a local HF checkpoint (default model: SmolLM2-135M-Instruct)",
                       description="Generate from text prompts (needs the checkpoint's tokenizer) or token ids.")
    p.add_argument("--prompt", metavar="TEXT", action="append", default=[],
                   help="a text prompt (repeatable; needs a tokenizer; default: none)")
    p.add_argument("--prompt-ids", metavar="IDS", action="append", default=[], type=token_ids,
                   help="a prompt as comma-separated token ids, e.g. 1,2,3 (repeatable; default: none)")
    p.add_argument("--stream", action="store_true", help="print the text as it is generated")
    p.add_argument("--chat", action="store_true",
                   help="apply the model's chat template: each --prompt is a user message")
    p.add_argument("--stop", metavar="TEXT", action="append", default=None,
                   help="a stop string (repeatable; default: none)")
    add_engine_args(p, speculative=True)
    add_sampling_args(p)
    guided = p.add_argument_group("structured output (needs a tokenizer and xgrammar)")
    one = guided.add_mutually_exclusive_group()
    one.add_argument("--json-schema", metavar="JSON", default=None,
                     help="a JSON schema, inline or @file (default: none)")
    one.add_argument("--regex", metavar="REGEX", default=None,
                     help="constrain the output to this regex (default: none)")
    p.set_defaults(check=check, run=run)


def check(args) -> None:
    from ..engine.hf_files import has_tokenizer

    if not args.prompt and not args.prompt_ids:
        raise UsageError("give at least one --prompt or --prompt-ids")
    if args.chat and args.prompt_ids:
        raise UsageError("--chat takes text --prompt messages, not --prompt-ids")
    if args.model is None:
        from ..engine.default_model import resolve_model

        args.model = resolve_model(None)[0]
    config = check_engine_args(args)
    vocab = config.get("vocab_size")
    tokenizer = has_tokenizer(args.model)
    if args.prompt and not tokenizer:
        raise UsageError(f"--prompt is text but {args.model} has no tokenizer files; use --prompt-ids")
    if isinstance(vocab, int):
        for ids in args.prompt_ids:
            if max(ids) >= vocab:
                raise UsageError(f"--prompt-ids: token id {max(ids)} is outside the vocabulary [0, {vocab})")
    if args.stop and not tokenizer:
        raise UsageError(f"--stop strings need a tokenizer, and {args.model} has none")
    if args.dry_sequence_breakers and not tokenizer:
        raise UsageError(f"--dry-sequence-breaker strings need a tokenizer, and {args.model} has none")
    args.params = sampling_params_from_args(args, vocab if isinstance(vocab, int) else 2**62)
    args.guided = _guided(args, tokenizer)


def _guided(args, tokenizer: bool):
    if args.json_schema is None and args.regex is None:
        return None
    if not tokenizer:
        raise UsageError(f"structured output needs a tokenizer, and {args.model} has none")
    if importlib.util.find_spec("xgrammar") is None:
        raise UsageError("structured output needs xgrammar (pip install xgrammar)")
    from ..engine.request import GuidedDecoding

    if args.regex is not None:
        return GuidedDecoding(regex=args.regex)
    text = args.json_schema
    if text.startswith("@"):
        try:
            with open(text[1:]) as f:
                text = f.read()
        except OSError as e:
            raise UsageError(f"--json-schema {args.json_schema}: cannot read the file ({e.strerror})") from None
    try:
        json.loads(text)
    except ValueError as e:
        raise UsageError(f"--json-schema is not valid JSON: {e}") from None
    return GuidedDecoding(json_schema=text)


def run(args) -> int:
    from ..term import phase

    prompts = list(args.prompt) + list(args.prompt_ids)
    stream = _text_printer(len(prompts)) if args.stream else None
    with phase(f"starting the engine (TP={args.tp})"):
        llm, _ = open_llm(args)

    def go(**kw):
        if args.chat:
            return llm.chat([[{"role": "user", "content": p}] for p in prompts], args.params, guided=args.guided, **kw)
        return llm.generate(prompts, args.params, guided=args.guided, **kw)

    with llm:
        if stream is None:
            with phase(f"generating {len(prompts)} prompt(s)"):
                outs = go()
        else:
            outs = go(stream=stream)
        for i, out in enumerate(outs):
            shown = out.text if out.text is not None else out.output_token_ids
            print(f"[{i}] ({out.finish_reason}, {len(out.output_token_ids)} tokens) {shown!r}")
        stats, info = llm.last_stats, llm.info
    print(json.dumps({"info": info.as_dict(), "stats": stats.as_dict()}))
    return 0


def _text_printer(num_prompts: int):
    """Stream text as it comes: bare for one prompt, one tagged line per delta for several."""
    if num_prompts == 1:
        return lambda d: print(d.text or "", end="\n" if d.finished else "", flush=True)
    return lambda d: d.text and print(f"[{d.index}] {d.text!r}", flush=True)
