"""Progress of a long benchmark: a bar on a terminal, one line per step on stderr otherwise (a log
then shows where a run was when it stopped).

    with progress("bench sampler --compare", total) as step:
        for ...:
            step("wall: topk x 256")          # before each step's work
"""
from __future__ import annotations

import contextlib
import sys
import time


@contextlib.contextmanager
def progress(title: str, total: int):
    from ..term import console

    con = console()
    if not con.is_terminal:
        start, done = time.perf_counter(), [0]

        def line(what: str) -> None:
            done[0] += 1
            print(f"{title} [{done[0]}/{total}, {time.perf_counter() - start:.0f} s] {what}", file=sys.stderr,
                  flush=True)
        yield line
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=con, transient=True) as bar:
        task = bar.add_task(title, total=total)
        first = [True]

        def advance(what: str) -> None:
            bar.update(task, advance=0 if first[0] else 1, description=f"{title}: {what}")
            first[0] = False
        yield advance
