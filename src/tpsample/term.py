"""Terminal output for people: tables sized to the terminal and progress on long work (rich).

`console()` is a rich Console as wide as the terminal (80 columns when output is not a
terminal and COLUMNS is unset), so tables fit instead of wrapping into noise. `table(title,
columns)` is a compact table whose cells never wrap; headers break where they hold "\n".
`phase(text)` shows a spinner and the elapsed time while a long step runs, on a terminal only,
and leaves nothing behind; only one phase may be active at a time. `quiet_third_party()` stops
transformers / huggingface / tqdm progress bars and advisory logging, for this process and the
worker processes it starts. rich is imported on first use, never at import time.
"""
from __future__ import annotations

import contextlib
import os

_QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def console():
    from rich.console import Console

    return Console(soft_wrap=False)


def table(title: str, columns: list[str], *, left: tuple[str, ...] = ()):
    """A compact rich Table. Cells never wrap (numbers stay whole); a header may hold "\n" to
    break where it reads well. Columns named in `left` are left-aligned text, the others
    right-aligned numbers. Keep the total under 80 columns for the default options."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
              collapse_padding=True, title_justify="left")
    for name in columns:
        t.add_column(name, justify="left" if name in left else "right", no_wrap=True)
    return t


@contextlib.contextmanager
def phase(text: str):
    """Spinner + elapsed time while the block runs (terminal only; transient)."""
    con = console()
    if not con.is_terminal:
        yield
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=con,
                  transient=True) as progress:
        progress.add_task(text, total=None)
        yield


def quiet_third_party() -> None:
    """No third-party progress bars or advisory logs (inherited by spawned workers, which read
    the environment when they import transformers; this process is switched off directly)."""
    import logging
    import sys

    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for name in ("transformers", "huggingface_hub", "safetensors", "xgrammar"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if "transformers" in sys.modules:                 # imported already: its flag was read at import
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
