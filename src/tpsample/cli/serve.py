"""`tpsample serve` (the OpenAI-compatible server) and `tpsample chat` (a terminal chat).

The options, checks and the two loops live in `cli.serve_commands`, the server in `tpsample.serve`;
this module registers the commands. User mistakes raise ValueError before any work starts.
"""
from __future__ import annotations


def register(sub) -> None:
    from . import serve_commands as commands

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (default model: SmolLM2-135M-Instruct)",
                           description="Serve a model over OpenAI-compatible HTTP: /v1/chat/completions, "
                                       "/v1/completions, /v1/models, /health (docs/serving.md).")
    commands.add_serve_args(serve)
    serve.set_defaults(check=_no_check, run=commands.run_serve)
    chat = sub.add_parser("chat", help="chat with a model in the terminal (default model: SmolLM2-135M-Instruct)",
                          description="Read a message, stream the answer, repeat; an empty line or EOF ends.")
    commands.add_chat_args(chat)
    chat.set_defaults(check=_no_check, run=commands.run_chat)


def _no_check(args) -> None:
    """The commands check their own options first thing in `run`, before loading anything."""
