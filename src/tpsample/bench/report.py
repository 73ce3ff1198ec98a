"""How every benchmark ends: its table, what produced its numbers, one JSON line, and the file
(`--out`).

`print_table(table)` prints a rich table whole: at least `TABLE_WIDTH` columns wide (a narrow
terminal wraps the lines; nothing is cut short), as wide as the terminal beyond that.

`finish(report, out)` adds `meta` to the report (`metadata()`: the commit, a hash of the
package's sources, the date, the device, the Python / torch / CUDA / Triton / FlashInfer
versions, the environment variables that change what runs, and the command line), prints the
report as one JSON line and, when `out` is a path, writes it there too (indented). Every
`tpsample bench` command ends through it, so their JSON files read the same way.

The commit comes from TPSAMPLE_COMMIT when set, else from git where the source tree is a checkout; a copy
of the tree without `.git` still records `source_sha256`, which
`python -m tpsample.bench.report` prints for the tree at hand (run it in the checkout to find the
commit a report was made from).
"""
from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parent.parent
ENV_KEYS = ("TRITON_INTERPRET", "TPSAMPLE_KERNELS_ON_CPU", "CUDA_VISIBLE_DEVICES", "FLASHINFER_CUDA_ARCH_LIST",
            "OMP_NUM_THREADS", "NCCL_NVLS_ENABLE")


TABLE_WIDTH = 140


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
    import torch

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
    import torch

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
