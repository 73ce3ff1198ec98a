"""`tpsample serve` (the OpenAI-compatible server) and `tpsample chat` (a terminal chat).

User mistakes are refused before any work starts: bad option values when parsing, the rest as
a ValueError of one line (the CLI layer prints it and exits with 2). Without a model, the
default model is used (`engine.default_model`).
"""
from __future__ import annotations

import os
import sys

from .args import int_at_least, positive_real
from .engine_opts import add_engine_args, add_sampling_args, open_llm, sampling_params_from_args


def register(sub) -> None:
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (default model: SmolLM2-135M-Instruct)",
                           description="Serve a model over OpenAI-compatible HTTP: /v1/chat/completions, "
                                       "/v1/completions, /v1/models, /health (docs/serving.md).")
    add_serve_args(serve)
    serve.set_defaults(check=_no_check, run=run_serve)
    chat = sub.add_parser("chat", help="chat with a model in the terminal (default model: SmolLM2-135M-Instruct)",
                          description="Read a message, stream the answer, repeat; an empty line or EOF ends.")
    add_chat_args(chat)
    chat.set_defaults(check=_no_check, run=run_chat)


def _no_check(args) -> None:
    """The commands check what parsing cannot first thing in `run`, before loading anything."""


# -- serve ------------------------------------------------------------------------------------
def add_serve_args(p) -> None:
    add_engine_args(p, positional_model=True, max_num_seqs=64)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000; 0 = any free port)")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: folder name)")
    p.add_argument("--max-pending", type=int_at_least(1), default=None,
                   help="requests in flight before answering 429 (default: 4 x --max-num-seqs)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="the server's log level (default: info)")
    p.add_argument("--generation-config", default="auto", metavar="{auto,vllm,none,FOLDER}",
                   help="defaults for sampling fields a request leaves out: 'auto' reads the model's "
                        "generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty, "
                        "max_new_tokens), 'vllm' or 'none' reads nothing, a folder reads its file (default: auto)")
    p.add_argument("--override-generation-config", default=None, metavar="JSON",
                   help='defaults that win over the generation config, e.g. \'{"temperature": 0.5}\'')
    add_serve_limit_args(p)


def add_serve_limit_args(p) -> None:
    """Access, size limits and timeouts (`tpsample.serve.config.ServeConfig`)."""
    from tpsample.serve.config import ServeConfig

    d = ServeConfig()
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every route but /health "
                        "(default: $TPSAMPLE_API_KEY; unset: no key)")
    p.add_argument("--allowed-hosts", default=None,
                   help="comma-separated Host header names to answer ('*': any; default: on a loopback "
                        "address its loopback names only, elsewhere any)")
    p.add_argument("--max-body-mb", type=positive_real, default=d.max_body_bytes / (1 << 20),
                   help="largest request body in MiB; larger is a 413 (default: %(default)g)")
    p.add_argument("--max-messages", type=int_at_least(1), default=d.max_messages,
                   help="chat messages per request (default: %(default)s)")
    p.add_argument("--max-prompt-chars", type=int_at_least(1), default=d.max_prompt_chars,
                   help="characters of prompt text per request (default: %(default)s)")
    for name, value, what in (("keep-alive", d.timeout_keep_alive_s, "close a kept-alive connection idle this long"),
                              ("header", d.timeout_header_s, "a request's line and headers may take; later: 408"),
                              ("body", d.timeout_body_s, "a request's body may take to arrive; later: 408"),
                              ("shutdown", d.timeout_shutdown_s, "on SIGINT/SIGTERM, the wait for open "
                                                                 "connections before they are closed")):
        p.add_argument(f"--timeout-{name}", type=positive_real, default=value,
                       help=f"seconds: {what} (default: %(default)g)")
    p.add_argument("--grammar-timeout", type=positive_real, default=d.grammar_timeout_s,
                   help="seconds a response_format grammar may take to compile; longer is a 400 "
                        "(default: %(default)g)")


