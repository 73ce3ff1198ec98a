"""The `tpsample` command line.

Contract:
- `main(argv) -> exit code`. Parsers are built inside `main`, never at import time; command
  modules import torch and the engine only when their command runs.
- A command group is one module in this package with `register(subparsers)`, which adds its
  parser(s) (class `args.Parser`) and sets two defaults: `check(args)`, which validates
  everything it can before any work starts, and `run(args) -> int`. Adding a command is that
  module plus its name in `COMMANDS`.
- A command whose install extra is missing (`extras.NEEDS`) is refused the same way, after
  parsing and before its check: one line naming the extra to install, exit 2.
- A user mistake (a bad option value, a failed check, a `ValueError` raised by validation
  anywhere under a command) prints one line, `tpsample: error: ...`, on stderr and exits 2.
  Internal errors keep their tracebacks. Ctrl-C exits 130 with one line.
"""
from __future__ import annotations

import importlib
import sys

from . import extras
from .args import Parser, UsageError

COMMANDS = ("demo", "generate", "serve", "bench")


def build_parser() -> Parser:
    parser = Parser(prog="tpsample", description="Exact sampling for tensor-parallel LLM decoding.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv=None) -> int:
    from ..term import quiet_third_party

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:           # --help (0), or a bad option already printed as one line (2)
        return exc.code if isinstance(exc.code, int) else 2
    quiet_third_party()
    try:
        extras.require(extras.command_name(args))
        args.check(args)
        return int(args.run(args) or 0)
    except (UsageError, ValueError) as exc:
        print(f"tpsample: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tpsample: interrupted", file=sys.stderr)
        return 130
