"""The harness every benchmark uses: how a call is measured, the progress shown while a bench
runs, and how it ends (its table, the JSON line and file with what produced the numbers).

Measuring: a call is `call()`, which launches the work and returns `finish()`, which reads the
results on the host; `before()`, when given, runs ahead of every call outside what is measured
(refilling logits an in-place call overwrites). `wall_us` (median of call + finish, and of
call alone: the host's share), `device_us` (the profiler's device time per call, `before()`'s
own taken off; `exclude` drops events by name), `extra_bytes` (the allocator's peak above what
was allocated before the call); all but the wall time are None off CUDA.

Ending: `finish(report, out)` adds `meta` (`metadata()`: the commit, a hash of the package's
sources, the date, the device, the Python / torch / CUDA / Triton / FlashInfer versions, the
environment variables that change what runs, the command line), prints one JSON line and writes
the file. The commit comes from TPSAMPLE_COMMIT when set, else from git; a tree without `.git`
still records `source_sha256`, which `python -m tpsample.bench.report` prints for the tree at hand.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import shlex
import statistics
import subprocess
import sys
import time

import torch


def is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def sync(device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)


def wall_us(call, iters: int, device, before=None) -> tuple[float, float]:
    """(median us of call() + finish(), median us until call() returned)."""
    walls, hosts = [], []
    for _ in range(iters):
        if before is not None:
            before()
        sync(device)
        t0 = time.perf_counter()
        finish = call()
        t1 = time.perf_counter()
        finish()
        t2 = time.perf_counter()
        walls.append((t2 - t0) * 1e6)
        hosts.append((t1 - t0) * 1e6)
    return statistics.median(walls), statistics.median(hosts)


def host_copy_or_nccl(name: str) -> bool:
    """Events of a collective: copies between host and device (gloo stages CUDA tensors through
    host memory; the plan's small uploads go too) and NCCL kernels."""
    return name.startswith(("Memcpy HtoD", "Memcpy DtoH")) or "nccl" in name.lower()


def _profiled(fn, iters: int, device) -> list:
    """The profiler's events (averaged by name) of `iters` calls of fn()."""
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        sync(device)
    return prof.key_averages()


def profiled_us(fn, iters: int, device, exclude=None) -> float:
    """Total device time (us) of the events of `iters` calls of fn(), less the excluded ones."""
    return sum(e.self_device_time_total for e in _profiled(fn, iters, device) if not (exclude and exclude(e.key)))


def kernel_us(fn, iters: int, device, names) -> dict:
    """{kernel: device us per call} of the kernels in `names` fn() launches (after one untimed
    call), longest first."""
    fn()
    got = {e.key: e.self_device_time_total / iters for e in _profiled(fn, iters, device) if e.key in names}
    return {k: round(v, 1) for k, v in sorted(got.items(), key=lambda kv: -kv[1])}


def copy_bandwidth(device) -> float | None:
    """Bytes read + written per second by a device-to-device copy of 1 GiB (after warm-up);
    None off CUDA."""
    if not is_cuda(device):
        return None
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * 10 * src.numel() / (start.elapsed_time(end) / 1e3)


def device_us(call, iters: int, device, before=None, exclude=None, before_us: float | None = None) -> float | None:
    """Device time per call (us), before()'s own device time taken off (profiled here, or
    `before_us` per call when the caller measured it once for several columns); None off CUDA."""
    if not is_cuda(device):
        return None

    def one():
        if before is not None:
            before()
        call()()

    total = profiled_us(one, iters, device, exclude) / iters
    if before is not None:
        total -= before_us if before_us is not None else profiled_us(before, iters, device, exclude) / iters
    return max(total, 0.0)


def allocated(device) -> int | None:
    if not is_cuda(device):
        return None
    sync(device)
    return torch.cuda.memory_allocated(device)


def extra_bytes(call, device, before=None) -> int | None:
    """Allocator peak during one call above the bytes allocated before it; None off CUDA."""
    if not is_cuda(device):
        call()()
        return None
    if before is not None:
        before()
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    call()()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


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


PACKAGE = pathlib.Path(__file__).resolve().parent.parent
ENV_KEYS = ("TRITON_INTERPRET", "TPSAMPLE_KERNELS_ON_CPU", "CUDA_VISIBLE_DEVICES", "FLASHINFER_CUDA_ARCH_LIST",
            "OMP_NUM_THREADS", "NCCL_NVLS_ENABLE")


TABLE_WIDTH = 140


def cell(v, spec: str) -> str:
    """A table cell: v formatted, '-' for None."""
    return "-" if v is None else format(v, spec)


def print_table(table) -> None:
    from ..term import console

    con = console()
    con.width = max(con.width, TABLE_WIDTH)
    con.print(table)


def source_sha256() -> str:
    """sha256 over the package's .py files (relative path and bytes, in path order)."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        h.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(PACKAGE), *args], capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> dict:
    """{"commit": sha or None, "dirty": tracked files changed since it (None when unknown)}.
    TPSAMPLE_COMMIT, when set, wins: a copied tree can carry git metadata of another commit."""
    given = os.environ.get("TPSAMPLE_COMMIT")
    sha = None if given else _git("rev-parse", "HEAD")
    if sha is None:
        return {"commit": given, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": sha, "dirty": None if status is None else bool(status)}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_name(device=None) -> str:
    """The GPU's name for a CUDA device, else the CPU's (with its core count)."""
    dev = torch.device(device) if device is not None else None
    if (dev is None or dev.type == "cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    return f"cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def command_line() -> str:
    """The command as typed: `tpsample ...` for the CLI (also under `python -m tpsample.cli`)."""
    argv = sys.argv
    if os.path.basename(argv[0]) == "tpsample" or argv[0].endswith(os.path.join("tpsample", "cli", "__main__.py")):
        return shlex.join(["tpsample", *argv[1:]])
    return shlex.join([os.path.basename(sys.executable), *argv])


def metadata(device=None) -> dict:
    return {**commit(), "source_sha256": source_sha256(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "device": device_name(device), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": _version("triton"),
            "flashinfer": _version("flashinfer-python") or _version("flashinfer"),
            "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ}, "command": command_line()}


def finish(report: dict, out: str | None = None, device=None) -> dict:
    """Add `meta` (unless the report has it), print the report as one JSON line, and write it
    to `out` when given."""
    report = {**report, "meta": report.get("meta") or metadata(device)}
    if out:
        write(report, out)
    print(json.dumps(report))
    return report


def write(report: dict, out: str) -> None:
    """The report as an indented JSON file (replaced whole: a partial report is overwritten later)."""
    tmp = f"{out}.tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    os.replace(tmp, out)


if __name__ == "__main__":
    print(source_sha256())