def serve_config(args):
    """The ServeConfig of the parsed options (the API key may come from $TPSAMPLE_API_KEY)."""
    from tpsample.serve.config import ServeConfig

    api_key = args.api_key if args.api_key is not None else os.environ.get("TPSAMPLE_API_KEY") or None
    hosts = None if args.allowed_hosts is None else tuple(h for h in args.allowed_hosts.split(",") if h.strip())
    if hosts == ():
        raise ValueError("--allowed-hosts needs at least one name (or '*')")
    return ServeConfig(max_body_bytes=int(args.max_body_mb * (1 << 20)), max_messages=args.max_messages,
                       max_prompt_chars=args.max_prompt_chars, timeout_keep_alive_s=args.timeout_keep_alive,
                       timeout_header_s=args.timeout_header, timeout_body_s=args.timeout_body,
                       timeout_shutdown_s=args.timeout_shutdown, grammar_timeout_s=args.grammar_timeout,
                       api_key=api_key, allowed_hosts=hosts)


def override_generation_config(text: str | None) -> dict | None:
    """--override-generation-config: a JSON object, or a one-line ValueError."""
    if text is None:
        return None
    import json

    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--override-generation-config must be a JSON object: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--override-generation-config must be a JSON object, got {text!r}")
    return value


def _describe(defaults: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in defaults.items()) or "none (OpenAI's defaults)"


def run_serve(args) -> int:
    """Serve until SIGINT / SIGTERM (exit code 0) or an engine failure (1); the workers are
    stopped before it returns."""
    from rich.console import Console

    from tpsample.serve.app import build_app
    from tpsample.serve.sampling import generation_defaults
    from tpsample.serve.server import bind, serve_forever

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    config = serve_config(args)
    override = override_generation_config(args.override_generation_config)
    sock = bind(args.host, args.port)              # a taken port fails now, not after loading
    console = Console(stderr=True)
    try:
        llm, name = open_llm(args, console)
    except BaseException:                          # a model that does not load: free the port at once
        sock.close()
        raise
    name = args.served_model_name or name
    code = 0
    try:
        defaults = generation_defaults(args.generation_config, llm.config.model, override)
        console.print(f"sampling defaults for fields a request leaves out (--generation-config "
                      f"{args.generation_config}): {_describe(defaults)}")
        app = build_app(llm, model_name=name, max_pending=args.max_pending, config=config, defaults=defaults)
        host, port = sock.getsockname()[:2]
        console.print(f"serving [bold]{name}[/bold] at http://{host}:{port}/v1 (TP={args.tp}, strategy "
                      f"{llm.info.strategy}, {llm.info.kv_tokens:,} KV tokens"
                      f"{', API key required' if config.api_key else ''}); Ctrl-C stops")
        code = serve_forever(app, sock, args.log_level)
    except KeyboardInterrupt:                   # a Ctrl-C before the server started
        pass
    finally:
        llm.close()
    return code


# -- chat -------------------------------------------------------------------------------------
def add_chat_args(p) -> None:
    add_engine_args(p, positional_model=True, max_num_seqs=64)
    p.add_argument("--system", default=None, help="a system message to start the conversation with (default: none)")
    add_sampling_args(p)
    p.set_defaults(temperature=0.7, top_p=0.9, max_tokens=256)


def run_chat(args) -> int:
    """Read a line, stream the answer, repeat; an empty line or EOF (Ctrl-D) ends. Piped stdin works."""
    from rich.console import Console

    params = sampling_params_from_args(args, 2**62)      # the engine checks the ids against its vocabulary
    console = Console(stderr=True)
    llm, name = open_llm(args, console)
    interactive = sys.stdin.isatty()
    history = [{"role": "system", "content": args.system}] if args.system else []
    if interactive:
        console.print(f"chatting with [bold]{name}[/bold] (TP={args.tp}); an empty line or Ctrl-D ends")
    try:
        while True:
            try:
                line = input("you> " if interactive else "")
            except EOFError:
                break
            if not line.strip():
                break
            history.append({"role": "user", "content": line})
            print("assistant> ", end="", flush=True)
            out = llm.chat(history, params, stream=lambda d: print(d.text, end="", flush=True))[0]
            print(flush=True)
            history.append({"role": "assistant", "content": out.text})
    finally:
        llm.close()
    return 0
