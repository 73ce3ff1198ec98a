"""Argument parsing shared by the commands: a parser whose errors are one line, option types
that reject bad values at parse time, and the checks commands run before any work starts.

A check raises `UsageError` (or `ValueError`); `tpsample.cli.main` prints it as one line,
`tpsample: error: ...`, and exits 2. Nothing here imports torch.
"""
from __future__ import annotations

import argparse
import math
import os
import sys


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2."""


class HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help unless the help already says its default."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, argparse.SUPPRESS) or not action.option_strings:
            return text
        default = action.default
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and every option's default shown in its help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def int_at_least(lo: int):
    """An option type: an integer >= lo."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}")
        return value
    parse.__name__ = f"integer >= {lo}"
    return parse


def real(text: str) -> float:
    """An option type: a finite number (ranges are SamplingParams' to check)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_real(text: str) -> float:
    """An option type: a finite number > 0."""
    value = real(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def csv_ints(lo: int, what: str = "integers"):
    """An option type: comma-separated integers >= lo (at least one)."""
    def parse(text: str) -> list[int]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        try:
            values = [int(x) for x in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be comma-separated {what} >= {lo}, got {text!r}") from None
        if not values or any(v < lo for v in values):
            raise argparse.ArgumentTypeError(f"must be comma-separated {what} >= {lo}, got {text!r}")
        return values
    parse.__name__ = f"comma-separated {what}"
    return parse


def csv_choices(choices: tuple[str, ...]):
    """An option type: a comma-separated subset of choices (at least one)."""
    def parse(text: str) -> list[str]:
        values = [x.strip() for x in text.split(",") if x.strip()]
        bad = [v for v in values if v not in choices]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"must be comma-separated names from {', '.join(choices)}; "
                                             f"got {text!r}")
        return values
    parse.__name__ = "comma-separated names"
    return parse


def read_model_config(path: str, option: str = "--model") -> dict:
    """config.json of a local HF checkpoint folder, checked: a directory holding a config.json
    that is a JSON object (`model.config.read_json_object`; it imports torch, so only here)."""
    if not os.path.isdir(path):
        raise UsageError(f"{option} {path!r} is not a directory (a local HF checkpoint folder: config.json "
                         "+ *.safetensors)")
    config = os.path.join(path, "config.json")
    if not os.path.exists(config):
        raise UsageError(f"{option} {path!r} has no config.json")
    from ..model.config import read_json_object

    try:
        return read_json_object(config)
    except ValueError as e:
        raise UsageError(f"{option} {path!r}: {e}") from None


def check_tp_splits(config: dict, tp: int, what: str) -> None:
    """The model's heads, KV heads and MLP width split over tp ranks (each count divides by tp,
    or tp is a multiple of it and the units replicate, as the model's parallel layers do)."""
    heads = config.get("num_attention_heads")
    counts = {"attention heads": heads, "KV heads": config.get("num_key_value_heads") or heads,
              "MLP features": config.get("intermediate_size")}
    for name, n in counts.items():
        if isinstance(n, int) and n > 0 and n % tp and tp % n:
            raise UsageError(f"--tp {tp} cannot split {what}: it has {n} {name}, and TP must divide that "
                             "count or be a multiple of it")


def check_writable_file(path: str, option: str) -> None:
    """path can be written (tried: a file that did not exist is created and removed again)."""
    if os.path.isdir(path):
        raise UsageError(f"{option} {path!r} is a directory; give a file name")
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        raise UsageError(f"{option} {path!r} cannot be written ({e.strerror})") from None
    if not existed:
        os.remove(path)


def check_device(device: str | None, option: str = "--device") -> None:
    """A device that exists here, by the Sampler's rule (`validation.check_device`; it imports
    torch, so only when a device is given), the message naming the option."""
    if device is not None:
        from ..validation import check_device as check_device_here

        check_device_here(device, option)


def check_gpus_for_ranks(device: str | None, tp: int) -> None:
    """The engine puts one rank per GPU: tp GPUs must be present when device is cuda."""
    if device is None or not device.startswith("cuda"):
        return
    import torch

    if torch.cuda.device_count() < tp:
        raise UsageError(f"--tp {tp} on cuda needs {tp} GPU(s), one per rank; {torch.cuda.device_count()} found")
