"""Which install extra each command needs, checked before the command does anything.

`pip install tpsample` brings the sampler only (torch, numpy). A command names the modules it
imports in `NEEDS`, with the extra that brings them; `require(command)` raises `UsageError`
("'tpsample demo' needs the engine extra (not installed: rich): pip install 'tpsample[engine]'")
when one of them cannot be imported, so `tpsample.cli.main` prints one line and exits 2.
Every module named here is also a requirement name of its extra in pyproject.toml
(tests/test_install.py holds this). Nothing here imports the modules it checks.
"""
from __future__ import annotations

import importlib.util

from .args import UsageError

ENGINE = ("transformers", "safetensors", "gguf", "accelerate", "rich")   # the engine and the default model
TABLES = ("rich", "matplotlib")                                          # the benchmarks' tables and plots
SERVER = ("fastapi", "uvicorn", "prometheus_client")

# command (as typed after `tpsample`) -> (extra, modules it imports)
NEEDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "demo": ("engine", ENGINE),
    "generate": ("engine", ENGINE),
    "chat": ("engine", ENGINE),
    "serve": ("serve", ENGINE + SERVER),
    "bench sampler": ("engine", TABLES),
    "bench kernels": ("engine", ("rich",)),
    "bench engine": ("engine", ENGINE + TABLES),
    "bench serve": ("serve", ENGINE + SERVER + ("httpx",)),
}


def command_name(args) -> str:
    """"bench sampler" for `tpsample bench sampler ...`, "demo" for `tpsample demo ...`."""
    what = getattr(args, "what", None)
    return f"{args.command} {what}" if args.command == "bench" and what else args.command


def importable(module: str) -> bool:
    """The module can be found (not imported); a finder that refuses it counts as missing."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(command: str) -> None:
    """UsageError naming the extra to install when a module `command` needs is missing."""
    extra, modules = NEEDS.get(command, ("", ()))
    missing = [m for m in dict.fromkeys(modules) if not importable(m)]
    if missing:
        raise UsageError(f"'tpsample {command}' needs the {extra} extra (not installed: {', '.join(missing)}): "
                         f"pip install 'tpsample[{extra}]'")
